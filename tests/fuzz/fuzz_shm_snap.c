/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the shm initiator's use of the records a target
 * publishes in the shared channel: the registry snapshot (any regions, in
 * any order, overlapping, reversed, with any count) searched by
 * kvt__shm_region_find(), and an allocation's mapping as a MAP_ACK
 * describes it, resolved by kvt__shm_at(). Whatever the target wrote, a
 * range is accepted only inside one published region with the access
 * asked for, and resolves only to bytes of the mapping.
 *
 * Input: nregions u32 (as the target wrote it), then regions (start u64,
 * end u64, access u8) until a 0xff marker byte or the input ends, then
 * queries (lo u64, len u32, access u8; map base u64, map len u32).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/shm/shm_sess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t take(const uint8_t **p, size_t *left, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i<n && * left> 0; i++, (*p)++, (*left)--)
        v |= (uint64_t) * *p << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvt__shm_chan_t *ch;
    static uint8_t local[4096];
    const uint8_t *p = data;
    size_t left = size;
    uint32_t nreg, n, w = 0;

    if (ch == NULL && (ch = calloc(1, KVT_SHM_CHAN_SIZE)) == NULL)
        abort();
    nreg = (uint32_t)take(&p, &left, 4);
    while (left >= 17 && *p != 0xff && w < KVT_SHM_MAX_REGIONS) {
        kvt__shm_region_t *r = &ch->regions[w++];
        r->start = take(&p, &left, 8);
        r->end = take(&p, &left, 8);
        r->access = (uint32_t)take(&p, &left, 1) & KVT_ACCESS_REMOTE_RW;
        r->map_id = w;
    }
    if (left > 0 && *p == 0xff)
        take(&p, &left, 1);
    ch->nregions = nreg;
    /* What the initiator's callers do with the count. */
    n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    if (n > w)
        n = w; /* regions past those written are the previous input's */
    while (left > 0) {
        uint64_t lo = take(&p, &left, 8), len = take(&p, &left, 4) + 1;
        uint32_t access = (uint32_t)take(&p, &left, 1) & KVT_ACCESS_REMOTE_RW;
        uint64_t base = take(&p, &left, 8), mlen = take(&p, &left, 4) + 1;
        const kvt__shm_region_t *r;
        uint8_t *at;

        if (lo > UINT64_MAX - len)
            continue; /* refused at submission: a range that wraps */
        r = kvt__shm_region_find(ch, n, lo, lo + len, access);
        if (r != NULL &&
            (r < ch->regions || r >= ch->regions + n || r->start > lo ||
             lo + len > r->end || (r->access & access) != access))
            abort();
        /* A mapping is kept only when base + length does not wrap. */
        if (base > UINT64_MAX - mlen)
            continue;
        if (mlen > sizeof(local))
            mlen = sizeof(local);
        at = kvt__shm_at(local, base, mlen, lo, lo + len);
        if (at != NULL && (at < local || at + len > local + mlen))
            abort();
    }
    return 0;
}
