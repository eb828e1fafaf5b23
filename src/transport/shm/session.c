/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host transport, initiator side: a session to a target on this
 * host, met on the abstract socket its descriptor's shm section names.
 * Its liveness comes from the target process itself (a pidfd, its
 * /proc state) and the socket.
 *
 * Jobs. A submission is cut into jobs, runs of segments of one opcode of
 * at most JOB_MAX bytes and JOB_SEGS segments, sized so that a large
 * submission spreads over every executor; a NOTIFY is a job of its own.
 * Jobs queue on their session in submission order.
 *
 * Executors. Whoever takes a job runs it: a pool worker, or the thread
 * waiting on the batch (the ops' progress), so a synchronous transfer costs
 * no wake-up. Several threads run jobs of one session at once; that is
 * how a large submission is split across threads. Running a job: take the
 * channel's lease (target.c explains it), check every segment against the
 * target's snapshot, copy it with memcpy through a mapping of the
 * target's allocation when there is one, through the channel's staging
 * slots for small strided pieces written into memory that is not mapped
 * (after the lease: the target checks those itself), and with
 * process_vm_writev/readv (up to 1024 vectors a call, contiguous pieces
 * merged) otherwise, and release the lease. Success also needs the
 * target alive and not stopped when they ended: a copy into a target
 * that is stopped (SIGSTOP, a tracer) or dead is not a transfer, and
 * times out or fails instead of counting as delivered. A job copied while
 * its target is stopped is parked on its session rather than holding its
 * executor, and a pool worker ends it once the target runs again (or the
 * job's deadline passes). Jobs staged through slots, or waiting for the
 * lease, still wait for the target in their executor; a session whose
 * staged job waits for a stopped target is held (no executor takes its
 * other jobs) until the target runs again.
 *
 * Ordering. A NOTIFY job is taken only at the head of its session's queue
 * with no other job of the session running, so the target delivers it
 * after every write submitted before it has landed. Only one NOTIFY runs
 * at a time per session, so the notification ring has one producer.
 *
 * Completion lifecycle. Before any job is queued, each slot's remaining
 * count is set to the number of jobs holding its segments; each job
 * completes each of its slots exactly once, with the first failure among
 * that slot's segments, whether it ran, timed out or was cancelled by
 * kill(). A job is either queued, held by the one executor that took it,
 * or parked (both counted in @inflight): kill() fails the queued and the
 * parked ones, executors finish theirs. The session's channel, socket
 * and mappings are released once it is dead and nothing is in flight.
 *
 * Locks. Order: pool_lock -> session lock. map_lock (writer-preferring)
 * is held for reading across the copies of a job and for writing while
 * mappings change; sock_lock serialises requests on the socket and is
 * held only across one bounded request. No lock is held while waiting for
 * the lease, and the lease is never held while waiting for the target.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/log.h"
#include "util/time.h"

#define JOB_MIN (1024u * 1024u)
#define SPLIT_MIN (2u * 1024u * 1024u)
#define JOB_MAX (8u * 1024u * 1024u)
#define JOB_SEGS 1024u
#define CMA_IOV 1024 /* UIO_MAXIOV */
#define TICK_NS (50ull * 1000000ull)
#define SLICE_NS (10 * 1000000)
#define STOPPED_POLL_NS (1000u * 1000u)
#define WAIT_SPIN_NS (50u * 1000u)
#define NOMAP_MAX 16
/* Strided pieces up to this size stay whole, grouped in one segment. */
#define PACK_MAX (64u * 1024u)
/* Strided writes of pieces up to this size into memory that is not
 * mapped go through the staging slots (shm.h) rather than cross-memory
 * attach, which pins a target page per vector when the pieces are
 * strided there and takes a vector per piece when they are strided
 * here. */
#define STAGE_PIECE_MAX 2048u
/* Allocations up to this size are mapped with their page tables filled. */
#define POPULATE_MAX (4ull << 30)

/* @count pieces of @len bytes (1: a contiguous range), the k-th at
 * laddr + k * lstride here and raddr + k * rstride in the target. */
typedef struct {
    uint64_t laddr;
    uint64_t raddr;
    uint64_t len;
    uint64_t lstride, rstride;
    uint64_t vlo, vhi; /* must lie wholly in one region */
    uint32_t count;
    int32_t st;
    kvt__comp_t *comp; /* of the descriptor it is part of */
} seg_t;

/* How a segment is copied (rw_run). */
enum { HOW_NONE, HOW_MAP, HOW_CMA, HOW_STAGE };

/* One allocation per submission: this header, the jobs, the segments and
 * the notification messages; freed when its last job completes. */
typedef struct job_block {
    alignas(16) _Atomic uint32_t refs;
} job_block_t;

typedef struct job {
    struct job *next;
    job_block_t *blk;
    uint32_t op;
    uint32_t nsegs;
    uint64_t deadline;
    seg_t *segs;
    uint32_t nlen; /* NOTIFY: the message */
    uint8_t *msg;
} job_t;

typedef struct {
    uint32_t id;
    uint64_t base, len; /* in the target */
    uint8_t *local;
} map_t;

struct shm_session {
    kvt__session_t base;
    kvt__shm_t *shm;
    shm_session_t *next_all; /* under pool_lock */
    int linked;              /* on the pool's list, under pool_lock */
    pid_t pid;
    int sock;
    int pidfd;
    int statfd; /* /proc/PID/stat of the target */
    kvt__shm_chan_t *ch;
    size_t ch_len;

    pthread_mutex_t lock; /* the queue, parked, inflight, released */
    job_t *head, *tail;
    job_t *parked; /* copied, waiting for a stopped target (job_park) */
    unsigned inflight;
    int released;
    _Atomic int held; /* the target is stopped: no job is taken */

    pthread_rwlock_t map_lock;
    map_t *maps;
    size_t nmaps, mcap;
    _Atomic uint32_t mapped; /* nmaps, read without map_lock (take_pair) */
    _Atomic uint64_t map_seq;  /* snapshot the mappings were checked against */
    uint32_t nomap[NOMAP_MAX]; /* refused requests, until the next one */
    unsigned nnomap;

    pthread_mutex_t sock_lock;
    uint64_t req_seq;
};


static void session_kill(kvt__session_t *base, kvt_status_t why);
static void ring_bell(shm_session_t *s);
static kvt_status_t ring_wait(shm_session_t *s, _Atomic uint32_t *word,
                              uint32_t v, uint64_t deadline);
static int target_state(shm_session_t *s);

/*
 * Hold a session whose target is stopped while a job of it waits for the
 * target (staging slots, the notification ring): executors take no more
 * of its jobs, which would only wait as well, each holding its thread,
 * until stopped_poll() sees the target run again (or the session dies).
 */
static void session_hold(shm_session_t *s)
{
    int zero = 0;

    if (atomic_compare_exchange_strong(&s->held, &zero, 1))
        atomic_fetch_add(&s->shm->nheld, 1);
}

/* Let executors take the session's jobs again; 1 if it was held. */
static int session_unhold(shm_session_t *s)
{
    int one = 1;

    if (!atomic_compare_exchange_strong(&s->held, &one, 0))
        return 0;
    atomic_fetch_sub(&s->shm->nheld, 1);
    return 1;
}

#ifdef KVT_TSAN
/*
 * process_vm_writev/readv move bytes on behalf of another process; issue
 * them directly, as tcp.c does its payload calls, so that ThreadSanitizer
 * does not model them. Every other access stays checked. syscall() is
 * variadic: every argument is widened to a long, or the kernel reads
 * stack garbage above a 32-bit one (the flags, 7th, go on the stack).
 */
#define cma_writev(p, l, nl, r, nr)                                            \
    syscall(SYS_process_vm_writev, (long)(p), (l), (unsigned long)(nl), (r), \
            (unsigned long)(nr), 0ul)
#define cma_readv(p, l, nl, r, nr)                                             \
    syscall(SYS_process_vm_readv, (long)(p), (l), (unsigned long)(nl), (r),  \
            (unsigned long)(nr), 0ul)
#else
#define cma_writev(p, l, nl, r, nr)                                            \
    process_vm_writev((p), (l), (nl), (r), (nr), 0)
#define cma_readv(p, l, nl, r, nr)                                             \
    process_vm_readv((p), (l), (nl), (r), (nr), 0)
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- Liveness and the lease ---------------------------------------------- */

/* KVT_OK while the session is usable, as far as shared memory says.
 * Executors only (the channel is mapped while a job is in flight). */
static kvt_status_t session_status(shm_session_t *s)
{
    int32_t d = atomic_load(&s->base.dead);

    if (d != 0)
        return d;
    if (atomic_load(&s->ch->closed) != 0)
        return KVT_ERR_CONN_LOST;
    return KVT_OK;
}

/* session_status(), and the target process alive (a system call). */
static kvt_status_t peer_status(shm_session_t *s)
{
    kvt_status_t st = session_status(s);
    struct pollfd p[2];
    int n = 0;

    if (st != KVT_OK)
        return st;
    p[n++] = (struct pollfd){.fd = s->sock, .events = POLLRDHUP};
    if (s->pidfd >= 0)
        p[n++] = (struct pollfd){.fd = s->pidfd, .events = POLLIN};
    if (poll(p, (nfds_t)n, 0) > 0 &&
        ((p[0].revents & (POLLHUP | POLLRDHUP | POLLERR)) ||
         (n > 1 && p[1].revents)))
        return KVT_ERR_CONN_LOST;
    return KVT_OK;
}

static void lease_release(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;

    /* The last copy out under a closing lease wakes the target. */
    if (atomic_fetch_sub(&ch->active, 1) == 1 &&
        (atomic_load(&ch->lease) & 1) == 0)
        kvt__shm_futex_wake(&ch->active);
}

/*
 * Try the lease once: raise the active count, then check the lease is
 * open (sequentially consistent on both words, paired with the target's
 * close-then-drain). 1: taken. 0: closed (*seen_p: the lease word seen),
 * nothing held.
 */
static int lease_try(shm_session_t *s, uint32_t *seen_p)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t l;

    atomic_fetch_add(&ch->active, 1);
    l = atomic_load(&ch->lease);
    if (l & 1)
        return 1;
    lease_release(s);
    *seen_p = l;
    return 0;
}

/*
 * Take the lease (lease_try()) with the session usable, waiting for a
 * closed lease to reopen, in slices, until @deadline.
 */
static kvt_status_t lease_acquire(shm_session_t *s, uint64_t deadline)
{
    kvt__shm_chan_t *ch = s->ch;

    for (;;) {
        kvt_status_t st = session_status(s);
        uint64_t now;
        uint32_t l;

        if (st != KVT_OK)
            return st;
        if (lease_try(s, &l))
            return KVT_OK;
        now = kvt__now_ns();
        if (now >= deadline)
            return KVT_ERR_TIMEDOUT;
        atomic_fetch_add(&ch->lease_waiters, 1);
        kvt__shm_futex_wait(
            &ch->lease, l,
            deadline - now < SLICE_NS ? (int64_t)(deadline - now) : SLICE_NS);
        atomic_fetch_sub(&ch->lease_waiters, 1);
    }
}

/* ---- Mappings of the target's allocations -------------------------------- */

/* With map_lock held. */
static map_t *map_find(shm_session_t *s, uint32_t id)
{
    for (size_t i = 0; i < s->nmaps; i++)
        if (s->maps[i].id == id)
            return &s->maps[i];
    return NULL;
}

/* Release the mappings of allocations that left the snapshot. Called
 * under the lease, so the snapshot is stable and no copy of this session
 * uses a mapping it does not name. */
static void maps_reconcile(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;

    pthread_rwlock_wrlock(&s->map_lock);
    if (atomic_load(&s->map_seq) != ch->snap_seq) {
        size_t k = 0;
        for (size_t i = 0; i < s->nmaps; i++) {
            int named = 0;
            for (uint32_t r = 0; r < n && !named; r++)
                named = ch->regions[r].map_id == s->maps[i].id;
            if (named) {
                s->maps[k++] = s->maps[i];
            } else {
                KVT_LOG_D("shm: releasing the mapping of allocation %u of %s",
                          s->maps[i].id, s->base.name);
                munmap(s->maps[i].local, s->maps[i].len);
            }
        }
        s->nmaps = k;
        atomic_store(&s->mapped, (uint32_t)k);
        s->nnomap = 0;
        atomic_store(&s->map_seq, ch->snap_seq);
    }
    pthread_rwlock_unlock(&s->map_lock);
}

/* Receive one message, and the descriptor riding along (or -1). */
static ssize_t recv_msg(int fd, kvt__shm_msg_t *m, int *fd_p)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {m, sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = u.buf,
                        .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm;
    ssize_t n;

    *fd_p = -1;
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    for (cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int)) && *fd_p < 0)
            memcpy(fd_p, CMSG_DATA(cm), sizeof(int));
    }
    if (n >= 0 && (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        n = -1;
    if (n != (ssize_t)sizeof(*m) && *fd_p >= 0) {
        close(*fd_p);
        *fd_p = -1;
    }
    return n;
}

/* The memfd is one the owner cannot shrink under us (which would make our
 * accesses fault) and holds @len bytes. */
static int memfd_sound(int fd, uint64_t len)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);

    return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
           (uint64_t)st.st_size >= len;
}

static void msg_init(kvt__shm_msg_t *m, uint16_t type)
{
    memset(m, 0, sizeof(*m));
    m->magic = KVT_SHM_MAGIC;
    m->version = KVT_SHM_VERSION;
    m->type = type;
}

/*
 * Fill the page tables of a fresh mapping, writable, and touch every page
 * once: under shadow paging (some hypervisors) the first access to each
 * page of a new mapping traps, at several microseconds a page, and that
 * belongs to setting the mapping up, not to the first transfers through
 * it. Elsewhere this costs about a millisecond per GiB. Stops touching at
 * @deadline (0: none); the mapping is correct either way.
 */
static void map_warm(uint8_t *p, uint64_t len, uint64_t deadline)
{
    if (len > POPULATE_MAX)
        return;
    if (madvise(p, len, MADV_POPULATE_WRITE) != 0)
        madvise(p, len, MADV_WILLNEED);
    for (uint64_t off = 0; off < len; off += 4096) {
        (void)*(volatile uint8_t *)(p + off);
        if (deadline != 0 && (off & ((1u << 24) - 1)) == 0 &&
            kvt__now_ns() >= deadline)
            break;
    }
}

/*
 * Ask the target for allocation @id's memfd and map it, outside the lease
 * (the target answers from its service thread). A refusal is remembered
 * until the snapshot changes. Bounded by the socket's receive timeout,
 * and the warming of the mapping by @deadline (0: none).
 */
static void map_request(shm_session_t *s, uint32_t id, uint64_t deadline)
{
    kvt__shm_msg_t m;
    int fd = -1, known;
    uint8_t *p;

    pthread_mutex_lock(&s->sock_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    known = map_find(s, id) != NULL;
    for (unsigned i = 0; i < s->nnomap && !known; i++)
        known = s->nomap[i] == id;
    pthread_rwlock_unlock(&s->map_lock);
    if (known)
        goto out;
    msg_init(&m, KVT_SHM_MAP);
    m.id = id;
    m.seq = ++s->req_seq;
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
        goto out;
    for (;;) { /* skip answers to requests that timed out earlier */
        kvt__shm_msg_t a;
        if (recv_msg(s->sock, &a, &fd) != (ssize_t)sizeof(a) ||
            a.magic != KVT_SHM_MAGIC || a.type != KVT_SHM_MAP_ACK)
            goto out;
        if (a.seq == m.seq) {
            m = a;
            break;
        }
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    p = MAP_FAILED;
    if (m.status == KVT_OK && fd >= 0 && m.id == id && m.length > 0 &&
        m.addr <= UINT64_MAX - m.length && memfd_sound(fd, m.length))
        p = mmap(NULL, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED)
        map_warm(p, m.length, deadline);
    pthread_rwlock_wrlock(&s->map_lock);
    if (p != MAP_FAILED) {
        if (s->nmaps == s->mcap) {
            size_t cap = s->mcap ? 2 * s->mcap : 8;
            map_t *n = realloc(s->maps, cap * sizeof(*n));
            if (n == NULL) {
                munmap(p, m.length);
                p = MAP_FAILED;
            } else {
                s->maps = n;
                s->mcap = cap;
            }
        }
    }
    if (p != MAP_FAILED) {
        s->maps[s->nmaps++] = (map_t){id, m.addr, m.length, p};
        atomic_store(&s->mapped, (uint32_t)s->nmaps);
        KVT_LOG_D("shm: mapped allocation %u of %s (%llu bytes)", id,
                  s->base.name, (unsigned long long)m.length);
    } else if (s->nnomap < NOMAP_MAX) {
        s->nomap[s->nnomap++] = id;
    }
    pthread_rwlock_unlock(&s->map_lock);
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&s->sock_lock);
}

/* ---- Running jobs -------------------------------------------------------- */

/* The snapshot region holding [lo, hi) with @access, or NULL. */
static const kvt__shm_region_t *region_find(const kvt__shm_chan_t *ch,
                                            uint32_t n, uint64_t lo,
                                            uint64_t hi, uint32_t access)
{
    uint32_t a = 0, b = n;

    while (a < b) { /* first region ending above lo */
        uint32_t mid = a + (b - a) / 2;
        if (ch->regions[mid].end <= lo)
            a = mid + 1;
        else
            b = mid;
    }
    if (a >= n || ch->regions[a].start > lo || hi > ch->regions[a].end ||
        (ch->regions[a].access & access) != access)
        return NULL;
    return &ch->regions[a];
}

/* Whether each piece of a strided segment lies in one region with
 * @access (the segment's span need not). */
static int pieces_registered(const kvt__shm_chan_t *ch, uint32_t n,
                             const seg_t *g, uint32_t access)
{
    for (uint32_t q = 0; q < g->count; q++) {
        uint64_t a = g->raddr + q * g->rstride;
        if (region_find(ch, n, a, a + g->len, access) == NULL)
            return 0;
    }
    return 1;
}

/* Fail the segments of [from, to) that are still OK. */
static void segs_fail(job_t *j, uint32_t from, uint32_t to, kvt_status_t st)
{
    for (uint32_t i = from; i < to; i++)
        if (j->segs[i].st == KVT_OK)
            j->segs[i].st = st;
}

/*
 * Copy the pieces of the segments of @j marked HOW_CMA with as few calls
 * as the vector limit allows, neighbouring pieces merged on each side. A
 * short count stops at a fault: the segment holding the fault fails and
 * the next call resumes after it. Returns a status for the whole session
 * on ESRCH/EPERM.
 */
static kvt_status_t cma_run(shm_session_t *s, job_t *j, const uint8_t *how)
{
    struct iovec liov[CMA_IOV], riov[CMA_IOV];
    uint32_t i = 0, p = 0; /* cursor: segment, piece */

    while (i < j->nsegs) {
        uint32_t fi, fp, k, q;
        int nl = 0, nr = 0;
        uint64_t want = 0;
        ssize_t got;

        if (how[i] != HOW_CMA || j->segs[i].st != KVT_OK) {
            i++;
            p = 0;
            continue;
        }
        fi = i;
        fp = p;
        while (i < j->nsegs && how[i] == HOW_CMA && j->segs[i].st == KVT_OK) {
            const seg_t *g = &j->segs[i];
            uint64_t la = g->laddr + p * g->lstride;
            uint64_t ra = g->raddr + p * g->rstride;
            int lm = nl > 0 && (uint64_t)(uintptr_t)liov[nl - 1].iov_base +
                                       liov[nl - 1].iov_len ==
                                   la;
            int rm = nr > 0 && (uint64_t)(uintptr_t)riov[nr - 1].iov_base +
                                       riov[nr - 1].iov_len ==
                                   ra;
            if ((!lm && nl == CMA_IOV) || (!rm && nr == CMA_IOV))
                break;
            if (lm)
                liov[nl - 1].iov_len += g->len;
            else
                liov[nl++] = (struct iovec){(void *)(uintptr_t)la, g->len};
            if (rm)
                riov[nr - 1].iov_len += g->len;
            else
                riov[nr++] = (struct iovec){(void *)(uintptr_t)ra, g->len};
            want += g->len;
            if (++p == g->count) {
                i++;
                p = 0;
            }
        }
        if (j->op == KVT_OP_WRITE)
            got = cma_writev(s->pid, liov, (unsigned long)nl, riov,
                             (unsigned long)nr);
        else
            got = cma_readv(s->pid, liov, (unsigned long)nl, riov,
                            (unsigned long)nr);
        if (got == (ssize_t)want)
            continue;
        if (got < 0 && (errno == ESRCH || errno == EPERM)) {
            kvt_status_t st = errno == ESRCH ? KVT_ERR_CONN_LOST : KVT_ERR_IO;
            if (errno == EPERM)
                KVT_LOG_E("shm: %s no longer lets this process attach "
                          "(process_vm: permission denied)",
                          s->base.name);
            segs_fail(j, fi, j->nsegs, st);
            return st;
        }
        /* The piece where the copy stopped fails its segment; resume
         * after that segment. */
        if (got < 0)
            got = 0;
        for (k = fi, q = fp; (uint64_t)got >= j->segs[k].len;) {
            got -= (ssize_t)j->segs[k].len;
            if (++q == j->segs[k].count) {
                k++;
                q = 0;
            }
        }
        j->segs[k].st = KVT_ERR_ACCESS;
        i = k + 1;
        p = 0;
    }
    return KVT_OK;
}

/* ---- Staging ------------------------------------------------------------- */

/* The slots one executor holds for one job (at most all of them), and
 * the job segment of each run. */
typedef struct {
    uint32_t n;
    uint32_t slot[KVT_SHM_STAGE_SLOTS];
    uint32_t nruns[KVT_SHM_STAGE_SLOTS]; /* this side's count, not the
                                            slot's, which the peer can
                                            write */
    uint32_t seg[KVT_SHM_STAGE_SLOTS][KVT_SHM_STAGE_RUNS];
} held_t;

/* Give a slot back and tell whoever waits for one. */
static void slot_free(shm_session_t *s, uint32_t k)
{
    kvt__shm_chan_t *ch = s->ch;

    atomic_store_explicit(&ch->stage[k].state, KVT_SHM_SLOT_FREE,
                          memory_order_release);
    atomic_fetch_add(&ch->stage_seq, 1);
    if (atomic_load(&ch->waiters) != 0)
        kvt__shm_futex_wake(&ch->stage_seq);
}

/* Take the verdicts of the held slots the target is done with (all of
 * them with @all, waiting for the target) and free those slots. */
static kvt_status_t held_collect(shm_session_t *s, job_t *j, held_t *h,
                                 int all)
{
    kvt__shm_chan_t *ch = s->ch;

    while (h->n > 0) {
        uint32_t seq = atomic_load(&ch->stage_seq), kept = 0;
        for (uint32_t x = 0; x < h->n; x++) {
            kvt__shm_slot_t *sl = &ch->stage[h->slot[x]];
            if (atomic_load_explicit(&sl->state, memory_order_acquire) !=
                KVT_SHM_SLOT_DONE) {
                if (kept != x) {
                    h->slot[kept] = h->slot[x];
                    h->nruns[kept] = h->nruns[x];
                    memcpy(h->seg[kept], h->seg[x], sizeof(h->seg[x]));
                }
                kept++;
                continue;
            }
            for (uint32_t r = 0; r < h->nruns[x]; r++) {
                seg_t *g = &j->segs[h->seg[x][r]];
                if (g->st == KVT_OK && sl->runs[r].st != KVT_OK)
                    g->st = KVT_ERR_ACCESS;
            }
            slot_free(s, h->slot[x]);
        }
        h->n = kept;
        if (!all || h->n == 0)
            return KVT_OK;
        {
            kvt_status_t st = ring_wait(s, &ch->stage_seq, seq, j->deadline);
            if (st != KVT_OK)
                return st;
        }
    }
    return KVT_OK;
}

/* Claim a free slot for @h, collecting this job's finished ones first
 * when none is free, and waiting (bounded by the job's deadline). */
static kvt_status_t slot_claim(shm_session_t *s, job_t *j, held_t *h,
                               uint32_t *k_p)
{
    kvt__shm_chan_t *ch = s->ch;

    for (;;) {
        uint32_t seq = atomic_load(&ch->stage_seq);
        kvt_status_t st;
        for (uint32_t k = 0; k < KVT_SHM_STAGE_SLOTS; k++) {
            uint32_t f = KVT_SHM_SLOT_FREE;
            if (atomic_compare_exchange_strong(&ch->stage[k].state, &f,
                                               KVT_SHM_SLOT_CLAIMED)) {
                *k_p = k;
                return KVT_OK;
            }
        }
        st = held_collect(s, j, h, 0);
        if (st != KVT_OK)
            return st;
        if (atomic_load(&ch->stage_seq) != seq)
            continue;
        st = ring_wait(s, &ch->stage_seq, seq, j->deadline);
        if (st != KVT_OK)
            return st;
    }
}

/*
 * Write the pieces of the segments marked HOW_STAGE through the staging
 * slots: pack runs of pieces into a claimed slot, hand it to the target
 * (full, and a bell), and once every slot is done take the target's
 * verdict per run. No lease is held: the target checks each run against
 * its registry itself. Returns a status for the whole session when the
 * target does not answer (dead, or stopped past the deadline).
 */
static kvt_status_t stage_run(shm_session_t *s, job_t *j, const uint8_t *how)
{
    kvt__shm_chan_t *ch = s->ch;
    held_t h; /* 4 KiB */
    kvt__shm_slot_t *sl = NULL;
    uint32_t k = 0, *segof = NULL;
    uint64_t used = 0;
    kvt_status_t st = KVT_OK, cst;

    h.n = 0;

    for (uint32_t i = 0; i < j->nsegs && st == KVT_OK; i++) {
        const seg_t *g = &j->segs[i];
        uint32_t p = 0;

        if (how[i] != HOW_STAGE || g->st != KVT_OK)
            continue;
        while (p < g->count) {
            kvt__shm_run_t *r;
            uint64_t n;
            const uint8_t *src;
            uint8_t *dst;

            if (sl != NULL && (h.nruns[h.n - 1] == KVT_SHM_STAGE_RUNS ||
                               KVT_SHM_STAGE_BYTES - used < g->len)) {
                atomic_store_explicit(&sl->state, KVT_SHM_SLOT_FULL,
                                      memory_order_release);
                ring_bell(s);
                sl = NULL;
            }
            if (sl == NULL) {
                st = slot_claim(s, j, &h, &k);
                if (st != KVT_OK)
                    break;
                sl = &ch->stage[k];
                sl->nruns = 0;
                used = 0;
                h.slot[h.n] = k;
                h.nruns[h.n] = 0;
                segof = h.seg[h.n++];
            }
            n = (KVT_SHM_STAGE_BYTES - used) / g->len;
            if (n > g->count - p)
                n = g->count - p;
            r = &sl->runs[h.nruns[h.n - 1]];
            r->raddr = g->raddr + p * g->rstride;
            r->rstride = g->rstride;
            r->off = used;
            r->len = (uint32_t)g->len;
            r->count = (uint32_t)n;
            r->st = KVT_OK;
            segof[h.nruns[h.n - 1]++] = i;
            sl->nruns = h.nruns[h.n - 1];
            src = (const uint8_t *)(uintptr_t)(g->laddr + p * g->lstride);
            dst = sl->data + used;
            /* Plain stores: the target reads the slot next. */
            kvt__shm_copy_strided(dst, g->len, src, g->lstride, g->len, n, 0);
            used += n * g->len;
            p += (uint32_t)n;
        }
    }
    if (sl != NULL) {
        atomic_store_explicit(&sl->state, KVT_SHM_SLOT_FULL,
                              memory_order_release);
        ring_bell(s);
    }
    /* Also after a failure: what the target finishes is freed; what it
     * never will stays with the dying session. */
    cst = held_collect(s, j, &h, 1);
    return st != KVT_OK ? st : cst;
}

/* In /proc/PID/stat: PF_EXITING in the flags (field 9), and SIGKILL among
 * the thread's pending signals (field 31, the first 31 of them). */
#define STAT_PF_EXITING 0x4ull
#define STAT_SIGKILL (1ull << (SIGKILL - 1))

int kvt__shm_thread_state(const char *buf)
{
    const char *q = strrchr(buf, ')'); /* the name may hold anything */
    unsigned long long v = 0;

    if (q == NULL || q[1] != ' ' || q[2] == '\0')
        return KVT_SHM_THR_UNKNOWN;
    switch (q[2]) {
    case 'T':
    case 't':
        return KVT_SHM_THR_STOPPED;
    case 'Z':
    case 'X':
    case 'x':
        return KVT_SHM_THR_ZOMBIE;
    default:
        break;
    }
    q += 3; /* fields 4 on, numbers (some signed: only 9 and 31 count) */
    for (int f = 4; f <= 31; f++) {
        char *e;
        v = strtoull(q, &e, 10);
        if (e == q)
            return KVT_SHM_THR_UNKNOWN;
        if (f == 9 && (v & STAT_PF_EXITING))
            return KVT_SHM_THR_DYING;
        q = e;
    }
    return (v & STAT_SIGKILL) ? KVT_SHM_THR_DYING : KVT_SHM_THR_RUNNING;
}

/* Read the stat line of @fd into @buf (@len bytes of room). */
static int stat_read(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);

    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

/*
 * A target whose thread-group leader is a zombie lives on while another
 * of its threads does (the leader called pthread_exit()): 0 when one
 * runs, 1 when none does (stopped, or all dying: a group being killed),
 * -1 when none is left to read. The leader, a zombie, keeps the pid from
 * being reused meanwhile.
 */
static int zombie_leader_state(shm_session_t *s)
{
    char path[64], buf[1024];
    struct dirent *de;
    DIR *dir;
    int running = 0, seen = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)s->pid);
    dir = opendir(path);
    if (dir == NULL)
        return -1;
    while (!running && (de = readdir(dir)) != NULL) {
        int fd, st;
        if (de->d_name[0] < '1' || de->d_name[0] > '9' ||
            atoi(de->d_name) == (int)s->pid)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)s->pid,
                 de->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* gone meanwhile */
        st = stat_read(fd, buf, sizeof(buf)) == 0 ? kvt__shm_thread_state(buf)
                                                    : KVT_SHM_THR_UNKNOWN;
        close(fd);
        seen++;
        /* One that cannot be parsed is taken for running. */
        running |= st == KVT_SHM_THR_RUNNING || st == KVT_SHM_THR_UNKNOWN;
    }
    closedir(dir);
    if (running)
        return 0;
    return seen > 0 ? 1 : -1;
}

/*
 * The target's state from its /proc/PID/stat (one read, cheaper than a
 * poll): 0 running; 1 not running, stopped or dying (a copy into it is not
 * delivered, at least not yet); -1 unknown (the read failed: the pidfd
 * decides). The descriptor is bound to the process, not its number, so a
 * reused pid reads as gone. Only a zombie leader costs more reads.
 */
static int target_state(shm_session_t *s)
{
    char buf[1024];

    if (stat_read(s->statfd, buf, sizeof(buf)) != 0)
        return -1;
    switch (kvt__shm_thread_state(buf)) {
    case KVT_SHM_THR_RUNNING:
        return 0;
    case KVT_SHM_THR_STOPPED:
    case KVT_SHM_THR_DYING:
        return 1;
    case KVT_SHM_THR_ZOMBIE:
        return zombie_leader_state(s);
    default:
        return -1;
    }
}

/*
 * After the copies of a job: whether the target is stopped or dying (1,
 * target_state()), so that success is not reported yet, or not (0), with
 * *st_p KVT_OK when it is alive and running. A copy into a target that is
 * stopped is not a transfer until it runs again (as over TCP, where a
 * stopped peer answers nothing); into a dead one it fails, since nobody
 * will read what landed.
 */
static int target_check(shm_session_t *s, kvt_status_t *st_p)
{
    kvt_status_t st = session_status(s);
    int state = st == KVT_OK ? target_state(s) : 0;

    /* Not known to run: the pidfd and the socket tell whether it is gone
     * (a killed target may read as dying until it is reaped). */
    if (st == KVT_OK && state != 0)
        st = peer_status(s);
    *st_p = st;
    return st == KVT_OK && state > 0;
}

/* How each segment of a job is copied, and where it lies in a mapping
 * (HOW_MAP), decided under the lease (rw_begin). */
typedef struct {
    uint32_t ncma, nmap, nstage, want_map;
    kvt_status_t st; /* of the attached copies (rw_release) */
    uint8_t how[JOB_SEGS];
    uint8_t *loc[JOB_SEGS];
} rw_plan_t;

/*
 * Take the lease and map_lock (read) and check every segment of a READ or
 * WRITE job against the snapshot: one outside the target's registry (or
 * its access rights) fails with KVT_ERR_ACCESS and is not touched; the
 * others are marked for a mapping, the staging slots or cross-memory
 * attach. 0: both held, @p filled. -1: the lease could not be had (the
 * job failed, the session killed). With @try, nothing is waited for: 1
 * when the lease is closed, the mappings are to be reconciled or
 * map_lock is taken (nothing held, nothing done; run the job alone).
 */
static int rw_begin(shm_session_t *s, job_t *j, rw_plan_t *p, int try)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t access = j->op == KVT_OP_WRITE ? KVT_ACCESS_REMOTE_WRITE
                                            : KVT_ACCESS_REMOTE_READ;
    uint32_t n;
    kvt_status_t st;

    if (try) {
        uint32_t l;
        if (session_status(s) != KVT_OK || !lease_try(s, &l))
            return 1;
        if (ch->snap_seq != atomic_load(&s->map_seq) ||
            pthread_rwlock_tryrdlock(&s->map_lock) != 0) {
            lease_release(s);
            return 1;
        }
    } else {
        st = lease_acquire(s, j->deadline);
        if (st != KVT_OK) {
            segs_fail(j, 0, j->nsegs, st);
            session_kill(&s->base, st);
            return -1;
        }
        if (ch->snap_seq != atomic_load(&s->map_seq))
            maps_reconcile(s);
        pthread_rwlock_rdlock(&s->map_lock);
    }
    p->ncma = p->nmap = p->nstage = p->want_map = 0;
    n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    for (uint32_t i = 0; i < j->nsegs; i++) {
        seg_t *g = &j->segs[i];
        const kvt__shm_region_t *r = region_find(ch, n, g->vlo, g->vhi, access);
        const map_t *m = NULL;
        uint64_t end = g->raddr + (g->count - 1) * g->rstride + g->len;

        p->how[i] = HOW_NONE;
        p->loc[i] = NULL;
        /* Without a region for the span, a strided segment may still have
         * each piece in one (never then in one mapping). */
        if (r == NULL &&
            !(g->count > 1 && pieces_registered(ch, n, g, access))) {
            g->st = KVT_ERR_ACCESS;
            continue;
        }
        if (r != NULL && r->map_id != 0) {
            m = map_find(s, r->map_id);
            if (m == NULL && p->want_map == 0)
                p->want_map = r->map_id;
        }
        if (m != NULL && g->raddr >= m->base && end <= m->base + m->len) {
            p->loc[i] = m->local + (g->raddr - m->base);
            p->how[i] = HOW_MAP;
            p->nmap++;
        } else if (j->op == KVT_OP_WRITE && g->count > 1 &&
                   g->len <= STAGE_PIECE_MAX &&
                   (g->rstride != g->len || g->lstride != g->len)) {
            p->how[i] = HOW_STAGE;
            p->nstage++;
        } else {
            p->how[i] = HOW_CMA;
            p->ncma++;
        }
    }
    return 0;
}

/* The mapped segments of @j not yet copied (loc set), merged while
 * contiguous on both sides; strided ones as one strided copy each. */
static void rw_copy_maps(job_t *j, rw_plan_t *p)
{
    for (uint32_t i = 0; i < j->nsegs && p->nmap > 0;) {
        const seg_t *g = &j->segs[i];
        uint8_t **loc = p->loc;
        uint64_t len = g->len;
        uint32_t k;

        if (loc[i] == NULL) {
            i++;
            continue;
        }
        if (g->count > 1) {
            uint8_t *l = (uint8_t *)(uintptr_t)g->laddr;
            if (j->op == KVT_OP_WRITE)
                kvt__shm_copy_strided(loc[i], g->rstride, l, g->lstride,
                                      g->len, g->count, 1);
            else
                kvt__shm_copy_strided(l, g->lstride, loc[i], g->rstride,
                                      g->len, g->count, 0);
            i++;
            continue;
        }
        for (k = i + 1; k < j->nsegs && j->segs[k].count == 1 &&
                        loc[k] == loc[i] + len &&
                        j->segs[k].laddr == g->laddr + len;
             k++)
            len += j->segs[k].len;
        if (j->op == KVT_OP_WRITE)
            kvt__shm_copy(loc[i], (const void *)(uintptr_t)g->laddr, len, 1);
        else
            kvt__shm_copy((void *)(uintptr_t)g->laddr, loc[i], len, 0);
        i = k;
    }
}

/* After the mapped copies of a job begun with rw_begin(): cross-memory
 * attach (under map_lock), then map_lock and the lease are released. */
static void rw_release(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    p->st = p->ncma > 0 ? cma_run(s, j, p->how) : KVT_OK;
    pthread_rwlock_unlock(&s->map_lock);
    lease_release(s);
}

/*
 * The end of a job after rw_release(): the staged segments are written
 * and success is checked: it needs the target alive and running
 * (target_check()). No target thread takes part in a mapped or attached
 * copy: it costs the target no wake-up. Returns 1 when the target is
 * stopped and the job's deadline has not passed: the job is to be parked
 * (job_end()) rather than holding its executor until the target runs.
 */
static int rw_finish(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    kvt_status_t st = p->st;

    if (st == KVT_OK && p->nstage > 0)
        st = stage_run(s, j, p->how);
    if (st == KVT_OK && p->ncma + p->nmap > 0 && target_check(s, &st)) {
        if (kvt__now_ns() < j->deadline)
            return 1;
        st = KVT_ERR_TIMEDOUT;
    }
    if (st != KVT_OK) {
        segs_fail(j, 0, j->nsegs, st);
        session_kill(&s->base, st);
    }
    if (p->want_map != 0 && st == KVT_OK)
        map_request(s, p->want_map, 0);
    return 0;
}

/* Everything of a job begun with rw_begin() that is its own; as
 * rw_finish(). */
static int rw_rest(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    rw_copy_maps(j, p);
    rw_release(s, j, p);
    return rw_finish(s, j, p);
}

/* Run a READ or WRITE job alone; as rw_finish(). */
static int rw_run(shm_session_t *s, job_t *j)
{
    rw_plan_t p; /* 9 KiB */

    return rw_begin(s, j, &p, 0) == 0 ? rw_rest(s, j, &p) : 0;
}

/*
 * Two pieces of one source row: segments with the same geometry whose
 * pieces are disjoint parts of the same rows (two peers' heads of this
 * rank's cache).
 */
static int seg_siblings(const seg_t *a, const seg_t *b)
{
    uint64_t d = a->laddr > b->laddr ? a->laddr - b->laddr
                                     : b->laddr - a->laddr;

    return a->count > 1 && a->count == b->count && a->len == b->len &&
           a->lstride == b->lstride && a->lstride > a->len && d >= a->len &&
           d + a->len <= a->lstride;
}

static void job_done(shm_session_t *s, job_t *j);
static void job_end(shm_session_t *s, job_t *j, int park);
static void job_run(shm_session_t *s, job_t *j);

/*
 * Run and account for two WRITE jobs of different sessions taken
 * together (take_pair()): each source row is read once for both.
 * Segments that are siblings (seg_siblings()) and mapped on both sides
 * are copied piece by piece in step, both parts of a row one after the
 * other: reading one part of every row and later the other costs nearly
 * twice the memory traffic of reading each row once (the hardware
 * prefetches whole rows). The rest of each job is run as rw_run() would.
 * The partner's lease and mappings are only tried: when either is not at
 * hand at once, it runs alone after the first (holding one lease while
 * waiting for another could wait on a target that waits on this one).
 * Both leases are released before either job's end; a job whose target
 * is stopped is parked (job_end()), so it holds back neither the other
 * nor the executor.
 */
static void job_run_pair(shm_session_t *s, job_t *j, shm_session_t *s2,
                         job_t *j2)
{
    rw_plan_t p[2]; /* 18 KiB */

    if (rw_begin(s, j, &p[0], 0) != 0) {
        job_done(s, j);
        job_run(s2, j2);
        return;
    }
    if (rw_begin(s2, j2, &p[1], 1) != 0) {
        job_end(s, j, rw_rest(s, j, &p[0]));
        job_run(s2, j2);
        return;
    }
    for (uint32_t i = 0; i < j->nsegs && i < j2->nsegs; i++) {
        const seg_t *a = &j->segs[i], *b = &j2->segs[i];
        if (p[0].loc[i] == NULL || p[1].loc[i] == NULL || !seg_siblings(a, b))
            continue;
        kvt__shm_copy_pair(p[0].loc[i], a->rstride,
                           (const void *)(uintptr_t)a->laddr, p[1].loc[i],
                           b->rstride, (const void *)(uintptr_t)b->laddr,
                           a->lstride, a->len, a->count);
        p[0].loc[i] = p[1].loc[i] = NULL;
        atomic_fetch_add_explicit(&s->shm->paired, 1, memory_order_relaxed);
    }
    rw_copy_maps(j2, &p[1]);
    rw_copy_maps(j, &p[0]);
    rw_release(s2, j2, &p[1]);
    rw_release(s, j, &p[0]);
    job_end(s, j, rw_finish(s, j, &p[0]));
    job_end(s2, j2, rw_finish(s2, j2, &p[1]));
}

/* Wait (in slices, bounded by @deadline) while *word == @v. */
static kvt_status_t ring_wait(shm_session_t *s, _Atomic uint32_t *word,
                              uint32_t v, uint64_t deadline)
{
    kvt_status_t st = peer_status(s);
    uint64_t now = kvt__now_ns();

    if (st != KVT_OK)
        return st;
    if (now >= deadline)
        return KVT_ERR_TIMEDOUT;
    atomic_fetch_add(&s->ch->waiters, 1);
    kvt__shm_futex_wait(word, v,
                        deadline - now < SLICE_NS ? (int64_t)(deadline - now)
                                                  : SLICE_NS);
    atomic_fetch_sub(&s->ch->waiters, 1);
    /* Nothing moved: the target may be stopped. */
    if (atomic_load(word) == v && target_state(s) == 1)
        session_hold(s);
    return KVT_OK;
}

static void ring_bell(shm_session_t *s)
{
    kvt__shm_msg_t bell;

    msg_init(&bell, KVT_SHM_BELL);
    /* A bell lost to a full socket is made up by the target's tick. */
    send(s->sock, &bell, sizeof(bell), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Queue a notification on the ring, ring the bell, and wait until the
 * target has taken it into its queue. */
static kvt_status_t notify_run(shm_session_t *s, job_t *j)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t tail = atomic_load_explicit(&ch->nq_tail, memory_order_relaxed);
    kvt__shm_note_t *nt;
    kvt_status_t st = KVT_OK;

    for (;;) {
        uint32_t head =
            atomic_load_explicit(&ch->nq_head, memory_order_acquire);
        if (tail - head < KVT_SHM_NOTES)
            break;
        st = ring_wait(s, &ch->nq_head, head, j->deadline);
        if (st != KVT_OK)
            return st;
    }
    nt = &ch->notes[tail % KVT_SHM_NOTES];
    nt->len = j->nlen;
    memcpy(nt->data, j->msg, j->nlen);
    atomic_store_explicit(&ch->nq_tail, tail + 1, memory_order_release);
    ring_bell(s);
    for (;;) {
        uint32_t head =
            atomic_load_explicit(&ch->nq_head, memory_order_acquire);
        if ((int32_t)(head - (tail + 1)) >= 0)
            return KVT_OK;
        st = ring_wait(s, &ch->nq_head, head, j->deadline);
        if (st != KVT_OK)
            return st;
    }
}

static void job_unref(job_t *j)
{
    if (atomic_fetch_sub_explicit(&j->blk->refs, 1, memory_order_acq_rel) == 1)
        free(j->blk);
}

/* Complete each descriptor of @j once, with the first failure of its
 * run of segments. */
static void job_complete(job_t *j)
{
    for (uint32_t i = 0; i < j->nsegs;) {
        kvt__comp_t *c = j->segs[i].comp;
        kvt_status_t st = KVT_OK;
        for (; i < j->nsegs && j->segs[i].comp == c; i++)
            if (st == KVT_OK)
                st = j->segs[i].st;
        kvt__comp_done(c, st);
    }
    job_unref(j);
}

static void fail_list(job_t *list, kvt_status_t st)
{
    while (list != NULL) {
        job_t *next = list->next;
        segs_fail(list, 0, list->nsegs, st);
        job_complete(list);
        list = next;
    }
}

/* Unmap and close everything the session holds on the target. */
static void release_resources(shm_session_t *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    for (size_t i = 0; i < s->nmaps; i++)
        munmap(s->maps[i].local, s->maps[i].len);
    s->nmaps = 0;
    atomic_store(&s->mapped, 0);
    pthread_rwlock_unlock(&s->map_lock);
    if (s->ch != NULL)
        munmap(s->ch, s->ch_len);
    s->ch = NULL;
    if (s->sock >= 0)
        close(s->sock);
    if (s->pidfd >= 0)
        close(s->pidfd);
    if (s->statfd >= 0)
        close(s->statfd);
    s->sock = s->pidfd = s->statfd = -1;
}

static void pool_unlink(shm_session_t *s)
{
    kvt__shm_t *shm = s->shm;
    shm_session_t **pp;

    pthread_mutex_lock(&shm->pool_lock);
    for (pp = &shm->sessions; s->linked && *pp != NULL;
         pp = &(*pp)->next_all) {
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    }
    s->linked = 0;
    pthread_mutex_unlock(&shm->pool_lock);
}

/*
 * Once dead with nothing in flight (by whoever observes that first):
 * release what the session holds on the target, leave the pool's list
 * and drop the session's reference. The session may be freed before
 * this returns; the caller does not touch it afterwards.
 */
static void release(shm_session_t *s)
{
    release_resources(s);
    pool_unlink(s);
    kvt__session_release(&s->base);
}

/* The next job an executor may take, with the session lock held. */
static job_t *take_locked(shm_session_t *s)
{
    job_t *j = s->head;

    if (j == NULL || atomic_load(&s->base.dead) || atomic_load(&s->held) ||
        (j->op == KVT_OP_NOTIFY && s->inflight > 0))
        return NULL;
    s->head = j->next;
    if (s->head == NULL)
        s->tail = NULL;
    s->inflight++;
    return j;
}

static void pool_wake(kvt__shm_t *shm, unsigned n)
{
    pthread_mutex_lock(&shm->pool_lock);
    for (unsigned i = 0; i < n && i < shm->idle; i++)
        pthread_cond_signal(&shm->pool_cond);
    pthread_mutex_unlock(&shm->pool_lock);
}

/* Account for a job that has run: complete it, and release the session
 * or hand its NOTIFY on when that was the last one in flight. */
static void job_done(shm_session_t *s, job_t *j)
{
    kvt__shm_t *shm = s->shm;
    int release_now = 0, notify_ready = 0;

    job_complete(j);
    pthread_mutex_lock(&s->lock);
    s->inflight--;
    if (s->inflight == 0 && atomic_load(&s->base.dead) && !s->released) {
        s->released = 1;
        release_now = 1;
    }
    notify_ready =
        s->inflight == 0 && s->head != NULL && s->head->op == KVT_OP_NOTIFY;
    pthread_mutex_unlock(&s->lock);
    if (notify_ready)
        pool_wake(shm, 1);
    if (release_now)
        release(s);
}

/*
 * Park a job whose copies are done but whose target is stopped: it stays
 * in flight (a NOTIFY behind it still waits for it) without holding the
 * thread that ran it; stopped_poll() ends it once the target runs again,
 * is gone, or the job's deadline passes, and session_kill() fails it.
 */
static void job_park(shm_session_t *s, job_t *j)
{
    kvt_status_t dead;

    pthread_mutex_lock(&s->lock);
    dead = atomic_load(&s->base.dead);
    if (dead == KVT_OK) {
        j->next = s->parked;
        s->parked = j;
        atomic_fetch_add(&s->shm->nparked, 1);
    }
    pthread_mutex_unlock(&s->lock);
    if (dead != KVT_OK) { /* killed since the check: not delivered */
        segs_fail(j, 0, j->nsegs, dead);
        job_done(s, j);
    }
}

/* Account for a job that has run, or park it (@park: rw_finish()). */
static void job_end(shm_session_t *s, job_t *j, int park)
{
    if (park)
        job_park(s, j);
    else
        job_done(s, j);
}

/* End each job of @list (taken off a parked list) with @st. */
static void parked_end(shm_session_t *s, job_t *list, kvt_status_t st)
{
    while (list != NULL) {
        job_t *next = list->next;
        atomic_fetch_sub(&s->shm->nparked, 1);
        if (st != KVT_OK)
            segs_fail(list, 0, list->nsegs, st);
        job_done(s, list);
        list = next;
    }
}

/*
 * Wake workers for @n new jobs, or, for a plugged submission, count them
 * for flush() at the submitter's last unplug (kvt_submit_plug()): the
 * jobs of one round to several peers are then all queued before any of
 * them runs, and the workers can pair them (take_pair()).
 */
static void submit_wake(kvt__shm_t *shm, unsigned n, int plugged)
{
    if (plugged)
        atomic_fetch_add(&shm->deferred, n);
    else
        pool_wake(shm, n);
}

static void shm_flush(kvt__tl_t *tl)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    unsigned n = atomic_exchange(&shm->deferred, 0);

    if (n > 0)
        pool_wake(shm, n);
}

/* Run a job taken with take_locked() and account for it. */
static void job_run(shm_session_t *s, job_t *j)
{
    int park = 0;

    if (j->op == KVT_OP_NOTIFY) {
        kvt_status_t st = notify_run(s, j);
        if (st != KVT_OK) {
            segs_fail(j, 0, j->nsegs, st);
            session_kill(&s->base, st);
        }
    } else {
        park = rw_run(s, j);
    }
    job_end(s, j, park);
}

/* ---- Submission ---------------------------------------------------------- */

typedef struct {
    job_t *jobs; /* NULL: count only */
    seg_t *segs;
    size_t nj, ns; /* used so far */
    job_t *cur;    /* the job being filled (fill run only) */
    int open;
    uint32_t cur_op;
    uint32_t cur_nsegs;
    kvt__comp_t *cur_comp; /* of its last segment */
    uint64_t cur_bytes;
    uint32_t *pieces; /* per descriptor of the submission */
} plan_t;

static void plan_open(plan_t *p, uint32_t op, uint64_t dl)
{
    if (p->jobs != NULL) {
        job_t *j = &p->jobs[p->nj];
        memset(j, 0, sizeof(*j));
        j->op = op;
        j->deadline = dl;
        j->segs = &p->segs[p->ns];
        p->cur = j;
    }
    p->nj++;
    p->open = 1;
    p->cur_op = op;
    p->cur_nsegs = 0;
    p->cur_bytes = 0;
}

/* Append a segment to the open job; a descriptor's pieces are the jobs
 * its segments fall in. */
static void plan_add(plan_t *p, size_t i, const seg_t *g)
{
    if (p->cur_nsegs == 0 || p->cur_comp != g->comp)
        p->pieces[i]++;
    if (p->jobs != NULL) {
        p->cur->segs[p->cur_nsegs] = *g;
        p->cur->nsegs++;
    }
    p->cur_comp = g->comp;
    p->cur_nsegs++;
    p->cur_bytes += g->len * g->count;
    p->ns++;
}

/*
 * Cut descriptors into jobs. Run twice: with p->jobs NULL it only counts
 * jobs, segments and each descriptor's pieces; then it fills the arrays
 * the first run sized. A descriptor's remote range is what must lie in one
 * region (each piece's, for the strided form), so that one crossing a
 * region's end is refused whole even when it is cut across jobs.
 */
static void plan_run(plan_t *p, const kvt__xfer_t *x, size_t n,
                     uint64_t target, uint64_t dl)
{
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = &x[i];
        kvt__comp_t *comp = d->comp;
        uint32_t c = d->count;
        uint64_t L = d->len, ls = d->lstride, rs = d->rstride, la = d->laddr;

        p->pieces[i] = 0;
        if (d->op == KVT_OP_NOTIFY) {
            seg_t g = {.count = 1, .st = KVT_OK, .comp = comp};
            plan_open(p, KVT_OP_NOTIFY, dl);
            if (p->jobs != NULL) {
                p->cur->nlen = (uint32_t)L;
                p->cur->msg = (uint8_t *)(uintptr_t)la; /* copied later */
            }
            plan_add(p, i, &g);
            p->open = 0;
            continue;
        }
        /* Small strided pieces: runs of whole pieces, as many as the
         * job has room for, the run's span in one region. */
        for (uint32_t k = 0; c > 1 && L <= PACK_MAX && k < c;) {
            uint64_t room, cnt;
            seg_t g;
            if (!p->open || p->cur_op != d->op ||
                p->cur_bytes >= target || p->cur_nsegs >= JOB_SEGS)
                plan_open(p, d->op, dl);
            room = target - p->cur_bytes;
            cnt = room / L ? room / L : 1;
            if (cnt > c - k)
                cnt = c - k;
            g = (seg_t){.laddr = la + k * ls,
                        .raddr = d->raddr + k * rs,
                        .len = L,
                        .lstride = ls,
                        .rstride = rs,
                        .count = (uint32_t)cnt,
                        .st = KVT_OK,
                        .comp = comp};
            g.vlo = g.raddr;
            g.vhi = g.raddr + (cnt - 1) * rs + L;
            plan_add(p, i, &g);
            k += (uint32_t)cnt;
        }
        for (uint32_t k = 0; !(c > 1 && L <= PACK_MAX) && k < c; k++) {
            uint64_t ra = d->raddr + k * rs, off = 0;
            uint64_t vlo = c == 1 ? d->raddr : ra;
            while (off < L) {
                seg_t g;
                if (!p->open || p->cur_op != d->op ||
                    p->cur_bytes >= target || p->cur_nsegs >= JOB_SEGS)
                    plan_open(p, d->op, dl);
                g = (seg_t){.laddr = la + k * ls + off,
                            .raddr = ra + off,
                            .len = L - off,
                            .count = 1,
                            .vlo = vlo,
                            .vhi = vlo + L,
                            .st = KVT_OK,
                            .comp = comp};
                if (g.len > target - p->cur_bytes)
                    g.len = target - p->cur_bytes;
                g.lstride = g.rstride = g.len;
                plan_add(p, i, &g);
                off += g.len;
            }
        }
    }
}

static kvt_status_t shm_submit(kvt__session_t *base, const kvt__xfer_t *x,
                               size_t n, kvt__sub_t *hint)
{
    shm_session_t *s = (shm_session_t *)base;
    kvt__shm_t *shm = s->shm;
    uint64_t total = 0, target, dl;
    plan_t p = {0};
    job_block_t *blk;
    size_t msgs = 0, nj, ns;
    uint8_t *mp;
    job_t *list = NULL;
    int dead;

    p.pieces = malloc(n * sizeof(uint32_t));
    if (p.pieces == NULL)
        return KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (x[i].op == KVT_OP_NOTIFY)
            msgs += x[i].len;
        else
            total += kvt__xfer_bytes(&x[i]);
    }
    /* Spread a large submission over every executor; keep a small one in
     * one job, whose hand-off would cost more than the copy it shares. */
    target = total / (1 + shm->nworkers);
    if (total < SPLIT_MIN)
        target = JOB_MAX;
    target = target < JOB_MIN ? JOB_MIN : target > JOB_MAX ? JOB_MAX : target;
    dl = kvt__now_ns() + shm->cfg->timeout_ns;
    plan_run(&p, x, n, target, dl);
    nj = p.nj;
    ns = p.ns;
    blk = malloc(sizeof(*blk) + nj * sizeof(job_t) + ns * sizeof(seg_t) + msgs);
    if (blk == NULL) {
        free(p.pieces);
        return KVT_ERR_NO_MEMORY;
    }
    atomic_init(&blk->refs, (uint32_t)nj);
    p.jobs = (job_t *)(blk + 1);
    p.segs = (seg_t *)(p.jobs + nj);
    mp = (uint8_t *)(p.segs + ns);
    p.nj = p.ns = 0;
    p.open = 0;
    plan_run(&p, x, n, target, dl);
    for (size_t i = 0; i < nj; i++) {
        job_t *j = &p.jobs[i];
        j->blk = blk;
        j->next = i + 1 < nj ? &p.jobs[i + 1] : NULL;
        if (j->op == KVT_OP_NOTIFY) { /* copied at submission */
            memcpy(mp, j->msg, j->nlen);
            j->msg = mp;
            mp += j->nlen;
        }
    }
    /* Every descriptor's count is set before any job can complete. */
    for (size_t i = 0; i < n; i++)
        kvt__comp_expect(x[i].comp, p.pieces[i]);
    free(p.pieces);
    if (nj > 0)
        list = &p.jobs[0];

    kvt__sub_note(hint, s);
    pthread_mutex_lock(&s->lock);
    dead = atomic_load(&s->base.dead);
    if (!dead && list != NULL) {
        if (s->tail)
            s->tail->next = list;
        else
            s->head = list;
        s->tail = &p.jobs[nj - 1];
    }
    pthread_mutex_unlock(&s->lock);
    if (dead) {
        fail_list(list, dead);
        return KVT_OK;
    }
    submit_wake(shm, (unsigned)nj, hint->plugged);
    return KVT_OK;
}

/*
 * Waiter progress: run this session's jobs from the thread waiting for
 * them until *@until reads 0, the queue offers nothing, or @deadline_ns
 * passes; the caller then sleeps on the batch.
 */
static kvt_status_t shm_progress(kvt__session_t *base, void *where,
                                 const _Atomic uint32_t *until,
                                 uint64_t deadline_ns)
{
    shm_session_t *s = where;

    while (atomic_load_explicit(until, memory_order_acquire) != 0) {
        job_t *j;
        if (deadline_ns != 0 && kvt__now_ns() >= deadline_ns)
            break;
        pthread_mutex_lock(&s->lock);
        j = take_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (j == NULL)
            break;
        job_run(s, j);
    }
    /* What is left is running on a worker (which may have taken the job
     * before this thread came) and usually ends within microseconds:
     * poll for it rather than sleep and be woken. */
    {
        uint64_t end = kvt__now_ns() + WAIT_SPIN_NS;
        if (deadline_ns != 0 && deadline_ns < end)
            end = deadline_ns;
        while (atomic_load_explicit(until, memory_order_acquire) != 0 &&
               kvt__now_ns() < end)
            cpu_relax();
    }
    return KVT_OK;
}

/* ---- Session lifecycle --------------------------------------------------- */

static void session_kill(kvt__session_t *base, kvt_status_t why)
{
    shm_session_t *s = (shm_session_t *)base;
    int32_t zero = 0;
    int release_now = 0;
    job_t *list, *parked;

    if (!atomic_compare_exchange_strong(&base->dead, &zero, why))
        return;
    kvt__session_evict(base);
    if (why != KVT_ERR_CANCELED)
        KVT_LOG_W("shm session to %s failed: %s", base->name,
                  kvt_status_str(why));
    pthread_mutex_lock(&s->lock);
    list = s->head;
    s->head = s->tail = NULL;
    parked = s->parked;
    s->parked = NULL;
    if (s->inflight == 0 && !s->released) {
        s->released = 1;
        release_now = 1;
    }
    pthread_mutex_unlock(&s->lock);
    session_unhold(s);
    fail_list(list, why);
    parked_end(s, parked, why); /* the last one releases */
    if (release_now)
        release(s);
}

/*
 * Free the session: it released itself (dead, nothing in flight), or the
 * engine is being torn down with the pool stopped and every session
 * killed (kvt__shm_stop()).
 */
static void session_destroy(kvt__session_t *base)
{
    shm_session_t *s = (shm_session_t *)base;

    if (!s->released)
        release_resources(s);
    pool_unlink(s);
    free(s->maps);
    pthread_mutex_destroy(&s->sock_lock);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}


/* ---- The worker pool ----------------------------------------------------- */

/*
 * Every TICK_NS one worker looks for sessions whose target died or whose
 * oldest queued job is past its deadline, and fails them, as the TCP
 * workers do for their connections.
 */
static void pool_tick(kvt__shm_t *shm)
{
    shm_session_t *bad[32];
    kvt_status_t why[32];
    size_t nbad = 0;
    uint64_t now = kvt__now_ns();

    pthread_mutex_lock(&shm->pool_lock);
    for (shm_session_t *s = shm->sessions; s != NULL && nbad < 32;
         s = s->next_all) {
        kvt_status_t st = KVT_OK;
        pthread_mutex_lock(&s->lock);
        if (!s->released && !atomic_load(&s->base.dead)) {
            st = peer_status(s);
            if (st == KVT_OK && s->head != NULL && now > s->head->deadline)
                st = KVT_ERR_TIMEDOUT;
        }
        pthread_mutex_unlock(&s->lock);
        if (st != KVT_OK) {
            kvt__session_hold(&s->base);
            bad[nbad] = s;
            why[nbad++] = st;
        }
    }
    pthread_mutex_unlock(&shm->pool_lock);
    for (size_t i = 0; i < nbad; i++) {
        session_kill(&bad[i]->base, why[i]);
        kvt__session_release(&bad[i]->base);
    }
}

/*
 * The sessions on the pool's list, each held (kvt__session_hold()), in a
 * malloc'd array: a list to walk without pool_lock while sessions leave
 * it. Every one of them is released with sessions_put().
 */
static shm_session_t **sessions_get(kvt__shm_t *shm, size_t *n_p)
{
    shm_session_t **v = NULL;
    size_t n = 0, k = 0;

    pthread_mutex_lock(&shm->pool_lock);
    for (shm_session_t *s = shm->sessions; s != NULL; s = s->next_all)
        n++;
    if (n > 0)
        v = malloc(n * sizeof(*v));
    for (shm_session_t *s = shm->sessions; v != NULL && s != NULL;
         s = s->next_all) {
        kvt__session_hold(&s->base);
        v[k++] = s;
    }
    pthread_mutex_unlock(&shm->pool_lock);
    *n_p = k;
    return v;
}

static void sessions_put(shm_session_t **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvt__session_release(&v[i]->base);
    free(v);
}

/*
 * End the parked jobs (job_park()) whose target runs again (delivered) or
 * is gone (failed with the session), and those past their deadline
 * (KVT_ERR_TIMEDOUT, which fails the session, as a job that waited for
 * the target would have); let the executors take the jobs of a held
 * session (session_hold()) whose target runs again. One pool worker at a
 * time runs it, every STOPPED_POLL_NS while any job is parked or any
 * session held. Sessions may leave the list meanwhile: it walks a held
 * copy (sessions_get()).
 */
static void stopped_poll(kvt__shm_t *shm)
{
    uint64_t now = kvt__now_ns();
    shm_session_t **all;
    size_t nall;

    all = sessions_get(shm, &nall);
    for (size_t k = 0; k < nall; k++) {
        shm_session_t *s = all[k];
        job_t *done = NULL, **pp;
        kvt_status_t st = KVT_OK;
        int any, stopped = 0;

        pthread_mutex_lock(&s->lock);
        any = s->parked != NULL;
        pthread_mutex_unlock(&s->lock);
        if (any || atomic_load(&s->held))
            stopped = target_check(s, &st);
        if (!stopped && st == KVT_OK && session_unhold(s))
            pool_wake(shm, ~0u); /* every idle worker */
        pthread_mutex_lock(&s->lock);
        for (pp = &s->parked; any && *pp != NULL;) {
            job_t *j = *pp;
            if (stopped && now < j->deadline) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            j->next = done;
            done = j;
        }
        pthread_mutex_unlock(&s->lock);
        if (stopped && done != NULL)
            st = KVT_ERR_TIMEDOUT;
        /* The session dies before its jobs fail, so that whoever sees a
         * failure and opens the segment again gets a new session. */
        if (st != KVT_OK)
            session_kill(&s->base, st);
        parked_end(s, done, st);
    }
    sessions_put(all, nall);
}

/*
 * A job for a pool worker, from the sessions in turn: the scan starts
 * after the session the last job was taken from, so that sessions with
 * queued jobs are served alternately rather than the first one in the
 * list until it is empty (a large batch to one peer does not hold back
 * the transfers to the others). Called with pool_lock held; NULL when
 * nothing is queued.
 */
static shm_session_t *take_next(kvt__shm_t *shm, job_t **j_p)
{
    shm_session_t *s = shm->sessions;
    unsigned n = 0, start;

    for (; s != NULL; s = s->next_all)
        n++;
    if (n == 0)
        return NULL;
    start = shm->rr % n;
    s = shm->sessions;
    for (unsigned k = 0; k < start; k++)
        s = s->next_all;
    for (unsigned k = 0; k < n; k++) {
        job_t *j;
        pthread_mutex_lock(&s->lock);
        j = take_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (j != NULL) {
            shm->rr = (start + k + 1) % n;
            *j_p = j;
            return s;
        }
        s = s->next_all != NULL ? s->next_all : shm->sessions;
    }
    return NULL;
}

/* How far into another session's queue take_pair() looks. */
#define PAIR_LOOK 8

/*
 * A job of another session to run with @j (job_run_pair()): when @j
 * writes pieces that are parts of rows here (a strided source), the
 * first job among the next PAIR_LOOK queued in another session, before
 * any NOTIFY, whose first segment is the sibling of @j's (the other part
 * of the same rows) is taken too. Jobs of one session may run in any
 * order; a NOTIFY waits for those taken before it. Only between
 * sessions that map memory of their targets: staged jobs gain nothing
 * from running together, and run better side by side on two workers,
 * each in step with its own target. Called with pool_lock held; NULL when
 * there is none.
 */
static shm_session_t *take_pair(kvt__shm_t *shm, shm_session_t *s, job_t *j,
                                job_t **j2_p)
{
    if (j->op != KVT_OP_WRITE || j->nsegs == 0 || j->segs[0].count < 2 ||
        j->segs[0].lstride <= j->segs[0].len ||
        atomic_load_explicit(&s->mapped, memory_order_relaxed) == 0)
        return NULL;
    for (shm_session_t *o = shm->sessions; o != NULL; o = o->next_all) {
        job_t *prev, *c;
        unsigned k = 0;

        if (o == s ||
            atomic_load_explicit(&o->mapped, memory_order_relaxed) == 0)
            continue;
        pthread_mutex_lock(&o->lock);
        /* As take_locked(): none of a dead or held session. */
        if (atomic_load(&o->base.dead) || atomic_load(&o->held)) {
            pthread_mutex_unlock(&o->lock);
            continue;
        }
        for (prev = NULL, c = o->head; c != NULL && k < PAIR_LOOK;
             prev = c, c = c->next, k++) {
            if (c->op == KVT_OP_NOTIFY)
                break;
            if (c->op != KVT_OP_WRITE || c->nsegs != j->nsegs ||
                !seg_siblings(&j->segs[0], &c->segs[0]))
                continue;
            if (prev == NULL)
                o->head = c->next;
            else
                prev->next = c->next;
            if (o->tail == c)
                o->tail = prev;
            o->inflight++;
            pthread_mutex_unlock(&o->lock);
            *j2_p = c;
            return o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    return NULL;
}

/* Whether any job is parked or any session held. */
static int stopped_any(kvt__shm_t *shm)
{
    return atomic_load(&shm->nparked) > 0 || atomic_load(&shm->nheld) > 0;
}

static void *worker_main(void *arg)
{
    kvt__shm_t *shm = arg;
    uint64_t last_tick = kvt__now_ns();

    pthread_mutex_lock(&shm->pool_lock);
    while (!shm->stopping) {
        shm_session_t *s;
        job_t *j = NULL;
        uint64_t now;

        /* Parked jobs and held sessions are looked at between jobs too,
         * so that a busy pool does not leave them waiting. */
        now = stopped_any(shm) && !shm->park_polling ? kvt__now_ns() : 0;
        if (now != 0 && now - shm->park_polled >= STOPPED_POLL_NS) {
            shm->park_polling = 1;
            shm->park_polled = now;
            pthread_mutex_unlock(&shm->pool_lock);
            stopped_poll(shm);
            pthread_mutex_lock(&shm->pool_lock);
            shm->park_polling = 0;
        }
        s = take_next(shm, &j);
        if (j != NULL) {
            job_t *j2 = NULL;
            shm_session_t *s2 = take_pair(shm, s, j, &j2);
            pthread_mutex_unlock(&shm->pool_lock);
            if (j2 != NULL)
                job_run_pair(s, j, s2, j2);
            else
                job_run(s, j);
            pthread_mutex_lock(&shm->pool_lock);
            continue;
        }
        now = kvt__now_ns();
        if (now - last_tick >= TICK_NS) {
            last_tick = now;
            pthread_mutex_unlock(&shm->pool_lock);
            pool_tick(shm);
            pthread_mutex_lock(&shm->pool_lock);
            continue;
        }
        {
            struct timespec ts;
            uint64_t ns;
            clock_gettime(CLOCK_REALTIME, &ts);
            ns = (uint64_t)ts.tv_nsec +
                 (stopped_any(shm) ? STOPPED_POLL_NS : TICK_NS);
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            shm->idle++;
            pthread_cond_timedwait(&shm->pool_cond, &shm->pool_lock, &ts);
            shm->idle--;
        }
    }
    pthread_mutex_unlock(&shm->pool_lock);
    return NULL;
}

/* Start the workers with the first session. Called with pool_lock held. */
static kvt_status_t pool_start_locked(kvt__shm_t *shm)
{
    unsigned n = shm->cfg->num_workers;

    if (shm->workers != NULL)
        return KVT_OK;
    shm->workers = calloc(n, sizeof(pthread_t));
    if (shm->workers == NULL)
        return KVT_ERR_NO_MEMORY;
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&shm->workers[i], NULL, worker_main, shm) != 0) {
            KVT_LOG_E("shm: cannot start worker threads");
            break;
        }
        shm->nworkers++;
    }
    return shm->nworkers > 0 ? KVT_OK : KVT_ERR_IO;
}

void kvt__shm_sessions_stop(kvt__shm_t *shm)
{
    shm_session_t **all;
    size_t nall;

    pthread_mutex_lock(&shm->pool_lock);
    shm->stopping = 1;
    pthread_cond_broadcast(&shm->pool_cond);
    pthread_mutex_unlock(&shm->pool_lock);
    for (unsigned i = 0; i < shm->nworkers; i++)
        pthread_join(shm->workers[i], NULL);
    shm->nworkers = 0;
    all = sessions_get(shm, &nall);
    for (size_t k = 0; k < nall; k++)
        session_kill(&all[k]->base, KVT_ERR_CANCELED);
    sessions_put(all, nall);
}

/* ---- Opening a session --------------------------------------------------- */

/*
 * Connect to the target's socket, check that the process behind it is the
 * one the descriptor names, and receive and check the channel; then probe
 * that this process may attach to it. On failure *why says what to log.
 */
static kvt_status_t chan_connect(shm_session_t *s, const kvt__segdesc_t *d,
                                 const char *path, size_t nl, const char **why)
{
    const kvt__engine_cfg_t *cfg = s->shm->cfg;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint64_t ms = cfg->connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000};
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    kvt__shm_msg_t m;
    uint64_t probe = 0;
    struct iovec lv = {&probe, sizeof(probe)}, rv;
    int memfd = -1;

    memcpy(sa.sun_path, path, nl);
    s->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s->sock < 0) {
        *why = "cannot create a socket";
        return KVT_ERR_IO;
    }
    setsockopt(s->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(s->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(s->sock, (struct sockaddr *)&sa,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl))) {
        *why = "the peer serves no shm socket (another network namespace?)";
        return KVT_ERR_UNREACHABLE;
    }
    if (getsockopt(s->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        cred.pid != (pid_t)d->pid) {
        *why = "the socket's owner is not the peer's process";
        return KVT_ERR_ACCESS;
    }
    msg_init(&m, KVT_SHM_HELLO);
    m.pid = (uint32_t)getpid();
    snprintf(m.name, sizeof(m.name), "%s", cfg->seg_name);
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m) ||
        recv_msg(s->sock, &m, &memfd) != (ssize_t)sizeof(m) ||
        m.magic != KVT_SHM_MAGIC || m.type != KVT_SHM_HELLO_ACK) {
        *why = "no answer to the shm handshake";
        goto err_fd;
    }
    if (m.status != KVT_OK || m.version != KVT_SHM_VERSION) {
        *why = m.version != KVT_SHM_VERSION ? "another shm protocol version"
                                            : "the peer refused the channel";
        goto err_fd;
    }
    if (m.pid != d->pid || m.host_id != cfg->host_id || memfd < 0 ||
        m.length < KVT_SHM_CHAN_SIZE || !memfd_sound(memfd, m.length)) {
        *why = "the peer's channel does not check out";
        goto err_fd;
    }
    s->ch_len = m.length;
    s->ch = mmap(NULL, s->ch_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    close(memfd);
    memfd = -1;
    if (s->ch == MAP_FAILED) {
        s->ch = NULL;
        *why = "cannot map the channel";
        return KVT_ERR_NO_MEMORY;
    }
    if (s->ch->magic != KVT_SHM_CHAN_MAGIC ||
        s->ch->version != KVT_SHM_VERSION || s->ch->size != s->ch_len ||
        s->ch->max_notes != KVT_SHM_NOTES ||
        s->ch->max_regions != KVT_SHM_MAX_REGIONS) {
        *why = "the peer's channel does not check out";
        return KVT_ERR_PROTOCOL;
    }
    /* The channel is at m.addr in the target: reading it back proves
     * that this process may attach to that one. */
    rv = (struct iovec){(void *)(uintptr_t)m.addr, sizeof(probe)};
    if (process_vm_readv(s->pid, &lv, 1, &rv, 1, 0) != sizeof(probe) ||
        probe != KVT_SHM_CHAN_MAGIC) {
        *why = errno == EPERM ? "not permitted to attach to the peer "
                                "(ptrace restrictions)"
                              : "cannot attach to the peer";
        return KVT_ERR_ACCESS;
    }
    s->pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
    {
        char statpath[64];
        snprintf(statpath, sizeof(statpath), "/proc/%d/stat", (int)s->pid);
        s->statfd = open(statpath, O_RDONLY | O_CLOEXEC);
    }
    if (s->statfd < 0) {
        *why = "cannot read the peer's state in /proc";
        return KVT_ERR_ACCESS;
    }
    return KVT_OK;

err_fd:
    if (memfd >= 0)
        close(memfd);
    return KVT_ERR_PROTOCOL;
}

/*
 * Map the allocations the first snapshot names, before the session is
 * used, while @deadline allows: the target's KV memory is then ready for
 * the first transfers. Anything left is mapped on first use (cross-memory
 * attach carries those transfers meanwhile).
 */
static void maps_prefetch(shm_session_t *s, uint64_t deadline)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t ids[16], nids = 0, n;

    atomic_fetch_add(&ch->active, 1);
    if (atomic_load(&ch->lease) & 1) {
        n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions
                                               : KVT_SHM_MAX_REGIONS;
        for (uint32_t r = 0; r < n && nids < 16; r++) {
            uint32_t id = ch->regions[r].map_id, k = 0;
            while (k < nids && ids[k] != id)
                k++;
            if (id != 0 && k == nids)
                ids[nids++] = id;
        }
    }
    lease_release(s);
    for (uint32_t i = 0; i < nids && kvt__now_ns() < deadline; i++)
        map_request(s, ids[i], deadline);
}

/*
 * The peer's shm section: version 1, the name of its abstract socket (a
 * u16 length and the name, without the leading NUL). 0 when sound.
 */
static int section_sock(const kvt__segdesc_tl_t *tl, char *path, size_t *len_p)
{
    uint16_t n;

    if (tl == NULL || tl->version != 1 || tl->len < 2)
        return -1;
    n = (uint16_t)(tl->body[0] | (tl->body[1] << 8));
    if (n == 0 || n > KVT_SHM_SOCK_MAX || (uint32_t)n + 2 != tl->len ||
        memchr(tl->body + 2, 0, n) != NULL)
        return -1;
    path[0] = '\0'; /* abstract namespace */
    memcpy(path + 1, tl->body + 2, n);
    *len_p = 1 + (size_t)n;
    return 0;
}

static kvt_status_t shm_session_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                             kvt__session_t **s_p, const char **why)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    uint64_t t0 = kvt__now_ns();
    kvt__segdesc_t d = {0};
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t plen = 0;
    pthread_rwlockattr_t ra;
    shm_session_t *s;
    kvt_status_t st;
    int bad;

    memcpy(d.name, peer->desc->name, sizeof(d.name));
    d.host_id = peer->desc->host_id;
    d.pid = peer->desc->pid;
    bad = section_sock(kvt__segdesc_tl(peer->desc, KVT_TRANSPORT_SHM), path,
                       &plen);
    if (bad) {
        *why = "the peer's shm section is malformed";
        return KVT_ERR_PROTOCOL;
    }

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        *why = "out of memory";
        return KVT_ERR_NO_MEMORY;
    }
    s->sock = s->pidfd = s->statfd = -1;
    s->pid = (pid_t)d.pid;
    s->shm = shm;
    snprintf(s->base.name, sizeof(s->base.name), "%s", peer->name);
    st = chan_connect(s, &d, path, plen, why);
    if (st != KVT_OK)
        goto err_free;

    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->sock_lock, NULL);
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->map_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    atomic_store(&s->map_seq, UINT64_MAX);
    /* Half of what is left of the connect timeout at most. */
    {
        uint64_t now = kvt__now_ns();
        uint64_t end = t0 + shm->cfg->connect_timeout_ms * 1000000ull;
        if (now < end)
            maps_prefetch(s, now + (end - now) / 2);
    }

    pthread_mutex_lock(&shm->pool_lock);
    st = pool_start_locked(shm);
    if (st == KVT_OK) {
        kvt__session_init(&s->base, tl, peer);
        s->next_all = shm->sessions;
        shm->sessions = s;
        s->linked = 1;
    }
    pthread_mutex_unlock(&shm->pool_lock);
    if (st != KVT_OK) {
        *why = "cannot start worker threads";
        for (size_t i = 0; i < s->nmaps; i++)
            munmap(s->maps[i].local, s->maps[i].len);
        free(s->maps);
        pthread_rwlock_destroy(&s->map_lock);
        pthread_mutex_destroy(&s->sock_lock);
        pthread_mutex_destroy(&s->lock);
        goto err_free;
    }
    *s_p = &s->base;
    return KVT_OK;

err_free:
    if (s->ch != NULL)
        munmap(s->ch, s->ch_len);
    if (s->sock >= 0)
        close(s->sock);
    if (s->pidfd >= 0)
        close(s->pidfd);
    if (s->statfd >= 0)
        close(s->statfd);
    free(s);
    return st;
}

/* A peer is reachable when its shm section names a socket (the open then
 * checks that the process behind it is the one the descriptor names). */
static int shm_reachable(kvt__tl_t *tl, const kvt__segdesc_t *d,
                         const char **why_p)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t len;

    (void)tl;
    if (section_sock(kvt__segdesc_tl(d, KVT_TRANSPORT_SHM), path, &len) != 0) {
        *why_p = "the peer's shm section is malformed";
        return 0;
    }
    return 1;
}

KVT_TRANSPORT_REGISTER(shm, {
    .name = "shm",
    .id = KVT_TRANSPORT_SHM,
    .caps = {.local_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .remote_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .flags = KVT__TL_SAME_HOST | KVT__TL_STRIDED,
             .priority = 100},
    .create = kvt__shm_create,
    .stop = kvt__shm_stop,
    .destroy = kvt__shm_destroy,
    .describe = kvt__shm_describe,
    .mem_changed = kvt__shm_registry_changed,
    .reachable = shm_reachable,
    .open = shm_session_open,
    .submit = shm_submit,
    .progress = shm_progress,
    .flush = shm_flush,
    .kill = session_kill,
    .destroy_session = session_destroy,
});
