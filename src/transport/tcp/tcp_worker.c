/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker threads: epoll loops that own their connections, the
 * transfer timeout, and waiter progress (a thread waiting on a batch reads
 * its connection itself).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/thread.h"
#include "util/time.h"

typedef void (*timeout_hook_t)(void *conn);
static _Atomic timeout_hook_t timeout_hook;

void kvt__tcp_timeout_hook_set(void (*fn)(void *conn))
{
    atomic_store(&timeout_hook, fn);
}

static void check_timeouts(tcp_worker_t *w, uint64_t now)
{
    tcp_conn_t *expired[64];
    size_t n = 0;

    pthread_mutex_lock(&w->lock);
    for (tcp_conn_t *c = w->conns; c != NULL; c = c->wnext) {
        if (!c->outbound)
            continue;
        /* Input left unwatched while idle is watched again each tick, so
         * that an end of stream or a reset is noticed (ev_lock is a leaf
         * lock). */
        if (atomic_load_explicit(&c->idle_unwatched, memory_order_relaxed) &&
            atomic_exchange(&c->idle_unwatched, 0))
            kvt__tcp_conn_events(c);
        if (n == 64)
            continue;
        pthread_mutex_lock(&c->out_lock);
        if (c->out_head != NULL && now > c->out_head->deadline)
            expired[n++] = c;
        pthread_mutex_unlock(&c->out_lock);
    }
    pthread_mutex_unlock(&w->lock);
    /* The locks were let go: a waiter attached to a connection (which
     * completes frames under rx_lock) may have completed the frame since,
     * and a connection should not fail for a frame answered in time. So
     * the look is made again under rx_lock, which keeps every reader out
     * until the connection is failed: whatever heads it now must be past
     * its deadline too. This narrows the window without closing it: an
     * attached waiter receives a response before it takes rx_lock, and
     * a response read but not yet taken in is still failed with its
     * connection, as any response that comes after the deadline. (The
     * connection stays allocated meanwhile: its session lives until this
     * worker has reaped it, between rounds.) */
    for (size_t i = 0; i < n; i++) {
        tcp_conn_t *c = expired[i];
        timeout_hook_t hook =
            atomic_load_explicit(&timeout_hook, memory_order_relaxed);
        int late;

        if (hook != NULL)
            hook(c);
        pthread_mutex_lock(&c->rx_lock);
        pthread_mutex_lock(&c->out_lock);
        late = c->out_head != NULL && now > c->out_head->deadline;
        pthread_mutex_unlock(&c->out_lock);
        if (late) {
            KVT_LOG_W("transfer to %s timed out after %.1f s",
                      c->sess->base.name,
                      (double)w->tcp->cfg->timeout_ns / 1e9);
            kvt__tcp_conn_fail(c, KVT_ERR_TIMEDOUT);
        }
        pthread_mutex_unlock(&c->rx_lock);
    }
}

static void conn_tx_event(tcp_conn_t *c)
{
    int changed = 0;

    pthread_mutex_lock(&c->tx_lock);
    if (!c->dead) {
        kvt__tcp_flush_locked(c, 0);
        changed = kvt__tcp_want_out_update(c);
    }
    pthread_mutex_unlock(&c->tx_lock);
    if (changed)
        kvt__tcp_conn_events(c);
}

void *kvt__tcp_worker_main(void *arg)
{
    tcp_worker_t *w = arg;
    kvt__tcp_t *tcp = w->tcp;
    struct epoll_event evs[64];

    kvt__thread_name("kvt-tcp-w%u", w->id);
    while (!atomic_load_explicit(&tcp->stopping, memory_order_acquire)) {
        int n, ticked = 0;

        kvt__tcp_worker_reap(w);
        if (atomic_load_explicit(&w->nfenced, memory_order_acquire) != 0)
            kvt__tcp_fence_sweep(w);
        /* No timeout: an epoll_wait() that may time out arms a timer
         * each time it sleeps (0.35 us of a 14 us round trip, measured);
         * the tick comes from tfd. */
        n = epoll_wait(w->epfd, evs, 64, -1);

#ifdef KVT_TSAN
        if (n > 0) {
            /* Pairs with the unlock in kvt__tcp_worker_attach(), for
             * ThreadSanitizer, which does not model epoll: whatever the
             * attaching thread wrote to a connection before adding it to
             * the epoll set is ordered before the events that name it (the
             * kernel's own lock on the set orders them in every build). */
            pthread_mutex_lock(&w->lock);
            pthread_mutex_unlock(&w->lock);
        }
#endif

        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)w || p == (void *)&w->tfd) {
                uint64_t v;
                ticked |= p != (void *)w;
                if (read(p == (void *)w ? w->evfd : w->tfd, &v, sizeof(v)) < 0)
                    (void)0;
            } else {
                tcp_conn_t *c = p;
                if (evs[i].events & EPOLLOUT)
                    conn_tx_event(c);
                if (!c->outbound) {
                    /* Held back (backpressure), a connection reads again
                     * when its responses drain: no input edge comes for
                     * what already waits in the socket. A broken one
                     * goes now: it would not be read to its end. */
                    if (c->rx_held && (evs[i].events & (EPOLLERR | EPOLLHUP)))
                        kvt__tcp_conn_fail(c, KVT_ERR_CONN_LOST);
                    else if ((evs[i].events &
                              (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) ||
                             c->rx_held)
                        kvt__tcp_conn_rx(c, NULL, evs[i].events);
                    continue;
                }
                if (!(evs[i].events &
                      (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
                    continue;
                pthread_mutex_lock(&c->rx_lock);
                if (c->waiters == 0 && !c->rx_dead)
                    kvt__tcp_conn_rx(c, NULL, evs[i].events);
                pthread_mutex_unlock(&c->rx_lock);
            }
        }
        /* The clock is read on the tick alone: the timer's expiry is
         * reported whatever else is ready. */
        if (ticked)
            check_timeouts(w, kvt__now_ns());
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
            kvt__tcp_conn_fail(c, KVT_ERR_CANCELED); /* frees it */
            continue;
        }
        /* Outbound connections outlive their failure. */
        pthread_mutex_lock(&c->rx_lock);
        kvt__tcp_conn_fail(c, KVT_ERR_CANCELED);
        pthread_mutex_unlock(&c->rx_lock);
    }
    return NULL;
}

/*
 * Attach the calling thread to outbound connection @c as the reader of its
 * responses: the worker stops watching its input until the last waiter
 * detaches (waiter_detach()). Returns 0, or -1 when it cannot: the
 * connection is dead, or another thread already reads it (a second
 * waiter polling the same socket could sleep on after the first had read
 * the response that completes its batch; other waiters sleep on their
 * batches, woken by whoever completes them). The descriptor stays open
 * while a waiter is attached. With @try_only, -1 as well when another
 * thread holds rx_lock now (reading a response into place): a submitting
 * thread does not wait for that.
 */
int kvt__tcp_waiter_attach(tcp_conn_t *c, int try_only)
{
    if (try_only) {
        if (pthread_mutex_trylock(&c->rx_lock) != 0)
            return -1;
    } else {
        pthread_mutex_lock(&c->rx_lock);
    }
    if (c->rx_dead || c->fd < 0 || c->waiters > 0) {
        pthread_mutex_unlock(&c->rx_lock);
        return -1;
    }
    if (c->waiters++ == 0) {
        /* Spare the worker a wake-up; input that came before this is
         * still readable, and the waiter's poll() sees it. Input left
         * unwatched while idle is unwatched already: the mask stays as it
         * is, and whoever watches it again finds no_input up
         * (kvt__tcp_conn_enqueue(), check_timeouts()). */
        atomic_store(&c->no_input, 1);
        if (!atomic_load(&c->idle_unwatched))
            kvt__tcp_conn_events(c);
    }
    pthread_mutex_unlock(&c->rx_lock);
    return 0;
}

/* The calling thread stops reading @c (rx_lock held). */
static void waiter_detach_locked(tcp_conn_t *c)
{
    if (--c->waiters == 0) {
        if (c->rx_dead) {
            /* Failed while attached: kvt__tcp_conn_fail() left the
             * descriptor to the last waiter. */
            tcp_session_t *s = c->sess;
            int fd;
            pthread_mutex_lock(&s->lock);
            fd = c->fd;
            c->fd = -1;
            pthread_mutex_unlock(&s->lock);
            close(fd);
        } else {
            /* Nothing in flight: input stays unwatched until the next
             * frame or the worker's tick (tcp_conn_t.idle_unwatched), so
             * that the next synchronous transfer attaches for free. The
             * flag goes up before out_head is read: a frame enqueued after
             * that read sees it (kvt__tcp_conn_enqueue()), and one
             * enqueued before is seen here. */
            int busy;
            atomic_store_explicit(&c->idle_unwatched, 1, memory_order_seq_cst);
            pthread_mutex_lock(&c->out_lock);
            busy = c->out_head != NULL;
            pthread_mutex_unlock(&c->out_lock);
            if (busy)
                atomic_store(&c->idle_unwatched, 0);
            /* Watching input again reports to the worker whatever is
             * left unread (EPOLL_CTL_MOD polls the socket). While input
             * stays unwatched (idle) the mask is as it is: a frame
             * enqueued from now on clears the flag and, finding no_input
             * down, watches input itself (kvt__tcp_conn_enqueue(); one of
             * the two sees the other's write). */
            atomic_store(&c->no_input, 0);
            if (!atomic_load(&c->idle_unwatched))
                kvt__tcp_conn_events(c);
        }
    }
}

static void waiter_detach(tcp_conn_t *c)
{
    pthread_mutex_lock(&c->rx_lock);
    waiter_detach_locked(c);
    pthread_mutex_unlock(&c->rx_lock);
}

/* An attachment made at submission (kvt__sub_t.attached) that no
 * progress() call takes over. */
void kvt__tcp_detach(kvt__session_t *base, void *where)
{
    (void)base;
    waiter_detach(where);
}

/*
 * Waiter progress (see the top of this file): read connection @where from
 * this thread until *@until reads 0 or @deadline_ns passes; @attached: the
 * thread attached itself when it submitted (kvt__tcp_waiter_attach()).
 * KVT_ERR_AGAIN when the connection is dead or read by another waiter:
 * the caller sleeps on the batch instead.
 *
 * Without a deadline the thread sleeps in the read itself, into the
 * read-ahead buffer, which no other thread touches while it is attached:
 * one system call per response instead of a poll() and a read. The
 * connection is blocking for this read alone (every other call passes
 * MSG_DONTWAIT). A failure of the connection, the transfer timeout's
 * included, shuts the socket down, which ends the read. With a deadline,
 * or with bytes still read ahead, it polls instead (a receive timeout on
 * the socket would cost every sleep a timer: 0.25 us of a 14 us
 * round trip, measured).
 */
kvt_status_t kvt__tcp_progress(kvt__session_t *base, void *where,
                               const _Atomic uint32_t *until,
                               uint64_t deadline_ns, int attached)
{
    tcp_conn_t *c = where;
    int fd, empty;

    (void)base;
    if (!attached && kvt__tcp_waiter_attach(c, 0) != 0)
        return KVT_ERR_AGAIN;
    /* Attached (under rx_lock, which ordered these after their last
     * writes): the descriptor stays open and as it is, and only this
     * thread reads or moves the read-ahead buffer, until it detaches. */
    fd = c->fd;
    empty = c->rx_pre_off == c->rx_pre_len;

    while (atomic_load_explicit(until, memory_order_acquire) != 0) {
        uint64_t left = UINT64_MAX;
        ssize_t n = -1;
        int err = 0;

        if (deadline_ns != 0) {
            uint64_t now = kvt__now_ns();
            if (now >= deadline_ns)
                break;
            left = deadline_ns - now;
        }
        if (empty && deadline_ns == 0) {
            n = recv(fd, c->rx_pre, RX_PRE, 0);
            if (n < 0) {
                err = errno;
                if (err == EINTR)
                    continue;
                if (err == EAGAIN || err == EWOULDBLOCK) {
                    empty = 0; /* not blocking after all: poll */
                    continue;
                }
            }
        } else {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            int ms = left == UINT64_MAX ? -1 : (int)((left + 999999) / 1000000);
            if (poll(&p, 1, ms) < 0 && errno != EINTR)
                break;
        }
        pthread_mutex_lock(&c->rx_lock);
        if (c->rx_dead) {
            /* Its frames are completed; the caller sleeps on the rest. */
            pthread_mutex_unlock(&c->rx_lock);
            break;
        }
        if (n > 0) {
            c->rx_pre_off = 0;
            c->rx_pre_len = (uint32_t)n;
        }
        if (err != 0) {
            /* The read took the socket's error: say so here, no later
             * read would. */
            int32_t why = atomic_load(&c->fail_status);
            kvt__tcp_conn_fail(c, why != 0 ? why : KVT_ERR_CONN_LOST);
        } else {
            /* A short read drained the socket: the next turn sleeps in
             * the read rather than ask again (EPOLLIN says so). */
            kvt__tcp_conn_rx(c, until, EPOLLIN);
        }
        empty = c->rx_pre_off == c->rx_pre_len;
        if (atomic_load_explicit(until, memory_order_acquire) == 0) {
            /* Done: leave in the same hold of rx_lock. */
            waiter_detach_locked(c);
            pthread_mutex_unlock(&c->rx_lock);
            return KVT_OK;
        }
        pthread_mutex_unlock(&c->rx_lock);
    }
    waiter_detach(c);
    return KVT_OK;
}
