/* SPDX-License-Identifier: Apache-2.0 */
/* The bootstrap server of connector.h: `kvt metad` in this process, over
 * the public server calls (kvt/metad.h). */
#include <stdlib.h>

#include <kvt/connector.h>
#include <kvt/metad.h>

struct kvt_bootstrap {
    kvt_metad_h metad;
};

kvt_status_t kvt_bootstrap_start(const char *host, uint16_t port,
                                 kvt_bootstrap_h *server_p)
{
    kvt_metad_params_t p = {0};
    struct kvt_bootstrap *b;
    kvt_status_t st;

    if (server_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    b = calloc(1, sizeof(*b));
    if (b == NULL)
        return KVT_ERR_NO_MEMORY;
    p.field_mask = KVT_METAD_PARAM_HOST | KVT_METAD_PARAM_PORT;
    p.host = host;
    p.port = port;
    st = kvt_metad_start(&p, &b->metad);
    if (st != KVT_OK) {
        free(b);
        return st;
    }
    *server_p = b;
    return KVT_OK;
}

uint16_t kvt_bootstrap_port(kvt_bootstrap_h server)
{
    return server ? kvt_metad_port(server->metad) : 0;
}

void kvt_bootstrap_stop(kvt_bootstrap_h server)
{
    if (server == NULL)
        return;
    kvt_metad_stop(server->metad);
    free(server);
}
