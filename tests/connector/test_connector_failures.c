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

/* Every process stopped for longer than the peer timeout (2 s), mid-stream,
 * as when the machine stalls: on resuming, neither side may take the
 * other's silence over the pause for a death. Both sides' rooms succeed. */
KVT_TEST(all_paused_midstream)
{
    ccfg_t c = ccfg_default();
    c.fault = F_ALL_PAUSED;
    c.layerwise = 1;
    c.chunks = 1;
    c.layers = 8;
    c.layer_sleep_us = 200000;
    c.pause_at_ms = 900;
    c.pause_ms = 3500;
    c.time_limit_s = 20;
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

/*
 * A prefill rank dies mid-stream and a new one takes its place: decode's
 * rooms on the dead session fail, and its next rooms look the rank up
 * again, handshake with the new process and succeed.
 */
static int up_fd = -1;

static void report_up(void)
{
    char ch = 'u';
    CHECK(write(up_fd, &ch, 1) == 1);
}

static int restart_decode(const ccfg_t *c, uint16_t port, int to_parent,
                          int from_parent)
{
    rank_t *r = calloc(1, sizeof(*r));
    uint32_t half = c->nrooms / 2;
    char ch = 'a';
    int rc;

    ct_rank_init(r, c, SIDE_DECODE, 0, port);
    for (size_t k = 0; k < r->ncaches; k++)
        memset(r->caches[k].base, CANARY, r->caches[k].block_bytes * c->pool);
    for (uint32_t a = 0; a < c->naux; a++)
        memset(r->aux[a].base, CANARY, r->aux[a].item_bytes * r->aux[a].count);
    CHECK_OK(ct_connector(r, port));
    for (uint32_t pass = 0; pass < 2; pass++) {
        for (uint32_t i = pass * half; i < (pass + 1) * half; i++) {
            uint64_t slot = ct_aux_slot(r, i);
            CHECK_OK(kvt_receiver_create(r->conn, NULL, ct_room_id(i), -1,
                                         &r->room[i]));
            CHECK_OK(kvt_receiver_init(r->room[i], r->table[i],
                                       r->nblocks[i] - r->prefix[i],
                                       r->prefix[i], &slot, 1));
        }
        for (uint32_t i = pass * half; i < (pass + 1) * half; i++) {
            kvt_poll_t want = pass ? KVT_POLL_SUCCESS : KVT_POLL_FAILED;
            kvt_room_info_t info;
            kvt_room_wait(r->room[i], 10000);
            kvt_room_info(r->room[i], &info);
            if (info.state != want) {
                fprintf(stderr, "room %u: %s (%s)\n", i,
                        kvt_poll_str(info.state), info.reason);
                exit(1);
            }
        }
        if (pass == 0) {
            CHECK(write(to_parent, &ch, 1) == 1);
            CHECK(read(from_parent, &ch, 1) == 1);
        }
    }
    rc = ct_verify_rooms(r, half, c->nrooms);
    ct_rank_fini(r);
    free(r);
    return rc;
}

KVT_TEST(prefill_restarts)
{
    ccfg_t c = failing(F_PREFILL_DIES_MIDSTREAM);
    int up[2], down[2], ready[2], ctl, st;
    uint16_t port;
    pid_t boot = ct_boot_start(&port, &ctl), dec, p1, p2;
    char ch;

    c.nrooms = 4;
    CHECK(pipe(up) == 0 && pipe(down) == 0 && pipe(ready) == 0);
    fflush(NULL);
    if ((dec = fork()) == 0)
        exit(restart_decode(&c, port, up[1], down[0]));
    c.room_lo = 0;
    c.room_hi = 2;
    fflush(NULL);
    if ((p1 = fork()) == 0)
        exit(ct_prefill_main(&c, 0, port));
    CHECK(waitpid(p1, &st, 0) == p1 && WIFSIGNALED(st));
    CHECK(read(up[0], &ch, 1) == 1);
    /* The second prefill process serves the other rooms, in full. */
    c.fault = F_NONE;
    c.expect_prefill = KVT_POLL_SUCCESS;
    c.room_lo = 2;
    c.room_hi = 4;
    fflush(NULL);
    if ((p2 = fork()) == 0) {
        up_fd = ready[1];
        ct_up_hook = report_up;
        exit(ct_prefill_main(&c, 0, port));
    }
    CHECK(read(ready[0], &ch, 1) == 1);
    CHECK(write(down[1], &ch, 1) == 1);
    CHECK(waitpid(dec, &st, 0) == dec && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(waitpid(p2, &st, 0) == p2 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ct_boot_stop(boot, ctl);
}

#define CASE(n) KVT_CASE(n, 60)

KVT_TEST_MAIN(CASE(prefill_killed_midstream), CASE(all_paused_midstream),
              CASE(prefill_killed_midstream_tp21),
              CASE(decode_killed_midstream), CASE(decode_killed_midstream_tp12),
              CASE(decode_abort_bootstrapping), CASE(decode_abort_waiting),
              CASE(decode_abort_announced), CASE(decode_abort_transferring),
              CASE(prefill_abort_bootstrapping), CASE(prefill_abort_waiting),
              CASE(prefill_abort_transferring), CASE(waiting_timeout),
              CASE(bootstrap_timeout_prefill), CASE(prefill_restarts))
