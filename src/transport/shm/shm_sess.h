/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_SHM_SHM_SESS_H
#define KVT_TRANSPORT_SHM_SHM_SESS_H

/*
 * The same-host transport, initiator side: a session to a target on this
 * host, met on the abstract socket its descriptor's shm section names.
 * Its liveness comes from the target process itself (a pidfd, its
 * /proc state) and the socket.
 *
 * Jobs. A submission is cut into jobs, runs of segments of one opcode of
 * at most JOB_MAX bytes and JOB_SEGS segments, sized so that a large
 * submission spreads over every executor and its last jobs are small
 * (kvt__shm_job_size()); a NOTIFY is a job of its own.
 * Jobs queue on their session in submission order.
 *
 * Executors. Whoever takes a job runs it: a pool worker, or the thread
 * waiting on the batch (the ops' progress), so a synchronous transfer costs
 * no wake-up. Several threads run jobs of one session at once; that is
 * how a large submission is split across threads. Running a job: take the
 * channel's lease (shm_target.c explains it), check every segment against the
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
 * held only across one bounded request (or exchange). No lock is held while
 * waiting for the lease, and the lease is never held while waiting for the
 * target.
 */
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/shm/shm.h"

/* Jobs of a submission of SPLIT_MIN bytes or more are cut to sizes
 * between JOB_MIN and JOB_MAX (kvt__shm_job_size()). */
#define JOB_MIN (256u * 1024u)
#define SPLIT_MIN (2u * 1024u * 1024u)
#define JOB_MAX (8u * 1024u * 1024u)
#define JOB_SEGS 1024u
#define CMA_IOV 1024 /* UIO_MAXIOV */
#define TICK_NS (50ull * 1000000ull)
#define SLICE_NS (10 * 1000000)
#define STOPPED_POLL_NS (1000u * 1000u)
#define WAIT_SPIN_NS (50u * 1000u)
/* How long a pool worker that ended a job polls for the next submission
 * before it sleeps (shm_pool.c, pool_spin()). */
#define IDLE_SPIN_NS (100u * 1000u)
#define NOMAP_MAX 16
/* Strided pieces up to this size stay whole, grouped in one segment. */
#define PACK_MAX (64u * 1024u)
/* Strided writes of pieces up to this size into memory that is not
 * mapped go through the staging slots (shm.h) rather than cross-memory
 * attach, which pins a target page per vector when the pieces are
 * strided there and takes a vector per piece when they are strided
 * here. */
#define STAGE_PIECE_MAX 2048u

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
    int32_t ldev;      /* the local side's device; -1 for host memory */
    kvt__comp_t *comp; /* of the descriptor it is part of */
} seg_t;

/* How a segment is copied (rw_run). HOW_DEV: by the device (a device
 * copy between this side and the target's memory as opened or mapped
 * here); HOW_BOUNCE: device memory here, host memory there that is not
 * mapped: through a pinned bounce buffer and cross-memory attach. */
enum { HOW_NONE, HOW_MAP, HOW_CMA, HOW_STAGE, HOW_DEV, HOW_BOUNCE };

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
    uint64_t bytes; /* of its segments (planned) */
    seg_t *segs;
    uint32_t nlen; /* NOTIFY: the message */
    uint8_t *msg;
} job_t;

typedef struct {
    uint32_t id;
    uint64_t base, len; /* in the target */
    uint8_t *local;
} map_t;

/* A device allocation of the target, opened here through the driver's
 * sharing (shm_ipc.c): once, however many of its regions are linked to
 * it. */
typedef struct {
    uint64_t base, len; /* the allocation, in the target */
    uint8_t *local;     /* its base here */
    int dev;            /* the context it was opened under; -1: none (an
                           engine of this process: its addresses) */
    uint32_t links;     /* regions linked to it */
} ipc_t;

/* A device region of the target (registration @serial, from @start
 * there), linked to the opening of the allocation at @base there. */
typedef struct {
    uint32_t serial;
    uint64_t start;
    uint64_t base;
} ipc_link_t;

/* A device region whose opening a job asks for (rw_plan_t). */
typedef struct {
    uint64_t start;
    uint32_t serial;
} ipc_want_t;

/* The openings a job asks for in one exchange, at most (shm_ipc.c). */
#define IPC_WANT_MAX 256u

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
    job_t
        *parked; /* copied, waiting for a stopped target (kvt__shm_job_park) */
    unsigned inflight;
    int released;
    _Atomic int held; /* the target is stopped: no job is taken */
    /* kvt__shm_stopped_poll() only: the target read as running at the
     * last poll, after it had read as stopped or with jobs parked. */
    int ran;

    pthread_rwlock_t map_lock;
    map_t *maps;
    size_t nmaps, mcap;
    _Atomic uint32_t
        mapped; /* nmaps, read without map_lock (kvt__shm_take_pair) */
    _Atomic uint64_t map_seq;  /* snapshot the mappings were checked against */
    uint32_t nomap[NOMAP_MAX]; /* refused requests, until the next one */
    unsigned nnomap;
    /* The target's device allocations opened here (shm_ipc.c), sorted by
     * their base there; the device regions linked to them, sorted by
     * serial; the refused regions until the next snapshot (past NOMAP_MAX
     * of them, @noipc_over: every region not linked). Under map_lock, as
     * the mappings are. */
    ipc_t *ipcs;
    size_t nipcs, icap;
    ipc_link_t *links;
    size_t nlinks, lcap;
    uint32_t noipc[NOMAP_MAX];
    unsigned nnoipc;
    int noipc_over;
    _Atomic int dev_said; /* a device transfer was refused: said once */

    pthread_mutex_t sock_lock;
    uint64_t req_seq;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A run as this side wrote it (the slot's copy is the peer's to
 * change): the job segment, where its pieces are here, and where in the
 * slot. */
typedef struct {
    uint64_t laddr;
    uint32_t seg, off, len, count;
} hrun_t;

/* The slots one executor holds for one job (at most all of them), and
 * their runs. */
typedef struct {
    uint32_t n;
    uint32_t slot[KVT_SHM_STAGE_SLOTS];
    uint32_t nruns[KVT_SHM_STAGE_SLOTS]; /* this side's count, not the
                                            slot's, which the peer can
                                            write */
    hrun_t run[KVT_SHM_STAGE_SLOTS][KVT_SHM_STAGE_RUNS];
} held_t;

/* How each segment of a job is copied, and where it lies in a mapping
 * (HOW_MAP), decided under the lease (rw_begin). */
typedef struct {
    uint32_t ncma, nmap, nstage, want_map;
    kvt_status_t st; /* of the attached copies (rw_release) */
    /* Device copies: segments by the device and through the bounce
     * buffer, and those waiting for an opening or a mapping (need),
     * asked for (the device regions in want, the snapshot they were seen
     * in map_seq) before the job is tried again. */
    uint32_t ndev, nbounce, need, nwant;
    uint64_t map_seq;
    int sdev;                    /* the device of the job's stream */
    int dfail;                   /* a device copy could not be queued */
    struct kvt__shm_dstream *ds; /* the job's stream, once issued */
    uint8_t how[JOB_SEGS];
    uint8_t *loc[JOB_SEGS];
    uint8_t *dloc[JOB_SEGS]; /* HOW_DEV: the target's side here; NULL:
                                resolved piece by piece */
    ipc_want_t want[IPC_WANT_MAX];
} rw_plan_t;

/* ---- Across the files of the initiator side -------------------------- */

/* shm_liveness.c */
void kvt__shm_session_hold(shm_session_t *s);
int kvt__shm_session_unhold(shm_session_t *s);
kvt_status_t kvt__shm_session_status(shm_session_t *s);
kvt_status_t kvt__shm_peer_status(shm_session_t *s);
int kvt__shm_target_state(shm_session_t *s);
int kvt__shm_target_check(shm_session_t *s, kvt_status_t *st_p);

/* shm_chan.c */
void kvt__shm_lease_release(shm_session_t *s);
int kvt__shm_lease_try(shm_session_t *s, uint32_t *seen_p);
kvt_status_t kvt__shm_lease_acquire(shm_session_t *s, uint64_t deadline);
ssize_t kvt__shm_recv_msg(int fd, kvt__shm_msg_t *m, int *fd_p);
int kvt__shm_memfd_sound(int fd, uint64_t len);
kvt_status_t kvt__shm_ring_wait(shm_session_t *s, _Atomic uint32_t *word,
                                uint32_t v, uint64_t deadline);
void kvt__shm_ring_bell(shm_session_t *s);
kvt_status_t kvt__shm_notify_run(shm_session_t *s, job_t *j);
kvt_status_t kvt__shm_chan_connect(shm_session_t *s, const kvt__segdesc_t *d,
                                   const char *path, size_t nl,
                                   const char **why);
int kvt__shm_section_sock(const kvt__segdesc_tl_t *tl, char *path,
                          size_t *len_p);

/* Where [lo, hi) of the target lies in @local, a view here of the
 * target's [base, base + len) (a mapping, an opened allocation), or NULL
 * when it does not lie within. */
static inline uint8_t *kvt__shm_at(uint8_t *local, uint64_t base, uint64_t len,
                                   uint64_t lo, uint64_t hi)
{
    return lo >= base && hi <= base + len ? local + (lo - base) : NULL;
}

/* shm_map.c */
map_t *kvt__shm_map_find(shm_session_t *s, uint32_t id);
int kvt__shm_map_refused(shm_session_t *s, uint32_t id);
void kvt__shm_maps_reconcile(shm_session_t *s);
void kvt__shm_map_request(shm_session_t *s, uint32_t id);
void kvt__shm_rw_copy_maps(job_t *j, rw_plan_t *p);
void kvt__shm_maps_prefetch(shm_session_t *s, uint64_t deadline);

/* shm_dev.c */
struct kvt__shm_dstream {
    struct kvt__shm_dstream *next;
    kvt__dstream_t *s;
    int dev;
};
struct kvt__shm_bounce {
    struct kvt__shm_bounce *next;
    uint8_t *buf;
};
struct kvt__shm_dstream *kvt__shm_dstream_get(kvt__shm_t *shm, int dev);
void kvt__shm_dstream_put(kvt__shm_t *shm, struct kvt__shm_dstream *d);
void kvt__shm_dev_issue(shm_session_t *s, job_t *j, rw_plan_t *p);
kvt_status_t kvt__shm_dev_finish(shm_session_t *s, job_t *j, rw_plan_t *p);

/* shm_ipc.c */
const ipc_t *kvt__shm_ipc_find(shm_session_t *s, uint32_t serial);
int kvt__shm_ipc_refused(shm_session_t *s, uint32_t serial);
/* Add device region @serial (from @start) to the openings @p asks for;
 * past IPC_WANT_MAX of them it waits for the job's next try. */
void kvt__shm_ipc_want(rw_plan_t *p, uint32_t serial, uint64_t start);
/*
 * Ask the target for the allocations holding the device regions of
 * @want[0..n) (sorted here) that are neither open nor refused, in one
 * exchange, and open each allocation not open yet, outside the lease
 * (the target answers from its service thread); nothing is asked when
 * the snapshot is no longer @seq, the one they were seen in. KVT_OK
 * once answered (opened or refused), KVT_ERR_TIMEDOUT when the answers
 * did not all come by @deadline (a stopped target), KVT_ERR_CONN_LOST
 * when the socket broke.
 */
kvt_status_t kvt__shm_ipc_fetch(shm_session_t *s, ipc_want_t *want, uint32_t n,
                                uint64_t seq, uint64_t deadline);
void kvt__shm_ipcs_reconcile_locked(shm_session_t *s);
void kvt__shm_ipcs_release(shm_session_t *s);
void kvt__shm_dev_refused(shm_session_t *s, const char *why);

/* shm_job.c: the snapshot region holding [lo, hi) with @access, or NULL. */
const kvt__shm_region_t *kvt__shm_region_find(const kvt__shm_chan_t *ch,
                                              uint32_t n, uint64_t lo,
                                              uint64_t hi, uint32_t access);

/* shm_cma.c */
kvt_status_t kvt__shm_cma_run(shm_session_t *s, job_t *j, const uint8_t *how);

/* shm_stage.c */
kvt_status_t kvt__shm_stage_run(shm_session_t *s, job_t *j, const uint8_t *how);

/* shm_job.c */
void kvt__shm_segs_fail(job_t *j, uint32_t from, uint32_t to, kvt_status_t st);
int kvt__shm_seg_siblings(const seg_t *a, const seg_t *b);
void kvt__shm_job_run_pair(shm_session_t *s, job_t *j, shm_session_t *s2,
                           job_t *j2);
void kvt__shm_fail_list(job_t *list, kvt_status_t st);
void kvt__shm_job_park(shm_session_t *s, job_t *j);
void kvt__shm_parked_end(shm_session_t *s, job_t *list, kvt_status_t st);
/*
 * Run job @j of @s, taken with kvt__shm_take_locked(), and account for
 * it; it may go on with more jobs of the same submission (shm_job.c, RUN_MAX)
 * until @until_ns (kvt__now_ns(); 0: no limit), a waiting thread's
 * deadline.
 */
void kvt__shm_job_run(shm_session_t *s, job_t *j, uint64_t until_ns);

/* shm_pool.c */
job_t *kvt__shm_take_locked(shm_session_t *s);
/* Signal up to @n sleeping workers; returns how many were asleep. */
unsigned kvt__shm_pool_wake(kvt__shm_t *shm, unsigned n);
/*
 * Admission of copiers. A pool worker runs a job between
 * kvt__shm_copier_enter(shm, 0) and kvt__shm_copier_leave(); a waiting
 * thread runs jobs of its batch (shm_progress()) between
 * kvt__shm_copier_enter(shm, 1) and kvt__shm_copier_leave(). Either
 * brackets every wait for a target inside with kvt__shm_copier_waits(1)
 * and (0), in pairs, which may nest (on any other thread they do
 * nothing): a thread that waits does not hold a CPU. A worker takes a
 * job only when kvt__shm_room() leaves it room.
 */
void kvt__shm_copier_enter(kvt__shm_t *shm, int driver);
void kvt__shm_copier_leave(kvt__shm_t *shm);
void kvt__shm_copier_waits(int on);
/* How many more workers may take a job while @busy workers run one and
 * @drivers waiting threads run jobs (none for @idle_ns: 0 when some do),
 * in a process that may use @ncpu CPUs: the CPUs they leave free, a
 * waiting thread counted for DRIVE_GRACE_NS after it left, and one when
 * no worker runs a job. */
unsigned kvt__shm_room(unsigned busy, unsigned drivers, uint64_t idle_ns,
                       unsigned ncpu);
/* How long a waiting thread that left shm_progress() is counted as still
 * running jobs: between two batches it comes back within microseconds. */
#define DRIVE_GRACE_NS (200u * 1000u)
void kvt__shm_submit_wake(kvt__shm_t *shm, unsigned n, int plugged);
void kvt__shm_flush(kvt__tl_t *tl);
void kvt__shm_stopped_poll(kvt__shm_t *shm);
/*
 * Whether kvt__shm_stopped_poll() takes a target as still stopped, given
 * what kvt__shm_target_check() said (@stopped, @st): a stopped target that
 * is killed reads as running for a moment (each thread takes SIGKILL off
 * its pending signals before it marks itself exiting), so it runs again
 * only when two polls in a row, STOPPED_POLL_NS apart, read it running;
 * by the second a killed one reads as dying or its pidfd as gone. @ran:
 * the session's note of the last poll.
 */
int kvt__shm_still_stopped(int *ran, int stopped, kvt_status_t st);
shm_session_t *kvt__shm_take_pair(kvt__shm_t *shm, shm_session_t *s, job_t *j,
                                  job_t **j2_p);
kvt_status_t kvt__shm_pool_start_locked(kvt__shm_t *shm);

/* shm_session.c */
/*
 * The size of the next job of a submission whose jobs take 1/@share each
 * of the @left bytes not yet cut (guided scheduling), within [JOB_MIN,
 * JOB_MAX]; @share 0: JOB_MAX (a submission below SPLIT_MIN, or one
 * executor). The executors take the large jobs first and the small last
 * ones even out when they finish, so that at the end of a batch no
 * executor copies alone while the others wait for the next one.
 */
uint64_t kvt__shm_job_size(uint64_t left, unsigned share);
void kvt__shm_release(shm_session_t *s);
void kvt__shm_session_kill(kvt__session_t *base, kvt_status_t why);

#endif
