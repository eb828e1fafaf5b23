/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_MEM_CUDA_CUDA_DRV_H
#define KVT_MEM_CUDA_CUDA_DRV_H

/*
 * The CUDA driver API, loaded at run time (dlopen of libcuda.so.1, or of
 * $KVT_CUDA_LIBRARY), so that one build runs on hosts with and without a
 * GPU and links no CUDA library. cuda.h gives the types only: every call
 * goes through this table, by the symbol names the CUDA 12+ headers map
 * the calls to (cuMemAlloc_v2, ...), which every driver since
 * CUDA 11 exports.
 *
 * Thread safety: the table is loaded once (the first kvt__cuda() call, any
 * thread) and never changes; the driver's calls are thread-safe.
 */
#include <cuda.h>
#include <stdint.h>

typedef struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*PointerGetAttributes)(unsigned int, CUpointer_attribute *,
                                     void **, CUdeviceptr);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
    /* Optional (NULL when absent): same-host sharing of device memory
     * (legacy IPC handles), and 2-D copies (strided pieces). */
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
    /* Optional (NULL when absent): host functions in a stream's order
     * (transfers ordered on an application's stream). */
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
    /* Optional (NULL when absent): allocation, for tools and tests. */
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    /* Optional (NULL when absent): the allocation holding an address
     * (IPC export), and a device's UUID (same-host peers that number the
     * devices differently). */
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);

    int version;  /* cuDriverGetVersion(): 13000 for 13.0 */
    int ndevices; /* cuDeviceGetCount() */
} kvt__cuda_drv_t;

/*
 * The driver, loaded and initialised on first use; NULL when there is no
 * driver (no library, a symbol missing, cuInit() failing), no device, or
 * this process is a child of fork() after its parent initialised it.
 * kvt__cuda_why() then says why, for messages and kvt info. Called only
 * once device memory is in play (never at engine creation).
 */
const kvt__cuda_drv_t *kvt__cuda(void);
const char *kvt__cuda_why(void);

/* The driver's name for @r ("CUDA_ERROR_..."-style text). */
const char *kvt__cuda_err(CUresult r);

/*
 * Make device @dev's primary context current on this thread (retained
 * once per device for the process's lifetime), *prev_p the one that was:
 * 0, or -1 (logged). kvt__cuda_leave() makes @prev current again, so
 * that a caller's thread (a framework's, bound to its own device) keeps
 * its context across kvt's calls.
 */
int kvt__cuda_enter(int dev, CUcontext *prev_p);
void kvt__cuda_leave(CUcontext prev);
/* As kvt__cuda_enter(), a lost device's too: for releasing what kvt
 * holds there (streams, events), which the driver frees even then. */
int kvt__cuda_enter_teardown(int dev, CUcontext *prev_p);
/* A context for calls that any one serves (freeing portable pinned
 * memory): the caller's current one, else one kvt already holds; never
 * a new one (a process using device 1 gets no context on device 0).
 * 0, or -1 when there is none. */
int kvt__cuda_enter_any(CUcontext *prev_p);

/*
 * @r, a driver's answer about work on device @dev: a sticky error (a fault
 * on the device: the driver then refuses every call in the context until
 * the process ends) marks the device lost, logged once; kvt__cuda_enter()
 * refuses it from then on, so that device work fails at once with
 * KVT_ERR_IO instead of calling a driver that can only refuse. Returns @r.
 */
CUresult kvt__cuda_check(int dev, CUresult r);
/* The error that lost device @dev's context, or 0. */
int kvt__cuda_lost(int dev);

/* Device @dev's UUID: 0, or -1 (no driver, or one without the call). */
int kvt__cuda_uuid(int dev, uint8_t uuid[16]);

/*
 * What the driver knows of [addr, addr + len): 1 when it is device memory
 * (*dev_p its ordinal) mapped from end to end (one allocation, or
 * adjacent mappings of the virtual-memory API), 0 when the driver does not
 * know it as device memory (host, pinned and managed memory), -1 when it
 * starts in device memory but runs past what is mapped (logged).
 */
int kvt__cuda_classify(const void *addr, size_t len, int32_t *dev_p);

/* As kvt__cuda_classify(), with the range of the mappings that hold it
 * (*base_p, *size_p) when it is device memory. */
int kvt__cuda_classify_range(const void *addr, size_t len, int32_t *dev_p,
                             uint64_t *base_p, uint64_t *size_p);

#endif
