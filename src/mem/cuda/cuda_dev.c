/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The calls of mem/dev.h over the CUDA driver (cuda.c): staging streams
 * and pinned buffers, host functions in a stream's order, and same-host
 * sharing of device memory (legacy IPC handles). Every result of device
 * work goes through kvt__cuda_check(): a lost context is remembered, and
 * its device refused from then on.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda/cuda_drv.h"
#include "mem/dev.h"
#include "util/log.h"

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
    r = kvt__cuda_check(device,
                        d->StreamCreate(&s->st, CU_STREAM_NON_BLOCKING));
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
    const kvt__cuda_drv_t *d;
    CUcontext prev;

    /* Nothing to free never asks for the driver (a host-only engine's
     * teardown must not load it). */
    if (s == NULL)
        return;
    d = kvt__cuda();
    /* A lost device's too: the driver releases them even then (nothing
     * queued there runs any more: no wait). */
    if (d != NULL && kvt__cuda_enter_teardown(s->dev, &prev) == 0) {
        if (s->st != NULL) {
            if (!kvt__cuda_lost(s->dev))
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
    r = kvt__cuda_check(s->dev, d->MemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                                               (CUdeviceptr)(uintptr_t)src, len,
                                               s->st));
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
    kvt__cuda_check(s->dev, r);
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
    r = kvt__cuda_check(s->dev, d->StreamSynchronize(s->st));
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
    const kvt__cuda_drv_t *d;
    CUcontext prev;

    /* Portable pinned memory: any device's context frees it, one that is
     * there already (none is made for it on a device nobody uses). NULL
     * never asks for the driver. */
    if (p == NULL)
        return;
    d = kvt__cuda();
    if (d == NULL || kvt__cuda_enter_any(&prev) != 0)
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
    kvt__cuda_check(s->dev, r);
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
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
    int legacy = 1;
    void *val = &legacy;
    CUipcMemHandle h;
    CUcontext prev;
    CUdeviceptr base = 0;
    size_t size = 0;
    int32_t dev = -1;
    uint64_t mb, ms;
    CUresult r;

    *why_p = NULL;
    if (d == NULL) {
        *why_p = kvt__cuda_why();
        return -1;
    }
    if (d->IpcGetMemHandle == NULL || d->MemGetAddressRange == NULL) {
        *why_p = "the CUDA driver lacks cuIpcGetMemHandle";
        return -1;
    }
    if (kvt__cuda_classify_range(addr, len, &dev, &mb, &ms) != 1 ||
        dev != device) {
        *why_p = "the range is no longer device memory of its device";
        return -1;
    }
    /* Legacy IPC handles cover cuMemAlloc() memory only: not the
     * virtual-memory API's (PyTorch's expandable segments), nor a memory
     * pool's. Drivers before the attribute answer an error: asked below. */
    if (d->PointerGetAttributes(1, &at, &val, (CUdeviceptr)(uintptr_t)addr) ==
            CUDA_SUCCESS &&
        !legacy) {
        *why_p = "it is memory of the CUDA virtual-memory API or of a memory "
                 "pool (PyTorch's expandable segments, say), which legacy "
                 "IPC handles do not share";
        return -1;
    }
    if (kvt__cuda_enter(device, &prev) != 0) {
        *why_p = "no context on its device";
        return -1;
    }
    /* The handle is of the allocation: its base, as the driver gives it
     * (the pointer attributes' range may be a larger reservation). */
    r = d->MemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)addr);
    if (r == CUDA_SUCCESS)
        r = d->IpcGetMemHandle(&h, base);
    kvt__cuda_leave(prev);
    if (r != CUDA_SUCCESS) {
        snprintf(buf, sizeof(buf), "cuIpcGetMemHandle: %s", kvt__cuda_err(r));
        *why_p = buf;
        return -1;
    }
    *base_p = (uint64_t)base;
    *size_p = (uint64_t)size;
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

int kvt__dev_uuid(int device, uint8_t uuid[16])
{
    return kvt__cuda_uuid(device, uuid);
}

int kvt__dev_of_uuid(const uint8_t uuid[16])
{
    const kvt__cuda_drv_t *d = kvt__cuda();
    uint8_t u[16];

    for (int i = 0; d != NULL && i < d->ndevices; i++)
        if (kvt__cuda_uuid(i, u) == 0 && memcmp(u, uuid, 16) == 0)
            return i;
    return -1;
}

const char *kvt__dev_why(void)
{
    return kvt__cuda_why();
}
