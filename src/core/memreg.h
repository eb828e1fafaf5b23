/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_MEMREG_H
#define KVT_CORE_MEMREG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <kvt/engine.h>

/*
 * The registry of local memory: a sorted array of disjoint regions behind
 * a writer-preferring rwlock. Network paths hold the read lock only for
 * the span of one non-blocking socket call into or out of registered
 * memory, never across a wait, so kvt_mem_unregister() is never held up
 * by a stalled peer. Every removal bumps @gen; a path that validated
 * ranges under an older generation validates them again before touching
 * memory.
 */
typedef struct {
    uint64_t start;
    uint64_t end; /* exclusive */
    uint32_t access;
    uint32_t kind;
} kvt__region_t;

typedef struct {
    pthread_rwlock_t lock;
    kvt__region_t *regions;
    size_t count;
    size_t cap;
    _Atomic uint64_t gen;
} kvt__memreg_t;

kvt_status_t kvt__memreg_init(kvt__memreg_t *reg);
void kvt__memreg_fini(kvt__memreg_t *reg);

/* All-or-nothing insert of @count regions. */
kvt_status_t kvt__memreg_add(kvt__memreg_t *reg,
                             const kvt_mem_region_t *regions, size_t count);
kvt_status_t kvt__memreg_remove(kvt__memreg_t *reg, uint64_t start);

static inline void kvt__memreg_rdlock(kvt__memreg_t *reg)
{
    pthread_rwlock_rdlock(&reg->lock);
}
static inline void kvt__memreg_unlock(kvt__memreg_t *reg)
{
    pthread_rwlock_unlock(&reg->lock);
}

/*
 * With the read lock held: is [addr, addr+len) wholly inside one region
 * whose access includes all of @access? (@access 0: any region.)
 */
int kvt__memreg_contains_locked(const kvt__memreg_t *reg, uint64_t addr,
                                uint64_t len, uint32_t access);

/* With the read lock held: does some region overlap [start, end)? */
int kvt__memreg_overlaps_locked(const kvt__memreg_t *reg, uint64_t start,
                                uint64_t end);

/* With the read lock held: how many regions, and the i-th in address
 * order (valid until the lock is released). */
size_t kvt__memreg_count_locked(const kvt__memreg_t *reg);
const kvt__region_t *kvt__memreg_at_locked(const kvt__memreg_t *reg,
                                           size_t i);

/* Takes the read lock itself. */
int kvt__memreg_contains(kvt__memreg_t *reg, uint64_t addr, uint64_t len,
                         uint32_t access);

/* Copy the regions into a malloc'd array for a segment descriptor. */
kvt_status_t kvt__memreg_snapshot(kvt__memreg_t *reg,
                                  kvt_remote_region_t **regions_p,
                                  uint32_t *count_p);

#endif
