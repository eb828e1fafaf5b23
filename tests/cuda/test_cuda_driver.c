/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt against the driver's rules, as the test double enforces them
 * (tests/cuda/README.md): the driver loaded only once device memory is in
 * play (a child forked after engine creation can still use CUDA);
 * memory of the virtual-memory API and of pools (registration checks what
 * is mapped; legacy IPC export refused with its reason, the allocation's
 * base taken from cuMemGetAddressRange()); registering 65,536 device
 * regions; several devices (no context made on a device nobody uses, a
 * stream per device); a lost context refused cleanly; copies that do not
 * wait for the application's blocking streams.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "double.h"
#include "kvt_test.h"
#include "xfer_test.h"
#include <kvt/log.h>
#include "mem/cuda/cuda_drv.h"
#include "mem/dev.h"

static void *dbl;

/* A symbol of the double (opened by double_open()). */
static void *sym(const char *name)
{
    void *f;

    if (dbl == NULL)
        dbl = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);
    CHECK(dbl != NULL);
    f = dlsym(dbl, name);
    CHECK(f != NULL);
    return f;
}

static void use_dev(int dev)
{
    CUcontext c;

    CHECK(cu.DevicePrimaryCtxRetain(&c, dev) == CUDA_SUCCESS);
    CHECK(cu.CtxSetCurrent(c) == CUDA_SUCCESS);
}

static CUdeviceptr dev_alloc(int dev, size_t len)
{
    CUdeviceptr p = 0;

    use_dev(dev);
    CHECK(cu.MemAlloc(&p, len) == CUDA_SUCCESS);
    return p;
}

static kvt_engine_h engine(uint32_t transports)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e;

    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    p.local_host = "127.0.0.1";
    if (transports != 0) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        p.transports = transports;
    }
    CHECK_OK(kvt_engine_create(&p, &e));
    return e;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- The driver loaded only for device memory --------------------------- */

/*
 * An engine that moves host memory never loads the driver, so a child
 * forked after it was created initialises CUDA and uses device memory
 * (the double refuses cuInit in a child of a process that called it, as
 * the driver does).
 */
KVT_TEST(fork_after_engine)
{
    const char *lib = getenv("KVT_TEST_CUDA_DOUBLE");
    uint8_t *buf = malloc(1 << 20);
    kvt_engine_h e;
    int status;
    pid_t pid;

    if (lib == NULL)
        SKIP("KVT_TEST_CUDA_DOUBLE is not set");
    e = engine(0); /* every transport built: tcp, shm, ucx */
    CHECK_OK(kvt_mem_register(e, buf, 1 << 20, KVT_ACCESS_REMOTE_RW));
    /* Host memory moved over tcp and shm, and engines and connections
     * torn down: none of it loads the driver either. */
    for (uint32_t t = KVT_TRANSPORT_TCP; t <= KVT_TRANSPORT_SHM; t <<= 1) {
        uint8_t *src = malloc(1 << 16);
        kvt_engine_h i = engine(t);
        kvt_segment_t seg;
        kvt_xfer_desc_t d;
        memset(src, 3, 1 << 16);
        CHECK_OK(kvt_mem_register(i, src, 1 << 16, KVT_ACCESS_REMOTE_RW));
        CHECK_OK(kvt_segment_open(i, kvt_engine_segment_name(e), &seg));
        d = kvt_test_xd(KVT_OP_WRITE, seg, src, (uint64_t)(uintptr_t)buf,
                        1 << 16);
        CHECK_OK(kvt_test_xfer(i, &d, 1));
        CHECK(buf[100] == 3);
        CHECK_OK(kvt_segment_close(i, seg));
        kvt_engine_destroy(i);
        free(src);
    }
    CHECK(dlopen(lib, RTLD_NOW | RTLD_NOLOAD) == NULL); /* never loaded */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* No thread is started here: a sanitizer may not follow a fork
         * of a threaded process with new threads. */
        kvt_mem_domain_info_t d[8];
        size_t n = 0, k;
        void *h = dlopen(lib, RTLD_NOW);
        CUresult (*init)(unsigned) =
            h ? (CUresult(*)(unsigned))(uintptr_t)dlsym(h, "cuInit") : NULL;
        if (init == NULL || init(0) != CUDA_SUCCESS)
            _exit(2);
        /* kvt here too: the driver is usable, and device memory is
         * told apart. */
        if (kvt_mem_domains(d, 8, &n) != KVT_OK)
            _exit(3);
        for (k = 0; k < n && d[k].kind != KVT_MEM_CUDA; k++)
            ;
        if (k == n || !d[k].available)
            _exit(4);
        double_open();
        {
            int32_t dev = -1;
            CUdeviceptr p = dev_alloc(1, 1 << 20);
            if (kvt__cuda_classify((void *)p, 1 << 20, &dev) != 1 || dev != 1)
                _exit(5);
        }
        _exit(0);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kvt_mem_unregister(e, buf);
    kvt_engine_destroy(e);
    free(buf);
}

/* A child forked after the parent's kvt initialised the driver: device
 * memory is refused there, saying why, and nothing calls the driver. */
KVT_TEST(forked_child_refuses)
{
    kvt_mem_params_t mp = {0};
    kvt_engine_h e;
    void *m = NULL;
    int status;
    pid_t pid;

    double_open();
    e = engine(KVT_TRANSPORT_TCP);
    mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    mp.kind = KVT_MEM_CUDA;
    mp.device = 0;
    CHECK_OK(kvt_mem_alloc_ex(e, 1 << 20, &mp, &m));
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        kvt_mem_domain_info_t d[8];
        void *m2 = NULL;
        size_t n = 0;
        int said = 0;
        if (kvt_mem_alloc_ex(e, 1 << 20, &mp, &m2) != KVT_ERR_NOT_SUPPORTED)
            _exit(2);
        if (kvt_mem_domains(d, 8, &n) != KVT_OK)
            _exit(3);
        for (size_t i = 0; i < n; i++)
            if (d[i].kind == KVT_MEM_CUDA && !d[i].available &&
                strstr(d[i].detail, "forked") != NULL)
                said = 1;
        _exit(said ? 0 : 4);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kvt_engine_destroy(e);
}

/* ---- Virtual-memory API and pools ---------------------------------------- */

typedef struct {
    CUdeviceptr base; /* 8 MiB reserved: [0, 4 MiB) mapped, two pieces */
} vmm_t;

static void vmm_make(vmm_t *v, int dev)
{
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                        unsigned long long) =
        (CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                     unsigned long long))(uintptr_t)sym("cuMemAddressReserve");
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
                       const CUmemAllocationProp *, unsigned long long) =
        (CUresult(*)(CUmemGenericAllocationHandle *, size_t,
                     const CUmemAllocationProp *,
                     unsigned long long))(uintptr_t)sym("cuMemCreate");
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long) =
        (CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                     unsigned long long))(uintptr_t)sym("cuMemMap");
    CUmemAllocationProp prop = {0};
    CUmemGenericAllocationHandle h[2];
    const size_t MiB = 1 << 20;

    use_dev(dev);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CHECK(reserve(&v->base, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CHECK(create(&h[i], 2 * MiB, &prop, 0) == CUDA_SUCCESS);
        CHECK(map(v->base + (size_t)i * 2 * MiB, 2 * MiB, 0, h[i], 0) ==
              CUDA_SUCCESS);
    }
}

/*
 * Registration checks what is mapped, not the reservation: a range across
 * two adjacent mappings is device memory, one running into the unmapped
 * part is refused (a copy there would lose the context). Copies across the
 * mappings work; a copy into the hole is refused before it reaches the
 * device, which stays usable.
 */
KVT_TEST(vmm_registration)
{
    const size_t MiB = 1 << 20;
    uint8_t *a = malloc(2 * MiB), *b = calloc(1, 2 * MiB);
    kvt_engine_h e;
    vmm_t v;

    double_open();
    e = engine(KVT_TRANSPORT_TCP);
    vmm_make(&v, 1);
    CHECK_OK(kvt_mem_register(e, (void *)(v.base + MiB), 2 * MiB,
                              KVT_ACCESS_REMOTE_RW));
    CHECK_ST(kvt_mem_register(e, (void *)(v.base + 3 * MiB), 2 * MiB,
                              KVT_ACCESS_REMOTE_RW),
             KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt_mem_register(e, (void *)(v.base + 5 * MiB), MiB,
                              KVT_ACCESS_REMOTE_RW),
             KVT_ERR_NOT_SUPPORTED);
    for (size_t i = 0; i < 2 * MiB; i++)
        a[i] = (uint8_t)(i * 7 + 3);
    CHECK_OK(kvt_mem_copy((void *)(v.base + MiB), a, 2 * MiB));
    CHECK_OK(kvt_mem_copy(b, (void *)(v.base + MiB), 2 * MiB));
    CHECK(memcmp(a, b, 2 * MiB) == 0);
    CHECK_ST(kvt_mem_copy((void *)(v.base + 3 * MiB), a, 2 * MiB), KVT_ERR_IO);
    /* Not sent to the device: its context is not lost. */
    CHECK_OK(kvt_mem_copy(b, (void *)(v.base + MiB), 2 * MiB));
    CHECK_OK(kvt_mem_unregister(e, (void *)(v.base + MiB)));
    kvt_engine_destroy(e);
    free(a);
    free(b);
}

/*
 * Export for same-host peers: the allocation's base and size from
 * cuMemGetAddressRange() (the double refuses an inner address, as the
 * driver's reference says it may); memory legacy IPC does not share is
 * refused saying so.
 */
KVT_TEST(ipc_export)
{
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = (CUresult(*)(
        CUdeviceptr *, size_t, CUstream))(uintptr_t)sym("cuMemAllocAsync");
    uint8_t handle[KVT__DEV_IPC_BYTES];
    uint64_t base = 0, size = 0;
    const char *why = NULL;
    CUdeviceptr p, pool;
    vmm_t v;

    double_open();
    p = dev_alloc(1, 1 << 20);
    CHECK(kvt__dev_ipc_export((void *)(p + 8192), 4096, 1, &base, &size, handle,
                              &why) == 0);
    CHECK(base == p && size == 1 << 20);
    vmm_make(&v, 1);
    CHECK(kvt__dev_ipc_export((void *)(v.base + 4096), 4096, 1, &base, &size,
                              handle, &why) == -1);
    CHECK(why != NULL && strstr(why, "virtual-memory API") != NULL);
    use_dev(1);
    CHECK(alloc_async(&pool, 1 << 20, NULL) == CUDA_SUCCESS);
    why = NULL;
    CHECK(kvt__dev_ipc_export((void *)pool, 4096, 1, &base, &size, handle,
                              &why) == -1);
    CHECK(why != NULL && strstr(why, "memory pool") != NULL);
}

/* ---- Registering many device regions ------------------------------------- */

/*
 * 65,536 device regions (64 allocations of 1 MiB, 1 KiB each) in a process
 * with 4,000 other mappings: registration asks the driver, not the
 * process's map, and takes under a second.
 */
KVT_TEST(register_many)
{
    enum { ALLOCS = 64, PER = 1024, N = ALLOCS * PER, GAPS = 4000 };
    kvt_mem_region_t *r = calloc(N, sizeof(*r));
    uint8_t *gaps;
    kvt_engine_h e;
    double t0, t;
    size_t k = 0;

    double_open();
    /* A process's map with thousands of lines: alternate protections so
     * that the pages do not merge. */
    gaps = mmap(NULL, (size_t)2 * GAPS * 4096, PROT_READ,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(gaps != MAP_FAILED);
    for (int i = 0; i < GAPS; i++)
        CHECK(mprotect(gaps + (size_t)2 * i * 4096, 4096, PROT_NONE) == 0);
    e = engine(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM);
    for (int a = 0; a < ALLOCS; a++) {
        CUdeviceptr p = dev_alloc(a % 2, (size_t)PER * 1024);
        for (int i = 0; i < PER; i++, k++)
            r[k] = (kvt_mem_region_t){(void *)(p + (size_t)i * 1024),
                                      1024,
                                      KVT_ACCESS_REMOTE_RW,
                                      KVT_MEM_AUTO,
                                      0,
                                      0};
    }
    t0 = now_s();
    CHECK_OK(kvt_mem_register_batch(e, r, N));
    t = now_s() - t0;
    printf("registered %d device regions in %.3f s (%.2f us each)\n", N, t,
           t * 1e6 / N);
    /* The bar is the product build's; a sanitizer's runs several times
     * slower (kvt_test_slowdown()). */
    CHECK(t < 1.0 * kvt_test_slowdown());
    /* One by one: the same cost per region. */
    CHECK_OK(kvt_mem_unregister(e, r[0].addr));
    CHECK_OK(kvt_mem_unregister(e, r[1].addr));
    t0 = now_s();
    CHECK_OK(kvt_mem_register(e, r[0].addr, 1024, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(e, r[1].addr, 1024, KVT_ACCESS_REMOTE_RW));
    t = now_s() - t0;
    printf("two more one by one in %.1f us\n", t * 1e6);
    CHECK(t < 0.01 * kvt_test_slowdown());
    kvt_engine_destroy(e);
    munmap(gaps, (size_t)2 * GAPS * 4096);
    free(r);
}

/* ---- Several devices ------------------------------------------------------
 */

/*
 * Device memory on devices 1 and 17 only (20 devices): staging over tcp
 * frees its pinned buffers without making a context on device 0, and one
 * connection copies into each device on a stream of that device (none on
 * another device's stream), both ways.
 */
KVT_TEST(devices_apart)
{
    long (*retains)(int) =
        (long (*)(int))(uintptr_t)sym("kvt_cuda_double_ctx_retains");
    long (*cross)(void) =
        (long (*)(void))(uintptr_t)sym("kvt_cuda_double_cross_device_copies");
    enum { LEN = 1 << 20 };
    uint8_t *src = malloc(2 * LEN), *back = calloc(1, 2 * LEN);
    kvt_engine_h t, i;
    kvt_xfer_desc_t d[4];
    kvt_segment_t seg;
    CUdeviceptr t1, t17, i1, i17;

    double_open();
    t = engine(KVT_TRANSPORT_TCP);
    i = engine(KVT_TRANSPORT_TCP);
    t1 = dev_alloc(1, LEN);
    t17 = dev_alloc(17, LEN);
    i1 = dev_alloc(1, LEN);
    i17 = dev_alloc(17, LEN);
    CHECK(cu.CtxSetCurrent(NULL) == CUDA_SUCCESS);
    CHECK_OK(kvt_mem_register(t, (void *)t1, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(t, (void *)t17, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(i, (void *)i1, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(i, (void *)i17, LEN, KVT_ACCESS_REMOTE_RW));
    for (size_t k = 0; k < 2 * LEN; k++)
        src[k] = (uint8_t)(k * 13 + 1);
    CHECK_OK(kvt_mem_copy((void *)i1, src, LEN));
    CHECK_OK(kvt_mem_copy((void *)i17, src + LEN, LEN));
    CHECK_OK(kvt_segment_open(i, kvt_engine_segment_name(t), &seg));
    /* Writes from both devices to both devices, one connection. */
    d[0] = kvt_test_xd(KVT_OP_WRITE, seg, (void *)i1, t17, LEN);
    d[1] = kvt_test_xd(KVT_OP_WRITE, seg, (void *)i17, t1, LEN);
    CHECK_OK(kvt_test_xfer(i, d, 2));
    CHECK_OK(kvt_mem_copy(back, (void *)t17, LEN));
    CHECK_OK(kvt_mem_copy(back + LEN, (void *)t1, LEN));
    CHECK(memcmp(back, src, 2 * LEN) == 0);
    /* Reads back, crossed again. */
    d[2] = kvt_test_xd(KVT_OP_READ, seg, (void *)i1, t1, LEN);
    d[3] = kvt_test_xd(KVT_OP_READ, seg, (void *)i17, t17, LEN);
    CHECK_OK(kvt_test_xfer(i, d + 2, 2));
    CHECK_OK(kvt_mem_copy(back, (void *)i17, LEN));
    CHECK(memcmp(back, src, LEN) == 0);
    CHECK_OK(kvt_mem_copy(back, (void *)i1, LEN));
    CHECK(memcmp(back, src + LEN, LEN) == 0);
    CHECK_OK(kvt_segment_close(i, seg));
    kvt_engine_destroy(i);
    kvt_engine_destroy(t);
    printf("contexts retained on device 0: %ld; cross-device copies: %ld\n",
           retains(0), cross());
    CHECK(retains(0) == 0);
    CHECK(cross() == 0);
    free(src);
    free(back);
}

/* ---- A lost context ------------------------------------------------------ */

static _Atomic int lost_lines;

static void count_lost(void *arg, kvt_log_level_t level, const char *file,
                       int line, const char *msg)
{
    (void)arg;
    (void)level;
    (void)file;
    (void)line;
    if (strstr(msg, "context of device 0 is lost") != NULL)
        lost_lines++;
}

/*
 * A copy that fails on the device loses the context (sticky, as on the
 * driver): its transfer fails with KVT_ERR_IO, kvt says so once, later
 * device work fails at once without reaching the driver, kvt_mem_domains()
 * names the lost device, and host memory still moves.
 */
KVT_TEST(lost_context)
{
    void (*fail_copy)(long) =
        (void (*)(long))(uintptr_t)sym("kvt_cuda_double_fail_copy");
    long (*lost_calls)(void) =
        (long (*)(void))(uintptr_t)sym("kvt_cuda_double_lost_calls");
    long calls;
    enum { LEN = 1 << 20 };
    uint8_t *hs = malloc(LEN), *ht = calloc(1, LEN);
    kvt_mem_domain_info_t dom[8];
    kvt_engine_h t, i;
    kvt_xfer_desc_t d;
    kvt_segment_t seg;
    CUdeviceptr dv;
    size_t n = 0;
    int named = 0;
    double t0;

    double_open();
    kvt_log_set_handler(count_lost, NULL);
    t = engine(KVT_TRANSPORT_TCP);
    i = engine(KVT_TRANSPORT_TCP);
    dv = dev_alloc(0, LEN);
    CHECK(cu.CtxSetCurrent(NULL) == CUDA_SUCCESS);
    memset(hs, 5, LEN);
    CHECK_OK(kvt_mem_register(t, ht, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(i, hs, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(i, (void *)dv, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(i, kvt_engine_segment_name(t), &seg));
    d = kvt_test_xd(KVT_OP_WRITE, seg, (void *)dv, (uint64_t)(uintptr_t)ht,
                    LEN);
    CHECK_OK(kvt_test_xfer(i, &d, 1));
    fail_copy(1);
    CHECK_ST(kvt_test_xfer(i, &d, 1), KVT_ERR_IO);
    /* From now on kvt refuses the device itself: no call reaches the
     * driver under the lost context (the double counts them). */
    calls = lost_calls();
    t0 = now_s();
    CHECK_ST(kvt_test_xfer(i, &d, 1), KVT_ERR_IO);
    d.opcode = KVT_OP_READ;
    CHECK_ST(kvt_test_xfer(i, &d, 1), KVT_ERR_IO);
    CHECK_ST(kvt_mem_copy(hs, (void *)dv, 4096), KVT_ERR_IO);
    CHECK(now_s() - t0 < 2.0);
    printf("driver calls under the lost context after kvt knew: %ld\n",
           lost_calls() - calls);
    CHECK(lost_calls() == calls);
    CHECK(lost_lines == 1);
    CHECK_OK(kvt_mem_domains(dom, 8, &n));
    for (size_t k = 0; k < n; k++)
        if (dom[k].kind == KVT_MEM_CUDA &&
            strstr(dom[k].detail, "device 0 lost") != NULL)
            named = 1;
    CHECK(named);
    /* Host memory is not affected. */
    d = kvt_test_xd(KVT_OP_WRITE, seg, hs, (uint64_t)(uintptr_t)ht, LEN);
    CHECK_OK(kvt_test_xfer(i, &d, 1));
    CHECK(memcmp(hs, ht, LEN) == 0);
    kvt_log_set_handler(NULL, NULL);
    CHECK_OK(kvt_segment_close(i, seg));
    kvt_engine_destroy(i);
    kvt_engine_destroy(t);
    free(hs);
    free(ht);
}

/* ---- The application's streams --------------------------------------------
 */

static _Atomic int release;

static void hold(void *arg)
{
    (void)arg;
    while (!release)
        usleep(1000);
}

/*
 * kvt's copies never wait for the application's blocking streams (the
 * legacy NULL stream would: the double orders it with them, as the driver
 * does): a copy completes while the application's stream is held.
 */
KVT_TEST(copy_beside_busy_stream)
{
    enum { LEN = 1 << 16 };
    uint8_t *a = malloc(LEN), *b = calloc(1, LEN);
    CUdeviceptr p;
    CUstream app;

    double_open();
    p = dev_alloc(0, LEN);
    CHECK(cu.StreamCreate(&app, 0) == CUDA_SUCCESS); /* blocking */
    CHECK(cu.LaunchHostFunc(app, hold, NULL) == CUDA_SUCCESS);
    memset(a, 9, LEN);
    CHECK_OK(kvt_mem_copy((void *)p, a, LEN));
    CHECK_OK(kvt_mem_copy(b, (void *)p, LEN));
    CHECK(memcmp(a, b, LEN) == 0);
    release = 1;
    CHECK(cu.StreamSynchronize(app) == CUDA_SUCCESS);
    CHECK(cu.StreamDestroy(app) == CUDA_SUCCESS);
    free(a);
    free(b);
}

KVT_TEST_MAIN(KVT_CASE(fork_after_engine, 30),
              KVT_CASE(forked_child_refuses, 30),
              KVT_CASE(vmm_registration, 30), KVT_CASE(ipc_export, 30),
              KVT_CASE(register_many, 60), KVT_CASE(devices_apart, 60),
              KVT_CASE(lost_context, 60), KVT_CASE(copy_beside_busy_stream, 30))
