/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The peer's regions and their keys: the table a session loads from the
 * peer's descriptor (again after a registry change), and the lookup that
 * finds the region of a piece and unpacks its key on first use. Calls
 * nothing else of the transport.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx/ucx.h"
#include "util/log.h"

void kvt__ucx_regions_free(ucx_session_t *s)
{
    for (size_t i = 0; i < s->nregions; i++) {
        if (s->regions[i].rkey != NULL)
            ucp_rkey_destroy(s->regions[i].rkey);
        free(s->regions[i].key);
    }
    free(s->regions);
    s->regions = NULL;
    s->nregions = 0;
    s->last = 0;
}

/* The regions of @d that have a ucx key, in address order (descriptors
 * list them so; checked). */
kvt_status_t kvt__ucx_regions_load(ucx_session_t *s, const kvt__segdesc_t *d)
{
    const kvt__segdesc_tl_t *sec = kvt__segdesc_tl(d, kvt__tl_ucx.id);
    ucx_rregion_t *r;
    size_t n = 0;

    if (sec == NULL)
        return KVT_ERR_PROTOCOL;
    r = calloc(d->nregions ? d->nregions : 1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < d->nregions; i++) {
        uint32_t klen;
        const uint8_t *k = kvt__segdesc_key(sec, i, &klen);
        const kvt_remote_region_t *dr = &d->regions[i];
        if (k == NULL || klen == 0 || dr->kind != KVT_MEM_HOST)
            continue;
        if (n > 0 && dr->addr < r[n - 1].end)
            goto bad;
        r[n].key = malloc(klen);
        if (r[n].key == NULL) {
            s->regions = r, s->nregions = n;
            kvt__ucx_regions_free(s);
            return KVT_ERR_NO_MEMORY;
        }
        memcpy(r[n].key, k, klen);
        r[n].klen = klen;
        r[n].start = dr->addr;
        r[n].end = dr->addr + dr->length;
        r[n].access = dr->access;
        n++;
    }
    s->regions = r;
    s->nregions = n;
    s->last = 0;
    return KVT_OK;

bad:
    s->regions = r, s->nregions = n;
    kvt__ucx_regions_free(s);
    return KVT_ERR_PROTOCOL;
}

/* The region that holds all of [addr, +len) with @access, its key
 * unpacked; NULL when there is none (worker thread). */
ucx_rregion_t *kvt__ucx_region_find(ucx_session_t *s, uint64_t addr,
                                    uint64_t len, uint32_t access)
{
    ucx_rregion_t *r = NULL;
    size_t lo = 0, hi = s->nregions;

    if (s->last < s->nregions && addr >= s->regions[s->last].start &&
        addr < s->regions[s->last].end) {
        r = &s->regions[s->last];
    } else {
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->regions[mid].end <= addr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == s->nregions || addr < s->regions[lo].start)
            return NULL;
        r = &s->regions[lo];
        s->last = lo;
    }
    if (len > r->end - addr || (r->access & access) != access)
        return NULL;
    if (r->rkey == NULL) {
        ucs_status_t st = ucp_ep_rkey_unpack(s->conn->ep, r->key, &r->rkey);
        if (st != UCS_OK) {
            KVT_LOG_W("ucx: %s: a region's key does not unpack: %s",
                      s->base.name, ucs_status_string(st));
            r->rkey = NULL;
            return NULL;
        }
    }
    return r;
}
