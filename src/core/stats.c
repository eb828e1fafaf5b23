/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The counters of an engine's metrics (core/stats.h, include/kvt/metrics.h):
 * per-thread blocks bumped on the data path, the clock they time with,
 * and kvt_engine_stats(), which sums them. The Prometheus text is in
 * stats_prom.c, the /metrics listener in stats_http.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "core/engine_int.h"
#include "core/stats.h"
#include "util/time.h"

static _Atomic uint64_t next_id = 1, next_thread = 1;
/* The calling thread's state, in one thread-local object (its address is
 * computed once per call: in a shared library each thread-local access
 * may cost a call). */
#define TCACHE 4
typedef struct {
    uint64_t thread; /* this thread's number, 0 until it counts */
    /* Its blocks of the last engines it counted for. */
    struct {
        uint64_t id;
        kvt__stats_shard_t *b;
    } cache[TCACHE];
    unsigned next;
    /* Inside kvt__comp_run_begin()/end(): the moment of the run, read on
     * its first use (0: not yet). */
    int in_run;
    uint64_t run_now;
} tls_t;
static _Thread_local tls_t tls;

void kvt__comp_run_begin(void)
{
    tls_t *t = &tls;

    t->in_run = 1;
    t->run_now = 0;
}

void kvt__comp_run_end(void)
{
    tls.in_run = 0;
}

static kvt__stats_shard_t *shard_of(kvt__stats_t *st, tls_t *t)
{
    kvt__stats_shard_t *b;

    if (!st->on)
        return NULL;
    for (unsigned i = 0; i < TCACHE; i++)
        if (t->cache[i].id == st->id)
            return t->cache[i].b;
    if (t->thread == 0)
        t->thread = atomic_fetch_add(&next_thread, 1);
    /* Counted for this engine before (the cache forgot it), or a new
     * block, pushed onto the engine's list. */
    for (b = atomic_load_explicit(&st->shards, memory_order_acquire);
         b != NULL && b->owner != t->thread; b = b->next)
        ;
    if (b == NULL) {
        if (posix_memalign((void **)&b, 64, sizeof(*b)) != 0)
            return NULL;
        memset(b, 0, sizeof(*b));
        b->owner = t->thread;
        b->next = atomic_load_explicit(&st->shards, memory_order_relaxed);
        while (!atomic_compare_exchange_weak_explicit(&st->shards, &b->next, b,
                                                      memory_order_release,
                                                      memory_order_relaxed))
            ;
    }
    t->cache[t->next].id = st->id;
    t->cache[t->next].b = b;
    t->next = (t->next + 1) % TCACHE;
    return b;
}

kvt__stats_shard_t *kvt__stats_shard(kvt__stats_t *st)
{
    return shard_of(st, &tls);
}

/* The TSC, where it runs at a constant rate through every power state
 * (constant_tsc and nonstop_tsc in /proc/cpuinfo), calibrated against
 * CLOCK_MONOTONIC once; else CLOCK_MONOTONIC itself. */
static pthread_once_t tsc_once = PTHREAD_ONCE_INIT;
static int tsc_on;
static double ns_per_tick = 1.0;

#if defined(__x86_64__)
#include <x86intrin.h> /* IWYU pragma: keep */
static void tsc_init(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    int c = 0, n = 0;
    uint64_t t0, t1, r0, r1;

    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL && !(c && n))
        if (strncmp(line, "flags", 5) == 0) {
            c = strstr(line, " constant_tsc") != NULL;
            n = strstr(line, " nonstop_tsc") != NULL;
            break;
        }
    fclose(f);
    if (!c || !n)
        return;
    t0 = kvt__now_ns();
    r0 = __rdtsc();
    do
        t1 = kvt__now_ns();
    while (t1 - t0 < 2000000);
    r1 = __rdtsc();
    if (r1 <= r0)
        return;
    ns_per_tick = (double)(t1 - t0) / (double)(r1 - r0);
    tsc_on = 1;
}

uint64_t kvt__stats_ticks(void)
{
    return tsc_on ? __rdtsc() : kvt__now_ns();
}
#else
static void tsc_init(void)
{
}

uint64_t kvt__stats_ticks(void)
{
    return kvt__now_ns();
}
#endif

/* Latency bucket bounds, microseconds: 10 us to 10 s in a 1-2-5 series. */
static const uint64_t bounds_us[KVT_STATS_LATENCY_BUCKETS - 1] = {
    10,     20,      50,      100,     200,     500,    1000,
    2000,   5000,    10000,   20000,   50000,   100000, 200000,
    500000, 1000000, 2000000, 5000000, 10000000};

uint64_t kvt_stats_latency_bound_us(unsigned i)
{
    return i < KVT_STATS_LATENCY_BUCKETS - 1 ? bounds_us[i] : 0;
}

static unsigned size_class(uint64_t bytes)
{
    return bytes <= 4096 ? 0 : bytes <= 65536 ? 1 : bytes <= (1u << 20) ? 2 : 3;
}

static unsigned bucket_of(uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned i = 0;

    while (i < KVT_STATS_LATENCY_BUCKETS - 1 && us > bounds_us[i])
        i++;
    return i;
}

void kvt__stats_done(kvt__stats_t *st, unsigned tl, unsigned op, uint64_t bytes,
                     uint64_t t0, int32_t status)
{
    tls_t *t = &tls;
    kvt__stats_shard_t *sh = shard_of(st, t);
    kvt__tl_ctr_t *c;
    uint64_t ns, now;
    unsigned sc;

    if (sh == NULL)
        return;
    if (tl >= KVT__STATS_TL) {
        KVT__BUMP(sh->refused[kvt__stats_status_index(status)], 1);
        return;
    }
    c = &sh->tl[tl];
    if (status == KVT_OK) {
        unsigned k = op == KVT_OP_WRITE ? 0 : op == KVT_OP_READ ? 1 : 2;
        KVT__BUMP(c->ops[k], 1);
        if (k < 2)
            KVT__BUMP(c->bytes[k], bytes);
    } else {
        KVT__BUMP(c->fail[kvt__stats_status_index(status)], 1);
    }
    if (t->in_run) {
        if (t->run_now == 0)
            t->run_now = kvt__stats_ticks();
        now = t->run_now;
    } else {
        now = kvt__stats_ticks();
    }
    ns = now > t0 ? (uint64_t)((double)(now - t0) * ns_per_tick) : 0;
    sc = size_class(bytes);
    KVT__BUMP(c->lat[sc][bucket_of(ns)], 1);
    KVT__BUMP(c->lat_sum[sc], ns);
}

#define LOAD(a) atomic_load_explicit(&(a), memory_order_relaxed)

kvt_status_t kvt_engine_stats(kvt_engine_h e, kvt_engine_stats_t *out)
{
    kvt__stats_t *st;
    uint64_t done = 0;

    if (e == NULL || out == NULL)
        return KVT_ERR_INVALID_PARAM;
    uint32_t version = out->version;

    if (version != 1 && version != KVT_STATS_VERSION)
        return KVT_ERR_VERSION;
    st = &e->stats;
    /* A caller of version 1 has no room for what came after it. */
    memset(out, 0,
           version == 1 ? offsetof(kvt_engine_stats_t, served) : sizeof(*out));
    out->version = version;
    out->ntransports =
        e->ntl < KVT_STATS_TRANSPORTS ? e->ntl : KVT_STATS_TRANSPORTS;
    for (unsigned t = 0; t < out->ntransports; t++) {
        kvt_transport_stats_t *o = &out->transports[t];
        snprintf(o->name, sizeof(o->name), "%s", e->tl[t]->ops->name);
        o->sessions_opened = LOAD(st->sess_opened[t]);
        o->sessions_open = o->sessions_opened - LOAD(st->sess_closed[t]);
        if (version >= 2 && e->tl[t]->ops->served != NULL) {
            uint64_t v[4] = {0};
            e->tl[t]->ops->served(e->tl[t], v);
            out->served[t] = (kvt_served_stats_t){v[0], v[1], v[2], v[3]};
        }
    }
    for (kvt__stats_shard_t *sh =
             atomic_load_explicit(&st->shards, memory_order_acquire);
         sh != NULL; sh = sh->next) {
        out->batches += LOAD(sh->batches);
        out->descriptors += LOAD(sh->descs);
        for (unsigned i = 0; i < KVT_STATS_STATUSES; i++) {
            uint64_t v = LOAD(sh->refused[i]);
            out->refused[i] += v;
            done += v;
        }
        for (unsigned t = 0; t < out->ntransports; t++) {
            kvt__tl_ctr_t *c = &sh->tl[t];
            kvt_transport_stats_t *o = &out->transports[t];
            uint64_t w = LOAD(c->ops[0]), r = LOAD(c->ops[1]),
                     n = LOAD(c->ops[2]);
            o->writes += w;
            o->reads += r;
            o->notifies += n;
            done += w + r + n;
            o->write_bytes += LOAD(c->bytes[0]);
            o->read_bytes += LOAD(c->bytes[1]);
            for (unsigned i = 0; i < KVT_STATS_STATUSES; i++) {
                uint64_t v = LOAD(c->fail[i]);
                o->failures[i] += v;
                done += v;
            }
            for (unsigned s = 0; s < KVT_STATS_SIZE_CLASSES; s++) {
                for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++)
                    o->latency[s][b] += LOAD(c->lat[s][b]);
                o->latency_sum_ns[s] += LOAD(c->lat_sum[s]);
            }
        }
    }
    /* Read in this order, completions may be counted that their
     * submission was not yet: never below 0. */
    out->inflight = out->descriptors > done ? out->descriptors - done : 0;
    out->notifies_received = LOAD(st->notifies_received);
    out->notifies_dropped = LOAD(st->notifies_dropped);
    out->handshakes_refused = LOAD(st->hs_refused);
    out->handshakes_failed = LOAD(st->hs_failed);
    pthread_mutex_lock(&e->sess_lock);
    out->segments_open = e->nnames;
    pthread_mutex_unlock(&e->sess_lock);
    kvt__memreg_rdlock(&e->reg);
    out->regions = kvt__memreg_count_locked(&e->reg);
    for (size_t i = 0; i < out->regions; i++) {
        const kvt__region_t *r = kvt__memreg_at_locked(&e->reg, i);
        out->region_bytes += r->end - r->start;
    }
    kvt__memreg_unlock(&e->reg);
    return KVT_OK;
}

kvt_status_t kvt__stats_init(kvt_engine_h e)
{
    const char *off = getenv("KVT_METRICS");

    /* KVT_METRICS=off: no counting on the data path (to measure what it
     * costs); the engine's metrics then read 0. */
    e->stats.on =
        !(off != NULL && (strcmp(off, "off") == 0 || strcmp(off, "0") == 0));
    e->cfg.metrics_on = e->stats.on;
    e->stats.id = atomic_fetch_add(&next_id, 1);
    atomic_store(&e->stats.shards, NULL);
    pthread_once(&tsc_once, tsc_init);
    return kvt__stats_list(e);
}

void kvt__stats_fini(kvt_engine_h e)
{
    kvt__stats_shard_t *b = atomic_exchange(&e->stats.shards, NULL);

    kvt__stats_unlist(e);
    while (b != NULL) {
        kvt__stats_shard_t *n = b->next;
        free(b);
        b = n;
    }
}
