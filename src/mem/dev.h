/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_MEM_DEV_H
#define KVT_MEM_DEV_H

/*
 * Copies between host and device memory, for transports that move device
 * memory through host memory (staging), without the device API's headers.
 * Built over the CUDA driver (mem/cuda/cuda.c) when the CUDA memory
 * domain is; otherwise every call fails (no device memory can be
 * registered then).
 *
 * A stream is owned by one thread at a time (a connection's worker): its
 * copies run in order, asynchronously. Pinned host buffers come from the
 * driver (page-locked: copies run at the bus's speed and asynchronously).
 * Every call returns 0 or -1 (logged once per kind of failure).
 */
#include <stddef.h>
#include <stdint.h>

typedef struct kvt__dstream kvt__dstream_t;

/* A stream on device @device; NULL when none can be made (logged). */
kvt__dstream_t *kvt__dev_stream_new(int device);
/* Waits for what is queued, then frees it. NULL is ignored. */
void kvt__dev_stream_free(kvt__dstream_t *s);

/* Queue a copy of @len bytes, either way between host and device memory
 * or device to device (unified addresses). */
int kvt__dev_copy(kvt__dstream_t *s, void *dst, const void *src, size_t len);

/* Markers: 0..KVT__DEV_MARKS-1 per stream. mark() records one after what
 * is queued; mark_wait() waits for it (0, or -1 when a copy before it
 * failed). */
#define KVT__DEV_MARKS 8
int kvt__dev_mark(kvt__dstream_t *s, unsigned m);
int kvt__dev_mark_wait(kvt__dstream_t *s, unsigned m);

/* Wait for everything queued: 0, or -1 when a copy failed. */
int kvt__dev_sync(kvt__dstream_t *s);

/* Pinned host memory (allocated under device @device); NULL when none
 * (logged). */
void *kvt__dev_host_alloc(size_t len, int device);
void kvt__dev_host_free(void *p);

#endif
