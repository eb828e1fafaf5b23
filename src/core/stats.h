/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_STATS_H
#define KVT_CORE_STATS_H

/*
 * The engine's counters (include/kvt/metrics.h is the contract). The hot
 * ones, per completed descriptor, live in blocks owned by one thread
 * each: a thread finds its block of the engine through a small
 * thread-local cache and bumps its counters with plain (relaxed load and
 * store, no locked instruction) arithmetic, so that counting costs a few
 * nanoseconds and no cache line is shared between threads; a reading sums
 * the blocks. Times are read from the TSC where it is invariant (a
 * cheaper clock than clock_gettime()), else from CLOCK_MONOTONIC. Rare
 * events (sessions, handshakes, notifications) are atomics of the
 * engine.
 */
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#include <kvt/metrics.h>

#define KVT__STATS_TL 8 /* KVT__TL_MAX */

typedef struct {
    _Atomic uint64_t ops[3]; /* write, read, notify (completed OK) */
    _Atomic uint64_t bytes[2];
    _Atomic uint64_t fail[KVT_STATS_STATUSES];
    _Atomic uint64_t lat[KVT_STATS_SIZE_CLASSES][KVT_STATS_LATENCY_BUCKETS];
    _Atomic uint64_t lat_sum[KVT_STATS_SIZE_CLASSES];
} kvt__tl_ctr_t;

typedef struct kvt__stats_shard {
    alignas(64) kvt__tl_ctr_t tl[KVT__STATS_TL];
    _Atomic uint64_t refused[KVT_STATS_STATUSES];
    _Atomic uint64_t batches, descs;
    struct kvt__stats_shard *next; /* the engine's blocks */
    uint64_t owner;                /* the thread's number */
} kvt__stats_shard_t;

typedef struct {
    int on;      /* 0: KVT_METRICS=off, nothing is counted */
    uint64_t id; /* unique in the process, for the threads' caches */
    kvt__stats_shard_t *_Atomic shards; /* one per thread that counted */
    _Atomic uint64_t notifies_received, notifies_dropped;
    _Atomic uint64_t hs_refused, hs_failed;
    _Atomic uint64_t sess_opened[KVT__STATS_TL], sess_closed[KVT__STATS_TL];
} kvt__stats_t;

struct kvt_engine;
/* The engine's counters (stats.c), and its place among the engines the
 * /metrics listener serves (stats_http.c; KVT_METRICS_PORT starts it
 * with the first engine). init() lists it; unlist() takes it off that
 * list (the start of its destruction); fini() frees the counters (its
 * end: completions count until then). list() is init()'s part in
 * stats_http.c: KVT_OK or KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__stats_init(struct kvt_engine *e);
kvt_status_t kvt__stats_list(struct kvt_engine *e);
void kvt__stats_unlist(struct kvt_engine *e);
void kvt__stats_fini(struct kvt_engine *e);

/* The calling thread's block (NULL when nothing is counted, or out of
 * memory). */
kvt__stats_shard_t *kvt__stats_shard(kvt__stats_t *st);

/* Add @v to a counter of the calling thread's own block. */
#define KVT__BUMP(a, v)                                                        \
    atomic_store_explicit(                                                     \
        &(a), atomic_load_explicit(&(a), memory_order_relaxed) + (v),          \
        memory_order_relaxed)

/* The clock of the metrics: ticks (TSC or nanoseconds). */
uint64_t kvt__stats_ticks(void);

/* Index for a status in failure arrays. */
static inline unsigned kvt__stats_status_index(int32_t status)
{
    unsigned i = status < 0 ? (unsigned)-status : 0;
    return i < KVT_STATS_STATUSES ? i : KVT_STATS_STATUSES - 1;
}

/* A descriptor became final: @tl its transport's index (0xff: refused
 * before any took it), @op, its bytes, its submission time. */
void kvt__stats_done(kvt__stats_t *st, unsigned tl, unsigned op, uint64_t bytes,
                     uint64_t t0, int32_t status);

#endif
