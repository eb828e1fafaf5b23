/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the bootstrap client's decoding of GET /route answers:
 * the first byte picks the answer (the prefill sizes, or one rank's
 * address), the rest is what the server sent. None may crash or leak, and
 * what is accepted holds what kvt_bootc_sizes()/kvt_bootc_route() promise.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/bootstrap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *why = NULL;
    char name[300];
    uint32_t tp = 0, dp = 0;
    size_t cap;
    kvt_status_t st;

    if (size < 1)
        return 0;
    if (data[0] & 1) {
        st = kvt__boot_sizes_parse((const char *)data + 1, size - 1, &tp, &dp,
                                   &why);
        if (st == KVT_OK &&
            (tp == 0 || dp == 0 || tp % dp != 0 || tp > (1u << 20)))
            abort();
    } else {
        /* Callers' buffers differ: a short one must be refused whole. */
        cap = data[0] & 2 ? sizeof(name) : 1 + (size_t)(data[0] >> 2);
        memset(name, 0x5a, sizeof(name));
        st = kvt__boot_route_parse((const char *)data + 1, size - 1, name, cap,
                                   &why);
        if (st == KVT_OK) {
            const char *colon = strrchr(name, ':');
            if (strlen(name) >= cap || colon == NULL || colon == name ||
                strtoul(colon + 1, NULL, 10) == 0 ||
                strtoul(colon + 1, NULL, 10) > 65535 || strchr(name, ' '))
                abort();
        }
        for (size_t i = cap; i < sizeof(name); i++)
            if (name[i] != 0x5a)
                abort();
    }
    if (st != KVT_OK && (st != KVT_ERR_PROTOCOL || why == NULL))
        abort();
    return 0;
}
