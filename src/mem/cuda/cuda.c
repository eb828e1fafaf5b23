/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA memory domain: device memory the driver knows, told apart at
 * registration by cuPointerGetAttributes() (memory type, device ordinal,
 * the allocation that holds it), recorded as
 * kind KVT_MEM_CUDA on its device. The driver is loaded at run time
 * (cuda_drv.h); without one this domain detects nothing and refuses a
 * stated "cuda:N", and device pointers fail as host memory does not hold
 * them (mem/host.c).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda/cuda_drv.h"
#include "mem/dev.h"
#include "mem/md.h"
#include "util/log.h"

#define MAX_DEVICES 64

static kvt__cuda_drv_t drv;
static const kvt__cuda_drv_t *_Atomic loaded; /* set once, by load() */
static char why[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[MAX_DEVICES];

static int sym(void *h, const char *name, void *fn_p, int optional)
{
    void *f = dlsym(h, name);

    if (f == NULL && !optional) {
        snprintf(why, sizeof(why), "the CUDA driver lacks %s", name);
        return -1;
    }
    memcpy(fn_p, &f, sizeof(f));
    return 0;
}

static void load(void)
{
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    CUresult r;
    void *h;

    if (lib == NULL || lib[0] == '\0')
        lib = "libcuda.so.1";
    h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, sizeof(why), "no CUDA driver (%s)", dlerror());
        return;
    }
#define SYM(field, name) sym(h, name, &drv.field, 0)
    if (SYM(Init, "cuInit") || SYM(DriverGetVersion, "cuDriverGetVersion") ||
        SYM(GetErrorString, "cuGetErrorString") ||
        SYM(DeviceGetCount, "cuDeviceGetCount") ||
        SYM(DeviceGet, "cuDeviceGet") ||
        SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
        SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") ||
        SYM(CtxSetCurrent, "cuCtxSetCurrent") ||
        SYM(CtxGetCurrent, "cuCtxGetCurrent") ||
        SYM(PointerGetAttributes, "cuPointerGetAttributes") ||
        SYM(MemcpyAsync, "cuMemcpyAsync") ||
        SYM(StreamCreate, "cuStreamCreate") ||
        SYM(StreamDestroy, "cuStreamDestroy_v2") ||
        SYM(StreamSynchronize, "cuStreamSynchronize") ||
        SYM(EventCreate, "cuEventCreate") ||
        SYM(EventRecord, "cuEventRecord") ||
        SYM(EventSynchronize, "cuEventSynchronize") ||
        SYM(EventDestroy, "cuEventDestroy_v2") ||
        SYM(MemHostAlloc, "cuMemHostAlloc") ||
        SYM(MemFreeHost, "cuMemFreeHost")) {
        dlclose(h);
        return;
    }
#undef SYM
    sym(h, "cuIpcGetMemHandle", &drv.IpcGetMemHandle, 1);
    sym(h, "cuIpcOpenMemHandle_v2", &drv.IpcOpenMemHandle, 1);
    sym(h, "cuIpcCloseMemHandle", &drv.IpcCloseMemHandle, 1);
    sym(h, "cuMemcpy2DAsync_v2", &drv.Memcpy2DAsync, 1);
    sym(h, "cuLaunchHostFunc", &drv.LaunchHostFunc, 1);
    sym(h, "cuMemAlloc_v2", &drv.MemAlloc, 1);
    sym(h, "cuMemFree_v2", &drv.MemFree, 1);
    r = drv.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        drv.GetErrorString(r, &s);
        snprintf(why, sizeof(why), "cuInit failed: %s (%d)",
                 s != NULL ? s : "unknown error", (int)r);
        dlclose(h);
        return;
    }
    if (drv.DriverGetVersion(&drv.version) != CUDA_SUCCESS)
        drv.version = 0;
    if (drv.DeviceGetCount(&drv.ndevices) != CUDA_SUCCESS ||
        drv.ndevices <= 0) {
        snprintf(why, sizeof(why), "the CUDA driver found no device");
        dlclose(h);
        return;
    }
    if (drv.ndevices > MAX_DEVICES)
        drv.ndevices = MAX_DEVICES;
    snprintf(why, sizeof(why), "driver %d.%d, %d device%s", drv.version / 1000,
             drv.version % 1000 / 10, drv.ndevices,
             drv.ndevices == 1 ? "" : "s");
    loaded = &drv; /* the library stays loaded for the process */
}

const kvt__cuda_drv_t *kvt__cuda(void)
{
    pthread_once(&once, load);
    return loaded;
}

const char *kvt__cuda_why(void)
{
    pthread_once(&once, load);
    return why;
}

const char *kvt__cuda_err(CUresult r)
{
    const char *s = NULL;

    if (loaded == NULL || loaded->GetErrorString(r, &s) != CUDA_SUCCESS ||
        s == NULL)
        return "unknown CUDA error";
    return s;
}

int kvt__cuda_enter(int dev, CUcontext *prev_p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext c, cur = NULL;
    CUresult r;

    *prev_p = NULL;
    if (d == NULL || dev < 0 || dev >= d->ndevices)
        return -1;
    pthread_mutex_lock(&ctx_lock);
    c = ctxs[dev];
    if (c == NULL) {
        CUdevice cd;
        r = d->DeviceGet(&cd, dev);
        if (r == CUDA_SUCCESS)
            r = d->DevicePrimaryCtxRetain(&c, cd);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&ctx_lock);
            KVT_LOG_E("cuda: no context on device %d: %s", dev,
                      kvt__cuda_err(r));
            return -1;
        }
        ctxs[dev] = c;
    }
    pthread_mutex_unlock(&ctx_lock);
    if (d->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        cur = NULL;
    *prev_p = cur;
    if (cur == c)
        return 0;
    r = d->CtxSetCurrent(c);
    if (r != CUDA_SUCCESS) {
        KVT_LOG_E("cuda: cannot use device %d: %s", dev, kvt__cuda_err(r));
        return -1;
    }
    return 0;
}

void kvt__cuda_leave(CUcontext prev)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext cur = NULL;

    if (d != NULL && d->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != prev)
        d->CtxSetCurrent(prev);
}

int kvt__cuda_classify(const void *addr, size_t len, int32_t *dev_p)
{
    uint64_t base, size;

    return kvt__cuda_classify_range(addr, len, dev_p, &base, &size);
}

int kvt__cuda_classify_range(const void *addr, size_t len, int32_t *dev_p,
                             uint64_t *base_p, uint64_t *size_p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    /* The allocation's range comes with the attributes: unlike
     * cuMemGetAddressRange(), they need no current context (a thread
     * bound to another device, or to none, asks too). */
    CUpointer_attribute at[5] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned int type = 0;
    int ordinal = -1, managed = 0;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, base = 0;
    size_t size = 0;
    void *vals[5] = {&type, &ordinal, &managed, &base, &size};

    if (d == NULL)
        return 0;
    /* Host memory the driver never saw answers with type 0 (or an error
     * on older drivers): not device memory. Managed memory is host
     * memory to kvt: this process can touch it. */
    if (d->PointerGetAttributes(5, at, vals, p) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE || managed)
        return 0;
    if (p < base || p + len < p || p + len > base + size) {
        KVT_LOG_E("cuda: [%p, +%zu) starts in device memory but runs "
                  "past its allocation [0x%llx, +%zu)",
                  addr, len, (unsigned long long)base, size);
        return -1;
    }
    *dev_p = ordinal;
    *base_p = (uint64_t)base;
    *size_p = (uint64_t)size;
    return 1;
}

/*
 * Whether the driver is in the process already: device memory cannot
 * exist before it is, so registrations in a process that never loaded it
 * do not pay for loading and initialising it (nor leave a forked child
 * without CUDA).
 */
static int driver_present(void)
{
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    void *h;

    if (loaded != NULL)
        return 1;
    h = dlopen(lib != NULL && lib[0] != '\0' ? lib : "libcuda.so.1",
               RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        return 0;
    dlclose(h);
    return 1;
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
    const kvt__cuda_drv_t *d = kvt__cuda();

    *devices_p = d != NULL ? d->ndevices : 0;
    *detail_p = kvt__cuda_why();
    return d != NULL;
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
    r = d->MemAlloc(&p, len);
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
        /* The application's driver is loaded, kvt's could not be: either
         * range may be device memory, which host code must not touch. */
        KVT_LOG_E("copy: the CUDA driver is loaded but kvt cannot use it: "
                  "%s",
                  kvt__cuda_why());
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
            r = d->StreamSynchronize(st);
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

/* ---- Staging copies (mem/dev.h) ----------------------------------------- */

struct kvt__dstream {
    int dev;
    CUstream st;
    CUevent ev[KVT__DEV_MARKS];
};

static void said_once(_Atomic int *flag, const char *what, CUresult r)
{
    if (!atomic_exchange(flag, 1))
        KVT_LOG_E("cuda: %s: %s", what, kvt__cuda_err(r));
}

kvt__dstream_t *kvt__dev_stream_new(int device)
{
    static _Atomic int said;
    const kvt__cuda_drv_t *d = kvt__cuda();
    kvt__dstream_t *s;
    CUcontext prev;
    CUresult r;

    if (d == NULL || kvt__cuda_enter(device, &prev) != 0)
        return NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        kvt__cuda_leave(prev);
        return NULL;
    }
    s->dev = device;
    r = d->StreamCreate(&s->st, CU_STREAM_NON_BLOCKING);
    for (unsigned i = 0; r == CUDA_SUCCESS && i < KVT__DEV_MARKS; i++)
        r = d->EventCreate(&s->ev[i], CU_EVENT_DISABLE_TIMING);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        said_once(&said, "cannot create a stream", r);
        kvt__dev_stream_free(s);
        return NULL;
    }
    return s;
}

void kvt__dev_stream_free(kvt__dstream_t *s)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;

    if (s == NULL || d == NULL)
        return;
    if (kvt__cuda_enter(s->dev, &prev) == 0) {
        if (s->st != NULL) {
            d->StreamSynchronize(s->st);
            d->StreamDestroy(s->st);
        }
        for (unsigned i = 0; i < KVT__DEV_MARKS; i++)
            if (s->ev[i] != NULL)
                d->EventDestroy(s->ev[i]);
        kvt__cuda_leave(prev);
    }
    free(s);
}

int kvt__dev_copy(kvt__dstream_t *s, void *dst, const void *src, size_t len)
{
    static _Atomic int said;
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    CUresult r;

    if (kvt__cuda_enter(s->dev, &prev) != 0)
        return -1;
    r = d->MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                       len, s->st);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        said_once(&said, "a copy was refused", r);
        return -1;
    }
    return 0;
}

enum { MARK_RECORD, MARK_WAIT };

/* Record or wait for marker @m of @s, under its device's context:
 * the driver's result, or CUDA_ERROR_INVALID_VALUE without a context. */
static CUresult mark_op(kvt__dstream_t *s, unsigned m, int op)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    CUresult r;

    if (m >= KVT__DEV_MARKS || kvt__cuda_enter(s->dev, &prev) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    r = op == MARK_RECORD ? d->EventRecord(s->ev[m], s->st)
                          : d->EventSynchronize(s->ev[m]);
    kvt__cuda_leave(prev);
    return r;
}

int kvt__dev_mark(kvt__dstream_t *s, unsigned m)
{
    return mark_op(s, m, MARK_RECORD) == CUDA_SUCCESS ? 0 : -1;
}

int kvt__dev_mark_wait(kvt__dstream_t *s, unsigned m)
{
    return mark_op(s, m, MARK_WAIT) == CUDA_SUCCESS ? 0 : -1;
}

int kvt__dev_sync(kvt__dstream_t *s)
{
    static _Atomic int said;
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    CUresult r;

    if (kvt__cuda_enter(s->dev, &prev) != 0)
        return -1;
    r = d->StreamSynchronize(s->st);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        said_once(&said, "a copy failed on the device", r);
        return -1;
    }
    return 0;
}

void *kvt__dev_host_alloc(size_t len, int device)
{
    static _Atomic int said;
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    void *p = NULL;
    CUresult r;

    if (d == NULL || kvt__cuda_enter(device, &prev) != 0)
        return NULL;
    r = d->MemHostAlloc(&p, len, CU_MEMHOSTALLOC_PORTABLE);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        said_once(&said, "no pinned host memory", r);
        return NULL;
    }
    return p;
}

void kvt__dev_host_free(void *p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;

    /* Portable pinned memory: any device's context frees it. */
    if (p == NULL || d == NULL || kvt__cuda_enter(0, &prev) != 0)
        return;
    d->MemFreeHost(p);
    kvt__cuda_leave(prev);
}

int kvt__dev_copy2d(kvt__dstream_t *s, void *dst, size_t dpitch,
                    const void *src, size_t spitch, size_t width, size_t height)
{
    static _Atomic int said;
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUDA_MEMCPY2D c;
    CUcontext prev;
    CUresult r = CUDA_SUCCESS;

    if (height == 1 || (dpitch == width && spitch == width))
        return kvt__dev_copy(s, dst, src, width * height);
    if (kvt__cuda_enter(s->dev, &prev) != 0)
        return -1;
    /* The driver bounds pitches (the device's maximum pitch, 2^31 - 1 on
     * every GPU so far): wider strides go one row a copy. */
    if (d->Memcpy2DAsync != NULL && dpitch <= INT32_MAX &&
        spitch <= INT32_MAX) {
        memset(&c, 0, sizeof(c));
        c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.srcDevice = (CUdeviceptr)(uintptr_t)src;
        c.srcPitch = spitch;
        c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
        c.dstPitch = dpitch;
        c.WidthInBytes = width;
        c.Height = height;
        r = d->Memcpy2DAsync(&c, s->st);
    } else {
        for (size_t k = 0; k < height && r == CUDA_SUCCESS; k++)
            r = d->MemcpyAsync((CUdeviceptr)(uintptr_t)dst + k * dpitch,
                               (CUdeviceptr)(uintptr_t)src + k * spitch, width,
                               s->st);
    }
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        said_once(&said, "a strided copy was refused", r);
        return -1;
    }
    return 0;
}

int kvt__dev_usable(void)
{
    return kvt__cuda() != NULL;
}

/*
 * The stream is the application's, in whatever context it belongs to (the
 * NULL stream: the calling thread's current context), so no context is
 * entered here: the driver finds it from the stream.
 */
int kvt__dev_host_fn(void *stream, void (*fn)(void *), void *arg,
                     const char **why_p)
{
    static _Thread_local char buf[160];
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUresult r;

    if (d == NULL) {
        *why_p = kvt__cuda_why();
        return -1;
    }
    if (d->LaunchHostFunc == NULL) {
        *why_p = "the CUDA driver has no cuLaunchHostFunc";
        return -1;
    }
    r = d->LaunchHostFunc((CUstream)stream, fn, arg);
    if (r != CUDA_SUCCESS) {
        snprintf(buf, sizeof(buf), "cuLaunchHostFunc: %s%s", kvt__cuda_err(r),
                 r == CUDA_ERROR_INVALID_CONTEXT && stream == NULL
                     ? " (the NULL stream needs a current context)"
                     : "");
        *why_p = buf;
        return -1;
    }
    return 0;
}

/* ---- Same-host sharing (mem/dev.h) -------------------------------------- */

_Static_assert(sizeof(CUipcMemHandle) == KVT__DEV_IPC_BYTES,
               "an IPC handle is CU_IPC_HANDLE_SIZE bytes");

int kvt__dev_ipc_export(const void *addr, size_t len, int device,
                        uint64_t *base_p, uint64_t *size_p,
                        uint8_t handle[KVT__DEV_IPC_BYTES], const char **why_p)
{
    static _Thread_local char buf[160];
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUipcMemHandle h;
    CUcontext prev;
    int32_t dev = -1;
    CUresult r;

    *why_p = NULL;
    if (d == NULL) {
        *why_p = kvt__cuda_why();
        return -1;
    }
    if (d->IpcGetMemHandle == NULL) {
        *why_p = "the CUDA driver lacks cuIpcGetMemHandle";
        return -1;
    }
    if (kvt__cuda_classify_range(addr, len, &dev, base_p, size_p) != 1 ||
        dev != device) {
        *why_p = "the range is no longer device memory of its device";
        return -1;
    }
    if (kvt__cuda_enter(device, &prev) != 0) {
        *why_p = "no context on its device";
        return -1;
    }
    r = d->IpcGetMemHandle(&h, (CUdeviceptr)*base_p);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        /* Memory of the virtual-memory API, say, which legacy IPC
         * handles do not cover. */
        snprintf(buf, sizeof(buf), "cuIpcGetMemHandle: %s", kvt__cuda_err(r));
        *why_p = buf;
        return -1;
    }
    memcpy(handle, &h, sizeof(h));
    return 0;
}

int kvt__dev_ipc_open(const uint8_t handle[KVT__DEV_IPC_BYTES], int device,
                      void **ptr_p, const char **why_p)
{
    static _Thread_local char buf[160];
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUipcMemHandle h;
    CUdeviceptr p = 0;
    CUcontext prev;
    CUresult r;

    *why_p = NULL;
    if (d == NULL) {
        *why_p = kvt__cuda_why();
        return -1;
    }
    if (d->IpcOpenMemHandle == NULL || d->IpcCloseMemHandle == NULL) {
        *why_p = "the CUDA driver lacks cuIpcOpenMemHandle";
        return -1;
    }
    if (kvt__cuda_enter(device, &prev) != 0) {
        *why_p = "no context on the device";
        return -1;
    }
    memcpy(&h, handle, sizeof(h));
    /* Opened again in the same context, the driver counts references and
     * answers the same address. */
    r = d->IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        snprintf(buf, sizeof(buf), "cuIpcOpenMemHandle: %s", kvt__cuda_err(r));
        *why_p = buf;
        return -1;
    }
    *ptr_p = (void *)(uintptr_t)p;
    return 0;
}

void kvt__dev_ipc_close(void *ptr, int device)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext prev;
    CUresult r;

    if (d == NULL || d->IpcCloseMemHandle == NULL ||
        kvt__cuda_enter(device, &prev) != 0)
        return;
    r = d->IpcCloseMemHandle((CUdeviceptr)(uintptr_t)ptr);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS)
        KVT_LOG_W("cuda: closing a peer's memory at %p: %s", ptr,
                  kvt__cuda_err(r));
}
