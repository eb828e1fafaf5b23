/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA memory domain against the driver test double (cuda_double.c,
 * loaded through KVT_CUDA_LIBRARY): detection of device memory, its
 * device and allocation; a stated kind checked; pinned host memory taken
 * as host memory; refusal of ranges that overrun an allocation, of device
 * memory stated as host memory, and, with no driver (--no-driver: kvt is
 * pointed at a library that does not exist while the test still allocates
 * through the double), of every device pointer.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "double.h"
#include "kvt_test.h"
#include "xfer_test.h"
#include "transport/peer.h"

static int no_driver;

static CUdeviceptr dev_alloc(int dev, size_t len)
{
    CUcontext c;
    CUdeviceptr p = 0;

    CHECK(cu.DevicePrimaryCtxRetain(&c, dev) == CUDA_SUCCESS);
    CHECK(cu.CtxSetCurrent(c) == CUDA_SUCCESS);
    CHECK(cu.MemAlloc(&p, len) == CUDA_SUCCESS);
    return p;
}

static kvt_engine_h engine(void)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e;

    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    p.local_host = "127.0.0.1";
    CHECK_OK(kvt_engine_create(&p, &e));
    return e;
}

static const kvt_mem_domain_info_t *cuda_domain(void)
{
    static kvt_mem_domain_info_t d[8];
    size_t n = 0;

    CHECK_OK(kvt_mem_domains(d, 8, &n));
    for (size_t i = 0; i < n; i++)
        if (d[i].kind == KVT_MEM_CUDA)
            return &d[i];
    SKIP("this build has no CUDA memory domain");
    return NULL;
}

KVT_TEST(domain)
{
    const kvt_mem_domain_info_t *d = cuda_domain();

    printf("cuda: available %d, %d devices: %s\n", d->available, d->devices,
           d->detail);
    if (no_driver) {
        CHECK(d->available == 0 && d->devices == 0);
        CHECK(strstr(d->detail, "no CUDA driver") != NULL);
    } else {
        CHECK(d->available == 1 && d->devices == 2);
        CHECK(strstr(d->detail, "2 devices") != NULL);
    }
}

static void region_kind(kvt_engine_h e, void *addr, kvt_mem_kind_t kind,
                        int32_t dev)
{
    kvt_remote_region_t rr[8];
    kvt_segment_t self;
    size_t n = 0, i;

    CHECK_OK(kvt_segment_open(e, kvt_engine_segment_name(e), &self));
    CHECK_OK(kvt_segment_regions(e, self, 0, rr, 8, &n));
    for (i = 0; i < n && i < 8; i++)
        if (rr[i].addr == (uint64_t)(uintptr_t)addr)
            break;
    CHECK(i < n);
    CHECK(rr[i].kind == (uint32_t)kind && rr[i].device == dev);
    CHECK_OK(kvt_segment_close(e, self));
}

KVT_TEST(detect)
{
    kvt_engine_h e;
    CUdeviceptr d0, d1;
    kvt_mem_params_t mp = {0};
    void *pinned;

    cuda_domain();
    double_open();
    if (no_driver)
        SKIP("detection needs the driver");
    e = engine();
    d0 = dev_alloc(0, 1 << 20);
    d1 = dev_alloc(1, 1 << 20);
    /* Told from the memory: device and ordinal. */
    CHECK_OK(kvt_mem_register(e, (void *)d0, 1 << 20, KVT_ACCESS_REMOTE_RW));
    region_kind(e, (void *)d0, KVT_MEM_CUDA, 0);
    CHECK_OK(kvt_mem_register_ex(e, (void *)(d1 + 4096), 8192, NULL));
    region_kind(e, (void *)(d1 + 4096), KVT_MEM_CUDA, 1);
    CHECK_OK(kvt_mem_unregister(e, (void *)(d1 + 4096)));
    /* Stated: the right device is taken, another refused, and device
     * memory is never host memory. */
    mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    mp.kind = KVT_MEM_CUDA;
    mp.device = 1;
    CHECK_OK(kvt_mem_register_ex(e, (void *)d1, 4096, &mp));
    region_kind(e, (void *)d1, KVT_MEM_CUDA, 1);
    mp.device = 0;
    CHECK_ST(kvt_mem_register_ex(e, (void *)(d1 + 8192), 4096, &mp),
             KVT_ERR_NOT_SUPPORTED);
    mp.kind = KVT_MEM_HOST;
    CHECK_ST(kvt_mem_register_ex(e, (void *)(d1 + 8192), 4096, &mp),
             KVT_ERR_NOT_SUPPORTED);
    /* A range that runs past its allocation. */
    CHECK_ST(
        kvt_mem_register_ex(e, (void *)(d1 + (1 << 20) - 4096), 8192, NULL),
        KVT_ERR_NOT_SUPPORTED);
    /* Host memory stated as CUDA memory. */
    pinned = malloc(8192);
    mp.kind = KVT_MEM_CUDA;
    CHECK_ST(kvt_mem_register_ex(e, pinned, 8192, &mp), KVT_ERR_NOT_SUPPORTED);
    free(pinned);
    /* Pinned host memory is host memory. */
    CHECK(cu.MemHostAlloc(&pinned, 1 << 16, 0) == CUDA_SUCCESS);
    CHECK_OK(kvt_mem_register(e, pinned, 1 << 16, KVT_ACCESS_REMOTE_RW));
    region_kind(e, pinned, KVT_MEM_HOST, -1);
    CHECK_OK(kvt_mem_unregister(e, pinned));
    CHECK_OK(kvt_mem_unregister(e, (void *)d0));
    CHECK_OK(kvt_mem_unregister(e, (void *)d1));
    kvt_engine_destroy(e);
    CHECK(cu.MemFreeHost(pinned) == CUDA_SUCCESS);
    CHECK(cu.MemFree(d0) == CUDA_SUCCESS && cu.MemFree(d1) == CUDA_SUCCESS);
}

/* Device memory allocated through kvt: registered on its device, freed
 * through the driver. */
KVT_TEST(alloc_device)
{
    kvt_mem_params_t mp = {0};
    kvt_engine_h e;
    void *m = NULL;

    cuda_domain();
    double_open();
    e = engine();
    mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    mp.kind = KVT_MEM_CUDA;
    mp.device = 1;
    if (no_driver) {
        CHECK_ST(kvt_mem_alloc_ex(e, 1 << 20, &mp, &m), KVT_ERR_NOT_SUPPORTED);
        kvt_engine_destroy(e);
        return;
    }
    CHECK_OK(kvt_mem_alloc_ex(e, 1 << 20, &mp, &m));
    region_kind(e, m, KVT_MEM_CUDA, 1);
    CHECK_ST(kvt_mem_register(e, m, 4096, 3), KVT_ERR_EXISTS);
    CHECK_OK(kvt_mem_free(e, m));
    CHECK_ST(kvt_mem_free(e, m), KVT_ERR_NOT_FOUND);
    mp.device = 7;
    CHECK_ST(kvt_mem_alloc_ex(e, 1 << 20, &mp, &m), KVT_ERR_INVALID_PARAM);
    mp.device = 0;
    CHECK_OK(kvt_mem_alloc_ex(e, 1 << 20, &mp, &m)); /* freed by the end */
    kvt_engine_destroy(e);
}

static void (*refuse_copy)(long);

/* kvt_mem_copy() between host and device memory, and a copy the driver
 * refuses when it is queued (an error at issue time: one that fails on the
 * device loses the context, tests/cuda/test_cuda_driver.c). */
KVT_TEST(mem_copy)
{
    enum { LEN = 1 << 20 };
    uint8_t *a = malloc(LEN), *b = calloc(1, LEN);
    CUdeviceptr d0, d1;
    void *h;

    cuda_domain();
    double_open();
    if (no_driver)
        SKIP("needs the driver");
    d0 = dev_alloc(0, LEN);
    d1 = dev_alloc(1, LEN);
    pattern_fill(a, LEN, 9, 0);
    CHECK_OK(kvt_mem_copy((void *)d0, a, LEN));
    CHECK_OK(kvt_mem_copy((void *)d1, (void *)d0, LEN)); /* device to device */
    CHECK_OK(kvt_mem_copy(b, (void *)d1, LEN));
    CHECK(memcmp(a, b, LEN) == 0);
    h = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);
    CHECK(h != NULL);
    *(void **)&refuse_copy = dlsym(h, "kvt_cuda_double_refuse_copy");
    CHECK(refuse_copy != NULL);
    refuse_copy(1);
    CHECK_ST(kvt_mem_copy(b, (void *)d0, LEN), KVT_ERR_IO);
    CHECK_OK(kvt_mem_copy(b, (void *)d0, LEN));
    CHECK(memcmp(a, b, LEN) == 0);
    /* A range running past its allocation is refused. */
    CHECK_ST(kvt_mem_copy((void *)(d0 + LEN - 4096), a, 8192), KVT_ERR_IO);
    CHECK(cu.MemFree(d0) == CUDA_SUCCESS && cu.MemFree(d1) == CUDA_SUCCESS);
    free(a);
    free(b);
}

KVT_TEST(no_driver_refuses)
{
    kvt_mem_region_t r[1];
    kvt_mem_params_t mp = {0};
    kvt_engine_h e;
    CUdeviceptr d0;

    cuda_domain();
    double_open();
    if (!no_driver)
        SKIP("run with --no-driver");
    e = engine();
    d0 = dev_alloc(0, 1 << 20);
    /* kvt found no driver: a device pointer is refused, not taken for
     * host memory, whichever way it is registered. */
    CHECK_ST(kvt_mem_register(e, (void *)d0, 1 << 20, KVT_ACCESS_REMOTE_RW),
             KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt_mem_register_ex(e, (void *)d0, 4096, NULL),
             KVT_ERR_NOT_SUPPORTED);
    mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    mp.kind = KVT_MEM_CUDA;
    mp.device = 0;
    CHECK_ST(kvt_mem_register_ex(e, (void *)d0, 4096, &mp),
             KVT_ERR_NOT_SUPPORTED);
    r[0] = (kvt_mem_region_t){(void *)d0, 4096, 3, KVT_MEM_AUTO, 0, 0};
    CHECK_ST(kvt_mem_register_batch(e, r, 1), KVT_ERR_NOT_SUPPORTED);
    kvt_engine_destroy(e);
    CHECK(cu.MemFree(d0) == CUDA_SUCCESS);
}

/* ---- Moving device memory (a peer in another process) ------------------- */

/*
 * A peer with its main region in device memory, and an engine here with
 * @len bytes of device memory registered and the peer's segment open
 * (@conns connections a peer over tcp; 0: the default). Skips without the
 * driver.
 */
typedef struct {
    peer_t p;
    kvt_engine_h e;
    kvt_segment_t seg;
    void *dev;
} dev_pair_t;

/* As dev_pair(), the peer's main region as @peer_mem says: device
 * memory (1), plain host memory (0), kvt_mem_alloc() memory (2). */
/* The engine's slice size for the next dev_pair() (0: its default). */
static size_t g_slice;

static void dev_pair_with(dev_pair_t *x, uint32_t transports, size_t len,
                          unsigned conns, int peer_mem)
{
    peer_opts_t o = {transports, 0, peer_mem == 2, 0, peer_mem == 1};
    kvt_engine_params_t ep = {0};

    cuda_domain();
    double_open();
    if (no_driver)
        SKIP("needs the driver");
    CHECK(peer_start(&x->p, &o) == 0);
    ep.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    ep.transports = transports;
    if (conns != 0) {
        ep.field_mask |= KVT_ENGINE_PARAM_CONNS_PER_PEER;
        ep.conns_per_peer = conns;
    }
    if (g_slice != 0) {
        ep.field_mask |= KVT_ENGINE_PARAM_SLICE_SIZE;
        ep.slice_size = g_slice;
    }
    CHECK_OK(kvt_engine_create(&ep, &x->e));
    x->dev = (void *)dev_alloc(0, len);
    CHECK_OK(kvt_mem_register(x->e, x->dev, len, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(x->e, x->p.segment, &x->seg));
}

static void dev_pair(dev_pair_t *x, uint32_t transports, size_t len,
                     unsigned conns)
{
    dev_pair_with(x, transports, len, conns, 1);
}

static void dev_pair_end(dev_pair_t *x)
{
    kvt_engine_destroy(x->e);
    peer_stop(&x->p);
    devmem_free(x->dev);
}

/*
 * A same-host peer whose memory is on the device: one transport carries
 * every kind of memory (shm, through the driver's sharing), so that a
 * notification sent after device writes follows them. The double delays
 * every copy (KVT_CUDA_DOUBLE_DELAY_US, set by the test): a notification
 * that overtook the copies would see old bytes.
 */
KVT_TEST(same_host_device_routes)
{
    enum { LEN = 4 << 20 };
    kvt_xfer_desc_t d[2];
    const char *name = NULL;
    uint8_t *host = malloc(LEN);
    const char *r;
    dev_pair_t x;

    dev_pair(&x, KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, LEN, 0);
    CHECK_OK(
        kvt_segment_transport(x.e, x.seg, KVT_MEM_CUDA, KVT_MEM_CUDA, &name));
    CHECK(strcmp(name, "shm") == 0);
    CHECK_OK(
        kvt_segment_transport(x.e, x.seg, KVT_MEM_HOST, KVT_MEM_HOST, &name));
    CHECK(strcmp(name, "shm") == 0);
    /* Device to device through the peer: fill ours, write, notify. */
    pattern_fill(host, LEN, 21, 0);
    CHECK(devmem_copy(x.dev, host, LEN) == 0);
    d[0] = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, LEN);
    d[1] = kvt_test_xd(KVT_OP_NOTIFY, x.seg, "done", 0, 4);
    CHECK_OK(kvt_test_xfer(x.e, d, 2));
    r = peer_cmd(&x.p, "notify 5000 %llu %llu 21",
                 (unsigned long long)x.p.main_addr, (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "done 0") == 0);
    /* And back: read the peer's device memory into ours. */
    CHECK(devmem_copy(x.dev, memset(host, 0, LEN), LEN) == 0);
    d[0] = kvt_test_xd(KVT_OP_READ, x.seg, x.dev, x.p.main_addr, LEN);
    CHECK_OK(kvt_test_xfer(x.e, d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    CHECK(pattern_check(host, LEN, 21, 0) == 0);
    dev_pair_end(&x);
    free(host);
}

/* Without device memory, a same-host peer is served by shm. */
KVT_TEST(same_host_host_only)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_engine_h e;
    kvt_segment_t seg;
    const char *name = NULL;
    peer_t p;

    CHECK(peer_start(&p, &o) == 0);
    e = engine_new(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    CHECK_OK(kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_HOST, &name));
    CHECK(strcmp(name, "shm") == 0);
    /* Device memory would go the same way (the driver's sharing), with a
     * driver; without one this engine has no device memory to send. */
    if (no_driver) {
        CHECK_ST(
            kvt_segment_transport(e, seg, KVT_MEM_CUDA, KVT_MEM_HOST, &name),
            KVT_ERR_NOT_SUPPORTED);
    } else {
        CHECK_OK(
            kvt_segment_transport(e, seg, KVT_MEM_CUDA, KVT_MEM_HOST, &name));
        CHECK(strcmp(name, "shm") == 0);
    }
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/*
 * A copy the driver refuses when it is queued: out of device memory (a
 * write's staging copy) and into it (a read's); the descriptor fails with
 * KVT_ERR_IO and the next one on the same connection succeeds.
 */
static void copy_fails(uint32_t transport)
{
    enum { LEN = 1 << 20 };
    kvt_xfer_desc_t d;
    uint8_t *host = malloc(LEN);
    dev_pair_t x;
    void *h;

    dev_pair(&x, transport, LEN, 0);
    h = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);
    CHECK(h != NULL);
    *(void **)&refuse_copy = dlsym(h, "kvt_cuda_double_refuse_copy");
    CHECK(refuse_copy != NULL);
    pattern_fill(host, LEN, 5, 0);
    CHECK(devmem_copy(x.dev, host, LEN) == 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, LEN);
    refuse_copy(1); /* the write's copy out of device memory */
    CHECK_ST(kvt_test_xfer(x.e, &d, 1), KVT_ERR_IO);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(peer_cmd(&x.p, "check %llu %llu 5", (unsigned long long)x.p.main_addr,
                   (unsigned long long)LEN) != NULL);
    d.opcode = KVT_OP_READ;
    refuse_copy(1); /* the read's first copy into device memory */
    CHECK_ST(kvt_test_xfer(x.e, &d, 1), KVT_ERR_IO);
    CHECK(devmem_copy(x.dev, memset(host, 0, LEN), LEN) == 0);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    CHECK(pattern_check(host, LEN, 5, 0) == 0);
    dev_pair_end(&x);
    free(host);
}

/*
 * Over tcp the device copies of the frames behind the head of the send
 * queue run ahead while it is sent. One of those refused fails its own
 * descriptor only (zeros were sent for it); every other block lands.
 */
KVT_TEST(copy_ahead_fails)
{
    enum { N = 16, BLK = 1 << 20 };
    kvt_xfer_desc_t d[N];
    uint8_t *host = malloc((size_t)N * BLK);
    kvt_batch_h b;
    unsigned failed = 0;
    dev_pair_t x;
    void *h;

    /* A frame per block: a frame carries pieces up to a slice. */
    g_slice = BLK;
    dev_pair(&x, KVT_TRANSPORT_TCP, (size_t)N * BLK, 1);
    g_slice = 0;
    h = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);
    CHECK(h != NULL);
    *(void **)&refuse_copy = dlsym(h, "kvt_cuda_double_refuse_copy");
    CHECK(refuse_copy != NULL);
    /* Every other block there, so that no two frames merge; block i
     * holds the pattern of where it goes. */
    for (int i = 0; i < N; i++)
        pattern_fill(host + (size_t)i * BLK, BLK, 7, (uint64_t)i * 2 * BLK);
    CHECK(devmem_copy(x.dev, host, (size_t)N * BLK) == 0);
    for (int i = 0; i < N; i++)
        d[i] =
            kvt_test_xd(KVT_OP_WRITE, x.seg, (uint8_t *)x.dev + (size_t)i * BLK,
                        x.p.main_addr + (uint64_t)i * 2 * BLK, BLK);
    refuse_copy(5);
    CHECK_OK(kvt_batch_create(x.e, N, &b));
    CHECK_OK(kvt_batch_submit(b, d, N));
    CHECK(kvt_batch_wait(b, 30000) != KVT_INPROGRESS);
    for (int i = 0; i < N; i++) {
        kvt_status_t st = kvt_batch_entry(b, (size_t)i, NULL);
        const char *r;
        CHECK(st == KVT_OK || st == KVT_ERR_IO);
        if (st != KVT_OK) {
            failed++;
            continue;
        }
        r = peer_cmd(
            &x.p, "check %llu %llu 7",
            (unsigned long long)(x.p.main_addr + (uint64_t)i * 2 * BLK),
            (unsigned long long)BLK);
        CHECK(r != NULL && strcmp(r, "0") == 0);
    }
    CHECK(failed == 1);
    CHECK_OK(kvt_batch_free(b));
    dev_pair_end(&x);
    free(host);
}

KVT_TEST(device_copy_fails)
{
    copy_fails(KVT_TRANSPORT_TCP);
}

/* The same over shm: the device copy into the peer's opened memory, and
 * out of it. */
KVT_TEST(device_copy_fails_shm)
{
    copy_fails(KVT_TRANSPORT_SHM);
}

/*
 * The target unregisters its device memory while writes stream into it,
 * then overwrites it (on another stream of the driver). No write may land
 * after the unregistration returned: every copy queued into the region
 * before it completes first. The double delays each copy (500 us), so
 * that copies still queued would land after the overwrite.
 */
static void unregister_load(uint32_t transport)
{
    enum { N = 256, BLK = 1 << 20, ROUNDS = 6, SPREAD = 32 };
    kvt_xfer_desc_t *d = calloc(N, sizeof(*d));
    kvt_batch_state_t bs;
    kvt_batch_h b;
    const char *r;
    dev_pair_t x;
    /* Over tcp one connection: the writes, all into one block (which the
     * overwrite then covers quickly), land one after the other (over two
     * they would race each other). shm runs jobs on several threads at
     * once: its writes go to SPREAD blocks in turn, so that none races
     * another. */
    uint64_t span = transport == KVT_TRANSPORT_SHM ? SPREAD * BLK : BLK;

    dev_pair(&x, transport, BLK, 1);
    for (int i = 0; i < N; i++)
        d[i] = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev,
                           x.p.main_addr + (uint64_t)i * BLK % span, BLK);
    CHECK_OK(kvt_batch_create(x.e, N, &b));
    /* Each round: writes under way, the target unregisters and
     * overwrites; nothing of the writes may show afterwards. The moment
     * of the unregistration against the copies in flight varies, so a few
     * rounds are run. */
    for (int round = 0; round < ROUNDS; round++) {
        if (round > 0) {
            r = peer_cmd(&x.p, "reg %llu %llu",
                         (unsigned long long)x.p.main_addr,
                         (unsigned long long)PEER_MAIN_LEN);
            CHECK(r != NULL && atoi(r) == KVT_OK);
        }
        CHECK_OK(kvt_batch_submit(b, d, N));
        for (int i = 0; i < 20000; i++) {
            kvt_batch_query(b, &bs);
            if (bs.completed >= 2 + (uint32_t)round)
                break;
            usleep(100);
        }
        r = peer_cmd(&x.p, "unregfill %llu %llu 90",
                     (unsigned long long)x.p.main_addr,
                     (unsigned long long)span);
        CHECK(r != NULL && atoi(r) == KVT_OK);
        CHECK(kvt_batch_wait(b, 30000) != KVT_INPROGRESS);
        kvt_batch_query(b, &bs);
        CHECK(bs.failed > 0); /* the writes after it were refused */
        usleep(50000);
        r = peer_cmd(&x.p, "count %llu %llu 90",
                     (unsigned long long)x.p.main_addr,
                     (unsigned long long)span);
        CHECK(r != NULL && strcmp(r, "0") == 0);
        CHECK_OK(kvt_batch_reset(b));
    }
    CHECK_OK(kvt_batch_free(b));
    dev_pair_end(&x);
    free(d);
}

KVT_TEST(unregister_under_load)
{
    unregister_load(KVT_TRANSPORT_TCP);
}

/* Over shm the initiator's device copies run into the target's memory
 * opened in its own process: the registry barrier waits for them. */
KVT_TEST(unregister_under_load_shm)
{
    unregister_load(KVT_TRANSPORT_SHM);
}

static long (*ipc_opens)(void), (*ipc_live)(void);

static void ipc_counters(void)
{
    void *h = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);

    CHECK(h != NULL);
    *(void **)&ipc_opens = dlsym(h, "kvt_cuda_double_ipc_opens");
    *(void **)&ipc_live = dlsym(h, "kvt_cuda_double_ipc_live");
    CHECK(ipc_opens != NULL && ipc_live != NULL);
}

/*
 * The peer's device region is opened once and kept: many writes, one
 * opening. Registered again (a new registration at the same address),
 * it is opened afresh and the old opening closed, so nothing is written
 * through a stale one.
 */
KVT_TEST(ipc_cached)
{
    enum { LEN = 1 << 20 };
    uint8_t *host = malloc(LEN);
    kvt_xfer_desc_t d;
    const char *r;
    dev_pair_t x;
    long opens;

    dev_pair(&x, KVT_TRANSPORT_SHM, LEN, 0);
    ipc_counters();
    opens = ipc_opens();
    CHECK(ipc_live() == 0);
    for (int i = 0; i < 16; i++) {
        pattern_fill(host, LEN, 40 + (uint64_t)i, 0);
        CHECK(devmem_copy(x.dev, host, LEN) == 0);
        d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, LEN);
        CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    }
    CHECK(ipc_opens() == opens + 1);
    CHECK(ipc_live() == 1);
    r = peer_cmd(&x.p, "check %llu %llu 55", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    r = peer_cmd(&x.p, "unreg %llu", (unsigned long long)x.p.main_addr);
    CHECK(r != NULL && atoi(r) == KVT_OK);
    r = peer_cmd(&x.p, "reg %llu %llu", (unsigned long long)x.p.main_addr,
                 (unsigned long long)PEER_MAIN_LEN);
    CHECK(r != NULL && atoi(r) == KVT_OK);
    pattern_fill(host, LEN, 60, 0);
    CHECK(devmem_copy(x.dev, host, LEN) == 0);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(ipc_opens() == opens + 2);
    CHECK(ipc_live() == 1);
    r = peer_cmd(&x.p, "check %llu %llu 60", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    dev_pair_end(&x);
    free(host);
}

/*
 * Device memory here, host memory there, over shm: plain memory (through
 * the bounce buffer and cross-memory attach) and kvt_mem_alloc() memory
 * (a device copy into the mapping); contiguous and strided, both ways.
 * And host memory here into the peer's device memory.
 */
static void host_there(int peer_mem)
{
    enum { LEN = 4 << 20, PIECE = 3000, STRIDE = 8192, N = 300 };
    uint8_t *host = malloc(LEN), *orig = malloc(LEN);
    kvt_xfer_desc_t d;
    const char *name = NULL, *r;
    dev_pair_t x;

    dev_pair_with(&x, KVT_TRANSPORT_SHM, LEN, 0, peer_mem);
    CHECK_OK(
        kvt_segment_transport(x.e, x.seg, KVT_MEM_CUDA, KVT_MEM_HOST, &name));
    CHECK(strcmp(name, "shm") == 0);
    /* Contiguous, past the bounce buffer's size. */
    pattern_fill(host, LEN, 81, 0);
    CHECK(devmem_copy(x.dev, host, LEN) == 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, LEN);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    r = peer_cmd(&x.p, "check %llu %llu 81", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    CHECK(devmem_copy(x.dev, memset(host, 0, LEN), LEN) == 0);
    d.opcode = KVT_OP_READ;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    CHECK(pattern_check(host, LEN, 81, 0) == 0);
    /* Strided: N pieces of PIECE bytes every STRIDE here, packed there;
     * read back strided the other way. */
    r = peer_cmd(&x.p, "fill %llu %llu 0", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL);
    pattern_fill(orig, LEN, 82, 0);
    CHECK(devmem_copy(x.dev, orig, LEN) == 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, PIECE);
    d.count = N;
    d.local_stride = STRIDE;
    d.remote_stride = PIECE;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    d.opcode = KVT_OP_READ;
    d.local_addr = (uint8_t *)x.dev + LEN / 2;
    d.local_stride = PIECE;
    d.remote_stride = 0;
    d.count = 1;
    d.length = (uint64_t)N * PIECE;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    for (int k = 0; k < N; k++)
        CHECK(memcmp(host + LEN / 2 + (size_t)k * PIECE,
                     orig + (size_t)k * STRIDE, PIECE) == 0);
    dev_pair_end(&x);
    free(host);
    free(orig);
}

KVT_TEST(device_to_plain_host)
{
    host_there(0);
}

KVT_TEST(device_to_mapped_host)
{
    host_there(2);
}

/* Host memory here into the peer's device memory and back. */
KVT_TEST(host_to_device)
{
    enum { LEN = 4 << 20 };
    peer_opts_t o = {KVT_TRANSPORT_SHM, 0, 0, 0, 1};
    uint8_t *host = malloc(LEN);
    kvt_xfer_desc_t d;
    kvt_segment_t seg;
    const char *name = NULL, *r;
    kvt_engine_h e;
    peer_t p;

    cuda_domain();
    double_open();
    if (no_driver)
        SKIP("needs the driver");
    CHECK(peer_start(&p, &o) == 0);
    e = engine_new(KVT_TRANSPORT_SHM, 0);
    CHECK(e != NULL);
    CHECK_OK(kvt_mem_register(e, host, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    CHECK_OK(kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_CUDA, &name));
    CHECK(strcmp(name, "shm") == 0);
    pattern_fill(host, LEN, 83, 0);
    d = kvt_test_xd(KVT_OP_WRITE, seg, host, p.main_addr, LEN);
    CHECK_OK(kvt_test_xfer(e, &d, 1));
    r = peer_cmd(&p, "check %llu %llu 83", (unsigned long long)p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    memset(host, 0, LEN);
    d.opcode = KVT_OP_READ;
    CHECK_OK(kvt_test_xfer(e, &d, 1));
    CHECK(pattern_check(host, LEN, 83, 0) == 0);
    kvt_engine_destroy(e);
    peer_stop(&p);
    free(host);
}

/*
 * A target whose driver will not share its device memory: transfers with
 * it go through the staging slots, copied by the target itself, both
 * ways, contiguous (larger than a slot) and strided, from device memory
 * and from host memory here; nothing is opened.
 */
KVT_TEST(ipc_refused_stages)
{
    enum { LEN = 3 << 20, PIECE = 3000, STRIDE = 8192, N = 300 };
    uint8_t *host = malloc(LEN), *orig = malloc(LEN);
    uint8_t *hbuf = malloc(LEN);
    kvt_xfer_desc_t d;
    const char *r;
    dev_pair_t x;

    ipc_counters();
    setenv("KVT_CUDA_DOUBLE_NO_IPC", "1", 1); /* the peer's driver */
    dev_pair(&x, KVT_TRANSPORT_SHM, LEN, 0);
    unsetenv("KVT_CUDA_DOUBLE_NO_IPC");
    CHECK(ipc_live() == 0);
    /* Device memory here, contiguous, both ways. */
    pattern_fill(orig, LEN, 91, 0);
    CHECK(devmem_copy(x.dev, orig, LEN) == 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, LEN);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    r = peer_cmd(&x.p, "check %llu %llu 91", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    CHECK(devmem_copy(x.dev, memset(host, 0, LEN), LEN) == 0);
    d.opcode = KVT_OP_READ;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    CHECK(pattern_check(host, LEN, 91, 0) == 0);
    /* Strided pieces here, packed there, and read back packed. */
    pattern_fill(orig, LEN, 92, 0);
    CHECK(devmem_copy(x.dev, orig, LEN) == 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, x.dev, x.p.main_addr, PIECE);
    d.count = N;
    d.local_stride = STRIDE;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    d = kvt_test_xd(KVT_OP_READ, x.seg, (uint8_t *)x.dev + LEN / 2 + 4096,
                    x.p.main_addr, (uint64_t)N * PIECE);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(devmem_copy(host, x.dev, LEN) == 0);
    for (int k = 0; k < N; k++)
        CHECK(memcmp(host + LEN / 2 + 4096 + (size_t)k * PIECE,
                     orig + (size_t)k * STRIDE, PIECE) == 0);
    /* Host memory here. */
    CHECK_OK(kvt_mem_register(x.e, hbuf, LEN, KVT_ACCESS_REMOTE_RW));
    pattern_fill(hbuf, LEN, 93, 0);
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, hbuf, x.p.main_addr, LEN);
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    r = peer_cmd(&x.p, "check %llu %llu 93", (unsigned long long)x.p.main_addr,
                 (unsigned long long)LEN);
    CHECK(r != NULL && strcmp(r, "0") == 0);
    memset(hbuf, 0, LEN);
    d.opcode = KVT_OP_READ;
    CHECK_OK(kvt_test_xfer(x.e, &d, 1));
    CHECK(pattern_check(hbuf, LEN, 93, 0) == 0);
    /* Outside the peer's registry: refused by the target's own check. */
    d = kvt_test_xd(KVT_OP_WRITE, x.seg, hbuf, x.p.guard_addr, 4096);
    CHECK_ST(kvt_test_xfer(x.e, &d, 1), KVT_ERR_ACCESS);
    CHECK(ipc_live() == 0);
    dev_pair_end(&x);
    free(host);
    free(orig);
    free(hbuf);
}

/*
 * The target killed while device copies into its memory are queued: the
 * batch ends (failed, not hung) and the engine opens the next peer.
 */
KVT_TEST(peer_killed_mid_copy)
{
    enum { N = 4096, BLK = 4096 };
    kvt_xfer_desc_t *d = calloc(N, sizeof(*d));
    kvt_batch_state_t bs;
    kvt_batch_h b;
    kvt_status_t st;
    dev_pair_t x;
    peer_t p2;
    peer_opts_t o = {KVT_TRANSPORT_SHM, 0, 0, 0, 1};
    kvt_segment_t seg2;

    dev_pair(&x, KVT_TRANSPORT_SHM, (size_t)N * BLK, 0);
    /* Every other block there: each its own device copy (500 us each in
     * the double), about two seconds of copies in all. */
    for (int i = 0; i < N; i++)
        d[i] =
            kvt_test_xd(KVT_OP_WRITE, x.seg, (uint8_t *)x.dev + (size_t)i * BLK,
                        x.p.main_addr + (uint64_t)i * 2 * BLK, BLK);
    CHECK_OK(kvt_batch_create(x.e, N, &b));
    CHECK_OK(kvt_batch_submit(b, d, N));
    usleep(100000);
    kvt_batch_query(b, &bs);
    CHECK(bs.completed < N); /* still copying */
    peer_kill(&x.p, SIGKILL);
    st = kvt_batch_wait(b, 30000);
    CHECK(st != KVT_INPROGRESS && st != KVT_OK);
    kvt_batch_query(b, &bs);
    CHECK(bs.failed > 0);
    CHECK_OK(kvt_batch_free(b));
    CHECK(peer_start(&p2, &o) == 0);
    CHECK_OK(kvt_segment_open(x.e, p2.segment, &seg2));
    d[0] = kvt_test_xd(KVT_OP_WRITE, seg2, x.dev, p2.main_addr, BLK);
    CHECK_OK(kvt_test_xfer(x.e, d, 1));
    peer_stop(&p2);
    dev_pair_end(&x);
    free(d);
}

int main(int argc, char **argv)
{
    static const kvt_test_case_t cases[] = {
        KVT_CASE(domain, 30),
        KVT_CASE(detect, 30),
        KVT_CASE(no_driver_refuses, 30),
        KVT_CASE(alloc_device, 30),
        KVT_CASE(mem_copy, 30),
        KVT_CASE(same_host_device_routes, 60),
        KVT_CASE(same_host_host_only, 30),
        KVT_CASE(device_copy_fails, 60),
        KVT_CASE(device_copy_fails_shm, 60),
        KVT_CASE(copy_ahead_fails, 60),
        KVT_CASE(unregister_under_load, 60),
        KVT_CASE(unregister_under_load_shm, 60),
        KVT_CASE(ipc_cached, 60),
        KVT_CASE(device_to_plain_host, 60),
        KVT_CASE(device_to_mapped_host, 60),
        KVT_CASE(host_to_device, 60),
        KVT_CASE(ipc_refused_stages, 60),
        KVT_CASE(peer_killed_mid_copy, 60)};

    if (argc > 1 && strcmp(argv[1], "--no-driver") == 0) {
        no_driver = 1;
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
