/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_TCP_TCP_H
#define KVT_TRANSPORT_TCP_TCP_H

/*
 * The TCP transport: persistent connections per peer, owned by worker
 * threads that drive them with edge-triggered epoll.
 *
 * Roles. A connection is either outbound (this engine initiates: requests
 * go out, responses come back) or inbound (a peer initiates: requests come
 * in, responses go out). A peer session is nconns outbound connections;
 * each is owned by one worker, which alone reads it, fails it and closes
 * its descriptor.
 *
 * Ordering. The target handles the requests of one connection strictly in
 * order and answers in the same order, so the responses of a connection
 * match its outstanding FIFO head by head (the request id is checked).
 * A request is appended to the outstanding FIFO and to the send queue
 * under tx_lock in one step, so both lists have the same order.
 *
 * Locks. Order: rx_lock -> session lock -> tx_lock -> out_lock. rx_lock
 * guards the receive state of an outbound connection; tx_lock guards the
 * send queue, socket writes and the dead flag; out_lock guards the
 * outstanding FIFO. ev_lock (the epoll registration) is a leaf: it may
 * be taken under rx_lock or the worker's lock, and holds no other. None is
 * held across a wait: every socket call is non-blocking but an attached
 * waiter's read (kvt__tcp_progress()), made with no lock held.
 *
 * Waiter progress. A thread in kvt_batch_wait() whose frames all went to
 * one connection reads that connection itself (it "attaches" as the
 * connection's waiter) instead of sleeping until the worker has read the
 * response and woken it: a synchronous transfer then costs one wake-up per
 * side, as a plain ping-pong does. At most one waiter is attached at a
 * time; it completes whatever responses it reads, for any batch, and other
 * threads sleep on their batches meanwhile. While a waiter is attached the
 * worker does not watch the connection's input; when it leaves, watching
 * again reports anything left unread to the worker. A thread in
 * kvt_batch_submit_wait() attaches before its request leaves (submit
 * sees kvt__sub_t.will_wait): a response that comes before the thread
 * waits, as on a busy CPU where the target runs the moment the request
 * is written, then wakes no worker either.
 *
 * Completion lifecycle. Every piece of every request frame is completed
 * exactly once: by its response, or by the failure of its connection
 * (connection lost, timeout, session killed, engine stopped), which the
 * owning worker performs.
 *
 * Fences. A session that failed may leave requests in the target's
 * socket buffers (a stopped target reads them when it runs again), and
 * the target would apply them after the writes of the session that
 * replaces it: a write that failed would overwrite newer data. So session
 * ids are this instance's id and a counter, each HELLO names in its fence
 * the last counter below which every session of this instance to that
 * peer is dead (tcp_fence_of()), and the target, before it accepts the
 * connection (kvt__tcp_admit()), has the workers close every inbound
 * connection of those sessions: what they held either landed before the
 * new session's first request is read, or never does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "mem/dev.h"
#include "core/tl.h"
#include "util/log.h"
#include "util/sock.h"

#define TICK_NS (50ull * 1000000ull)
#define MAX_CONNS 16
#define RX_IOV ((int)KVT_WIRE_MAX_SEGS) /* a whole frame in one read */
#define SCRATCH_LEN (256u * 1024u)
/* Read-ahead per connection (tcp_conn_t.rx_pre): a read for a header asks
 * for RX_PRE bytes, so that a small frame (header, piece table, a 4 KiB
 * payload) comes in one call; the read that ends a payload asks for
 * RX_PRE_TAIL more, for the next header and a small body (more would be
 * payload copied twice when frames stream). */
#define RX_PRE (8u * 1024u)
#define RX_PRE_TAIL 512u
#define MIN_FRAME (64u * 1024u)
/* The most payload of a WRITE that a submitting thread sends itself on an
 * idle connection (kvt__tcp_conn_enqueue()); larger ones are the
 * worker's. */
#define INLINE_MAX (64u * 1024u)
/* A WRITE frame up to this size (header, piece table, payload) is sent
 * from one contiguous copy: a synchronous 4 KiB write then took 0.1 us
 * less of a 16 us round trip than sent from three vectors (median of ten
 * alternating rounds, both ends on one CPU). */
#define FLAT_MAX (8u * 1024u)
/* Inbound, while a WRITE's payload has at least RX_LOWAT bytes to come:
 * the worker is woken for its socket only once that many are there
 * (SO_RCVLOWAT), not for each segment that lands. */
#define RX_LOWAT (1024u * 1024u)
/* Inbound: stop reading a connection's requests while its queued
 * responses hold more than OUT_HOLD bytes of memory, read again once they
 * hold at most OUT_RESUME (kvt__tcp_conn_rx()). */
#define OUT_HOLD (8u * 1024u * 1024u)
#define OUT_RESUME (4u * 1024u * 1024u)
/* Outbound: request frames a connection's send queue holds at most, the
 * one being written included (WRITEs, kvt__tcp_place()); the rest of a
 * submission waits in the backlog (tcp_session_t.bl_head), and each
 * connection takes the next frame from there once it has written one. */
#define TXQ_FRAMES 2u

typedef struct kvt__tcp kvt__tcp_t;
typedef struct tcp_conn tcp_conn_t;
typedef struct tcp_worker tcp_worker_t;
typedef struct tcp_session tcp_session_t;

/* Something to send: a request frame or a response. */
typedef struct tcp_tx {
    struct tcp_tx *next;
    struct iovec *cur;
    int cnt;
    uint8_t is_resp;
} tcp_tx_t;

/*
 * A request frame, initiator side. It is referenced twice: by the send
 * queue until its last byte is written, and by the outstanding FIFO until
 * its response is handled. The response can be handled before the sender
 * has finished its bookkeeping on the frame, so whoever drops the last
 * reference frees it (or keeps it as its thread's spare:
 * kvt__tcp_frame_alloc()).
 */
typedef struct tcp_frame {
    tcp_tx_t tx;
    _Atomic uint32_t refs;
    struct tcp_frame *next_out;
    uint8_t type;
    uint64_t req_id;
    uint64_t deadline;
    uint64_t bytes;
    uint32_t npieces;
    uint32_t nlsegs;
    kvt__comp_t **comps; /* [npieces] */
    uint32_t *piece_seg; /* [npieces + 1]: first local segment of a piece */
    struct iovec *lsegs; /* local segments, in payload order */
    uint64_t snap[MAX_CONNS]; /* NOTIFY: enq_seq of each conn to wait for */
    /* Local device memory: per local segment, rx_seg_t.dev1 (NULL when
     * all are host memory). A WRITE sends its device segments from a
     * pinned copy made when it reaches the head of the send queue, and
     * given back once its last byte is written; a failed copy sends zeros
     * and fails its pieces with KVT_ERR_IO. */
    uint32_t *lseg_dev1;
    void *stage;
    uint64_t stage_len;
    int stage_dev;   /* the device of its device segments (the first's) */
    int stage_mixed; /* they are on several devices */
    _Atomic int dev_failed;
    kvt__tcp_t *stage_tcp;
    /* Copied ahead (kvt__tcp_frame_prefetch()): on this stream of its
     * connection, complete once its marker is; NULL when not pending. */
    kvt__dstream_t *stage_ds;
    unsigned stage_mark;
    uint32_t cap; /* bytes allocated (kvt__tcp_frame_alloc()); 0: not kept */
    uint8_t hdr[KVT_WIRE_HDR_LEN];
    uint8_t *body;
    struct iovec iov[]; /* send vector; for READ the local segments follow */
} tcp_frame_t;

/* A response, target side. */
typedef struct tcp_resp {
    tcp_tx_t tx;
    /* Memory it holds (allocation and pinned copy): counted in the
     * connection's out_bytes while queued. */
    size_t cost;
    /* READ_RESP only: the payload comes from registered memory and is
     * validated again whenever the registry changed. */
    uint32_t nsegs;
    uint32_t first_seg; /* index of the first payload entry in iov */
    uint64_t gen;
    uint32_t late;
    int32_t late_status;
    uint64_t *seg_addr;
    void *stage; /* pinned copy of device payload (kvt__tcp_stage_put()) */
    uint64_t stage_len;
    kvt__tcp_t *tcp;
    uint8_t hdr[KVT_WIRE_HDR_LEN];
    uint8_t trailer[KVT_WIRE_TRAILER_LEN];
    uint8_t *body;
    struct iovec iov[];
} tcp_resp_t;

typedef struct {
    uint64_t addr;
    uint64_t len;
    uint32_t piece;
    uint32_t valid;
    uint32_t dev1; /* device memory of device dev1 - 1; 0: host memory */
    uint64_t soff; /* READ from device memory: where in the pinned copy */
} rx_seg_t;

/*
 * Device memory goes through pinned host memory (tcp_dev.c). Received
 * bytes for device memory land in a ring of STAGE_CHUNKS chunks of the
 * connection's staging buffer; each full chunk is copied to the device
 * asynchronously while the next one is received, and a frame is answered
 * (WRITE_ACK) or completed (READ_RESP) only once its last copy completed.
 * Outgoing device bytes (a WRITE's payload, a READ_RESP's) are copied
 * into a pinned buffer of the frame before it is queued.
 */
#define STAGE_CHUNKS 4
#define TCP_DEV_STREAMS KVT__DEV_MAX /* a stream per device */
#define STAGE_CHUNK (256u * 1024u)

typedef struct mem_stage mem_stage_t;

enum { RX_HDR, RX_BODY, RX_PAYLOAD, RX_TRAILER };

struct tcp_conn {
    int fd;
    uint8_t outbound;
    uint32_t index;
    tcp_worker_t *w;
    tcp_session_t *sess; /* outbound only */

    pthread_mutex_t tx_lock;
    tcp_tx_t *txq_head, *txq_tail;
    /* Under tx_lock: the stream on which the device copies of the WRITE
     * frames behind the head run ahead (tcp_dev.c), its device, and the
     * next marker. */
    kvt__dstream_t *tx_ds;
    int tx_ds_dev;
    unsigned tx_mark;
    int dead; /* under tx_lock */

    pthread_mutex_t out_lock;
    tcp_frame_t *out_head, *out_tail;

    /* Outbound only: the receive state's lock, the number of waiters
     * attached, and whether the connection failed (all under rx_lock). */
    pthread_mutex_t rx_lock;
    int waiters;
    int rx_dead;

    /* What the worker's epoll watches (see kvt__tcp_conn_events()): input
     * unless a waiter reads the connection, output only while the send queue
     * waits for room. Edge-triggered output events would otherwise wake
     * the worker each time the peer acknowledges bytes. */
    pthread_mutex_t ev_lock;
    uint32_t ev_mask; /* registered, under ev_lock */
    int ev_closed;    /* descriptor leaving the epoll set, under ev_lock */
    _Atomic int want_out;
    _Atomic int out_kick; /* want_out went to 1: poll the socket again */
    _Atomic int no_input;
    /* Input left unwatched after the last waiter detached from a
     * connection with nothing in flight, so that the next synchronous
     * transfer on it attaches without two epoll_ctl() calls. Cleared, and
     * input watched again, by the next frame enqueued on the connection
     * (kvt__tcp_conn_enqueue()) or at the worker's next tick, whichever
     * comes first: a peer that closes an idle connection is noticed
     * within TICK_NS (the worker's timer, tcp_worker_t.tfd);
     * an error or a reset is reported at once. */
    _Atomic int idle_unwatched;

    _Atomic uint64_t enq_seq;
    _Atomic uint64_t done_seq;
    /* Outbound, in a session of two or more connections: request frames
     * in the send queue; raised under tx_lock, lowered under tx_lock and
     * the session's bl_lock. */
    _Atomic uint32_t txq_frames;
    _Atomic uint64_t inflight;
    _Atomic int32_t fail_status;

    /* Receive state: touched by the connection's reader, under rx_lock:
     * its worker, or the one waiter attached to it, which also reads
     * into rx_pre without the lock (kvt__tcp_progress()). */
    int rx_state;
    size_t rx_have;
    /* The last read was shorter than asked: the socket had nothing more
     * then (for a stream socket, a short read says so), and an edge
     * reports what comes after. Cleared on each kvt__tcp_conn_rx(), and
     * only set when that call may trust a short read (rx_short_ok: its
     * events did not report the peer's end). */
    int rx_drained, rx_short_ok;
    /* Bytes read ahead of the state machine, [rx_pre_off, rx_pre_len) of
     * rx_pre (RX_PRE, RX_PRE_TAIL). The state machine takes its bytes
     * from here before it reads the socket; a pass ends with it empty,
     * except when held back (rx_held), which an output event resumes, and
     * a waiter leaves only with it empty (no edge would report it). */
    uint32_t rx_pre_off, rx_pre_len;
    uint8_t rx_pre[RX_PRE];
    uint8_t rx_hdrbuf[KVT_WIRE_HDR_LEN];
    kvt__wire_hdr_t rx_hdr;
    uint8_t *rx_body;
    size_t rx_body_cap;
    uint8_t rx_trailer[KVT_WIRE_TRAILER_LEN];
    rx_seg_t *rx_segs;
    uint32_t rx_nsegs, rx_seg, rx_check;
    uint64_t rx_seg_off;
    uint64_t rx_gen;
    kvt__wire_piece_t *rx_pieces;
    int32_t *rx_pstatus;
    uint32_t rx_npieces;
    /* Inbound: payload bytes of the WRITE being read still to come (every
     * read into its segments lowers it: kvt__tcp_rx_took()), and the
     * socket's SO_RCVLOWAT now (1, the kernel's default, from the start). */
    uint64_t rx_left;
    int rx_lowat;
    tcp_frame_t *rx_frame;
    /* Device memory staging: used by the owning worker; its stream is
     * also waited for by kvt__tcp_mem_changed() (any thread). */
    mem_stage_t *_Atomic stage;

    int attached; /* outbound: handed to its worker (kvt__tcp_worker_attach())
                   */
    char peer[KVT_WIRE_NAME_MAX + 1];
    /* For log lines: the peer's name escaped, and for inbound connections
     * its address. */
    char who[KVT_LOG_ESC_MAX + KVT_SOCK_ADDR_MAX + 8];
    /* Inbound: memory held by queued responses (written under tx_lock),
     * and whether reading requests is held back for it (worker only).
     * How long responses may wait unread is bounded by the socket's
     * TCP_USER_TIMEOUT (the transfer timeout): the connection fails. */
    _Atomic uint64_t out_bytes;
    int rx_held;
    /* Inbound: the initiator's instance and session counter (HELLO), and
     * the transport's list of inbound connections, under in_lock. */
    uint32_t inst, counter;
    _Atomic int fenced; /* to be closed by its worker (a later fence) */
    int listed;
    tcp_conn_t *inext, *iprev;
    tcp_conn_t *wnext; /* worker's list */
    tcp_conn_t *dnext; /* worker's reap list (outbound, failed) */
};

struct tcp_worker {
    kvt__tcp_t *tcp;
    unsigned id;
    pthread_t thread;
    int epfd;
    int evfd;
    int tfd;              /* timerfd: the tick, every TICK_NS */
    pthread_mutex_t lock; /* guards the conn list and the reap list */
    tcp_conn_t *conns;
    /* Failed outbound connections (kvt__tcp_worker_reap()): changed under
     * lock; read without it to skip the lock when empty. */
    tcp_conn_t *_Atomic reap;
    _Atomic unsigned nfenced; /* inbound connections to close (fences) */
    uint8_t *scratch;
    /* Served as a target (kvt_served_stats_t): writes landed, reads
     * answered, and their bytes; written by this worker only. */
    _Atomic uint64_t served[4];
};

struct tcp_session {
    kvt__session_t base;
    kvt__tcp_t *tcp;
    unsigned nconns;
    tcp_conn_t *conns[MAX_CONNS];
    pthread_mutex_t lock; /* conn fds vs. shutdown; parked notifies */
    tcp_frame_t *parked_head, *parked_tail;
    _Atomic uint32_t nparked;
    /* Request frames placed on no connection yet, in submission order
     * (linked by tx.next), under bl_lock: each connection takes the next
     * one when it has written one of its own, so that the connections
     * stay busy until the last frame, whichever of them runs faster
     * (kvt__tcp_place()). Taken after a connection's tx_lock, never
     * before. */
    pthread_mutex_t bl_lock;
    tcp_tx_t *bl_head, *bl_tail;
    _Atomic uint32_t rr;
    /* Connections not yet reaped by their worker: the last reap releases
     * the session (kvt__session_release()). */
    _Atomic uint32_t unreaped;
    /* This instance's counter for the session, and the transport's list of
     * live sessions (under in_lock), which fences must spare. */
    uint32_t counter;
    int listed;
    char pname[KVT_WIRE_NAME_MAX + 1];
    tcp_session_t *lnext;
};

struct kvt__tcp {
    kvt__tl_t base;
    kvt_engine_h e;
    const kvt__engine_cfg_t *cfg;
    kvt__memreg_t *reg;
    unsigned nworkers;
    tcp_worker_t *workers;
    _Atomic unsigned rr;
    _Atomic uint64_t next_req;
    _Atomic int stopping;
    int started;
    uint32_t inst;                 /* this instance's id in session ids */
    _Atomic uint32_t next_counter; /* the next session's counter */
    pthread_mutex_t in_lock;       /* inbound, live */
    pthread_cond_t in_cond;        /* an inbound connection was freed */
    tcp_conn_t *inbound;           /* accepted data connections */
    tcp_session_t *live;           /* sessions opened and not yet dead */
    void *zeros; /* read-only zero pages: payload of refused read pieces */
    /* Device memory: pinned buffers of one slice (a frame's payload at
     * most), kept for reuse; a stream for copies made by submitting
     * threads, one at a time. */
    pthread_mutex_t dev_lock;
    void **stage_free;
    unsigned nstage_free;
    struct kvt__dstream *tx_stream[TCP_DEV_STREAMS]; /* per device */
    _Atomic int dev_staged; /* a connection staged device memory once */
};

extern const kvt__tl_ops_t kvt__tl_tcp;

#ifdef KVT_TSAN
/*
 * Payload bytes move on behalf of a peer process, and the ordering of
 * those accesses against this process's threads is established across
 * processes (an acknowledgement, then a message), which ThreadSanitizer
 * cannot see. Issue these calls directly so that it does not take them
 * for unsynchronised accesses; every other access stays checked.
 */
#include <sys/syscall.h>
#define payload_recvmsg(fd, mh, fl)                                            \
    syscall(SYS_recvmsg, (long)(fd), (mh), (unsigned long)(fl))
#define payload_sendmsg(fd, mh, fl)                                            \
    syscall(SYS_sendmsg, (long)(fd), (mh), (unsigned long)(fl))
#define payload_send(fd, buf, len, fl)                                         \
    syscall(SYS_sendto, (long)(fd), (buf), (len), (unsigned long)(fl), NULL, 0)
#else
#define payload_recvmsg(fd, mh, fl) recvmsg((fd), (mh), (fl))
#define payload_sendmsg(fd, mh, fl) sendmsg((fd), (mh), (fl))
#define payload_send(fd, buf, len, fl) send((fd), (buf), (len), (fl))
#endif

#define CONN_EVENTS (EPOLLIN | EPOLLET | EPOLLRDHUP)

/* Up to @max bytes of what @c read ahead (tcp_conn_t.rx_pre) into @dst;
 * how many (0 when nothing is left). Receive state: its reader only. */
static inline size_t kvt__tcp_pre_take(tcp_conn_t *c, void *dst, size_t max)
{
    size_t n = c->rx_pre_len - c->rx_pre_off;

    if (n > max)
        n = max;
    memcpy(dst, c->rx_pre + c->rx_pre_off, n);
    c->rx_pre_off += (uint32_t)n;
    return n;
}

/* ---- Across the files of the transport --------------------------------- */

/* tcp_tx.c */
/* A request frame of @sz bytes, its header zeroed; NULL when out of
 * memory. Freed by the last kvt__tcp_frame_put(). */
tcp_frame_t *kvt__tcp_frame_alloc(size_t sz);
void kvt__tcp_frame_put(tcp_frame_t *f);
void kvt__tcp_tx_free(tcp_tx_t *t);
kvt_status_t kvt__tcp_flush_locked(tcp_conn_t *c, int head_only);
void kvt__tcp_conn_events(tcp_conn_t *c);
int kvt__tcp_want_out_update(tcp_conn_t *c);
void kvt__tcp_send_resp(tcp_conn_t *c, tcp_resp_t *r);
void kvt__tcp_send_hdr(tcp_conn_t *c, const uint8_t *hdr);
tcp_resp_t *kvt__tcp_resp_alloc(size_t niov, size_t body_len, size_t nsegs);
void kvt__tcp_hdr_init(kvt__wire_hdr_t *h, uint8_t type, uint64_t req_id);
void kvt__tcp_send_simple(tcp_conn_t *c, uint8_t type, uint64_t req_id,
                          kvt_status_t status, const void *body, size_t len);
void kvt__tcp_conn_enqueue(tcp_conn_t *c, tcp_frame_t *f);
/* Whether an idle connection sends @f from the submitting thread. */
static inline int kvt__tcp_sends_inline(const tcp_frame_t *f)
{
    return f->type != KVT_WIRE_WRITE || f->bytes <= INLINE_MAX;
}
int kvt__tcp_notify_ready(tcp_session_t *s, const tcp_frame_t *f);
void kvt__tcp_release_parked(tcp_session_t *s);
tcp_conn_t *kvt__tcp_pick_conn(tcp_session_t *s, int for_waiter);
tcp_conn_t *kvt__tcp_place(tcp_session_t *s, tcp_frame_t *f);
void kvt__tcp_backlog_spread(tcp_session_t *s);
void kvt__tcp_backlog_fail(tcp_session_t *s, kvt_status_t why);

/* tcp_target.c */
void kvt__tcp_resp_revalidate(kvt__tcp_t *tcp, tcp_resp_t *r);
int kvt__tcp_ensure_rx_arrays(tcp_conn_t *c);
void kvt__tcp_send_write_ack(tcp_conn_t *c);
int kvt__tcp_inbound_dispatch(tcp_conn_t *c);

/* tcp_rx.c */
void kvt__tcp_frame_complete(tcp_conn_t *c, tcp_frame_t *f, kvt_status_t st,
                             const int32_t *pst);
void kvt__tcp_conn_rx(tcp_conn_t *c, const _Atomic uint32_t *stop, uint32_t ev);

/* @n payload bytes were read into the current segments. */
static inline void kvt__tcp_rx_took(tcp_conn_t *c, uint64_t n)
{
    c->rx_left = n < c->rx_left ? c->rx_left - n : 0;
}

/* tcp_cm.c */
int kvt__tcp_worker_attach(tcp_worker_t *w, tcp_conn_t *c);
void kvt__tcp_worker_reap(tcp_worker_t *w);
void kvt__tcp_conn_fail(tcp_conn_t *c, kvt_status_t st);
kvt_status_t kvt__tcp_accept(kvt__tl_t *tl, int fd,
                             const kvt__wire_hello_t *hello);
void kvt__tcp_session_kill(kvt__session_t *base, kvt_status_t why);
void kvt__tcp_session_destroy(kvt__session_t *base);
kvt_status_t kvt__tcp_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                           kvt__session_t **s_p, const char **why_p);

/* tcp_fence.c */
kvt_status_t kvt__tcp_fence_init(kvt__tcp_t *tcp);
void kvt__tcp_fence_fini(kvt__tcp_t *tcp);
uint32_t kvt__tcp_live_add(kvt__tcp_t *tcp, tcp_session_t *s, const char *peer);
void kvt__tcp_live_del(tcp_session_t *s);
void kvt__tcp_inbound_add(kvt__tcp_t *tcp, tcp_conn_t *c,
                          const kvt__wire_hello_t *hello);
void kvt__tcp_inbound_del(kvt__tcp_t *tcp, tcp_conn_t *c);
kvt_status_t kvt__tcp_admit(kvt__tl_t *tl, const kvt__wire_hello_t *hello,
                            const char **why_p);
void kvt__tcp_fence_sweep(tcp_worker_t *w);

/* tcp_worker.c */
void *kvt__tcp_worker_main(void *arg);
kvt_status_t kvt__tcp_progress(kvt__session_t *base, void *where,
                               const _Atomic uint32_t *until,
                               uint64_t deadline_ns, int attached);
int kvt__tcp_waiter_attach(tcp_conn_t *c, int try_only);
void kvt__tcp_detach(kvt__session_t *base, void *where);
/* For tests of the transfer timeout: @fn (NULL: none) is called by the
 * worker with each connection whose oldest frame it found past its
 * deadline, after it let go of the locks it looked under and before it
 * takes rx_lock to fail the connection, where a response may still
 * complete the frame. Process-wide. */
void kvt__tcp_timeout_hook_set(void (*fn)(void *conn));

/* tcp_dev.c */
void *kvt__tcp_stage_get(kvt__tcp_t *tcp, uint64_t len, int dev);
void kvt__tcp_stage_put(kvt__tcp_t *tcp, void *p, uint64_t len);
void kvt__tcp_dev_fini(kvt__tcp_t *tcp);
void kvt__tcp_frame_stage(kvt__tcp_t *tcp, tcp_frame_t *f);
/* tx_lock held: a device WRITE frame at the head of the send queue is
 * ready to send (staged now, or its copies ahead waited for); the device
 * copies of the next ones behind it are queued to run while it is sent. */
void kvt__tcp_frame_ready(tcp_conn_t *c, tcp_frame_t *f);
/* The connection failed (dead, its queue taken): the copies ahead are
 * waited for, so the frames can be freed. */
void kvt__tcp_tx_quiesce(tcp_conn_t *c, tcp_tx_t *list);
int kvt__tcp_rx_dev(tcp_conn_t *c);
int kvt__tcp_rx_dev_finish(tcp_conn_t *c);
int kvt__tcp_dev_read_stage(tcp_conn_t *c, void *dst, uint64_t src,
                            uint64_t len, int dev);
int kvt__tcp_dev_read_sync(tcp_conn_t *c);
void kvt__tcp_conn_stage_free(tcp_conn_t *c);
void kvt__tcp_rx_dev_drop(tcp_conn_t *c);
void kvt__tcp_dev_quiesce(tcp_conn_t *c);
void kvt__tcp_mem_changed(kvt__tl_t *tl);

/* tcp_submit.c */
kvt_status_t kvt__tcp_submit(kvt__session_t *base, const kvt__xfer_t *x,
                             size_t n, kvt__sub_t *hint);

#endif
