/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test double of the part of the CUDA driver API kvt uses, for machines
 * without a GPU: loaded by kvt in place of libcuda.so.1 when
 * KVT_CUDA_LIBRARY names it. Built for the tests only, never installed.
 * It refuses what the driver refuses, as the driver does; README.md lists
 * the rules and the controls (tests/cuda/README.md).
 *
 * "Device" memory is a memfd mapped twice: the address handed out has no
 * access at all (so host code that touches device memory directly faults,
 * as it would on a GPU), and a second, private mapping is what the copy
 * threads read and write. Each stream's copies and events run in order on
 * a thread of that stream, each copy after a delay
 * (KVT_CUDA_DOUBLE_DELAY_US, default 20), so that code which uses a buffer
 * before its copy completed, or orders work across streams without
 * waiting, sees stale bytes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
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
EXPORT void kvt_cuda_double_refuse_copy(long nth_from_now);
EXPORT void kvt_cuda_double_poison(int dev, int result);
EXPORT long kvt_cuda_double_ipc_opens(void);
EXPORT long kvt_cuda_double_ipc_live(void);
EXPORT long kvt_cuda_double_host_fn_refusals(void);
EXPORT long kvt_cuda_double_ctx_retains(int dev);
EXPORT long kvt_cuda_double_cross_device_copies(void);
EXPORT long kvt_cuda_double_inits(void);
EXPORT long kvt_cuda_double_lost_calls(void);

#define MAX_DEV 64

enum {
    K_DEVICE,  /* cuMemAlloc */
    K_HOST,    /* cuMemHostAlloc: pinned host memory */
    K_VMM,     /* a cuMemMap() mapping in a reservation */
    K_POOL,    /* cuMemAllocAsync: from the device's memory pool */
    K_MANAGED, /* cuMemAllocManaged */
};

/* A physical allocation of the virtual-memory API (cuMemCreate). */
typedef struct {
    int fd;
    size_t size;
    int dev;
    int maps; /* mappings of it now */
    int released;
} vmm_handle_t;

/* An address range reserved by cuMemAddressReserve(): mappings in it are
 * also mapped, at the same offsets, in a shadow reservation, so that a
 * copy across adjacent mappings sees one run of bytes. */
typedef struct {
    uintptr_t base;
    size_t size;
    uint8_t *shadow;
} resv_t;

typedef struct {
    uintptr_t view;  /* handed out; no access (managed: read-write) */
    uint8_t *shadow; /* what copies touch */
    size_t size;
    int kind;
    int dev; /* K_HOST: -1 */
    int fd;  /* K_DEVICE, K_POOL: its memfd */
    /* Opened from another process's IPC handle: that process and the
     * memfd's inode, and how many opens it has. */
    int imported, refs;
    pid_t pid;
    uint64_t ino;
    vmm_handle_t *vh; /* K_VMM */
    resv_t *rv;       /* K_VMM: its reservation */
} alloc_t;

/* An IPC handle: the exporter's memfd, reached through /proc, and the
 * physical device it lives on. */
typedef struct {
    uint32_t magic;
    int32_t pid, fd, phys;
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
    int fault; /* touches unmapped device memory: a sticky fault */
    int fail;  /* an injected failure (kvt_cuda_double_fail_copy) */
    void *dst;
    const void *src;
    size_t width, height, dpitch, spitch;
    /* Work of other streams this waits for (the legacy NULL stream's
     * ordering with blocking streams): the first nwait of them. */
    unsigned nwait;
    struct stream **wait_s;
    uint64_t *wait_seq;
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
    int dev;      /* the context it belongs to */
    int blocking; /* ordered with the device's NULL stream */
    int is_null;
    struct stream *next; /* every stream, for fork() and ordering */
} stream_t;

typedef struct event {
    stream_t *s; /* where it was last recorded */
    int dev;
    _Atomic int state; /* 0 pending, 1 done, 2 failed */
} event_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
/* Allocations, sorted by view (under lock). */
static alloc_t *allocs;
static size_t nallocs, acap;
static resv_t *resvs[1024]; /* reservations; under lock */
static unsigned nresvs;
static stream_t *streams;   /* under lock */
static stream_t *graveyard; /* destroyed streams (under lock) */
static int started, ndev = 2, no_ipc, fork_ok;
static int phys[MAX_DEV];      /* ordinal -> physical device */
static _Atomic pid_t init_pid; /* the process that called cuInit() */
static unsigned delay_us = 20;
static _Atomic long copies, fail_at, refuse_at, ipc_opens, inits;
static _Atomic long retains[MAX_DEV], cross_copies, lost_calls;
static _Atomic int sticky[MAX_DEV]; /* CUresult: the context is lost */
static stream_t null_streams[MAX_DEV];
static __thread int cur_dev = -1;
/* The threads running a host function now, by thread id: the driver
 * refuses calls made from one (CUDA_ERROR_NOT_PERMITTED). Not a
 * thread-local flag: a dlopen()ed library's thread-local storage in a
 * thread still running at exit crashes LeakSanitizer's scan. */
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

/*
 * What every call checks first, as the driver does: not from a host
 * function; cuInit() called, in this process (a child of fork() cannot
 * use the driver its parent initialised, unless KVT_CUDA_DOUBLE_FORK=1).
 */
static CUresult entry(void)
{
    if (in_host_fn()) {
        host_fn_refusals++;
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if (init_pid == 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (init_pid != getpid() && !fork_ok)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

#define ENTER()                                                                \
    do {                                                                       \
        CUresult e_ = entry();                                                 \
        if (e_ != CUDA_SUCCESS)                                                \
            return e_;                                                         \
    } while (0)

/* A current context, not lost. */
#define NEED_CTX()                                                             \
    do {                                                                       \
        if (cur_dev < 0)                                                       \
            return CUDA_ERROR_INVALID_CONTEXT;                                 \
        if (sticky[cur_dev] != 0) {                                            \
            lost_calls++;                                                      \
            return (CUresult)sticky[cur_dev];                                  \
        }                                                                      \
    } while (0)

EXPORT void kvt_cuda_double_fail_copy(long nth_from_now)
{
    fail_at = nth_from_now > 0 ? copies + nth_from_now : 0;
}

EXPORT void kvt_cuda_double_refuse_copy(long nth_from_now)
{
    refuse_at = nth_from_now > 0 ? copies + nth_from_now : 0;
}

/* Lose device @dev's context with @result (0: restore it). */
EXPORT void kvt_cuda_double_poison(int dev, int result)
{
    if (dev >= 0 && dev < MAX_DEV)
        sticky[dev] = result;
}

/* Imports of another process's memory made so far (not counting opens
 * of a handle already open, which the driver counts as references). */
EXPORT long kvt_cuda_double_ipc_opens(void)
{
    return ipc_opens;
}

/* How many driver calls made from inside a host function were refused. */
EXPORT long kvt_cuda_double_host_fn_refusals(void)
{
    return host_fn_refusals;
}

/* cuDevicePrimaryCtxRetain() calls on device @dev. */
EXPORT long kvt_cuda_double_ctx_retains(int dev)
{
    return dev >= 0 && dev < MAX_DEV ? retains[dev] : 0;
}

/* Copies on a stream of one device that touch another's memory. */
EXPORT long kvt_cuda_double_cross_device_copies(void)
{
    return cross_copies;
}

/* Calls made under a lost context (refused with its sticky error). */
EXPORT long kvt_cuda_double_lost_calls(void)
{
    return lost_calls;
}

/* Successful cuInit() calls in this process. */
EXPORT long kvt_cuda_double_inits(void)
{
    return init_pid == getpid() ? inits : 0;
}

/* Imports open now. */
EXPORT long kvt_cuda_double_ipc_live(void)
{
    long n = 0;

    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nallocs; i++)
        n += allocs[i].imported;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---- The allocation table ---------------------------------------------- */

/* The index of the first allocation whose view ends above @p. Under
 * lock. */
static size_t lower(uintptr_t p)
{
    size_t a = 0, b = nallocs;

    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (allocs[m].view + allocs[m].size <= p)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* The allocation holding @p, or NULL. Under lock. */
static alloc_t *holding(uintptr_t p)
{
    size_t i = lower(p);

    return i < nallocs && allocs[i].view <= p ? &allocs[i] : NULL;
}

static resv_t *resv_of(uintptr_t p)
{
    for (unsigned i = 0; i < nresvs; i++)
        if (p >= resvs[i]->base && p - resvs[i]->base < resvs[i]->size)
            return resvs[i];
    return NULL;
}

/* List @a: 0, or -1 when out of memory. */
static int record(alloc_t a)
{
    size_t i;

    pthread_mutex_lock(&lock);
    if (nallocs == acap) {
        size_t nc = acap ? 2 * acap : 1024;
        alloc_t *n = realloc(allocs, nc * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&lock);
            return -1;
        }
        allocs = n;
        acap = nc;
    }
    i = lower(a.view);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof(*allocs));
    allocs[i] = a;
    nallocs++;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* Unlist the allocation at index @i. Under lock. */
static alloc_t unlist(size_t i)
{
    alloc_t a = allocs[i];

    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof(*allocs));
    nallocs--;
    return a;
}

/* Unlist the allocation of @kind handed out at @view; its entry (size 0
 * when there is none). */
static alloc_t take(uintptr_t view, int kind)
{
    alloc_t a = {0};
    alloc_t *f;

    pthread_mutex_lock(&lock);
    f = holding(view);
    if (f != NULL && f->view == view && f->kind == kind && !f->imported)
        a = unlist((size_t)(f - allocs));
    pthread_mutex_unlock(&lock);
    return a;
}

/* Where a copy reads or writes @p: the shadow of device memory, the
 * address itself for host memory; NULL for device memory out of bounds
 * (refused when the copy is queued), FAULT for addresses of a reservation
 * not mapped from end to end (a fault on the device when it runs). *dev_p:
 * the device whose memory it is, or -1. */
#define FAULT ((uint8_t *)-1)
static uint8_t *where(uintptr_t p, size_t len, int *dev_p)
{
    alloc_t *a;
    resv_t *rv;
    uint8_t *r = (uint8_t *)p;

    *dev_p = -1;
    pthread_mutex_lock(&lock);
    rv = resv_of(p);
    if (rv != NULL) {
        /* Mapped from end to end, across adjacent mappings. */
        uintptr_t at = p, end = p + len;
        r = len <= rv->size - (p - rv->base) ? rv->shadow + (p - rv->base)
                                             : FAULT;
        while (r != FAULT && at < end) {
            a = holding(at);
            if (a == NULL || a->kind != K_VMM)
                r = FAULT;
            else {
                *dev_p = a->dev;
                at = a->view + a->size;
            }
        }
    } else if ((a = holding(p)) != NULL && a->kind != K_HOST) {
        r = len <= a->size - (p - a->view) ? a->shadow + (p - a->view) : NULL;
        *dev_p = a->kind == K_MANAGED ? -1 : a->dev;
    }
    pthread_mutex_unlock(&lock);
    return r;
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

/* ---- Streams ------------------------------------------------------------ */

static void run_op(stream_t *s, op_t *o)
{
    if (o->is_event) {
        o->ev->state =
            atomic_exchange(&s->failed, 0) || sticky[s->dev] != 0 ? 2 : 1;
        return;
    }
    if (o->fn != NULL) {
        run_host_fn(o);
        return;
    }
    if (delay_us > 0) {
        struct timespec ts = {0, (long)delay_us * 1000};
        nanosleep(&ts, NULL);
    }
    if (o->fault || o->fail || sticky[s->dev] != 0) {
        /* As the driver: a fault on the device loses the context. */
        int r = o->fault ? CUDA_ERROR_ILLEGAL_ADDRESS
                         : CUDA_ERROR_LAUNCH_FAILED,
            none = 0;
        if (o->fault || o->fail)
            atomic_compare_exchange_strong(&sticky[s->dev], &none, r);
        s->failed = 1;
        s->sync_failed = 1;
        return;
    }
    for (size_t r = 0; r < o->height; r++)
        dev_copy((uint8_t *)o->dst + r * o->dpitch,
                 (const uint8_t *)o->src + r * o->spitch, o->width);
}

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
        /* Earlier work of the streams it is ordered after. */
        for (unsigned w = 0; w < o->nwait; w++)
            while (o->wait_s[w]->done < o->wait_seq[w] &&
                   o->wait_s[w]->pid == getpid())
                pthread_cond_wait(&done_cond, &lock);
        s->q_head = o->next;
        if (s->q_head == NULL)
            s->q_tail = NULL;
        pthread_mutex_unlock(&lock);
        run_op(s, o);
        s->done++;
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&done_cond);
        free(o->wait_s);
        free(o->wait_seq);
        free(o);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* The copy thread of @s in this process: a child of fork() has none, so
 * one is started on first use in each process. Called with the lock
 * held. */
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
            free(o->wait_s);
            free(o->wait_seq);
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

/* The stream a handle names: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD (taken
 * as the legacy one) and NULL are the current context's NULL stream. */
static stream_t *stream_of(CUstream hs)
{
    if (hs == NULL || hs == CU_STREAM_LEGACY || hs == CU_STREAM_PER_THREAD)
        return cur_dev >= 0 ? &null_streams[cur_dev] : NULL;
    return (stream_t *)hs;
}

/*
 * Queue @o on @s. The legacy NULL stream is ordered with the blocking
 * streams of its context: its work waits for what they queued before,
 * and theirs for what it queued before (non-blocking streams are not).
 */
static CUresult enqueue(op_t *o, stream_t *s)
{
    unsigned cap = 0;

    o->s = s;
    pthread_mutex_lock(&lock);
    if (ensure_copier(s) != 0) {
        pthread_mutex_unlock(&lock);
        free(o);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (stream_t *t = streams; t != NULL; t = t->next) {
        int orders = s->is_null
                         ? (t != s && t->blocking && t->dev == s->dev)
                         : (s->blocking && t->is_null && t->dev == s->dev);
        if (!orders || t->done >= t->queued)
            continue;
        if (o->nwait == cap) {
            unsigned nc = cap ? 2 * cap : 4;
            void *a = realloc(o->wait_s, nc * sizeof(*o->wait_s));
            void *b =
                a ? realloc(o->wait_seq, nc * sizeof(*o->wait_seq)) : NULL;
            if (a != NULL)
                o->wait_s = a;
            if (b == NULL)
                break; /* ordered less: not worse than before */
            o->wait_seq = b;
            cap = nc;
        }
        o->wait_s[o->nwait] = t;
        o->wait_seq[o->nwait++] = t->queued;
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

/* ---- Initialisation, devices, contexts --------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    const char *v;

    (void)flags;
    if (in_host_fn()) {
        host_fn_refusals++;
        return CUDA_ERROR_NOT_PERMITTED;
    }
    pthread_mutex_lock(&lock);
    if (init_pid != 0 && init_pid != getpid() && !fork_ok) {
        /* As the driver: what a parent initialised is not usable in a
         * child of fork(). */
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!started) {
        if ((v = getenv("KVT_CUDA_DOUBLE_DEVICES")) != NULL)
            ndev = atoi(v);
        if (ndev > MAX_DEV)
            ndev = MAX_DEV;
        for (int i = 0; i < MAX_DEV; i++)
            phys[i] = i;
        /* KVT_CUDA_DOUBLE_VISIBLE="1,0": ordinal i is physical device
         * v[i] (CUDA_VISIBLE_DEVICES). */
        if ((v = getenv("KVT_CUDA_DOUBLE_VISIBLE")) != NULL) {
            for (int i = 0; i < ndev && *v != '\0'; i++) {
                char *e;
                phys[i] = (int)strtol(v, &e, 10);
                v = *e == ',' ? e + 1 : e;
            }
        }
        if ((v = getenv("KVT_CUDA_DOUBLE_DELAY_US")) != NULL)
            delay_us = (unsigned)atoi(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_FAIL_COPY")) != NULL)
            fail_at = atol(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_NO_IPC")) != NULL)
            no_ipc = atoi(v);
        if ((v = getenv("KVT_CUDA_DOUBLE_FORK")) != NULL)
            fork_ok = atoi(v);
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        for (int d = MAX_DEV - 1; d >= 0; d--) {
            null_streams[d].dev = d;
            null_streams[d].is_null = 1;
            null_streams[d].next = streams;
            streams = &null_streams[d];
        }
        started = 1;
    }
    init_pid = getpid();
    inits++;
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
    case CUDA_ERROR_NOT_INITIALIZED:
        *s = "initialization error";
        break;
    case CUDA_ERROR_NOT_READY:
        *s = "device not ready";
        break;
    case CUDA_ERROR_LAUNCH_FAILED:
        *s = "unspecified launch failure";
        break;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        *s = "an illegal memory access was encountered";
        break;
    case CUDA_ERROR_INVALID_CONTEXT:
        *s = "invalid device context";
        break;
    case CUDA_ERROR_INVALID_HANDLE:
        *s = "invalid resource handle";
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
    case CUDA_ERROR_NOT_SUPPORTED:
        *s = "operation not supported";
        break;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
        *s = "peer access is not supported between these two devices";
        break;
    default:
        *s = "unknown error (test double)";
        break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    ENTER();
    *n = ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    ENTER();
    if (ordinal < 0 || ordinal >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

/* A device's UUID: its physical number, so that two processes that
 * number the devices differently (KVT_CUDA_DOUBLE_VISIBLE) agree. */
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    ENTER();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    memset(u, 0, sizeof(*u));
    memcpy(u->bytes, "kvt-double-gpu", 14);
    u->bytes[15] = (char)phys[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    ENTER();
    if (d < 0 || d >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    retains[d]++;
    *c = (CUcontext)(uintptr_t)(0x1000 + d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    ENTER();
    return d >= 0 && d < ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    uintptr_t v = (uintptr_t)c;

    ENTER();
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
    ENTER();
    *c = cur_dev < 0 ? NULL : (CUcontext)(uintptr_t)(0x1000 + cur_dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    ENTER();
    if (cur_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = cur_dev;
    return CUDA_SUCCESS;
}

/* ---- Memory ------------------------------------------------------------ */

/* A memfd of @len bytes mapped twice: the view without access (@at: where,
 * or anywhere), the shadow read-write (@sat: where, or anywhere). */
static int map_twice(int fd, size_t len, off_t off, void *at, void *sat,
                     void **view_p, void **shadow_p)
{
    int fx = at != NULL ? MAP_FIXED : 0, sfx = sat != NULL ? MAP_FIXED : 0;
    void *view = mmap(at, len, PROT_NONE, MAP_SHARED | fx, fd, off);
    void *shadow =
        mmap(sat, len, PROT_READ | PROT_WRITE, MAP_SHARED | sfx, fd, off);

    if (view == MAP_FAILED || shadow == MAP_FAILED) {
        if (view != MAP_FAILED && at == NULL)
            munmap(view, len);
        if (shadow != MAP_FAILED && sat == NULL)
            munmap(shadow, len);
        return -1;
    }
    *view_p = view;
    *shadow_p = shadow;
    return 0;
}

static CUresult alloc_device(CUdeviceptr *p, size_t size, int kind)
{
    size_t len = (size + 4095) & ~(size_t)4095;
    void *view, *shadow;
    int fd;

    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fd = memfd_create("kvt-cuda-double", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)len) != 0 ||
        map_twice(fd, len, 0, NULL, NULL, &view, &shadow) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (record((alloc_t){.view = (uintptr_t)view,
                         .shadow = shadow,
                         .size = len,
                         .kind = kind,
                         .dev = cur_dev,
                         .fd = fd}) != 0) {
        munmap(view, len);
        munmap(shadow, len);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)(uintptr_t)view;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr *p, size_t size)
{
    ENTER();
    NEED_CTX();
    return alloc_device(p, size, K_DEVICE);
}

/* Memory the host reaches (one read-write mapping), listed as @kind. */
static CUresult alloc_host(void **p, size_t size, int kind, int dev)
{
    void *m;

    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (record((alloc_t){.view = (uintptr_t)m,
                         .shadow = m,
                         .size = size,
                         .kind = kind,
                         .dev = dev,
                         .fd = -1}) != 0) {
        munmap(m, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = m;
    return CUDA_SUCCESS;
}

/* Managed memory: the host reaches it. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size,
                                  unsigned int flags)
{
    void *m = NULL;
    CUresult r;

    ENTER();
    NEED_CTX();
    (void)flags;
    r = alloc_host(&m, size, K_MANAGED, cur_dev);
    *p = (CUdeviceptr)(uintptr_t)m;
    return r;
}

static void free_alloc(alloc_t a)
{
    if (a.kind == K_MANAGED) {
        munmap((void *)a.view, a.size);
        return;
    }
    munmap((void *)a.view, a.size);
    munmap(a.shadow, a.size);
    close(a.fd);
}

EXPORT CUresult cuMemFree(CUdeviceptr p)
{
    alloc_t a;

    ENTER();
    NEED_CTX();
    a = take((uintptr_t)p, K_DEVICE);
    if (a.size == 0)
        a = take((uintptr_t)p, K_MANAGED);
    if (a.size == 0) /* imported memory is freed by cuIpcCloseMemHandle */
        return CUDA_ERROR_INVALID_VALUE;
    free_alloc(a);
    return CUDA_SUCCESS;
}

/* Memory of the device's pool (stream-ordered allocation): not covered
 * by legacy IPC handles. Taken as allocated at once. */
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream hs)
{
    ENTER();
    NEED_CTX();
    (void)hs;
    return alloc_device(p, size, K_POOL);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream hs)
{
    alloc_t a;

    ENTER();
    NEED_CTX();
    (void)hs;
    a = take((uintptr_t)p, K_POOL);
    if (a.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    free_alloc(a);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
    ENTER();
    NEED_CTX();
    (void)flags;
    return alloc_host(p, size, K_HOST, -1);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    alloc_t a;

    ENTER();
    NEED_CTX();
    a = take((uintptr_t)p, K_HOST);
    if (a.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, a.size);
    return CUDA_SUCCESS;
}

/* ---- The virtual-memory API -------------------------------------------- */

#define GRANULE ((size_t)2 << 20)

EXPORT CUresult
cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                              CUmemAllocationGranularity_flags option)
{
    ENTER();
    (void)prop;
    (void)option;
    *g = GRANULE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size,
                                    size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags)
{
    resv_t *rv;
    void *v, *s;

    ENTER();
    (void)alignment;
    (void)addr;
    (void)flags;
    if (size == 0 || size % GRANULE != 0)
        return CUDA_ERROR_INVALID_VALUE;
    rv = calloc(1, sizeof(*rv));
    v = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    s = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    pthread_mutex_lock(&lock);
    if (rv == NULL || v == MAP_FAILED || s == MAP_FAILED ||
        nresvs == sizeof(resvs) / sizeof(resvs[0])) {
        pthread_mutex_unlock(&lock);
        if (v != MAP_FAILED)
            munmap(v, size);
        if (s != MAP_FAILED)
            munmap(s, size);
        free(rv);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rv->base = (uintptr_t)v;
    rv->size = size;
    rv->shadow = s;
    resvs[nresvs++] = rv;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    resv_t *rv = NULL;

    ENTER();
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < nresvs; i++) {
        if (resvs[i]->base == (uintptr_t)p && resvs[i]->size == size) {
            size_t k = lower(resvs[i]->base);
            if (k < nallocs && allocs[k].view < resvs[i]->base + size)
                break; /* still mapped */
            rv = resvs[i];
            resvs[i] = resvs[--nresvs];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (rv == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)rv->base, rv->size);
    munmap(rv->shadow, rv->size);
    free(rv);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    vmm_handle_t *vh;

    ENTER();
    (void)flags;
    if (size == 0 || size % GRANULE != 0 ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop->location.id < 0 || prop->location.id >= ndev)
        return CUDA_ERROR_INVALID_VALUE;
    vh = calloc(1, sizeof(*vh));
    if (vh == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    vh->fd = memfd_create("kvt-cuda-double-vmm", MFD_CLOEXEC);
    if (vh->fd < 0 || ftruncate(vh->fd, (off_t)size) != 0) {
        if (vh->fd >= 0)
            close(vh->fd);
        free(vh);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vh->size = size;
    vh->dev = prop->location.id;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)vh;
    return CUDA_SUCCESS;
}

static void vmm_put(vmm_handle_t *vh)
{
    if (vh->released && vh->maps == 0) {
        close(vh->fd);
        free(vh);
    }
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    vmm_handle_t *vh = (vmm_handle_t *)(uintptr_t)h;

    ENTER();
    pthread_mutex_lock(&lock);
    vh->released = 1;
    vmm_put(vh);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                         CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
    vmm_handle_t *vh = (vmm_handle_t *)(uintptr_t)h;
    uintptr_t at = (uintptr_t)p;
    void *view, *shadow;
    resv_t *rv;
    size_t k;

    ENTER();
    (void)flags;
    pthread_mutex_lock(&lock);
    rv = resv_of(at);
    k = lower(at);
    if (rv == NULL || size == 0 || offset + size > vh->size ||
        size > rv->size - (at - rv->base) ||
        (k < nallocs && allocs[k].view < at + size)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (map_twice(vh->fd, size, (off_t)offset, (void *)at,
                  rv->shadow + (at - rv->base), &view, &shadow) != 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vh->maps++;
    pthread_mutex_unlock(&lock);
    if (record((alloc_t){.view = at,
                         .shadow = shadow,
                         .size = size,
                         .kind = K_VMM,
                         .dev = vh->dev,
                         .fd = -1,
                         .vh = vh,
                         .rv = rv}) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    uintptr_t at = (uintptr_t)p;
    alloc_t a = {0};
    alloc_t *f;

    ENTER();
    pthread_mutex_lock(&lock);
    f = holding(at);
    if (f != NULL && f->kind == K_VMM && f->view == at && f->size == size)
        a = unlist((size_t)(f - allocs));
    if (a.size != 0) {
        mmap((void *)a.view, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        mmap(a.shadow, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        a.vh->maps--;
        vmm_put(a.vh);
    }
    pthread_mutex_unlock(&lock);
    return a.size != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size,
                               const CUmemAccessDesc *desc, size_t count)
{
    ENTER();
    (void)p;
    (void)size;
    (void)desc;
    return count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- What the driver knows of an address -------------------------------- */

EXPORT CUresult cuPointerGetAttributes(unsigned int n,
                                       CUpointer_attribute *attrs, void **data,
                                       CUdeviceptr ptr)
{
    alloc_t a = {0}, *f;
    uintptr_t rbase = 0;
    size_t rsize = 0;
    int known, legacy;

    ENTER();
    pthread_mutex_lock(&lock);
    f = holding((uintptr_t)ptr);
    if (f != NULL) {
        a = *f;
        rbase = a.kind == K_VMM ? a.rv->base : a.view;
        rsize = a.kind == K_VMM ? a.rv->size : a.size;
    } else {
        resv_t *rv = resv_of((uintptr_t)ptr);
        if (rv != NULL) /* reserved, not mapped */
            rbase = rv->base, rsize = rv->size;
    }
    pthread_mutex_unlock(&lock);
    known = a.size != 0;
    legacy = known && (a.kind == K_DEVICE || a.imported);
    for (unsigned i = 0; i < n; i++) {
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] =
                !known ? 0
                       : (a.kind == K_HOST ? CU_MEMORYTYPE_HOST
                                           : CU_MEMORYTYPE_DEVICE);
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = !known ? -2 : (a.dev >= 0 ? a.dev : 0);
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(int *)data[i] = known && a.kind == K_MANAGED;
            break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            *(int *)data[i] = legacy;
            break;
        case CU_POINTER_ATTRIBUTE_MAPPED:
            *(int *)data[i] = known;
            break;
        /* As the driver: the range is the mappable address range (a
         * reservation, for the virtual-memory API); the mapping is
         * cuMemGetAddressRange()'s. The mapping attributes are not among
         * those the reference lists for this call: refused. */
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = (CUdeviceptr)rbase;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = rsize;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

/* The allocation (for the virtual-memory API: the mapping) holding
 * @ptr. */
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
                                     CUdeviceptr ptr)
{
    CUresult r = CUDA_ERROR_NOT_FOUND;
    alloc_t *a;

    ENTER();
    NEED_CTX();
    pthread_mutex_lock(&lock);
    a = holding((uintptr_t)ptr);
    if (a != NULL && a->kind != K_HOST) {
        if (base)
            *base = (CUdeviceptr)a->view;
        if (size)
            *size = a->size;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- Copies ------------------------------------------------------------ */

/* Queue a copy of @h rows of @w bytes on @hs, under the current context
 * (the stream's). */
static CUresult copy_rows(uintptr_t db, uintptr_t sb, size_t w, size_t h,
                          size_t dp, size_t sp, CUstream hs)
{
    size_t dspan = (h - 1) * dp + w, sspan = (h - 1) * sp + w;
    int ddev, sdev;
    uint8_t *d = where(db, dspan, &ddev), *sr = where(sb, sspan, &sdev);
    stream_t *s = stream_of(hs);
    long n = ++copies;
    op_t *o;

    if (s == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (s->dev != cur_dev)
        return CUDA_ERROR_INVALID_HANDLE; /* another context's stream */
    if (sticky[s->dev] != 0)
        return (CUresult)sticky[s->dev];
    if (d == NULL || sr == NULL || (refuse_at != 0 && n == refuse_at))
        return CUDA_ERROR_INVALID_VALUE;
    if ((ddev >= 0 && ddev != s->dev) || (sdev >= 0 && sdev != s->dev))
        cross_copies++;
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->fault = d == FAULT || sr == FAULT;
    o->fail = fail_at != 0 && n == fail_at;
    o->dst = d;
    o->src = sr;
    o->width = w;
    o->height = h;
    o->dpitch = dp;
    o->spitch = sp;
    return enqueue(o, s);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                              CUstream s)
{
    ENTER();
    NEED_CTX();
    if (n == 0)
        return CUDA_SUCCESS;
    return copy_rows((uintptr_t)dst, (uintptr_t)src, n, 1, n, n, s);
}

EXPORT CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream s)
{
    uintptr_t sb, db;

    ENTER();
    NEED_CTX();
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
    return copy_rows(db, sb, c->WidthInBytes, c->Height, c->dstPitch,
                     c->srcPitch, s);
}

/* ---- IPC ---------------------------------------------------------------- */

/* As the driver: the base of an allocation of cuMemAlloc() (not of the
 * virtual-memory API, nor of a pool), under a context. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    ipc_handle_t x = {IPC_MAGIC, (int32_t)getpid(), -1, 0, 0, 0};
    struct stat sb;
    alloc_t *a;

    ENTER();
    NEED_CTX();
    if (no_ipc) /* as the driver for memory it cannot share */
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    a = holding((uintptr_t)p);
    if (a != NULL && a->kind == K_DEVICE && !a->imported &&
        a->view == (uintptr_t)p) {
        x.fd = a->fd;
        x.phys = phys[a->dev];
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
    void *view, *shadow;
    int fd;

    ENTER();
    NEED_CTX();
    (void)flags;
    memcpy(&x, h.reserved, sizeof(x));
    if (x.magic != IPC_MAGIC || x.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (x.pid == (int32_t)getpid()) /* as the driver: not one's own */
        return CUDA_ERROR_INVALID_CONTEXT;
    /* Under another device's context, the memory would be reached over
     * the peer link: as on GPUs without one, refused. */
    if (x.phys != phys[cur_dev])
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nallocs; i++) {
        alloc_t *a = &allocs[i];
        if (a->imported && a->pid == x.pid && a->ino == x.ino) {
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
    if (map_twice(fd, x.size, 0, NULL, NULL, &view, &shadow) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (record((alloc_t){.view = (uintptr_t)view,
                         .shadow = shadow,
                         .size = x.size,
                         .kind = K_DEVICE,
                         .dev = cur_dev,
                         .fd = fd,
                         .imported = 1,
                         .refs = 1,
                         .pid = x.pid,
                         .ino = x.ino}) != 0) {
        munmap(view, x.size);
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
    alloc_t *f;

    ENTER();
    NEED_CTX();
    pthread_mutex_lock(&lock);
    f = holding((uintptr_t)p);
    if (f != NULL && f->imported && f->view == (uintptr_t)p) {
        if (--f->refs == 0)
            a = unlist((size_t)(f - allocs));
        else
            a.refs = 1;
    }
    pthread_mutex_unlock(&lock);
    if (a.size == 0)
        return a.refs ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    free_alloc(a);
    return CUDA_SUCCESS;
}

/* ---- Streams, events, host functions ----------------------------------- */

EXPORT CUresult cuStreamCreate(CUstream *hs, unsigned int flags)
{
    stream_t *s;

    ENTER();
    NEED_CTX();
    if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
        return CUDA_ERROR_INVALID_VALUE;
    s = calloc(1, sizeof(stream_t));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->dev = cur_dev;
    s->blocking = !(flags & CU_STREAM_NON_BLOCKING);
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&lock);
    *hs = (CUstream)s;
    return CUDA_SUCCESS;
}

/* Wait until @s has run @want operations (its copy thread in this
 * process: none in a child of fork() that queued nothing). Under lock. */
static void wait_done(stream_t *s, uint64_t want)
{
    while (s->done < want && s->pid == getpid())
        pthread_cond_wait(&done_cond, &lock);
}

EXPORT CUresult cuStreamSynchronize(CUstream hs)
{
    stream_t *s;

    ENTER();
    s = stream_of(hs);
    if (s == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    if (s->is_null) /* and, as its work would, the blocking streams' */
        for (stream_t *t = streams; t != NULL; t = t->next)
            if (t->blocking && t->dev == s->dev)
                wait_done(t, t->queued);
    wait_done(s, s->queued);
    pthread_mutex_unlock(&lock);
    if (sticky[s->dev] != 0) {
        s->sync_failed = 0;
        return (CUresult)sticky[s->dev];
    }
    /* Events and synchronisations each report a failure once: one does
     * not take it from the other. */
    return atomic_exchange(&s->sync_failed, 0) ? CUDA_ERROR_LAUNCH_FAILED
                                               : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream hs)
{
    stream_t *s = (stream_t *)hs, **pp;
    int joined;

    ENTER();
    if (s == NULL || s->is_null || hs == CU_STREAM_LEGACY ||
        hs == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    wait_done(s, s->queued);
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
    /* Kept, not freed: work queued on the NULL stream before may still
     * look at how far this stream got. */
    pthread_mutex_lock(&lock);
    s->next = graveyard;
    graveyard = s;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    event_t *ev;

    ENTER();
    NEED_CTX();
    (void)flags;
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->state = 1; /* an event never recorded has completed */
    ev->dev = cur_dev;
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream hs)
{
    event_t *ev = (event_t *)e;
    stream_t *s;
    op_t *o;

    ENTER();
    NEED_CTX();
    s = stream_of(hs);
    if (s->dev != ev->dev || s->dev != cur_dev)
        return CUDA_ERROR_INVALID_HANDLE; /* as the driver: one context */
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->state = 0;
    ev->s = s;
    o->is_event = 1;
    o->ev = ev;
    return enqueue(o, s);
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    event_t *ev = (event_t *)e;
    int st;

    ENTER();
    pthread_mutex_lock(&lock);
    while (ev->state == 0 && ev->s != NULL && ev->s->pid == getpid())
        pthread_cond_wait(&done_cond, &lock);
    st = ev->state;
    pthread_mutex_unlock(&lock);
    if (sticky[ev->dev] != 0)
        return (CUresult)sticky[ev->dev];
    return st == 0 ? CUDA_ERROR_NOT_READY
                   : (st == 2 ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS);
}

EXPORT CUresult cuEventDestroy(CUevent e)
{
    ENTER();
    cuEventSynchronize(e);
    free(e);
    return CUDA_SUCCESS;
}

/* As the driver: @fn runs once the stream's earlier work is done, and
 * the stream's later work starts after it returns. */
EXPORT CUresult cuLaunchHostFunc(CUstream hs, CUhostFn fn, void *arg)
{
    stream_t *s;
    op_t *o;

    ENTER();
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    s = stream_of(hs);
    if (s == NULL)
        return CUDA_ERROR_INVALID_CONTEXT; /* the NULL stream's context */
    if (sticky[s->dev] != 0)
        return (CUresult)sticky[s->dev];
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->fn = fn;
    o->fn_arg = arg;
    return enqueue(o, s);
}
