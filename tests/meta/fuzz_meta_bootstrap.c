/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target for PD bootstrap registrations (PUT /route bodies). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/bootstrap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__boot_rank_t r;
    const char *why = NULL;
    kvt_status_t st = kvt__boot_parse((const char *)data, size, &r, &why);

    if (st != KVT_OK) {
        if (why == NULL ||
            (st != KVT_ERR_PROTOCOL && st != KVT_ERR_INVALID_PARAM))
            abort();
        return 0;
    }
    if (r.tp_size < 1 || r.tp_size > KVT_BOOT_MAX_RANKS || r.dp_size < 1 ||
        r.tp_size % r.dp_size != 0 || r.engine_rank >= r.tp_size ||
        r.rank_port == 0 || r.role[0] == '\0' || r.rank_ip[0] == '\0' ||
        strlen(r.role) > KVT_BOOT_ROLE_MAX ||
        strlen(r.rank_ip) > KVT_META_HOST_MAX)
        abort();
    if (kvt__boot_dp_group(&r) >= r.dp_size ||
        kvt__boot_tp_rank(&r) >= r.tp_size / r.dp_size)
        abort();
    return 0;
}
