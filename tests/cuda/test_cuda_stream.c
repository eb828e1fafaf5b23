/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfers ordered on a CUDA stream (kvt_transfer_on_stream()), against
 * the driver test double: the double runs a stream's copies and host
 * functions in order on a thread of that stream, each copy after a delay,
 * and refuses every driver call made from a host function, as the driver
 * does. Each case queues work before and after the transfer on one stream
 * and checks that the transfer saw the bytes of the work before it and
 * that the work after it saw the transfer's, with no host wait between;
 * and that kvt made no driver call from the host function.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "double.h"
#include "kvt_test.h"
#include "xfer_test.h"
#include "transport/peer.h"

#define LEN (1u << 20)

static int no_driver;

/* The double, with device 0's context current on this thread. */
static void double_ready(void)
{
    CUcontext c;

    double_open();
    CHECK(cu.DevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHECK(cu.CtxSetCurrent(c) == CUDA_SUCCESS);
}

/* An engine here with LEN bytes of device memory and LEN of host memory
 * registered, a peer (host memory) opened over @transport, a stream. */
typedef struct {
    peer_t p;
    kvt_engine_h e;
    kvt_segment_t seg;
    CUdeviceptr dev;
    uint8_t *host;
    CUstream st;
} fixture_t;

static void setup(fixture_t *f, uint32_t transport)
{
    peer_opts_t o = {transport, 0, 0, 0, 0};
    kvt_engine_params_t ep = {0};

    double_ready();
    if (no_driver)
        SKIP("needs the driver");
    CHECK(peer_start(&f->p, &o) == 0);
    ep.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    ep.transports = transport;
    CHECK_OK(kvt_engine_create(&ep, &f->e));
    CHECK(cu.MemAlloc(&f->dev, LEN) == CUDA_SUCCESS);
    CHECK_OK(kvt_mem_register(f->e, (void *)(uintptr_t)f->dev, LEN,
                              KVT_ACCESS_REMOTE_RW));
    f->host = malloc(LEN);
    CHECK(f->host != NULL);
    CHECK_OK(kvt_mem_register(f->e, f->host, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(f->e, f->p.segment, &f->seg));
    CHECK(cu.StreamCreate(&f->st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
}

static void teardown(fixture_t *f)
{
    CHECK(cu.StreamDestroy(f->st) == CUDA_SUCCESS);
    kvt_engine_destroy(f->e);
    peer_stop(&f->p);
    cu.MemFree(f->dev);
    free(f->host);
}

/* A synchronous transfer between the host buffer and the peer. */
static void host_xfer(fixture_t *f, uint32_t op, uint64_t remote)
{
    kvt_xfer_desc_t d = kvt_test_xd(op, f->seg, f->host, remote, LEN);
    kvt_batch_h b;

    CHECK_OK(kvt_batch_create(f->e, 1, &b));
    CHECK_OK(kvt_batch_submit_wait(b, &d, 1, 30000));
    CHECK_OK(kvt_batch_free(b));
}

typedef struct {
    _Atomic int calls;
    _Atomic kvt_status_t status;
} done_t;

static void on_done(kvt_status_t st, void *arg)
{
    done_t *d = arg;

    d->status = st;
    d->calls++;
}

/*
 * On one stream: fill the device buffer with pattern 1, write it to the
 * peer in 4 descriptors, fill the buffer with pattern 2. The peer must
 * hold pattern 1: the write waited for the first copy and the second
 * waited for the write.
 */
static void write_in_order(uint32_t transport)
{
    uint8_t *p1 = malloc(LEN), *p2 = malloc(LEN);
    kvt_xfer_desc_t d[4];
    done_t done = {0};
    fixture_t f;
    long refused;

    CHECK(p1 != NULL && p2 != NULL);
    setup(&f, transport);
    refused = cu.host_fn_refusals();
    pattern_fill(p1, LEN, 1, 0);
    pattern_fill(p2, LEN, 2, 0);
    for (int i = 0; i < 4; i++)
        d[i] = kvt_test_xd(KVT_OP_WRITE, f.seg,
                           (void *)(uintptr_t)(f.dev + i * LEN / 4),
                           f.p.main_addr + i * LEN / 4, LEN / 4);
    CHECK(cu.MemcpyAsync(f.dev, (CUdeviceptr)(uintptr_t)p1, LEN, f.st) ==
          CUDA_SUCCESS);
    CHECK_OK(kvt_transfer_on_stream(f.e, d, 4, f.st, on_done, &done));
    CHECK(cu.MemcpyAsync(f.dev, (CUdeviceptr)(uintptr_t)p2, LEN, f.st) ==
          CUDA_SUCCESS);
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1);
    CHECK(done.status == KVT_OK);
    host_xfer(&f, KVT_OP_READ, f.p.main_addr);
    CHECK(pattern_check(f.host, LEN, 1, 0) == 0);
    CHECK(cu.host_fn_refusals() == refused);
    teardown(&f);
    free(p1);
    free(p2);
}

KVT_TEST(write_in_order_tcp)
{
    write_in_order(KVT_TRANSPORT_TCP);
}

KVT_TEST(write_in_order_shm)
{
    write_in_order(KVT_TRANSPORT_SHM);
}

/*
 * On one stream: read the peer's memory into the device buffer, then copy
 * the buffer to host memory. The copy must see what was read.
 */
static void read_in_order(uint32_t transport)
{
    uint8_t *out = malloc(LEN);
    kvt_xfer_desc_t d;
    done_t done = {0};
    fixture_t f;
    long refused;

    CHECK(out != NULL);
    setup(&f, transport);
    refused = cu.host_fn_refusals();
    pattern_fill(f.host, LEN, 3, 0);
    host_xfer(&f, KVT_OP_WRITE, f.p.main_addr);
    memset(out, 0, LEN);
    d = kvt_test_xd(KVT_OP_READ, f.seg, (void *)(uintptr_t)f.dev, f.p.main_addr,
                    LEN);
    CHECK_OK(kvt_transfer_on_stream(f.e, &d, 1, f.st, on_done, &done));
    CHECK(cu.MemcpyAsync((CUdeviceptr)(uintptr_t)out, f.dev, LEN, f.st) ==
          CUDA_SUCCESS);
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1 && done.status == KVT_OK);
    CHECK(pattern_check(out, LEN, 3, 0) == 0);
    CHECK(cu.host_fn_refusals() == refused);
    teardown(&f);
    free(out);
}

KVT_TEST(read_in_order_tcp)
{
    read_in_order(KVT_TRANSPORT_TCP);
}

KVT_TEST(read_in_order_shm)
{
    read_in_order(KVT_TRANSPORT_SHM);
}

/* A transfer that fails reports why, and the stream goes on. */
KVT_TEST(failure_reported)
{
    kvt_xfer_desc_t d;
    done_t done = {0};
    fixture_t f;

    setup(&f, KVT_TRANSPORT_TCP);
    d = kvt_test_xd(KVT_OP_WRITE, f.seg, f.host, f.p.guard_addr, 4096);
    CHECK_OK(kvt_transfer_on_stream(f.e, &d, 1, f.st, on_done, &done));
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1);
    CHECK(done.status == KVT_ERR_ACCESS);
    teardown(&f);
}

/* A gate on the stream: a host function that waits until opened. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_open;

static void gate(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gate_lock);
    while (!gate_open)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
}

/*
 * The engine is destroyed while its transfer waits on the stream behind
 * earlier work: when the stream reaches it, it ends with KVT_ERR_CANCELED
 * and moves nothing; the stream goes on.
 */
KVT_TEST(engine_gone_first)
{
    kvt_xfer_desc_t d;
    done_t done = {0};
    fixture_t f;

    setup(&f, KVT_TRANSPORT_TCP);
    gate_open = 0;
    CHECK(cu.LaunchHostFunc(f.st, gate, NULL) == CUDA_SUCCESS);
    d = kvt_test_xd(KVT_OP_WRITE, f.seg, f.host, f.p.main_addr, 4096);
    CHECK_OK(kvt_transfer_on_stream(f.e, &d, 1, f.st, on_done, &done));
    kvt_engine_destroy(f.e);
    f.e = NULL;
    CHECK(done.calls == 0);
    pthread_mutex_lock(&gate_lock);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1);
    CHECK(done.status == KVT_ERR_CANCELED);
    teardown(&f);
}

/*
 * Writes and their notification, queued behind a gate: the notification's
 * message is copied by the call (the caller's buffer is reused before the
 * stream gets there), and the peer receives it after the writes landed.
 */
KVT_TEST(notify_copied)
{
    kvt_xfer_desc_t d[2];
    done_t done = {0};
    char msg[32];
    const char *r;
    fixture_t f;

    setup(&f, KVT_TRANSPORT_TCP);
    gate_open = 0;
    CHECK(cu.LaunchHostFunc(f.st, gate, NULL) == CUDA_SUCCESS);
    pattern_fill(f.host, LEN, 7, 0);
    snprintf(msg, sizeof(msg), "layer-31-done");
    d[0] = kvt_test_xd(KVT_OP_WRITE, f.seg, f.host, f.p.main_addr, LEN);
    d[1] = kvt_test_xd(KVT_OP_NOTIFY, f.seg, msg, 0, strlen(msg));
    CHECK_OK(kvt_transfer_on_stream(f.e, d, 2, f.st, on_done, &done));
    memset(msg, 'X', sizeof(msg) - 1);
    pthread_mutex_lock(&gate_lock);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1 && done.status == KVT_OK);
    r = peer_cmd(&f.p, "notify 5000 %llu %u 7",
                 (unsigned long long)f.p.main_addr, LEN);
    CHECK(strcmp(r, "layer-31-done 0") == 0);
    teardown(&f);
}

/*
 * The engine is destroyed while its stream-ordered transfer is in flight
 * (the peer stopped): the transfer ends with KVT_ERR_CANCELED and the
 * stream goes on, long before the transfer timeout.
 */
KVT_TEST(engine_gone_while_running)
{
    kvt_xfer_desc_t d;
    done_t done = {0};
    fixture_t f;

    setup(&f, KVT_TRANSPORT_TCP);
    peer_kill(&f.p, SIGSTOP);
    d = kvt_test_xd(KVT_OP_WRITE, f.seg, f.host, f.p.main_addr, LEN);
    CHECK_OK(kvt_transfer_on_stream(f.e, &d, 1, f.st, on_done, &done));
    usleep(200 * 1000); /* reached and submitted: the peer cannot answer */
    CHECK(done.calls == 0);
    kvt_engine_destroy(f.e);
    f.e = NULL;
    CHECK(cu.StreamSynchronize(f.st) == CUDA_SUCCESS);
    CHECK(done.calls == 1);
    CHECK(done.status == KVT_ERR_CANCELED);
    peer_kill(&f.p, SIGCONT);
    teardown(&f);
}

static void *no_context(void *arg)
{
    kvt_engine_h e = arg;
    kvt_xfer_desc_t d = kvt_test_xd(KVT_OP_WRITE, 1, &d, 0, 8);

    /* A new thread has no current context: the NULL stream has none. */
    return (void *)(intptr_t)kvt_transfer_on_stream(e, &d, 1, NULL, NULL, NULL);
}

/* What the call refuses, and the NULL stream. */
KVT_TEST(refusals)
{
    kvt_xfer_desc_t d = kvt_test_xd(KVT_OP_WRITE, 1, &d, 0, 8);
    kvt_engine_params_t ep = {0};
    kvt_engine_h e;
    pthread_t t;
    void *r;

    double_ready();
    CHECK_OK(kvt_engine_create(&ep, &e));
    CHECK(kvt_transfer_on_stream(NULL, &d, 1, NULL, NULL, NULL) ==
          KVT_ERR_INVALID_PARAM);
    CHECK(kvt_transfer_on_stream(e, NULL, 1, NULL, NULL, NULL) ==
          KVT_ERR_INVALID_PARAM);
    CHECK(kvt_transfer_on_stream(e, &d, 0, NULL, NULL, NULL) ==
          KVT_ERR_INVALID_PARAM);
    if (no_driver) {
        CHECK(kvt_transfer_on_stream(e, &d, 1, NULL, NULL, NULL) ==
              KVT_ERR_NOT_SUPPORTED);
    } else {
        CHECK(pthread_create(&t, NULL, no_context, e) == 0);
        CHECK(pthread_join(t, &r) == 0);
        CHECK((kvt_status_t)(intptr_t)r == KVT_ERR_IO);
    }
    kvt_engine_destroy(e);
}

/* The NULL stream of a thread with a current context works. */
KVT_TEST(null_stream)
{
    kvt_xfer_desc_t d;
    done_t done = {0};
    fixture_t f;

    setup(&f, KVT_TRANSPORT_TCP);
    pattern_fill(f.host, LEN, 4, 0);
    d = kvt_test_xd(KVT_OP_WRITE, f.seg, f.host, f.p.main_addr, LEN);
    CHECK_OK(kvt_transfer_on_stream(f.e, &d, 1, NULL, on_done, &done));
    CHECK(cu.StreamSynchronize(NULL) == CUDA_SUCCESS);
    CHECK(done.calls == 1 && done.status == KVT_OK);
    memset(f.host, 0, LEN);
    host_xfer(&f, KVT_OP_READ, f.p.main_addr);
    CHECK(pattern_check(f.host, LEN, 4, 0) == 0);
    teardown(&f);
}

/*
 * The legacy NULL stream held by a stream-ordered transfer whose target is
 * device memory of this same process, over shm, staged (the double
 * refuses to share device memory): the target's thread copies each piece
 * into its device memory while the host function holds the NULL stream. Those
 * copies must not queue behind it (they did on the NULL stream: the
 * transfer then waited for itself until the transfer timeout).
 */
KVT_TEST(null_stream_into_own_device)
{
    kvt_engine_params_t ep = {0};
    kvt_engine_h tgt, ini;
    kvt_segment_t seg;
    kvt_xfer_desc_t d;
    done_t done = {0};
    CUdeviceptr dev;
    uint8_t *host = malloc(LEN), *out = malloc(LEN);

    /* Device memory not shared: the target's own thread copies each piece
     * into it (each case runs in a process of its own, which loads the
     * double here first). */
    setenv("KVT_CUDA_DOUBLE_NO_IPC", "1", 1);
    double_ready();
    if (no_driver)
        SKIP("needs the driver");
    CHECK(host != NULL && out != NULL);
    ep.field_mask =
        KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_TRANSFER_TIMEOUT;
    ep.transports = KVT_TRANSPORT_SHM;
    ep.transfer_timeout_ms = 5000;
    CHECK_OK(kvt_engine_create(&ep, &tgt));
    CHECK_OK(kvt_engine_create(&ep, &ini));
    CHECK(cu.MemAlloc(&dev, LEN) == CUDA_SUCCESS);
    CHECK_OK(kvt_mem_register(tgt, (void *)(uintptr_t)dev, LEN,
                              KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(ini, host, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(ini, kvt_engine_segment_name(tgt), &seg));
    CHECK(strcmp(seg_transport(ini, seg), "shm") == 0);
    pattern_fill(host, LEN, 6, 0);
    d = kvt_test_xd(KVT_OP_WRITE, seg, host, dev, LEN);
    CHECK_OK(kvt_transfer_on_stream(ini, &d, 1, NULL, on_done, &done));
    CHECK(cu.StreamSynchronize(NULL) == CUDA_SUCCESS);
    CHECK(done.calls == 1);
    CHECK(done.status == KVT_OK);
    CHECK(cu.MemcpyAsync((CUdeviceptr)(uintptr_t)out, dev, LEN, NULL) ==
          CUDA_SUCCESS);
    CHECK(cu.StreamSynchronize(NULL) == CUDA_SUCCESS);
    CHECK(pattern_check(out, LEN, 6, 0) == 0);
    kvt_engine_destroy(ini);
    kvt_engine_destroy(tgt);
    cu.MemFree(dev);
    free(host);
    free(out);
}

int main(int argc, char **argv)
{
    static const kvt_test_case_t cases[] = {
        KVT_CASE(write_in_order_tcp, 60),
        KVT_CASE(write_in_order_shm, 60),
        KVT_CASE(read_in_order_tcp, 60),
        KVT_CASE(read_in_order_shm, 60),
        KVT_CASE(failure_reported, 60),
        KVT_CASE(engine_gone_first, 60),
        KVT_CASE(refusals, 30),
        KVT_CASE(null_stream, 60),
        KVT_CASE(null_stream_into_own_device, 60),
        KVT_CASE(notify_copied, 60),
        KVT_CASE(engine_gone_while_running, 60)};

    if (argc > 1 && strcmp(argv[1], "--no-driver") == 0) {
        no_driver = 1;
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
