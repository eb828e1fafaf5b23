/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connections and sessions: a connection's life on its worker (attach,
 * fail, reap), data connections handed over by the control plane, and a
 * session's open, kill and destroy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

static tcp_conn_t *conn_new(tcp_worker_t *w, int fd, int outbound)
{
    tcp_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->outbound = (uint8_t)outbound;
    c->w = w;
    c->rx_lowat = 1;
    pthread_mutex_init(&c->tx_lock, NULL);
    pthread_mutex_init(&c->out_lock, NULL);
    pthread_mutex_init(&c->rx_lock, NULL);
    pthread_mutex_init(&c->ev_lock, NULL);
    return c;
}

static void conn_free(tcp_conn_t *c)
{
    /* Its device copies complete before it leaves the list that
     * unregistrations wait on; the staging is freed only once it is off
     * that list (an unregistration may be waiting on its stream). */
    kvt__tcp_dev_quiesce(c);
    if (c->listed)
        kvt__tcp_inbound_del(c->w->tcp, c);
    kvt__tcp_conn_stage_free(c);
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

int kvt__tcp_worker_attach(tcp_worker_t *w, tcp_conn_t *c)
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
 * takes it off between two rounds of events (kvt__tcp_worker_reap()), when no
 * event of its last round can still name it, and the last connection of
 * a session reaped releases the session. Called with the connection out
 * of the epoll set already.
 */
static void worker_reap_later(tcp_worker_t *w, tcp_conn_t *c)
{
    int other = !pthread_equal(pthread_self(), w->thread);

    pthread_mutex_lock(&w->lock);
    c->dnext = atomic_load_explicit(&w->reap, memory_order_relaxed);
    atomic_store_explicit(&w->reap, c, memory_order_relaxed);
    pthread_mutex_unlock(&w->lock);
    if (other) {
        uint64_t one = 1;
        if (write(w->evfd, &one, sizeof(one)) < 0)
            (void)0;
    }
}

void kvt__tcp_worker_reap(tcp_worker_t *w)
{
    tcp_conn_t *c, *next;

    /* Nothing to reap, the common case: no lock. A connection put on the
     * list as this reads it is reaped on the next turn (another thread
     * wakes the worker after putting it there). */
    if (atomic_load_explicit(&w->reap, memory_order_relaxed) == NULL)
        return;
    pthread_mutex_lock(&w->lock);
    c = atomic_load_explicit(&w->reap, memory_order_relaxed);
    atomic_store_explicit(&w->reap, NULL, memory_order_relaxed);
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
void kvt__tcp_conn_fail(tcp_conn_t *c, kvt_status_t st)
{
    tcp_frame_t *list;
    tcp_tx_t *t, *tn;
    int fd, idle;

    pthread_mutex_lock(&c->tx_lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->tx_lock);
        return;
    }
    {
        /* The reason, for a submitting thread that finds the connection
         * dead before the session is killed (kvt__tcp_conn_enqueue()). */
        int32_t z = 0;
        atomic_compare_exchange_strong(&c->fail_status, &z, st);
    }
    c->dead = 1;
    t = c->txq_head;
    idle = t == NULL;
    c->txq_head = c->txq_tail = NULL;
    kvt__tcp_tx_quiesce(c, t); /* copies ahead into the frames' buffers */
    pthread_mutex_unlock(&c->tx_lock);
    for (; t != NULL; t = tn) {
        tn = t->next;
        kvt__tcp_tx_free(t);
    }
    pthread_mutex_lock(&c->out_lock);
    list = c->out_head;
    c->out_head = c->out_tail = NULL;
    pthread_mutex_unlock(&c->out_lock);
    idle = idle && list == NULL;

    worker_detach(c->w, c);
    if (c->outbound) {
        tcp_session_t *s = c->sess;
        /* A peer that closes while nothing is in flight on the
         * connection (it exited, or destroyed its engine) closed it in
         * order: nothing failed, and the next transfer opens afresh. */
        if (st == KVT_ERR_CONN_LOST && idle)
            KVT_LOG_I("connection %u to %s closed by the peer, nothing in "
                      "flight",
                      c->index, s->base.name);
        else if (st != KVT_ERR_CANCELED)
            KVT_LOG_W("connection %u to %s failed: %s", c->index, s->base.name,
                      kvt_status_str(st));
        c->rx_dead = 1;
        kvt__tcp_session_kill(&s->base, st);
        if (c->waiters == 0) {
            pthread_mutex_lock(&s->lock);
            fd = c->fd;
            c->fd = -1;
            pthread_mutex_unlock(&s->lock);
            close(fd);
        }
        /* A READ cut off mid-payload may have copies into device memory
         * queued: they complete before its buffer is handed back. */
        kvt__tcp_dev_quiesce(c);
        while (list != NULL) {
            tcp_frame_t *n = list->next_out;
            kvt__tcp_frame_complete(c, list, st, NULL);
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
        KVT_LOG_D("inbound connection from %s closed: %s", c->who,
                  kvt_status_str(st));
        close(c->fd);
        conn_free(c);
    }
}

/*
 * A data connection the control plane accepted (its HELLO answered): it
 * goes to the next worker in turn, which owns it from then on.
 */
kvt_status_t kvt__tcp_accept(kvt__tl_t *tl, int fd,
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
    {
        char esc[KVT_LOG_ESC_MAX], addr[KVT_SOCK_ADDR_MAX];
        snprintf(c->who, sizeof(c->who), "\"%s\" at %s",
                 kvt__log_escape(esc, sizeof(esc), hello->name),
                 kvt__sock_peer_str(fd, addr, sizeof(addr)));
    }
    kvt__tcp_inbound_add(tcp, c, hello);
    if (kvt__tcp_worker_attach(w, c) != 0) {
        worker_detach(w, c);
        conn_free(c);
        close(fd);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

void kvt__tcp_session_kill(kvt__session_t *base, kvt_status_t why)
{
    tcp_session_t *s = (tcp_session_t *)base;
    tcp_frame_t *parked;
    int32_t zero = 0;

    if (!atomic_compare_exchange_strong(&base->dead, &zero, why))
        return;
    kvt__tcp_live_del(s);
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
        kvt__tcp_frame_complete(NULL, parked, why, NULL);
        kvt__tcp_frame_put(parked); /* never queued for sending */
        parked = n;
    }
    kvt__tcp_backlog_fail(s, why);
}

/*
 * Free the session: every connection is reaped (the session released
 * itself), or the workers have stopped (engine teardown), so no worker
 * and no waiter uses any of them.
 */
void kvt__tcp_session_destroy(kvt__session_t *base)
{
    tcp_session_t *s = (tcp_session_t *)base;

    kvt__tcp_live_del(s);
    /* Empty unless the session never died (killing it fails the backlog). */
    kvt__tcp_backlog_fail(s, KVT_ERR_CANCELED);
    for (unsigned i = 0; i < s->nconns; i++) {
        if (s->conns[i] == NULL)
            continue;
        if (s->conns[i]->fd >= 0) {
            /* Workers already stopped. */
            pthread_mutex_lock(&s->conns[i]->rx_lock);
            kvt__tcp_conn_fail(s->conns[i], KVT_ERR_CANCELED);
            pthread_mutex_unlock(&s->conns[i]->rx_lock);
        }
        conn_free(s->conns[i]);
    }
    pthread_mutex_destroy(&s->bl_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

kvt_status_t kvt__tcp_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                           kvt__session_t **s_p, const char **why_p)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;
    kvt_engine_h e = tcp->e;
    const char *name = peer->name, *addr = peer->addr;
    uint64_t deadline = kvt__now_ns() + tcp->cfg->connect_timeout_ms * 1000000;
    uint64_t sid;
    uint32_t fence;
    tcp_session_t *s;
    kvt_status_t st;
    unsigned i;

    *s_p = NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVT_ERR_NO_MEMORY;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->bl_lock, NULL);
    s->tcp = tcp;
    s->nconns = tcp->cfg->conns_per_peer;
    fence = kvt__tcp_live_add(tcp, s, name);
    sid = (uint64_t)tcp->inst << 32 | s->counter;

    for (i = 0; i < s->nconns; i++) {
        kvt__wire_hello_t hello = {.session_id = sid,
                                   .conn_index = i,
                                   .nconns = s->nconns,
                                   .transport = KVT_TRANSPORT_TCP,
                                   .fence = fence};
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
        {
            char esc[KVT_LOG_ESC_MAX];
            snprintf(s->conns[i]->who, sizeof(s->conns[i]->who), "\"%s\"",
                     kvt__log_escape(esc, sizeof(esc), name));
        }
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
            /* Left blocking: every call but a waiter's read passes
             * MSG_DONTWAIT (kvt__tcp_progress()). */
        }
        for (i = 0; i < s->nconns; i++) {
            if (kvt__tcp_worker_attach(s->conns[i]->w, s->conns[i]) != 0)
                break;
        }
        if (i < s->nconns) {
            unsigned left = s->nconns - i;
            worker_detach(s->conns[i]->w, s->conns[i]);
            s->conns[i]->attached = 0;
            kvt__tcp_session_kill(&s->base, KVT_ERR_IO);
            for (; i < s->nconns; i++) {
                pthread_mutex_lock(&s->conns[i]->rx_lock);
                kvt__tcp_conn_fail(s->conns[i], KVT_ERR_IO);
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
    kvt__tcp_live_del(s);
    pthread_mutex_destroy(&s->bl_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return st;
}
