/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging copies (mem/dev.h) in a build without a device memory domain:
 * no device memory can be registered, so no transport asks; every call
 * fails.
 */
#include "mem/dev.h"

kvt__dstream_t *kvt__dev_stream_new(int device)
{
    (void)device;
    return NULL;
}

void kvt__dev_stream_free(kvt__dstream_t *s)
{
    (void)s;
}

int kvt__dev_copy(kvt__dstream_t *s, void *dst, const void *src, size_t len)
{
    (void)s, (void)dst, (void)src, (void)len;
    return -1;
}

int kvt__dev_mark(kvt__dstream_t *s, unsigned m)
{
    (void)s, (void)m;
    return -1;
}

int kvt__dev_mark_wait(kvt__dstream_t *s, unsigned m)
{
    (void)s, (void)m;
    return -1;
}

int kvt__dev_sync(kvt__dstream_t *s)
{
    (void)s;
    return -1;
}

void *kvt__dev_host_alloc(size_t len, int device)
{
    (void)len, (void)device;
    return NULL;
}

void kvt__dev_host_free(void *p)
{
    (void)p;
}

int kvt__dev_copy2d(kvt__dstream_t *s, void *dst, size_t dpitch,
                    const void *src, size_t spitch, size_t width, size_t height)
{
    (void)s, (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width,
        (void)height;
    return -1;
}

int kvt__dev_usable(void)
{
    return 0;
}

int kvt__dev_ipc_export(const void *addr, size_t len, int device,
                        uint64_t *base_p, uint64_t *size_p,
                        uint8_t handle[KVT__DEV_IPC_BYTES], const char **why_p)
{
    (void)addr, (void)len, (void)device, (void)base_p, (void)size_p,
        (void)handle;
    *why_p = "kvt was built without device memory";
    return -1;
}

int kvt__dev_ipc_open(const uint8_t handle[KVT__DEV_IPC_BYTES], int device,
                      void **ptr_p, const char **why_p)
{
    (void)handle, (void)device, (void)ptr_p;
    *why_p = "kvt was built without device memory";
    return -1;
}

void kvt__dev_ipc_close(void *ptr, int device)
{
    (void)ptr, (void)device;
}

int kvt__dev_host_fn(void *stream, void (*fn)(void *), void *arg,
                     const char **why_p)
{
    (void)stream, (void)fn, (void)arg;
    *why_p = "kvt is built without CUDA";
    return -1;
}

const char *kvt__dev_why(void)
{
    return "this kvt was built without device memory";
}

int kvt__dev_uuid(int device, uint8_t uuid[16])
{
    (void)device;
    (void)uuid;
    return -1;
}

int kvt__dev_of_uuid(const uint8_t uuid[16])
{
    (void)uuid;
    return -1;
}
