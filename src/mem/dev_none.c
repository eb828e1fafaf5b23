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
