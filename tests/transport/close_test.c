/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer that leaves in order (its process exits, or destroys its engine)
 * while nothing is in flight is said at info level, not warned about: over
 * tcp "closed by the peer, nothing in flight", over shm "the peer left,
 * nothing in flight". A peer killed under a transfer is still a warning
 * and fails the transfer.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvt_test.h"
#include "peer.h"
#include "xfer_test.h"

static kvt_engine_h initiator(uint32_t transports)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e;

    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    p.local_host = "127.0.0.1";
    p.transports = transports;
    CHECK_OK(kvt_engine_create(&p, &e));
    return e;
}

/* Move 64 KiB to the peer, let it exit, and wait for this side to notice
 * (at most 5 s). */
static void leave_in_order(uint32_t transports, const char *said)
{
    char log[] = "/tmp/kvt-close-test-XXXXXX";
    peer_opts_t o = {transports, 0, 0, 0, 0};
    uint8_t *buf = malloc(1 << 16);
    kvt_xfer_desc_t d;
    kvt_segment_t seg;
    kvt_engine_h e;
    int old, lines = 0;
    peer_t p;

    setenv("KVT_LOG", "info", 1);
    old = kvt_test_log_to(log);
    CHECK(peer_start(&p, &o) == 0);
    e = initiator(transports);
    CHECK_OK(kvt_mem_register(e, buf, 1 << 16, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    d = kvt_test_xd(KVT_OP_WRITE, seg, buf, p.main_addr, 1 << 16);
    CHECK_OK(kvt_test_xfer(e, &d, 1));
    peer_stop(&p);
    for (int i = 0; i < 500 && lines == 0; i++) {
        usleep(10000);
        lines = kvt_test_count_in_file(log, said);
    }
    kvt_engine_destroy(e);
    kvt_test_log_back(old);
    printf("'%s': %d lines; warnings of a lost peer: %d\n", said, lines,
           kvt_test_count_in_file(log, "connection to peer lost"));
    CHECK(lines >= 1);
    CHECK(kvt_test_count_in_file(log, "connection to peer lost") == 0);
    CHECK(kvt_test_count_in_file(log, " WARN ") == 0);
    unlink(log);
    free(buf);
}

KVT_TEST(tcp_peer_leaves)
{
    leave_in_order(KVT_TRANSPORT_TCP, "closed by the peer, nothing in flight");
}

KVT_TEST(shm_peer_leaves)
{
    leave_in_order(KVT_TRANSPORT_SHM, "the peer left, nothing in flight");
}

/* Killed under a 64 MiB read: the transfer fails and it is a warning. */
KVT_TEST(tcp_peer_killed_under_a_transfer)
{
    char log[] = "/tmp/kvt-close-test-XXXXXX";
    peer_opts_t o = {KVT_TRANSPORT_TCP, 0, 0, 0, 0};
    enum { N = 64 };
    uint8_t *buf = malloc(PEER_MAIN_LEN);
    kvt_xfer_desc_t d[N];
    kvt_segment_t seg;
    kvt_batch_h b;
    kvt_engine_h e;
    int old;
    peer_t p;

    old = kvt_test_log_to(log);
    CHECK(peer_start(&p, &o) == 0);
    e = initiator(KVT_TRANSPORT_TCP);
    CHECK_OK(kvt_mem_register(e, buf, PEER_MAIN_LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    for (int i = 0; i < N; i++)
        d[i] = kvt_test_xd(KVT_OP_READ, seg, buf, p.main_addr, PEER_MAIN_LEN);
    CHECK_OK(kvt_batch_create(e, N, &b));
    CHECK_OK(kvt_batch_submit(b, d, N));
    peer_kill(&p, SIGKILL);
    CHECK(kvt_batch_wait(b, 10000) != KVT_OK);
    CHECK_OK(kvt_batch_free(b));
    peer_stop(&p);
    kvt_engine_destroy(e);
    kvt_test_log_back(old);
    CHECK(kvt_test_count_in_file(log, "failed: connection to peer lost") >= 1);
    unlink(log);
    free(buf);
}

KVT_TEST_MAIN(KVT_CASE(tcp_peer_leaves, 30), KVT_CASE(shm_peer_leaves, 30),
              KVT_CASE(tcp_peer_killed_under_a_transfer, 30))
