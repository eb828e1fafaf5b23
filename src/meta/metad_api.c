/* SPDX-License-Identifier: Apache-2.0 */
/* The public face of the metadata layer (kvt/metad.h) over metad.h. */
#include <kvt/metad.h>

#include "meta/meta.h"
#include "meta/metad.h"

const char *kvt_meta_backends(void)
{
    return kvt__meta_backends_built();
}

int kvt_metad_available(void)
{
    return kvt__meta_server_built();
}

kvt_status_t kvt_metad_start(const kvt_metad_params_t *params,
                             kvt_metad_h *server_p)
{
    kvt__metad_params_t p = {0};
    const char *host = NULL;
    uint16_t port = 8080;
    uint64_t m = params != NULL ? params->field_mask : 0;
    kvt__metad_t *md;
    kvt_status_t st;

    if (server_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (m & KVT_METAD_PARAM_HOST)
        host = params->host;
    if (m & KVT_METAD_PARAM_PORT)
        port = params->port;
    if (m & KVT_METAD_PARAM_THREADS) {
        p.field_mask |= KVT__METAD_PARAM_THREADS;
        p.threads = params->threads;
    }
    if (m & KVT_METAD_PARAM_MAX_BODY) {
        p.field_mask |= KVT__METAD_PARAM_MAX_BODY;
        p.max_body = params->max_body;
    }
    if (m & KVT_METAD_PARAM_MAX_BYTES) {
        p.field_mask |= KVT__METAD_PARAM_MAX_BYTES;
        p.max_bytes = params->max_bytes;
    }
    if (m & KVT_METAD_PARAM_MAX_CONNS) {
        p.field_mask |= KVT__METAD_PARAM_MAX_CONNS;
        p.max_conns = params->max_conns;
    }
    if (m & KVT_METAD_PARAM_HEADER_TIMEOUT) {
        p.field_mask |= KVT__METAD_PARAM_HEADER_TIMEOUT;
        p.header_timeout_ms = params->header_timeout_ms;
    }
    if (m & KVT_METAD_PARAM_BODY_TIMEOUT) {
        p.field_mask |= KVT__METAD_PARAM_BODY_TIMEOUT;
        p.body_timeout_ms = params->body_timeout_ms;
    }
    p.field_mask |= KVT__METAD_PARAM_AUTH;
    if (((m & KVT_METAD_PARAM_AUTH_TOKEN)
             ? kvt__auth_init(&p.auth, params->auth_token)
             : kvt__auth_init_env(&p.auth)) != KVT_OK)
        return KVT_ERR_INVALID_PARAM;
    p.auth_reads = (m & KVT_METAD_PARAM_AUTH_READS) && params->auth_reads;
    st = kvt__metad_start(host, port, &p, &md);
    kvt__wipe(&p.auth, sizeof(p.auth));
    if (st == KVT_OK)
        *server_p = (kvt_metad_h)md;
    return st;
}

uint16_t kvt_metad_port(kvt_metad_h server)
{
    return server != NULL ? kvt__metad_port((kvt__metad_t *)server) : 0;
}

void kvt_metad_stop(kvt_metad_h server)
{
    kvt__metad_stop((kvt__metad_t *)server);
}
