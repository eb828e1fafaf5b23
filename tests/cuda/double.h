/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_CUDA_DOUBLE_H
#define KVT_TESTS_CUDA_DOUBLE_H

/*
 * The driver test double (cuda_double.c) as the CUDA tests drive it
 * themselves: opened by path (KVT_TEST_CUDA_DOUBLE), the same instance kvt
 * loads through KVT_CUDA_LIBRARY unless kvt is told to load none. Skips
 * the test where the variable is not set.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

#include "kvt_test.h"

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
    long (*host_fn_refusals)(void);
} cu;

static inline void double_open(void)
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
    S(MemcpyAsync, "cuMemcpyAsync");
    S(StreamCreate, "cuStreamCreate");
    S(StreamSynchronize, "cuStreamSynchronize");
    S(StreamDestroy, "cuStreamDestroy_v2");
    S(LaunchHostFunc, "cuLaunchHostFunc");
    S(host_fn_refusals, "kvt_cuda_double_host_fn_refusals");
#undef S
    CHECK(cu.Init(0) == CUDA_SUCCESS);
}

#endif
