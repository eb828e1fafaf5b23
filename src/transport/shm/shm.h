/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_SHM_SHM_H
#define KVT_TRANSPORT_SHM_SHM_H

/*
 * The same-host transport (docs/shm.md is the spec). A target engine
 * listens on an abstract Unix socket whose name follows from its segment
 * descriptor; an initiator on the same host (same boot id, same pid
 * namespace, verified) connects, and the target hands it a *channel*: a
 * sealed memfd that both map. The initiator then moves bytes itself, with
 * process_vm_writev/readv into any registered memory, or with memcpy into
 * a mapping of the target's kvt_mem_alloc() memfds, which the target also
 * passes over the socket. The channel carries:
 *
 *  - the lease: a word the target makes odd while the snapshot below is
 *    current, and a count of copies in progress that the initiator raises
 *    around every copy. A registry change closes the lease, waits for the
 *    count to drain, publishes the new snapshot and reopens it, before
 *    kvt_mem_register()/kvt_mem_unregister() return;
 *  - the snapshot of the target's registry (regions, access rights, and
 *    which kvt_mem_alloc() allocation holds each), against which the
 *    initiator checks every range while it holds the lease;
 *  - a ring of notifications, delivered by the target's service thread;
 *  - staging slots for small pieces, copied out by that thread.
 *
 * Every field one side reads from the other is untrusted: indices are
 * bounded, lengths clamped, and a wrong value can only fail transfers.
 */
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mem/dev.h"
#include "core/tl.h"

#define KVT_SHM_VERSION 5
#define KVT_SHM_MAGIC 0x5354564bu                /* "KVTS" */
#define KVT_SHM_CHAN_MAGIC 0x316e616863747663ull /* "kvtchan1" */
#define KVT_SHM_NOTES 64u
#define KVT_SHM_MAX_REGIONS KVT_SEGDESC_MAX_REGIONS
/* The target's service thread also looks at every channel this often, in
 * case a bell was lost to a full socket. */
#define KVT_SHM_TICK_NS (50ull * 1000000ull)
/* A registry change waits this long for an initiator's copies to drain
 * before it severs that initiator's channel. */
#define KVT_SHM_DRAIN_NS (1000ull * 1000000ull)

/* Staging: small pieces (the heads of one rank inside another rank's
 * token-major blocks) into memory the initiator cannot map. It copies
 * them into a slot; the target's service thread checks each run against
 * its registry and copies it out. Cross-memory attach pins the target's
 * page once per vector, so it is slow for such pieces. Device memory of
 * the target that the driver does not share goes through the slots too,
 * both ways: the target copies runs of a READ slot into it. */
#define KVT_SHM_STAGE_SLOTS 8u
#define KVT_SHM_STAGE_BYTES (512u * 1024u)
#define KVT_SHM_STAGE_RUNS 256u

/* A slot's state: the initiator claims a free slot, fills it and makes it
 * full; the target makes it done; the initiator reads the results and
 * frees it. */
enum {
    KVT_SHM_SLOT_FREE = 0,
    KVT_SHM_SLOT_CLAIMED = 1,
    KVT_SHM_SLOT_FULL = 2,
    KVT_SHM_SLOT_DONE = 3,
    KVT_SHM_SLOT_BUSY = 4, /* being copied out by the target */
};

/* @count pieces of @len bytes for [raddr + k * rstride, + len), packed in
 * the slot's data from @off. @st: the target's verdict. */
typedef struct {
    uint64_t raddr;
    uint64_t rstride;
    uint64_t off;
    uint32_t len;
    uint32_t count;
    int32_t st;
    uint32_t reserved;
} kvt__shm_run_t;

typedef struct {
    alignas(64) _Atomic uint32_t state;
    uint32_t nruns;
    uint32_t op; /* KVT_OP_WRITE: into the target; KVT_OP_READ: out */
    kvt__shm_run_t runs[KVT_SHM_STAGE_RUNS];
    alignas(64) uint8_t data[KVT_SHM_STAGE_BYTES];
} kvt__shm_slot_t;

/* One region of the target's registry, as the channel publishes it. */
typedef struct {
    uint64_t start;
    uint64_t end; /* exclusive */
    uint32_t access;
    uint32_t map_id; /* kvt_mem_alloc() allocation holding it; 0: none */
    uint32_t serial; /* the registration (kvt__region_t.serial) */
    uint16_t kind;   /* kvt_mem_kind_t */
    int16_t device;  /* of device memory; -1 for host memory */
} kvt__shm_region_t;

typedef struct {
    uint32_t len;
    uint32_t reserved;
    uint8_t data[KVT_NOTIFY_MAX];
} kvt__shm_note_t;

/*
 * The channel, at offset 0 of its memfd. Fields are grouped by writer so
 * that the initiator's hot counter does not share a cache line with the
 * target's words.
 */
typedef struct {
    /* Fixed by the target at creation. */
    uint64_t magic;
    uint32_t version;
    uint32_t target_pid;
    uint64_t size;
    uint32_t max_regions;
    uint32_t max_notes;

    /* Written by the target. */
    alignas(64) _Atomic uint32_t lease; /* odd: open; futex word */
    _Atomic int32_t closed;             /* != 0: channel closed, why */
    _Atomic uint32_t nq_head;           /* notifications consumed; futex word */
    _Atomic uint32_t stage_seq;         /* slots made done; futex word */
    uint32_t nregions;
    uint32_t truncated; /* the registry had more regions than fit */
    uint64_t snap_seq;  /* changes with every published snapshot */

    /* Written by the initiator. */
    alignas(64) _Atomic uint32_t active; /* copies in progress; futex */
    _Atomic uint32_t lease_waiters;
    _Atomic uint32_t nq_tail;
    _Atomic uint32_t waiters; /* sleeping on nq_head or stage_seq */
    /* What this initiator moved into and out of the target's memory
     * (kvt_served_stats_t: writes, reads, their bytes), for the target's
     * metrics: it sees no copy. Within this group's cache line, so the
     * layout after it is that of channels without them. */
    _Atomic uint64_t served[4];

    alignas(64) kvt__shm_note_t notes[KVT_SHM_NOTES];
    kvt__shm_slot_t stage[KVT_SHM_STAGE_SLOTS];
    kvt__shm_region_t regions[]; /* max_regions */
} kvt__shm_chan_t;

#define KVT_SHM_CHAN_SIZE                                                      \
    ((sizeof(kvt__shm_chan_t) +                                                \
      (size_t)KVT_SHM_MAX_REGIONS * sizeof(kvt__shm_region_t) + 4095) &        \
     ~(size_t)4095)

/* Messages on the Unix socket (SOCK_SEQPACKET, one struct per message). */
enum {
    KVT_SHM_HELLO = 1,     /* initiator: pid, name */
    KVT_SHM_HELLO_ACK = 2, /* target: status, pid, host_id, addr, length;
                              the channel memfd rides along */
    KVT_SHM_MAP = 3,       /* initiator: id (allocation), seq */
    KVT_SHM_MAP_ACK = 4,   /* target: status, id, seq, addr, length; the
                              allocation's memfd rides along on success */
    KVT_SHM_BELL = 5,      /* initiator: notifications wait */
    KVT_SHM_IPC = 6,       /* initiator: id (a device region's serial),
                              addr (its start), seq */
    KVT_SHM_IPC_ACK = 7,   /* target: status, id, seq, addr and length (the
                              allocation holding the region), pid (its
                              device's ordinal there), name (its device's
                              UUID, KVT_SHM_UUID_BYTES; all zero: none),
                              handle; on failure, name says why */
    KVT_SHM_CHALLENGE = 8, /* target: pid, handle = its nonce and MAC */
    KVT_SHM_AUTH = 9,      /* initiator: handle = its MAC */
};

/* Bytes of a device UUID in an IPC answer's name. */
#define KVT_SHM_UUID_BYTES 16

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    int32_t status;
    uint32_t pid;
    uint64_t host_id;
    uint64_t id;
    uint64_t seq;
    uint64_t addr;
    uint64_t length;
    char name[KVT_WIRE_NAME_MAX + 1];
    uint8_t handle[KVT__DEV_IPC_BYTES];
} kvt__shm_msg_t;

typedef struct shm_tchan shm_tchan_t;
typedef struct shm_session shm_session_t;

/* Engine-wide state of the transport, both roles. */
typedef struct kvt__shm kvt__shm_t;

struct kvt__shm {
    kvt__tl_t base;
    kvt_engine_h e;
    const kvt__engine_cfg_t *cfg;
    kvt__memreg_t *reg;

    /* Target role (shm_target.c). */
    int listen_fd;
    char sock_name[108]; /* the abstract socket's, with its leading NUL */
    size_t sock_len;
    int epfd;
    int evfd;
    pthread_t thread;
    int running;
    /* Lock order: chan_lock -> registry read lock -> alloc_lock. */
    pthread_mutex_t chan_lock; /* channel list, snapshots, leases */
    shm_tchan_t *chans;
    uint64_t served_gone[4]; /* the channels' served[] at their close */
    _Atomic uint64_t served_last[4]; /* the sums last read, never less */
    uint64_t snap_seq;
    /* The stage helper (shm_target.c), started by the service thread. */
    pthread_t helper;
    int helper_running, helper_failed;
    _Atomic uint32_t helper_seq; /* futex word: work for the helper */
    _Atomic int helper_stop;
    _Atomic int ipc_said; /* an export was refused: said once */

    /* Initiator role (shm_session.c). Lock order: pool_lock -> session
     * lock. */
    pthread_mutex_t pool_lock;
    pthread_cond_t pool_cond;
    shm_session_t *sessions;
    unsigned rr; /* where the workers' next scan starts (take_next) */
    _Atomic uint64_t paired;  /* segments copied two rows' parts at a time */
    _Atomic unsigned nparked; /* jobs waiting for a stopped target */
    _Atomic unsigned nheld;   /* sessions held for one (session_hold) */
    uint64_t park_polled;     /* when stopped_poll() last ran */
    int park_polling;         /* a worker is in stopped_poll() */
    pthread_t *workers;
    unsigned nworkers;
    unsigned idle;
    int stopping;
    /* Admission (shm_pool.c, kvt__shm_room()): copiers beyond the CPUs this
     * process may use take turns rather than copy faster. @ncpu: those
     * CPUs, at creation; @busy: workers in a job; @drivers: waiting
     * threads running jobs (shm_progress()); neither counts a thread
     * while it waits for a target. @drove_ns: when a waiting thread last
     * left shm_progress(); @declined: workers asleep that found no room
     * for a queued job. Seen by tests: @busy_peak, the most workers in a
     * job at once; @worker_jobs, the jobs workers took from the pool (a
     * run of jobs of one submission counts once: shm_job.c, RUN_MAX),
     * @over_jobs of them while as many copiers as CPUs or more ran
     * already; @state_reads, the reads of a target's /proc state
     * (kvt__shm_target_state()). */
    unsigned ncpu;
    _Atomic unsigned busy, drivers, busy_peak, declined;
    _Atomic uint64_t drove_ns, worker_jobs, over_jobs, state_reads;
    /* Jobs queued by plugged submissions, for flush() to wake workers for. */
    _Atomic unsigned deferred;
    /* A worker that ended a job polls for the next submission for a
     * while before it sleeps (shm_pool.c, worker_main()): @submits counts the
     * submissions, @spinning the workers polling (at most one). Seen
     * by tests: @submit_wakes, the submissions that signalled a sleeping
     * worker. */
    _Atomic uint64_t submits, submit_wakes;
    _Atomic unsigned spinning;
    /* Device copies (shm_dev.c): idle streams and pinned bounce buffers, kept
     * for the executors; under dev_lock. */
    pthread_mutex_t dev_lock;
    struct kvt__shm_dstream *dstreams;
    struct kvt__shm_bounce *bounces;
    unsigned nbounces;
};

struct shm_tchan {
    shm_tchan_t *next;
    int fd;
    kvt__shm_chan_t *ch;
    size_t len;
    pid_t peer_pid;
    int ptraced;   /* admitted under the ptracer grant (shm_barrier.c) */
    uint32_t head; /* notifications consumed; the service thread's copy */
    int dead;      /* under chan_lock: no lease is granted any more */
    char peer[KVT_WIRE_NAME_MAX + 1];
};

/* shm_target.c: what peers moved into and out of this engine's memory,
 * as they counted it in their channels (the tl op served). */
void kvt__shm_served(kvt__tl_t *tl, uint64_t out[4]);

/* shm_barrier.c: the registry barrier and the ptracer grant (chan_lock held
 * for those that touch channels). */
int kvt__shm_yama_scope(void);
/* Tests: act as if Yama's scope were @scope (-2: read it again). */
void kvt__shm_yama_scope_set(int scope);
/* A channel for a peer process @pid: 0 when no grant is needed, 1 when
 * admitted under the grant (release it with the channel), -1 when the
 * grant is held for another process (*holder_p says which). */
int kvt__shm_ptracer_admit(pid_t pid, long *holder_p);
void kvt__shm_ptracer_release(void);
void kvt__shm_snap_build(kvt__shm_t *shm, kvt__shm_region_t **regs_p,
                         uint32_t *n_p, uint32_t *trunc_p);
void kvt__shm_publish(kvt__shm_t *shm, shm_tchan_t *c,
                      const kvt__shm_region_t *regs, uint32_t n,
                      uint32_t trunc);
void kvt__shm_sever(shm_tchan_t *c, kvt_status_t why);

/* shm_stage_out.c: copy out the slots of @c made full (@helper: called by
 * the helper thread, under chan_lock). */
void kvt__shm_consume_stage(kvt__shm_t *shm, shm_tchan_t *c, int helper);

/* shm_chan.c: a message of @type, magic and version set. */
void kvt__shm_msg_init(kvt__shm_msg_t *m, uint16_t type);

/* shm_auth.c: the socket's proof of the shared secret, when either side holds
 * one. Target: after the HELLO's credentials are checked; 0 when the
 * peer proved the key, -1 to refuse with *ack (status and reason set,
 * logged), -2 to close. Initiator: mark @hello and add its nonce before
 * sending; then answer the target's first message @chal (it must be a
 * CHALLENGE proving the key for @name_t and @pid_t_) with AUTH.
 * KVT_ERR_ACCESS or KVT_ERR_PROTOCOL with *why. */
int kvt__shm_auth_target(kvt__shm_t *shm, int fd, const kvt__shm_msg_t *hello,
                         kvt__shm_msg_t *ack);
void kvt__shm_auth_hello(const kvt__shm_t *shm, kvt__shm_msg_t *hello);
kvt_status_t kvt__shm_auth_initiator(const kvt__shm_t *shm, int sock,
                                     const kvt__shm_msg_t *hello,
                                     const char *name_t, uint32_t pid_t_,
                                     const kvt__shm_msg_t *chal,
                                     const char **why);
/* shm_target.c: deliver the notifications @c's initiator queued. */
int kvt__shm_consume_notes(kvt__shm_t *shm, shm_tchan_t *c);

extern const kvt__tl_ops_t kvt__tl_shm;

/* shm_target.c: the transport's life in an engine, and its target role. */
kvt_status_t kvt__shm_create(kvt_engine_h e, kvt__tl_t **tl_p);
void kvt__shm_stop(kvt__tl_t *tl);
void kvt__shm_destroy(kvt__tl_t *tl);
kvt_status_t kvt__shm_describe(kvt__tl_t *tl, kvt__segdesc_t *d);
/*
 * The registry changed (called after every successful register and
 * unregister, without the registry lock). Returns once every same-host
 * peer sees the new registry: no copy validated against the old one is
 * still running, so an unregistered range is not touched after this
 * returns.
 */
void kvt__shm_registry_changed(kvt__tl_t *tl);

/* The longest socket name a descriptor's shm section may carry. */
#define KVT_SHM_SOCK_MAX 106

/* The abstract socket name of the engine (@host_id, @pid, @port) into
 * @out (room for 108 bytes, sun_path); returns its length. */
size_t kvt__shm_sock_name(char *out, uint64_t host_id, uint32_t pid,
                          uint16_t port);

/* shm_dev.c: free the device streams and bounce buffers kept for the
 * initiator's executors (the engine is being destroyed). */
void kvt__shm_dev_fini(kvt__shm_t *shm);

/* shm_pool.c: stop the initiator workers and cancel every session. */
void kvt__shm_sessions_stop(kvt__shm_t *shm);

/* shm_copy.c: copy @len bytes; @nt: with non-temporal stores where that
 * pays (the destination is not read again by this thread). Ends with a
 * store fence, so the bytes are visible before any later store. */
void kvt__shm_copy(void *dst, const void *src, size_t len, int nt);

/* One of several pieces written into a peer's memory: streamed from
 * 4 KiB up (the destination is not read here, and a streamed line is
 * not read for ownership first), without the fence: 1 when streamed,
 * and then the writer calls kvt__shm_copy_fence() after its last piece,
 * before anything reports the copy done. */
int kvt__shm_copy_piece(void *dst, const void *src, size_t len);
void kvt__shm_copy_fence(void);

/* @count pieces of @len bytes, the k-th from src + k * sstride to
 * dst + k * dstride (one copy when both are contiguous). @nt: as for
 * kvt__shm_copy(); pieces scattered in the destination are then streamed
 * from a few hundred bytes up (with the fence). */
void kvt__shm_copy_strided(void *dst, size_t dstride, const void *src,
                           size_t sstride, size_t len, size_t count, int nt);
/* @count pieces of two rows' parts in step: the k-th piece of @len bytes
 * from s0 + k * sstride to d0 + k * ds0, then from s1 + k * sstride to
 * d1 + k * ds1; streamed stores (a write into a peer's mapping). */
void kvt__shm_copy_pair(void *d0, size_t ds0, const void *s0, void *d1,
                        size_t ds1, const void *s1, size_t sstride, size_t len,
                        size_t count);

/* A staged run as the target reads it from the slot (untrusted): 1 if
 * its pieces are well formed (count and len at least 1, stride at least
 * len), their data lies within the slot, and its address range does not
 * wrap; then *span_p is the bytes from the first piece's start to the
 * last one's end. */
int kvt__shm_run_check(const kvt__shm_run_t *r, uint64_t *span_p);

/* A thread's state from its /proc/PID/stat line @line (nul-terminated):
 * stopped (T or t: a stop signal, a tracer), dying (SIGKILL pending, or
 * exiting: woken to die, it reads as running until it is gone), a zombie
 * (Z, X), running, or unknown (unparsable). */
enum {
    KVT_SHM_THR_UNKNOWN,
    KVT_SHM_THR_RUNNING,
    KVT_SHM_THR_STOPPED,
    KVT_SHM_THR_DYING,
    KVT_SHM_THR_ZOMBIE
};
int kvt__shm_thread_state(const char *line);

/* Shared (cross-process) futex operations on a channel word. */
void kvt__shm_futex_wait(_Atomic uint32_t *word, uint32_t expected,
                         int64_t timeout_ns);
void kvt__shm_futex_wake(_Atomic uint32_t *word);

#endif
