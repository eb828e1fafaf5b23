/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The batch id table: Mooncake-style integer ids for kvt batches. See
 * kvtpy.h for the id layout and the reference rule. Every function here
 * runs with or without the GIL and touches no Python object.
 */
#include "kvtpy.h"

#include <stdlib.h>

/* Generations stay below 2**31 so that every id fits a signed 64-bit
 * integer, in case callers keep ids in numpy int64 arrays. */
#define GEN_MAX 0x7fffffffu

void kvtpy_ids_init(kvtpy_ids_t *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
}

void kvtpy_ids_fini(kvtpy_ids_t *t)
{
    free(t->entries);
    free(t->free_slots);
    pthread_mutex_destroy(&t->lock);
    memset(t, 0, sizeof(*t));
}

static uint64_t make_id(const kvtpy_id_entry_t *e, size_t slot)
{
    return (uint64_t)e->gen << 32 | (uint64_t)(slot + 1);
}

/* With the lock held: the slot of a live @id, or -1. */
static long find_locked(kvtpy_ids_t *t, uint64_t id)
{
    uint64_t low = id & 0xffffffffu;
    kvtpy_id_entry_t *e;

    if (low == 0 || low > t->count)
        return -1;
    e = &t->entries[low - 1];
    if (!e->live || (uint64_t)e->gen != id >> 32)
        return -1;
    return (long)(low - 1);
}

/* With the lock held: free the batch of a dead, unreferenced slot and make
 * the slot reusable. The free list has room for every slot (its capacity
 * follows the entries'). */
static void reclaim_locked(kvtpy_ids_t *t, size_t slot)
{
    kvtpy_id_entry_t *e = &t->entries[slot];

    /* Only final batches are released, so this does not refuse; if it
     * ever did, the engine would free the batch on destruction. */
    kvt_batch_free(e->batch);
    e->batch = NULL;
    t->free_slots[t->nfree++] = (uint32_t)slot;
}

/* With the lock held: make the id unknown; reclaim when unreferenced. */
static void release_locked(kvtpy_ids_t *t, size_t slot)
{
    kvtpy_id_entry_t *e = &t->entries[slot];

    e->live = 0;
    e->gen = e->gen >= GEN_MAX ? 1 : e->gen + 1;
    if (e->refs == 0)
        reclaim_locked(t, slot);
}

uint64_t kvtpy_ids_add(kvtpy_ids_t *t, kvt_batch_h b)
{
    kvtpy_id_entry_t *e;
    uint64_t id = 0;
    size_t slot;

    pthread_mutex_lock(&t->lock);
    if (t->nfree > 0) {
        slot = t->free_slots[--t->nfree];
    } else {
        if (t->count == t->cap) {
            size_t cap = t->cap ? t->cap * 2 : 64;
            kvtpy_id_entry_t *ne;
            uint32_t *nf;

            if (cap > 0xffffffffu)
                goto out;
            ne = realloc(t->entries, cap * sizeof(*ne));
            if (ne == NULL)
                goto out;
            t->entries = ne;
            nf = realloc(t->free_slots, cap * sizeof(*nf));
            if (nf == NULL)
                goto out;
            t->free_slots = nf;
            t->cap = cap;
        }
        slot = t->count++;
        t->entries[slot].gen = 1;
    }
    e = &t->entries[slot];
    e->batch = b;
    e->refs = 0;
    e->live = 1;
    id = make_id(e, slot);
out:
    pthread_mutex_unlock(&t->lock);
    return id;
}

kvt_status_t kvtpy_ids_check(kvtpy_ids_t *t, uint64_t id)
{
    kvt_status_t st;
    long slot;

    pthread_mutex_lock(&t->lock);
    slot = find_locked(t, id);
    if (slot < 0) {
        pthread_mutex_unlock(&t->lock);
        return KVT_ERR_NOT_FOUND;
    }
    st = kvt_batch_query(t->entries[slot].batch, NULL);
    /* Mooncake frees an id that completed or failed; a timed-out one
     * stays until get_batch_transfer_status() consumes it. */
    if (st == KVT_OK || (st < 0 && st != KVT_ERR_TIMEDOUT))
        release_locked(t, (size_t)slot);
    pthread_mutex_unlock(&t->lock);
    return st;
}

void kvtpy_ids_acquire(kvtpy_ids_t *t, const uint64_t *ids, size_t n,
                       kvt_batch_h *batches, uint32_t *slots)
{
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        long slot = find_locked(t, ids[i]);
        batches[i] = NULL;
        if (slot < 0)
            continue;
        t->entries[slot].refs++;
        batches[i] = t->entries[slot].batch;
        slots[i] = (uint32_t)slot;
    }
    pthread_mutex_unlock(&t->lock);
}

void kvtpy_ids_finish(kvtpy_ids_t *t, const kvt_batch_h *batches,
                      const uint32_t *slots, size_t n)
{
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        kvtpy_id_entry_t *e;
        if (batches[i] == NULL)
            continue;
        e = &t->entries[slots[i]];
        /* A duplicate id in the list, or another thread, may have
         * released it already; the reference still has to go. */
        if (e->live)
            release_locked(t, slots[i]);
        if (--e->refs == 0 && !e->live)
            reclaim_locked(t, slots[i]);
    }
    pthread_mutex_unlock(&t->lock);
}
