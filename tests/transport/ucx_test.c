/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx cases beyond the conformance suite (black box: the public API and
 * the test peer only): one engine reaching one peer over ucx and another
 * over tcp at once, and the choice an engine running ucx and tcp makes
 * for a peer that offers both, or tcp alone. Run over UCX's tcp on lo
 * (tests/transport/CMakeLists.txt sets the environment); skipped when
 * ucx is not built in.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "devmem.h"
#include "kvt_test.h"
#include "peer.h"

#define BLK (1u << 20)
#define N 64

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

/* N writes of BLK from @local into @p's main region, as one batch. */
static kvt_batch_h submit(kvt_engine_h e, kvt_segment_t seg, uint8_t *local,
                          const peer_t *p)
{
    kvt_xfer_desc_t d[N];
    kvt_batch_h b;

    memset(d, 0, sizeof(d));
    for (int i = 0; i < N; i++) {
        d[i].opcode = KVT_OP_WRITE;
        d[i].segment = seg;
        d[i].local_addr = local + (uint64_t)i * BLK;
        d[i].remote_addr = p->main_addr + (uint64_t)i * BLK;
        d[i].length = BLK;
    }
    CHECK_OK(kvt_batch_create(e, N, &b));
    CHECK_OK(kvt_batch_submit(b, d, N));
    return b;
}

static uint64_t peer_check(peer_t *p, uint64_t len, uint64_t seed)
{
    const char *r =
        peer_cmd(p, "check %llu %llu %llu", (unsigned long long)p->main_addr,
                 (unsigned long long)len, (unsigned long long)seed);
    CHECK(r != NULL);
    return strtoull(r, NULL, 10);
}

/* One engine, two peers: A offers ucx (and tcp), B tcp alone. Each gets
 * the transport it offers; two 64 MiB batches run at once, every byte
 * checked on both; then A dies and B's next batch is unaffected. */
KVT_TEST(mixed_ucx_and_tcp)
{
    peer_opts_t oa = {KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP, 0, 0, 0, 0};
    peer_opts_t ob = {KVT_TRANSPORT_TCP, 0, 0, 0, 0};
    kvt_segment_t sa, sb;
    kvt_batch_h ba, bb;
    peer_t a, b;
    kvt_engine_h e;
    uint8_t *la, *lb;

    CHECK(peer_start(&a, &oa) == 0);
    CHECK(peer_start(&b, &ob) == 0);
    e = engine_new(KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, a.segment, &sa));
    CHECK_OK(kvt_segment_open(e, b.segment, &sb));
    CHECK(strcmp(seg_transport(e, sa), "ucx") == 0);
    CHECK(strcmp(seg_transport(e, sb), "tcp") == 0);
    la = map((size_t)N * BLK);
    lb = map((size_t)N * BLK);
    pattern_fill(la, (uint64_t)N * BLK, 91, 0);
    pattern_fill(lb, (uint64_t)N * BLK, 92, 0);
    CHECK_OK(kvt_mem_register(e, la, (size_t)N * BLK, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(e, lb, (size_t)N * BLK, KVT_ACCESS_REMOTE_RW));
    ba = submit(e, sa, la, &a);
    bb = submit(e, sb, lb, &b);
    CHECK_OK(kvt_batch_wait(ba, 60000));
    CHECK_OK(kvt_batch_wait(bb, 60000));
    CHECK(peer_check(&a, (uint64_t)N * BLK, 91) == 0);
    CHECK(peer_check(&b, (uint64_t)N * BLK, 92) == 0);

    peer_kill(&a, SIGKILL);
    pattern_fill(lb, (uint64_t)N * BLK, 93, 0);
    CHECK_OK(kvt_batch_reset(bb));
    CHECK_OK(kvt_batch_free(bb));
    bb = submit(e, sb, lb, &b);
    CHECK_OK(kvt_batch_wait(bb, 60000));
    CHECK(peer_check(&b, (uint64_t)N * BLK, 93) == 0);
    CHECK_OK(kvt_batch_free(ba));
    CHECK_OK(kvt_batch_free(bb));
    kvt_engine_destroy(e);
    peer_stop(&b);
    munmap(la, (size_t)N * BLK);
    munmap(lb, (size_t)N * BLK);
}

/* ucx runs only when named: an engine with the default transports does
 * not run it, and reaches a peer that offers ucx over its own. */
KVT_TEST(explicit_only)
{
    peer_opts_t oa = {KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP, 0, 0, 0, 0};
    kvt_engine_params_t p = {0};
    kvt_segment_t s;
    kvt_engine_h e;
    peer_t a;

    CHECK(peer_start(&a, &oa) == 0);
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    p.local_host = "127.0.0.1";
    CHECK_OK(kvt_engine_create(&p, &e));
    CHECK_OK(kvt_segment_open(e, a.segment, &s));
    CHECK(seg_offers(e, s, KVT_TRANSPORT_UCX));
    CHECK(strcmp(seg_transport(e, s), "ucx") != 0);
    kvt_engine_destroy(e);
    peer_stop(&a);
}

/*
 * Device memory, where UCX has no CUDA support (Debian's UCX): ucx does not
 * claim it, so with tcp allowed too one transport that moves every kind in
 * use (tcp) carries the peer, and with ucx alone device memory has no
 * transport while host memory still goes over ucx. Needs a CUDA driver
 * (the test double, KVT_CUDA_LIBRARY).
 */
KVT_TEST(device_memory_elsewhere)
{
    peer_opts_t oa = {KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP, 0, 0, 0, 1};
    const char *name = NULL;
    kvt_segment_t s;
    kvt_engine_h e;
    kvt_status_t st;
    void *dev;
    peer_t a;

    if (devmem_probe() != 0)
        SKIP("no CUDA driver (KVT_CUDA_LIBRARY)");
    CHECK(peer_start(&a, &oa) == 0);
    dev = devmem_alloc(1 << 20, 0);
    CHECK(dev != NULL);
    /* ucx alone: host memory goes over it; device memory only when this
     * UCX was built for it (ucp_context_query). */
    e = engine_new(KVT_TRANSPORT_UCX, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_mem_register(e, dev, 1 << 20, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, a.segment, &s));
    CHECK(strcmp(seg_transport(e, s), "ucx") == 0);
    st = kvt_segment_transport(e, s, KVT_MEM_CUDA, KVT_MEM_CUDA, &name);
    kvt_engine_destroy(e);
    if (st == KVT_OK) {
        CHECK(strcmp(name, "ucx") == 0);
        peer_stop(&a);
        devmem_free(dev);
        SKIP("this UCX moves device memory itself");
    }
    CHECK_ST(st, KVT_ERR_NOT_SUPPORTED);
    /* With tcp allowed too: one transport for every kind in use. */
    e = engine_new(KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_mem_register(e, dev, 1 << 20, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, a.segment, &s));
    CHECK_OK(kvt_segment_transport(e, s, KVT_MEM_CUDA, KVT_MEM_CUDA, &name));
    CHECK(strcmp(name, "tcp") == 0);
    CHECK(strcmp(seg_transport(e, s), "tcp") == 0);
    kvt_engine_destroy(e);
    peer_stop(&a);
    devmem_free(dev);
}

static const kvt_test_case_t cases[] = {
    KVT_CASE(mixed_ucx_and_tcp, 120),
    KVT_CASE(explicit_only, 30),
    KVT_CASE(device_memory_elsewhere, 60),
};

int main(int argc, char **argv)
{
    kvt_transport_info_t all[16];
    size_t nt = 0;
    int found = 0;

    CHECK_OK(kvt_transports(all, 16, &nt));
    for (size_t i = 0; i < nt && i < 16; i++)
        found |= all[i].id == KVT_TRANSPORT_UCX;
    if (!found) {
        fprintf(stderr, "skipped: ucx is not built in\n");
        return KVT_TEST_SKIP;
    }
    signal(SIGPIPE, SIG_IGN);
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
