/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_MEMREG_H
#define KVT_CORE_MEMREG_H

/*
 * The registry of local memory: a sorted array of disjoint regions behind
 * a writer-preferring rwlock. Network paths hold the read lock only for
 * the span of one non-blocking socket call into or out of registered
 * memory, never across a wait, so kvt_mem_unregister() is never held up
 * by a stalled peer. Every removal bumps @gen; a path that validated
 * ranges under an older generation validates them again before touching
 * memory.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <kvt/engine.h> /* IWYU pragma: keep */

/* Transports one engine runs, and so keys a region may have. */
#define KVT_MEMREG_KEYS 8
/* Regions one engine may register: as many as its descriptor can carry
 * (KVT_SEGDESC_MAX_REGIONS). */
#define KVT_MEMREG_MAX (1u << 20)

/* What one transport keeps for a region it registered (mem_reg()): its
 * own handle, and the packed key a peer needs to address the region
 * through it (malloc'd; NULL when none), which the descriptor carries. */
typedef struct {
    void *memh;
    uint8_t *rkey;
    uint32_t rkey_len;
} kvt__tl_key_t;

typedef struct {
    uint64_t start;
    uint64_t end; /* exclusive */
    uint32_t access;
    uint16_t kind;  /* kvt_mem_kind_t */
    int16_t device; /* of a device kind; -1 for host memory */
    /* Per transport (by its index in the engine), or NULL when no
     * transport keeps anything for the region; owned by the registry. */
    kvt__tl_key_t *keys;
    /* Set by kvt__memreg_add(): this registration's number, never 0,
     * different from every other region's of the registry (until 2^32
     * registrations later). */
    uint32_t serial;
} kvt__region_t;

typedef struct {
    pthread_rwlock_t lock;
    kvt__region_t *regions;
    size_t count;
    size_t cap;
    size_t ndev;     /* regions of a device kind (not host memory) */
    uint32_t serial; /* the last region's (kvt__region_t.serial) */
    _Atomic uint64_t gen;
} kvt__memreg_t;

kvt_status_t kvt__memreg_init(kvt__memreg_t *reg);
void kvt__memreg_fini(kvt__memreg_t *reg);

/*
 * All-or-nothing insert of @count regions (start, end, access, kind,
 * device and keys set): KVT_ERR_INVALID_PARAM for an empty, wrapping or
 * badly accessed one, KVT_ERR_EXISTS when one overlaps another or a
 * registered region, KVT_ERR_NO_SPACE past KVT_MEMREG_MAX regions,
 * KVT_ERR_NO_MEMORY. On success the registry owns
 * their keys.
 */
kvt_status_t kvt__memreg_add(kvt__memreg_t *reg, const kvt__region_t *regions,
                             size_t count);
/* Remove the region starting at @start into *out (the caller then owns
 * its keys). KVT_ERR_NOT_FOUND. */
kvt_status_t kvt__memreg_remove(kvt__memreg_t *reg, uint64_t start,
                                kvt__region_t *out);

/* The registry's generation: bumped by every removal. */
static inline uint64_t kvt__memreg_gen(kvt__memreg_t *reg)
{
    return atomic_load_explicit(&reg->gen, memory_order_acquire);
}

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
/* As kvt__memreg_contains_locked(), and the region is host memory: for
 * the paths that touch it with host code (a same-host peer's staged
 * pieces). */
int kvt__memreg_contains_host_locked(const kvt__memreg_t *reg, uint64_t addr,
                                     uint64_t len, uint32_t access);
int kvt__memreg_contains_locked(const kvt__memreg_t *reg, uint64_t addr,
                                uint64_t len, uint32_t access);

/* With the read lock held: does some region overlap [start, end)? */
int kvt__memreg_overlaps_locked(const kvt__memreg_t *reg, uint64_t start,
                                uint64_t end);

/* With the read lock held: how many regions, and the i-th in address
 * order (valid until the lock is released). */
size_t kvt__memreg_count_locked(const kvt__memreg_t *reg);
const kvt__region_t *kvt__memreg_at_locked(const kvt__memreg_t *reg, size_t i);

/* With the read lock held: the region that holds all of [addr,
 * addr+len), or NULL. */
const kvt__region_t *kvt__memreg_find_locked(const kvt__memreg_t *reg,
                                             uint64_t addr, uint64_t len);

/* Takes the read lock itself. */
int kvt__memreg_contains(kvt__memreg_t *reg, uint64_t addr, uint64_t len,
                         uint32_t access);

#endif
