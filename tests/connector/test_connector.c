/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connector scenarios, every rank a process (conn_test.h): whole-request
 * and layer-wise modes over tensor-parallel pairs and both block layouts,
 * MLA with dummy ranks, draft layers, quantisation scales, prefix reuse,
 * several aux buffers, many rooms.
 */
#include "conn_test.h"

#define TP_CASE(mode, lay, p, d)                                               \
    KVT_TEST(mode##_##lay##_tp##p##d)                                          \
    {                                                                          \
        ccfg_t c = ccfg_default();                                             \
        c.P = p;                                                               \
        c.D = d;                                                               \
        c.layerwise = sizeof(#mode) == sizeof("layer");                        \
        c.head_major = sizeof(#lay) == sizeof("head");                         \
        ct_run(&c);                                                            \
    }

TP_CASE(whole, token, 1, 1)
TP_CASE(whole, token, 2, 1)
TP_CASE(whole, token, 4, 2)
TP_CASE(whole, token, 1, 2)
TP_CASE(whole, token, 2, 4)
TP_CASE(whole, head, 1, 1)
TP_CASE(whole, head, 2, 1)
TP_CASE(whole, head, 4, 2)
TP_CASE(whole, head, 1, 2)
TP_CASE(whole, head, 2, 4)
TP_CASE(layer, token, 1, 1)
TP_CASE(layer, token, 2, 1)
TP_CASE(layer, token, 4, 2)
TP_CASE(layer, token, 1, 2)
TP_CASE(layer, token, 2, 4)
TP_CASE(layer, head, 1, 1)
TP_CASE(layer, head, 2, 1)
TP_CASE(layer, head, 4, 2)
TP_CASE(layer, head, 1, 2)
TP_CASE(layer, head, 2, 4)

#define CASE(n) KVT_CASE(n, 60)

KVT_TEST_MAIN(CASE(whole_token_tp11), CASE(whole_token_tp21),
              CASE(whole_token_tp42), CASE(whole_token_tp12),
              CASE(whole_token_tp24), CASE(whole_head_tp11),
              CASE(whole_head_tp21), CASE(whole_head_tp42),
              CASE(whole_head_tp12), CASE(whole_head_tp24),
              CASE(layer_token_tp11), CASE(layer_token_tp21),
              CASE(layer_token_tp42), CASE(layer_token_tp12),
              CASE(layer_token_tp24), CASE(layer_head_tp11),
              CASE(layer_head_tp21), CASE(layer_head_tp42),
              CASE(layer_head_tp12), CASE(layer_head_tp24))
