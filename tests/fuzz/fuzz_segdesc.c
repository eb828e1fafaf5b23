/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target for the binary segment descriptor decoder: whatever decodes
 * must encode back to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__segdesc_t d;
    uint8_t *buf;
    size_t len;

    if (kvt__segdesc_decode(data, size, &d) != KVT_OK)
        return 0;
    if (kvt__segdesc_encode(&d, &buf, &len) == KVT_OK) {
        if (len != size || memcmp(buf, data, size) != 0)
            abort();
        free(buf);
    }
    kvt__segdesc_clear(&d);
    return 0;
}
