/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry of local memory regions (memreg.h): a sorted array of
 * disjoint regions, searched by binary search under a read lock.
 */
#include "core/memreg.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

kvt_status_t kvt__memreg_init(kvt__memreg_t *reg)
{
    pthread_rwlockattr_t attr;

    memset(reg, 0, sizeof(*reg));
    pthread_rwlockattr_init(&attr);
    /* Readers hold the lock for one socket call at a time; an unregister
     * must not starve behind a stream of them. */
    pthread_rwlockattr_setkind_np(&attr,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&reg->lock, &attr) != 0) {
        pthread_rwlockattr_destroy(&attr);
        return KVT_ERR_NO_MEMORY;
    }
    pthread_rwlockattr_destroy(&attr);
    return KVT_OK;
}

void kvt__memreg_fini(kvt__memreg_t *reg)
{
    pthread_rwlock_destroy(&reg->lock);
    for (size_t i = 0; i < reg->count; i++) {
        if (reg->regions[i].keys == NULL)
            continue;
        for (unsigned k = 0; k < KVT_MEMREG_KEYS; k++)
            free(reg->regions[i].keys[k].rkey);
        free(reg->regions[i].keys);
    }
    free(reg->regions);
    reg->regions = NULL;
}

/* Index of the first region whose end is above @addr. */
static size_t lower_bound(const kvt__memreg_t *reg, uint64_t addr)
{
    size_t lo = 0, hi = reg->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (reg->regions[mid].end <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int kvt__memreg_overlaps_locked(const kvt__memreg_t *reg, uint64_t start,
                                uint64_t end)
{
    size_t i = lower_bound(reg, start);
    return i < reg->count && reg->regions[i].start < end;
}

static int cmp_region(const void *a, const void *b)
{
    const kvt__region_t *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

kvt_status_t kvt__memreg_add(kvt__memreg_t *reg, const kvt__region_t *regions,
                             size_t count)
{
    kvt_status_t st = KVT_OK;
    kvt__region_t *tmp = NULL;

    if (count == 0)
        return KVT_OK;
    if (regions == NULL)
        return KVT_ERR_INVALID_PARAM;
    tmp = calloc(count, sizeof(*tmp));
    if (tmp == NULL)
        return KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < count; i++) {
        const kvt__region_t *g = &regions[i];
        if (g->start == 0 || g->end <= g->start ||
            (g->access & ~(uint32_t)KVT_ACCESS_REMOTE_RW) != 0) {
            KVT_LOG_W("register: invalid region %#llx+%llu access %#x",
                      (unsigned long long)g->start,
                      (unsigned long long)(g->end - g->start), g->access);
            st = KVT_ERR_INVALID_PARAM;
            goto out_free;
        }
        tmp[i] = *g;
    }
    qsort(tmp, count, sizeof(*tmp), cmp_region);
    for (size_t i = 1; i < count; i++) {
        if (tmp[i].start < tmp[i - 1].end) {
            st = KVT_ERR_EXISTS;
            goto out_free;
        }
    }

    pthread_rwlock_wrlock(&reg->lock);
    if (reg->count + count > KVT_MEMREG_MAX) {
        KVT_LOG_W("register: %zu regions are registered already; at most "
                  "%u can be",
                  reg->count, KVT_MEMREG_MAX);
        st = KVT_ERR_NO_SPACE;
        goto out_unlock;
    }
    for (size_t i = 0; i < count; i++) {
        if (kvt__memreg_overlaps_locked(reg, tmp[i].start, tmp[i].end)) {
            KVT_LOG_W("register: %#lx+%lu overlaps a registered region",
                      (unsigned long)tmp[i].start,
                      (unsigned long)(tmp[i].end - tmp[i].start));
            st = KVT_ERR_EXISTS;
            goto out_unlock;
        }
    }
    if (reg->count + count > reg->cap) {
        size_t cap = reg->cap ? reg->cap : 16;
        kvt__region_t *n;
        while (cap < reg->count + count)
            cap *= 2;
        n = realloc(reg->regions, cap * sizeof(*n));
        if (n == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto out_unlock;
        }
        reg->regions = n;
        reg->cap = cap;
    }
    /* Each registration is told apart from any earlier one at the same
     * address (a peer caching what it learnt of a region goes by it). */
    for (size_t i = 0; i < count; i++) {
        if (++reg->serial == 0)
            reg->serial = 1;
        tmp[i].serial = reg->serial;
    }
    /* Merge the sorted new regions into the sorted array, from the back. */
    {
        size_t i = reg->count, j = count, k = reg->count + count;
        while (j > 0) {
            if (i > 0 && reg->regions[i - 1].start > tmp[j - 1].start)
                reg->regions[--k] = reg->regions[--i];
            else
                reg->regions[--k] = tmp[--j];
        }
        reg->count += count;
        for (size_t n = 0; n < count; n++)
            reg->ndev += tmp[n].kind != KVT_MEM_HOST;
    }
out_unlock:
    pthread_rwlock_unlock(&reg->lock);
out_free:
    free(tmp);
    return st;
}

kvt_status_t kvt__memreg_remove(kvt__memreg_t *reg, uint64_t start,
                                kvt__region_t *out)
{
    kvt_status_t st = KVT_ERR_NOT_FOUND;
    size_t i;

    pthread_rwlock_wrlock(&reg->lock);
    i = lower_bound(reg, start);
    if (i < reg->count && reg->regions[i].start == start) {
        *out = reg->regions[i];
        reg->ndev -= out->kind != KVT_MEM_HOST;
        memmove(&reg->regions[i], &reg->regions[i + 1],
                (reg->count - i - 1) * sizeof(reg->regions[0]));
        reg->count--;
        atomic_fetch_add_explicit(&reg->gen, 1, memory_order_release);
        st = KVT_OK;
    }
    pthread_rwlock_unlock(&reg->lock);
    return st;
}

const kvt__region_t *kvt__memreg_find_locked(const kvt__memreg_t *reg,
                                             uint64_t addr, uint64_t len)
{
    size_t i;
    const kvt__region_t *r;

    if (len == 0 || addr > UINT64_MAX - len)
        return NULL;
    i = lower_bound(reg, addr);
    if (i >= reg->count)
        return NULL;
    r = &reg->regions[i];
    return r->start <= addr && addr + len <= r->end ? r : NULL;
}

int kvt__memreg_contains_host_locked(const kvt__memreg_t *reg, uint64_t addr,
                                     uint64_t len, uint32_t access)
{
    const kvt__region_t *r;

    if (!kvt__memreg_contains_locked(reg, addr, len, access))
        return 0;
    if (reg->ndev == 0)
        return 1;
    r = kvt__memreg_find_locked(reg, addr, len);
    return r != NULL && r->kind == KVT_MEM_HOST;
}

int kvt__memreg_contains_locked(const kvt__memreg_t *reg, uint64_t addr,
                                uint64_t len, uint32_t access)
{
    size_t i;
    const kvt__region_t *r;

    if (len == 0 || addr > UINT64_MAX - len)
        return 0;
    i = lower_bound(reg, addr);
    if (i >= reg->count)
        return 0;
    r = &reg->regions[i];
    return r->start <= addr && addr + len <= r->end &&
           (r->access & access) == access;
}

int kvt__memreg_contains(kvt__memreg_t *reg, uint64_t addr, uint64_t len,
                         uint32_t access)
{
    int ok;
    pthread_rwlock_rdlock(&reg->lock);
    ok = kvt__memreg_contains_locked(reg, addr, len, access);
    pthread_rwlock_unlock(&reg->lock);
    return ok;
}

size_t kvt__memreg_count_locked(const kvt__memreg_t *reg)
{
    return reg->count;
}

const kvt__region_t *kvt__memreg_at_locked(const kvt__memreg_t *reg, size_t i)
{
    return &reg->regions[i];
}
