/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver, loaded at run time (cuda_drv.h): loading, contexts,
 * what the driver knows of an address, and devices whose context is lost.
 * The memory domain is cuda_md.c, the staging and sharing calls of
 * mem/dev.h cuda_dev.c.
 *
 * The driver is loaded and initialised (cuInit) only when device memory
 * is first seen (a registration the driver is already in the process for,
 * an allocation, a peer's device region, kvt info), never at engine
 * creation: a process that forks keeps its child able to use CUDA, and a
 * host-only engine on a GPU host pays nothing. A child of fork() after
 * that cannot use the driver its parent initialised: kvt__cuda() says so
 * there.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem/cuda/cuda_drv.h"
#include "util/log.h"

#define MAX_DEVICES 64

static kvt__cuda_drv_t drv;
static const kvt__cuda_drv_t *_Atomic loaded; /* set once, by load() */
static char why[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[MAX_DEVICES];
static pid_t load_pid;     /* the process that initialised the driver */
static _Atomic int forked; /* this is a child of fork() after that */
static char fork_why[160];
/* Devices whose context is lost (a sticky error): the error, 0 if not. */
static _Atomic int lost[MAX_DEVICES];

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

/* In a child of fork(): the driver the parent initialised is not usable
 * here (the driver's rule), and kvt says so rather than fail call by
 * call. */
static void after_fork(void)
{
    snprintf(fork_why, sizeof(fork_why),
             "this process was forked from pid %d after that process "
             "initialised the CUDA driver, which a child cannot use",
             (int)load_pid);
    forked = 1;
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
    sym(h, "cuMemGetAddressRange_v2", &drv.MemGetAddressRange, 1);
    sym(h, "cuDeviceGetUuid_v2", &drv.DeviceGetUuid, 1);
    if (drv.DeviceGetUuid == NULL)
        sym(h, "cuDeviceGetUuid", &drv.DeviceGetUuid, 1);
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
    load_pid = getpid();
    pthread_atfork(NULL, NULL, after_fork);
    loaded = &drv; /* the library stays loaded for the process */
}

const kvt__cuda_drv_t *kvt__cuda(void)
{
    pthread_once(&once, load);
    return forked ? NULL : loaded;
}

const char *kvt__cuda_why(void)
{
    pthread_once(&once, load);
    return forked ? fork_why : why;
}

const char *kvt__cuda_err(CUresult r)
{
    const char *s = NULL;

    if (loaded == NULL || loaded->GetErrorString(r, &s) != CUDA_SUCCESS ||
        s == NULL)
        return "unknown CUDA error";
    return s;
}

/*
 * Errors after which the driver refuses every later call in the context
 * (a fault on the device: the context is lost until the process ends).
 */
static int sticky(CUresult r)
{
    switch ((int)r) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
        return 1;
    default:
        return 0;
    }
}

CUresult kvt__cuda_check(int dev, CUresult r)
{
    int none = 0;

    if (r == CUDA_SUCCESS || !sticky(r) || dev < 0 || dev >= MAX_DEVICES)
        return r;
    if (atomic_compare_exchange_strong(&lost[dev], &none, (int)r))
        KVT_LOG_E("cuda: the context of device %d is lost (%s): the driver "
                  "refuses all work on it until the process restarts, and "
                  "kvt refuses its device memory from now on (host memory "
                  "is not affected)",
                  dev, kvt__cuda_err(r));
    return r;
}

int kvt__cuda_lost(int dev)
{
    return dev >= 0 && dev < MAX_DEVICES ? lost[dev] : 0;
}

static int enter(int dev, CUcontext *prev_p, int even_lost)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext c, cur = NULL;
    CUresult r;

    *prev_p = NULL;
    if (d == NULL || dev < 0 || dev >= d->ndevices ||
        (lost[dev] != 0 && !even_lost))
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

int kvt__cuda_enter(int dev, CUcontext *prev_p)
{
    return enter(dev, prev_p, 0);
}

int kvt__cuda_enter_teardown(int dev, CUcontext *prev_p)
{
    return enter(dev, prev_p, 1);
}

int kvt__cuda_enter_any(CUcontext *prev_p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUcontext cur = NULL;
    int dev = -1;

    *prev_p = NULL;
    if (d == NULL)
        return -1;
    pthread_mutex_lock(&ctx_lock);
    if (d->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        int ok = 1; /* the caller's own, unless it is a lost one */
        for (int i = 0; i < d->ndevices; i++)
            if (ctxs[i] == cur && lost[i] != 0)
                ok = 0;
        if (ok) {
            pthread_mutex_unlock(&ctx_lock);
            *prev_p = cur;
            return 0;
        }
    }
    for (int i = 0; i < d->ndevices && dev < 0; i++)
        if (ctxs[i] != NULL && lost[i] == 0)
            dev = i;
    pthread_mutex_unlock(&ctx_lock);
    return dev >= 0 ? kvt__cuda_enter(dev, prev_p) : -1;
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

/*
 * The mapping holding @p (*base_p, *size_p) and the address range it was
 * mapped in (*range_p): 1 when @p is mapped device memory of device @dev,
 * 0 when not. The mapping comes from cuMemGetAddressRange(), which the
 * reference names for the mapped region (the attributes' range is the
 * mappable range, a whole reservation for the virtual-memory API); it
 * needs a context: @dev's primary one, entered for the call.
 */
static int mapping_of(const kvt__cuda_drv_t *d, CUdeviceptr p, int dev,
                      CUdeviceptr *base_p, size_t *size_p, CUdeviceptr *range_p)
{
    CUpointer_attribute at[5] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_MAPPED};
    unsigned int type = 0;
    int ordinal = -1, managed = 0, mapped = 0;
    void *vals[5] = {&type, &ordinal, &managed, range_p, &mapped};
    CUcontext prev;
    CUresult r;

    *base_p = 0;
    *size_p = 0;
    *range_p = 0;
    if (d->PointerGetAttributes(5, at, vals, p) != CUDA_SUCCESS) {
        /* A driver before the MAPPED attribute (CUDA 10.2): the range
         * below answers for what is mapped. */
        mapped = 1;
        if (d->PointerGetAttributes(4, at, vals, p) != CUDA_SUCCESS)
            return 0;
    }
    if (type != CU_MEMORYTYPE_DEVICE || managed || !mapped || ordinal != dev ||
        d->MemGetAddressRange == NULL || kvt__cuda_enter(dev, &prev) != 0)
        return 0;
    r = d->MemGetAddressRange(base_p, size_p, p);
    kvt__cuda_leave(prev);
    return r == CUDA_SUCCESS && *size_p > 0 && p >= *base_p &&
           p - *base_p < *size_p;
}

int kvt__cuda_classify_range(const void *addr, size_t len, int32_t *dev_p,
                             uint64_t *base_p, uint64_t *size_p)
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    /* What the driver knows comes with the attributes: unlike
     * cuMemGetAddressRange(), they need no current context (a thread
     * bound to another device, or to none, asks too). */
    CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned int type = 0;
    int ordinal = -1, managed = 0;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, end = p + len, at_p, mb = 0;
    CUdeviceptr range = 0, next_range = 0;
    size_t ms = 0;
    void *vals[3] = {&type, &ordinal, &managed};

    if (d == NULL)
        return 0;
    /* Host memory the driver never saw answers with type 0 (or an error
     * on older drivers): not device memory. Managed memory is host
     * memory to kvt: this process can touch it. */
    if (d->PointerGetAttributes(3, at, vals, p) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE || managed)
        return 0;
    if (end < p || len == 0 || !mapping_of(d, p, ordinal, &mb, &ms, &range)) {
        KVT_LOG_E("cuda: [%p, +%zu) starts in device memory that is not "
                  "mapped",
                  addr, len);
        return -1;
    }
    *base_p = (uint64_t)mb;
    /* Mapped from end to end: within one allocation, or across the
     * mappings that follow each other in one reservation of the
     * virtual-memory API (PyTorch's expandable segments grow so); never
     * across two allocations, which one copy cannot span. A copy into a
     * hole would be a fault on the device that loses the context. */
    for (at_p = mb + ms; at_p < end; at_p = mb + ms) {
        if (!mapping_of(d, at_p, ordinal, &mb, &ms, &next_range) ||
            mb != at_p || next_range != range) {
            KVT_LOG_E("cuda: [%p, +%zu) starts in device memory but runs "
                      "past its allocation into [0x%llx, ...), which is not "
                      "mapped in the same range of cuda:%d",
                      addr, len, (unsigned long long)at_p, ordinal);
            return -1;
        }
    }
    *dev_p = ordinal;
    *size_p = (uint64_t)(mb + ms) - *base_p;
    return 1;
}

int kvt__cuda_uuid(int dev, uint8_t uuid[16])
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    CUuuid u;
    CUdevice cd;

    if (d == NULL || d->DeviceGetUuid == NULL || dev < 0 ||
        dev >= d->ndevices || d->DeviceGet(&cd, dev) != CUDA_SUCCESS ||
        d->DeviceGetUuid(&u, cd) != CUDA_SUCCESS)
        return -1;
    memcpy(uuid, u.bytes, 16);
    return 0;
}
