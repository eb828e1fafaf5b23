/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the JSON segment descriptor decoder: whatever decodes
 * must encode again and decode to the same descriptor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/meta.h"
#include "util/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__segdesc_t a, b;
    char *json;
    size_t len;
    kvt_status_t st;

    kvt__log_level_cur = -1; /* refusals are expected here */
    st = kvt__segdesc_from_json((const char *)data, size, &a);
    if (st != KVT_OK) {
        if (a.regions != NULL || a.nregions != 0)
            abort();
        return 0;
    }
    st = kvt__segdesc_to_json(&a, &json, &len);
    if (st == KVT_ERR_NO_MEMORY)
        goto out_a;
    if (st != KVT_OK || kvt__segdesc_from_json(json, len, &b) != KVT_OK)
        abort();
    if (strcmp(a.name, b.name) != 0 || strcmp(a.host, b.host) != 0 ||
        a.port != b.port || a.transports != b.transports ||
        a.host_id != b.host_id || a.pid != b.pid || a.nregions != b.nregions ||
        (a.nregions > 0 &&
         memcmp(a.regions, b.regions, a.nregions * sizeof(*a.regions)) != 0))
        abort();
    kvt__segdesc_clear(&b);
    free(json);
out_a:
    kvt__segdesc_clear(&a);
    return 0;
}
