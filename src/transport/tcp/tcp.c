/* SPDX-License-Identifier: Apache-2.0 */
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
 * outstanding FIFO. None is held across a wait: sockets are non-blocking.
 *
 * Waiter progress. A thread in kvt_batch_wait() whose frames all went to
 * one connection reads that connection itself (it "attaches" as the
 * connection's waiter) instead of sleeping until the worker has read the
 * response and woken it: a synchronous transfer then costs one wake-up per
 * side, as a plain ping-pong does. At most one waiter is attached at a
 * time; it completes whatever responses it reads, for any batch, and other
 * threads sleep on their batches meanwhile. While a waiter is attached the
 * worker does not watch the connection's input; when it leaves, watching
 * again reports anything left unread to the worker.
 *
 * Completion lifecycle. Every piece of every request frame is completed
 * exactly once: by its response, or by the failure of its connection
 * (connection lost, timeout, session killed, engine stopped), which the
 * owning worker performs.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ctrl/ctrl.h"
#include "transport/transport.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define TICK_NS (50ull * 1000000ull)
#define MAX_CONNS 16
#define RX_IOV ((int)KVT_WIRE_MAX_SEGS) /* a whole frame in one readv */
#define SCRATCH_LEN (256u * 1024u)
#define MIN_FRAME (64u * 1024u)

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
 * reference frees it.
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
    uint8_t hdr[KVT_WIRE_HDR_LEN];
    uint8_t *body;
    struct iovec iov[]; /* send vector; for READ the local segments follow */
} tcp_frame_t;

/* A response, target side. */
typedef struct tcp_resp {
    tcp_tx_t tx;
    /* READ_RESP only: the payload comes from registered memory and is
     * validated again whenever the registry changed. */
    uint32_t nsegs;
    uint32_t first_seg; /* index of the first payload entry in iov */
    uint64_t gen;
    uint32_t late;
    int32_t late_status;
    uint64_t *seg_addr;
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
} rx_seg_t;

enum { RX_HDR, RX_BODY, RX_PAYLOAD, RX_TRAILER };

struct tcp_conn {
    int fd;
    uint8_t outbound;
    uint32_t index;
    tcp_worker_t *w;
    tcp_session_t *sess; /* outbound only */

    pthread_mutex_t tx_lock;
    tcp_tx_t *txq_head, *txq_tail;
    int dead; /* under tx_lock */

    pthread_mutex_t out_lock;
    tcp_frame_t *out_head, *out_tail;

    /* Outbound only: the receive state's lock, the number of waiters
     * attached, and whether the connection failed (all under rx_lock). */
    pthread_mutex_t rx_lock;
    int waiters;
    int rx_dead;

    /* What the worker's epoll watches (see conn_events()): input unless a
     * waiter reads the connection, output only while the send queue
     * waits for room. Edge-triggered output events would otherwise wake
     * the worker each time the peer acknowledges bytes. */
    pthread_mutex_t ev_lock;
    uint32_t ev_mask;   /* registered, under ev_lock */
    int ev_closed;      /* descriptor leaving the epoll set, under ev_lock */
    _Atomic int want_out;
    _Atomic int no_input;

    _Atomic uint64_t enq_seq;
    _Atomic uint64_t done_seq;
    _Atomic uint64_t inflight;
    _Atomic int32_t fail_status;

    /* Receive state: touched by the owning worker only. */
    int rx_state;
    size_t rx_have;
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
    tcp_frame_t *rx_frame;

    int attached; /* outbound: handed to its worker (worker_attach()) */
    char peer[KVT_WIRE_NAME_MAX + 1];
    tcp_conn_t *wnext; /* worker's list */
    tcp_conn_t *dnext; /* worker's reap list (outbound, failed) */
};

struct tcp_worker {
    kvt__tcp_t *tcp;
    unsigned id;
    pthread_t thread;
    int epfd;
    int evfd;
    pthread_mutex_t lock; /* guards the conn list and the reap list */
    tcp_conn_t *conns;
    tcp_conn_t *reap; /* failed outbound connections (worker_reap()) */
    uint8_t *scratch;
    uint64_t last_tick;
};

struct tcp_session {
    kvt__session_t base;
    kvt__tcp_t *tcp;
    unsigned nconns;
    tcp_conn_t *conns[MAX_CONNS];
    pthread_mutex_t lock; /* conn fds vs. shutdown; parked notifies */
    tcp_frame_t *parked_head, *parked_tail;
    _Atomic uint32_t nparked;
    _Atomic uint32_t rr;
    /* Connections not yet reaped by their worker: the last reap releases
     * the session (kvt__session_release()). */
    _Atomic uint32_t unreaped;
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
    void *zeros; /* read-only zero pages: payload of refused read pieces */
};

extern const kvt__tl_ops_t kvt__tl_tcp;

static void conn_fail(tcp_conn_t *c, kvt_status_t st);
static void worker_reap_later(tcp_worker_t *w, tcp_conn_t *c);
static void session_kill(kvt__session_t *base, kvt_status_t why);
static void release_parked(tcp_session_t *s);

/* ---- Sending ------------------------------------------------------------ */

static void frame_put(tcp_frame_t *f)
{
    if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) == 1)
        free(f);
}

static void tx_free(tcp_tx_t *t)
{
    if (t->is_resp)
        free(t);
    else
        frame_put((tcp_frame_t *)t);
}

#ifdef KVT_TSAN
/*
 * Payload bytes move on behalf of a peer process, and the ordering of
 * those accesses against this process's threads is established across
 * processes (an acknowledgement, then a message), which ThreadSanitizer
 * cannot see. Issue these calls directly so that it does not take them
 * for unsynchronised accesses; every other access stays checked.
 */
#include <sys/syscall.h>
#define payload_readv(fd, iov, n)                                              \
    syscall(SYS_readv, (long)(fd), (iov), (unsigned long)(n))
#define payload_sendmsg(fd, mh, fl)                                            \
    syscall(SYS_sendmsg, (long)(fd), (mh), (unsigned long)(fl))
#else
#define payload_readv(fd, iov, n) readv((fd), (iov), (n))
#define payload_sendmsg(fd, mh, fl) sendmsg((fd), (mh), (fl))
#endif

/*
 * READ_RESP payload comes from registered memory: with the registry read
 * lock held, check that nothing was unregistered since validation, and
 * point any segment that left the registry at zero pages.
 */
static void resp_revalidate(kvt__tcp_t *tcp, tcp_resp_t *r)
{
    kvt__memreg_t *reg = tcp->reg;
    uint64_t gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    int cur;

    if (gen == r->gen)
        return;
    r->gen = gen;
    cur = (int)(r->tx.cur - r->iov);
    for (uint32_t i = 0; i < r->nsegs; i++) {
        int k = (int)r->first_seg + (int)i;
        struct iovec *v = &r->iov[k];
        if (k < cur || r->seg_addr[i] == 0)
            continue;
        if (!kvt__memreg_contains_locked(reg, r->seg_addr[i], v->iov_len,
                                         KVT_ACCESS_REMOTE_READ)) {
            uint64_t sent = (uint64_t)(uintptr_t)v->iov_base - r->seg_addr[i];
            if (k > cur)
                sent = 0;
            v->iov_base = (char *)tcp->zeros + sent;
            r->seg_addr[i] = 0;
            r->late++;
            r->late_status = KVT_ERR_ACCESS;
        }
    }
    {
        uint8_t *t = r->trailer;
        uint32_t late = r->late;
        int32_t lst = r->late_status;
        memcpy(t, &late, 4);
        memcpy(t + 4, &lst, 4);
    }
}

/*
 * Write as much of the queue as the socket takes (with @head_only, stop
 * after the first item). Called with tx_lock held. Returns KVT_OK (done,
 * or socket full: the worker's EPOLLOUT edge resumes) or
 * KVT_ERR_CONN_LOST.
 */
static kvt_status_t flush_locked(tcp_conn_t *c, int head_only)
{
    kvt__tcp_t *tcp = c->w->tcp;

    while (c->txq_head != NULL) {
        tcp_tx_t *t = c->txq_head;
        struct msghdr mh = {0};
        ssize_t n;
        int locked = 0;

        if (t->is_resp && ((tcp_resp_t *)t)->seg_addr != NULL) {
            kvt__memreg_rdlock(tcp->reg);
            locked = 1;
            resp_revalidate(tcp, (tcp_resp_t *)t);
        }
        mh.msg_iov = t->cur;
        mh.msg_iovlen = (size_t)(t->cnt > IOV_MAX ? IOV_MAX : t->cnt);
        n = payload_sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (locked)
            kvt__memreg_unlock(tcp->reg);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return KVT_OK;
            KVT_LOG_D("send to %s: %s", c->peer, strerror(errno));
            /* tx_lock is held and the connection is not dead, so its
             * descriptor is still open; the owning worker sees the
             * shutdown and fails the connection. */
            shutdown(c->fd, SHUT_RDWR);
            return KVT_ERR_CONN_LOST;
        }
        t->cur = kvt__iov_advance(t->cur, &t->cnt, (size_t)n);
        if (t->cnt == 0) {
            c->txq_head = t->next;
            if (c->txq_head == NULL)
                c->txq_tail = NULL;
            tx_free(t);
            if (head_only)
                break;
        }
    }
    return KVT_OK;
}

/*
 * Bring the worker's epoll registration of @c in line with want_out and
 * no_input. Whoever changes either flag calls this afterwards; the mask is
 * computed under ev_lock from the flags' latest values, so the last call
 * wins with the right answer. (Reading the flags before taking the lock
 * let a call that read an old value apply it after a newer one: EPOLLOUT
 * dropped while frames waited, and the connection stalled until something
 * else was sent on it.) Adding EPOLLOUT when the socket already has room
 * reports it at once (EPOLL_CTL_MOD polls the socket), so no edge is lost.
 */
static void conn_events(tcp_conn_t *c)
{
    uint32_t mask = EPOLLET;

    pthread_mutex_lock(&c->ev_lock);
    if (!atomic_load_explicit(&c->no_input, memory_order_acquire))
        mask |= EPOLLIN | EPOLLRDHUP;
    if (atomic_load_explicit(&c->want_out, memory_order_acquire))
        mask |= EPOLLOUT;
    if (!c->ev_closed && mask != c->ev_mask) {
        struct epoll_event ev = {.events = mask, .data.ptr = c};
        if (epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
            c->ev_mask = mask;
    }
    pthread_mutex_unlock(&c->ev_lock);
}

/* After a flush with tx_lock held: whether output must be watched now.
 * Returns 1 when the flag changed (the caller then calls conn_events()
 * after dropping tx_lock). */
static int want_out_update(tcp_conn_t *c)
{
    int want = c->txq_head != NULL;
    return atomic_exchange_explicit(&c->want_out, want,
                                    memory_order_acq_rel) != want;
}

static void txq_append_locked(tcp_conn_t *c, tcp_tx_t *t)
{
    t->next = NULL;
    if (c->txq_tail)
        c->txq_tail->next = t;
    else
        c->txq_head = t;
    c->txq_tail = t;
}

/* Target side: queue a response and send what the socket takes now. */
static void send_resp(tcp_conn_t *c, tcp_resp_t *r)
{
    int changed;

    pthread_mutex_lock(&c->tx_lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->tx_lock);
        free(r);
        return;
    }
    txq_append_locked(c, &r->tx);
    flush_locked(c, 0);
    changed = want_out_update(c);
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        conn_events(c);
}

static tcp_resp_t *resp_alloc(size_t niov, size_t body_len, size_t nsegs)
{
    size_t sz = sizeof(tcp_resp_t) + niov * sizeof(struct iovec) + body_len +
                nsegs * sizeof(uint64_t);
    tcp_resp_t *r = calloc(1, sz);
    if (r == NULL)
        return NULL;
    r->tx.is_resp = 1;
    r->tx.cur = r->iov;
    r->tx.cnt = (int)niov;
    r->body = (uint8_t *)(r->iov + niov);
    if (nsegs)
        r->seg_addr = (uint64_t *)(r->body + body_len);
    return r;
}

static void hdr_init(kvt__wire_hdr_t *h, uint8_t type, uint64_t req_id)
{
    memset(h, 0, sizeof(*h));
    h->ver_major = KVT_WIRE_VERSION_MAJOR;
    h->ver_minor = KVT_WIRE_VERSION_MINOR;
    h->type = type;
    h->req_id = req_id;
}

/* A response with a body only (acks, descriptors, errors). */
static void send_simple(tcp_conn_t *c, uint8_t type, uint64_t req_id,
                        kvt_status_t status, const void *body, size_t len)
{
    kvt__wire_hdr_t h;
    tcp_resp_t *r = resp_alloc(2, len, 0);

    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    hdr_init(&h, type, req_id);
    h.status = status;
    h.body_len = (uint32_t)len;
    kvt__wire_hdr_encode(&h, r->hdr);
    if (len)
        memcpy(r->body, body, len);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, len};
    r->tx.cnt = len ? 2 : 1;
    send_resp(c, r);
}

/* ---- Target side: handling requests -------------------------------------- */

static int ensure_rx_arrays(tcp_conn_t *c)
{
    if (c->rx_segs != NULL)
        return 0;
    c->rx_segs = calloc(KVT_WIRE_MAX_SEGS, sizeof(*c->rx_segs));
    c->rx_pieces = calloc(KVT_WIRE_MAX_PIECES, sizeof(*c->rx_pieces));
    c->rx_pstatus = calloc(KVT_WIRE_MAX_PIECES, sizeof(*c->rx_pstatus));
    return (c->rx_segs && c->rx_pieces && c->rx_pstatus) ? 0 : -1;
}

/* Validate the pieces of a WRITE or READ against the registry and lay out
 * the segments. Refused pieces get KVT_ERR_ACCESS and invalid segments. */
static void layout_pieces(tcp_conn_t *c, uint32_t need)
{
    kvt__memreg_t *reg = c->w->tcp->reg;
    uint32_t s = 0;

    kvt__memreg_rdlock(reg);
    c->rx_gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    for (uint32_t i = 0; i < c->rx_npieces; i++) {
        const kvt__wire_piece_t *p = &c->rx_pieces[i];
        uint64_t span = p->stride * (p->count - 1) + p->len;
        /* One lookup for the whole span when it lies in one region (the
         * strided pieces of head slicing do); run by run otherwise. */
        int ok = kvt__memreg_contains_locked(reg, p->addr, span, need);
        if (!ok && p->count > 1) {
            ok = 1;
            for (uint32_t k = 0; k < p->count && ok; k++)
                ok = kvt__memreg_contains_locked(
                    reg, p->addr + k * p->stride, p->len, need);
        }
        c->rx_pstatus[i] = ok ? KVT_OK : KVT_ERR_ACCESS;
        for (uint32_t k = 0; k < p->count; k++, s++)
            c->rx_segs[s] = (rx_seg_t){p->addr + k * p->stride, p->len, i,
                                       (uint32_t)ok};
    }
    kvt__memreg_unlock(reg);
    c->rx_nsegs = s;
    c->rx_seg = 0;
    c->rx_seg_off = 0;
}

static size_t encode_fails(const tcp_conn_t *c, uint8_t *out,
                           int32_t *first_p)
{
    size_t n = 0;
    *first_p = KVT_OK;
    for (uint32_t i = 0; i < c->rx_npieces; i++) {
        int32_t st = c->rx_pstatus[i];
        if (st == KVT_OK)
            continue;
        if (*first_p == KVT_OK)
            *first_p = st;
        memcpy(out + n, &i, 4);
        memcpy(out + n + 4, &st, 4);
        n += KVT_WIRE_FAIL_LEN;
    }
    return n;
}

static size_t count_fails(const tcp_conn_t *c)
{
    size_t n = 0;
    for (uint32_t i = 0; i < c->rx_npieces; i++)
        n += c->rx_pstatus[i] != KVT_OK;
    return n;
}

static void send_write_ack(tcp_conn_t *c)
{
    size_t nf = count_fails(c);
    kvt__wire_hdr_t h;
    tcp_resp_t *r = resp_alloc(2, nf * KVT_WIRE_FAIL_LEN, 0);
    int32_t first;

    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    hdr_init(&h, KVT_WIRE_WRITE_ACK, c->rx_hdr.req_id);
    h.body_len = (uint32_t)encode_fails(c, r->body, &first);
    h.status = first;
    kvt__wire_hdr_encode(&h, r->hdr);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, h.body_len};
    r->tx.cnt = h.body_len ? 2 : 1;
    send_resp(c, r);
}

static void handle_read(tcp_conn_t *c)
{
    size_t nf, nvalid = 0;
    uint64_t payload = 0;
    kvt__wire_hdr_t h;
    tcp_resp_t *r;
    int32_t first;
    uint32_t k = 2, j = 0;

    layout_pieces(c, KVT_ACCESS_REMOTE_READ);
    for (uint32_t s = 0; s < c->rx_nsegs; s++) {
        if (c->rx_segs[s].valid) {
            nvalid++;
            payload += c->rx_segs[s].len;
        }
    }
    nf = count_fails(c);
    r = resp_alloc(3 + nvalid, nf * KVT_WIRE_FAIL_LEN, nvalid);
    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    hdr_init(&h, KVT_WIRE_READ_RESP, c->rx_hdr.req_id);
    h.body_len = (uint32_t)encode_fails(c, r->body, &first);
    h.status = first;
    h.payload_len = payload;
    kvt__wire_hdr_encode(&h, r->hdr);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, h.body_len};
    r->first_seg = 2;
    for (uint32_t s = 0; s < c->rx_nsegs; s++) {
        if (!c->rx_segs[s].valid)
            continue;
        r->iov[k++] = (struct iovec){(void *)(uintptr_t)c->rx_segs[s].addr,
                                     c->rx_segs[s].len};
        r->seg_addr[j++] = c->rx_segs[s].addr;
    }
    r->nsegs = j;
    r->gen = c->rx_gen;
    r->iov[k++] = (struct iovec){r->trailer, KVT_WIRE_TRAILER_LEN};
    r->tx.cnt = (int)k;
    if (h.body_len == 0) {
        /* Drop the empty body entry so the vector has no holes. */
        memmove(&r->iov[1], &r->iov[2], (k - 2) * sizeof(struct iovec));
        r->first_seg = 1;
        r->tx.cnt = (int)k - 1;
    }
    /* The trailer reports pieces whose region was unregistered while
     * their bytes were being sent; resp_revalidate() fills it in. */
    send_resp(c, r);
}

/* A complete request header and body are in; act on it. Returns 0 to go on
 * reading, -1 after the connection was shut down. */
static int inbound_dispatch(tcp_conn_t *c)
{
    kvt_engine_h e = c->w->tcp->e;
    const kvt__wire_hdr_t *h = &c->rx_hdr;
    uint32_t nsegs;

    switch (h->type) {
    case KVT_WIRE_WRITE:
    case KVT_WIRE_READ:
        if (ensure_rx_arrays(c) != 0 ||
            kvt__wire_pieces_decode(c->rx_body, h->body_len, h->payload_len,
                                    c->rx_pieces, KVT_WIRE_MAX_PIECES,
                                    &c->rx_npieces, &nsegs) != KVT_OK) {
            KVT_LOG_W("malformed %s from %s; closing",
                      kvt__wire_type_name(h->type), c->peer);
            goto err_protocol;
        }
        if (h->type == KVT_WIRE_READ) {
            handle_read(c);
            return 0;
        }
        layout_pieces(c, KVT_ACCESS_REMOTE_WRITE);
        c->rx_state = RX_PAYLOAD;
        return 0;
    case KVT_WIRE_NOTIFY:
        if (h->body_len > KVT_NOTIFY_MAX) {
            send_simple(c, KVT_WIRE_NOTIFY_ACK, h->req_id, KVT_ERR_OVERFLOW,
                        NULL, 0);
            return 0;
        }
        kvt__notify_push(e, c->peer, c->rx_body, h->body_len);
        send_simple(c, KVT_WIRE_NOTIFY_ACK, h->req_id, KVT_OK, NULL, 0);
        return 0;
    case KVT_WIRE_PING:
        send_simple(c, KVT_WIRE_PONG, h->req_id, KVT_OK, NULL, 0);
        return 0;
    default:
        KVT_LOG_W("unexpected %s from %s; closing",
                  kvt__wire_type_name(h->type), c->peer);
        goto err_protocol;
    }
err_protocol:
    send_simple(c, KVT_WIRE_ERROR, h->req_id, KVT_ERR_PROTOCOL,
                "protocol error", 14);
    shutdown(c->fd, SHUT_RDWR);
    return -1;
}

/* ---- Initiator side: handling responses ----------------------------------- */

/* Complete every piece of @f: @pst[i] when given, else @st. */
static void frame_complete(tcp_conn_t *c, tcp_frame_t *f, kvt_status_t st,
                           const int32_t *pst)
{
    atomic_fetch_sub_explicit(&c->inflight, f->bytes, memory_order_relaxed);
    for (uint32_t i = 0; i < f->npieces; i++)
        kvt__comp_done(f->comps[i], pst ? pst[i] : st);
    frame_put(f);
}

static void pstatus_fail_cb(void *arg, uint32_t index, kvt_status_t status)
{
    ((int32_t *)arg)[index] = status;
}

static tcp_frame_t *out_pop(tcp_conn_t *c)
{
    tcp_frame_t *f;
    pthread_mutex_lock(&c->out_lock);
    f = c->out_head;
    if (f) {
        c->out_head = f->next_out;
        if (c->out_head == NULL)
            c->out_tail = NULL;
    }
    pthread_mutex_unlock(&c->out_lock);
    return f;
}

static void response_done(tcp_conn_t *c, tcp_frame_t *f, kvt_status_t st,
                          const int32_t *pst)
{
    /* The head is @f: outbound_dispatch() checked it on the header. */
    out_pop(c);
    frame_complete(c, f, st, pst);
    atomic_fetch_add_explicit(&c->done_seq, 1, memory_order_release);
    if (atomic_load_explicit(&c->sess->nparked, memory_order_acquire))
        release_parked(c->sess);
}

/* Returns 0 to go on, or a failure status for the connection. */
static kvt_status_t outbound_dispatch(tcp_conn_t *c)
{
    const kvt__wire_hdr_t *h = &c->rx_hdr;
    tcp_frame_t *f;

    pthread_mutex_lock(&c->out_lock);
    f = c->out_head;
    pthread_mutex_unlock(&c->out_lock);

    if (h->type == KVT_WIRE_ERROR) {
        KVT_LOG_E("peer %s refused us: %s (%.*s)", c->sess->base.name,
                  kvt_status_str(h->status), (int)h->body_len,
                  (const char *)c->rx_body);
        return h->status < 0 ? h->status : KVT_ERR_PROTOCOL;
    }
    if (f == NULL || f->req_id != h->req_id ||
        (h->type == KVT_WIRE_WRITE_ACK && f->type != KVT_WIRE_WRITE) ||
        (h->type == KVT_WIRE_READ_RESP && f->type != KVT_WIRE_READ) ||
        (h->type == KVT_WIRE_NOTIFY_ACK && f->type != KVT_WIRE_NOTIFY) ||
        (h->type != KVT_WIRE_WRITE_ACK && h->type != KVT_WIRE_READ_RESP &&
         h->type != KVT_WIRE_NOTIFY_ACK)) {
        KVT_LOG_E("unexpected %s (request %llu) from %s",
                  kvt__wire_type_name(h->type), (unsigned long long)h->req_id,
                  c->sess->base.name);
        return KVT_ERR_PROTOCOL;
    }
    if (h->type == KVT_WIRE_NOTIFY_ACK) {
        response_done(c, f, h->status > 0 ? KVT_ERR_PROTOCOL : h->status,
                      NULL);
        return KVT_OK;
    }
    if (ensure_rx_arrays(c) != 0)
        return KVT_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < f->npieces; i++)
        c->rx_pstatus[i] = KVT_OK;
    if (kvt__wire_fails_decode(c->rx_body, h->body_len, f->npieces,
                               pstatus_fail_cb, c->rx_pstatus) != KVT_OK)
        return KVT_ERR_PROTOCOL;
    if (h->type == KVT_WIRE_WRITE_ACK) {
        response_done(c, f, KVT_OK, c->rx_pstatus);
        return KVT_OK;
    }
    /* READ_RESP: the payload holds the accepted pieces, in order. */
    {
        uint64_t expect = 0;
        uint32_t s = 0;
        for (uint32_t i = 0; i < f->npieces; i++) {
            if (c->rx_pstatus[i] != KVT_OK)
                continue;
            for (uint32_t k = f->piece_seg[i]; k < f->piece_seg[i + 1]; k++) {
                c->rx_segs[s++] = (rx_seg_t){
                    (uint64_t)(uintptr_t)f->lsegs[k].iov_base,
                    f->lsegs[k].iov_len, i, 1};
                expect += f->lsegs[k].iov_len;
            }
        }
        if (expect != h->payload_len)
            return KVT_ERR_PROTOCOL;
        c->rx_nsegs = s;
        c->rx_seg = 0;
        c->rx_seg_off = 0;
        c->rx_frame = f;
        c->rx_state = RX_PAYLOAD;
    }
    return KVT_OK;
}

static void read_resp_finish(tcp_conn_t *c)
{
    tcp_frame_t *f = c->rx_frame;
    uint32_t late;
    int32_t lst;

    memcpy(&late, c->rx_trailer, 4);
    memcpy(&lst, c->rx_trailer + 4, 4);
    if (late > 0) {
        /* Some region went away while the target was sending: the frame's
         * accepted pieces cannot be trusted as a whole. */
        if (lst >= 0)
            lst = KVT_ERR_ACCESS;
        for (uint32_t i = 0; i < f->npieces; i++)
            if (c->rx_pstatus[i] == KVT_OK)
                c->rx_pstatus[i] = lst;
    }
    c->rx_frame = NULL;
    response_done(c, f, KVT_OK, c->rx_pstatus);
}

/* ---- Receiving ------------------------------------------------------------ */

/* Re-check inbound WRITE segments after the registry changed. Called with
 * the registry read lock held. */
static void rx_revalidate(tcp_conn_t *c, kvt__memreg_t *reg)
{
    uint64_t gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    if (gen == c->rx_gen)
        return;
    c->rx_gen = gen;
    for (uint32_t s = c->rx_seg; s < c->rx_nsegs; s++) {
        rx_seg_t *g = &c->rx_segs[s];
        if (g->valid && !kvt__memreg_contains_locked(
                            reg, g->addr, g->len, KVT_ACCESS_REMOTE_WRITE)) {
            g->valid = 0;
            c->rx_pstatus[g->piece] = KVT_ERR_ACCESS;
        }
    }
}

/* Advance the segment cursor by @got bytes. */
static void rx_advance(tcp_conn_t *c, uint64_t got)
{
    while (got > 0) {
        uint64_t left = c->rx_segs[c->rx_seg].len - c->rx_seg_off;
        if (got < left) {
            c->rx_seg_off += got;
            got = 0;
        } else {
            got -= left;
            c->rx_seg++;
            c->rx_seg_off = 0;
        }
    }
}

/*
 * Read payload bytes for the current segments: valid runs straight into
 * their destination with readv (neighbouring segments merged into one
 * vector), refused ones into scratch. (Reading runs of small pieces into
 * scratch and copying them out was measured slower than readv with a
 * vector per 512-byte piece.) Returns 1 when the payload is complete, 0
 * when the socket is drained, -1 on EOF/error.
 */
static int rx_payload(tcp_conn_t *c)
{
    kvt__memreg_t *reg = c->w->tcp->reg;
    int check = !c->outbound;

    while (c->rx_seg < c->rx_nsegs) {
        struct iovec iov[RX_IOV];
        int n = 0;
        ssize_t got;
        uint32_t s;

        if (check) {
            kvt__memreg_rdlock(reg);
            rx_revalidate(c, reg);
        }
        s = c->rx_seg;
        if (!c->rx_segs[s].valid) {
            uint64_t left = c->rx_segs[s].len - c->rx_seg_off;
            iov[n++] = (struct iovec){c->w->scratch,
                                      left < SCRATCH_LEN ? left : SCRATCH_LEN};
        } else {
            uint64_t off = c->rx_seg_off;
            for (; s < c->rx_nsegs && c->rx_segs[s].valid; s++) {
                char *p = (char *)(uintptr_t)c->rx_segs[s].addr + off;
                uint64_t len = c->rx_segs[s].len - off;
                off = 0;
                if (n > 0 && (char *)iov[n - 1].iov_base +
                                     iov[n - 1].iov_len ==
                                 p) {
                    iov[n - 1].iov_len += len;
                } else if (n < RX_IOV) {
                    iov[n++] = (struct iovec){p, len};
                } else {
                    break;
                }
            }
        }
        got = payload_readv(c->fd, iov, n);
        if (check)
            kvt__memreg_unlock(reg);
        if (got == 0)
            return -1;
        if (got < 0)
            return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        rx_advance(c, (uint64_t)got);
    }
    return 1;
}

/* Read into a fixed buffer until @want bytes are there. 1 done, 0 drained,
 * -1 EOF/error. */
static int rx_fill(tcp_conn_t *c, uint8_t *buf, size_t want)
{
    while (c->rx_have < want) {
        ssize_t n = recv(c->fd, buf + c->rx_have, want - c->rx_have, 0);
        if (n == 0)
            return -1;
        if (n < 0)
            return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        c->rx_have += (size_t)n;
    }
    return 1;
}

/*
 * Read and handle what @c has, until the socket is drained (the worker,
 * edge-triggered) or, when @stop is given, as soon as *@stop reads 0
 * between two frames (a waiter, which polls: whatever it
 * leaves is reported to the worker when input is watched again).
 */
static void conn_rx(tcp_conn_t *c, const _Atomic uint32_t *stop)
{
    kvt_status_t fail = KVT_ERR_CONN_LOST;
    int r = 0;

    for (;;) {
        if (stop != NULL && c->rx_state == RX_HDR &&
            atomic_load_explicit(stop, memory_order_acquire) == 0)
            return;
        switch (c->rx_state) {
        case RX_HDR: {
            kvt_status_t st;
            r = rx_fill(c, c->rx_hdrbuf, KVT_WIRE_HDR_LEN);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            st = kvt__wire_hdr_decode(c->rx_hdrbuf, KVT_WIRE_HDR_LEN,
                                      &c->rx_hdr);
            if (st == KVT_ERR_VERSION) {
                char msg[96];
                int n = snprintf(msg, sizeof(msg),
                                 "kvt protocol %d.%d required, peer sent %u.%u",
                                 KVT_WIRE_VERSION_MAJOR,
                                 KVT_WIRE_VERSION_MINOR, c->rx_hdr.ver_major,
                                 c->rx_hdr.ver_minor);
                KVT_LOG_E("refusing peer %s: %s", c->peer, msg);
                if (!c->outbound)
                    send_simple(c, KVT_WIRE_ERROR, c->rx_hdr.req_id,
                                KVT_ERR_VERSION, msg, (size_t)n);
                fail = KVT_ERR_VERSION;
                goto fail;
            }
            if (st != KVT_OK) {
                KVT_LOG_W("malformed frame header from %s; closing",
                          c->peer[0] ? c->peer : "a peer");
                fail = KVT_ERR_PROTOCOL;
                goto fail;
            }
            if (c->rx_hdr.body_len > c->rx_body_cap) {
                uint8_t *nb = realloc(c->rx_body, c->rx_hdr.body_len);
                if (nb == NULL) {
                    fail = KVT_ERR_NO_MEMORY;
                    goto fail;
                }
                c->rx_body = nb;
                c->rx_body_cap = c->rx_hdr.body_len;
            }
            c->rx_state = RX_BODY;
        }
            /* fall through */
        case RX_BODY:
            r = rx_fill(c, c->rx_body, c->rx_hdr.body_len);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            c->rx_state = RX_HDR;
            if (c->outbound) {
                kvt_status_t st;
                if (c->rx_hdr.type != KVT_WIRE_READ_RESP &&
                    c->rx_hdr.payload_len != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
                st = outbound_dispatch(c);
                if (st != KVT_OK) {
                    fail = st;
                    goto fail;
                }
            } else {
                if (c->rx_hdr.type != KVT_WIRE_WRITE &&
                    c->rx_hdr.type != KVT_WIRE_READ &&
                    c->rx_hdr.payload_len != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
                if (inbound_dispatch(c) != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
            }
            break;
        case RX_PAYLOAD:
            r = rx_payload(c);
            if (r <= 0)
                goto out;
            if (c->outbound) {
                c->rx_state = RX_TRAILER;
                c->rx_have = 0;
            } else {
                c->rx_state = RX_HDR;
                kvt__engine_landed(c->w->tcp->e);
                send_write_ack(c);
            }
            break;
        case RX_TRAILER:
            r = rx_fill(c, c->rx_trailer, KVT_WIRE_TRAILER_LEN);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            c->rx_state = RX_HDR;
            read_resp_finish(c);
            break;
        }
    }
out:
    if (r == 0)
        return;
fail: {
    int32_t why = atomic_load(&c->fail_status);
    conn_fail(c, why != 0 ? why : fail);
}
}

/* ---- Connection lifecycle ------------------------------------------------ */

static tcp_conn_t *conn_new(tcp_worker_t *w, int fd, int outbound)
{
    tcp_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->outbound = (uint8_t)outbound;
    c->w = w;
    pthread_mutex_init(&c->tx_lock, NULL);
    pthread_mutex_init(&c->out_lock, NULL);
    pthread_mutex_init(&c->rx_lock, NULL);
    pthread_mutex_init(&c->ev_lock, NULL);
    return c;
}

static void conn_free(tcp_conn_t *c)
{
    pthread_mutex_destroy(&c->tx_lock);
    pthread_mutex_destroy(&c->out_lock);
    pthread_mutex_destroy(&c->rx_lock);
    pthread_mutex_destroy(&c->ev_lock);
    free(c->rx_body);
    free(c->rx_segs);
    free(c->rx_pieces);
    free(c->rx_pstatus);
    free(c);
}

#define CONN_EVENTS (EPOLLIN | EPOLLET | EPOLLRDHUP)

static int worker_attach(tcp_worker_t *w, tcp_conn_t *c)
{
    struct epoll_event ev = {.events = CONN_EVENTS, .data.ptr = c};
    c->ev_mask = CONN_EVENTS;
    c->attached = 1;
    pthread_mutex_lock(&w->lock);
    c->wnext = w->conns;
    w->conns = c;
    pthread_mutex_unlock(&w->lock);
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        KVT_LOG_E("epoll_ctl: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static void worker_detach(tcp_worker_t *w, tcp_conn_t *c)
{
    tcp_conn_t **pp;
    pthread_mutex_lock(&c->ev_lock);
    if (!c->ev_closed && c->fd >= 0)
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    c->ev_closed = 1;
    pthread_mutex_unlock(&c->ev_lock);
    pthread_mutex_lock(&w->lock);
    for (pp = &w->conns; *pp != NULL; pp = &(*pp)->wnext) {
        if (*pp == c) {
            *pp = c->wnext;
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
}

/*
 * A failed outbound connection goes on its worker's reap list; the worker
 * takes it off between two rounds of events (worker_reap()), when no
 * event of its last round can still name it, and the last connection of
 * a session reaped releases the session. Called with the connection out
 * of the epoll set already.
 */
static void worker_reap_later(tcp_worker_t *w, tcp_conn_t *c)
{
    int other = !pthread_equal(pthread_self(), w->thread);

    pthread_mutex_lock(&w->lock);
    c->dnext = w->reap;
    w->reap = c;
    pthread_mutex_unlock(&w->lock);
    if (other) {
        uint64_t one = 1;
        if (write(w->evfd, &one, sizeof(one)) < 0)
            (void)0;
    }
}

static void worker_reap(tcp_worker_t *w)
{
    tcp_conn_t *c, *next;

    pthread_mutex_lock(&w->lock);
    c = w->reap;
    w->reap = NULL;
    pthread_mutex_unlock(&w->lock);
    for (; c != NULL; c = next) {
        tcp_session_t *s = c->sess;
        next = c->dnext;
        if (atomic_fetch_sub(&s->unreaped, 1) == 1)
            kvt__session_release(&s->base);
    }
}

/*
 * Fail a connection. Inbound: only its worker calls this. Outbound: the
 * caller holds rx_lock (the worker, or an attached waiter). Every frame
 * queued or in flight on it is completed with @st; the descriptor is
 * closed, unless waiters still poll it, in which case the last of them
 * closes it. Outbound connections stay allocated, dead, until their
 * session is destroyed; inbound ones are freed.
 */
static void conn_fail(tcp_conn_t *c, kvt_status_t st)
{
    tcp_frame_t *list;
    tcp_tx_t *t, *tn;
    int fd;

    pthread_mutex_lock(&c->tx_lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->tx_lock);
        return;
    }
    c->dead = 1;
    t = c->txq_head;
    c->txq_head = c->txq_tail = NULL;
    pthread_mutex_unlock(&c->tx_lock);
    for (; t != NULL; t = tn) {
        tn = t->next;
        tx_free(t);
    }
    pthread_mutex_lock(&c->out_lock);
    list = c->out_head;
    c->out_head = c->out_tail = NULL;
    pthread_mutex_unlock(&c->out_lock);

    worker_detach(c->w, c);
    if (c->outbound) {
        tcp_session_t *s = c->sess;
        if (st != KVT_ERR_CANCELED)
            KVT_LOG_W("connection %u to %s failed: %s", c->index,
                      s->base.name, kvt_status_str(st));
        c->rx_dead = 1;
        session_kill(&s->base, st);
        if (c->waiters == 0) {
            pthread_mutex_lock(&s->lock);
            fd = c->fd;
            c->fd = -1;
            pthread_mutex_unlock(&s->lock);
            close(fd);
        }
        while (list != NULL) {
            tcp_frame_t *n = list->next_out;
            frame_complete(c, list, st, NULL);
            list = n;
        }
        free(c->rx_segs);
        free(c->rx_pieces);
        free(c->rx_pstatus);
        free(c->rx_body);
        c->rx_segs = NULL;
        c->rx_pieces = NULL;
        c->rx_pstatus = NULL;
        c->rx_body = NULL;
        c->rx_body_cap = 0;
        if (c->w != NULL && c->attached)
            worker_reap_later(c->w, c);
    } else {
        KVT_LOG_D("inbound connection from %s closed: %s", c->peer,
                  kvt_status_str(st));
        close(c->fd);
        conn_free(c);
    }
}

/* ---- Workers --------------------------------------------------------------- */

/*
 * A data connection the control plane accepted (its HELLO answered): it
 * goes to the next worker in turn, which owns it from then on.
 */
static kvt_status_t tcp_accept(kvt__tl_t *tl, int fd,
                               const kvt__wire_hello_t *hello)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;
    tcp_worker_t *w;
    tcp_conn_t *c;

    w = &tcp->workers[atomic_fetch_add(&tcp->rr, 1) % tcp->nworkers];
    c = conn_new(w, fd, 0);
    if (c == NULL) {
        close(fd);
        return KVT_ERR_NO_MEMORY;
    }
    snprintf(c->peer, sizeof(c->peer), "%s", hello->name);
    if (worker_attach(w, c) != 0) {
        worker_detach(w, c);
        conn_free(c);
        close(fd);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

static void check_timeouts(tcp_worker_t *w, uint64_t now)
{
    tcp_conn_t *expired[64];
    size_t n = 0;

    pthread_mutex_lock(&w->lock);
    for (tcp_conn_t *c = w->conns; c != NULL && n < 64; c = c->wnext) {
        if (!c->outbound)
            continue;
        pthread_mutex_lock(&c->out_lock);
        if (c->out_head != NULL && now > c->out_head->deadline)
            expired[n++] = c;
        pthread_mutex_unlock(&c->out_lock);
    }
    pthread_mutex_unlock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        KVT_LOG_W("transfer to %s timed out after %.1f s",
                  expired[i]->sess->base.name,
                  (double)w->tcp->cfg->timeout_ns / 1e9);
        pthread_mutex_lock(&expired[i]->rx_lock);
        conn_fail(expired[i], KVT_ERR_TIMEDOUT);
        pthread_mutex_unlock(&expired[i]->rx_lock);
    }
}

static void conn_tx_event(tcp_conn_t *c)
{
    int changed = 0;

    pthread_mutex_lock(&c->tx_lock);
    if (!c->dead) {
        flush_locked(c, 0);
        changed = want_out_update(c);
    }
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        conn_events(c);
}

static void *worker_main(void *arg)
{
    tcp_worker_t *w = arg;
    kvt__tcp_t *tcp = w->tcp;
    struct epoll_event evs[64];

    while (!atomic_load_explicit(&tcp->stopping, memory_order_acquire)) {
        int n;
        uint64_t now;

        worker_reap(w);
        n = epoll_wait(w->epfd, evs, 64, (int)(TICK_NS / 1000000));

        if (n > 0) {
            /* Pairs with the unlock in worker_attach(): whatever the
             * attaching thread wrote to a connection is visible here (and
             * to ThreadSanitizer, which does not model epoll). */
            pthread_mutex_lock(&w->lock);
            pthread_mutex_unlock(&w->lock);
        }

        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)w) {
                uint64_t v;
                if (read(w->evfd, &v, sizeof(v)) < 0)
                    (void)0;
            } else {
                tcp_conn_t *c = p;
                if (evs[i].events & EPOLLOUT)
                    conn_tx_event(c);
                if (!(evs[i].events &
                      (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
                    continue;
                if (!c->outbound) {
                    conn_rx(c, NULL);
                    continue;
                }
                pthread_mutex_lock(&c->rx_lock);
                if (c->waiters == 0 && !c->rx_dead)
                    conn_rx(c, NULL);
                pthread_mutex_unlock(&c->rx_lock);
            }
        }
        now = kvt__now_ns();
        if (now - w->last_tick >= TICK_NS) {
            w->last_tick = now;
            check_timeouts(w, now);
        }
    }
    /* Stopping: fail everything this worker owns. */
    for (;;) {
        tcp_conn_t *c;
        pthread_mutex_lock(&w->lock);
        c = w->conns;
        pthread_mutex_unlock(&w->lock);
        if (c == NULL)
            break;
        if (!c->outbound) {
            conn_fail(c, KVT_ERR_CANCELED); /* frees it */
            continue;
        }
        /* Outbound connections outlive their failure. */
        pthread_mutex_lock(&c->rx_lock);
        conn_fail(c, KVT_ERR_CANCELED);
        pthread_mutex_unlock(&c->rx_lock);
    }
    return NULL;
}

/* ---- Sessions ------------------------------------------------------------- */

static void session_kill(kvt__session_t *base, kvt_status_t why)
{
    tcp_session_t *s = (tcp_session_t *)base;
    tcp_frame_t *parked;
    int32_t zero = 0;

    if (!atomic_compare_exchange_strong(&base->dead, &zero, why))
        return;
    kvt__session_evict(base);
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->nconns; i++) {
        tcp_conn_t *c = s->conns[i];
        int32_t z = 0;
        if (c == NULL)
            continue;
        atomic_compare_exchange_strong(&c->fail_status, &z, why);
        if (c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    }
    parked = s->parked_head;
    s->parked_head = s->parked_tail = NULL;
    atomic_store(&s->nparked, 0);
    pthread_mutex_unlock(&s->lock);
    while (parked != NULL) {
        tcp_frame_t *n = parked->next_out;
        frame_complete(s->conns[0], parked, why, NULL);
        frame_put(parked); /* never queued for sending */
        parked = n;
    }
}

/*
 * Free the session: every connection is reaped (the session released
 * itself), or the workers have stopped (engine teardown), so no worker
 * and no waiter uses any of them.
 */
static void session_destroy(kvt__session_t *base)
{
    tcp_session_t *s = (tcp_session_t *)base;
    for (unsigned i = 0; i < s->nconns; i++) {
        if (s->conns[i] == NULL)
            continue;
        if (s->conns[i]->fd >= 0) {
            /* Workers already stopped. */
            pthread_mutex_lock(&s->conns[i]->rx_lock);
            conn_fail(s->conns[i], KVT_ERR_CANCELED);
            pthread_mutex_unlock(&s->conns[i]->rx_lock);
        }
        conn_free(s->conns[i]);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Put @f on connection @c: FIFO and send queue in one step, then send what
 * the socket takes from this thread. */
static void conn_enqueue(tcp_conn_t *c, tcp_frame_t *f)
{
    int dead, changed = 0;

    atomic_fetch_add_explicit(&c->inflight, f->bytes, memory_order_relaxed);
    pthread_mutex_lock(&c->tx_lock);
    dead = c->dead;
    if (!dead) {
        pthread_mutex_lock(&c->out_lock);
        f->next_out = NULL;
        if (c->out_tail)
            c->out_tail->next_out = f;
        else
            c->out_head = f;
        c->out_tail = f;
        pthread_mutex_unlock(&c->out_lock);
        atomic_fetch_add_explicit(&c->enq_seq, 1, memory_order_relaxed);
        txq_append_locked(c, &f->tx);
        /* An idle connection sends this frame from the calling thread,
         * which saves a wake-up on small transfers; anything the socket
         * does not take now, and every later frame, is the worker's. */
        if (c->txq_head == &f->tx)
            flush_locked(c, 1);
        changed = want_out_update(c);
    }
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        conn_events(c);
    if (dead) {
        int32_t why = atomic_load(&c->sess->base.dead);
        frame_complete(c, f, why ? why : KVT_ERR_CONN_LOST, NULL);
        frame_put(f); /* the send queue's reference, never taken up */
    }
}

static int notify_ready(tcp_session_t *s, const tcp_frame_t *f)
{
    for (unsigned i = 0; i < s->nconns; i++)
        if (atomic_load_explicit(&s->conns[i]->done_seq,
                                 memory_order_acquire) < f->snap[i])
            return 0;
    return 1;
}

/* Send the parked notifications whose preceding writes have all landed. */
static void release_parked(tcp_session_t *s)
{
    tcp_frame_t *ready = NULL, **tail = &ready;

    pthread_mutex_lock(&s->lock);
    while (s->parked_head != NULL && notify_ready(s, s->parked_head)) {
        tcp_frame_t *f = s->parked_head;
        s->parked_head = f->next_out;
        if (s->parked_head == NULL)
            s->parked_tail = NULL;
        atomic_fetch_sub(&s->nparked, 1);
        f->next_out = NULL;
        *tail = f;
        tail = &f->next_out;
    }
    pthread_mutex_unlock(&s->lock);
    while (ready != NULL) {
        tcp_frame_t *n = ready->next_out;
        conn_enqueue(s->conns[0], ready);
        ready = n;
    }
}

static tcp_conn_t *pick_conn(tcp_session_t *s)
{
    tcp_conn_t *best = NULL;
    uint64_t best_load = UINT64_MAX;
    unsigned start = atomic_fetch_add_explicit(&s->rr, 1, memory_order_relaxed);

    for (unsigned k = 0; k < s->nconns; k++) {
        tcp_conn_t *c = s->conns[(start + k) % s->nconns];
        uint64_t load = atomic_load_explicit(&c->inflight,
                                             memory_order_relaxed);
        if (load < best_load) {
            best = c;
            best_load = load;
        }
    }
    return best;
}

/* ---- Submission: cutting descriptors into frames ---------------------------- */

typedef struct {
    kvt__comp_t *comp;
    uint32_t count;
    uint64_t len;
    uint64_t raddr, rstride;
    uint64_t laddr, lstride;
} pspec_t;

/* Pieces of a strided descriptor that one wire piece carries. */
static inline uint64_t strided_k(uint64_t len, uint64_t slice)
{
    uint64_t k = slice / len;
    return k > KVT_WIRE_MAX_SEGS ? KVT_WIRE_MAX_SEGS : k;
}

static inline uint32_t spec_lsegs(const pspec_t *p)
{
    return (p->count == 1 || p->lstride == p->len) ? 1 : p->count;
}

static tcp_frame_t *frame_build(tcp_session_t *s, uint8_t type,
                                const pspec_t *ps, size_t np)
{
    kvt__tcp_t *tcp = s->tcp;
    uint32_t nlsegs = 0;
    size_t table = np * KVT_WIRE_PIECE_LEN, niov, sz;
    uint64_t payload = 0;
    kvt__wire_hdr_t h;
    tcp_frame_t *f;
    uint8_t *p;
    uint32_t k = 0;

    for (size_t i = 0; i < np; i++) {
        nlsegs += spec_lsegs(&ps[i]);
        payload += ps[i].len * ps[i].count;
    }
    niov = 2 + nlsegs;
    sz = sizeof(*f) + niov * sizeof(struct iovec) +
         np * sizeof(kvt__comp_t *) + (np + 1) * 4 + table;
    f = malloc(sz);
    if (f == NULL)
        return NULL;
    memset(f, 0, sizeof(*f));
    atomic_init(&f->refs, 2);
    f->type = type;
    f->npieces = (uint32_t)np;
    f->nlsegs = nlsegs;
    f->bytes = payload;
    f->req_id = atomic_fetch_add_explicit(&tcp->next_req, 1,
                                          memory_order_relaxed);
    f->deadline = kvt__now_ns() + tcp->cfg->timeout_ns;
    p = (uint8_t *)(f->iov + niov);
    f->comps = (kvt__comp_t **)p;
    f->piece_seg = (uint32_t *)(f->comps + np);
    f->body = (uint8_t *)(f->piece_seg + np + 1);
    f->lsegs = f->iov + 2;
    for (size_t i = 0; i < np; i++) {
        const pspec_t *q = &ps[i];
        kvt__wire_piece_t wp = {q->raddr, (uint32_t)q->len, q->count,
                                q->count > 1 ? q->rstride : q->len};
        kvt__wire_piece_encode(&wp, f->body + i * KVT_WIRE_PIECE_LEN);
        f->comps[i] = q->comp;
        f->piece_seg[i] = k;
        if (spec_lsegs(q) == 1) {
            f->lsegs[k++] = (struct iovec){(void *)(uintptr_t)q->laddr,
                                           q->len * q->count};
        } else {
            for (uint32_t j = 0; j < q->count; j++)
                f->lsegs[k++] = (struct iovec){
                    (void *)(uintptr_t)(q->laddr + j * q->lstride), q->len};
        }
    }
    f->piece_seg[np] = k;
    hdr_init(&h, type, f->req_id);
    h.body_len = (uint32_t)table;
    h.payload_len = payload;
    kvt__wire_hdr_encode(&h, f->hdr);
    f->iov[0] = (struct iovec){f->hdr, KVT_WIRE_HDR_LEN};
    f->iov[1] = (struct iovec){f->body, table};
    f->tx.cur = f->iov;
    f->tx.cnt = type == KVT_WIRE_WRITE ? (int)niov : 2;
    if (type == KVT_WIRE_READ) {
        /* The send vector must not alias the receive segments, which the
         * sender's cursor would trim. */
        f->lsegs = f->iov + 2;
    }
    return f;
}

/*
 * Cut the READ or WRITE descriptors @x[0..n) into wire pieces and the
 * pieces into frames, then enqueue the frames on the least loaded
 * connections. Every descriptor's piece count is set before any frame is
 * enqueued.
 */
static void submit_op(tcp_session_t *s, uint8_t type,
                      const kvt__xfer_t *const *x, size_t n, kvt__sub_t *hint)
{
    uint64_t slice = s->tcp->cfg->slice_size, total = 0, target;
    size_t cap = 0, np = 0, start;
    pspec_t *ps = NULL;
    tcp_frame_t *frames = NULL, **ftail = &frames;

    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = x[i];
        total += kvt__xfer_bytes(d);
        if (d->count == 1 || d->len > slice || d->len > UINT32_MAX)
            cap += d->count * ((d->len + slice - 1) / slice);
        else
            cap += (d->count + strided_k(d->len, slice) - 1) /
                   strided_k(d->len, slice);
    }
    ps = malloc(cap * sizeof(*ps));
    if (ps == NULL)
        goto err_fail_all;
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = x[i];
        uint32_t c = d->count;
        uint64_t L = d->len, ls = d->lstride, rs = d->rstride, la = d->laddr;
        size_t first = np;

        if (c == 1 || L > slice || L > UINT32_MAX) {
            for (uint32_t j = 0; j < c; j++)
                for (uint64_t off = 0; off < L; off += slice)
                    ps[np++] = (pspec_t){d->comp, 1,
                                         L - off < slice ? L - off : slice,
                                         d->raddr + j * rs + off, 0,
                                         la + j * ls + off, 0};
        } else {
            uint64_t k = strided_k(L, slice);
            for (uint64_t j = 0; j < c; j += k) {
                uint32_t cnt = (uint32_t)(c - j < k ? c - j : k);
                ps[np++] = (pspec_t){d->comp, cnt, L, d->raddr + j * rs, rs,
                                     la + j * ls, ls};
            }
        }
        kvt__comp_expect(d->comp, (uint32_t)(np - first));
    }

    /* Frame size: spread a submission over the connections, between
     * MIN_FRAME and one slice. */
    target = (total + s->nconns - 1) / s->nconns;
    if (target < MIN_FRAME)
        target = MIN_FRAME;
    if (target > slice)
        target = slice;
    start = 0;
    while (start < np) {
        uint64_t bytes = 0;
        uint32_t rsegs = 0, lsegs = 0;
        size_t end = start;
        tcp_frame_t *f;

        while (end < np) {
            const pspec_t *q = &ps[end];
            uint64_t b = q->len * q->count;
            if (end > start &&
                (bytes + b > target || end - start >= KVT_WIRE_MAX_PIECES ||
                 rsegs + q->count > KVT_WIRE_MAX_SEGS ||
                 lsegs + spec_lsegs(q) > KVT_WIRE_MAX_SEGS))
                break;
            bytes += b;
            rsegs += q->count;
            lsegs += spec_lsegs(q);
            end++;
        }
        f = frame_build(s, type, ps + start, end - start);
        if (f == NULL) {
            for (size_t i = start; i < np; i++)
                kvt__comp_done(ps[i].comp, KVT_ERR_NO_MEMORY);
            break;
        }
        *ftail = f;
        ftail = (tcp_frame_t **)&f->tx.next;
        start = end;
    }
    free(ps);
    while (frames != NULL) {
        tcp_frame_t *f = frames, *next = (tcp_frame_t *)f->tx.next;
        tcp_conn_t *c = pick_conn(s);
        kvt__sub_note(hint, c);
        conn_enqueue(c, f);
        frames = next;
    }
    return;

err_fail_all:
    for (size_t i = 0; i < n; i++) {
        kvt__comp_expect(x[i]->comp, 1);
        kvt__comp_done(x[i]->comp, KVT_ERR_NO_MEMORY);
    }
}

static void submit_notify(tcp_session_t *s, const kvt__xfer_t *d,
                          kvt__sub_t *hint)
{
    size_t len = d->len;
    tcp_frame_t *f = calloc(1, sizeof(*f) + 2 * sizeof(struct iovec) +
                                   2 * sizeof(kvt__comp_t *) + 8 + len);
    kvt__wire_hdr_t h;
    int parked = 0;

    kvt__comp_expect(d->comp, 1);
    kvt__sub_note(hint, NULL); /* may be released by a worker */
    if (f == NULL) {
        kvt__comp_done(d->comp, KVT_ERR_NO_MEMORY);
        return;
    }
    atomic_init(&f->refs, 2);
    f->type = KVT_WIRE_NOTIFY;
    f->npieces = 1;
    f->comps = (kvt__comp_t **)(f->iov + 2);
    f->comps[0] = d->comp;
    f->body = (uint8_t *)(f->comps + 2);
    if (len > 0)
        memcpy(f->body, (const void *)(uintptr_t)d->laddr, len);
    f->req_id = atomic_fetch_add(&s->tcp->next_req, 1);
    f->deadline = kvt__now_ns() + s->tcp->cfg->timeout_ns;
    hdr_init(&h, KVT_WIRE_NOTIFY, f->req_id);
    h.body_len = (uint32_t)len;
    kvt__wire_hdr_encode(&h, f->hdr);
    f->iov[0] = (struct iovec){f->hdr, KVT_WIRE_HDR_LEN};
    f->iov[1] = (struct iovec){f->body, len};
    f->tx.cur = f->iov;
    f->tx.cnt = len ? 2 : 1;

    /* Ordering: wait for every frame enqueued so far on every connection
     * of this session to be answered. */
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->nconns; i++)
        f->snap[i] = atomic_load(&s->conns[i]->enq_seq);
    if (s->parked_head != NULL || !notify_ready(s, f)) {
        f->next_out = NULL;
        if (s->parked_tail)
            s->parked_tail->next_out = f;
        else
            s->parked_head = f;
        s->parked_tail = f;
        atomic_fetch_add(&s->nparked, 1);
        parked = 1;
    }
    pthread_mutex_unlock(&s->lock);
    if (!parked) {
        conn_enqueue(s->conns[0], f);
    } else {
        /* An answer may have come in between the snapshot and parking. */
        release_parked(s);
        if (atomic_load(&s->base.dead))
            session_kill(&s->base, atomic_load(&s->base.dead));
    }
}

static kvt_status_t tcp_submit(kvt__session_t *base, const kvt__xfer_t *x,
                               size_t n, kvt__sub_t *hint)
{
    tcp_session_t *s = (tcp_session_t *)base;
    const kvt__xfer_t **w = malloc(2 * n * sizeof(*w)), **r;
    size_t i = 0;

    if (w == NULL)
        return KVT_ERR_NO_MEMORY;
    r = w + n;
    /* Writes and reads are cut into frames separately; a NOTIFY ends the
     * run before it so that it follows every write submitted earlier. */
    while (i < n) {
        size_t nw = 0, nr = 0;
        for (; i < n && x[i].op != KVT_OP_NOTIFY; i++) {
            if (x[i].op == KVT_OP_WRITE)
                w[nw++] = &x[i];
            else
                r[nr++] = &x[i];
        }
        submit_op(s, KVT_WIRE_WRITE, w, nw, hint);
        submit_op(s, KVT_WIRE_READ, r, nr, hint);
        if (i < n) {
            submit_notify(s, &x[i], hint);
            i++;
        }
    }
    free(w);
    return KVT_OK;
}

/*
 * Waiter progress (see the top of this file): read connection @where from
 * this thread until *@until reads 0 or @deadline_ns passes. KVT_ERR_AGAIN
 * when the connection is already dead: the caller sleeps on the batch
 * instead.
 */
static kvt_status_t tcp_progress(kvt__session_t *base, void *where,
                                 const _Atomic uint32_t *until,
                                 uint64_t deadline_ns)
{
    tcp_conn_t *c = where;
    int fd;

    pthread_mutex_lock(&c->rx_lock);
    /* One reader per connection besides the worker: a second waiter
     * polling the same socket could sleep on after the first had read the
     * response that completes its batch. Other waiters sleep on their
     * batches, woken by whoever completes them. */
    if (c->rx_dead || c->fd < 0 || c->waiters > 0) {
        pthread_mutex_unlock(&c->rx_lock);
        return KVT_ERR_AGAIN;
    }
    fd = c->fd; /* stays open while a waiter is attached */
    if (c->waiters++ == 0) {
        /* Spare the worker a wake-up; input that came before this is
         * still readable, and poll() below sees it. */
        atomic_store(&c->no_input, 1);
        conn_events(c);
    }
    pthread_mutex_unlock(&c->rx_lock);

    while (atomic_load_explicit(until, memory_order_acquire) != 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = -1;
        if (deadline_ns != 0) {
            uint64_t now = kvt__now_ns();
            if (now >= deadline_ns)
                break;
            ms = (int)((deadline_ns - now + 999999) / 1000000);
        }
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            break;
        pthread_mutex_lock(&c->rx_lock);
        if (!c->rx_dead)
            conn_rx(c, until);
        pthread_mutex_unlock(&c->rx_lock);
    }

    pthread_mutex_lock(&c->rx_lock);
    if (--c->waiters == 0) {
        if (c->rx_dead) {
            tcp_session_t *s = c->sess;
            pthread_mutex_lock(&s->lock);
            c->fd = -1;
            pthread_mutex_unlock(&s->lock);
            close(fd);
        } else {
            /* Watching input again reports to the worker whatever is
             * left unread (EPOLL_CTL_MOD polls the socket). */
            atomic_store(&c->no_input, 0);
            conn_events(c);
        }
    }
    pthread_mutex_unlock(&c->rx_lock);
    return KVT_OK;
}

/* ---- Opening a session ---------------------------------------------------- */

static kvt_status_t tcp_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                             kvt__session_t **s_p, const char **why_p)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;
    kvt_engine_h e = tcp->e;
    const char *name = peer->name, *addr = peer->addr;
    uint64_t deadline =
        kvt__now_ns() + tcp->cfg->connect_timeout_ms * 1000000;
    uint64_t sid = ((uint64_t)getpid() << 32) ^ kvt__now_ns();
    tcp_session_t *s;
    kvt_status_t st;
    unsigned i;

    *s_p = NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVT_ERR_NO_MEMORY;
    pthread_mutex_init(&s->lock, NULL);
    s->tcp = tcp;
    s->nconns = tcp->cfg->conns_per_peer;

    for (i = 0; i < s->nconns; i++) {
        kvt__wire_hello_t hello = {sid, i, s->nconns, KVT_TRANSPORT_TCP, {0}};
        int fd;
        st = kvt__ctrl_dial(e, name, addr, &hello, deadline, &fd);
        if (st != KVT_OK)
            goto err_close;
        s->conns[i] = conn_new(NULL, fd, 1);
        if (s->conns[i] == NULL) {
            close(fd);
            st = KVT_ERR_NO_MEMORY;
            goto err_close;
        }
        s->conns[i]->sess = s;
        s->conns[i]->index = i;
        snprintf(s->conns[i]->peer, sizeof(s->conns[i]->peer), "%s", name);
    }
    /* Hand the connections to the workers. A connection that cannot be
     * attached fails the session; its worker-less connections are failed
     * here, the attached ones by their workers. */
    kvt__session_init(&s->base, tl, peer);
    atomic_store(&s->unreaped, s->nconns);
    {
        unsigned base = atomic_fetch_add(&tcp->rr, 1);
        for (i = 0; i < s->nconns; i++) {
            tcp_conn_t *c = s->conns[i];
            c->w = &tcp->workers[(base + i) % tcp->nworkers];
            kvt__sock_set_nonblock(c->fd, 1);
        }
        for (i = 0; i < s->nconns; i++) {
            if (worker_attach(s->conns[i]->w, s->conns[i]) != 0)
                break;
        }
        if (i < s->nconns) {
            unsigned left = s->nconns - i;
            worker_detach(s->conns[i]->w, s->conns[i]);
            s->conns[i]->attached = 0;
            session_kill(&s->base, KVT_ERR_IO);
            for (; i < s->nconns; i++) {
                pthread_mutex_lock(&s->conns[i]->rx_lock);
                conn_fail(s->conns[i], KVT_ERR_IO);
                pthread_mutex_unlock(&s->conns[i]->rx_lock);
            }
            *s_p = &s->base;
            if (atomic_fetch_sub(&s->unreaped, left) == left)
                kvt__session_release(&s->base);
            return KVT_ERR_IO;
        }
    }
    *s_p = &s->base;
    return KVT_OK;

err_close:
    for (unsigned j = 0; j < i; j++) {
        close(s->conns[j]->fd);
        conn_free(s->conns[j]);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
    return st;
}

/* ---- Transport lifecycle -------------------------------------------------- */

static kvt_status_t tcp_create(kvt_engine_h e, kvt__tl_t **tl_p)
{
    struct epoll_event ev;
    kvt__tcp_t *tcp;
    kvt_status_t st;
    unsigned i;

    tcp = calloc(1, sizeof(*tcp));
    if (tcp == NULL)
        return KVT_ERR_NO_MEMORY;
    kvt__tl_init(&tcp->base, &kvt__tl_tcp, e);
    tcp->e = e;
    tcp->cfg = kvt__engine_cfg(e);
    tcp->reg = kvt__engine_reg(e);
    tcp->nworkers = tcp->cfg->num_workers;
    atomic_store(&tcp->next_req, 1);
    tcp->zeros = mmap(NULL, KVT_WIRE_MAX_PAYLOAD, PROT_READ,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (tcp->zeros == MAP_FAILED) {
        st = KVT_ERR_NO_MEMORY;
        goto err_free;
    }
    tcp->workers = calloc(tcp->nworkers, sizeof(*tcp->workers));
    if (tcp->workers == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err_unmap;
    }
    for (i = 0; i < tcp->nworkers; i++) {
        tcp_worker_t *w = &tcp->workers[i];
        w->tcp = tcp;
        w->id = i;
        pthread_mutex_init(&w->lock, NULL);
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->scratch = malloc(SCRATCH_LEN);
        if (w->epfd < 0 || w->evfd < 0 || w->scratch == NULL) {
            st = KVT_ERR_IO;
            goto err_workers;
        }
        ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = w};
        epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev);
    }
    *tl_p = &tcp->base;
    return KVT_OK;

err_workers:
    for (unsigned j = 0; j < tcp->nworkers; j++) {
        tcp_worker_t *w = &tcp->workers[j];
        if (w->tcp == NULL)
            continue;
        if (w->epfd >= 0)
            close(w->epfd);
        if (w->evfd >= 0)
            close(w->evfd);
        free(w->scratch);
        pthread_mutex_destroy(&w->lock);
    }
    free(tcp->workers);
err_unmap:
    munmap(tcp->zeros, KVT_WIRE_MAX_PAYLOAD);
err_free:
    free(tcp);
    return st;
}

static kvt_status_t tcp_start(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    for (unsigned i = 0; i < tcp->nworkers; i++) {
        if (pthread_create(&tcp->workers[i].thread, NULL, worker_main,
                           &tcp->workers[i]) != 0) {
            KVT_LOG_E("cannot start worker threads");
            atomic_store(&tcp->stopping, 1);
            for (unsigned j = 0; j < i; j++) {
                uint64_t one = 1;
                if (write(tcp->workers[j].evfd, &one, sizeof(one)) < 0)
                    (void)0;
                pthread_join(tcp->workers[j].thread, NULL);
            }
            return KVT_ERR_IO;
        }
    }
    tcp->started = 1;
    return KVT_OK;
}

static void tcp_stop(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    if (!tcp->started || atomic_exchange(&tcp->stopping, 1))
        return;
    for (unsigned i = 0; i < tcp->nworkers; i++) {
        uint64_t one = 1;
        if (write(tcp->workers[i].evfd, &one, sizeof(one)) < 0)
            (void)0;
    }
    for (unsigned i = 0; i < tcp->nworkers; i++)
        pthread_join(tcp->workers[i].thread, NULL);
}

static void tcp_destroy(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    for (unsigned i = 0; i < tcp->nworkers; i++) {
        tcp_worker_t *w = &tcp->workers[i];
        close(w->epfd);
        close(w->evfd);
        free(w->scratch);
        pthread_mutex_destroy(&w->lock);
    }
    free(tcp->workers);
    munmap(tcp->zeros, KVT_WIRE_MAX_PAYLOAD);
    free(tcp);
}

KVT_TRANSPORT_REGISTER(tcp, {
    .name = "tcp",
    .id = KVT_TRANSPORT_TCP,
    .caps = {.local_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .remote_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .flags = KVT__TL_STRIDED,
             .priority = 10},
    .create = tcp_create,
    .start = tcp_start,
    .stop = tcp_stop,
    .destroy = tcp_destroy,
    .accept = tcp_accept,
    .open = tcp_open,
    .submit = tcp_submit,
    .progress = tcp_progress,
    .kill = session_kill,
    .destroy_session = session_destroy,
});
