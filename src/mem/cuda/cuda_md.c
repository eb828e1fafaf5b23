/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA memory domain: device memory the driver knows, told apart at
 * registration by cuPointerGetAttributes() (memory type, device ordinal,
 * the mappings that hold it), recorded as kind KVT_MEM_CUDA on its device.
 * The driver is loaded at run time (cuda.c); without one this domain
 * detects nothing and refuses a stated "cuda:N", and device pointers fail
 * as host memory does not hold them (mem/host.c).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mem/cuda/cuda_drv.h"
#include "mem/md.h"
#include "util/log.h"

#define MAX_DEVICES 64

/*
 * Whether the driver is in the process already, and initialised: device
 * memory cannot exist before, so registrations in a process that never
 * initialised it do not pay for loading and initialising it (nor leave a
 * child it forks without CUDA, which a cuInit() here would). Asked with
 * cuCtxGetCurrent(), which answers CUDA_ERROR_NOT_INITIALIZED before
 * cuInit() (and in a child forked after it).
 */
static int driver_present(void)
{
    static _Atomic int present; /* once initialised, it stays */
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    CUresult (*cur)(CUcontext *);
    CUcontext c = NULL;
    void *h;

    if (present)
        return 1;
    h = dlopen(lib != NULL && lib[0] != '\0' ? lib : "libcuda.so.1",
               RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        return 0;
    *(void **)&cur = dlsym(h, "cuCtxGetCurrent");
    if (cur != NULL && cur(&c) != CUDA_ERROR_NOT_INITIALIZED)
        present = 1;
    dlclose(h);
    return present;
}

static int cuda_detect(const void *addr, size_t len, int32_t *device_p)
{
    /* A range that starts in device memory but overruns it is refused
     * here (-1), rather than taken for host memory. */
    int32_t dev = -1;
    int c;

    if (!driver_present())
        return 0;
    c = kvt__cuda_classify(addr, len, &dev);
    if (c > 0)
        *device_p = dev;
    return c;
}

static kvt_status_t cuda_check(const void *addr, size_t len, int32_t device)
{
    int32_t dev = -1;
    int c;

    if (kvt__cuda() == NULL) {
        KVT_LOG_E("register: [%p, +%zu) is stated to be CUDA memory, but "
                  "%s",
                  addr, len, kvt__cuda_why());
        return KVT_ERR_NOT_SUPPORTED;
    }
    c = kvt__cuda_classify(addr, len, &dev);
    if (c < 0)
        return KVT_ERR_NOT_SUPPORTED;
    if (c == 0) {
        KVT_LOG_E("register: [%p, +%zu) is stated to be memory of cuda:%d, "
                  "but the driver does not know it as device memory",
                  addr, len, (int)device);
        return KVT_ERR_NOT_SUPPORTED;
    }
    if (dev != device) {
        KVT_LOG_E("register: [%p, +%zu) is stated to be memory of cuda:%d, "
                  "but it is on cuda:%d",
                  addr, len, (int)device, (int)dev);
        return KVT_ERR_NOT_SUPPORTED;
    }
    return KVT_OK;
}

static int cuda_query(int32_t *devices_p, const char **detail_p)
{
    static _Thread_local char buf[512];
    const kvt__cuda_drv_t *d = kvt__cuda();
    size_t n;

    *devices_p = d != NULL ? d->ndevices : 0;
    *detail_p = kvt__cuda_why();
    if (d == NULL)
        return 0;
    /* Devices whose context is lost, named after the driver's line. */
    n = (size_t)snprintf(buf, sizeof(buf), "%s", *detail_p);
    for (int i = 0; i < d->ndevices && n < sizeof(buf); i++)
        if (kvt__cuda_lost(i) != 0)
            n += (size_t)snprintf(buf + n, sizeof(buf) - n,
                                  "; device %d lost (%s)", i,
                                  kvt__cuda_err((CUresult)kvt__cuda_lost(i)));
    *detail_p = buf;
    return 1;
}

static kvt_status_t cuda_alloc(size_t len, int32_t device, void **addr_p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    CUdeviceptr p = 0;
    CUresult r;

    if (d == NULL) {
        KVT_LOG_E("alloc: no CUDA memory: %s", kvt__cuda_why());
        return KVT_ERR_NOT_SUPPORTED;
    }
    if (d->MemAlloc == NULL || d->MemFree == NULL) {
        KVT_LOG_E("alloc: the CUDA driver lacks cuMemAlloc_v2");
        return KVT_ERR_NOT_SUPPORTED;
    }
    if (device < 0 || device >= d->ndevices) {
        KVT_LOG_E("alloc: no CUDA device %d (%d found)", (int)device,
                  d->ndevices);
        return KVT_ERR_INVALID_PARAM;
    }
    if (kvt__cuda_enter(device, &prev) != 0)
        return KVT_ERR_IO;
    r = kvt__cuda_check(device, d->MemAlloc(&p, len));
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        KVT_LOG_E("alloc: %zu bytes on cuda:%d: %s", len, (int)device,
                  kvt__cuda_err(r));
        return r == CUDA_ERROR_OUT_OF_MEMORY ? KVT_ERR_NO_MEMORY : KVT_ERR_IO;
    }
    *addr_p = (void *)(uintptr_t)p;
    return KVT_OK;
}

static void cuda_free(void *addr, size_t len, int32_t device)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;

    (void)len;
    if (d == NULL || d->MemFree == NULL || kvt__cuda_enter(device, &prev) != 0)
        return;
    d->MemFree((CUdeviceptr)(uintptr_t)addr);
    kvt__cuda_leave(prev);
}

/*
 * Streams for cuda_copy(), per device: non-blocking, so that a copy never
 * waits for the application's work on its blocking streams (the legacy
 * NULL stream does), nor for a host function holding one of them (a
 * stream-ordered transfer into this process would then wait for itself).
 * A few are kept for reuse; the device's context is current in callers.
 */
#define COPY_STREAMS 4
static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream copy_streams[MAX_DEVICES][COPY_STREAMS];
static int ncopy_streams[MAX_DEVICES];

static CUresult copy_stream_get(const kvt__cuda_drv_t *d, int dev, CUstream *s)
{
    pthread_mutex_lock(&copy_lock);
    *s =
        ncopy_streams[dev] > 0 ? copy_streams[dev][--ncopy_streams[dev]] : NULL;
    pthread_mutex_unlock(&copy_lock);
    return *s != NULL ? CUDA_SUCCESS
                      : d->StreamCreate(s, CU_STREAM_NON_BLOCKING);
}

static void copy_stream_put(const kvt__cuda_drv_t *d, int dev, CUstream s)
{
    pthread_mutex_lock(&copy_lock);
    if (ncopy_streams[dev] < COPY_STREAMS) {
        copy_streams[dev][ncopy_streams[dev]++] = s;
        s = NULL;
    }
    pthread_mutex_unlock(&copy_lock);
    if (s != NULL)
        d->StreamDestroy(s);
}

static int cuda_copy(void *dst, const void *src, size_t len)
{
    const kvt__cuda_drv_t *d;
    int32_t dd = -1, sd = -1;
    int cd, cs;
    CUcontext prev;
    CUstream st;
    CUresult r;

    if (!driver_present())
        return 0;
    if ((d = kvt__cuda()) == NULL) {
        /* The application's driver is there, kvt cannot use it (a child
         * forked after the driver was initialised, say): host memory is
         * copied as such; anything else may be device memory, which host
         * code must not touch. */
        if (kvt__host_readable(dst, len) && kvt__host_readable(src, len))
            return 0;
        KVT_LOG_E("copy: [%p, +%zu) or [%p, +%zu) is not host memory, and "
                  "kvt cannot use the CUDA driver: %s",
                  dst, len, src, len, kvt__cuda_why());
        return -1;
    }
    cd = kvt__cuda_classify(dst, len, &dd);
    cs = kvt__cuda_classify(src, len, &sd);
    if (cd < 0 || cs < 0)
        return -1; /* runs past its allocation: logged */
    if (cd == 0 && cs == 0)
        return 0;
    if (cd == 0)
        dd = sd; /* the device whose context copies */
    if (kvt__cuda_enter(dd, &prev) != 0)
        return -1;
    r = copy_stream_get(d, dd, &st);
    if (r == CUDA_SUCCESS) {
        r = d->MemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                           (CUdeviceptr)(uintptr_t)src, len, st);
        if (r == CUDA_SUCCESS)
            r = kvt__cuda_check(dd, d->StreamSynchronize(st));
        /* A stream whose copy failed is not reused. */
        if (r == CUDA_SUCCESS)
            copy_stream_put(d, dd, st);
        else
            d->StreamDestroy(st);
    }
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        KVT_LOG_E("copy: %zu bytes to %p from %p: %s", len, dst, src,
                  kvt__cuda_err(r));
        return -1;
    }
    return 1;
}

KVT_MEM_DOMAIN_REGISTER(cuda, {
                                  .name = "cuda",
                                  .kind = KVT_MEM_CUDA,
                                  .detect = cuda_detect,
                                  .check = cuda_check,
                                  .query = cuda_query,
                                  .alloc = cuda_alloc,
                                  .free = cuda_free,
                                  .copy = cuda_copy,
                              });
