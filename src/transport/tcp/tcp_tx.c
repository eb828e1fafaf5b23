/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The send path: the per-connection send queue written with sendmsg()
 * (payload gathered straight from registered memory), the epoll interest
 * in output, responses, and putting request frames on a connection
 * (parked notifications wait for the writes before them).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <unistd.h> /* IWYU pragma: keep */

#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/sock.h"

static void backlog_take_locked(tcp_conn_t *c);
static tcp_conn_t *least_loaded(tcp_session_t *s, int for_waiter,
                                int with_room);

/*
 * Request frames of up to SPARE_MAX bytes: the largest one a thread let
 * go is kept, as the thread's value of spare_key, for the next one it
 * builds. A synchronous writer builds and completes its frames on its
 * own thread, and the frame of a 4 KiB write is larger than glibc's
 * per-thread cache takes: malloc() and free() ran some 300 instructions
 * a write (callgrind; docs/benchmarks.md). The key's destructor frees a
 * thread's spare when the thread ends (the main thread's stays reachable
 * until the process exits). Under a sanitizer every frame goes through
 * malloc() and free(), so that a use after the last put is still caught.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPARE_MAX 0u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPARE_MAX 0u
#endif
#endif
#ifndef SPARE_MAX
#define SPARE_MAX (16u * 1024u)
#endif

static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static int spare_ok;

static void spare_init(void)
{
    spare_ok = pthread_key_create(&spare_key, free) == 0;
}

/* Unloaded (dlclose()), the library leaves no destructor behind for
 * threads that end later; their spares are lost. */
__attribute__((destructor)) static void spare_fini(void)
{
    if (spare_ok)
        pthread_key_delete(spare_key);
}

tcp_frame_t *kvt__tcp_frame_alloc(size_t sz)
{
    tcp_frame_t *f = NULL;

    if (sz <= SPARE_MAX) {
        pthread_once(&spare_once, spare_init);
        if (spare_ok && (f = pthread_getspecific(spare_key)) != NULL) {
            if (f->cap >= sz)
                pthread_setspecific(spare_key, NULL);
            else
                f = NULL; /* too small: kept until a larger one goes */
        }
    }
    if (f == NULL) {
        f = malloc(sz);
        if (f == NULL)
            return NULL;
        sz = sz <= SPARE_MAX ? sz : 0;
    } else {
        sz = f->cap;
    }
    memset(f, 0, sizeof(*f));
    f->cap = (uint32_t)sz;
    return f;
}

void kvt__tcp_frame_put(tcp_frame_t *f)
{
    if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) == 1) {
        if (f->stage != NULL)
            kvt__tcp_stage_put(f->stage_tcp, f->stage, f->stage_len);
        free(f->lseg_dev1);
        /* Kept when the thread's spare is smaller, or it has none (cap
         * set: the frame came from kvt__tcp_frame_alloc(), after
         * spare_init()). */
        if (f->cap != 0 && spare_ok) {
            tcp_frame_t *old = pthread_getspecific(spare_key);
            if ((old == NULL || old->cap < f->cap) &&
                pthread_setspecific(spare_key, f) == 0) {
                free(old);
                return;
            }
        }
        free(f);
    }
}

void kvt__tcp_tx_free(tcp_tx_t *t)
{
    if (t->is_resp) {
        tcp_resp_t *r = (tcp_resp_t *)t;
        if (r->stage != NULL)
            kvt__tcp_stage_put(r->tcp, r->stage, r->stage_len);
        free(t);
    } else
        kvt__tcp_frame_put((tcp_frame_t *)t);
}

/*
 * Write as much of the queue as the socket takes (with @head_only, stop
 * after the first item). Called with tx_lock held. Returns KVT_OK (done,
 * or socket full: the worker's EPOLLOUT edge resumes) or
 * KVT_ERR_CONN_LOST.
 */
kvt_status_t kvt__tcp_flush_locked(tcp_conn_t *c, int head_only)
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
            kvt__tcp_resp_revalidate(tcp, (tcp_resp_t *)t);
        } else if (!t->is_resp) {
            tcp_frame_t *f = (tcp_frame_t *)t;
            if (f->type == KVT_WIRE_WRITE && f->lseg_dev1 != NULL)
                kvt__tcp_frame_ready(c, f);
        }
        mh.msg_iov = t->cur;
        mh.msg_iovlen = (size_t)(t->cnt > IOV_MAX ? IOV_MAX : t->cnt);
        /* One vector (an acknowledgement): send() spares the kernel the
         * import of a message and its vectors, 0.18 us of a 14 us round
         * trip here. */
        if (mh.msg_iovlen == 1)
            n = payload_send(c->fd, t->cur->iov_base, t->cur->iov_len,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
        else
            n = payload_sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (locked)
            kvt__memreg_unlock(tcp->reg);
        if (n < 0) {
            /* Interrupted: again at once, as no edge would report the
             * room that is still there. */
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return KVT_OK;
            KVT_LOG_D("send to %s: %s", c->who, strerror(errno));
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
            if (!t->is_resp && ((tcp_frame_t *)t)->stage != NULL) {
                /* All of it is in the socket: the pinned copy goes back. */
                tcp_frame_t *f = (tcp_frame_t *)t;
                kvt__tcp_stage_put(tcp, f->stage, f->stage_len);
                f->stage = NULL;
            }
            if (t->is_resp)
                atomic_fetch_sub_explicit(&c->out_bytes,
                                          ((tcp_resp_t *)t)->cost,
                                          memory_order_relaxed);
            else
                backlog_take_locked(c); /* a request frame: room for one */
            kvt__tcp_tx_free(t);
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
 *
 * The mask alone does not say that: want_out can go from 1 to 0 (a flush
 * emptied the queue without filling the socket, so no edge will come)
 * and back to 1 (a frame queued) before either call gets here, and both
 * then find EPOLLOUT registered already. So a 0 to 1 change also raises
 * out_kick (kvt__tcp_want_out_update()), and the next call polls the
 * socket again whatever the mask. (Input events report EPOLLOUT as well,
 * which hid this while the worker watched input; with a waiter reading
 * the connection, the frame it waited for stayed queued until the
 * transfer timeout: test_engine tcp_send_queue_never_stalls, two at
 * once.)
 */
void kvt__tcp_conn_events(tcp_conn_t *c)
{
    uint32_t mask = EPOLLET;
    int kick;

    pthread_mutex_lock(&c->ev_lock);
    /* Sequentially consistent: the callers that clear one of these flags
     * and then read the other without calling here (waiter attach and
     * detach, kvt__tcp_conn_enqueue()) rely on one of the two sides
     * seeing the other's write, this read included (check_timeouts()). */
    if (!atomic_load(&c->no_input) && !atomic_load(&c->idle_unwatched))
        mask |= EPOLLIN | EPOLLRDHUP;
    if (atomic_load_explicit(&c->want_out, memory_order_acquire))
        mask |= EPOLLOUT;
    kick = atomic_exchange_explicit(&c->out_kick, 0, memory_order_acq_rel) &&
           (mask & EPOLLOUT);
    if (!c->ev_closed && (mask != c->ev_mask || kick)) {
        struct epoll_event ev = {.events = mask, .data.ptr = c};
        if (epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
            c->ev_mask = mask;
    }
    pthread_mutex_unlock(&c->ev_lock);
}

/* After a flush with tx_lock held: whether output must be watched now.
 * Returns 1 when the flag changed (the caller then calls kvt__tcp_conn_events()
 * after dropping tx_lock); a change to 1 raises out_kick. */
int kvt__tcp_want_out_update(tcp_conn_t *c)
{
    int want = c->txq_head != NULL;
    /* Written under tx_lock only, so read and written here without a
     * locked exchange (which every request paid for). */
    if (atomic_load_explicit(&c->want_out, memory_order_relaxed) == want)
        return 0;
    atomic_store_explicit(&c->want_out, want, memory_order_release);
    if (want)
        atomic_store_explicit(&c->out_kick, 1, memory_order_release);
    return 1;
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
void kvt__tcp_send_resp(tcp_conn_t *c, tcp_resp_t *r)
{
    int changed;

    pthread_mutex_lock(&c->tx_lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->tx_lock);
        kvt__tcp_tx_free(&r->tx);
        return;
    }
    r->cost += r->stage_len;
    atomic_fetch_add_explicit(&c->out_bytes, r->cost, memory_order_relaxed);
    txq_append_locked(c, &r->tx);
    kvt__tcp_flush_locked(c, 0);
    changed = kvt__tcp_want_out_update(c);
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        kvt__tcp_conn_events(c);
}

tcp_resp_t *kvt__tcp_resp_alloc(size_t niov, size_t body_len, size_t nsegs)
{
    size_t sz = sizeof(tcp_resp_t) + niov * sizeof(struct iovec) + body_len +
                nsegs * sizeof(uint64_t);
    /* malloc() and memset(), not calloc(): glibc's calloc() (2.36, Debian
     * 12) bypasses the per-thread cache. The empty asm keeps the compiler
     * from merging the two into a calloc() call. */
    tcp_resp_t *r = malloc(sz);
    if (r == NULL)
        return NULL;
    __asm__ volatile("" : : "r"(r) : "memory");
    memset(r, 0, sz);
    r->tx.is_resp = 1;
    r->cost = sz;
    r->tx.cur = r->iov;
    r->tx.cnt = (int)niov;
    r->body = (uint8_t *)(r->iov + niov);
    if (nsegs)
        r->seg_addr = (uint64_t *)(r->body + body_len);
    return r;
}

void kvt__tcp_hdr_init(kvt__wire_hdr_t *h, uint8_t type, uint64_t req_id)
{
    memset(h, 0, sizeof(*h));
    h->ver_major = KVT_WIRE_VERSION_MAJOR;
    h->ver_minor = KVT_WIRE_VERSION_MINOR;
    h->type = type;
    h->req_id = req_id;
}

/*
 * Target side: a response that is a header alone (@hdr, encoded), sent
 * from the caller's buffer while nothing waits in the send queue, which
 * spares it the allocation and the queue (a 4 KiB synchronous write:
 * docs/benchmarks.md); what the socket does not take now is queued as any
 * response is. Only the connection's worker sends its responses, so
 * nothing is queued between the attempt and the fallback.
 */
void kvt__tcp_send_hdr(tcp_conn_t *c, const uint8_t *hdr)
{
    ssize_t n = 0;
    tcp_resp_t *r;

    pthread_mutex_lock(&c->tx_lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->tx_lock);
        return;
    }
    if (c->txq_head == NULL) {
        do {
            n = payload_send(c->fd, hdr, KVT_WIRE_HDR_LEN,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN) {
            /* As kvt__tcp_flush_locked() does: the worker sees the
             * shutdown and fails the connection. */
            KVT_LOG_D("send to %s: %s", c->who, strerror(errno));
            shutdown(c->fd, SHUT_RDWR);
            n = KVT_WIRE_HDR_LEN;
        }
        if (n == KVT_WIRE_HDR_LEN) {
            pthread_mutex_unlock(&c->tx_lock);
            return;
        }
        if (n < 0)
            n = 0;
    }
    pthread_mutex_unlock(&c->tx_lock);
    r = kvt__tcp_resp_alloc(1, 0, 0);
    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    memcpy(r->hdr, hdr, KVT_WIRE_HDR_LEN);
    r->iov[0] =
        (struct iovec){r->hdr + n, KVT_WIRE_HDR_LEN - (size_t)n}; /* the rest */
    kvt__tcp_send_resp(c, r);
}

/* A response with a body only (acks, descriptors, errors); with none,
 * the header alone (kvt__tcp_send_hdr()). */
void kvt__tcp_send_simple(tcp_conn_t *c, uint8_t type, uint64_t req_id,
                          kvt_status_t status, const void *body, size_t len)
{
    kvt__wire_hdr_t h;
    tcp_resp_t *r;

    if (len == 0) {
        uint8_t hdr[KVT_WIRE_HDR_LEN];
        kvt__tcp_hdr_init(&h, type, req_id);
        h.status = status;
        kvt__wire_hdr_encode(&h, hdr);
        kvt__tcp_send_hdr(c, hdr);
        return;
    }
    r = kvt__tcp_resp_alloc(2, len, 0);
    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    kvt__tcp_hdr_init(&h, type, req_id);
    h.status = status;
    h.body_len = (uint32_t)len;
    kvt__wire_hdr_encode(&h, r->hdr);
    memcpy(r->body, body, len);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, len};
    r->tx.cnt = 2;
    kvt__tcp_send_resp(c, r);
}

/* Put @f on live connection @c (tx_lock held, its bytes counted in
 * c->inflight): the outstanding FIFO and the send queue in one step. */
static void conn_append_locked(tcp_conn_t *c, tcp_frame_t *f)
{
    pthread_mutex_lock(&c->out_lock);
    f->next_out = NULL;
    if (c->out_tail)
        c->out_tail->next_out = f;
    else
        c->out_head = f;
    c->out_tail = f;
    pthread_mutex_unlock(&c->out_lock);
    atomic_fetch_add_explicit(&c->enq_seq, 1, memory_order_relaxed);
    if (c->sess->nconns > 1) /* only read where there can be a backlog */
        atomic_fetch_add_explicit(&c->txq_frames, 1, memory_order_relaxed);
    txq_append_locked(c, &f->tx);
}

/* Put @f on connection @c: FIFO and send queue in one step, then send what
 * the socket takes from this thread. */
void kvt__tcp_conn_enqueue(tcp_conn_t *c, tcp_frame_t *f)
{
    int dead, changed = 0;

    atomic_fetch_add_explicit(&c->inflight, f->bytes, memory_order_relaxed);
    pthread_mutex_lock(&c->tx_lock);
    dead = c->dead;
    if (!dead) {
        conn_append_locked(c, f);
        /* An idle connection sends a request from the calling thread,
         * which saves a wake-up, unless it is a WRITE with more than
         * INLINE_MAX bytes of payload. That one is the worker's, as
         * is anything the socket does not take now and every later frame:
         * copied from here, it would hold the submitting thread for the
         * copy, and one submitting thread would do the copying for every
         * connection while their workers idle (1 MiB writes over two
         * connections: 0.95 of the matched ceiling against 0.92 when the
         * submitting thread sent them; docs/benchmarks.md). */
        if (c->txq_head == &f->tx && kvt__tcp_sends_inline(f))
            kvt__tcp_flush_locked(c, 1);
        changed = kvt__tcp_want_out_update(c);
        /* Its response is read by an attached waiter or the worker: input
         * left unwatched while idle is watched again, unless a waiter is
         * attached (no_input), which reads it and leaves input unwatched
         * either way. After the frame is on out_head: see
         * waiter_detach_locked(), which watches input again itself when
         * it finds the flag down after raising no_input's (one of the two
         * sees the other's write). */
        if (atomic_load_explicit(&c->idle_unwatched, memory_order_seq_cst) &&
            atomic_exchange(&c->idle_unwatched, 0) &&
            !atomic_load_explicit(&c->no_input, memory_order_seq_cst))
            changed = 1;
    }
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        kvt__tcp_conn_events(c);
    if (dead) {
        /* Its worker may not have killed the session yet (it marks the
         * connection dead first): killed here, so that a caller told of
         * the loss finds the session gone, and a segment opened again
         * dials the peer anew instead of finding this one still live. */
        int32_t why = atomic_load(&c->fail_status);
        kvt__tcp_session_kill(&c->sess->base, why ? why : KVT_ERR_CONN_LOST);
        kvt__tcp_frame_complete(c, f, atomic_load(&c->sess->base.dead), NULL);
        kvt__tcp_frame_put(f); /* the send queue's reference, never taken up */
    }
}

/*
 * The backlog. Frames of a submission are put on connections while their
 * send queues hold fewer than TXQ_FRAMES request frames, and wait in the
 * session's backlog beyond that; a connection that has written a request
 * frame takes the next one (backlog_take_locked()). Placed all at once
 * (as they were), a batch's frames were split between the connections
 * when it was submitted, and a connection that got through its share
 * first idled until the batch was complete and the next one submitted:
 * with 1 MiB writes over two connections, a batch of 32 in flight behind
 * another, one of the two CPUs idled for up to 3 ms at a time while the
 * other connection finished its share (perf sched, docs/benchmarks.md).
 *
 * No frame is lost in the backlog: frames go there only while every
 * connection holds TXQ_FRAMES of them, each of which takes a frame from
 * there when written (lowering its count and looking at the backlog under
 * bl_lock, as the choice here is made, so that neither misses the other);
 * a failed connection kills the session, which fails the backlog
 * (kvt__tcp_backlog_fail()) after marking the session dead, and no frame
 * goes to the backlog of a dead session.
 */

/* Returns the connection for @f, or NULL when @f went to the backlog. */
tcp_conn_t *kvt__tcp_place(tcp_session_t *s, tcp_frame_t *f)
{
    tcp_conn_t *c = NULL;

    if (s->nconns < 2)
        return s->conns[0];
    pthread_mutex_lock(&s->bl_lock);
    if (atomic_load_explicit(&s->base.dead, memory_order_acquire)) {
        pthread_mutex_unlock(&s->bl_lock);
        return kvt__tcp_pick_conn(s, 0);
    }
    if (s->bl_head == NULL)
        c = least_loaded(s, 0, 1);
    if (c == NULL) {
        f->tx.next = NULL;
        if (s->bl_tail)
            s->bl_tail->next = &f->tx;
        else
            s->bl_head = &f->tx;
        s->bl_tail = &f->tx;
    }
    pthread_mutex_unlock(&s->bl_lock);
    return c;
}

/* @c wrote a request frame (tx_lock held, @c live): one fewer in its send
 * queue, and the next frames of the backlog while there is room. */
static void backlog_take_locked(tcp_conn_t *c)
{
    tcp_session_t *s = c->sess;

    if (s->nconns < 2) /* no backlog, no count (conn_append_locked()) */
        return;
    pthread_mutex_lock(&s->bl_lock);
    atomic_fetch_sub_explicit(&c->txq_frames, 1, memory_order_relaxed);
    while (s->bl_head != NULL &&
           atomic_load_explicit(&c->txq_frames, memory_order_relaxed) <
               TXQ_FRAMES) {
        tcp_frame_t *f = (tcp_frame_t *)s->bl_head;
        s->bl_head = f->tx.next;
        if (s->bl_head == NULL)
            s->bl_tail = NULL;
        /* Under bl_lock, so that a NOTIFY that found the backlog empty
         * counts this frame in enq_seq (kvt__tcp_backlog_spread()). */
        atomic_fetch_add_explicit(&c->inflight, f->bytes, memory_order_relaxed);
        conn_append_locked(c, f);
    }
    pthread_mutex_unlock(&s->bl_lock);
}

static tcp_tx_t *backlog_detach(tcp_session_t *s)
{
    tcp_tx_t *t;

    pthread_mutex_lock(&s->bl_lock);
    t = s->bl_head;
    s->bl_head = s->bl_tail = NULL;
    pthread_mutex_unlock(&s->bl_lock);
    return t;
}

/* Before a NOTIFY takes its snapshot of enq_seq: every frame of the
 * backlog on a connection, so that the NOTIFY waits for them too. */
void kvt__tcp_backlog_spread(tcp_session_t *s)
{
    tcp_tx_t *t = backlog_detach(s);

    while (t != NULL) {
        tcp_tx_t *n = t->next;
        kvt__tcp_conn_enqueue(kvt__tcp_pick_conn(s, 0), (tcp_frame_t *)t);
        t = n;
    }
}

/* The session died (base.dead set): the backlog fails with @why. */
void kvt__tcp_backlog_fail(tcp_session_t *s, kvt_status_t why)
{
    tcp_tx_t *t = backlog_detach(s);

    while (t != NULL) {
        tcp_frame_t *f = (tcp_frame_t *)t;
        t = t->next;
        kvt__tcp_frame_complete(NULL, f, why, NULL); /* on no connection */
        kvt__tcp_frame_put(f); /* never queued for sending */
    }
}

int kvt__tcp_notify_ready(tcp_session_t *s, const tcp_frame_t *f)
{
    for (unsigned i = 0; i < s->nconns; i++)
        if (atomic_load_explicit(&s->conns[i]->done_seq, memory_order_acquire) <
            f->snap[i])
            return 0;
    return 1;
}

/* Send the parked notifications whose preceding writes have all landed. */
void kvt__tcp_release_parked(tcp_session_t *s)
{
    tcp_frame_t *ready = NULL, **tail = &ready;

    pthread_mutex_lock(&s->lock);
    while (s->parked_head != NULL && kvt__tcp_notify_ready(s, s->parked_head)) {
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
        kvt__tcp_conn_enqueue(s->conns[0], ready);
        ready = n;
    }
}

/* The least loaded connection of @s, the first of a round-robin walk
 * among equals; @for_waiter (the submitting thread will attach itself as
 * the reader): among equals, one whose input is left unwatched, which
 * spares the two epoll_ctl() calls of moving the attachment; @with_room:
 * only among those whose send queue holds fewer than TXQ_FRAMES request
 * frames (NULL when none does). */
static tcp_conn_t *least_loaded(tcp_session_t *s, int for_waiter, int with_room)
{
    tcp_conn_t *best = NULL;
    uint64_t best_load = UINT64_MAX;
    int best_unwatched = 0;
    /* A hint, not a count: two threads that read the same value start
     * their walks at the same connection, which costs evenness only; a
     * locked increment cost every submission a read-modify-write. */
    unsigned start = atomic_load_explicit(&s->rr, memory_order_relaxed);

    atomic_store_explicit(&s->rr, start + 1, memory_order_relaxed);

    for (unsigned k = 0; k < s->nconns; k++) {
        tcp_conn_t *c = s->conns[(start + k) % s->nconns];
        uint64_t load =
            atomic_load_explicit(&c->inflight, memory_order_relaxed);
        int unwatched =
            for_waiter &&
            atomic_load_explicit(&c->idle_unwatched, memory_order_relaxed);
        if (with_room &&
            atomic_load_explicit(&c->txq_frames, memory_order_relaxed) >=
                TXQ_FRAMES)
            continue;
        if (load < best_load ||
            (load == best_load && unwatched && !best_unwatched)) {
            best = c;
            best_load = load;
            best_unwatched = unwatched;
        }
    }
    return best;
}

tcp_conn_t *kvt__tcp_pick_conn(tcp_session_t *s, int for_waiter)
{
    return least_loaded(s, for_waiter, 0);
}
