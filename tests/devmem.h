/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_DEVMEM_H
#define KVT_TESTS_DEVMEM_H

/*
 * Device memory for tests, through the CUDA driver kvt loads (the library
 * $KVT_CUDA_LIBRARY names: the test double of tests/cuda, or the real
 * driver): allocation on a device and synchronous copies either way.
 * Header-only, public API only (no cuda.h): the few driver calls are
 * declared here with the driver's ABI.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int (*Init)(unsigned int);
    int (*DevicePrimaryCtxRetain)(void **, int);
    int (*CtxSetCurrent)(void *);
    int (*MemAlloc)(uint64_t *, size_t);
    int (*MemFree)(uint64_t);
    int (*MemcpyAsync)(uint64_t, uint64_t, size_t, void *);
    int (*StreamSynchronize)(void *);
} devmem_drv_t;

static devmem_drv_t devmem_drv;

/* Whether a driver library is there, without initialising it (a process
 * that forks must not have called cuInit()). 0 or -1. */
static inline int devmem_probe(void)
{
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    void *h = dlopen(lib != NULL && lib[0] ? lib : "libcuda.so.1", RTLD_NOW);

    if (h == NULL)
        return -1;
    return dlsym(h, "cuInit") != NULL && dlsym(h, "cuMemAlloc_v2") != NULL ? 0
                                                                           : -1;
}

/* 0 when a driver is there (initialised now), -1 otherwise. */
static inline int devmem_open(void)
{
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    void *h;

    if (devmem_drv.Init != NULL)
        return 0;
    h = dlopen(lib != NULL && lib[0] ? lib : "libcuda.so.1", RTLD_NOW);
    if (h == NULL)
        return -1;
    *(void **)&devmem_drv.DevicePrimaryCtxRetain =
        dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&devmem_drv.CtxSetCurrent = dlsym(h, "cuCtxSetCurrent");
    *(void **)&devmem_drv.MemAlloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&devmem_drv.MemFree = dlsym(h, "cuMemFree_v2");
    *(void **)&devmem_drv.MemcpyAsync = dlsym(h, "cuMemcpyAsync");
    *(void **)&devmem_drv.StreamSynchronize = dlsym(h, "cuStreamSynchronize");
    *(void **)&devmem_drv.Init = dlsym(h, "cuInit");
    if (!devmem_drv.Init || !devmem_drv.DevicePrimaryCtxRetain ||
        !devmem_drv.CtxSetCurrent || !devmem_drv.MemAlloc ||
        !devmem_drv.MemFree || !devmem_drv.MemcpyAsync ||
        !devmem_drv.StreamSynchronize || devmem_drv.Init(0) != 0) {
        devmem_drv.Init = NULL;
        return -1;
    }
    return 0;
}

/* Make device @dev current on this thread. */
static inline int devmem_use(int dev)
{
    void *c;

    if (devmem_drv.DevicePrimaryCtxRetain(&c, dev) != 0)
        return -1;
    return devmem_drv.CtxSetCurrent(c) == 0 ? 0 : -1;
}

/* @len bytes of device memory on @dev; NULL on failure. */
static inline void *devmem_alloc(size_t len, int dev)
{
    uint64_t p = 0;

    if (devmem_open() != 0 || devmem_use(dev) != 0 ||
        devmem_drv.MemAlloc(&p, len) != 0)
        return NULL;
    return (void *)(uintptr_t)p;
}

static inline void devmem_free(void *p)
{
    if (p != NULL && devmem_open() == 0 && devmem_use(0) == 0)
        devmem_drv.MemFree((uint64_t)(uintptr_t)p);
}

/* Copy @len bytes, either way (unified addresses), and wait. 0 or -1. */
static inline int devmem_copy(void *dst, const void *src, size_t len)
{
    if (devmem_open() != 0 || devmem_use(0) != 0 ||
        devmem_drv.MemcpyAsync((uint64_t)(uintptr_t)dst,
                               (uint64_t)(uintptr_t)src, len, NULL) != 0)
        return -1;
    return devmem_drv.StreamSynchronize(NULL) == 0 ? 0 : -1;
}

#endif
