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

/* Devices kvt numbers (0..KVT__DEV_MAX-1); a driver's others are not used. */
#define KVT__DEV_MAX 64

/* A stream on device @device; NULL when none can be made (logged). */
kvt__dstream_t *kvt__dev_stream_new(int device);
/* Waits for what is queued, then frees it. NULL is ignored. */
void kvt__dev_stream_free(kvt__dstream_t *s);

/* Queue a copy of @len bytes, either way between host and device memory
 * or device to device (unified addresses). */
int kvt__dev_copy(kvt__dstream_t *s, void *dst, const void *src, size_t len);

/* Queue @height pieces of @width bytes, the k-th from src + k * spitch to
 * dst + k * dpitch (a 2-D copy where the driver takes those pitches). */
int kvt__dev_copy2d(kvt__dstream_t *s, void *dst, size_t dpitch,
                    const void *src, size_t spitch, size_t width,
                    size_t height);

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

/* Whether device memory can be moved here: a driver with devices
 * (loading and initialising it on first use: call it only once device
 * memory is in play, never at engine creation). kvt__dev_why() says why
 * not (static or thread-local text). */
int kvt__dev_usable(void);
const char *kvt__dev_why(void);

/* Device @device's UUID (0, or -1), and the device of this process with
 * @uuid (-1 when none): processes on one host may number the devices
 * differently (CUDA_VISIBLE_DEVICES). */
int kvt__dev_uuid(int device, uint8_t uuid[16]);
int kvt__dev_of_uuid(const uint8_t uuid[16]);

/*
 * Run @fn(@arg) in the order of an application's CUDA stream @stream (a
 * CUstream; NULL: the legacy default stream of the calling thread's
 * current context): once the work queued on it before has finished, and
 * before any work queued after starts (cuLaunchHostFunc). @fn runs on a
 * thread of the driver and must make no CUDA call. Returns 0, or -1 with
 * *why_p set (no driver, the driver refused: a static or thread-local
 * string).
 */
int kvt__dev_host_fn(void *stream, void (*fn)(void *), void *arg,
                     const char **why_p);

/*
 * Same-host sharing. export() gives what another process on this host
 * needs to reach the device allocation holding [addr, +len) on @device
 * (*base_p, *size_p: the allocation's range), with one sharing per
 * allocation; open() maps such a handle into this process, under
 * @device's context (*ptr_p: the allocation's base here); close() undoes
 * one open(). export() and open() return 0, or -1 with *why_p (static or
 * thread-local text).
 */
#define KVT__DEV_IPC_BYTES 64
int kvt__dev_ipc_export(const void *addr, size_t len, int device,
                        uint64_t *base_p, uint64_t *size_p,
                        uint8_t handle[KVT__DEV_IPC_BYTES], const char **why_p);
int kvt__dev_ipc_open(const uint8_t handle[KVT__DEV_IPC_BYTES], int device,
                      void **ptr_p, const char **why_p);
void kvt__dev_ipc_close(void *ptr, int device);

#endif
