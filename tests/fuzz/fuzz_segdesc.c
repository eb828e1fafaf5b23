/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the binary segment descriptor decoder. Whatever decodes
 * keeps the invariants the engine relies on, and its encoding (the
 * canonical form: sections this build knows, in order) decodes again to
 * the same encoding.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/segdesc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const kvt__segdesc_t *d)
{
    uint32_t bits = 0;

    if (d->nregions > KVT_SEGDESC_MAX_REGIONS || d->ntl > KVT_SEGDESC_MAX_TL ||
        d->name[0] == '\0')
        abort();
    for (uint32_t i = 0; i < d->nregions; i++)
        if (d->regions[i].length == 0 ||
            d->regions[i].addr > UINT64_MAX - d->regions[i].length)
            abort();
    for (uint32_t t = 0; t < d->ntl; t++) {
        const kvt__segdesc_tl_t *tl = &d->tl[t];
        if ((tl->id & (tl->id - 1)) != 0 || (bits & tl->id) != 0)
            abort();
        bits |= tl->id;
        for (uint32_t k = 0; k < tl->nkeys; k++)
            if (tl->keys[k].region >= d->nregions ||
                tl->keys[k].len > KVT_SEGDESC_KEY_MAX ||
                (k > 0 && tl->keys[k].region <= tl->keys[k - 1].region))
                abort();
    }
    if (bits != d->transports)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__segdesc_t d, d2;
    uint8_t *buf, *buf2;
    size_t len, len2;

    if (kvt__segdesc_decode(data, size, &d) != KVT_OK)
        return 0;
    check(&d);
    if (kvt__segdesc_encode(&d, &buf, &len) == KVT_OK) {
        if (kvt__segdesc_decode(buf, len, &d2) != KVT_OK)
            abort();
        check(&d2);
        if (kvt__segdesc_encode(&d2, &buf2, &len2) != KVT_OK || len2 != len ||
            memcmp(buf, buf2, len) != 0)
            abort();
        free(buf2);
        kvt__segdesc_clear(&d2);
        free(buf);
    }
    kvt__segdesc_clear(&d);
    return 0;
}
