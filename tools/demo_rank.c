/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank of kvt demo (demo.h): its engine, connector and paged KV caches
 * (in host memory, or in device memory reached through a host mirror);
 * prefill's simulated forward pass, layer by layer, each layer's KV a
 * deterministic function of request, layer, cache, token, head and byte;
 * decode's receivers, poisoning and check of every byte; reports to the
 * demo process over a pipe.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <kvt/connector.h>
#include <kvt/kvt.h>

#include "demo.h"

/* ---- KV contents -----------------------------------------------------------
 */

/*
 * The bytes of one head of one token: 64-bit words derived from a seed of
 * (room, layer, cache, token, global head). Cheap enough to write and
 * check at memory speed, and different for every run of bytes.
 */
static uint64_t run_seed(uint64_t room, uint32_t layer, uint32_t kind,
                         uint64_t token, uint32_t head)
{
    return mix64(room ^ mix64(((uint64_t)layer << 40) ^ ((uint64_t)kind << 32) ^
                              (token << 8) ^ head));
}

static inline uint64_t run_word(uint64_t seed, uint32_t i)
{
    return (seed ^ (i * 0x9e3779b97f4a7c15ull)) * 0xff51afd7ed558ccdull;
}

static void run_fill(uint8_t *p, uint32_t bytes, uint64_t seed)
{
    uint32_t i = 0;
    for (; (i + 1) * 8 <= bytes; i++) {
        uint64_t w = run_word(seed, i);
        memcpy(p + i * 8, &w, 8);
    }
    for (uint32_t b = i * 8; b < bytes; b++)
        p[b] = (uint8_t)(run_word(seed, i) >> (8 * (b - i * 8)));
}

static uint64_t run_check(const uint8_t *p, uint32_t bytes, uint64_t seed)
{
    uint64_t bad = 0;
    uint32_t i = 0;
    for (; (i + 1) * 8 <= bytes; i++) {
        uint64_t w, want = run_word(seed, i);
        memcpy(&w, p + i * 8, 8);
        if (w != want)
            for (int k = 0; k < 8; k++)
                bad += ((w ^ want) >> (8 * k) & 0xff) != 0;
    }
    for (uint32_t b = i * 8; b < bytes; b++)
        bad += p[b] != (uint8_t)(run_word(seed, i) >> (8 * (b - i * 8)));
    return bad;
}

/* ---- Reports from ranks to the demo process --------------------------------
 */

static int rep_fd = -1;

static void report(const rep_t *r)
{
    ssize_t n = write(rep_fd, r, sizeof(*r));
    (void)n;
}

static void report_error(int side, uint32_t rank, const char *fmt, ...)
{
    rep_t r = {.type = REP_ERROR, .side = (uint32_t)side, .rank = rank};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.text, sizeof(r.text), fmt, ap);
    va_end(ap);
    report(&r);
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull),
                          (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ---- A rank ----------------------------------------------------------------
 */

#define AUX_BYTES 64

typedef struct {
    const opts_t *o;
    int side;
    uint32_t rank, tp;
    uint32_t heads, head0; /* local heads and the first global one */
    uint32_t ncache_per_layer;
    uint32_t nlayers; /* target + draft */
    uint64_t pool;    /* blocks */
    uint64_t block_bytes;
    kvt_engine_h e;
    kvt_conn_h conn;
    uint8_t *arena;
    uint64_t arena_len;
    /* --memory=cuda: the arena is device memory, which this code reaches
     * through a host mirror and kvt_mem_copy() (host_of(), dev_sync()). */
    uint8_t *mirror;
    kvt_kv_cache_t *caches;
    uint8_t *aux;
    uint64_t aux_slots;
    uint32_t *free_blocks;
    uint64_t nfree;
    uint64_t rng;
} rank_t;

static uint64_t rng_next(rank_t *r)
{
    r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
    return r->rng >> 17;
}

/* Random, non-contiguous block ids from the free list. */
static void take_blocks(rank_t *r, uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t j = rng_next(r) % r->nfree;
        ids[i] = r->free_blocks[j];
        r->free_blocks[j] = r->free_blocks[--r->nfree];
    }
}

static void give_blocks(rank_t *r, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        r->free_blocks[r->nfree++] = ids[i];
}

static uint32_t cache_kind(const rank_t *r, uint32_t c)
{
    if (r->o->m->latent_bytes)
        return KVT_CACHE_LATENT;
    return c == 0 ? KVT_CACHE_K : KVT_CACHE_V;
}

static uint32_t run_bytes(const rank_t *r)
{
    return r->o->m->latent_bytes ? r->o->m->latent_bytes : r->o->m->head_bytes;
}

/* Where this code reads and writes @p of the arena: the arena itself, or
 * its host mirror when the arena is device memory. */
static uint8_t *host_of(const rank_t *r, uint8_t *p)
{
    return r->mirror != NULL ? r->mirror + (p - r->arena) : p;
}

/* Device memory: bring [p, +len) of the arena into the mirror (@to_dev
 * 0) or from it to the device. 0, or -1 (reported). */
static int dev_sync(rank_t *r, uint8_t *p, uint64_t len, int to_dev)
{
    kvt_status_t st;

    if (r->mirror == NULL)
        return 0;
    st = to_dev ? kvt_mem_copy(p, host_of(r, p), len)
                : kvt_mem_copy(host_of(r, p), p, len);
    if (st != KVT_OK) {
        report_error(r->side, r->rank, "device copy: %s", kvt_status_str(st));
        return -1;
    }
    return 0;
}

/* Write (prefill) or check (decode) layer @l of logical blocks of a
 * request held in local blocks @ids. Returns mismatching bytes. */
static uint64_t layer_bytes(rank_t *r, const req_t *q, uint32_t l,
                            const uint32_t *ids, uint32_t n, int check)
{
    uint32_t tpb = r->o->m->tokens_per_block, rb = run_bytes(r);
    uint64_t bad = 0;

    for (uint32_t c = 0; c < r->ncache_per_layer; c++) {
        const kvt_kv_cache_t *kc = &r->caches[l * r->ncache_per_layer + c];
        uint32_t kind = cache_kind(r, c);
        for (uint32_t b = 0; b < n; b++) {
            uint8_t *dblk = (uint8_t *)kc->base + ids[b] * kc->block_bytes;
            uint8_t *blk = host_of(r, dblk);
            if (check && dev_sync(r, dblk, kc->block_bytes, 0) != 0) {
                bad += kc->block_bytes;
                continue;
            }
            for (uint32_t t = 0; t < tpb; t++) {
                uint64_t token = (uint64_t)b * tpb + t;
                for (uint32_t h = 0; h < r->heads; h++) {
                    uint64_t s =
                        run_seed(q->room, l, kind, token, r->head0 + h);
                    uint8_t *p = blk + ((uint64_t)t * r->heads + h) * rb;
                    if (check)
                        bad += run_check(p, rb, s);
                    else
                        run_fill(p, rb, s);
                }
            }
            if (!check)
                dev_sync(r, dblk, kc->block_bytes, 1);
        }
    }
    return bad;
}

static void aux_bytes(rank_t *r, const req_t *q, uint64_t slot, int check,
                      uint64_t *bad)
{
    uint8_t *d = r->aux + slot * AUX_BYTES, *p = host_of(r, d);
    uint64_t s = mix64(q->room ^ 0xa0a0a0a0ull);
    if (check) {
        if (dev_sync(r, d, AUX_BYTES, 0) != 0)
            *bad += AUX_BYTES;
        else
            *bad += run_check(p, AUX_BYTES, s);
    } else {
        run_fill(p, AUX_BYTES, s);
        dev_sync(r, d, AUX_BYTES, 1);
    }
}

static int rank_setup(rank_t *r)
{
    const model_t *m = r->o->m;
    kvt_engine_params_t ep = {0};
    kvt_conn_params_t cp = {0};
    kvt_kv_layout_t layout = {0};
    kvt_aux_buffer_t aux;
    char boot[64];
    kvt_status_t st;
    uint64_t per_cache, off = 0;
    uint32_t maxb =
        (r->o->max_len + m->tokens_per_block - 1) / m->tokens_per_block;
    void *arena;

    r->nlayers = m->layers + m->draft_layers;
    r->ncache_per_layer = m->latent_bytes ? 1 : 2;
    if (m->latent_bytes) {
        r->heads = 1;
        r->head0 = 0;
    } else {
        r->heads = m->kv_heads / r->tp;
        r->head0 = r->rank * r->heads;
    }
    r->block_bytes = (uint64_t)m->tokens_per_block * r->heads * run_bytes(r);
    r->pool = (uint64_t)maxb * r->o->concurrency * 2 + 8;
    r->aux_slots = (uint64_t)r->o->concurrency * 2;
    per_cache = r->pool * r->block_bytes;
    r->arena_len =
        per_cache * r->nlayers * r->ncache_per_layer + r->aux_slots * AUX_BYTES;

    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    ep.local_host = "127.0.0.1";
    ep.transports = strcmp(r->o->protocol, "tcp") == 0 ? KVT_TRANSPORT_TCP
                    : strcmp(r->o->protocol, "shm") == 0
                        ? KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM
                        : KVT_TRANSPORT_ALL;
    st = kvt_engine_create(&ep, &r->e);
    if (st != KVT_OK) {
        report_error(r->side, r->rank, "engine: %s", kvt_status_str(st));
        return -1;
    }
    if (r->o->cuda) {
        /* Device memory, one device per rank (round robin), and a host
         * mirror for this code's own reads and writes. */
        kvt_mem_domain_info_t dm[8];
        kvt_mem_params_t mp = {0};
        size_t nd = 0;
        int32_t ndev = 1;
        uint32_t idx =
            r->side == SIDE_PREFILL ? r->rank : r->o->prefill_tp + r->rank;
        if (kvt_mem_domains(dm, 8, &nd) == KVT_OK)
            for (size_t i = 0; i < nd && i < 8; i++)
                if (dm[i].kind == KVT_MEM_CUDA && dm[i].devices > 0)
                    ndev = dm[i].devices;
        mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
        mp.kind = KVT_MEM_CUDA;
        mp.device = (int32_t)(idx % (uint32_t)ndev);
        st = kvt_mem_alloc_ex(r->e, r->arena_len, &mp, &arena);
        r->mirror = calloc(1, r->arena_len);
        if (st == KVT_OK && r->mirror == NULL)
            st = KVT_ERR_NO_MEMORY;
    } else {
        st = kvt_mem_alloc(r->e, r->arena_len, KVT_ACCESS_REMOTE_RW, &arena);
    }
    if (st != KVT_OK) {
        report_error(r->side, r->rank, "allocating %llu bytes: %s",
                     (unsigned long long)r->arena_len, kvt_status_str(st));
        return -1;
    }
    r->arena = arena;
    /* A GPU's KV cache takes no page faults: have every page of the host
     * arena in place before the run, so that first touches (and the
     * kernel zeroing each page then) are not part of what is measured. */
    if (!r->o->cuda &&
        madvise(r->arena, r->arena_len, MADV_POPULATE_WRITE) != 0)
        for (uint64_t i = 0; i < r->arena_len; i += 4096)
            ((volatile uint8_t *)r->arena)[i] = 0;
    r->caches =
        calloc((size_t)r->nlayers * r->ncache_per_layer, sizeof(*r->caches));
    for (uint32_t l = 0; l < r->nlayers; l++) {
        for (uint32_t c = 0; c < r->ncache_per_layer; c++) {
            kvt_kv_cache_t *kc = &r->caches[l * r->ncache_per_layer + c];
            kc->layer = l;
            kc->kind = cache_kind(r, c);
            kc->block_layout = KVT_BLOCK_TOKEN_MAJOR;
            kc->tokens_per_block = m->tokens_per_block;
            kc->heads = r->heads;
            kc->head_bytes = run_bytes(r);
            kc->base = r->arena + off;
            kc->block_bytes = r->block_bytes;
            kc->num_blocks = r->pool;
            off += per_cache;
        }
    }
    r->aux = r->arena + off;
    aux = (kvt_aux_buffer_t){r->aux, AUX_BYTES, r->aux_slots};
    layout.num_layers = m->layers;
    layout.num_draft_layers = m->draft_layers;
    layout.num_caches = (size_t)r->nlayers * r->ncache_per_layer;
    layout.caches = r->caches;
    layout.num_aux = 1;
    layout.aux = &aux;

    snprintf(boot, sizeof(boot), "%s", r->o->metadata);
    cp.field_mask = KVT_CONN_PARAM_ROLE | KVT_CONN_PARAM_ENGINE |
                    KVT_CONN_PARAM_LAYOUT | KVT_CONN_PARAM_BOOTSTRAP_ADDR |
                    KVT_CONN_PARAM_TP_RANK | KVT_CONN_PARAM_TP_SIZE |
                    KVT_CONN_PARAM_FLAGS | KVT_CONN_PARAM_SUBMIT_INTERVAL;
    cp.role = r->side == SIDE_PREFILL ? KVT_ROLE_PREFILL : KVT_ROLE_DECODE;
    cp.engine = r->e;
    cp.layout = &layout;
    cp.bootstrap_addr = boot;
    cp.tp_rank = r->rank;
    cp.tp_size = r->tp;
    cp.flags = KVT_CONN_NO_REGISTER;
    cp.submit_interval = r->o->submit_interval;
    st = kvt_conn_create(&cp, &r->conn);
    if (st != KVT_OK) {
        report_error(r->side, r->rank, "connector: %s", kvt_status_str(st));
        return -1;
    }
    r->free_blocks = malloc(r->pool * sizeof(uint32_t));
    for (uint64_t i = 0; i < r->pool; i++)
        r->free_blocks[i] = (uint32_t)i;
    r->nfree = r->pool;
    r->rng = mix64(r->o->seed ^ ((uint64_t)r->side << 32) ^ r->rank) | 1;
    return 0;
}

static void rank_teardown(rank_t *r)
{
    kvt_conn_destroy(r->conn);
    kvt_engine_destroy(r->e); /* frees the arena */
    free(r->mirror);
    free(r->caches);
    free(r->free_blocks);
}

typedef struct {
    req_t q;
    kvt_sender_h room;
    uint32_t *ids;
    uint64_t slot;
    uint64_t t_first, t_last;
} job_t;

/* Whether a room has left BOOTSTRAPPING (decode announced its blocks). */
static int wait_announced(kvt_sender_h s, uint64_t deadline)
{
    for (;;) {
        kvt_poll_t p = kvt_room_poll(s);
        if (p != KVT_POLL_BOOTSTRAPPING)
            return p != KVT_POLL_FAILED;
        if (now_ns() > deadline)
            return 0;
        usleep(200);
    }
}

/*
 * Prefill: one forward step per batch. With layer-wise streaming each
 * layer is marked ready as soon as it is "computed"; otherwise the whole
 * request is sent after the last layer. Calibration batches (the first
 * ones, when asked) skip the compute so that the transfer is all there is.
 */
static int prefill_batch(rank_t *r, job_t *jobs, uint32_t nj, int calib)
{
    const opts_t *o = r->o;
    uint64_t step = 0, t;
    uint32_t maxtok = 0;
    double ms;

    for (uint32_t j = 0; j < nj; j++) {
        job_t *jb = &jobs[j];
        kvt_status_t st =
            kvt_sender_create(r->conn, NULL, jb->q.room, &jb->room);
        if (st == KVT_OK)
            st = kvt_sender_init(jb->room, jb->q.blocks, &jb->slot, 1);
        if (st != KVT_OK) {
            report_error(SIDE_PREFILL, r->rank, "room %llu: %s",
                         (unsigned long long)jb->q.room, kvt_status_str(st));
            return -1;
        }
        if (jb->q.tokens > maxtok)
            maxtok = jb->q.tokens;
    }
    for (uint32_t j = 0; j < nj; j++)
        wait_announced(jobs[j].room, now_ns() + 30000000000ull);

    ms = calib ? 0 : demo_layer_compute_ms(o, maxtok);
    if (o->layerwise && !calib) {
        kvt_conn_step_begin(r->conn, &step);
        for (uint32_t j = 0; j < nj; j++)
            kvt_sender_send_step(jobs[j].room, step, jobs[j].ids,
                                 jobs[j].q.blocks, 1);
    }
    t = now_ns();
    for (uint32_t l = 0; l < r->nlayers; l++) {
        for (uint32_t j = 0; j < nj; j++)
            layer_bytes(r, &jobs[j].q, l, jobs[j].ids, jobs[j].q.blocks, 0);
        t += (uint64_t)(ms * 1e6);
        sleep_until(t);
        if (o->layerwise && !calib) {
            uint64_t tr = now_ns();
            for (uint32_t j = 0; j < nj; j++) {
                if (l == 0)
                    jobs[j].t_first = tr;
                jobs[j].t_last = tr;
            }
            kvt_conn_layer_ready(r->conn, step, l);
        }
    }
    for (uint32_t j = 0; j < nj; j++)
        aux_bytes(r, &jobs[j].q, jobs[j].slot, 0, NULL);
    if (o->layerwise && !calib) {
        kvt_conn_step_end(r->conn, step);
    } else {
        uint64_t tr = now_ns();
        for (uint32_t j = 0; j < nj; j++) {
            jobs[j].t_first = jobs[j].t_last = tr;
            kvt_sender_send(jobs[j].room, jobs[j].ids, jobs[j].q.blocks, 1);
        }
    }
    for (uint32_t j = 0; j < nj; j++) {
        kvt_room_info_t info;
        rep_t rep = {.type = calib ? REP_CALIB : REP_PREFILL,
                     .side = SIDE_PREFILL,
                     .rank = r->rank,
                     .room = jobs[j].q.room,
                     .t_first = jobs[j].t_first,
                     .t_last = jobs[j].t_last};
        kvt_room_wait(jobs[j].room, -1);
        kvt_room_info(jobs[j].room, &info);
        rep.ok = info.state == KVT_POLL_SUCCESS;
        snprintf(rep.text, sizeof(rep.text), "%s", info.reason);
        report(&rep);
        kvt_room_destroy(jobs[j].room);
    }
    return 0;
}

/* Decode: receivers for the batch, then wait and check every byte. */
static int decode_batch(rank_t *r, job_t *jobs, uint32_t nj, int calib)
{
    for (uint32_t j = 0; j < nj; j++) {
        job_t *jb = &jobs[j];
        kvt_status_t st =
            kvt_receiver_create(r->conn, NULL, jb->q.room, -1, &jb->room);
        /* Poison the blocks, so that a byte that did not arrive fails the
         * check even if an earlier request left the right value there. */
        for (uint32_t l = 0; l < r->nlayers; l++)
            for (uint32_t c = 0; c < r->ncache_per_layer; c++) {
                kvt_kv_cache_t *kc = &r->caches[l * r->ncache_per_layer + c];
                for (uint32_t b = 0; b < jb->q.blocks; b++) {
                    uint8_t *d =
                        (uint8_t *)kc->base + jb->ids[b] * kc->block_bytes;
                    memset(host_of(r, d), 0xEE, kc->block_bytes);
                    dev_sync(r, d, kc->block_bytes, 1);
                }
            }
        memset(host_of(r, r->aux + jb->slot * AUX_BYTES), 0xEE, AUX_BYTES);
        dev_sync(r, r->aux + jb->slot * AUX_BYTES, AUX_BYTES, 1);
        if (st == KVT_OK)
            st = kvt_receiver_init(jb->room, jb->ids, jb->q.blocks, 0,
                                   &jb->slot, 1);
        if (st != KVT_OK) {
            report_error(SIDE_DECODE, r->rank, "room %llu: %s",
                         (unsigned long long)jb->q.room, kvt_status_str(st));
            return -1;
        }
        jb->t_first = now_ns();
    }
    for (uint32_t j = 0; j < nj; j++) {
        job_t *jb = &jobs[j];
        kvt_room_info_t info;
        rep_t rep = {.type = calib ? REP_CALIB : REP_DECODE,
                     .side = SIDE_DECODE,
                     .rank = r->rank,
                     .room = jb->q.room,
                     .t_first = jb->t_first};
        uint64_t bad = 0;

        kvt_room_wait(jb->room, -1);
        kvt_room_info(jb->room, &info);
        /* When the room became final, not when this thread saw it. */
        rep.t_last = info.changed_ns;
        rep.ok = info.state == KVT_POLL_SUCCESS;
        rep.bytes = (uint64_t)jb->q.blocks * r->block_bytes * r->nlayers *
                        r->ncache_per_layer +
                    AUX_BYTES;
        if (rep.ok) {
            for (uint32_t l = 0; l < r->nlayers; l++)
                bad += layer_bytes(r, &jb->q, l, jb->ids, jb->q.blocks, 1);
            aux_bytes(r, &jb->q, jb->slot, 1, &bad);
            rep.verified = rep.bytes - bad;
            if (bad)
                snprintf(rep.text, sizeof(rep.text),
                         "%llu bytes differ from what prefill wrote",
                         (unsigned long long)bad);
        } else {
            snprintf(rep.text, sizeof(rep.text), "%s: %s",
                     kvt_poll_str(info.state), info.reason);
        }
        report(&rep);
        kvt_room_destroy(jb->room);
    }
    return 0;
}

void demo_rank_main(const opts_t *o, int side, uint32_t rank, int fd)
{
    rank_t r = {.o = o,
                .side = side,
                .rank = rank,
                .tp = side == SIDE_PREFILL ? o->prefill_tp : o->decode_tp};
    uint32_t maxb =
        (o->max_len + o->m->tokens_per_block - 1) / o->m->tokens_per_block;
    job_t *jobs = calloc(o->concurrency, sizeof(*jobs));
    uint32_t total = o->calib + o->requests;
    rep_t done = {.type = REP_DONE, .side = (uint32_t)side, .rank = rank};
    int rc = 0;

    rep_fd = fd;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_IGN);
    /* Peers leaving at the end are expected; say only what goes wrong
     * (unless the user asked for more with KVT_LOG). */
    setenv("KVT_LOG", "error", 0);
    if (rank_setup(&r) != 0)
        _exit(1);
    /* This thread stands in for the GPU: the simulated forward pass on
     * prefill, poisoning and checking every byte on decode. It runs at
     * the lowest priority (the engine's and connector's threads, started
     * above, keep theirs), so that it does not take the CPU from the
     * transfers it measures, as GPU work would not. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
        report_error(side, rank,
                     "cannot lower the checking thread's "
                     "priority: %s",
                     strerror(errno));
    {
        rep_t ready = {.type = REP_READY, .side = (uint32_t)side, .rank = rank};
        report(&ready);
    }
    for (uint32_t i = 0; i < o->concurrency; i++)
        jobs[i].ids = malloc(maxb * sizeof(uint32_t));
    for (uint32_t first = 0; first < total && rc == 0;) {
        /* Calibration requests go one at a time, in their own batches. */
        int calib = first < o->calib;
        uint32_t nj = calib ? 1 : o->concurrency;
        if (first + nj > total)
            nj = total - first;
        for (uint32_t j = 0; j < nj; j++) {
            jobs[j].q = demo_request(o, first + j);
            jobs[j].slot = j;
            take_blocks(&r, jobs[j].ids, jobs[j].q.blocks);
        }
        rc = side == SIDE_PREFILL ? prefill_batch(&r, jobs, nj, calib)
                                  : decode_batch(&r, jobs, nj, calib);
        for (uint32_t j = 0; j < nj; j++)
            give_blocks(&r, jobs[j].ids, jobs[j].q.blocks);
        first += nj;
    }
    if (side == SIDE_PREFILL) {
        /* The transports that carried this rank's writes (the demo
         * reports them as the protocol used). */
        kvt_engine_stats_t es = {.version = KVT_STATS_VERSION};
        size_t n = 0;
        if (kvt_engine_stats(r.e, &es) == KVT_OK)
            for (uint32_t i = 0; i < es.ntransports && i < KVT_STATS_TRANSPORTS;
                 i++)
                if (es.transports[i].write_bytes > 0)
                    n += (size_t)snprintf(done.text + n, sizeof(done.text) - n,
                                          "%s%s", n ? "+" : "",
                                          es.transports[i].name);
    }
    report(&done);
    /* Stay until told, so that no rank's teardown races another's last
     * transfer. */
    {
        char c;
        ssize_t n = read(0, &c, 1);
        (void)n;
    }
    rank_teardown(&r);
    _exit(rc == 0 ? 0 : 1);
}
