/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_CONN_TEST_H
#define KVT_TESTS_CONN_TEST_H

/*
 * Multi-process connector scenarios. A case forks a bootstrap server and
 * one process per prefill and decode rank (before any thread exists in
 * the case process), all on 127.0.0.1. Every rank builds its KV caches
 * with random, non-contiguous block tables; prefill fills them with a
 * deterministic function of (room, layer, cache kind, token, global head,
 * byte) and decode checks every byte of every block it owns afterwards:
 * the blocks it asked for hold exactly its heads, everything else
 * (unasked blocks, prefix blocks, padding, other aux slots) still holds
 * the canary it was filled with.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvt_test.h"

#define CANARY 0xEE
#define GARBAGE 0x77
#define PAD_FILL 0x5A

enum { SIDE_PREFILL = 0, SIDE_DECODE = 1 };

/* What a rank does besides the plain protocol. */
enum {
    F_NONE = 0,
    F_PREFILL_DIES_MIDSTREAM, /* prefill rank 0 SIGKILLs itself mid-step */
    F_DECODE_DIES_MIDSTREAM,  /* decode rank 0 SIGKILLs itself once data
                                 moves */
    F_ABORT_BOOTSTRAPPING,    /* abort_side aborts before any contact */
    F_ABORT_WAITING,          /* ... once WAITING_FOR_INPUT (before init on
                                 decode, before send on prefill) */
    F_ABORT_ANNOUNCED,        /* decode aborts after init, prefill holds */
    F_ABORT_TRANSFERRING,     /* abort_side aborts mid-step */
    F_PREFILL_SILENT,         /* prefill never sends: waiting timeout */
    F_NO_DECODE,              /* no decode rank: bootstrap timeout */
    F_ALL_PAUSED,             /* every process stopped (SIGSTOP) mid-stream
                                 for pause_ms, longer than the peer
                                 timeout, as when a machine stalls */
};

typedef struct {
    uint32_t P, D;
    int head_major;
    int layerwise;
    uint32_t submit_interval;
    int mla, draft_mla, scales;
    uint32_t layers, draft;
    uint32_t kv_heads, head_bytes, latent_bytes, tokens;
    uint32_t ppad, dpad; /* padding bytes per block */
    uint32_t pool, nrooms, min_blocks, max_blocks, prefix, naux, chunks;
    uint32_t layer_sleep_us;
    int fault, abort_side;
    kvt_poll_t expect_prefill, expect_decode;
    uint64_t waiting_ms, bootstrap_ms;
    double time_limit_s;
    uint32_t room_lo, room_hi; /* prefill serves these rooms (0, 0: all) */
    uint32_t pdp; /* prefill data-parallel groups of P ranks (0: 1) */
    uint32_t pause_at_ms, pause_ms; /* F_ALL_PAUSED: when, how long */
} ccfg_t;

static inline ccfg_t ccfg_default(void)
{
    ccfg_t c;
    memset(&c, 0, sizeof(c));
    c.P = c.D = 1;
    c.submit_interval = 1;
    c.layers = 4;
    c.kv_heads = 8;
    c.head_bytes = 16;
    c.latent_bytes = 72;
    c.tokens = 4;
    c.pool = 96;
    c.nrooms = 4;
    c.min_blocks = 3;
    c.max_blocks = 9;
    c.naux = 2;
    c.chunks = 2;
    c.expect_prefill = c.expect_decode = KVT_POLL_SUCCESS;
    c.waiting_ms = 20000;
    c.bootstrap_ms = 20000;
    c.time_limit_s = 25;
    return c;
}

/* ---- Deterministic contents ------------------------------------------ */

static inline uint64_t ct_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t ct_seed(uint64_t room, uint32_t layer, uint32_t kind,
                               uint64_t token, uint32_t head)
{
    uint64_t x = ct_mix(room + 0x1234567);
    x = ct_mix(x ^ ((uint64_t)layer << 8 | kind));
    x = ct_mix(x ^ token);
    return ct_mix(x ^ head);
}

static inline uint8_t ct_byte(uint64_t seed, uint32_t b)
{
    return (uint8_t)(ct_mix(seed + b / 8) >> ((b % 8) * 8));
}

/* ---- A rank ------------------------------------------------------------ */

typedef struct {
    const ccfg_t *cfg;
    int side;
    uint32_t rank, tp, dp_rank;
    uint16_t boot_port;
    kvt_engine_h eng;
    kvt_conn_h conn;
    kvt_kv_cache_t caches[64 * 4];
    size_t ncaches;
    kvt_aux_buffer_t aux[8];
    uint32_t *table[512]; /* per room: blocks for logical [prefix, n) */
    uint32_t nblocks[512], prefix[512];
    struct kvt_room *room[512];
} rank_t;

static inline uint64_t ct_room_id(uint32_t i)
{
    return 0x5000 + 977ull * i;
}

static inline int ct_replicated(uint32_t kind)
{
    return kind == KVT_CACHE_LATENT || kind == KVT_CACHE_LATENT_SCALE;
}

static inline void ct_add_cache(rank_t *r, uint32_t layer, uint32_t kind)
{
    const ccfg_t *c = r->cfg;
    kvt_kv_cache_t *k = &r->caches[r->ncaches++];
    uint32_t hb = kind == KVT_CACHE_K || kind == KVT_CACHE_V ? c->head_bytes
                  : kind == KVT_CACHE_LATENT                 ? c->latent_bytes
                                                             : 4;
    uint32_t heads = ct_replicated(kind) ? 1 : c->kv_heads / r->tp;
    uint32_t pad = r->side == SIDE_PREFILL ? c->ppad : c->dpad;

    memset(k, 0, sizeof(*k));
    k->layer = layer;
    k->kind = kind;
    k->block_layout =
        c->head_major ? KVT_BLOCK_HEAD_MAJOR : KVT_BLOCK_TOKEN_MAJOR;
    k->tokens_per_block = c->tokens;
    k->heads = heads;
    k->head_bytes = hb;
    k->block_bytes = (uint64_t)c->tokens * heads * hb + pad;
    k->num_blocks = c->pool;
    CHECK(posix_memalign(&k->base, 64, k->block_bytes * c->pool) == 0);
}

static inline void ct_build_layout(rank_t *r)
{
    const ccfg_t *c = r->cfg;

    for (uint32_t l = 0; l < c->layers + c->draft; l++) {
        int mla = l < c->layers ? c->mla : c->draft_mla;
        if (mla) {
            ct_add_cache(r, l, KVT_CACHE_LATENT);
            if (c->scales)
                ct_add_cache(r, l, KVT_CACHE_LATENT_SCALE);
        } else {
            ct_add_cache(r, l, KVT_CACHE_K);
            ct_add_cache(r, l, KVT_CACHE_V);
            if (c->scales) {
                ct_add_cache(r, l, KVT_CACHE_K_SCALE);
                ct_add_cache(r, l, KVT_CACHE_V_SCALE);
            }
        }
    }
    for (uint32_t a = 0; a < c->naux; a++) {
        r->aux[a].item_bytes = 8 + 16 * a;
        r->aux[a].count = 2 * c->nrooms + 1;
        CHECK(posix_memalign(&r->aux[a].base, 64,
                             r->aux[a].item_bytes * r->aux[a].count) == 0);
    }
}

/* A prefill rank that must not send replicated caches and aux items
 * (another rank of its group does): it holds spoilt copies of them, so
 * that decode would notice if it sent them. */
static inline int ct_dummy(const rank_t *r)
{
    const ccfg_t *c = r->cfg;
    return r->side == SIDE_PREFILL && c->P > c->D && r->rank % (c->P / c->D);
}

static inline size_t ct_pos(const kvt_kv_cache_t *k, uint32_t t, uint32_t h,
                            uint32_t b)
{
    if (k->block_layout == KVT_BLOCK_HEAD_MAJOR)
        return ((size_t)h * k->tokens_per_block + t) * k->head_bytes + b;
    return ((size_t)t * k->heads + h) * k->head_bytes + b;
}

/* Write (prefill) or check (decode) logical block @lb of room @i in
 * block @blk of cache @k. Returns the number of wrong bytes. */
static inline size_t ct_block(rank_t *r, const kvt_kv_cache_t *k, uint32_t i,
                              uint64_t lb, uint32_t blk, int write)
{
    uint8_t *p = (uint8_t *)k->base + (size_t)blk * k->block_bytes;
    uint64_t content = (uint64_t)k->tokens_per_block * k->heads * k->head_bytes;
    uint8_t spoil = ct_dummy(r) && ct_replicated(k->kind) ? 0xA5 : 0;
    size_t bad = 0;

    for (uint32_t t = 0; t < k->tokens_per_block; t++) {
        for (uint32_t h = 0; h < k->heads; h++) {
            uint32_t gh = ct_replicated(k->kind) ? h : r->rank * k->heads + h;
            uint64_t seed = ct_seed(ct_room_id(i), k->layer, k->kind,
                                    lb * k->tokens_per_block + t, gh);
            for (uint32_t b = 0; b < k->head_bytes; b++) {
                uint8_t v = ct_byte(seed, b);
                size_t pos = ct_pos(k, t, h, b);
                if (write)
                    p[pos] = v ^ spoil;
                else if (p[pos] != v)
                    bad++;
            }
        }
    }
    for (uint64_t x = content; x < k->block_bytes; x++) {
        if (write)
            p[x] = PAD_FILL;
        else if (p[x] != CANARY)
            bad++;
    }
    return bad;
}

static inline uint64_t ct_aux_slot(const rank_t *r, uint32_t i)
{
    return r->side == SIDE_PREFILL ? i : 2 * r->cfg->nrooms - i;
}

static inline size_t ct_aux(rank_t *r, uint32_t i, int write)
{
    size_t bad = 0;
    for (uint32_t a = 0; a < r->cfg->naux; a++) {
        uint8_t *p = (uint8_t *)r->aux[a].base +
                     ct_aux_slot(r, i) * r->aux[a].item_bytes;
        uint64_t seed = ct_seed(ct_room_id(i), 1000 + a, 0, 0, 0);
        for (uint32_t b = 0; b < r->aux[a].item_bytes; b++) {
            if (write)
                p[b] = ct_byte(seed, b) ^ (ct_dummy(r) ? 0x3C : 0);
            else if (p[b] != ct_byte(seed, b))
                bad++;
        }
    }
    return bad;
}

/* Random block tables: a permutation of the pool per rank, handed out in
 * order, so that runs are short and sides differ. */
static inline void ct_tables(rank_t *r)
{
    const ccfg_t *c = r->cfg;
    uint32_t *perm = malloc(c->pool * sizeof(*perm)), next = 0;
    uint64_t s = ct_mix(((uint64_t)r->side << 32) + r->rank + 7);

    for (uint32_t b = 0; b < c->pool; b++)
        perm[b] = b;
    for (uint32_t b = c->pool - 1; b > 0; b--) {
        uint32_t j, t;
        s = ct_mix(s);
        j = (uint32_t)(s % (b + 1));
        /* Keep a few neighbours together so that runs exist. */
        if (s % 5 == 0 && b > 0)
            continue;
        t = perm[b];
        perm[b] = perm[j];
        perm[j] = t;
    }
    for (uint32_t i = 0; i < c->nrooms; i++) {
        uint32_t n =
            c->min_blocks +
            (uint32_t)(ct_mix(i + 99) % (c->max_blocks - c->min_blocks + 1));
        uint32_t k =
            (c->prefix && i % 2 == 0) ? (c->prefix < n ? c->prefix : n - 1) : 0;
        uint32_t own = r->side == SIDE_PREFILL ? n : n - k;
        r->nblocks[i] = n;
        r->prefix[i] = k;
        CHECK(next + own <= c->pool);
        r->table[i] = malloc((own ? own : 1) * sizeof(uint32_t));
        memcpy(r->table[i], perm + next, own * sizeof(uint32_t));
        next += own;
    }
    free(perm);
}

static inline void ct_engine(rank_t *r)
{
    kvt_engine_params_t ep = {0};
    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST |
                    KVT_ENGINE_PARAM_TRANSFER_TIMEOUT |
                    KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
    ep.local_host = "127.0.0.1";
    ep.transfer_timeout_ms = 8000;
    ep.connect_timeout_ms = 2000;
    CHECK_OK(kvt_engine_create(&ep, &r->eng));
}

static inline kvt_status_t ct_connector(rank_t *r, uint16_t boot_port)
{
    const ccfg_t *c = r->cfg;
    kvt_kv_layout_t lay = {c->layers, c->draft, r->ncaches,
                           r->caches, c->naux,  r->aux};
    kvt_conn_params_t p = {0};
    char addr[64];

    snprintf(addr, sizeof(addr), "127.0.0.1:%u", boot_port);
    p.field_mask =
        KVT_CONN_PARAM_ROLE | KVT_CONN_PARAM_ENGINE | KVT_CONN_PARAM_LAYOUT |
        KVT_CONN_PARAM_BOOTSTRAP_ADDR | KVT_CONN_PARAM_TP_RANK |
        KVT_CONN_PARAM_TP_SIZE | KVT_CONN_PARAM_BOOTSTRAP_TIMEOUT |
        KVT_CONN_PARAM_WAITING_TIMEOUT | KVT_CONN_PARAM_TRANSFER_TIMEOUT |
        KVT_CONN_PARAM_HEARTBEAT | KVT_CONN_PARAM_PEER_TIMEOUT |
        KVT_CONN_PARAM_SUBMIT_INTERVAL | KVT_CONN_PARAM_DP_RANK |
        KVT_CONN_PARAM_DP_SIZE;
    p.role = r->side == SIDE_PREFILL ? KVT_ROLE_PREFILL : KVT_ROLE_DECODE;
    p.engine = r->eng;
    p.layout = &lay;
    p.bootstrap_addr = addr;
    p.tp_rank = r->rank;
    p.tp_size = r->tp;
    p.bootstrap_timeout_ms = c->bootstrap_ms;
    p.waiting_timeout_ms = c->waiting_ms;
    p.transfer_timeout_ms = 20000;
    p.heartbeat_ms = 100;
    p.peer_timeout_ms = 2000;
    p.submit_interval = c->submit_interval;
    p.dp_rank = r->side == SIDE_PREFILL ? r->dp_rank : 0;
    p.dp_size = r->side == SIDE_PREFILL && c->pdp ? c->pdp : 1;
    return kvt_conn_create(&p, &r->conn);
}

static inline void ct_rank_init(rank_t *r, const ccfg_t *c, int side,
                                uint32_t rank, uint16_t port)
{
    memset(r, 0, sizeof(*r));
    r->cfg = c;
    r->side = side;
    r->rank = rank;
    r->tp = side == SIDE_PREFILL ? c->P : c->D;
    r->boot_port = port;
    ct_build_layout(r);
    ct_tables(r);
    ct_engine(r);
}

static inline void ct_rank_fini(rank_t *r)
{
    for (uint32_t i = 0; i < r->cfg->nrooms; i++)
        kvt_room_destroy(r->room[i]);
    kvt_conn_destroy(r->conn);
    kvt_engine_destroy(r->eng);
    for (size_t k = 0; k < r->ncaches; k++)
        free(r->caches[k].base);
    for (uint32_t a = 0; a < r->cfg->naux; a++)
        free(r->aux[a].base);
    for (uint32_t i = 0; i < r->cfg->nrooms; i++)
        free(r->table[i]);
}

/* Wait until every room is final (or @limit_s passes); then check each
 * against @want. Returns 0 when all match. */
/* After every room of the rank succeeded: the connector's metrics say so
 * (each room entered SUCCESS and is there now, none is anywhere else,
 * and each prefill room's tail was measured). */
static inline void ct_check_stats(rank_t *r)
{
    kvt_conn_stats_t s = {.version = KVT_STATS_VERSION};
    uint64_t n = 0;

    for (uint32_t i = 0; i < r->cfg->nrooms; i++)
        n += r->room[i] != NULL;
    CHECK_OK(kvt_conn_stats(r->conn, &s));
    CHECK(s.rooms[KVT_POLL_SUCCESS] == n && s.entered[KVT_POLL_SUCCESS] == n);
    CHECK(s.rooms[KVT_POLL_BOOTSTRAPPING] == 0 &&
          s.rooms[KVT_POLL_WAITING_FOR_INPUT] == 0 &&
          s.rooms[KVT_POLL_TRANSFERRING] == 0 && s.rooms[KVT_POLL_FAILED] == 0);
    CHECK(s.entered[KVT_POLL_BOOTSTRAPPING] == n &&
          s.left[KVT_POLL_BOOTSTRAPPING] == n);
    if (r->side == SIDE_PREFILL) {
        uint64_t sum = 0;
        for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++)
            sum += s.tail[b];
        CHECK(s.tails == n && sum == n);
    }
}

static inline int ct_wait_rooms(rank_t *r, kvt_poll_t want, double limit_s)
{
    double t0 = kvt_test_now();
    int bad = 0;

    /* Sanitizers slow everything down; twice the time still stays under
     * the 20 s timeouts a failure that did not propagate would wait for. */
    if (kvt_test_slowdown() > 1)
        limit_s *= 2;
    for (uint32_t i = 0; i < r->cfg->nrooms; i++) {
        kvt_room_info_t info;
        double left = limit_s - (kvt_test_now() - t0);
        if (r->room[i] == NULL)
            continue;
        kvt_room_wait(r->room[i], left > 0 ? (int64_t)(left * 1000) : 0);
        kvt_room_info(r->room[i], &info);
        if (info.state != want) {
            fprintf(stderr, "%s rank %u room %u: %s (%s: %s), wanted %s\n",
                    r->side == SIDE_PREFILL ? "prefill" : "decode", r->rank, i,
                    kvt_poll_str(info.state), kvt_status_name(info.error),
                    info.reason, kvt_poll_str(want));
            bad = 1;
        }
    }
    if (bad && getenv("CT_DEBUG")) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "curl -s http://127.0.0.1:%u/topology",
                 r->boot_port);
        if (system(cmd) != 0)
            fprintf(stderr, "no topology\n");
    }
    return bad;
}

static inline void ct_fill_layer(rank_t *r, uint32_t layer, uint32_t chunk,
                                 uint32_t nchunks)
{
    for (size_t k = 0; k < r->ncaches; k++) {
        if (r->caches[k].layer != layer)
            continue;
        for (uint32_t i = 0; i < r->cfg->nrooms; i++) {
            uint32_t n = r->nblocks[i];
            uint32_t a = n * chunk / nchunks, b = n * (chunk + 1) / nchunks;
            for (uint32_t lb = a; lb < b; lb++)
                ct_block(r, &r->caches[k], i, lb, r->table[i][lb], 1);
        }
    }
}

static inline int ct_wait_state(struct kvt_room *room, kvt_poll_t at_least,
                                double limit_s)
{
    double t0 = kvt_test_now();
    while (kvt_test_now() - t0 < limit_s) {
        kvt_poll_t s = kvt_room_poll(room);
        if (s == KVT_POLL_FAILED || s >= at_least)
            return 0;
        usleep(2000);
    }
    return -1;
}

/* The end of a case: every rank reports, then waits until all have, so
 * that no rank's connector goes away while a peer still needs it. */
static int ct_done_w = -1, ct_release_r = -1;
/* Called by a prefill rank once its connector is up (registered). */
static void (*ct_up_hook)(void);

static inline void ct_barrier(void)
{
    char ch = 1;
    if (ct_done_w < 0)
        return;
    if (write(ct_done_w, &ch, 1) != 1)
        return;
    while (read(ct_release_r, &ch, 1) < 0 && errno == EINTR)
        ;
}

/* ---- Prefill rank ------------------------------------------------------ */

/* Whether room @i is this prefill rank's: with several data-parallel
 * groups, decode sends room R to group R % groups. */
static inline int ct_mine(const rank_t *r, uint32_t i)
{
    uint32_t groups = r->cfg->pdp ? r->cfg->pdp : 1;
    return ct_room_id(i) % groups == r->dp_rank;
}

static inline int ct_prefill_main(const ccfg_t *c, uint32_t rank, uint16_t port)
{
    rank_t *r = calloc(1, sizeof(*r));
    uint32_t S = c->layerwise ? (c->chunks ? c->chunks : 1)
                              : (c->chunks ? c->chunks : 1);
    int abort_here = c->abort_side == SIDE_PREFILL;
    uint32_t LO = c->room_hi ? c->room_lo : 0;
    uint32_t HI = c->room_hi ? c->room_hi : c->nrooms;
    int rc;

    ct_rank_init(r, c, SIDE_PREFILL, rank % c->P, port);
    r->dp_rank = rank / c->P;
    CHECK_OK(ct_connector(r, port));
    if (ct_up_hook != NULL)
        ct_up_hook();
    for (size_t k = 0; k < r->ncaches; k++)
        memset(r->caches[k].base, c->layerwise ? GARBAGE : 0,
               r->caches[k].block_bytes * c->pool);
    for (uint32_t i = LO; i < HI; i++)
        if (ct_mine(r, i)) {
            uint64_t slot = ct_aux_slot(r, i);
            CHECK_OK(
                kvt_sender_create(r->conn, NULL, ct_room_id(i), &r->room[i]));
            if (abort_here && c->fault == F_ABORT_BOOTSTRAPPING) {
                CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
                continue;
            }
            CHECK_OK(kvt_sender_init(r->room[i], r->nblocks[i], &slot,
                                     c->naux ? 1 : 0));
        }
    if (c->fault == F_ABORT_BOOTSTRAPPING && abort_here)
        goto wait;
    if (c->fault == F_PREFILL_SILENT || c->fault == F_NO_DECODE ||
        c->fault == F_ABORT_ANNOUNCED || c->fault == F_ABORT_WAITING) {
        if (c->fault == F_ABORT_WAITING && abort_here) {
            for (uint32_t i = LO; i < HI; i++)
                if (ct_mine(r, i)) {
                    CHECK(ct_wait_state(r->room[i], KVT_POLL_WAITING_FOR_INPUT,
                                        10) == 0);
                    CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
                }
        }
        goto wait;
    }
    if (!c->layerwise) {
        for (uint32_t lyr = 0; lyr < c->layers + c->draft; lyr++)
            for (uint32_t s = 0; s < S; s++)
                ct_fill_layer(r, lyr, s, S);
        for (uint32_t i = LO; i < HI; i++)
            if (ct_mine(r, i))
                ct_aux(r, i, 1);
        for (uint32_t s = 0; s < S; s++) {
            for (uint32_t i = LO; i < HI; i++)
                if (ct_mine(r, i)) {
                    uint32_t n = r->nblocks[i];
                    uint32_t a = n * s / S, b = n * (s + 1) / S;
                    CHECK_OK(kvt_sender_send(r->room[i], r->table[i] + a, b - a,
                                             s == S - 1));
                }
        }
        goto wait;
    }
    for (uint32_t s = 0; s < S; s++) {
        uint64_t step;
        CHECK_OK(kvt_conn_step_begin(r->conn, &step));
        for (uint32_t i = LO; i < HI; i++)
            if (ct_mine(r, i)) {
                uint32_t n = r->nblocks[i];
                uint32_t a = n * s / S, b = n * (s + 1) / S;
                CHECK_OK(kvt_sender_send_step(r->room[i], step, r->table[i] + a,
                                              b - a, s == S - 1));
            }
        for (uint32_t lyr = 0; lyr < c->layers + c->draft; lyr++) {
            if (c->layer_sleep_us)
                usleep(c->layer_sleep_us);
            ct_fill_layer(r, lyr, s, S);
            CHECK_OK(kvt_conn_layer_ready(r->conn, step, lyr));
            if (s == S - 1 && lyr == 1 && rank == 0 &&
                c->fault == F_PREFILL_DIES_MIDSTREAM) {
                usleep(50000);
                raise(SIGKILL);
            }
            if (s == S - 1 && lyr == 1 && abort_here &&
                c->fault == F_ABORT_TRANSFERRING)
                for (uint32_t i = LO; i < HI; i++)
                    if (ct_mine(r, i))
                        CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
        }
        if (s == S - 1)
            for (uint32_t i = LO; i < HI; i++)
                if (ct_mine(r, i))
                    ct_aux(r, i, 1);
        CHECK_OK(kvt_conn_step_end(r->conn, step));
    }
wait:
    rc = ct_wait_rooms(r, c->expect_prefill, c->time_limit_s);
    if (rc == 0 && c->expect_prefill == KVT_POLL_SUCCESS)
        ct_check_stats(r);
    ct_barrier();
    ct_rank_fini(r);
    free(r);
    return rc;
}

/* ---- Decode rank ------------------------------------------------------- */

/* Check every block of rooms [lo, hi) and every block no room owns. */
static inline int ct_verify_rooms(rank_t *r, uint32_t lo, uint32_t hi)
{
    const ccfg_t *c = r->cfg;
    uint8_t *owner = calloc(c->pool, 1);
    uint32_t *room_of = calloc(c->pool, sizeof(uint32_t));
    uint32_t *lb_of = calloc(c->pool, sizeof(uint32_t));
    size_t bad = 0;

    for (uint32_t i = 0; i < c->nrooms; i++) {
        for (uint32_t j = 0; j < r->nblocks[i] - r->prefix[i]; j++) {
            owner[r->table[i][j]] = 1;
            room_of[r->table[i][j]] = i;
            lb_of[r->table[i][j]] = r->prefix[i] + j;
        }
    }
    for (size_t k = 0; k < r->ncaches; k++) {
        const kvt_kv_cache_t *kc = &r->caches[k];
        for (uint32_t b = 0; b < c->pool; b++) {
            size_t e;
            if (owner[b] && (room_of[b] < lo || room_of[b] >= hi)) {
                e = 0;
            } else if (owner[b]) {
                e = ct_block(r, kc, room_of[b], lb_of[b], b, 0);
            } else {
                const uint8_t *p =
                    (const uint8_t *)kc->base + (size_t)b * kc->block_bytes;
                e = 0;
                for (uint64_t x = 0; x < kc->block_bytes; x++)
                    e += p[x] != CANARY;
            }
            if (e > 0 && bad < 5)
                fprintf(stderr,
                        "decode rank %u: layer %u %s block %u "
                        "(room %u): %zu wrong bytes\n",
                        r->rank, kc->layer,
                        kc->kind == KVT_CACHE_K ? "K" : "cache", b,
                        owner[b] ? room_of[b] : 0, e);
            bad += e > 0;
        }
    }
    for (uint32_t i = lo; i < hi; i++) {
        size_t e = ct_aux(r, i, 0);
        if (e > 0)
            fprintf(stderr,
                    "decode rank %u: aux of room %u: %zu wrong "
                    "bytes\n",
                    r->rank, i, e);
        bad += e > 0;
    }
    for (uint32_t a = 0; a < c->naux; a++) {
        for (uint64_t s = 0; s < r->aux[a].count; s++) {
            const uint8_t *p =
                (const uint8_t *)r->aux[a].base + s * r->aux[a].item_bytes;
            int used = 0;
            for (uint32_t i = 0; i < c->nrooms; i++)
                used |= ct_aux_slot(r, i) == s;
            for (uint64_t x = 0; !used && x < r->aux[a].item_bytes; x++)
                if (p[x] != CANARY) {
                    fprintf(stderr,
                            "decode rank %u: aux %u slot %llu "
                            "touched\n",
                            r->rank, a, (unsigned long long)s);
                    bad++;
                    break;
                }
        }
    }
    free(owner);
    free(room_of);
    free(lb_of);
    return bad ? 1 : 0;
}

static inline int ct_verify(rank_t *r)
{
    return ct_verify_rooms(r, 0, r->cfg->nrooms);
}

static inline int ct_decode_main(const ccfg_t *c, uint32_t rank, uint16_t port)
{
    rank_t *r = calloc(1, sizeof(*r));
    int abort_here = c->abort_side == SIDE_DECODE;
    int rc;

    ct_rank_init(r, c, SIDE_DECODE, rank, port);
    for (size_t k = 0; k < r->ncaches; k++)
        memset(r->caches[k].base, CANARY, r->caches[k].block_bytes * c->pool);
    for (uint32_t a = 0; a < c->naux; a++)
        memset(r->aux[a].base, CANARY, r->aux[a].item_bytes * r->aux[a].count);
    CHECK_OK(ct_connector(r, port));
    if (c->fault == F_ABORT_BOOTSTRAPPING && c->abort_side == SIDE_PREFILL)
        usleep(300000); /* let prefill abort first */
    for (uint32_t i = 0; i < c->nrooms; i++) {
        uint64_t slot = ct_aux_slot(r, i);
        CHECK_OK(
            kvt_receiver_create(r->conn, NULL, ct_room_id(i), -1, &r->room[i]));
        if (abort_here && c->fault == F_ABORT_BOOTSTRAPPING) {
            CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
            continue;
        }
        if (abort_here && c->fault == F_ABORT_WAITING) {
            CHECK(ct_wait_state(r->room[i], KVT_POLL_WAITING_FOR_INPUT, 10) ==
                  0);
            CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
            continue;
        }
        CHECK_OK(kvt_receiver_init(r->room[i], r->table[i],
                                   r->nblocks[i] - r->prefix[i], r->prefix[i],
                                   &slot, c->naux ? 1 : 0));
    }
    if (abort_here && c->fault == F_ABORT_ANNOUNCED) {
        for (uint32_t i = 0; i < c->nrooms; i++)
            CHECK(ct_wait_state(r->room[i], KVT_POLL_WAITING_FOR_INPUT, 10) ==
                  0);
        usleep(50000);
        for (uint32_t i = 0; i < c->nrooms; i++)
            CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
    }
    if ((abort_here && c->fault == F_ABORT_TRANSFERRING) ||
        (rank == 0 && c->fault == F_DECODE_DIES_MIDSTREAM)) {
        CHECK(ct_wait_state(r->room[0], KVT_POLL_TRANSFERRING, 10) == 0);
        if (c->fault == F_DECODE_DIES_MIDSTREAM)
            raise(SIGKILL);
        for (uint32_t i = 0; i < c->nrooms; i++)
            CHECK_OK(kvt_room_abort(r->room[i], "test abort"));
    }
    rc = ct_wait_rooms(r, c->expect_decode, c->time_limit_s);
    if (rc == 0 && c->expect_decode == KVT_POLL_SUCCESS) {
        rc = ct_verify(r);
        ct_check_stats(r);
    }
    ct_barrier();
    ct_rank_fini(r);
    free(r);
    return rc;
}

/* ---- A case ------------------------------------------------------------ */

/* The bootstrap server in a child: reports its port on @wfd and runs
 * until @ctl reaches end of file. */
static inline void ct_boot_child(int wfd, int ctl)
{
    kvt_bootstrap_h b;
    uint16_t port;
    char ch;

    if (kvt_bootstrap_start("127.0.0.1", 0, &b) != KVT_OK)
        _exit(1);
    port = kvt_bootstrap_port(b);
    if (write(wfd, &port, sizeof(port)) != sizeof(port))
        _exit(1);
    close(wfd);
    while (read(ctl, &ch, 1) > 0)
        ;
    kvt_bootstrap_stop(b);
    exit(0);
}

/* Start the bootstrap child; *ctl_p is the pipe end whose closing stops
 * it. */
static inline pid_t ct_boot_start(uint16_t *port_p, int *ctl_p)
{
    int pfd[2], cfd[2];
    pid_t pid;

    CHECK(pipe(pfd) == 0 && pipe(cfd) == 0);
    fflush(NULL);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        close(cfd[1]);
        ct_boot_child(pfd[1], cfd[0]);
    }
    close(pfd[1]);
    close(cfd[0]);
    CHECK(read(pfd[0], port_p, sizeof(*port_p)) == sizeof(*port_p));
    close(pfd[0]);
    *ctl_p = cfd[1];
    return pid;
}

static inline void ct_boot_stop(pid_t pid, int ctl)
{
    int status;
    close(ctl);
    waitpid(pid, &status, 0);
}

/* Run a scenario: every rank in its own process. A rank the scenario
 * kills on purpose must die of SIGKILL; every other must exit 0. */
static inline void ct_run(const ccfg_t *c)
{
    pid_t pids[64];
    int side[64], n = 0, ctl, failed = 0, done[2], rel[2], reporters;
    uint16_t port;
    pid_t boot = ct_boot_start(&port, &ctl);
    double t0 = kvt_test_now(), limit;
    char buf[64];

    CHECK(pipe(done) == 0 && pipe(rel) == 0);
    ct_done_w = done[1];
    ct_release_r = rel[0];

    for (uint32_t p = 0; p < c->P * (c->pdp ? c->pdp : 1); p++) {
        fflush(NULL);
        pids[n] = fork();
        CHECK(pids[n] >= 0);
        if (pids[n] == 0)
            exit(ct_prefill_main(c, p, port));
        side[n++] = SIDE_PREFILL;
    }
    for (uint32_t d = 0; d < c->D && c->fault != F_NO_DECODE; d++) {
        fflush(NULL);
        pids[n] = fork();
        CHECK(pids[n] >= 0);
        if (pids[n] == 0)
            exit(ct_decode_main(c, d, port));
        side[n++] = SIDE_DECODE;
    }
    close(done[1]);
    close(rel[0]);
    if (c->fault == F_ALL_PAUSED) {
        usleep(c->pause_at_ms * 1000u);
        kill(boot, SIGSTOP);
        for (int i = 0; i < n; i++)
            kill(pids[i], SIGSTOP);
        usleep(c->pause_ms * 1000u);
        for (int i = 0; i < n; i++)
            kill(pids[i], SIGCONT);
        kill(boot, SIGCONT);
    }
    /* Release the ranks once every one that should live has reported. */
    reporters = n - (c->fault == F_PREFILL_DIES_MIDSTREAM ||
                     c->fault == F_DECODE_DIES_MIDSTREAM);
    limit = c->time_limit_s * 1.5 * kvt_test_slowdown();
    for (int got = 0; got < reporters;) {
        struct pollfd pf = {done[0], POLLIN, 0};
        ssize_t k;
        if (kvt_test_now() - t0 > limit)
            break;
        if (poll(&pf, 1, 100) <= 0)
            continue;
        k = read(done[0], buf, sizeof(buf));
        if (k <= 0)
            break;
        got += (int)k;
    }
    memset(buf, 1, sizeof(buf));
    for (int i = 0; i < n; i++)
        if (write(rel[1], buf, 1) != 1)
            break;
    close(rel[1]);
    close(done[0]);
    for (int i = 0; i < n; i++) {
        int st = 0, want_kill;
        while (waitpid(pids[i], &st, WNOHANG) == 0) {
            if (kvt_test_now() - t0 > limit + 10) {
                fprintf(stderr, "rank process %d hangs\n", i);
                for (int j = 0; j < n; j++)
                    kill(pids[j], SIGKILL);
            }
            usleep(5000);
        }
        want_kill =
            (c->fault == F_PREFILL_DIES_MIDSTREAM && side[i] == SIDE_PREFILL &&
             i == 0) ||
            (c->fault == F_DECODE_DIES_MIDSTREAM && side[i] == SIDE_DECODE &&
             pids[i] == pids[c->P * (c->pdp ? c->pdp : 1)]);
        if (want_kill) {
            if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
                fprintf(stderr, "rank %d should have died\n", i);
                failed = 1;
            }
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "%s process %d: %s %d\n",
                    side[i] == SIDE_PREFILL ? "prefill" : "decode", i,
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed = 1;
        }
    }
    ct_boot_stop(boot, ctl);
    CHECK(!failed);
}

#endif
