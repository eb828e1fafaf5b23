/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Same-host transport cases the conformance suite does not cover:
 * selection and the fallback to TCP, the unregister guarantee while an
 * initiator keeps writing (through a mapping and through cross-memory
 * attach), and a target that dies while its memory is mapped. Cases that
 * need shm skip when the target engine does not offer it.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "engine_test.h"
#include "kvt_test.h"
#include "transport/shm/shm.h"
#include "transport/shm/shm_sess.h"
#include "peer.h"

#define BLK (1u << 20)

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

/* The engine's shm transport (white box: its pairing counter). */
static kvt__shm_t *shm_of(kvt_engine_h e)
{
    kvt__tl_t *tl = kvt_test_tl(e, KVT_TRANSPORT_SHM);
    CHECK(tl != NULL);
    return (kvt__shm_t *)tl;
}

static int offers_shm(kvt_engine_h e, kvt_segment_t seg)
{
    return seg_offers(e, seg, KVT_TRANSPORT_SHM);
}

static kvt_status_t write1(kvt_engine_h e, kvt_segment_t seg, void *local,
                           uint64_t remote, uint64_t len)
{
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;
    kvt_status_t st;

    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = local;
    d.remote_addr = remote;
    d.length = len;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    st = kvt_batch_wait(b, 30000);
    CHECK(st != KVT_INPROGRESS);
    CHECK_OK(kvt_batch_free(b));
    return st;
}

/* Mappings of a peer's kvt_mem_alloc() memory in this process. */
static int alloc_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, "/memfd:kvt (deleted)") != NULL;
    fclose(f);
    return n;
}

/* A target that does not offer shm is reached over TCP, and the
 * initiator says so once; an initiator limited to TCP never tries. */
KVT_TEST(fallback_to_tcp)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP, 0, 1, 0, 0};
    char log[] = "/tmp/kvt-shm-test-XXXXXX";
    kvt_segment_t seg, again;
    kvt_engine_h e;
    peer_t p;
    uint8_t *buf;
    int fd;

    CHECK(peer_start(&p, &o) == 0);
    fd = mkstemp(log);
    CHECK(fd >= 0);
    CHECK(dup2(fd, 2) == 2); /* this process's log, to check below */
    e = engine_new(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    CHECK(strcmp(seg_transport(e, seg), "tcp") == 0);
    CHECK(!offers_shm(e, seg));
    buf = map(BLK);
    memset(buf, 0x42, BLK);
    CHECK_OK(kvt_mem_register(e, buf, BLK, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(write1(e, seg, buf, p.main_addr, BLK));
    CHECK_OK(kvt_segment_open(e, p.segment, &again)); /* cached */
    CHECK(again == seg);
    CHECK_OK(write1(e, seg, buf, p.main_addr, BLK));
    {
        char why[384];
        CHECK_OK(kvt_segment_transport_reason(e, seg, KVT_MEM_HOST,
                                              KVT_MEM_HOST, why, sizeof(why)));
        CHECK(strncmp(why, "tcp (the only transport that serves it)", 39) == 0);
        CHECK(strstr(why, "; shm: the peer does not offer it") != NULL);
        CHECK(kvt_segment_transport_reason(e, seg, KVT_MEM_HOST, KVT_MEM_HOST,
                                           NULL, 1) == KVT_ERR_INVALID_PARAM);
        CHECK(kvt_segment_transport_reason(e, seg + 1, KVT_MEM_HOST,
                                           KVT_MEM_HOST, why,
                                           sizeof(why)) == KVT_ERR_NOT_FOUND);
    }
    kvt_engine_destroy(e);
    CHECK(kvt_test_count_in_file(log, "host->host: tcp (") == 1);
    CHECK(kvt_test_count_in_file(log, "shm: the peer does not offer it") == 1);

    /* TCP only on this side: no attempt, nothing said. */
    CHECK(ftruncate(fd, 0) == 0);
    e = engine_new(KVT_TRANSPORT_TCP, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    CHECK(strcmp(seg_transport(e, seg), "tcp") == 0);
    {
        char why[384];
        CHECK_OK(kvt_segment_transport_reason(e, seg, KVT_MEM_HOST,
                                              KVT_MEM_HOST, why, sizeof(why)));
        CHECK(strstr(why, "shm: not in this engine's transports") != NULL);
    }
    kvt_engine_destroy(e);
    CHECK(kvt_test_count_in_file(log, "shm") == 0);
    unlink(log);
    close(fd);
    munmap(buf, BLK);
    peer_stop(&p);
}

/* Both sides allow shm: the session is shm; limited to TCP on either
 * side, it is TCP. */
KVT_TEST(selection)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 1, 0, 0};
    kvt_segment_t seg;
    kvt_engine_h e;
    peer_t p;

    CHECK(peer_start(&p, &o) == 0);
    e = engine_new(KVT_TRANSPORT_ALL, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    if (!offers_shm(e, seg))
        SKIP("the target engine does not offer shm");
    CHECK(strcmp(seg_transport(e, seg), "shm") == 0);
    {
        /* The target counts what this initiator moved over shm, though it
         * sees no copy (each side counts in the channel they share). */
        char *buf = map(BLK);
        unsigned long long w, r, wb, rb;
        memset(buf, 0x17, BLK);
        CHECK_OK(kvt_mem_register(e, buf, BLK, KVT_ACCESS_REMOTE_RW));
        CHECK_OK(write1(e, seg, buf, p.main_addr, BLK));
        CHECK_OK(write1(e, seg, buf, p.main_addr + BLK, 4096));
        CHECK(sscanf(peer_cmd(&p, "served shm"), "%llu %llu %llu %llu", &w, &r,
                     &wb, &rb) == 4);
        CHECK(w == 2 && wb == BLK + 4096 && r == 0 && rb == 0);
        CHECK_OK(kvt_mem_unregister(e, buf));
        munmap(buf, BLK);
    }
    {
        char why[384];
        CHECK_OK(kvt_segment_transport_reason(e, seg, KVT_MEM_HOST,
                                              KVT_MEM_HOST, why, sizeof(why)));
        CHECK(strncmp(why, "shm (the highest priority of the 2 that serve it)",
                      49) == 0);
        CHECK(strstr(why, "; tcp: serves it too, at a lower priority") != NULL);
        {
            kvt_transport_info_t t[8];
            size_t n = 0, ucx = 0;
            CHECK_OK(kvt_transports(t, 8, &n));
            for (size_t i = 0; i < n && i < 8; i++)
                ucx |= t[i].id == KVT_TRANSPORT_UCX;
            CHECK(!ucx || strstr(why, "; ucx: runs only when named in the "
                                      "engine's transports") != NULL);
        }
    }
    kvt_engine_destroy(e);
    e = engine_new(KVT_TRANSPORT_TCP, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    CHECK(strcmp(seg_transport(e, seg), "tcp") == 0);
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/*
 * Sessions are served in turn: with one pool worker, a large batch queued
 * to one peer does not hold back a small one to another peer until it is
 * done. Eight 64 MiB writes (64 jobs) go to the peer opened last (first
 * in the initiator's list), then one 4 KiB write to the other; nothing
 * waits on a batch (waiting runs a session's jobs in the waiting thread),
 * so only the worker moves bytes. The small write must land while most
 * of the large ones are still pending.
 */
/* Two target peers (B started and opened first) and an initiator engine
 * with @workers pool workers reaching both over shm; skips when they do
 * not offer it. */
static kvt_engine_h two_peers_n(peer_t *pa, peer_t *pb, const peer_opts_t *o,
                                kvt_segment_t *sa, kvt_segment_t *sb,
                                unsigned workers)
{
    kvt_engine_params_t ep = {0};
    kvt_engine_h e = NULL;

    CHECK(peer_start(pb, o) == 0);
    CHECK(peer_start(pa, o) == 0);
    ep.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_NUM_WORKERS;
    ep.transports = KVT_TRANSPORT_ALL;
    ep.num_workers = workers;
    CHECK_OK(kvt_engine_create(&ep, &e));
    CHECK_OK(kvt_segment_open(e, pb->segment, sb));
    CHECK_OK(kvt_segment_open(e, pa->segment, sa));
    if (!offers_shm(e, *sa) || strcmp(seg_transport(e, *sa), "shm"))
        SKIP("the target engine does not offer shm");
    return e;
}

/* Submit @d[0..@n) (writes to peer A) as one batch, then the first of
 * them sent to peer B instead (@sb at @b_addr, @b_len bytes) as another;
 * nothing waits on them. */
static void submit_a_then_b(kvt_engine_h e, kvt_xfer_desc_t *d, size_t n,
                            kvt_segment_t sb, uint64_t b_addr, uint64_t b_len,
                            kvt_batch_h *ba, kvt_batch_h *bb)
{
    CHECK_OK(kvt_batch_create(e, n, ba));
    CHECK_OK(kvt_batch_create(e, 1, bb));
    CHECK_OK(kvt_batch_submit(*ba, d, n));
    d[0].segment = sb;
    d[0].remote_addr = b_addr;
    d[0].length = b_len;
    CHECK_OK(kvt_batch_submit(*bb, d, 1));
}

/* As two_peers_n(), with one pool worker. */
static kvt_engine_h two_peers(peer_t *pa, peer_t *pb, const peer_opts_t *o,
                              kvt_segment_t *sa, kvt_segment_t *sb)
{
    return two_peers_n(pa, pb, o, sa, sb, 1);
}

KVT_TEST(sessions_served_in_turn)
{
    enum { BIG = 8 };
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_xfer_desc_t d[BIG];
    kvt_segment_t sa, sb;
    kvt_batch_h ba, bb;
    kvt_engine_h e = NULL;
    uint8_t *buf;
    peer_t pa, pb;
    size_t done = 0;
    double t0;

    e = two_peers(&pa, &pb, &o, &sa, &sb);
    buf = map(PEER_MAIN_LEN);
    memset(buf, 0x5a, PEER_MAIN_LEN);
    CHECK_OK(kvt_mem_register(e, buf, PEER_MAIN_LEN, KVT_ACCESS_REMOTE_RW));
    memset(d, 0, sizeof(d));
    for (int i = 0; i < BIG; i++) {
        d[i].opcode = KVT_OP_WRITE;
        d[i].segment = sa;
        d[i].local_addr = buf;
        d[i].remote_addr = pa.main_addr;
        d[i].length = PEER_MAIN_LEN;
    }
    submit_a_then_b(e, d, BIG, sb, pb.main_addr, 4096, &ba, &bb);
    t0 = kvt_test_now();
    while (kvt_batch_query(bb, NULL) == KVT_INPROGRESS &&
           kvt_test_now() - t0 < 30)
        ;
    for (size_t i = 0; i < BIG; i++)
        done += kvt_batch_entry(ba, i, NULL) != KVT_INPROGRESS;
    CHECK_OK(kvt_batch_query(bb, NULL));
    if (done > BIG / 2)
        fprintf(stderr, "the small write landed after %zu of %d large ones\n",
                done, BIG);
    CHECK(done <= BIG / 2);
    CHECK_OK(kvt_batch_wait(ba, 30000));
    CHECK_OK(kvt_batch_free(ba));
    CHECK_OK(kvt_batch_free(bb));
    kvt_engine_destroy(e);
    munmap(buf, PEER_MAIN_LEN);
    peer_stop(&pa);
    peer_stop(&pb);
}

/* Rows of two parts of @len bytes here, part 0 of each row for peer A
 * and part 1 for peer B, contiguous there; one pool worker. */
typedef struct {
    peer_t pa, pb;
    kvt_segment_t sa, sb;
    kvt_engine_h e;
    uint8_t *buf;
    size_t len;
    uint64_t rows, bytes; /* per peer */
} rows_t;

static void rows_setup(rows_t *f, int managed, size_t len, uint64_t size)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, managed, 0, 0};

    f->e = two_peers(&f->pa, &f->pb, &o, &f->sa, &f->sb);
    f->len = len;
    f->rows = size / len;
    f->bytes = f->rows * len;
    f->buf = map(2 * f->bytes);
    for (uint64_t r = 0; r < f->rows; r++)
        for (size_t i = 0; i < len; i++) {
            f->buf[2 * r * len + i] = pattern_byte(21, r * len + i);
            f->buf[(2 * r + 1) * len + i] = pattern_byte(22, r * len + i);
        }
    CHECK_OK(
        kvt_mem_register(f->e, f->buf, 2 * f->bytes, KVT_ACCESS_REMOTE_RW));
    /* The first write to each peer maps its memory, when it can be. */
    CHECK_OK(write1(f->e, f->sa, f->buf, f->pa.main_addr, 4096));
    CHECK_OK(write1(f->e, f->sb, f->buf, f->pb.main_addr, 4096));
}

/* Each peer's part of every row, one strided descriptor each. */
static void rows_descs(const rows_t *f, kvt_xfer_desc_t d[2])
{
    memset(d, 0, 2 * sizeof(*d));
    for (int k = 0; k < 2; k++) {
        d[k].opcode = KVT_OP_WRITE;
        d[k].segment = k ? f->sb : f->sa;
        d[k].local_addr = f->buf + (size_t)k * f->len;
        d[k].local_stride = 2 * f->len;
        d[k].remote_addr = k ? f->pb.main_addr : f->pa.main_addr;
        d[k].remote_stride = f->len;
        d[k].length = f->len;
        d[k].count = (uint32_t)f->rows;
    }
}

/* Both under the plug, so that they are queued together. */
static void rows_submit(rows_t *f, const kvt_xfer_desc_t d[2], kvt_batch_h b[2])
{
    CHECK_OK(kvt_batch_create(f->e, 1, &b[0]));
    CHECK_OK(kvt_batch_create(f->e, 1, &b[1]));
    kvt_submit_plug();
    CHECK_OK(kvt_batch_submit(b[0], &d[0], 1));
    CHECK_OK(kvt_batch_submit(b[1], &d[1], 1));
    kvt_submit_unplug();
}

/* Poll (a waiting thread would run jobs of its batch alone) until @b has
 * nothing pending or @secs pass; its status. */
static kvt_status_t rows_poll(kvt_batch_h b, double secs)
{
    double t0 = kvt_test_now();

    while (kvt_batch_query(b, NULL) == KVT_INPROGRESS &&
           kvt_test_now() - t0 < secs)
        usleep(100);
    return kvt_batch_query(b, NULL);
}

/* Bytes of the peer's main region that are not its part (pattern @seed). */
static void rows_check(peer_t *p, uint64_t bytes, int seed)
{
    CHECK(strcmp(peer_cmd(p, "check %llu %llu %d",
                          (unsigned long long)p->main_addr,
                          (unsigned long long)bytes, seed),
                 "0") == 0);
}

static void rows_teardown(rows_t *f)
{
    kvt_engine_destroy(f->e);
    munmap(f->buf, 2 * f->bytes);
    peer_stop(&f->pa);
    peer_stop(&f->pb);
}

/*
 * One source, two peers, each getting one part of every row (the heads
 * of one prefill rank split between two decode ranks). Every byte must
 * land, whether the two jobs' rows are copied in one pass (both peers
 * mapped: the pool's pair path, counted) or not (plain memory: staged,
 * never paired); a second pair of batches whose pieces are not parts of
 * the same rows is never paired.
 */
static void rows_for_two_peers(int managed, size_t len)
{
    kvt_xfer_desc_t d[2];
    kvt_batch_h b[2];
    uint64_t paired;
    rows_t f;

    rows_setup(&f, managed, len, 16u << 20);
    for (int siblings = 1; siblings >= 0; siblings--) {
        rows_descs(&f, d);
        if (!siblings) {
            /* Peer B: the same bytes as whole rows of part 1 and part 0
             * of the next row, never the other part of A's rows. */
            d[1].local_addr = f.buf + len + len / 2;
            d[1].length = len / 2;
            d[1].local_stride = len;
            d[1].remote_stride = len / 2;
            d[1].count = (uint32_t)(2 * f.rows - 2);
        }
        paired = atomic_load(&shm_of(f.e)->paired);
        rows_submit(&f, d, b);
        CHECK_OK(rows_poll(b[0], 30));
        CHECK_OK(rows_poll(b[1], 30));
        CHECK_OK(kvt_batch_free(b[0]));
        CHECK_OK(kvt_batch_free(b[1]));
        rows_check(&f.pa, f.bytes, 21);
        if (siblings) {
            rows_check(&f.pb, f.bytes, 22);
            /* Mapped on both sides: copied in one pass. */
            CHECK(managed ? atomic_load(&shm_of(f.e)->paired) > paired
                          : atomic_load(&shm_of(f.e)->paired) == paired);
        } else {
            CHECK(atomic_load(&shm_of(f.e)->paired) == paired);
        }
    }
    rows_teardown(&f);
}

KVT_TEST(rows_for_two_peers_mapped)
{
    rows_for_two_peers(1, 512);
    rows_for_two_peers(1, 1000);
}

KVT_TEST(rows_for_two_peers_staged)
{
    rows_for_two_peers(0, 512);
}

/*
 * B's registry changes before each pair of batches (its unrelated guard
 * range registered, then unregistered), so that B's snapshot is newer
 * than this side's mappings were checked against. When B's job is the
 * partner, it cannot be taken without waiting (the mappings are to be
 * reconciled first) and runs alone after A's; when it is the one taken,
 * it reconciles and A's is paired with it. The worker takes the two
 * sessions' jobs in turn, so four rounds see both. Every batch completes
 * and every byte lands.
 */
KVT_TEST(rows_for_two_peers_registry_changes)
{
    kvt_xfer_desc_t d[2];
    kvt_batch_h b[2];
    rows_t f;

    rows_setup(&f, 1, 512, 1u << 20);
    rows_descs(&f, d);
    for (int round = 0; round < 4; round++) {
        for (int k = 0; k < 2; k++)
            CHECK(strcmp(peer_cmd(k ? &f.pb : &f.pa, "fill %llu %llu 7",
                                  (unsigned long long)(k ? f.pb.main_addr
                                                         : f.pa.main_addr),
                                  (unsigned long long)f.bytes),
                         "ok") == 0);
        if (round % 2 == 0)
            CHECK(strcmp(peer_cmd(&f.pb, "reg %llu %llu",
                                  (unsigned long long)f.pb.guard_addr,
                                  (unsigned long long)PEER_SMALL_LEN),
                         "0") == 0);
        else
            CHECK(strcmp(peer_cmd(&f.pb, "unreg %llu",
                                  (unsigned long long)f.pb.guard_addr),
                         "0") == 0);
        rows_submit(&f, d, b);
        CHECK_OK(rows_poll(b[0], 30));
        CHECK_OK(rows_poll(b[1], 30));
        rows_check(&f.pa, f.bytes, 21);
        rows_check(&f.pb, f.bytes, 22);
        CHECK_OK(kvt_batch_free(b[0]));
        CHECK_OK(kvt_batch_free(b[1]));
    }
    rows_teardown(&f);
}

/*
 * A paired job whose target is stopped (SIGSTOP) does not hold back its
 * partner's: A's rows land and its batch completes while B is stopped
 * (B's write is copied in the same pass, but is only done once B runs
 * again); after SIGCONT, B's completes with every byte. Fails when the
 * pair's ends are taken in a fixed order with the stopped one first.
 */
KVT_TEST(rows_for_two_peers_partner_stopped)
{
    kvt_xfer_desc_t d[2];
    kvt_batch_h b[2];
    uint64_t paired;
    rows_t f;

    /* 1 MiB a peer: one job each, so that the two are paired. */
    rows_setup(&f, 1, 512, 1u << 20);
    rows_descs(&f, d);
    /* Twice: the worker takes the two sessions' jobs in turn, so B's is
     * the one taken once and the partner once. */
    for (int round = 0; round < 2; round++) {
        CHECK(strcmp(peer_cmd(&f.pa, "fill %llu %llu 7",
                              (unsigned long long)f.pa.main_addr,
                              (unsigned long long)f.bytes),
                     "ok") == 0);
        CHECK(strcmp(peer_cmd(&f.pb, "fill %llu %llu 7",
                              (unsigned long long)f.pb.main_addr,
                              (unsigned long long)f.bytes),
                     "ok") == 0);
        paired = atomic_load(&shm_of(f.e)->paired);
        peer_kill(&f.pb, SIGSTOP);
        rows_submit(&f, d, b);
        CHECK_OK(rows_poll(b[0], 5));
        CHECK(kvt_batch_query(b[1], NULL) == KVT_INPROGRESS);
        CHECK(atomic_load(&shm_of(f.e)->paired) > paired);
        rows_check(&f.pa, f.bytes, 21);
        peer_kill(&f.pb, SIGCONT);
        CHECK_OK(rows_poll(b[1], 30));
        rows_check(&f.pb, f.bytes, 22);
        CHECK_OK(kvt_batch_free(b[0]));
        CHECK_OK(kvt_batch_free(b[1]));
    }
    rows_teardown(&f);
}

/*
 * A job copied while its target is stopped (SIGSTOP) is parked rather
 * than held by the worker that ran it: with one pool worker, four 8 MiB
 * writes (four jobs) to stopped A, then one to B; nothing waits on a
 * batch, so only the worker runs jobs. B's lands while A's counts
 * nothing; after SIGCONT, A's completes with every byte. Fails when the
 * worker waits for A to run again: B's then waits as long. Then A is
 * stopped with jobs parked again and killed: they fail with the session
 * (KVT_ERR_CONN_LOST), and B's session goes on.
 */
KVT_TEST(stopped_target_parks)
{
    enum { N = 4, PART = 8 << 20 };
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_xfer_desc_t d[N];
    kvt_segment_t sa, sb;
    kvt_batch_h ba, bb;
    kvt_batch_state_t bs;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;

    e = two_peers(&pa, &pb, &o, &sa, &sb);
    buf = map((size_t)N * PART);
    pattern_fill(buf, (uint64_t)N * PART, 31, 0);
    CHECK_OK(kvt_mem_register(e, buf, (size_t)N * PART, KVT_ACCESS_REMOTE_RW));
    /* Both sessions up before the stop. */
    CHECK_OK(write1(e, sa, buf, pa.main_addr, 4096));
    CHECK_OK(write1(e, sb, buf, pb.main_addr, 4096));
    peer_kill(&pa, SIGSTOP);
    memset(d, 0, sizeof(d));
    for (int i = 0; i < N; i++) {
        d[i].opcode = KVT_OP_WRITE;
        d[i].segment = sa;
        d[i].local_addr = buf + (size_t)i * PART;
        d[i].remote_addr = pa.main_addr + (uint64_t)i * PART;
        d[i].length = PART;
    }
    submit_a_then_b(e, d, N, sb, pb.main_addr, PART, &ba, &bb);
    CHECK_OK(rows_poll(bb, 5));
    CHECK(strcmp(peer_cmd(&pb, "check %llu %llu 31",
                          (unsigned long long)pb.main_addr,
                          (unsigned long long)PART),
                 "0") == 0);
    CHECK_ST(kvt_batch_query(ba, &bs), KVT_INPROGRESS);
    CHECK(bs.completed == 0); /* nothing counts while A is stopped */
    peer_kill(&pa, SIGCONT);
    CHECK_OK(rows_poll(ba, 30));
    CHECK(strcmp(peer_cmd(&pa, "check %llu %llu 31",
                          (unsigned long long)pa.main_addr,
                          (unsigned long long)N * PART),
                 "0") == 0);
    CHECK_OK(kvt_batch_free(ba));
    CHECK_OK(kvt_batch_free(bb));

    peer_kill(&pa, SIGSTOP);
    d[0].segment = sa;
    d[0].remote_addr = pa.main_addr;
    CHECK_OK(kvt_batch_create(e, N, &ba));
    CHECK_OK(kvt_batch_submit(ba, d, N));
    usleep(200 * 1000);
    CHECK_ST(kvt_batch_query(ba, NULL), KVT_INPROGRESS);
    peer_kill(&pa, SIGKILL);
    CHECK_ST(rows_poll(ba, 5), KVT_ERR_CONN_LOST);
    CHECK_OK(kvt_batch_free(ba));
    CHECK_OK(write1(e, sb, buf, pb.main_addr, PART));
    kvt_engine_destroy(e);
    munmap(buf, (size_t)N * PART);
    peer_stop(&pa);
    peer_stop(&pb);
}

/*
 * A staged write that timed out on a stopped target never lands later:
 * its slots, full and untaken, are taken back when it fails, so the
 * target, running again, does not copy them out over what a new session
 * wrote meanwhile (a write that failed would overwrite newer data). The
 * target's bytes stay those written before; a new session's write then
 * lands. Fails when the failed job leaves its slots full.
 */
KVT_TEST(staged_write_timed_out_never_lands)
{
    enum { PIECES = 128, LEN = 128 << 10 };
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_engine_params_t ep = {0};
    kvt_xfer_desc_t d = {0};
    kvt_segment_t sa;
    kvt_batch_h b;
    kvt_engine_h e;
    peer_t pa;
    uint8_t *buf;

    CHECK(peer_start(&pa, &o) == 0);
    ep.field_mask = KVT_ENGINE_PARAM_TRANSPORTS |
                    KVT_ENGINE_PARAM_TRANSFER_TIMEOUT |
                    KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
    ep.transports = KVT_TRANSPORT_ALL;
    ep.transfer_timeout_ms = 400;
    ep.connect_timeout_ms = 400;
    CHECK_OK(kvt_engine_create(&ep, &e));
    CHECK_OK(kvt_segment_open(e, pa.segment, &sa));
    if (!offers_shm(e, sa) || strcmp(seg_transport(e, sa), "shm"))
        SKIP("the target engine does not offer shm");
    buf = map(2 * LEN);
    pattern_fill(buf, LEN, 51, 0);
    pattern_fill(buf + LEN, LEN, 52, 0);
    CHECK_OK(kvt_mem_register(e, buf, 2 * LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(write1(e, sa, buf, pa.main_addr, LEN));
    peer_kill(&pa, SIGSTOP);
    /* 512-byte pieces into plain memory: staged. */
    d.opcode = KVT_OP_WRITE;
    d.segment = sa;
    d.local_addr = buf + LEN;
    d.remote_addr = pa.main_addr;
    d.length = 512;
    d.count = PIECES;
    d.local_stride = 1024;
    d.remote_stride = 1024;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    CHECK_ST(rows_poll(b, 10), KVT_ERR_TIMEDOUT);
    CHECK_OK(kvt_batch_free(b));
    peer_kill(&pa, SIGCONT);
    usleep(300 * 1000); /* time for the target to copy out what it has */
    CHECK(strcmp(peer_cmd(&pa, "check %llu %llu 51",
                          (unsigned long long)pa.main_addr,
                          (unsigned long long)LEN),
                 "0") == 0);
    /* The failed session was evicted; a new one writes. */
    CHECK_OK(kvt_segment_open(e, pa.segment, &sa));
    CHECK_OK(write1(e, sa, buf + LEN, pa.main_addr, LEN));
    CHECK(strcmp(peer_cmd(&pa, "check %llu %llu 52",
                          (unsigned long long)pa.main_addr,
                          (unsigned long long)LEN),
                 "0") == 0);
    kvt_engine_destroy(e);
    munmap(buf, 2 * LEN);
    peer_stop(&pa);
}

/*
 * Both sessions up (a write each), then A stopped and a staged write
 * submitted to it: @pieces pieces of 512 bytes from @buf, 1 KiB apart
 * there (@d, for the caller to reuse). Returns its batch once the worker
 * that took it has waited past a slice for A to empty its slot.
 */
static kvt_batch_h staged_to_stopped(kvt_engine_h e, peer_t *pa, peer_t *pb,
                                     kvt_segment_t sa, kvt_segment_t sb,
                                     uint8_t *buf, uint32_t pieces,
                                     kvt_xfer_desc_t *d)
{
    kvt_batch_h b;

    CHECK_OK(write1(e, sa, buf, pa->main_addr, 4096));
    CHECK_OK(write1(e, sb, buf, pb->main_addr, 4096));
    peer_kill(pa, SIGSTOP);
    memset(d, 0, sizeof(*d));
    d->opcode = KVT_OP_WRITE;
    d->segment = sa;
    d->local_addr = buf;
    d->remote_addr = pa->main_addr;
    d->length = 512;
    d->count = pieces;
    d->remote_stride = 1024;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, d, 1));
    usleep(300 * 1000);
    return b;
}

/*
 * A staged write waiting for a stopped target holds its session: the
 * other executors take no more of its jobs (each would only wait as well,
 * holding its thread). Two pool workers, plain memory (staged): a job
 * of 512-byte pieces to stopped A, whose worker waits for the target to
 * empty its slot; then another to A and a write to B. B's lands while A
 * is stopped (every byte checked); after SIGCONT, A's complete. Fails
 * when the second worker takes A's next job and waits too: B's then
 * waits for A.
 */
KVT_TEST(stopped_target_holds_session)
{
    enum { PIECES = 1024 }; /* 512 KiB of 512-byte pieces: one job */
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_xfer_desc_t d = {0};
    kvt_segment_t sa, sb;
    kvt_batch_h a1, a2, b;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;

    e = two_peers_n(&pa, &pb, &o, &sa, &sb, 2);
    buf = map(4 * PIECES * 512);
    pattern_fill(buf, 4ull * PIECES * 512, 41, 0);
    CHECK_OK(kvt_mem_register(e, buf, 4 * PIECES * 512, KVT_ACCESS_REMOTE_RW));
    a1 = staged_to_stopped(e, &pa, &pb, sa, sb, buf, PIECES, &d);
    d.local_addr = buf + PIECES * 512;
    d.remote_addr = pa.main_addr + 2ull * PIECES * 512;
    CHECK_OK(kvt_batch_create(e, 1, &a2));
    CHECK_OK(kvt_batch_submit(a2, &d, 1));
    usleep(100 * 1000);
    memset(&d, 0, sizeof(d));
    d.opcode = KVT_OP_WRITE;
    d.segment = sb;
    d.local_addr = buf;
    d.remote_addr = pb.main_addr;
    d.length = 1 << 20;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    CHECK_OK(rows_poll(b, 5));
    CHECK(strcmp(peer_cmd(&pb, "check %llu %llu 41",
                          (unsigned long long)pb.main_addr,
                          (unsigned long long)(1 << 20)),
                 "0") == 0);
    CHECK(kvt_batch_query(a1, NULL) == KVT_INPROGRESS);
    CHECK(kvt_batch_query(a2, NULL) == KVT_INPROGRESS);
    peer_kill(&pa, SIGCONT);
    CHECK_OK(rows_poll(a1, 30));
    CHECK_OK(rows_poll(a2, 30));
    CHECK_OK(kvt_batch_free(a1));
    CHECK_OK(kvt_batch_free(a2));
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(e);
    munmap(buf, 4 * PIECES * 512);
    peer_stop(&pa);
    peer_stop(&pb);
}

/*
 * A thread waiting on its batch runs its jobs whatever the pool's workers
 * do, and so is not held up by a worker waiting for a stopped target. One
 * CPU (this test's process's affinity, set before the engine: each case
 * runs in a process of its own), one pool worker: it takes a staged write
 * to stopped A and waits for A to empty its slot; a synchronous 1 MiB
 * write to B is then run by its waiting thread and lands at once (every
 * byte checked). Fails when the waiting thread leaves B's job to the
 * workers while they are busy (a policy tried, docs/benchmarks.md) and
 * counts a worker waiting for its target as busy: B's write then waits for
 * the worker, which waits for A (30 s, the transfer timeout).
 */
KVT_TEST(waiter_runs_beside_worker_waiting_for_target)
{
    enum { PIECES = 1024 }; /* 512 KiB of 512-byte pieces: one job */
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_xfer_desc_t d = {0};
    kvt_segment_t sa, sb;
    cpu_set_t all, one;
    kvt_batch_h a;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    double t0;
    int cpu = 0;

    CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
    while (!CPU_ISSET(cpu, &all))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
    e = two_peers_n(&pa, &pb, &o, &sa, &sb, 1);
    buf = map(2 * PIECES * 512);
    pattern_fill(buf, 2ull * PIECES * 512, 43, 0);
    CHECK_OK(kvt_mem_register(e, buf, 2 * PIECES * 512, KVT_ACCESS_REMOTE_RW));
    a = staged_to_stopped(e, &pa, &pb, sa, sb, buf, PIECES, &d);
    t0 = kvt_test_now();
    CHECK_OK(write1(e, sb, buf, pb.main_addr, 1 << 20));
    fprintf(stderr, "B's write beside the waiting worker: %.3f s\n",
            kvt_test_now() - t0);
    CHECK(kvt_test_now() - t0 < 5.0);
    CHECK(strcmp(peer_cmd(&pb, "check %llu %llu 43",
                          (unsigned long long)pb.main_addr,
                          (unsigned long long)(1 << 20)),
                 "0") == 0);
    CHECK(kvt_batch_query(a, NULL) == KVT_INPROGRESS);
    peer_kill(&pa, SIGCONT);
    CHECK_OK(rows_poll(a, 30));
    CHECK_OK(kvt_batch_free(a));
    kvt_engine_destroy(e);
    munmap(buf, 2 * PIECES * 512);
    peer_stop(&pa);
    peer_stop(&pb);
}

/* How many workers may take a job (kvt__shm_room()). */
KVT_TEST(admission_room)
{
    const uint64_t never = UINT64_MAX, recent = DRIVE_GRACE_NS / 2;

    /* No thread waiting on a batch: a worker per CPU. */
    CHECK(kvt__shm_room(0, 0, never, 2) == 2);
    CHECK(kvt__shm_room(1, 0, never, 2) == 1);
    CHECK(kvt__shm_room(2, 0, never, 2) == 0);
    CHECK(kvt__shm_room(3, 1, 0, 8) == 4);
    /* One running its jobs keeps a CPU, and for a moment after it left. */
    CHECK(kvt__shm_room(0, 1, 0, 2) == 1);
    CHECK(kvt__shm_room(1, 1, 0, 2) == 0);
    CHECK(kvt__shm_room(1, 0, recent, 2) == 0);
    CHECK(kvt__shm_room(1, 0, DRIVE_GRACE_NS, 2) == 1);
    /* Always one worker, for the jobs no waiting thread runs. */
    CHECK(kvt__shm_room(0, 1, 0, 1) == 1);
    CHECK(kvt__shm_room(0, 4, 0, 2) == 1);
    CHECK(kvt__shm_room(1, 4, 0, 2) == 0);
    CHECK(kvt__shm_room(0, 0, never, 1) == 1);
}

/* A stopped target runs again for kvt__shm_stopped_poll() only when two
 * polls in a row read it running (kvt__shm_still_stopped()): a killed one
 * reads as running for a moment. */
KVT_TEST(stopped_target_runs_after_two_polls)
{
    int ran = 0;

    CHECK(kvt__shm_still_stopped(&ran, 1, KVT_OK) == 1);
    /* Read running once: still stopped; twice: runs. */
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_OK) == 1);
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_OK) == 0);
    /* The next stop starts over. */
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_OK) == 1);
    CHECK(kvt__shm_still_stopped(&ran, 1, KVT_OK) == 1);
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_OK) == 1);
    /* Gone after one running read: not held back (the caller fails its
     * jobs on @st), and the note is cleared. */
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_ERR_CONN_LOST) == 0);
    CHECK(ran == 0);
    CHECK(kvt__shm_still_stopped(&ran, 0, KVT_OK) == 1);
}

/* A piece written into a peer (kvt__shm_copy_piece()): every byte at any
 * alignment, streamed from 4 KiB up (reported, so the writer fences). */
KVT_TEST(copy_piece_streams_from_4k)
{
    static const size_t lens[] = {1, 255, 256, 4095, 4096, 4097, 65539};
    uint8_t *src = map(1u << 20), *dst = map(1u << 20);

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (size_t off = 0; off < 64; off += 13) {
            size_t n = lens[i];
            int streamed;
            for (size_t k = 0; k < n + 2; k++)
                src[off + k] = (uint8_t)(k * 7 + i + off);
            memset(dst, 0xAB, n + 200);
            streamed = kvt__shm_copy_piece(dst + 100 + off, src + off, n);
            kvt__shm_copy_fence();
            CHECK(streamed == (n >= 4096));
            CHECK(memcmp(dst + 100 + off, src + off, n) == 0);
            CHECK(dst[99 + off] == 0xAB && dst[100 + off + n] == 0xAB);
        }
    }
    munmap(src, 1u << 20);
    munmap(dst, 1u << 20);
}

/* The sizes a submission is cut into (kvt__shm_job_size()): a share of
 * what is left, so that the jobs shrink from JOB_MAX to JOB_MIN. */
KVT_TEST(job_sizes_shrink)
{
    uint64_t left = 32ull << 20, prev = JOB_MAX;
    unsigned n = 0, small = 0;

    CHECK(kvt__shm_job_size(32ull << 20, 0) == JOB_MAX);
    CHECK(kvt__shm_job_size(64ull << 20, 4) == JOB_MAX);
    CHECK(kvt__shm_job_size(2ull << 20, 4) == 512u << 10);
    CHECK(kvt__shm_job_size(1ull << 20, 4) == JOB_MIN);
    CHECK(kvt__shm_job_size(0, 4) == JOB_MIN);
    /* 32 MiB for two executors (a share of 1/4): 8 MiB first, then
     * smaller ones, the last four JOB_MIN each (the last one less). */
    while (left > 0) {
        uint64_t t = kvt__shm_job_size(left, 4);
        CHECK(t <= prev && t >= JOB_MIN);
        if (n == 0)
            CHECK(t == JOB_MAX);
        if (t > left)
            t = left;
        small += t <= JOB_MIN;
        prev = t;
        left -= t;
        n++;
    }
    fprintf(stderr, "32 MiB: %u jobs, %u of JOB_MIN or less\n", n, small);
    CHECK(n <= 20);
    CHECK(small >= 4);
}

/* Pin this case's process (each case runs in one of its own) to the first
 * two CPUs it may use, before the engine counts them; 0 when it may use
 * fewer. */
static int two_cpus(void)
{
    cpu_set_t all, two;
    int n = 0;

    CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
    CPU_ZERO(&two);
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++) {
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &two);
            n++;
        }
    }
    if (n < 2)
        return 0;
    CHECK(sched_setaffinity(0, sizeof(two), &two) == 0);
    return 1;
}

/* @n batches of one 16 MiB write each from @buf to @addr in @seg, the k-th
 * at offset k * 16 MiB on both sides, submitted. */
#define DEEP_LEN (16u << 20)
static void deep_submit(kvt_engine_h e, kvt_segment_t seg, uint8_t *buf,
                        uint64_t addr, kvt_batch_h *b, int n)
{
    for (int k = 0; k < n; k++) {
        kvt_xfer_desc_t d = {0};
        d.opcode = KVT_OP_WRITE;
        d.segment = seg;
        d.local_addr = buf + (size_t)k * DEEP_LEN;
        d.remote_addr = addr + (uint64_t)k * DEEP_LEN;
        d.length = DEEP_LEN;
        if (b[k] == NULL)
            CHECK_OK(kvt_batch_create(e, 1, &b[k]));
        else
            CHECK_OK(kvt_batch_reset(b[k]));
        CHECK_OK(kvt_batch_submit(b[k], &d, 1));
    }
}

/* Two peers and an engine with two pool workers, for the deep_submit()
 * cases: 2 * DEEP_LEN bytes of pattern @seed at *@buf_p, registered. */
static kvt_engine_h deep_setup(peer_t *pa, peer_t *pb, kvt_segment_t *sa,
                               int seed, uint8_t **buf_p)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_segment_t sb;
    kvt_engine_h e = two_peers_n(pa, pb, &o, sa, &sb, 2);

    *buf_p = map(2 * DEEP_LEN);
    pattern_fill(*buf_p, 2ull * DEEP_LEN, (uint64_t)seed, 0);
    CHECK_OK(kvt_mem_register(e, *buf_p, 2 * DEEP_LEN, KVT_ACCESS_REMOTE_RW));
    return e;
}

/* Every byte of deep_setup()'s @seed landed at A; then all torn down. */
/* Free what the deep tests set up. */
static void deep_free(kvt_engine_h e, peer_t *pa, peer_t *pb, kvt_batch_h *b,
                      uint8_t *buf)
{
    CHECK_OK(kvt_batch_free(b[0]));
    CHECK_OK(kvt_batch_free(b[1]));
    kvt_engine_destroy(e);
    munmap(buf, 2 * DEEP_LEN);
    peer_stop(pa);
    peer_stop(pb);
}

/* Check that @pa holds the pattern of @seed, then free. */
static void deep_end(kvt_engine_h e, peer_t *pa, peer_t *pb, kvt_batch_h *b,
                     uint8_t *buf, int seed)
{
    CHECK(strcmp(peer_cmd(pa, "check %llu %llu %d",
                          (unsigned long long)pa->main_addr,
                          (unsigned long long)(2 * DEEP_LEN), seed),
                 "0") == 0);
    deep_free(e, pa, pb, b, buf);
}

/*
 * Copiers beyond the CPUs take turns rather than copy faster
 * (docs/benchmarks.md, "Copiers on every CPU"): the workers leave a CPU to
 * a thread running its own batch's jobs. Two CPUs, two workers, plain
 * memory (cross-memory attach); one thread keeps two batches of 16 MiB in
 * flight (three jobs each) and waits on the older, running jobs as it
 * waits. The workers take jobs (the waiting thread does not run them all),
 * but hardly one while the waiting thread and the other worker run
 * theirs; every byte lands. Fails when workers take jobs whatever the
 * waiting thread does: nearly half of theirs then start beside two
 * other copiers.
 */
KVT_TEST(workers_leave_the_waiter_a_cpu)
{
    kvt_batch_h b[2] = {NULL, NULL};
    kvt_segment_t sa;
    uint64_t jobs, over;
    kvt__shm_t *shm;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    double t0;
    int rounds = 0;

    if (!two_cpus())
        SKIP("fewer than two CPUs");
    e = deep_setup(&pa, &pb, &sa, 62, &buf);
    shm = shm_of(e);
    CHECK(shm->ncpu == 2);
    deep_submit(e, sa, buf, pa.main_addr, b, 2);
    t0 = kvt_test_now();
    for (int i = 0; kvt_test_now() - t0 < 1.5 || rounds < 64; i ^= 1) {
        CHECK_OK(kvt_batch_wait(b[i], 30000));
        if (rounds++ == 4) { /* the first submission woke both workers */
            atomic_store(&shm->worker_jobs, 0);
            atomic_store(&shm->over_jobs, 0);
        }
        deep_submit(e, sa, buf + (size_t)i * DEEP_LEN,
                    pa.main_addr + (uint64_t)i * DEEP_LEN, &b[i], 1);
    }
    CHECK_OK(kvt_batch_wait(b[0], 30000));
    CHECK_OK(kvt_batch_wait(b[1], 30000));
    jobs = atomic_load(&shm->worker_jobs);
    over = atomic_load(&shm->over_jobs);
    fprintf(stderr,
            "%d rounds: workers took %llu jobs, %llu beside two "
            "copiers\n",
            rounds, (unsigned long long)jobs, (unsigned long long)over);
    CHECK(jobs >= 16);
    CHECK(over * 10 <= jobs);
    deep_end(e, &pa, &pb, b, buf, 62);
}

static double cpu_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Synchronous batches of 2 * DEEP_LEN from @buf to @addr in @seg, for
 * about a second (at least 64): how many, and in *@jobs_p and *@wakes_p
 * the jobs the workers took and the submissions that woke one, in
 * *@cpus_p the CPUs this process had on average. */
static int polled_batches(kvt_engine_h e, kvt_segment_t seg, uint8_t *buf,
                          uint64_t addr, kvt_batch_h b, uint64_t *jobs_p,
                          uint64_t *wakes_p, double *cpus_p)
{
    kvt__shm_t *shm = shm_of(e);
    double t0 = 0, c0 = 0;
    int rounds = 0;

    for (int warm = 4; warm > 0 || kvt_test_now() - t0 < 1.0 || rounds < 64;) {
        kvt_xfer_desc_t d = {0};
        d.opcode = KVT_OP_WRITE;
        d.segment = seg;
        d.local_addr = buf;
        d.remote_addr = addr;
        d.length = 2 * DEEP_LEN;
        CHECK_OK(kvt_batch_reset(b));
        CHECK_OK(kvt_batch_submit_wait(b, &d, 1, 30000));
        if (warm > 0 && --warm == 0) { /* the workers have started */
            atomic_store(&shm->worker_jobs, 0);
            atomic_store(&shm->submit_wakes, 0);
            t0 = kvt_test_now();
            c0 = cpu_seconds();
        } else if (warm == 0) {
            rounds++;
        }
    }
    *jobs_p = atomic_load(&shm->worker_jobs);
    *wakes_p = atomic_load(&shm->submit_wakes);
    *cpus_p = (cpu_seconds() - c0) / (kvt_test_now() - t0);
    return rounds;
}

/*
 * A thread that submits one batch at a time and waits for it, as a
 * synchronous transfer does: a worker that ended a job of one batch takes
 * a job of the next without being woken (pool.c, pool_spin()), so that
 * the next batch has two copiers from its start and its submission costs
 * no system call. Two CPUs, two workers, 32 MiB batches into plain
 * memory; every byte lands. Fails when a worker sleeps as soon as it
 * finds the queues empty: every submission then signals one.
 */
KVT_TEST(worker_polls_for_the_next_batch)
{
    kvt_batch_h b[2] = {NULL, NULL};
    kvt_segment_t sa;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    int held = 0;

    if (!two_cpus())
        SKIP("fewer than two CPUs");
    e = deep_setup(&pa, &pb, &sa, 64, &buf);
    CHECK_OK(kvt_batch_create(e, 1, &b[0]));
    CHECK_OK(kvt_batch_create(e, 1, &b[1]));
    /* Up to five tries: what runs beside this case on the same CPUs (the
     * other tests) keeps the submitting thread from its next batch for
     * longer than a worker polls; a try in which this process had less
     * than 1.8 of its two CPUs does not count. Without polling every
     * submission wakes a worker. */
    for (int t = 0; t < 5 && held == 0; t++) {
        uint64_t jobs, wakes;
        double cpus;
        int rounds = polled_batches(e, sa, buf, pa.main_addr, b[0], &jobs,
                                    &wakes, &cpus);
        fprintf(stderr,
                "%d batches on %.2f CPUs: workers took %llu jobs, %llu of "
                "them woke one\n",
                rounds, cpus, (unsigned long long)jobs,
                (unsigned long long)wakes);
        CHECK(jobs >= (uint64_t)rounds);
        if (cpus >= 1.8)
            held = wakes * 4 <= (uint64_t)rounds ? 1 : -1;
    }
    if (held == 0)
        fprintf(stderr, "never had two CPUs: not checked\n");
    /* Instrumented code takes longer between two batches than a worker
     * polls. */
    if (kvt_test_slowdown() == 1.0)
        CHECK(held >= 0);
    deep_end(e, &pa, &pb, b, buf, 64);
}

/* A 64 KiB write (a job of its own) of @buf's @k-th piece to the same
 * place at @addr in @seg. */
static kvt_xfer_desc_t piece_desc(kvt_segment_t seg, uint8_t *buf,
                                  uint64_t addr, int k)
{
    kvt_xfer_desc_t d = {0};

    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = buf + (size_t)k * (64u << 10);
    d.remote_addr = addr + (uint64_t)k * (64u << 10);
    d.length = 64u << 10;
    return d;
}

/*
 * A thread that submits one job and waits for it at once runs it itself
 * (kvt__sub_t.will_wait): no worker is signalled for it. 512 synchronous
 * 64 KiB writes, every byte checked. Fails when each submission signals a
 * sleeping worker, which then finds the job taken.
 */
KVT_TEST(waiting_submitter_wakes_no_worker)
{
    kvt_batch_h b[2] = {NULL, NULL};
    kvt__shm_t *shm;
    kvt_segment_t sa;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    int n = (int)(2 * DEEP_LEN / (64u << 10));

    e = deep_setup(&pa, &pb, &sa, 65, &buf);
    shm = shm_of(e);
    CHECK_OK(kvt_batch_create(e, 1, &b[0]));
    CHECK_OK(kvt_batch_create(e, 1, &b[1]));
    for (int k = 0; k < n; k++) {
        kvt_xfer_desc_t d = piece_desc(sa, buf, pa.main_addr, k);
        CHECK_OK(kvt_batch_reset(b[0]));
        CHECK_OK(kvt_batch_submit_wait(b[0], &d, 1, -1));
    }
    fprintf(stderr, "%d writes: %llu woke a worker, workers took %llu\n", n,
            (unsigned long long)atomic_load(&shm->submit_wakes),
            (unsigned long long)atomic_load(&shm->worker_jobs));
    CHECK(atomic_load(&shm->submit_wakes) == 0);
    deep_end(e, &pa, &pb, b, buf, 65);
}

/*
 * The target's /proc state is read once for a run of small jobs of one
 * submission that an executor copies in a row (job.c, RUN_BYTES), not
 * once a job: 64 synchronous 2 MiB writes into plain memory (cross-memory
 * attach), cut into seven jobs each for two copiers, with two workers.
 * Then the same write to a stopped target is parked, completes nothing
 * until the target runs again, and lands whole; and, parked again, fails
 * with the session when the target is killed. Fails when every job reads
 * the state: seven reads a write.
 */
KVT_TEST(one_state_read_per_run_of_jobs)
{
    enum { N = 64, LEN = 2 << 20 };
    kvt_batch_h b[2] = {NULL, NULL};
    kvt_batch_state_t bs;
    kvt__shm_t *shm;
    kvt_segment_t sa;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    uint64_t reads, left = LEN, jobs = 0;
    kvt_xfer_desc_t d = {0};

    if (!two_cpus())
        SKIP("fewer than two CPUs");
    e = deep_setup(&pa, &pb, &sa, 66, &buf);
    shm = shm_of(e);
    CHECK(shm->ncpu == 2);
    CHECK_OK(kvt_batch_create(e, 1, &b[0]));
    CHECK_OK(kvt_batch_create(e, 1, &b[1]));
    while (left > 0) { /* the jobs of one write (kvt__shm_job_size()) */
        uint64_t t = kvt__shm_job_size(left, 4);
        left -= t < left ? t : left;
        jobs++;
    }
    d.opcode = KVT_OP_WRITE;
    d.segment = sa;
    d.local_addr = buf;
    d.length = LEN;
    atomic_store(&shm->state_reads, 0);
    for (int k = 0; k < N; k++) { /* all of the buffer, in turn */
        size_t off = (size_t)(k % (2 * DEEP_LEN / LEN)) * LEN;
        d.local_addr = buf + off;
        d.remote_addr = pa.main_addr + off;
        CHECK_OK(kvt_batch_reset(b[0]));
        CHECK_OK(kvt_batch_submit_wait(b[0], &d, 1, 30000));
    }
    reads = atomic_load(&shm->state_reads);
    fprintf(stderr, "%d writes of %llu jobs: %llu state reads\n", N,
            (unsigned long long)jobs, (unsigned long long)reads);
    CHECK(jobs == 7);
    CHECK(reads >= N && reads * 2 <= N * jobs);

    peer_kill(&pa, SIGSTOP);
    CHECK_OK(kvt_batch_submit(b[1], &d, 1));
    for (int k = 0; k < 500 && atomic_load(&shm->nparked) == 0; k++)
        usleep(10 * 1000); /* copied, then parked */
    CHECK(atomic_load(&shm->nparked) > 0);
    usleep(50 * 1000);
    CHECK_ST(kvt_batch_query(b[1], &bs), KVT_INPROGRESS);
    CHECK(bs.completed == 0);
    peer_kill(&pa, SIGCONT);
    CHECK_OK(rows_poll(b[1], 30));
    CHECK(strcmp(peer_cmd(&pa, "check %llu %llu 66",
                          (unsigned long long)pa.main_addr,
                          (unsigned long long)(2 * DEEP_LEN)),
                 "0") == 0);

    /* Parked again, then killed: the run's jobs fail with the session,
     * none reported delivered. */
    peer_kill(&pa, SIGSTOP);
    CHECK_OK(kvt_batch_reset(b[1]));
    CHECK_OK(kvt_batch_submit(b[1], &d, 1));
    for (int k = 0; k < 500 && atomic_load(&shm->nparked) == 0; k++)
        usleep(10 * 1000);
    CHECK(atomic_load(&shm->nparked) > 0);
    peer_kill(&pa, SIGKILL);
    CHECK_ST(rows_poll(b[1], 5), KVT_ERR_CONN_LOST);
    CHECK_ST(kvt_batch_query(b[1], &bs), KVT_ERR_CONN_LOST);
    CHECK(bs.completed == 0);
    deep_free(e, &pa, &pb, b, buf);
}

/*
 * A wait shorter than the transfer timeout leaves its job to a worker
 * (the job may wait for its target past the wait's end), and wakes one as
 * it leaves: the submission woke none (kvt__sub_t.will_wait). 40
 * synchronous 64 KiB writes with 1 ms waits, each then polled for without
 * driving it, 2 ms apart so that no worker still polls for the next one;
 * every byte checked. Fails when the job is found only by a worker's
 * periodic look (TICK_NS, 50 ms): a median of 48 ms a write in one run,
 * where the hand-over took 0.19 ms.
 */
KVT_TEST(short_wait_hands_its_job_to_a_worker)
{
    kvt_batch_h b[2] = {NULL, NULL};
    kvt_segment_t sa;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;
    double took[40], median;
    int n = (int)(2 * DEEP_LEN / (64u << 10));

    e = deep_setup(&pa, &pb, &sa, 66, &buf);
    CHECK_OK(kvt_batch_create(e, 1, &b[0]));
    CHECK_OK(kvt_batch_create(e, 1, &b[1]));
    for (int k = 0; k < n; k++) {
        kvt_xfer_desc_t d = piece_desc(sa, buf, pa.main_addr, k);
        kvt_status_t st;
        double t0;
        CHECK_OK(kvt_batch_reset(b[0]));
        if (k >= 40) { /* the rest as the check needs them */
            CHECK_OK(kvt_batch_submit_wait(b[0], &d, 1, -1));
            continue;
        }
        usleep(2000);
        t0 = kvt_test_now();
        st = kvt_batch_submit_wait(b[0], &d, 1, 1);
        CHECK(st == KVT_OK || st == KVT_INPROGRESS);
        while ((st = kvt_batch_query(b[0], NULL)) == KVT_INPROGRESS)
            usleep(100);
        CHECK_OK(st);
        took[k] = kvt_test_now() - t0;
    }
    median = kvt_test_median(took, 40);
    fprintf(stderr, "40 writes with 1 ms waits: median %.2f ms, most %.2f\n",
            median * 1e3, took[39] * 1e3);
    /* Not scaled for instrumented builds: a hand-over is a wake-up and a
     * 64 KiB copy, far below the ticks the check tells it from. */
    CHECK(median < 0.010);
    deep_end(e, &pa, &pb, b, buf, 66);
}

/* Synchronous 1 MiB writes from @buf to @addr in @seg until *@stop. */
typedef struct {
    kvt_engine_h e;
    kvt_segment_t seg;
    uint8_t *buf;
    uint64_t addr;
    _Atomic int stop, writes;
} driver_t;

static void *driver_main(void *arg)
{
    driver_t *d = arg;

    while (!atomic_load(&d->stop)) {
        CHECK_OK(write1(d->e, d->seg, d->buf, d->addr, 1 << 20));
        atomic_fetch_add(&d->writes, 1);
    }
    return NULL;
}

/*
 * A worker waiting for its target holds no CPU. Two CPUs, two workers:
 * one waits for stopped A to empty its staging slot; a thread keeps
 * writing to C synchronously, running its own jobs (one CPU kept for it);
 * an asynchronous write to B then lands within 5 s, taken by the other
 * worker (every byte checked). Fails when a worker waiting for its target
 * still counts as copying: the other worker finds no room and B's write
 * waits until the writes to C stop (15 s).
 */
KVT_TEST(worker_waiting_for_target_frees_its_cpu)
{
    enum { PIECES = 1024 }; /* 512 KiB of 512-byte pieces: one job */
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_xfer_desc_t d = {0};
    kvt_segment_t sa, sb, sc;
    driver_t drv;
    kvt_batch_h a, b;
    pthread_t th;
    kvt_engine_h e;
    peer_t pa, pb, pc;
    uint8_t *buf;
    double t0;

    if (!two_cpus())
        SKIP("fewer than two CPUs");
    CHECK(peer_start(&pc, &o) == 0); /* forked before any thread */
    e = two_peers_n(&pa, &pb, &o, &sa, &sb, 2);
    CHECK_OK(kvt_segment_open(e, pc.segment, &sc));
    buf = map(2u << 20);
    pattern_fill(buf, 2u << 20, 44, 0);
    CHECK_OK(kvt_mem_register(e, buf, 2u << 20, KVT_ACCESS_REMOTE_RW));
    a = staged_to_stopped(e, &pa, &pb, sa, sb, buf, PIECES, &d);
    drv.e = e;
    drv.seg = sc;
    drv.buf = buf;
    drv.addr = pc.main_addr;
    atomic_init(&drv.stop, 0);
    atomic_init(&drv.writes, 0);
    CHECK(pthread_create(&th, NULL, driver_main, &drv) == 0);
    usleep(200 * 1000);
    t0 = kvt_test_now();
    memset(&d, 0, sizeof(d));
    d.opcode = KVT_OP_WRITE;
    d.segment = sb;
    d.local_addr = buf;
    d.remote_addr = pb.main_addr;
    d.length = 1u << 20;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    while (kvt_batch_query(b, NULL) == KVT_INPROGRESS &&
           kvt_test_now() - t0 < 15.0)
        usleep(1000);
    fprintf(stderr,
            "B's write beside a waiting worker and a driving "
            "thread: %.3f s (%d writes to C)\n",
            kvt_test_now() - t0, atomic_load(&drv.writes));
    CHECK(kvt_test_now() - t0 < 5.0);
    atomic_store(&drv.stop, 1);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_OK(kvt_batch_query(b, NULL));
    CHECK(strcmp(peer_cmd(&pb, "check %llu %llu 44",
                          (unsigned long long)pb.main_addr,
                          (unsigned long long)(1u << 20)),
                 "0") == 0);
    CHECK(kvt_batch_query(a, NULL) == KVT_INPROGRESS);
    peer_kill(&pa, SIGCONT);
    CHECK_OK(rows_poll(a, 30));
    CHECK_OK(kvt_batch_free(a));
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(e);
    munmap(buf, 2u << 20);
    peer_stop(&pa);
    peer_stop(&pb);
    peer_stop(&pc);
}

/*
 * With no thread waiting on its batch, the workers take jobs on every
 * CPU. Two CPUs, two workers; batches of 16 MiB submitted and polled
 * (kvt_batch_query(), which runs no job): two workers copy at once.
 * Fails when admission keeps a CPU for a waiting thread that is not
 * there.
 */
KVT_TEST(async_batches_use_every_worker)
{
    kvt_batch_h b[2] = {NULL, NULL};
    kvt_segment_t sa;
    kvt__shm_t *shm;
    kvt_engine_h e;
    peer_t pa, pb;
    uint8_t *buf;

    if (!two_cpus())
        SKIP("fewer than two CPUs");
    e = deep_setup(&pa, &pb, &sa, 63, &buf);
    shm = shm_of(e);
    for (int r = 0; r < 10 && atomic_load(&shm->busy_peak) < 2; r++) {
        deep_submit(e, sa, buf, pa.main_addr, b, 2);
        CHECK_OK(rows_poll(b[0], 30));
        CHECK_OK(rows_poll(b[1], 30));
    }
    CHECK(atomic_load(&shm->busy_peak) == 2);
    deep_end(e, &pa, &pb, b, buf, 63);
}

/*
 * A target whose first thread exits (pthread_exit(): the leader is a
 * zombie) lives on in its other threads. Its memory is mapped
 * (kvt_mem_alloc), since cross-memory attach needs the leader's address
 * space: a write through the mapping is delivered, not taken for one into
 * a dying process; stopped (SIGSTOP), it is held until SIGCONT. Fails when a
 * zombie leader reads as not running (the first write times out) or as
 * running whatever its other threads do (the held one completes).
 */
KVT_TEST(zombie_leader_target)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 1, 1, 0};
    kvt_engine_h e;
    kvt_xfer_desc_t d = {0};
    kvt_segment_t seg;
    kvt_batch_h b;
    uint8_t *buf = map(BLK);
    char path[64], st[512] = "";
    FILE *f;
    peer_t p;

    /* The peer first: forked while this process has one thread. */
    CHECK(peer_start(&p, &o) == 0);
    e = engine_new(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 2000);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    if (!offers_shm(e, seg))
        SKIP("the target engine does not offer shm");
    CHECK(strcmp(seg_transport(e, seg), "shm") == 0);
    pattern_fill(buf, BLK, 51, 0);
    CHECK_OK(kvt_mem_register(e, buf, BLK, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(write1(e, seg, buf, p.main_addr, 4096)); /* maps it */
    CHECK(strcmp(peer_cmd(&p, "leave"), "0") == 0);
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)p.pid);
    for (int i = 0; i < 1000 && kvt__shm_thread_state(st) != KVT_SHM_THR_ZOMBIE;
         i++) {
        f = fopen(path, "r");
        CHECK(f != NULL);
        if (fgets(st, sizeof(st), f) == NULL)
            st[0] = '\0';
        fclose(f);
        usleep(1000);
    }
    CHECK(kvt__shm_thread_state(st) == KVT_SHM_THR_ZOMBIE);
    CHECK_OK(write1(e, seg, buf, p.main_addr, BLK));
    CHECK(strcmp(peer_cmd(&p, "check %llu %llu 51",
                          (unsigned long long)p.main_addr,
                          (unsigned long long)BLK),
                 "0") == 0);
    peer_kill(&p, SIGSTOP);
    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = buf;
    d.remote_addr = p.main_addr;
    d.length = BLK;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    usleep(300 * 1000);
    CHECK(kvt_batch_query(b, NULL) == KVT_INPROGRESS);
    peer_kill(&p, SIGCONT);
    CHECK_OK(kvt_batch_wait(b, 10000));
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(e);
    munmap(buf, BLK);
    peer_stop(&p);
}

/* The state of a thread from its /proc stat line: stopped, a zombie,
 * dying (PF_EXITING in field 9, or SIGKILL pending in field 31), running;
 * a name holding ") " does not mislead it; a short line is unknown. */
KVT_TEST(thread_state_from_stat)
{
    /* Fields 4 to 31 after the state; 9 is the flags, 31 the pending
     * signals. */
    static const char tail[] = "1 1 1 0 -1 %s 0 0 0 0 0 0 0 0 20 0 4 0 1 1 1 "
                               "18446744073709551615 1 1 1 0 0 %s 0 0";
    char line[512], t[256];
    struct {
        const char *name, *state, *flags, *pending;
        int want;
    } c[] = {
        {"peer", "S", "4194368", "0", KVT_SHM_THR_RUNNING},
        {"peer", "R", "4194368", "0", KVT_SHM_THR_RUNNING},
        {"peer", "D", "4194368", "0", KVT_SHM_THR_RUNNING},
        {"peer", "T", "4194368", "0", KVT_SHM_THR_STOPPED},
        {"peer", "t", "4194368", "0", KVT_SHM_THR_STOPPED},
        {"peer", "Z", "4228172", "0", KVT_SHM_THR_ZOMBIE},
        {"peer", "X", "4228172", "0", KVT_SHM_THR_ZOMBIE},
        {"peer", "R", "4194372", "0", KVT_SHM_THR_DYING},   /* PF_EXITING */
        {"peer", "R", "4194368", "256", KVT_SHM_THR_DYING}, /* SIGKILL */
        {"peer", "S", "4194368", "2", KVT_SHM_THR_RUNNING}, /* SIGINT */
        {"a) T (b", "S", "4194368", "0", KVT_SHM_THR_RUNNING},
        {"a) R 1 (b", "T", "4194368", "0", KVT_SHM_THR_STOPPED},
    };

    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        snprintf(t, sizeof(t), tail, c[i].flags, c[i].pending);
        snprintf(line, sizeof(line), "4242 (%s) %s %s\n", c[i].name, c[i].state,
                 t);
        if (kvt__shm_thread_state(line) != c[i].want)
            fprintf(stderr, "case %zu: %s", i, line);
        CHECK(kvt__shm_thread_state(line) == c[i].want);
    }
    CHECK(kvt__shm_thread_state("4242 (peer) R 1 1 1 0") ==
          KVT_SHM_THR_UNKNOWN);
    CHECK(kvt__shm_thread_state("4242 (peer") == KVT_SHM_THR_UNKNOWN);
    CHECK(kvt__shm_thread_state("4242 (peer) ") == KVT_SHM_THR_UNKNOWN);
    CHECK(kvt__shm_thread_state("") == KVT_SHM_THR_UNKNOWN);
}

/* Strided write of @count 512-byte pieces, a 1 KiB stride in the target
 * (staged unless the target memory is mapped), from @local; waits. */
static kvt_status_t write_staged(kvt_engine_h e, kvt_segment_t seg,
                                 const uint8_t *local, uint64_t remote,
                                 uint32_t count)
{
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;
    kvt_status_t st;

    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = (void *)local;
    d.remote_addr = remote;
    d.length = 512;
    d.count = count;
    d.remote_stride = 1024;
    if (kvt_batch_create(e, 1, &b) != KVT_OK)
        return KVT_ERR_NO_MEMORY;
    st = kvt_batch_submit(b, &d, 1);
    if (st == KVT_OK)
        st = kvt_batch_wait(b, 30000);
    kvt_batch_free(b);
    return st;
}

/*
 * An initiator killed while it stages pieces into this process (a child
 * writing 8 MiB batches of 512-byte pieces in a loop, killed once its
 * writes flow): the target's service thread and its helper go on, the
 * target serves the next initiator (every staged byte checked) and its
 * engine is destroyed without waiting on the dead one.
 */
KVT_TEST(initiator_killed_while_staging)
{
    const uint32_t count = 16384; /* 8 MiB of pieces, 16 MiB of span */
    const size_t span = (size_t)count * 1024;
    uint8_t *mem = map(span), *local = map(span / 2);
    char name[128] = {0}, c;
    kvt_segment_t seg;
    kvt_engine_h t, e;
    int up[2], down[2];
    pid_t pid;
    double t0;

    /* The child is forked before any engine thread exists here. */
    CHECK(pipe(up) == 0 && pipe(down) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        kvt_engine_h ce;
        kvt_segment_t cs;
        int told = 0;
        if (read(down[0], name, sizeof(name) - 1) <= 0)
            _exit(2);
        ce = engine_new(KVT_TRANSPORT_ALL, 5000);
        if (ce == NULL || kvt_segment_open(ce, name, &cs) != KVT_OK ||
            strcmp(seg_transport(ce, cs), "shm") != 0 ||
            kvt_mem_register(ce, local, span / 2, KVT_ACCESS_REMOTE_RW) !=
                KVT_OK)
            _exit(3);
        memset(local, 0x77, span / 2);
        for (;;) {
            if (write_staged(ce, cs, local, (uint64_t)(uintptr_t)mem, count) !=
                KVT_OK)
                _exit(4);
            if (!told++ && write(up[1], "x", 1) != 1)
                _exit(5);
        }
    }
    close(up[1]);
    close(down[0]);
    t = engine_new(KVT_TRANSPORT_ALL, 5000);
    CHECK(t != NULL);
    CHECK_OK(kvt_mem_register(t, mem, span, KVT_ACCESS_REMOTE_RW));
    snprintf(name, sizeof(name), "%s", kvt_engine_segment_name(t));
    CHECK(write(down[1], name, strlen(name)) == (ssize_t)strlen(name));
    if (read(up[0], &c, 1) != 1) {
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 3)
            SKIP("no shm session to this process");
        CHECK(0);
    }
    usleep(30000);
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
    close(up[0]);
    close(down[1]);

    /* A new initiator (in this process) is served, every byte landing. */
    e = engine_new(KVT_TRANSPORT_ALL, 5000);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, name, &seg));
    CHECK_OK(kvt_mem_register(e, local, span / 2, KVT_ACCESS_REMOTE_RW));
    pattern_fill(local, span / 2, 9, 0);
    memset(mem, 0, span);
    CHECK_OK(write_staged(e, seg, local, (uint64_t)(uintptr_t)mem, count));
    for (uint32_t k = 0; k < count; k++) {
        CHECK(pattern_check(mem + (size_t)k * 1024, 512, 9,
                            (uint64_t)k * 512) == 0);
        for (int q = 512; q < 1024; q++)
            CHECK(mem[(size_t)k * 1024 + q] == 0);
    }
    kvt_engine_destroy(e);
    t0 = kvt_test_now();
    kvt_engine_destroy(t);
    CHECK(kvt_test_now() - t0 < 2);
    munmap(mem, span);
    munmap(local, span / 2);
}

typedef struct {
    kvt_engine_h e;
    kvt_segment_t seg;
    uint8_t *local;
    uint64_t remote;
    _Atomic int stop;
    int ok_before, access_after, ok_after_access, other;
    _Atomic int saw_access;
} writer_t;

/* Write 4 MiB of 0x11 over and over until told to stop. */
static void *writer_main(void *arg)
{
    writer_t *w = arg;

    while (!atomic_load(&w->stop)) {
        kvt_status_t st = write1(w->e, w->seg, w->local, w->remote, 4 * BLK);
        if (st == KVT_OK) {
            if (atomic_load(&w->saw_access))
                w->ok_after_access++;
            else
                w->ok_before++;
        } else if (st == KVT_ERR_ACCESS) {
            atomic_store(&w->saw_access, 1);
            w->access_after++;
        } else {
            w->other++;
        }
    }
    return NULL;
}

/*
 * The guarantee: once kvt_mem_unregister() has returned in the target, no
 * byte of a same-host initiator lands in the region, though the
 * initiator keeps writing (and, for kvt_mem_alloc() memory, still has it
 * mapped when the unregister starts). The target overwrites the region
 * right after unregistering and checks later that nothing changed it;
 * the initiator's writes fail with KVT_ERR_ACCESS from then on, and its
 * mapping of the allocation is released.
 */
static void unregister_while_writing(int managed)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, managed, 0, 0};
    writer_t w = {0};
    pthread_t th;
    peer_t p;
    const char *r;
    double t0;

    CHECK(peer_start(&p, &o) == 0);
    w.e = engine_new(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0);
    CHECK(w.e != NULL);
    CHECK_OK(kvt_segment_open(w.e, p.segment, &w.seg));
    if (!offers_shm(w.e, w.seg))
        SKIP("the target engine does not offer shm");
    CHECK(strcmp(seg_transport(w.e, w.seg), "shm") == 0);
    w.local = map(4 * BLK);
    memset(w.local, 0x11, 4 * BLK);
    CHECK_OK(kvt_mem_register(w.e, w.local, 4 * BLK, KVT_ACCESS_REMOTE_RW));
    w.remote = p.main_addr + 8 * BLK;
    /* The first write asks for the mapping, the second uses it. */
    CHECK_OK(write1(w.e, w.seg, w.local, w.remote, 4 * BLK));
    CHECK_OK(write1(w.e, w.seg, w.local, w.remote, 4 * BLK));
    CHECK(alloc_mappings() == (managed ? 1 : 0));

    CHECK(pthread_create(&th, NULL, writer_main, &w) == 0);
    usleep(100000);
    r = peer_cmd(&p, "unregfill %llu %llu %u", (unsigned long long)p.main_addr,
                 (unsigned long long)PEER_MAIN_LEN, 0xEEu);
    CHECK(r != NULL && atoi(r) == KVT_OK);
    /* Let the writer run into the unregistered region for a while. */
    t0 = kvt_test_now();
    while (w.access_after < 20 && kvt_test_now() - t0 < 10)
        usleep(10000);
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    fprintf(stderr,
            "writes: %d ok before, %d refused after, %d ok after, "
            "%d other\n",
            w.ok_before, w.access_after, w.ok_after_access, w.other);
    r = peer_cmd(&p, "count %llu %llu %u", (unsigned long long)p.main_addr,
                 (unsigned long long)PEER_MAIN_LEN, 0xEEu);
    CHECK(r != NULL);
    if (strcmp(r, "0") != 0) {
        fprintf(stderr, "%s bytes changed after kvt_mem_unregister()\n", r);
        CHECK(0);
    }
    CHECK(w.ok_before > 0 && w.access_after >= 20);
    CHECK(w.ok_after_access == 0 && w.other == 0);
    CHECK(alloc_mappings() == 0);
    kvt_engine_destroy(w.e);
    munmap(w.local, 4 * BLK);
    peer_stop(&p);
}

KVT_TEST(unregister_while_mapped)
{
    unregister_while_writing(1);
}

KVT_TEST(unregister_while_attached)
{
    unregister_while_writing(0);
}

/* The target dies while its memory is mapped and a large batch is being
 * written into it: the batch fails with KVT_ERR_CONN_LOST within the
 * transfer timeout, later work fails at once, and the mapping goes. */
KVT_TEST(target_death_while_mapped)
{
    enum { N = 1024 };
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 1, 0, 0};
    kvt_xfer_desc_t *d = calloc(N, sizeof(*d));
    kvt_batch_state_t bs;
    kvt_segment_t seg;
    kvt_engine_h e;
    kvt_batch_h b;
    kvt_status_t st;
    uint8_t *local;
    peer_t p;
    double t0;

    CHECK(peer_start(&p, &o) == 0);
    e = engine_new(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 5000);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    if (!offers_shm(e, seg))
        SKIP("the target engine does not offer shm");
    local = map(64 * BLK);
    CHECK_OK(kvt_mem_register(e, local, 64 * BLK, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(write1(e, seg, local, p.main_addr, BLK));
    CHECK_OK(write1(e, seg, local, p.main_addr, BLK));
    CHECK(alloc_mappings() == 1);
    for (int i = 0; i < N; i++) {
        d[i].opcode = KVT_OP_WRITE;
        d[i].segment = seg;
        d[i].local_addr = local + (uint64_t)(i % 64) * BLK;
        d[i].remote_addr = p.main_addr + (uint64_t)(i % 64) * BLK;
        d[i].length = BLK;
    }
    CHECK_OK(kvt_batch_create(e, N, &b));
    CHECK_OK(kvt_batch_submit(b, d, N));
    usleep(5000);
    t0 = kvt_test_now();
    peer_kill(&p, SIGKILL);
    st = kvt_batch_wait(b, 10000);
    CHECK(st != KVT_INPROGRESS);
    CHECK(kvt_test_now() - t0 < 5.0 * kvt_test_slowdown());
    kvt_batch_query(b, &bs);
    CHECK(bs.pending == 0 && bs.completed + bs.failed == N);
    if (bs.failed == 0)
        SKIP("the batch finished before the target died");
    CHECK(st == KVT_ERR_CONN_LOST);
    for (size_t i = 0; i < N; i++) {
        kvt_status_t es = kvt_batch_entry(b, i, NULL);
        CHECK(es == KVT_OK || es == KVT_ERR_CONN_LOST);
    }
    /* Later work fails at once; the mapping is released. */
    CHECK_OK(kvt_batch_reset(b));
    t0 = kvt_test_now();
    CHECK_OK(kvt_batch_submit(b, d, 1));
    CHECK_ST(kvt_batch_wait(b, 5000), KVT_ERR_CONN_LOST);
    CHECK(kvt_test_now() - t0 < 1.0 * kvt_test_slowdown());
    t0 = kvt_test_now();
    while (alloc_mappings() != 0 && kvt_test_now() - t0 < 2)
        usleep(10000);
    CHECK(alloc_mappings() == 0);
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(e);
    munmap(local, 64 * BLK);
    free(d);
}

/*
 * kvt__shm_copy_strided() moves exactly the pieces, with and without
 * streaming stores: piece lengths around the streaming thresholds (for
 * pieces scattered in the destination and for pieces contiguous there)
 * and the 32- and 128-byte steps of the vector loops, destinations off every
 * alignment, strides on either side or both, and one contiguous run.
 * Bytes between the pieces and past the last one stay as they were.
 */
static void test_copy_strided_exact(void)
{
    static const size_t lens[] = {1,   31,  64,   200,  255,  256,  257,
                                  300, 512, 1000, 1024, 2048, 4096, 4100};
    static const size_t offs[] = {0, 1, 17, 32, 63};
    const size_t count = 9;
    size_t cap = 2 * 4100 * count + 4096;
    uint8_t *src = malloc(cap), *dst = malloc(cap), *ref = malloc(cap);

    CHECK(src != NULL && dst != NULL && ref != NULL);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++) {
        size_t len = lens[a];
        for (size_t b = 0; b < sizeof(offs) / sizeof(offs[0]); b++) {
            for (int shape = 0; shape < 4; shape++) {
                size_t ds = shape & 1 ? 2 * len + offs[b] : len;
                size_t ss = shape & 2 ? 2 * len + 3 : len;
                for (int nt = 0; nt < 2; nt++) {
                    uint8_t *d = dst + offs[b], *s = src + 5;
                    memset(dst, 0xA5, cap);
                    memset(ref, 0xA5, cap);
                    for (size_t k = 0; k < count; k++)
                        memcpy(ref + offs[b] + k * ds, s + k * ss, len);
                    kvt__shm_copy_strided(d, ds, s, ss, len, count, nt);
                    if (memcmp(dst, ref, cap) != 0) {
                        fprintf(stderr,
                                "len %zu dst+%zu dstride %zu sstride %zu "
                                "nt %d: wrong bytes\n",
                                len, offs[b], ds, ss, nt);
                        CHECK(0);
                    }
                }
            }
        }
    }
    free(src);
    free(dst);
    free(ref);
}

/*
 * kvt__shm_copy_pair() moves exactly both parts of every row: piece
 * lengths below, at and above the streaming threshold, whole and partial
 * 128-byte steps, destinations aligned (the vector loop) and not, strided
 * or contiguous there. Bytes around the pieces stay as they were.
 */
static void test_copy_pair_exact(void)
{
    static const size_t lens[] = {1, 100, 255, 256, 384, 512, 1000, 1024};
    static const size_t offs[] = {0, 8, 32};
    const size_t count = 11;
    size_t cap = 4 * 1024 * count + 4096;
    uint8_t *src = malloc(cap), *d0 = aligned_alloc(64, cap),
            *d1 = aligned_alloc(64, cap), *r0 = malloc(cap), *r1 = malloc(cap);

    CHECK(src && d0 && d1 && r0 && r1);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)(i * 151 + 3);
    for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++) {
        size_t len = lens[a], ss = 2 * len;
        for (size_t b = 0; b < sizeof(offs) / sizeof(offs[0]); b++) {
            for (int spread = 0; spread < 2; spread++) {
                size_t ds = spread ? len + 64 : len;
                uint8_t *x = d0 + offs[b], *y = d1 + offs[b];
                memset(d0, 0xA5, cap);
                memset(d1, 0x5A, cap);
                memset(r0, 0xA5, cap);
                memset(r1, 0x5A, cap);
                for (size_t k = 0; k < count; k++) {
                    memcpy(r0 + offs[b] + k * ds, src + k * ss, len);
                    memcpy(r1 + offs[b] + k * ds, src + k * ss + len, len);
                }
                kvt__shm_copy_pair(x, ds, src, y, ds, src + len, ss, len,
                                   count);
                if (memcmp(d0, r0, cap) != 0 || memcmp(d1, r1, cap) != 0) {
                    fprintf(stderr,
                            "len %zu dst+%zu dstride %zu: wrong bytes\n", len,
                            offs[b], ds);
                    CHECK(0);
                }
            }
        }
    }
    free(src);
    free(d0);
    free(d1);
    free(r0);
    free(r1);
}

static const kvt_test_case_t cases[] = {
    KVT_CASE(copy_strided_exact, 30),
    KVT_CASE(copy_pair_exact, 30),
    KVT_CASE(fallback_to_tcp, 30),
    KVT_CASE(selection, 30),
    KVT_CASE(sessions_served_in_turn, 60),
    KVT_CASE(rows_for_two_peers_mapped, 60),
    KVT_CASE(rows_for_two_peers_staged, 60),
    KVT_CASE(rows_for_two_peers_partner_stopped, 60),
    KVT_CASE(rows_for_two_peers_registry_changes, 60),
    KVT_CASE(stopped_target_parks, 60),
    KVT_CASE(thread_state_from_stat, 30),
    KVT_CASE(zombie_leader_target, 60),
    KVT_CASE(stopped_target_holds_session, 60),
    KVT_CASE(waiter_runs_beside_worker_waiting_for_target, 60),
    KVT_CASE(admission_room, 30),
    KVT_CASE(copy_piece_streams_from_4k, 30),
    KVT_CASE(job_sizes_shrink, 30),
    KVT_CASE(stopped_target_runs_after_two_polls, 30),
    KVT_CASE(worker_polls_for_the_next_batch, 120),
    KVT_CASE(waiting_submitter_wakes_no_worker, 60),
    KVT_CASE(one_state_read_per_run_of_jobs, 60),
    KVT_CASE(short_wait_hands_its_job_to_a_worker, 60),
    KVT_CASE(workers_leave_the_waiter_a_cpu, 120),
    KVT_CASE(async_batches_use_every_worker, 60),
    KVT_CASE(worker_waiting_for_target_frees_its_cpu, 60),
    KVT_CASE(staged_write_timed_out_never_lands, 60),
    KVT_CASE(initiator_killed_while_staging, 60),
    KVT_CASE(unregister_while_mapped, 60),
    KVT_CASE(unregister_while_attached, 60),
    KVT_CASE(target_death_while_mapped, 60),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
