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

#include "kvt_test.h"

static int no_driver;

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
} cu;

/* The double, opened by this test itself (the same instance kvt loads,
 * unless kvt is told to load none). */
static void double_open(void)
{
    const char *path = getenv("KVT_TEST_CUDA_DOUBLE");
    void *h;

    if (path == NULL)
        SKIP("KVT_TEST_CUDA_DOUBLE is not set");
    h = dlopen(path, RTLD_NOW);
    CHECK(h != NULL);
#define S(f, n)                                                                \
    do {                                                                       \
        *(void **)&cu.f = dlsym(h, n);                                         \
        CHECK(cu.f != NULL);                                                   \
    } while (0)
    S(Init, "cuInit");
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    S(CtxSetCurrent, "cuCtxSetCurrent");
    S(MemAlloc, "cuMemAlloc_v2");
    S(MemFree, "cuMemFree_v2");
    S(MemHostAlloc, "cuMemHostAlloc");
    S(MemFreeHost, "cuMemFreeHost");
#undef S
    CHECK(cu.Init(0) == CUDA_SUCCESS);
}

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
    CHECK_ST(kvt_mem_register_ex(e, (void *)(d1 + (1 << 20) - 4096), 8192,
                                 NULL),
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

int main(int argc, char **argv)
{
    static const kvt_test_case_t cases[] = {
        KVT_CASE(domain, 30), KVT_CASE(detect, 30),
        KVT_CASE(no_driver_refuses, 30)};

    if (argc > 1 && strcmp(argv[1], "--no-driver") == 0) {
        no_driver = 1;
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
