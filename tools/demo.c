/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt demo: a disaggregated prefill/decode run on this machine.
 *
 * The demo process starts a bootstrap server (`kvt metad`, as a child) and
 * one process per prefill rank and per decode rank, all on 127.0.0.1. Every
 * rank derives the same request list from the seed (room ids, prompt
 * lengths), so they need no side channel. For each batch of requests,
 * decode ranks open receivers and announce randomly chosen, non-contiguous
 * blocks; prefill ranks wait for the announcements, then run a simulated
 * forward pass: layer by layer they write the layer's KV (a deterministic
 * function of request, layer, cache, token, head and byte), wait out the
 * layer's compute time, and mark it ready, so that the connector streams
 * it while the next layer "computes". Decode checks every byte of every
 * block it received. Ranks report timestamps and counts to the demo
 * process over a pipe, which prints progress and the summary.
 *
 * Timestamps are CLOCK_MONOTONIC, which is the same clock in every process
 * of the machine, so the transfer tail (from "last layer ready" on prefill
 * to SUCCESS on decode) is measured across processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvt/connector.h>
#include <kvt/kvt.h>

#include "cli.h"

/* ---- Models --------------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *desc;
    uint32_t layers, draft_layers;
    uint32_t kv_heads;   /* K/V heads in all (0 for MLA) */
    uint32_t head_bytes; /* per head per token: head_dim * 2 (bf16) */
    uint32_t latent_bytes; /* MLA: (kv_lora_rank + rope dims) * 2 */
    uint32_t tokens_per_block;
    /* FLOPs model: active parameters per layer, and the width that
     * attention's quadratic term scales with. */
    double params_per_layer;
    double attn_width;
} model_t;

static const model_t models[] = {
    {"llama3-8b", "Llama-3-8B-like: 32 layers, 8 KV heads x 128, bf16",
     32, 0, 8, 256, 0, 16, 218e6, 4096},
    {"llama3-8b-eagle",
     "Llama-3-8B-like with a 1-layer draft model (speculative decoding)",
     32, 1, 8, 256, 0, 16, 218e6, 4096},
    {"deepseek-v3", "DeepSeek-V3-like MLA: 61 layers, latent 512 + 64 rope, "
                    "bf16",
     61, 0, 0, 0, (512 + 64) * 2, 16, 37e9 / 61, 7168},
};

/* The speed the FLOPs model assumes for one prefill instance. */
#define DEFAULT_TFLOPS 100.0

typedef struct {
    const model_t *m;
    uint32_t requests, min_len, max_len, prefill_tp, decode_tp, concurrency;
    uint32_t submit_interval;
    uint64_t seed;
    int layerwise, json;
    uint32_t calib; /* calibration requests run first */
    double compute_ms; /* < 0: from the FLOPs model */
    double tflops;
    const char *protocol;
    const char *metadata;
    int cuda; /* --memory=cuda: caches and aux buffers in device memory */
} opts_t;

/* Simulated compute of one layer for a prompt of @tokens. */
static double layer_compute_ms(const opts_t *o, uint32_t tokens)
{
    double flops;
    if (o->compute_ms >= 0)
        return o->compute_ms;
    flops = 2.0 * o->m->params_per_layer * tokens +
            2.0 * (double)tokens * tokens * o->m->attn_width;
    return flops / (o->tflops * 1e12) * 1e3;
}

/* ---- The request list, the same in every process ------------------------ */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

typedef struct {
    uint64_t room;
    uint32_t tokens;
    uint32_t blocks;
} req_t;

static req_t request(const opts_t *o, uint32_t i)
{
    req_t r;
    uint64_t x = mix64(o->seed * 1000003 + i);
    r.room = mix64(x ^ 0xabcdef) | 1;
    r.tokens = o->min_len + (uint32_t)(x % (o->max_len - o->min_len + 1));
    r.blocks = (r.tokens + o->m->tokens_per_block - 1) / o->m->tokens_per_block;
    return r;
}

/* ---- KV contents ----------------------------------------------------------- */

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

/* ---- Reports from ranks to the demo process -------------------------------- */

enum {
    REP_READY = 1,   /* a rank is up */
    REP_PREFILL,     /* prefill rank finished a request */
    REP_DECODE,      /* decode rank finished a request */
    REP_CALIB,       /* calibration: one request moved without compute */
    REP_DONE,        /* a rank finished the whole list */
    REP_ERROR,       /* a rank failed; text follows */
};

/* One record, written atomically to the pipe (< PIPE_BUF). */
typedef struct {
    uint32_t type, side, rank, ok;
    uint64_t room;
    uint64_t t_first, t_last; /* prefill: first/last layer ready; decode:
                                 announced / SUCCESS */
    uint64_t bytes, verified;
    char text[160];
} rep_t;

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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull),
                          (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ---- A rank ---------------------------------------------------------------- */

enum { SIDE_PREFILL = 0, SIDE_DECODE = 1 };
#define AUX_BYTES 64

typedef struct {
    const opts_t *o;
    int side;
    uint32_t rank, tp;
    uint32_t heads, head0; /* local heads and the first global one */
    uint32_t ncache_per_layer;
    uint32_t nlayers;      /* target + draft */
    uint64_t pool;         /* blocks */
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
                    uint64_t s = run_seed(q->room, l, kind, token, r->head0 + h);
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
    uint32_t maxb = (r->o->max_len + m->tokens_per_block - 1) /
                    m->tokens_per_block;
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
    r->arena_len = per_cache * r->nlayers * r->ncache_per_layer +
                   r->aux_slots * AUX_BYTES;

    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    ep.local_host = "127.0.0.1";
    ep.transports = strcmp(r->o->protocol, "tcp") == 0
                        ? KVT_TRANSPORT_TCP
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
        uint32_t idx = r->side == SIDE_PREFILL ? r->rank
                                               : r->o->prefill_tp + r->rank;
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
    r->caches = calloc((size_t)r->nlayers * r->ncache_per_layer,
                       sizeof(*r->caches));
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
        kvt_status_t st = kvt_sender_create(r->conn, NULL, jb->q.room,
                                            &jb->room);
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

    ms = calib ? 0 : layer_compute_ms(o, maxtok);
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
                     .side = SIDE_PREFILL, .rank = r->rank,
                     .room = jobs[j].q.room, .t_first = jobs[j].t_first,
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
        kvt_status_t st = kvt_receiver_create(r->conn, NULL, jb->q.room, -1,
                                              &jb->room);
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
                     .side = SIDE_DECODE, .rank = r->rank,
                     .room = jb->q.room, .t_first = jb->t_first};
        uint64_t bad = 0;

        kvt_room_wait(jb->room, -1);
        kvt_room_info(jb->room, &info);
        /* When the room became final, not when this thread saw it. */
        rep.t_last = info.changed_ns;
        rep.ok = info.state == KVT_POLL_SUCCESS;
        rep.bytes = (uint64_t)jb->q.blocks * r->block_bytes * r->nlayers *
                        r->ncache_per_layer + AUX_BYTES;
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

static void rank_main(const opts_t *o, int side, uint32_t rank)
{
    rank_t r = {.o = o, .side = side, .rank = rank,
                .tp = side == SIDE_PREFILL ? o->prefill_tp : o->decode_tp};
    uint32_t maxb = (o->max_len + o->m->tokens_per_block - 1) /
                    o->m->tokens_per_block;
    job_t *jobs = calloc(o->concurrency, sizeof(*jobs));
    uint32_t total = o->calib + o->requests;
    rep_t done = {.type = REP_DONE, .side = (uint32_t)side, .rank = rank};
    int rc = 0;

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
        report_error(side, rank, "cannot lower the checking thread's "
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
            jobs[j].q = request(o, first + j);
            jobs[j].slot = j;
            take_blocks(&r, jobs[j].ids, jobs[j].q.blocks);
        }
        rc = side == SIDE_PREFILL ? prefill_batch(&r, jobs, nj, calib)
                                  : decode_batch(&r, jobs, nj, calib);
        for (uint32_t j = 0; j < nj; j++)
            give_blocks(&r, jobs[j].ids, jobs[j].q.blocks);
        first += nj;
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

/* ---- The demo process ------------------------------------------------------ */

typedef struct {
    pid_t pid;
    int side;
    uint32_t rank;
    int to_fd; /* its stdin: closed to let it exit */
    int done, exited;
} child_t;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int port_open(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static pid_t spawn_metad(uint16_t port)
{
    char ps[16];
    pid_t pid;
    snprintf(ps, sizeof(ps), "%u", port);
    pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execl("/proc/self/exe", "kvt", "metad", "--host", "127.0.0.1",
              "--port", ps, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double pct_ms(uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    return (double)v[(size_t)((double)(n - 1) * p + 0.5)] / 1e6;
}

typedef struct {
    uint64_t room;
    uint64_t t_last_ready, t_first_ready; /* max/min over prefill ranks */
    uint64_t t_success;                   /* max over decode ranks */
    uint32_t prefill_seen, decode_seen, failed;
    uint64_t bytes, verified;
    int calib;
    char why[160];
} room_stat_t;

static room_stat_t *find_room(room_stat_t *rs, uint32_t n, uint64_t room)
{
    for (uint32_t i = 0; i < n; i++)
        if (rs[i].room == room)
            return &rs[i];
    return NULL;
}

static void usage(void)
{
    printf("usage: kvt demo [options]\n"
           "  --model NAME            ");
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
        printf("%s%s", i ? " | " : "", models[i].name);
    printf(" (default llama3-8b)\n"
           "  --requests N            requests to run (default 16)\n"
           "  --prompt-len MIN:MAX    prompt tokens (default 256:1024)\n"
           "  --prefill-tp N          prefill tensor-parallel ranks (1)\n"
           "  --decode-tp N           decode tensor-parallel ranks (1)\n"
           "  --protocol P            tcp | shm | auto (default auto)\n"
           "  --memory M              host | cuda: KV caches and aux buffers "
           "in GPU memory\n"
           "                          (needs a GPU; default host)\n"
           "  --metadata URI          bootstrap server http://HOST:PORT "
           "(default: start kvt metad)\n"
           "  --compute-ms-per-layer X  simulated prefill compute per layer "
           "(default: FLOPs model at --tflops)\n"
           "  --tflops T              speed of the FLOPs model (default %.0f)\n"
           "  --layerwise | --no-layerwise  stream layers as computed "
           "(default on)\n"
           "  --submit-interval N     layers per submission (default 1)\n"
           "  --concurrency N         requests per prefill step (default 1)\n"
           "  --seed N                request list and block tables (1)\n"
           "  --json                  last line: one JSON object\n",
           DEFAULT_TFLOPS);
}

/* The options that take a positive count, and the field each sets. */
static const char *count_opt(int argc, char **argv, int *i, opts_t *o,
                             uint32_t **field_p)
{
    const struct {
        const char *name;
        uint32_t *field;
    } t[] = {{"requests", &o->requests},
             {"prefill-tp", &o->prefill_tp},
             {"decode-tp", &o->decode_tp},
             {"concurrency", &o->concurrency},
             {"submit-interval", &o->submit_interval}};
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        const char *v = cli_opt(argc, argv, i, t[k].name);
        if (v != NULL) {
            *field_p = t[k].field;
            return v;
        }
    }
    return NULL;
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->m = &models[0];
    o->requests = 16;
    o->min_len = 256;
    o->max_len = 1024;
    o->prefill_tp = o->decode_tp = o->concurrency = 1;
    o->submit_interval = 1;
    o->seed = 1;
    o->layerwise = 1;
    o->compute_ms = -1;
    o->tflops = DEFAULT_TFLOPS;
    o->protocol = "auto";
    o->calib = 3;
    for (int i = 1; i < argc; i++) {
        const char *v;
        uint32_t *field;
        uint64_t n;
        if (cli_flag(argv[i], "help")) {
            usage();
            exit(0);
        } else if (cli_flag(argv[i], "json")) {
            o->json = 1;
        } else if (cli_flag(argv[i], "layerwise")) {
            o->layerwise = 1;
        } else if (cli_flag(argv[i], "no-layerwise")) {
            o->layerwise = 0;
        } else if ((v = cli_opt(argc, argv, &i, "model"))) {
            size_t k;
            for (k = 0; k < sizeof(models) / sizeof(models[0]); k++)
                if (strcmp(v, models[k].name) == 0)
                    break;
            if (k == sizeof(models) / sizeof(models[0])) {
                fprintf(stderr, "kvt demo: unknown model '%s'\n", v);
                return -1;
            }
            o->m = &models[k];
        } else if ((v = cli_opt(argc, argv, &i, "prompt-len"))) {
            unsigned a, b;
            if (sscanf(v, "%u:%u", &a, &b) != 2 || a == 0 || b < a ||
                b > 131072) {
                fprintf(stderr, "kvt demo: --prompt-len MIN:MAX\n");
                return -1;
            }
            o->min_len = a;
            o->max_len = b;
        } else if ((v = cli_opt(argc, argv, &i, "protocol"))) {
            if (strcmp(v, "tcp") && strcmp(v, "shm") && strcmp(v, "auto")) {
                fprintf(stderr, "kvt demo: --protocol tcp|shm|auto\n");
                return -1;
            }
            o->protocol = v;
        } else if ((v = cli_opt(argc, argv, &i, "memory"))) {
            if (strcmp(v, "host") && strcmp(v, "cuda")) {
                fprintf(stderr, "kvt demo: --memory host|cuda\n");
                return -1;
            }
            o->cuda = strcmp(v, "cuda") == 0;
        } else if ((v = cli_opt(argc, argv, &i, "metadata"))) {
            if (strncmp(v, "http://", 7) != 0) {
                fprintf(stderr, "kvt demo: --metadata http://HOST:PORT\n");
                return -1;
            }
            o->metadata = v + 7;
        } else if ((v = cli_opt(argc, argv, &i, "compute-ms-per-layer"))) {
            o->compute_ms = atof(v);
            if (o->compute_ms < 0)
                return -1;
        } else if ((v = cli_opt(argc, argv, &i, "tflops"))) {
            o->tflops = atof(v);
            if (o->tflops <= 0)
                return -1;
        } else if ((v = cli_opt(argc, argv, &i, "seed"))) {
            o->seed = strtoull(v, NULL, 10);
        } else if ((v = count_opt(argc, argv, &i, o, &field)) != NULL) {
            if (cli_parse_size(v, &n) != 0 || n == 0 || n > 100000) {
                fprintf(stderr, "kvt demo: bad count in '%s'\n", argv[i]);
                return -1;
            }
            *field = (uint32_t)n;
        } else {
            fprintf(stderr, "kvt demo: bad option '%s' (see --help)\n",
                    argv[i]);
            return -1;
        }
    }
    if (o->m->kv_heads && (o->m->kv_heads % o->prefill_tp ||
                           o->m->kv_heads % o->decode_tp)) {
        fprintf(stderr, "kvt demo: %u KV heads do not split over tp %u/%u\n",
                o->m->kv_heads, o->prefill_tp, o->decode_tp);
        return -1;
    }
    if (o->prefill_tp + o->decode_tp > 16) {
        fprintf(stderr, "kvt demo: at most 16 ranks in all\n");
        return -1;
    }
    return 0;
}

/* @s with JSON's special characters replaced, into @out. */
static const char *json_safe(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++)
        out[n++] = (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
                       ? ' '
                       : *s;
    out[n] = '\0';
    return out;
}

/*
 * --memory=cuda needs a GPU: asked in a child process, so that this one
 * (which forks the ranks) never initialises the driver, after which a
 * forked child could not use it. 0 when one is there; else -1 with the
 * reason in @why.
 */
static int gpu_present(char *why, size_t cap)
{
    int fd[2], st = 0;
    ssize_t n;
    pid_t pid;

    if (pipe(fd) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        kvt_mem_domain_info_t d[8];
        size_t nd = 0;
        const char *w = "this kvt is built without CUDA (cuda.h not found)";
        int ok = 0;
        close(fd[0]);
        if (kvt_mem_domains(d, 8, &nd) == KVT_OK)
            for (size_t i = 0; i < nd && i < 8; i++)
                if (d[i].kind == KVT_MEM_CUDA) {
                    ok = d[i].available && d[i].devices > 0;
                    w = d[i].detail;
                }
        if (write(fd[1], w, strlen(w)) < 0)
            ok = 0;
        _exit(ok ? 0 : 1);
    }
    close(fd[1]);
    n = pid > 0 ? read(fd[0], why, cap - 1) : -1;
    why[n > 0 ? n : 0] = '\0';
    close(fd[0]);
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int kvt_cmd_demo(int argc, char **argv)
{
    opts_t o;
    int pfd[2], tty = isatty(1), failed_ranks = 0, rc = 0;
    uint32_t nranks, ready = 0, ndone = 0, total;
    child_t ch[17];
    pid_t metad = 0;
    char bootaddr[64];
    room_stat_t *rs;
    uint64_t t_start = 0, t_end = 0, bytes = 0, verified = 0, last_print = 0;
    uint32_t decoded = 0, failed = 0;
    char first_error[256] = "";
    struct sigaction sa = {0};

    if (parse(argc, argv, &o) != 0)
        return 2;
    if (o.cuda) {
        char why[256];
        if (gpu_present(why, sizeof(why)) != 0) {
            fprintf(stderr,
                    "kvt demo: --memory=cuda needs a GPU and its CUDA driver; "
                    "kvt finds none here: %s\n",
                    why);
            return 1;
        }
    }
    total = o.calib + o.requests;
    nranks = o.prefill_tp + o.decode_tp;
    rs = calloc(total, sizeof(*rs));
    for (uint32_t i = 0; i < total; i++) {
        rs[i].room = request(&o, i).room;
        rs[i].calib = i < o.calib;
    }
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (o.metadata == NULL) {
        uint16_t port = free_port();
        metad = spawn_metad(port);
        for (int i = 0; i < 250 && !port_open(port); i++)
            usleep(20000);
        if (!port_open(port)) {
            fprintf(stderr, "kvt demo: kvt metad did not start\n");
            kill(metad, SIGKILL);
            waitpid(metad, NULL, 0);
            return 1;
        }
        snprintf(bootaddr, sizeof(bootaddr), "127.0.0.1:%u", port);
        o.metadata = bootaddr;
    }
    if (!o.json || tty)
        fprintf(stderr,
                "kvt demo: %s, %u requests of %u..%u tokens, prefill tp %u, "
                "decode tp %u, %s, %s memory, %s, compute %.2f ms/layer at %u "
                "tokens\n",
                o.m->desc, o.requests, o.min_len, o.max_len, o.prefill_tp,
                o.decode_tp, o.protocol, o.cuda ? "GPU" : "host",
                o.layerwise ? "layer-wise" : "whole requests",
                layer_compute_ms(&o, o.max_len), o.max_len);

    if (pipe(pfd) != 0)
        return 1;
    for (uint32_t i = 0; i < nranks; i++) {
        int side = i < o.prefill_tp ? SIDE_PREFILL : SIDE_DECODE;
        uint32_t rank = side == SIDE_PREFILL ? i : i - o.prefill_tp;
        int in[2];
        if (pipe(in) != 0)
            return 1;
        ch[i] = (child_t){.side = side, .rank = rank};
        ch[i].pid = fork();
        if (ch[i].pid == 0) {
            close(pfd[0]);
            close(in[1]);
            dup2(in[0], 0);
            rep_fd = pfd[1];
            rank_main(&o, side, rank);
        }
        close(in[0]);
        ch[i].to_fd = in[1];
    }
    close(pfd[1]);

    /* Collect reports until every rank is done, a rank dies, or Ctrl-C. */
    while (ndone < nranks) {
        struct pollfd p = {pfd[0], POLLIN, 0};
        rep_t r;
        int st;
        if (interrupted) {
            snprintf(first_error, sizeof(first_error), "interrupted");
            rc = 130;
            break;
        }
        for (uint32_t i = 0; i < nranks; i++) {
            if (!ch[i].exited && waitpid(ch[i].pid, &st, WNOHANG) == ch[i].pid) {
                ch[i].exited = 1;
                if (!ch[i].done) {
                    snprintf(first_error + strlen(first_error),
                             sizeof(first_error) - strlen(first_error),
                             "%s rank %u died (%s %d); ",
                             ch[i].side ? "decode" : "prefill", ch[i].rank,
                             WIFSIGNALED(st) ? "signal" : "exit",
                             WIFSIGNALED(st) ? WTERMSIG(st)
                                             : WEXITSTATUS(st));
                    failed_ranks++;
                }
            }
        }
        if (failed_ranks) {
            rc = 1;
            break;
        }
        if (poll(&p, 1, 200) <= 0)
            goto progress;
        if (read(pfd[0], &r, sizeof(r)) != sizeof(r))
            continue;
        switch (r.type) {
        case REP_READY:
            if (++ready == nranks)
                t_start = now_ns();
            break;
        case REP_ERROR:
            fprintf(stderr, "kvt demo: %s rank %u: %s\n",
                    r.side ? "decode" : "prefill", r.rank, r.text);
            break;
        case REP_DONE:
            for (uint32_t i = 0; i < nranks; i++)
                if (ch[i].side == (int)r.side && ch[i].rank == r.rank)
                    ch[i].done = 1;
            ndone++;
            break;
        case REP_PREFILL:
        case REP_CALIB:
        case REP_DECODE: {
            room_stat_t *s = find_room(rs, total, r.room);
            if (s == NULL)
                break;
            if (r.side == SIDE_PREFILL) {
                s->prefill_seen++;
                if (r.t_last > s->t_last_ready)
                    s->t_last_ready = r.t_last;
                if (s->t_first_ready == 0 || r.t_first < s->t_first_ready)
                    s->t_first_ready = r.t_first;
                if (!r.ok && !s->why[0])
                    snprintf(s->why, sizeof(s->why), "prefill rank %u: %s",
                             r.rank, r.text);
                s->failed |= !r.ok;
            } else {
                s->decode_seen++;
                if (r.t_last > s->t_success)
                    s->t_success = r.t_last;
                s->bytes += r.bytes;
                s->verified += r.verified;
                if ((!r.ok || r.verified != r.bytes) && !s->why[0])
                    snprintf(s->why, sizeof(s->why), "decode rank %u: %s",
                             r.rank, r.text);
                s->failed |= !r.ok || r.verified != r.bytes;
                if (!s->calib && s->decode_seen == o.decode_tp) {
                    decoded++;
                    bytes += s->bytes;
                    verified += s->verified;
                    failed += s->failed != 0;
                    t_end = now_ns();
                }
            }
            break;
        }
        }
    progress:
        if (now_ns() - last_print > (tty ? 100000000ull : 1000000000ull) &&
            t_start && !(o.json && !tty)) {
            double secs = (double)(now_ns() - t_start) / 1e9;
            last_print = now_ns();
            if (tty) {
                int w = 30, fill = (int)(w * decoded / o.requests);
                fprintf(stderr, "\r[%.*s%*s] %u/%u requests, %.2f GB, "
                                "%.2f GB/s  ",
                        fill, "##############################", w - fill, "",
                        decoded, o.requests, (double)bytes / 1e9,
                        secs > 0 ? (double)bytes / 1e9 / secs : 0);
            } else {
                fprintf(stderr, "progress: %u/%u requests, %.2f GB, "
                                "%.2f GB/s\n",
                        decoded, o.requests, (double)bytes / 1e9,
                        secs > 0 ? (double)bytes / 1e9 / secs : 0);
            }
        }
    }
    if (tty && !(o.json && !tty))
        fprintf(stderr, "\n");

    /* Let every rank go, then reap them (and the server). */
    for (uint32_t i = 0; i < nranks; i++)
        close(ch[i].to_fd);
    for (uint32_t i = 0; i < nranks; i++) {
        if (rc != 0 && !ch[i].exited)
            kill(ch[i].pid, SIGKILL);
        if (!ch[i].exited) {
            int st;
            waitpid(ch[i].pid, &st, 0);
            if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
                rc = 1;
                snprintf(first_error, sizeof(first_error),
                         "%s rank %u exited badly at teardown",
                         ch[i].side ? "decode" : "prefill", ch[i].rank);
            }
        }
    }
    if (metad) {
        kill(metad, SIGTERM);
        waitpid(metad, NULL, 0);
    }

    /* Summary. */
    {
        uint64_t *tail = calloc(total, 8), *whole = calloc(total, 8),
                 *layer = calloc(total, 8);
        size_t nt = 0, nw = 0, nl = 0;
        uint32_t nlayers = o.m->layers + o.m->draft_layers;
        double secs = t_end > t_start ? (double)(t_end - t_start) / 1e9 : 0;
        double gbps = secs > 0 ? (double)bytes / 1e9 / secs : 0;
        uint64_t tokens = 0;
        double tail50, tail99, whole50, whole99, layer50;
        char esc[256];

        for (uint32_t i = 0; i < total; i++) {
            room_stat_t *s = &rs[i];
            if (s->decode_seen < o.decode_tp || s->prefill_seen == 0 ||
                s->failed) {
                if (!s->calib && !first_error[0] && s->why[0])
                    snprintf(first_error, sizeof(first_error), "room %llu: %s",
                             (unsigned long long)s->room, s->why);
                continue;
            }
            if (s->calib) {
                layer[nl++] = (s->t_success - s->t_last_ready) / nlayers;
                continue;
            }
            tokens += request(&o, i).tokens;
            tail[nt++] = s->t_success > s->t_last_ready
                             ? s->t_success - s->t_last_ready
                             : 0;
            whole[nw++] = s->t_success - s->t_first_ready;
        }
        if (decoded < o.requests && rc == 0)
            rc = 1;
        if (failed || verified != bytes)
            rc = rc ? rc : 1;
        tail50 = pct_ms(tail, nt, 0.5);
        tail99 = pct_ms(tail, nt, 0.99);
        whole50 = pct_ms(whole, nw, 0.5);
        whole99 = pct_ms(whole, nw, 0.99);
        layer50 = pct_ms(layer, nl, 0.5);
        if (!o.json || tty) {
            fprintf(stderr,
                    "\n  requests       %u done, %u failed (of %u)\n"
                    "  tokens         %llu\n"
                    "  bytes          %llu (%.1f MiB), verified %llu: %s\n"
                    "  throughput     %.3f GB/s over %.2f s\n"
                    "  tail           p50 %.2f ms, p99 %.2f ms (last layer "
                    "ready -> decode SUCCESS)\n"
                    "  whole request  p50 %.2f ms, p99 %.2f ms (%s -> "
                    "SUCCESS)\n"
                    "  one layer      p50 %.3f ms (one layer of one request, "
                    "measured alone)\n"
                    "  protocol       %s\n",
                    decoded - failed, failed, o.requests,
                    (unsigned long long)tokens, (unsigned long long)bytes,
                    (double)bytes / 1048576.0, (unsigned long long)verified,
                    verified == bytes && bytes > 0 ? "every byte matches"
                                                   : "MISMATCH",
                    gbps, secs, tail50, tail99, whole50, whole99,
                    o.layerwise ? "first layer ready" : "send", layer50,
                    o.protocol);
            if (rc != 0)
                fprintf(stderr, "kvt demo: FAILED: %s\n",
                        first_error[0] ? first_error : "see above");
        }
        if (o.json)
            printf("{\"model\":\"%s\",\"requests\":%u,\"failed\":%u,"
                   "\"tokens\":%llu,\"bytes\":%llu,\"verified_bytes\":%llu,"
                   "\"gbps\":%.4f,\"seconds\":%.3f,\"tail_ms_p50\":%.3f,"
                   "\"tail_ms_p99\":%.3f,\"whole_ms_p50\":%.3f,"
                   "\"whole_ms_p99\":%.3f,\"layer_ms_p50\":%.3f,"
                   "\"prefill_tp\":%u,\"decode_tp\":%u,\"layerwise\":%s,"
                   "\"protocol\":\"%s\",\"error\":\"%s\"}\n",
                   o.m->name, o.requests, o.requests - (decoded - failed),
                   (unsigned long long)tokens, (unsigned long long)bytes,
                   (unsigned long long)verified, gbps, secs, tail50, tail99,
                   whole50, whole99, layer50, o.prefill_tp, o.decode_tp,
                   o.layerwise ? "true" : "false", o.protocol,
                   rc ? json_safe(first_error[0] ? first_error : "failed",
                                  esc, sizeof(esc))
                      : "");
        free(tail);
        free(whole);
        free(layer);
    }
    free(rs);
    return rc;
}
