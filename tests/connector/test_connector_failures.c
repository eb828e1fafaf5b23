/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connector failures, every rank a process (conn_test.h): a rank killed
 * mid-stream, aborts from either side in each state, timeouts. Each
 * scenario waits less than the timeouts that would otherwise end the
 * rooms, so a failure that did not propagate shows as a wrong state.
 */
#include "conn_test.h"

static ccfg_t failing(int fault)
{
    ccfg_t c = ccfg_default();
    c.fault = fault;
    c.expect_prefill = c.expect_decode = KVT_POLL_FAILED;
    c.layerwise = 1;
    c.chunks = 1;
    c.layer_sleep_us = 60000;
    c.layers = 8;
    c.time_limit_s = 8;
    return c;
}

KVT_TEST(prefill_killed_midstream)
{
    ccfg_t c = failing(F_PREFILL_DIES_MIDSTREAM);
    ct_run(&c);
}

/* The survivor of two prefill ranks learns from decode's abort. */
KVT_TEST(prefill_killed_midstream_tp21)
{
    ccfg_t c = failing(F_PREFILL_DIES_MIDSTREAM);
    c.P = 2;
    ct_run(&c);
}

KVT_TEST(decode_killed_midstream)
{
    ccfg_t c = failing(F_DECODE_DIES_MIDSTREAM);
    ct_run(&c);
}

KVT_TEST(decode_killed_midstream_tp12)
{
    ccfg_t c = failing(F_DECODE_DIES_MIDSTREAM);
    c.D = 2;
    ct_run(&c);
}

static void aborted(int side, int fault)
{
    ccfg_t c = failing(fault);
    c.abort_side = side;
    c.P = 2;
    c.D = 2;
    ct_run(&c);
}

KVT_TEST(decode_abort_bootstrapping)
{
    /* Decode aborts before any contact: prefill is never told and ends
     * with its bootstrap timeout. */
    ccfg_t c = failing(F_ABORT_BOOTSTRAPPING);
    c.abort_side = SIDE_DECODE;
    c.bootstrap_ms = 1500;
    ct_run(&c);
}

KVT_TEST(decode_abort_waiting)
{
    aborted(SIDE_DECODE, F_ABORT_WAITING);
}

KVT_TEST(decode_abort_announced)
{
    aborted(SIDE_DECODE, F_ABORT_ANNOUNCED);
}

KVT_TEST(decode_abort_transferring)
{
    aborted(SIDE_DECODE, F_ABORT_TRANSFERRING);
}

KVT_TEST(prefill_abort_bootstrapping)
{
    aborted(SIDE_PREFILL, F_ABORT_BOOTSTRAPPING);
}

KVT_TEST(prefill_abort_waiting)
{
    aborted(SIDE_PREFILL, F_ABORT_WAITING);
}

KVT_TEST(prefill_abort_transferring)
{
    aborted(SIDE_PREFILL, F_ABORT_TRANSFERRING);
}

/* Prefill never sends: both sides end with the waiting timeout. */
KVT_TEST(waiting_timeout)
{
    ccfg_t c = failing(F_PREFILL_SILENT);
    c.waiting_ms = 1500;
    ct_run(&c);
}

/* No decode rank ever announces: prefill ends with its bootstrap
 * timeout. */
KVT_TEST(bootstrap_timeout_prefill)
{
    ccfg_t c = failing(F_NO_DECODE);
    c.bootstrap_ms = 1000;
    ct_run(&c);
}

#define CASE(n) KVT_CASE(n, 60)

KVT_TEST_MAIN(CASE(prefill_killed_midstream),
              CASE(prefill_killed_midstream_tp21),
              CASE(decode_killed_midstream), CASE(decode_killed_midstream_tp12),
              CASE(decode_abort_bootstrapping), CASE(decode_abort_waiting),
              CASE(decode_abort_announced), CASE(decode_abort_transferring),
              CASE(prefill_abort_bootstrapping), CASE(prefill_abort_waiting),
              CASE(prefill_abort_transferring), CASE(waiting_timeout),
              CASE(bootstrap_timeout_prefill))
