/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connector units in one process: layout validation and its sentences,
 * the control-message codec, the transfer plan applied by a model of the
 * engine's strided writes (memcpy) over many tensor-parallel geometries,
 * run grouping, API refusals, and a bootstrap server that cannot be
 * reached.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/layout.h"
#include "connector/msg.h"
#include "kvt_test.h"

static uint8_t pool_a[1 << 16], pool_b[1 << 16];

static kvt_kv_cache_t cache(uint32_t layer, uint32_t kind, void *base)
{
    kvt_kv_cache_t c = {layer, kind, KVT_BLOCK_TOKEN_MAJOR, 4, 2, 8, base,
                        64,    16};
    return c;
}

static void expect_fault(const kvt_kv_layout_t *l, const char *needle)
{
    char why[256];
    CHECK_ST(kvt_kv_layout_check(l, why, sizeof(why)), KVT_ERR_INVALID_PARAM);
    if (strstr(why, needle) == NULL) {
        fprintf(stderr, "reason '%s' lacks '%s'\n", why, needle);
        CHECK(0);
    }
}

KVT_TEST(layout_validation)
{
    kvt_kv_cache_t c[4] = {cache(0, KVT_CACHE_K, pool_a),
                           cache(0, KVT_CACHE_V, pool_a + 1024)};
    kvt_aux_buffer_t aux = {pool_b, 8, 4};
    kvt_kv_layout_t l = {1, 0, 2, c, 1, &aux};
    char why[256];

    CHECK_OK(kvt_kv_layout_check(&l, why, sizeof(why)));
    CHECK_ST(kvt_kv_layout_check(NULL, why, sizeof(why)),
             KVT_ERR_INVALID_PARAM);
    l.num_caches = 1;
    expect_fault(&l, "K without V");
    l.num_layers = 1;
    c[1].kind = KVT_CACHE_K;
    l.num_caches = 2;
    expect_fault(&l, "two K caches");
    c[1].kind = KVT_CACHE_V;
    c[2] = cache(0, KVT_CACHE_LATENT, pool_a + 2048);
    l.num_caches = 3;
    expect_fault(&l, "mixes a LATENT");
    l.num_caches = 2;
    c[0].kind = KVT_CACHE_K_SCALE;
    c[1].kind = KVT_CACHE_V;
    expect_fault(&l, "V without K");
    c[0].kind = KVT_CACHE_K;
    c[1].block_bytes = 63;
    expect_fault(&l, "block_bytes 63 is less than");
    c[1].block_bytes = 64;
    c[1].num_blocks = 15;
    expect_fault(&l, "share one block table");
    c[1].num_blocks = 16;
    c[1].layer = 3;
    expect_fault(&l, "out of range");
    c[1].layer = 0;
    c[1].base = NULL;
    expect_fault(&l, "base is NULL");
    c[1].base = pool_a + 1024;
    c[1].heads = 0;
    expect_fault(&l, "at least 1");
    c[1].heads = 2;
    c[1].block_layout = 7;
    expect_fault(&l, "block layout");
    c[1].block_layout = KVT_BLOCK_TOKEN_MAJOR;
    aux.count = 0;
    expect_fault(&l, "aux buffer 0");
    aux.count = 4;
    c[1].base = (void *)(uintptr_t)(UINT64_MAX - 100);
    expect_fault(&l, "overflows");
    c[1].base = pool_a + 1024;
    /* A draft layer without caches. */
    l.num_draft_layers = 1;
    expect_fault(&l, "layer 1 has no cache");
    c[2] = cache(1, KVT_CACHE_LATENT, pool_a + 2048);
    c[3] = cache(1, KVT_CACHE_LATENT_SCALE, pool_a + 3072);
    l.num_caches = 4;
    CHECK_OK(kvt_kv_layout_check(&l, why, sizeof(why)));
    c[2].kind = KVT_CACHE_V_SCALE;
    expect_fault(&l, "scales but neither");
    c[2].kind = KVT_CACHE_K_SCALE;
    c[3].kind = KVT_CACHE_LATENT;
    expect_fault(&l, "K_SCALE without K");
    /* KV: a layer's keys and values in one cache (vLLM's CPU blocks). */
    c[2].kind = KVT_CACHE_KV;
    l.num_caches = 3;
    CHECK_OK(kvt_kv_layout_check(&l, why, sizeof(why)));
    c[3] = cache(1, KVT_CACHE_K, pool_a + 3072);
    l.num_caches = 4;
    expect_fault(&l, "layer 1 mixes a KV cache with K or V");
    c[3].kind = KVT_CACHE_V_SCALE;
    expect_fault(&l, "layer 1 has K or V scales beside a KV cache");
    c[3].kind = KVT_CACHE_LATENT;
    expect_fault(&l, "layer 1 mixes a KV cache with a LATENT");
    c[3].kind = KVT_CACHE_KV + 1;
    expect_fault(&l, "unknown kind 7");
}

/* ---- Codec ------------------------------------------------------------- */

static void build_layout(kvtc__layout_t *l, uint32_t layers, uint32_t heads)
{
    kvtc__cache_t c[64];
    kvtc__aux_t a[2] = {{0x1000, 8, 4}, {0x2000, 24, 4}};
    char why[256];
    size_t n = 0;

    for (uint32_t i = 0; i < layers; i++) {
        for (uint32_t k = 0; k < 2; k++, n++) {
            kvtc__cache_t x = {
                i,  k ? KVT_CACHE_K : KVT_CACHE_V, 1,          4, heads,
                16, 0x10000 + 0x1000 * n,          64 * heads, 32};
            c[n] = x;
        }
    }
    CHECK_OK(kvtc__layout_build(l, layers, 0, c, n, a, 2, why, sizeof(why)));
}

KVT_TEST(codec)
{
    kvtc__layout_t l, l2;
    kvtc__hello_t h = {KVT_ROLE_DECODE, 1, 2, 0, 1}, h2;
    kvtc__cmb_t b;
    kvtc__cm_t m;
    kvtc__status_msg_t s = {-15, {0, 3, 4, 0, 1}, "aborted: why"}, s2;
    uint32_t ids[3000];
    uint64_t slots[2] = {3, UINT64_MAX};
    kvtc__room_msg_t r = {1, 2, KVTC__ROOM_DUMMY, 5, 2, slots, 3000, ids}, r2;
    uint8_t *frags;
    size_t *sizes, nf;
    char why[256];

    build_layout(&l, 3, 2);
    CHECK(l.caches[0].kind == KVT_CACHE_K && l.first[1] == 2);
    kvtc__cmb_init(&b, KVTC__CM_HELLO, 77, 0);
    kvtc__cm_hello_encode(&b, &h, &l);
    CHECK_OK(kvtc__cmb_finish(&b));
    CHECK_OK(kvtc__cm_parse(b.buf, b.len, &m));
    CHECK(m.type == KVTC__CM_HELLO && m.session == 77);
    CHECK_OK(kvtc__cm_hello_decode(&m, &h2, &l2, why, sizeof(why)));
    CHECK(h2.tp_rank == 1 && h2.tp_size == 2 && l2.ncaches == 6);
    CHECK(memcmp(l.caches, l2.caches, 6 * sizeof(*l.caches)) == 0);
    CHECK(l2.aux[1].item_bytes == 24);
    kvtc__layout_clear(&l2);
    /* Truncated, lengthened and corrupted headers are refused. */
    CHECK_ST(kvtc__cm_parse(b.buf, b.len - 1, &m), KVT_ERR_PROTOCOL);
    b.buf[4] = 9;
    CHECK_ST(kvtc__cm_parse(b.buf, b.len, &m), KVT_ERR_VERSION);
    b.buf[4] = 1;
    b.buf[0] ^= 1;
    CHECK_ST(kvtc__cm_parse(b.buf, b.len, &m), KVT_ERR_PROTOCOL);
    kvtc__cmb_free(&b);

    kvtc__cmb_init(&b, KVTC__CM_ABORT, 5, 9);
    kvtc__cm_status_encode(&b, &s);
    CHECK_OK(kvtc__cmb_finish(&b));
    CHECK_OK(kvtc__cm_parse(b.buf, b.len, &m));
    CHECK_OK(kvtc__cm_status_decode(&m, &s2));
    CHECK(s2.status == -15 && s2.who.tp_size == 4 &&
          strcmp(s2.reason, "aborted: why") == 0);
    kvtc__cmb_free(&b);

    for (uint32_t i = 0; i < 3000; i++)
        ids[i] = i * 7;
    kvtc__cmb_init(&b, KVTC__CM_ROOM, 5, 123);
    kvtc__cm_room_encode(&b, &r);
    CHECK_OK(kvtc__cmb_finish(&b));
    CHECK(b.len > KVT_NOTIFY_MAX);
    /* Fragments parse alone, and reassemble to the message. */
    CHECK_OK(kvtc__cm_fragment(b.buf, b.len, 42, KVT_NOTIFY_MAX, &frags, &sizes,
                               &nf));
    CHECK(nf == (b.len + KVT_NOTIFY_MAX - 57) / (KVT_NOTIFY_MAX - 56));
    {
        uint8_t *whole = calloc(1, b.len);
        size_t got = 0;
        for (size_t i = 0; i < nf; i++) {
            kvtc__frag_t f;
            CHECK(sizes[i] <= KVT_NOTIFY_MAX);
            CHECK_OK(kvtc__cm_parse(frags + i * KVT_NOTIFY_MAX, sizes[i], &m));
            CHECK(m.type == KVTC__CM_FRAG && m.room == 123);
            CHECK_OK(kvtc__cm_frag_decode(&m, &f));
            CHECK(f.msg_id == 42 && f.total == b.len &&
                  f.inner_type == KVTC__CM_ROOM);
            memcpy(whole + f.offset, f.data, f.len);
            got += f.len;
        }
        CHECK(got == b.len && memcmp(whole, b.buf, b.len) == 0);
        free(whole);
    }
    free(frags);
    free(sizes);
    CHECK_OK(kvtc__cm_parse(b.buf, b.len, &m));
    CHECK_OK(kvtc__cm_room_decode(&m, &r2));
    CHECK(r2.nblocks == 3000 && r2.ids[2999] == 2999 * 7 &&
          r2.aux_slots[1] == UINT64_MAX && r2.flags == KVTC__ROOM_DUMMY &&
          r2.first_block == 5);
    kvtc__room_msg_clear(&r2);
    m.len -= 4;
    CHECK_ST(kvtc__cm_room_decode(&m, &r2), KVT_ERR_PROTOCOL);
    kvtc__cmb_free(&b);
    kvtc__layout_clear(&l);
}

/* ---- The plan, applied by a model of the engine ------------------------- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* What the engine does with a WRITE descriptor. */
static void apply(const kvt_xfer_desc_t *d, uint8_t *remote, uint64_t rbase)
{
    uint32_t n = d->count > 1 ? d->count : 1;
    uint64_t ls = n > 1 && d->local_stride ? d->local_stride : d->length;
    uint64_t rs = n > 1 && d->remote_stride ? d->remote_stride : d->length;

    for (uint32_t i = 0; i < n; i++)
        memcpy(remote + (d->remote_addr - rbase) + i * rs,
               (uint8_t *)d->local_addr + i * ls, d->length);
}

static uint8_t val(uint32_t blk_logical, uint32_t t, uint32_t gh, uint32_t b)
{
    return (uint8_t)(blk_logical * 131 + t * 31 + gh * 7 + b * 3 + 1);
}

/* Prefill ranks 0..P-1 and decode ranks 0..D-1 with @H heads in all;
 * every prefill rank feeding decode rank d writes a random block table;
 * decode checks every byte, padding included. */
static void plan_case(uint32_t P, uint32_t D, int head_major, uint32_t ppad,
                      uint32_t dpad)
{
    const uint32_t H = 8, T = 4, HB = 6, NB = 24, N = 10;
    uint32_t hd = H / D, hp = H / P;

    for (uint32_t d = 0; d < D; d++) {
        uint64_t dblock = (uint64_t)T * hd * HB + dpad;
        uint8_t *dmem = malloc(dblock * NB);
        uint32_t dids[N];
        kvtc__layout_t dl;
        kvtc__cache_t dc = {0,  KVT_CACHE_K, (uint32_t)head_major,      T,
                            hd, HB,          (uint64_t)(uintptr_t)dmem, dblock,
                            NB};
        kvtc__cache_t dv = dc;
        char why[256];

        dv.kind = KVT_CACHE_V;
        memset(dmem, 0xEE, dblock * NB);
        for (uint32_t i = 0; i < N; i++) {
            int again;
            do {
                dids[i] = rnd(NB);
                again = 0;
                for (uint32_t j = 0; j < i; j++)
                    again |= dids[j] == dids[i];
            } while (again);
        }
        {
            kvtc__cache_t both[2] = {dc, dv};
            /* V shares the memory: only K is applied below. */
            CHECK_OK(kvtc__layout_build(&dl, 1, 0, both, 2, NULL, 0, why,
                                        sizeof(why)));
        }
        for (uint32_t p = 0; p < P; p++) {
            uint64_t pblock = (uint64_t)T * hp * HB + ppad;
            uint8_t *pmem;
            uint32_t pids[N];
            kvtc__layout_t pl;
            kvtc__xplan_t plan[2];
            kvtc__run_t runs[N];
            kvt_xfer_desc_t descs[N * 8];
            size_t nr, nd = 0;
            int feeds;

            feeds = P >= D ? p / (P / D) == d : d / (D / P) == p;
            if (!feeds)
                continue;
            pmem = malloc(pblock * NB);
            memset(pmem, 0x5A, pblock * NB);
            for (uint32_t i = 0; i < N; i++)
                pids[i] = (i * 5 + p) % NB;
            for (uint32_t i = 0; i < N; i++) {
                for (uint32_t t = 0; t < T; t++)
                    for (uint32_t h = 0; h < hp; h++)
                        for (uint32_t b = 0; b < HB; b++) {
                            size_t pos = head_major
                                             ? ((size_t)h * T + t) * HB + b
                                             : ((size_t)t * hp + h) * HB + b;
                            pmem[pids[i] * pblock + pos] =
                                val(i, t, p * hp + h, b);
                        }
            }
            {
                kvtc__cache_t pc = {
                    0,  KVT_CACHE_K, (uint32_t)head_major,      T,
                    hp, HB,          (uint64_t)(uintptr_t)pmem, pblock,
                    NB};
                kvtc__cache_t both[2] = {pc, pc};
                both[1].kind = KVT_CACHE_V;
                CHECK_OK(kvtc__layout_build(&pl, 1, 0, both, 2, NULL, 0, why,
                                            sizeof(why)));
            }
            CHECK_OK(kvtc__layout_plan(&pl, P, p, &dl, D, d, plan, why,
                                       sizeof(why)));
            nr = kvtc__runs_build(pids, dids, N, 3, runs);
            for (size_t k = 0; k < nr; k++) {
                CHECK(runs[k].n <= 3);
                nd += kvtc__xplan_descs(&plan[0], &runs[k], 1, 0, descs + nd);
            }
            for (size_t k = 0; k < nd; k++)
                apply(&descs[k], dmem, (uint64_t)(uintptr_t)dmem);
            kvtc__layout_clear(&pl);
            free(pmem);
        }
        /* Every byte of decode's blocks. */
        for (uint32_t blk = 0; blk < NB; blk++) {
            int owner = -1;
            for (uint32_t i = 0; i < N; i++)
                if (dids[i] == blk)
                    owner = (int)i;
            for (uint64_t x = 0; x < dblock; x++) {
                uint8_t want = 0xEE, got = dmem[blk * dblock + x];
                if (owner >= 0 && x < (uint64_t)T * hd * HB) {
                    uint32_t b = (uint32_t)(x % HB), h, t;
                    if (head_major) {
                        t = (uint32_t)(x / HB % T);
                        h = (uint32_t)(x / HB / T);
                    } else {
                        h = (uint32_t)(x / HB % hd);
                        t = (uint32_t)(x / HB / hd);
                    }
                    want = val((uint32_t)owner, t, d * hd + h, b);
                }
                if (got != want) {
                    fprintf(stderr,
                            "P=%u D=%u %s ppad=%u dpad=%u: decode %u "
                            "block %u byte %llu: %#x, want %#x\n",
                            P, D, head_major ? "head" : "token", ppad, dpad, d,
                            blk, (unsigned long long)x, got, want);
                    CHECK(0);
                }
            }
        }
        kvtc__layout_clear(&dl);
        free(dmem);
    }
}

KVT_TEST(plan_geometries)
{
    static const uint32_t pairs[][2] = {{1, 1}, {2, 1}, {4, 1}, {8, 1},
                                        {4, 2}, {8, 4}, {1, 2}, {1, 4},
                                        {1, 8}, {2, 4}, {2, 8}, {4, 8}};
    static const uint32_t pads[][2] = {{0, 0}, {0, 16}, {10, 0}, {8, 8}};

    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        for (int hm = 0; hm < 2; hm++)
            for (size_t k = 0; k < sizeof(pads) / sizeof(pads[0]); k++)
                plan_case(pairs[i][0], pairs[i][1], hm, pads[k][0], pads[k][1]);
}

KVT_TEST(plan_refusals)
{
    kvtc__layout_t a, b;
    kvtc__xplan_t plan[8];
    char why[256];

    build_layout(&a, 2, 4);
    build_layout(&b, 2, 2);
    CHECK_ST(kvtc__layout_plan(&a, 3, 0, &b, 2, 0, plan, why, sizeof(why)),
             KVT_ERR_INVALID_PARAM);
    CHECK(strstr(why, "divide") != NULL);
    /* 4 heads x tp 1 against 2 heads x tp 2: fine; x tp 4: totals differ */
    CHECK_OK(kvtc__layout_plan(&a, 1, 0, &b, 2, 1, plan, why, sizeof(why)));
    CHECK_ST(kvtc__layout_plan(&a, 1, 0, &b, 4, 1, plan, why, sizeof(why)),
             KVT_ERR_INVALID_PARAM);
    CHECK(strstr(why, "totals differ") != NULL);
    b.aux[1].item_bytes = 25;
    CHECK_ST(kvtc__layout_plan(&a, 1, 0, &b, 2, 1, plan, why, sizeof(why)),
             KVT_ERR_INVALID_PARAM);
    CHECK(strstr(why, "aux buffer 1") != NULL);
    kvtc__layout_clear(&a);
    kvtc__layout_clear(&b);
    build_layout(&a, 2, 2);
    build_layout(&b, 3, 2);
    CHECK_ST(kvtc__layout_plan(&a, 1, 0, &b, 1, 0, plan, why, sizeof(why)),
             KVT_ERR_INVALID_PARAM);
    CHECK(strstr(why, "layers") != NULL);
    kvtc__layout_clear(&a);
    kvtc__layout_clear(&b);
}

KVT_TEST(runs)
{
    uint32_t s[] = {4, 5, 6, 9, 10, 11, 12, 13, 2};
    uint32_t d[] = {7, 8, 9, 1, 2, 3, 4, 5, 3};
    kvtc__run_t r[9];
    size_t n = kvtc__runs_build(s, d, 9, 3, r);

    CHECK(n == 4);
    CHECK(r[0].src == 4 && r[0].dst == 7 && r[0].n == 3);
    CHECK(r[1].src == 9 && r[1].dst == 1 && r[1].n == 3);
    CHECK(r[2].src == 12 && r[2].dst == 4 && r[2].n == 2);
    CHECK(r[3].src == 2 && r[3].n == 1);
    CHECK(kvtc__max_run(16) == 65536 && kvtc__max_run(1u << 20) == 2048 &&
          kvtc__max_run(UINT32_MAX) == 1);
}

/* ---- API refusals and an unreachable bootstrap server ------------------ */

static kvt_conn_h make_conn(kvt_engine_h e, kvt_role_t role, kvt_kv_cache_t *c,
                            kvt_status_t want)
{
    kvt_aux_buffer_t aux = {pool_b, 8, 4};
    kvt_kv_layout_t l = {1, 0, 2, c, 1, &aux};
    kvt_conn_params_t p = {0};
    kvt_conn_h conn = NULL;

    p.field_mask = KVT_CONN_PARAM_ROLE | KVT_CONN_PARAM_ENGINE |
                   KVT_CONN_PARAM_LAYOUT | KVT_CONN_PARAM_BOOTSTRAP_ADDR |
                   KVT_CONN_PARAM_BOOTSTRAP_TIMEOUT;
    p.role = role;
    p.engine = e;
    p.layout = &l;
    p.bootstrap_addr = "127.0.0.1:1";
    p.bootstrap_timeout_ms = 700;
    CHECK_ST(kvt_conn_create(&p, &conn), want);
    return conn;
}

KVT_TEST(api_and_unreachable_bootstrap)
{
    kvt_kv_cache_t c[2] = {cache(0, KVT_CACHE_K, pool_a),
                           cache(0, KVT_CACHE_V, pool_a + 1024)};
    kvt_engine_params_t ep = {0};
    kvt_engine_h e;
    kvt_conn_h conn;
    kvt_receiver_h r, r2;
    kvt_sender_h s;
    kvt_room_info_t info;
    uint32_t ids[2] = {1, 99};
    uint64_t slot = 9, step;
    double t0;

    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    ep.local_host = "127.0.0.1";
    CHECK_OK(kvt_engine_create(&ep, &e));
    /* Prefill must register: an unreachable server fails creation. */
    make_conn(e, KVT_ROLE_PREFILL, c, KVT_ERR_UNREACHABLE);
    conn = make_conn(e, KVT_ROLE_DECODE, c, KVT_OK);
    /* The memory is registered: a second connector on it is refused. */
    make_conn(e, KVT_ROLE_DECODE, c, KVT_ERR_EXISTS);
    CHECK_ST(kvt_sender_create(conn, NULL, 1, &s), KVT_ERR_INVALID_PARAM);
    CHECK_ST(kvt_conn_step_begin(conn, &step), KVT_ERR_INVALID_PARAM);
    CHECK_OK(kvt_receiver_create(conn, NULL, 5, -1, &r));
    CHECK_ST(kvt_receiver_create(conn, NULL, 5, -1, &r2), KVT_ERR_EXISTS);
    CHECK_ST(kvt_receiver_init(r, ids, 2, 0, NULL, 0),
             KVT_ERR_INVALID_PARAM); /* block 99 of 16 */
    CHECK_ST(kvt_receiver_init(r, ids, 1, 0, &slot, 1),
             KVT_ERR_INVALID_PARAM); /* aux slot 9 of 4 */
    slot = 3;
    CHECK_OK(kvt_receiver_init(r, ids, 1, 0, &slot, 1));
    CHECK_ST(kvt_receiver_init(r, ids, 1, 0, &slot, 1), KVT_ERR_INVALID_PARAM);
    t0 = kvt_test_now();
    CHECK(kvt_room_wait(r, 5000) == KVT_POLL_FAILED);
    CHECK(kvt_test_now() - t0 < 3.0 * kvt_test_slowdown());
    CHECK_OK(kvt_room_info(r, &info));
    CHECK(info.error == KVT_ERR_TIMEDOUT && info.room == 5);
    CHECK(strstr(info.reason, "unreachable") != NULL);
    CHECK(strcmp(kvt_poll_str(info.state), "Failed") == 0);
    kvt_room_destroy(r);
    /* A room still bootstrapping when the connector goes: destroy aborts
     * it and returns promptly. */
    CHECK_OK(kvt_receiver_create(conn, "127.0.0.1:2", 6, 0, &r2));
    t0 = kvt_test_now();
    kvt_conn_destroy(conn);
    CHECK(kvt_test_now() - t0 < 2.0 * kvt_test_slowdown());
    kvt_engine_destroy(e);
}

KVT_TEST_MAIN(KVT_CASE(layout_validation, 10), KVT_CASE(codec, 10),
              KVT_CASE(plan_geometries, 60), KVT_CASE(plan_refusals, 10),
              KVT_CASE(runs, 10), KVT_CASE(api_and_unreachable_bootstrap, 30))
