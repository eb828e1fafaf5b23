/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connector features, every rank a process (conn_test.h): MLA with dummy
 * ranks, draft layers, quantisation scales, prefix reuse, several aux
 * buffers, padded blocks, layer groups, chunked requests, many rooms.
 */
#include "conn_test.h"

/* MLA (latent + its scales): each decode rank gets the latent cache from
 * one prefill rank; the other prefill ranks of its group are dummies. */
static void mla(uint32_t P, uint32_t D, int layerwise)
{
    ccfg_t c = ccfg_default();
    c.P = P;
    c.D = D;
    c.mla = 1;
    c.scales = 1;
    c.layerwise = layerwise;
    ct_run(&c);
}

KVT_TEST(mla_dummy_tp21)
{
    mla(2, 1, 0);
}
KVT_TEST(mla_dummy_tp42_layerwise)
{
    mla(4, 2, 1);
}
KVT_TEST(mla_tp12)
{
    mla(1, 2, 1);
}
KVT_TEST(mla_tp11)
{
    mla(1, 1, 0);
}

/* Target K/V layers and MLA draft layers (and the reverse), with heads
 * sliced across tp 2 -> 1 and 1 -> 2. */
KVT_TEST(draft_layers)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 1;
    c.layers = 3;
    c.draft = 2;
    c.draft_mla = 1;
    c.layerwise = 1;
    ct_run(&c);
}

KVT_TEST(draft_layers_mla_target)
{
    ccfg_t c = ccfg_default();
    c.P = 1;
    c.D = 2;
    c.layers = 3;
    c.mla = 1;
    c.draft = 1;
    c.head_major = 1;
    ct_run(&c);
}

/* K/V with per-token-head scale caches, sliced like the heads. */
KVT_TEST(quant_scales_tp21)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 1;
    c.scales = 1;
    c.layerwise = 1;
    ct_run(&c);
}

KVT_TEST(quant_scales_tp24_head_major)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 4;
    c.scales = 1;
    c.head_major = 1;
    ct_run(&c);
}

/* Decode holds a prefix of every other room: only the rest is sent. */
KVT_TEST(prefix_reuse)
{
    ccfg_t c = ccfg_default();
    c.prefix = 2;
    c.min_blocks = 3;
    ct_run(&c);
}

KVT_TEST(prefix_reuse_tp24_layerwise)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 4;
    c.prefix = 3;
    c.min_blocks = 4;
    c.layerwise = 1;
    ct_run(&c);
}

KVT_TEST(aux_buffers)
{
    ccfg_t c = ccfg_default();
    c.naux = 5;
    c.P = 2;
    c.D = 1;
    ct_run(&c);
}

/* Padded blocks on one side: no contiguous runs, per-block and per-row
 * pieces. */
KVT_TEST(padded_blocks)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 1;
    c.dpad = 40;
    ct_run(&c);
}

KVT_TEST(padded_blocks_head_major)
{
    ccfg_t c = ccfg_default();
    c.P = 1;
    c.D = 2;
    c.ppad = 24;
    c.dpad = 8;
    c.head_major = 1;
    c.layerwise = 1;
    ct_run(&c);
}

KVT_TEST(submit_interval)
{
    ccfg_t c = ccfg_default();
    c.layers = 7;
    c.submit_interval = 3;
    c.layerwise = 1;
    c.chunks = 3;
    ct_run(&c);
}

KVT_TEST(whole_chunks)
{
    ccfg_t c = ccfg_default();
    c.chunks = 4;
    c.min_blocks = 1;
    ct_run(&c);
}

KVT_TEST(many_rooms)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 1;
    c.nrooms = 96;
    c.min_blocks = 1;
    c.max_blocks = 4;
    c.pool = 400;
    c.layerwise = 1;
    ct_run(&c);
}

/* Two prefill data-parallel groups: decode sends room R to group
 * R % 2. */
KVT_TEST(prefill_dp_groups)
{
    ccfg_t c = ccfg_default();
    c.P = 2;
    c.D = 1;
    c.pdp = 2;
    c.nrooms = 6;
    c.layerwise = 1;
    ct_run(&c);
}

#define CASE(n) KVT_CASE(n, 60)

KVT_TEST_MAIN(CASE(mla_dummy_tp21), CASE(mla_dummy_tp42_layerwise),
              CASE(mla_tp12), CASE(mla_tp11), CASE(draft_layers),
              CASE(draft_layers_mla_target), CASE(quant_scales_tp21),
              CASE(quant_scales_tp24_head_major), CASE(prefix_reuse),
              CASE(prefix_reuse_tp24_layerwise), CASE(aux_buffers),
              CASE(padded_blocks), CASE(padded_blocks_head_major),
              CASE(submit_interval), CASE(whole_chunks), CASE(many_rooms),
              CASE(prefill_dp_groups))
