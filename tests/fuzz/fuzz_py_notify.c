/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the Python binding's notification decoding (the "\0MCN"
 * packing of a name and a message, python/src/notify_pack.h): whatever a
 * peer sends, name and msg lie inside the payload's first KVT_NOTIFY_MAX
 * bytes, cover it without gap, and a pair packed again decodes the same.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "notify_pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char again[KVT_NOTIFY_MAX];
    size_t clamp = size > KVT_NOTIFY_MAX ? KVT_NOTIFY_MAX : size;
    size_t noff, nlen, moff, mlen, n2off, n2len, m2off, m2len;
    const char *p = (const char *)data;
    int packed = kvtpy_notify_unpack(p, size, &noff, &nlen, &moff, &mlen);

    if (moff + mlen != clamp || moff > clamp || noff + nlen > moff)
        abort();
    if (!packed) {
        if (nlen != 0 || moff != 0)
            abort();
        return 0;
    }
    if (noff != KVTPY_NOTIFY_HDR_LEN || moff != noff + nlen)
        abort();
    /* Pack the pair as notify.c does and decode it again. */
    memcpy(again, KVTPY_NOTIFY_MAGIC, KVTPY_NOTIFY_MAGIC_LEN);
    again[4] = (char)(nlen & 0xff);
    again[5] = (char)(nlen >> 8);
    memcpy(again + KVTPY_NOTIFY_HDR_LEN, p + noff, nlen);
    memcpy(again + KVTPY_NOTIFY_HDR_LEN + nlen, p + moff, mlen);
    if (kvtpy_notify_unpack(again, KVTPY_NOTIFY_HDR_LEN + nlen + mlen, &n2off,
                            &n2len, &m2off, &m2len) != 1 ||
        n2len != nlen || m2len != mlen ||
        memcmp(again + n2off, p + noff, nlen) != 0 ||
        memcmp(again + m2off, p + moff, mlen) != 0)
        abort();
    return 0;
}
