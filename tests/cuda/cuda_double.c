/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test double of the part of the CUDA driver API kvt uses, for machines
 * without a GPU: loaded by kvt in place of libcuda.so.1 when
 * KVT_CUDA_LIBRARY names it. Built for the tests only, never installed
 * (tests/cuda/README.md).
 *
 * "Device" memory is a memfd mapped twice: the address handed out has no
 * access at all (so host code that touches device memory directly faults,
 * as it would on a GPU), and a second, private mapping is what the copy
 * thread reads and writes. Each stream's copies and events run in order
 * on a thread of that stream, each copy after a delay
 * (KVT_CUDA_DOUBLE_DELAY_US, default 20), so that code which uses a buffer
 * before its copy completed, or orders work across streams without
 * waiting, sees stale bytes. Calls that need a context on the real driver
 * fail here without one. Faults are injected through
 * kvt_cuda_double_fail_copy() or KVT_CUDA_DOUBLE_FAIL_COPY=N (the Nth
 * copy of the process fails, copying nothing); the next event recorded on
 * that stream, and its next synchronisation, report
 * CUDA_ERROR_LAUNCH_FAILED.
 * KVT_CUDA_DOUBLE_DEVICES sets the number of devices (default 2; 0: none).
 * KVT_CUDA_DOUBLE_NO_IPC=1 refuses to export IPC handles (as the driver
 * does for memory of the virtual-memory API).
 * Host functions (cuLaunchHostFunc) run in their stream's order on its
 * thread, and the stream's later work waits for them to return; as the
 * driver's documentation requires, a host function must not call the
 * driver: every call made from one fails with CUDA_ERROR_NOT_PERMITTED.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* The double's own controls, for tests (dlsym). */
EXPORT void kvt_cuda_double_fail_copy(long nth_from_now);
EXPORT long kvt_cuda_double_ipc_opens(void);
EXPORT long kvt_cuda_double_ipc_live(void);
EXPORT long kvt_cuda_double_host_fn_refusals(void);
#define MAX_ALLOCS 4096

typedef struct {
    uintptr_t view;  /* handed out; no access */
    uint8_t *shadow; /* what copies touch */
    size_t size;
    int dev; /* -1: pinned host memory */
    int fd;  /* device memory: its memfd */
    /* Opened from another process's IPC handle: that process and the
     * memfd's inode, and how many opens it has. */
    int imported, refs;
    pid_t pid;
    uint64_t ino;
} alloc_t;

/* An IPC handle: the exporter's memfd, reached through /proc. */
typedef struct {
    uint32_t magic;
    int32_t pid, fd, dev;
    uint64_t ino, size;
} ipc_handle_t;
#define IPC_MAGIC 0x4b564449u
_Static_assert(sizeof(ipc_handle_t) <= CU_IPC_HANDLE_SIZE, "handle fits");

typedef struct op {
    struct op *next;
    struct stream *s;
    int is_event;
    struct event *ev;
    CUhostFn fn; /* a host function (cuLaunchHostFunc) and its argument */
    void *fn_arg;
    void *dst;
    const void *src;
    size_t width, height, dpitch, spitch;
} op_t;

/* A stream: its own queue and copy thread, so that work on different
 * streams is not ordered (as on a GPU), and a reader that does not wait
 * for a stream's copies sees stale bytes. */
typedef struct stream {
    _Atomic int failed;      /* a copy failed since the last event */
    _Atomic int sync_failed; /* a copy failed since the last synchronise */
    _Atomic uint64_t queued, done;
    op_t *q_head, *q_tail; /* under lock */
    pthread_t thread;
    pid_t pid; /* the process whose thread serves it; 0: none */
    int closing;
    struct stream *next; /* every stream, for fork() */
} stream_t;

typedef struct event {
    _Atomic uint64_t seq; /* 0: never recorded */
    stream_t *s;
    _Atomic int state; /* 0 pending, 1 done, 2 failed */
} event_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static alloc_t allocs[MAX_ALLOCS];
static stream_t *streams; /* under lock */
static int started, ndev = 2, no_ipc;
static unsigned delay_us = 20;
static _Atomic long copies, fail_at, ipc_opens;
static stream_t null_stream;
static __thread int cur_dev = -1;
/* The threads running a host function now, by thread id: the driver
 * refuses calls made from one (CUDA_ERROR_NOT_PERMITTED). Not a
 * thread-local flag: a dlopen()ed library's thread-local storage in a
 * thread still running at exit (the NULL stream's) crashes
 * LeakSanitizer's scan of the threads. */
#define FN_THREADS 64
static _Atomic pid_t fn_tids[FN_THREADS];
static _Atomic long host_fn_refusals;

static int in_host_fn(void)
{
    pid_t me = (pid_t)syscall(SYS_gettid);

    for (int i = 0; i < FN_THREADS; i++)
        if (fn_tids[i] == me)
            return 1;
    return 0;
}

/* Run @o's host function, its thread listed meanwhile. */
static void run_host_fn(op_t *o)
{
    pid_t me = (pid_t)syscall(SYS_gettid), none;
    int slot = -1;

    for (int i = 0; i < FN_THREADS && slot < 0; i++) {
        none = 0;
        if (atomic_compare_exchange_strong(&fn_tids[i], &none, me))
            slot = i;
    }
    o->fn(o->fn_arg);
    if (slot >= 0)
        fn_tids[slot] = 0;
}

#define NO_CALL_FROM_HOST_FN()                                                 \
    do {                                                                       \
        if (in_host_fn()) {                                                    \
            host_fn_refusals++;                                                \
            return CUDA_ERROR_NOT_PERMITTED;                                   \
        }                                                                      \
    } while (0)

EXPORT void kvt_cuda_double_fail_copy(long nth_from_now)
{
    fail_at = nth_from_now > 0 ? copies + nth_from_now : 0;
}

/* Imports of another process's memory made so far (not counting opens
 * of a handle already open, which the driver counts as references). */
EXPORT long kvt_cuda_double_ipc_opens(void)
{
    return ipc_opens;
}

/* Imports open now. */
/* How many driver calls made from inside a host function were refused. */
EXPORT long kvt_cuda_double_host_fn_refusals(void)
{
    return host_fn_refusals;
}

EXPORT long kvt_cuda_double_ipc_live(void)
{
    long n = 0;

    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        n += allocs[i].size != 0 && allocs[i].imported;
    pthread_mutex_unlock(&lock);
    return n;
}

/* The allocation holding [p, p + len): device view or pinned host. */
static alloc_t *find(uintptr_t p, size_t len)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc_t *a = &allocs[i];
        if (a->size != 0 && p >= a->view && p - a->view < a->size)
            return len <= a->size - (p - a->view) ? a : NULL;
    }
    return NULL;
}

/* Where a copy reads or writes @p: the shadow of device memory, the
 * address itself for host memory; NULL for device memory out of bounds. */
static uint8_t *where(uintptr_t p, size_t len)
{
    alloc_t *a;

    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        a = &allocs[i];
        if (a->size != 0 && a->dev >= 0 && p >= a->view &&
            p - a->view < a->size) {
            uint8_t *r = len <= a->size - (p - a->view)
                             ? a->shadow + (p - a->view)
                             : NULL;
            pthread_mutex_unlock(&lock);
            return r;
        }
    }
    pthread_mutex_unlock(&lock);
    return (uint8_t *)p;
}

#ifdef KVT_TSAN
/*
 * A device's copy engines write memory outside the view of any CPU
 * thread, and two streams may write the same bytes at once (a test that
 * writes one block from two connections does): ThreadSanitizer would take
 * that for a race between this double's copy threads, and stop the
 * process. Copy through the kernel, which it does not see, as the
 * transports' payload calls are (transport/tcp/tcp.h).
 */
static void dev_copy(void *dst, const void *src, size_t n)
{
    struct iovec l = {(void *)src, n}, r = {dst, n};
    if (syscall(SYS_process_vm_writev, (long)getpid(), &l, 1ul, &r, 1ul, 0ul) !=
        (long)n)
        memcpy(dst, src, n);
}
#else
#define dev_copy memcpy
#endif

static void *copy_main(void *arg)
{
    stream_t *s = arg;

    pthread_mutex_lock(&lock);
    for (;;) {
        op_t *o;
        while (s->q_head == NULL && !s->closing)
            pthread_cond_wait(&cond, &lock);
        if (s->q_head == NULL)
            break;
        o = s->q_head;
        s->q_head = o->next;
        if (s->q_head == NULL)
            s->q_tail = NULL;
        pthread_mutex_unlock(&lock);
        if (o->is_event) {
            o->ev->state = atomic_exchange(&s->failed, 0) ? 2 : 1;
        } else if (o->fn != NULL) {
            run_host_fn(o);
        } else {
            long n = ++copies;
            if (delay_us > 0) {
                struct timespec ts = {0, (long)delay_us * 1000};
                nanosleep(&ts, NULL);
            }
            if (fail_at != 0 && n == fail_at) {
                s->failed = 1;
                s->sync_failed = 1;
            } else {
                for (size_t r = 0; r < o->height; r++)
                    dev_copy((uint8_t *)o->dst + r * o->dpitch,
                             (const uint8_t *)o->src + r * o->spitch, o->width);
            }
        }
        s->done++;
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&done_cond);
        free(o);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* The copy thread of @s in this process: a child of fork() has none (a
 * real driver does not survive fork() either; the tests fork after
 * loading it), so one is started on first use in each process. Called
 * with the lock held. */
static int ensure_copier(stream_t *s)
{
    if (s->pid == getpid())
        return 0;
    if (pthread_create(&s->thread, NULL, copy_main, s) != 0)
        return -1;
    s->pid = getpid();
    return 0;
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void fork_child(void)
{
    /* What was queued belongs to the parent's copy threads. */
    for (stream_t *s = streams; s != NULL; s = s->next) {
        op_t *o = s->q_head;
        while (o != NULL) {
            op_t *n = o->next;
            free(o);
            o = n;
        }
        s->q_head = s->q_tail = NULL;
        s->done = s->queued;
        s->pid = 0;
    }
    pthread_cond_init(&cond, NULL);
    pthread_cond_init(&done_cond, NULL);
    pthread_mutex_unlock(&lock);
}

static CUresult enqueue(op_t *o, CUstream hs)
{
    stream_t *s = hs != NULL ? (stream_t *)hs : &null_stream;

    o->s = s;
    pthread_mutex_lock(&lock);
    if (ensure_copier(s) != 0) {
        pthread_mutex_unlock(&lock);
        free(o);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->queued++;
    if (s->q_tail)
        s->q_tail->next = o;
    else
        s->q_head = o;
    s->q_tail = o;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult copy2d(void *dst, const void *src, size_t w, size_t h,
                       size_t dp, size_t sp, CUstream hs)
{
    op_t *o = calloc(1, sizeof(*o));

    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->dst = dst;
    o->src = src;
    o->width = w;
    o->height = h;
    o->dpitch = dp;
    o->spitch = sp;
    return enqueue(o, hs);
}

/* ---- Initialisation, devices, contexts --------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    const char *v;

    (void)flags;
    pthread_mutex_lock(&lock);
    if (!started) {
        if ((v = getenv("KVT_CUDA_DOUBLE_DEVICES")) != NULL)
            ndev = atoi(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_DELAY_US")) != NULL)
            delay_us = (unsigned)atoi(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_FAIL_COPY")) != NULL)
            fail_at = atol(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_NO_IPC")) != NULL)
            no_ipc = atoi(v);
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        null_stream.next = streams;
        streams = &null_stream;
        started = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_SUCCESS:
        *s = "no error";
        break;
    case CUDA_ERROR_INVALID_VALUE:
        *s = "invalid argument";
        break;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "out of memory";
        break;
    case CUDA_ERROR_NOT_READY:
        *s = "device not ready";
        break;
    case CUDA_ERROR_LAUNCH_FAILED:
        *s = "unspecified launch failure";
        break;
    case CUDA_ERROR_INVALID_CONTEXT:
        *s = "invalid device context";
        break;
    case CUDA_ERROR_INVALID_DEVICE:
        *s = "invalid device ordinal";
        break;
    case CUDA_ERROR_NO_DEVICE:
        *s = "no CUDA-capable device is detected";
        break;
    case CUDA_ERROR_NOT_PERMITTED:
        *s = "operation not permitted";
        break;
    default:
        *s = "unknown error (test double)";
        break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    *n = ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (ordinal < 0 || ordinal >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    NO_CALL_FROM_HOST_FN();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *c = (CUcontext)(uintptr_t)(0x1000 + d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    return d >= 0 && d < ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    uintptr_t v = (uintptr_t)c;

    NO_CALL_FROM_HOST_FN();
    if (c == NULL) {
        cur_dev = -1;
        return CUDA_SUCCESS;
    }
    if (v < 0x1000 || v >= 0x1000 + (uintptr_t)ndev)
        return CUDA_ERROR_INVALID_CONTEXT;
    cur_dev = (int)(v - 0x1000);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
    *c = cur_dev < 0 ? NULL : (CUcontext)(uintptr_t)(0x1000 + cur_dev);
    return CUDA_SUCCESS;
}

/* ---- Memory ------------------------------------------------------------ */

/* List @a: 0, or -1 when the table is full. */
static int record(alloc_t a)
{
    int rc = -1;

    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS && rc != 0; i++) {
        if (allocs[i].size == 0) {
            allocs[i] = a;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Unlist the allocation handed out at @view, device memory (@device) or
 * pinned host memory; its entry (size 0 when there is none). */
static alloc_t take(uintptr_t view, int device)
{
    alloc_t a = {0};

    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].size != 0 && allocs[i].view == view &&
            (allocs[i].dev >= 0) == device) {
            a = allocs[i];
            allocs[i].size = 0;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return a;
}

/* "Device" memory: a memfd mapped twice, the view handed out without
 * access, the shadow read-write for the copies. */
EXPORT CUresult cuMemAlloc(CUdeviceptr *p, size_t size)
{
    size_t len = (size + 4095) & ~(size_t)4095;
    void *view = MAP_FAILED, *shadow = MAP_FAILED;
    int fd;

    NO_CALL_FROM_HOST_FN();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fd = memfd_create("kvt-cuda-double", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)len) == 0) {
        view = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
        shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (view == MAP_FAILED || shadow == MAP_FAILED ||
        record((alloc_t){(uintptr_t)view, shadow, len, cur_dev, fd, 0, 0, 0,
                         0}) != 0) {
        if (view != MAP_FAILED)
            munmap(view, len);
        if (shadow != MAP_FAILED)
            munmap(shadow, len);
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)(uintptr_t)view;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree(CUdeviceptr p)
{
    alloc_t a;

    NO_CALL_FROM_HOST_FN();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: a context */
    pthread_mutex_lock(&lock);
    {
        alloc_t *f = find((uintptr_t)p, 1);
        int imported = f != NULL && f->imported;
        pthread_mutex_unlock(&lock);
        if (imported) /* freed by cuIpcCloseMemHandle only */
            return CUDA_ERROR_INVALID_VALUE;
    }
    a = take((uintptr_t)p, 1);
    if (a.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)a.view, a.size);
    munmap(a.shadow, a.size);
    close(a.fd);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
    void *m;

    NO_CALL_FROM_HOST_FN();
    (void)flags;
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (record((alloc_t){(uintptr_t)m, m, size, -1, -1, 0, 0, 0, 0}) != 0) {
        munmap(m, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    alloc_t a;

    NO_CALL_FROM_HOST_FN();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    a = take((uintptr_t)p, 0);
    if (a.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, a.size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttributes(unsigned int n,
                                       CUpointer_attribute *attrs, void **data,
                                       CUdeviceptr ptr)
{
    alloc_t a = {0}, *f;

    NO_CALL_FROM_HOST_FN();
    pthread_mutex_lock(&lock);
    f = find((uintptr_t)ptr, 1);
    if (f != NULL)
        a = *f;
    pthread_mutex_unlock(&lock);
    for (unsigned i = 0; i < n; i++) {
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] =
                a.size == 0
                    ? 0
                    : (a.dev >= 0 ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST);
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = a.size == 0 ? -2 : (a.dev >= 0 ? a.dev : 0);
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(int *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = (CUdeviceptr)a.view;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = a.size;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
                                     CUdeviceptr ptr)
{
    CUresult r = CUDA_ERROR_NOT_FOUND;
    alloc_t *a;

    NO_CALL_FROM_HOST_FN();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: a context */
    pthread_mutex_lock(&lock);
    a = find((uintptr_t)ptr, 1);
    if (a != NULL && a->dev >= 0) {
        if (base)
            *base = (CUdeviceptr)a->view;
        if (size)
            *size = a->size;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- Copies, streams, events ------------------------------------------- */

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                              CUstream s)
{
    uint8_t *d = where((uintptr_t)dst, n), *sr = where((uintptr_t)src, n);

    NO_CALL_FROM_HOST_FN();
    if (d == NULL || sr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (n == 0)
        return CUDA_SUCCESS;
    return copy2d(d, sr, n, 1, n, n, s);
}

EXPORT CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream s)
{
    uintptr_t sb, db;
    size_t sspan, dspan;
    uint8_t *d, *sr;

    NO_CALL_FROM_HOST_FN();
    if (c->Height == 0 || c->WidthInBytes == 0)
        return CUDA_SUCCESS;
    if (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes ||
        c->srcPitch > INT32_MAX || c->dstPitch > INT32_MAX)
        return CUDA_ERROR_INVALID_VALUE; /* as the driver: pitch bounds */
    sb = c->srcMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)c->srcHost
                                                : (uintptr_t)c->srcDevice;
    db = c->dstMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)c->dstHost
                                                : (uintptr_t)c->dstDevice;
    sb += c->srcY * c->srcPitch + c->srcXInBytes;
    db += c->dstY * c->dstPitch + c->dstXInBytes;
    sspan = (c->Height - 1) * c->srcPitch + c->WidthInBytes;
    dspan = (c->Height - 1) * c->dstPitch + c->WidthInBytes;
    d = where(db, dspan);
    sr = where(sb, sspan);
    if (d == NULL || sr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return copy2d(d, sr, c->WidthInBytes, c->Height, c->dstPitch, c->srcPitch,
                  s);
}

/* ---- IPC ---------------------------------------------------------------- */

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    ipc_handle_t x = {IPC_MAGIC, (int32_t)getpid(), -1, 0, 0, 0};
    struct stat sb;
    alloc_t *a;

    NO_CALL_FROM_HOST_FN();
    if (no_ipc) /* as the driver for memory of the virtual-memory API */
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    a = find((uintptr_t)p, 1);
    if (a != NULL && a->dev >= 0 && !a->imported) {
        x.fd = a->fd;
        x.dev = a->dev;
        x.size = a->size;
    }
    pthread_mutex_unlock(&lock);
    if (x.fd < 0 || fstat(x.fd, &sb) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    x.ino = (uint64_t)sb.st_ino;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &x, sizeof(x));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
                                   unsigned int flags)
{
    ipc_handle_t x;
    char path[64];
    struct stat sb;
    void *view = MAP_FAILED, *shadow = MAP_FAILED;
    int fd;

    NO_CALL_FROM_HOST_FN();
    (void)flags;
    memcpy(&x, h.reserved, sizeof(x));
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (x.magic != IPC_MAGIC || x.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (x.pid == (int32_t)getpid()) /* as the driver: not one's own */
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc_t *a = &allocs[i];
        if (a->size != 0 && a->imported && a->pid == x.pid && a->ino == x.ino) {
            a->refs++;
            *p = (CUdeviceptr)a->view;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)x.pid, (int)x.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_ino != x.ino ||
        (uint64_t)sb.st_size < x.size) {
        close(fd);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    view = mmap(NULL, x.size, PROT_NONE, MAP_SHARED, fd, 0);
    shadow = mmap(NULL, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (view == MAP_FAILED || shadow == MAP_FAILED ||
        record((alloc_t){(uintptr_t)view, shadow, x.size, x.dev, fd, 1, 1,
                         x.pid, x.ino}) != 0) {
        if (view != MAP_FAILED)
            munmap(view, x.size);
        if (shadow != MAP_FAILED)
            munmap(shadow, x.size);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ipc_opens++;
    *p = (CUdeviceptr)(uintptr_t)view;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    alloc_t a = {0};

    NO_CALL_FROM_HOST_FN();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc_t *f = &allocs[i];
        if (f->size != 0 && f->imported && f->view == (uintptr_t)p) {
            if (--f->refs == 0) {
                a = *f;
                f->size = 0;
            } else {
                a.refs = 1;
            }
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (a.size == 0)
        return a.refs ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    munmap((void *)a.view, a.size);
    munmap(a.shadow, a.size);
    close(a.fd);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *hs, unsigned int flags)
{
    stream_t *s;

    NO_CALL_FROM_HOST_FN();
    (void)flags;
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    s = calloc(1, sizeof(stream_t));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&lock);
    *hs = (CUstream)s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream hs)
{
    stream_t *s = hs != NULL ? (stream_t *)hs : &null_stream;
    uint64_t want = s->queued;

    NO_CALL_FROM_HOST_FN();
    pthread_mutex_lock(&lock);
    while (s->done < want)
        pthread_cond_wait(&done_cond, &lock);
    pthread_mutex_unlock(&lock);
    /* Events and synchronisations each report a failure once: one does
     * not take it from the other. */
    return atomic_exchange(&s->sync_failed, 0) ? CUDA_ERROR_LAUNCH_FAILED
                                               : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream hs)
{
    stream_t *s = (stream_t *)hs, **pp;
    int joined;

    if (s == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    cuStreamSynchronize(hs);
    pthread_mutex_lock(&lock);
    for (pp = &streams; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    s->closing = 1;
    joined = s->pid == getpid();
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    if (joined)
        pthread_join(s->thread, NULL);
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    event_t *ev = calloc(1, sizeof(*ev));

    (void)flags;
    if (ev == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->state = 1; /* an event never recorded has completed */
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream hs)
{
    event_t *ev = (event_t *)e;
    op_t *o;

    NO_CALL_FROM_HOST_FN();
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->state = 0;
    o->is_event = 1;
    o->ev = ev;
    return enqueue(o, hs);
}

static CUresult event_result(CUevent e)
{
    int st = ((event_t *)e)->state;

    return st == 0 ? CUDA_ERROR_NOT_READY
                   : (st == 2 ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS);
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    event_t *ev = (event_t *)e;

    NO_CALL_FROM_HOST_FN();
    pthread_mutex_lock(&lock);
    while (ev->state == 0)
        pthread_cond_wait(&done_cond, &lock);
    pthread_mutex_unlock(&lock);
    return event_result(e);
}

/* As the driver: @fn runs once the stream's earlier work is done, and
 * the stream's later work starts after it returns. */
EXPORT CUresult cuLaunchHostFunc(CUstream hs, CUhostFn fn, void *arg)
{
    op_t *o;

    NO_CALL_FROM_HOST_FN();
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (hs == NULL && cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT; /* the NULL stream's context */
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->fn = fn;
    o->fn_arg = arg;
    return enqueue(o, hs);
}

EXPORT CUresult cuEventDestroy(CUevent e)
{
    cuEventSynchronize(e);
    free(e);
    return CUDA_SUCCESS;
}
