/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A worker thread: takes what other threads hand it (its inbox), posts
 * it, drives ucp's progress, serves its sessions (FIFO, acknowledgements,
 * timeouts, release), and sleeps on ucp's event descriptor and its own
 * eventfd when nothing is in flight, never spinning a core while idle.
 */
#include <errno.h>
#include <string.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/ucx/ucx.h"
#include "util/log.h"
#include "util/thread.h"
#include "util/time.h"
#include "util/tsan.h"

#define TICK_NS (10ull * 1000000ull) /* timeouts are checked this often */
#define SPIN_NS (20ull * 1000ull)    /* polled before sleeping, when busy */

void kvt__ucx_wake(ucx_worker_t *wk)
{
    uint64_t one = 1;

    if (write(wk->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        KVT_LOG_E("ucx: cannot wake a worker: %s", strerror(errno));
}

void kvt__ucx_post(ucx_worker_t *wk, ucx_msg_t *m, int wake)
{
    int was_empty;

    /* A message about a session holds it until handled (it may be
     * closed meanwhile). */
    if (m->s != NULL)
        kvt__session_hold(&m->s->base);
    m->next = NULL;
    pthread_mutex_lock(&wk->lock);
    was_empty = wk->in_head == NULL;
    if (wk->in_tail)
        wk->in_tail->next = m;
    else
        wk->in_head = m;
    wk->in_tail = m;
    pthread_mutex_unlock(&wk->lock);
    if (wake && (was_empty || atomic_exchange(&wk->need_wake, 0)))
        kvt__ucx_wake(wk);
    else if (!wake)
        atomic_store(&wk->need_wake, 1);
}

/*
 * Drive ucp until it has nothing to do. Over UCX's tcp and shared memory
 * (no RDMA) ucp copies peers' writes into this engine's memory here; the
 * engine's landed counter orders those copies before what
 * kvt_notify_recv() returns from now on.
 */
static unsigned progress(ucx_worker_t *wk)
{
    unsigned n = 0;

    /* Under ThreadSanitizer the memory accesses in ucp's progress are not
     * tracked (its synchronisation still is): over UCX's tcp and shared
     * memory ucp copies peers' writes into registered memory there, which
     * the peers' protocol orders with the application's own accesses
     * across processes, where TSan cannot follow (kvt's tcp copies
     * through the kernel, which it does not see either, or from its
     * read-ahead, under the same annotation). The
     * callbacks run in it only note what happened; the work is done
     * outside, where it is checked. */
    KVT_TSAN_IGNORE_READS_BEGIN();
    KVT_TSAN_IGNORE_WRITES_BEGIN();
    while (ucp_worker_progress(wk->w))
        n++;
    KVT_TSAN_IGNORE_WRITES_END();
    KVT_TSAN_IGNORE_READS_END();
    if (n > 0)
        kvt__engine_landed(wk->ucx->e);
    return n;
}

static ucx_msg_t *inbox_take(ucx_worker_t *wk)
{
    ucx_msg_t *m;

    pthread_mutex_lock(&wk->lock);
    m = wk->in_head;
    wk->in_head = wk->in_tail = NULL;
    pthread_mutex_unlock(&wk->lock);
    return m;
}

static int inbox_empty(ucx_worker_t *wk)
{
    int e;

    pthread_mutex_lock(&wk->lock);
    e = wk->in_head == NULL;
    pthread_mutex_unlock(&wk->lock);
    return e;
}

/* Drop what a handled message held (after it is freed). */
static void unhold(ucx_session_t *s)
{
    if (s != NULL)
        kvt__session_release(&s->base);
}

static void handle(ucx_worker_t *wk, ucx_msg_t *m)
{
    ucx_session_t *s = m->s;

    switch (m->kind) {
    case MSG_OPEN:
        kvt__ucx_sess_connect(s);
        free(m);
        break;
    case MSG_XFER:
        kvt__ucx_sess_xfer(m->s, m);
        break;
    case MSG_KILL:
        if (!m->s->released)
            kvt__ucx_sess_fail(m->s, m->why, 0);
        free(m);
        break;
    case MSG_REG_CHANGED:
        kvt__ucx_reg_changed(wk, m->gen);
        free(m);
        break;
    default:
        free(m);
        break;
    }
    unhold(s);
}

static void serve_touched(ucx_worker_t *wk, uint64_t now)
{
    /* Serving may touch sessions again (a held transfer posted); a few
     * rounds settle it, the rest waits for the next turn. */
    for (int round = 0; round < 4 && wk->touched != NULL; round++) {
        ucx_session_t *s = wk->touched;
        wk->touched = NULL;
        while (s != NULL) {
            ucx_session_t *next = s->tnext;
            s->touched = 0;
            s->tnext = NULL;
            if (!s->released)
                kvt__ucx_sess_service(s, now);
            s = next;
        }
    }
}

static void close_epochs(ucx_worker_t *wk)
{
    for (ucx_session_t *s = wk->touched; s != NULL; s = s->tnext)
        kvt__ucx_sess_close_epoch(s);
}

static int any_busy(ucx_worker_t *wk)
{
    for (ucx_session_t *s = wk->sessions; s != NULL; s = s->wnext)
        if (kvt__ucx_sess_busy(s))
            return 1;
    return 0;
}

static void tick(ucx_worker_t *wk, uint64_t now)
{
    ucx_session_t *s = wk->sessions;

    while (s != NULL) {
        ucx_session_t *next = s->wnext; /* s may be released */
        if (!s->touched)
            kvt__ucx_sess_service(s, now);
        s = next;
    }
    kvt__ucx_inbound_tick(wk, now);
    kvt__ucx_closing_reap(wk);
}

/* Everything fails with KVT_ERR_CANCELED; wait (at most 2 s) for ucp to
 * return what it holds. */
static void shut_down(ucx_worker_t *wk)
{
    uint64_t deadline = kvt__now_ns() + 2000000000ull;
    ucx_msg_t *m;

    for (ucx_session_t *s = wk->sessions; s != NULL; s = s->wnext)
        kvt__ucx_sess_fail(s, KVT_ERR_CANCELED, 0);
    kvt__ucx_inbound_close_all(wk);
    for (;;) {
        uint64_t now = kvt__now_ns();
        progress(wk);
        kvt__ucx_conns_check(wk);
        kvt__ucx_events(wk);
        serve_touched(wk, now);
        tick(wk, now);
        if ((wk->sessions == NULL && wk->nclosing == 0) || now > deadline)
            break;
        usleep(100);
    }
    if (wk->sessions != NULL)
        KVT_LOG_W("ucx: a worker stops with transfers ucp did not return");
    kvt__ucx_conns_close_all(wk);
    while ((m = inbox_take(wk)) != NULL) {
        while (m != NULL) {
            ucx_msg_t *next = m->next;
            ucx_session_t *s = m->s;
            if (m->kind == MSG_XFER)
                kvt__ucx_complete_msg(m, KVT_ERR_CANCELED);
            else
                free(m);
            unhold(s);
            m = next;
        }
    }
    while (wk->nclosing > 0 && kvt__now_ns() < deadline + 1000000000ull) {
        ucp_worker_progress(wk->w);
        kvt__ucx_closing_reap(wk);
    }
    kvt__ucx_events(wk); /* frees what arrived last */
    if (wk->nclosing > 0) {
        /* A graceful close to a dead peer (without failure handling) never
         * ends: hand the requests back, and the worker's destruction ends
         * them. */
        KVT_LOG_W("ucx: a worker stops with %u endpoints still closing",
                  wk->nclosing);
        for (unsigned i = 0; i < wk->nclosing; i++)
            ucp_request_free(wk->closing[i]);
        wk->nclosing = 0;
    }
}

void *kvt__ucx_worker_main(void *arg)
{
    ucx_worker_t *wk = arg;
    kvt__ucx_t *ucx = wk->ucx;
    struct epoll_event evs[4];

    kvt__thread_name("kvt-ucx-w%u", wk->id);
    wk->next_tick = kvt__now_ns() + TICK_NS;
    for (;;) {
        ucx_msg_t *m = inbox_take(wk);
        uint64_t now;
        int busy;

        if (atomic_load(&ucx->stopping)) {
            while (m != NULL) {
                ucx_msg_t *next = m->next;
                ucx_session_t *s = m->s;
                if (m->kind == MSG_XFER)
                    kvt__ucx_complete_msg(m, KVT_ERR_CANCELED);
                else if (m->kind == MSG_OPEN) {
                    kvt__ucx_sess_connect(s);
                    free(m);
                } else
                    free(m);
                unhold(s);
                m = next;
            }
            shut_down(wk);
            return NULL;
        }
        while (m != NULL) {
            ucx_msg_t *next = m->next;
            handle(wk, m);
            m = next;
        }
        close_epochs(wk);
        progress(wk);
        kvt__ucx_conns_check(wk);
        kvt__ucx_events(wk);
        now = kvt__now_ns();
        serve_touched(wk, now);
        close_epochs(wk);
        if (now >= wk->next_tick) {
            tick(wk, now);
            wk->next_tick = now + TICK_NS;
        }
        if (!inbox_empty(wk) || wk->touched != NULL || wk->ev_head != NULL)
            continue;
        busy = any_busy(wk) || wk->nclosing > 0;
        if (busy) {
            /* Completions usually follow soon: poll a little first. */
            uint64_t until = kvt__now_ns() + SPIN_NS;
            int got = 0;
            while (!got && kvt__now_ns() < until)
                got = progress(wk) != 0 || !inbox_empty(wk);
            if (got)
                continue;
        }
        if (ucp_worker_arm(wk->w) == UCS_ERR_BUSY)
            continue;
        {
            int ms = busy ? (int)(TICK_NS / 1000000) : 1000;
            int n = epoll_wait(wk->epfd, evs, 4, ms);
            for (int i = 0; i < n; i++) {
                if (evs[i].data.fd == wk->evfd) {
                    uint64_t v;
                    if (read(wk->evfd, &v, sizeof(v)) < 0)
                        (void)0;
                }
            }
        }
    }
}
