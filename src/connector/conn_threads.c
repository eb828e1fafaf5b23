/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connector's three threads (conn_int.h says what each owns): the rx
 * thread applies what arrives, the worker sends and runs the timers, and
 * the slow thread makes the calls that may block for long.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

#define RX_BATCH 16
/* The worker looks at batches this often while any is in flight; their
 * completion wakes it anyway (kvtc__conn_batch_watch), so this only
 * bounds a missed wake-up. */
#define BUSY_POLL_NS 2000000ull
#define IDLE_POLL_NS 10000000ull
/* A gap between rounds this long (a hundred times the longest wait) means
 * the process was not running: see kvtc__sess_forgive(). */
#define STALL_MS 1000u

/* ---- The slow thread ----------------------------------------------------- */

static int slow_register(kvt_conn_h c, kvt_bootc_h bc, char *why, size_t wl)
{
    kvt_status_t st = KVT_ERR_NOT_SUPPORTED;

    if (bc != NULL)
        st = kvt_bootc_register(bc, c->server, c->host, c->port,
                                c->tp_size * c->dp_size, c->dp_size,
                                c->dp_rank * c->tp_size + c->tp_rank, c->ttl_s,
                                KVTC__HTTP_TIMEOUT_MS, why, wl);
    return st == KVT_OK ? 0 : -1;
}

/*
 * The slow thread performs the calls that may block for long: bootstrap
 * HTTP (prefill registration refreshes, decode topology lookups) and
 * kvt_segment_open() of new sessions. It takes one task under the lock,
 * marks it taken (FETCHING, OPENING), runs it unlocked, and applies the
 * result under the lock, re-checking that the object still wants it.
 */
static void *slow_main(void *arg)
{
    kvt_conn_h c = arg;
    kvt_bootc_h bc = NULL;
    char why[KVTC__WHY_MAX];

    pthread_setname_np(pthread_self(), "kvt-conn-slow");
    if (kvt_bootc_create(&bc) != KVT_OK)
        bc = NULL;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        uint64_t now = kvtc__conn_now_ms();
        kvtc__sess_t *s;

        if (c->t_register != 0 && now >= c->t_register) {
            int ok;
            pthread_mutex_unlock(&c->lock);
            ok = slow_register(c, bc, why, sizeof(why)) == 0;
            if (!ok)
                KVTC__LOG_W("connector: refreshing the bootstrap "
                            "registration: %s",
                            why);
            pthread_mutex_lock(&c->lock);
            c->t_register =
                kvtc__conn_now_ms() + (ok ? c->ttl_s * 1000ull / 3 : 1000ull);
            continue;
        }
        if (kvtc__topo_fetch(c, bc, now)) {
            kvtc__conn_wake(c);
            continue;
        }
        for (s = c->sessions; s != NULL; s = s->next)
            if (s->state == KVTC__SESS_NEW)
                break;
        if (s != NULL) {
            char name[KVTC__NAME_MAX];
            kvt_segment_t seg = 0;
            kvt_status_t st;

            s->state = KVTC__SESS_OPENING;
            kvtc__sess_ref(s);
            snprintf(name, sizeof(name), "%s", s->name);
            pthread_mutex_unlock(&c->lock);
            st = kvt_segment_open(c->engine, name, &seg);
            pthread_mutex_lock(&c->lock);
            if (s->state == KVTC__SESS_OPENING) {
                if (st == KVT_OK) {
                    s->seg = seg;
                    s->state = KVTC__SESS_OPENED;
                    s->t_state = kvtc__conn_now_ms();
                } else {
                    kvtc__sess_kill(c, s, st, "cannot reach %s: %s", name,
                                    kvt_status_str(st));
                }
            }
            kvtc__sess_unref(s);
            kvtc__conn_wake(c);
            continue;
        }
        kvtc__timed_wait(&c->slow_cv, &c->lock, 50000000ull);
    }
    pthread_mutex_unlock(&c->lock);
    kvt_bootc_destroy(bc);
    return NULL;
}

/* ---- The rx thread ------------------------------------------------------- */

/*
 * Takes notifications and applies them under the lock. After taking any,
 * an empty kvt_notify_recv() orders this thread after every write that
 * had landed before: a DONE is only applied once the writes it vouches
 * for are visible here, and through the lock to whoever polls.
 */
static void *rx_main(void *arg)
{
    kvt_conn_h c = arg;
    kvt_notify_t *buf = malloc(RX_BATCH * sizeof(*buf));
    int stop = 0;

    pthread_setname_np(pthread_self(), "kvt-conn-rx");
    if (buf == NULL) {
        KVTC__LOG_E("connector: no memory for the notification thread");
        return NULL;
    }
    while (!stop) {
        size_t n = 0, z = 0;
        kvt_notify_recv(c->engine, buf, RX_BATCH, &n, 20);
        if (n > 0)
            kvt_notify_recv(c->engine, NULL, 0, &z, 0);
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < n; i++) {
            buf[i].from[sizeof(buf[i].from) - 1] = '\0';
            kvtc__rx_dispatch(c, buf[i].from, (const uint8_t *)buf[i].data,
                              buf[i].length);
        }
        if (n > 0) {
            kvtc__conn_wake(c);
            pthread_cond_broadcast(&c->changed);
        }
        stop = c->stop;
        pthread_mutex_unlock(&c->lock);
    }
    free(buf);
    return NULL;
}

/* ---- The worker ---------------------------------------------------------- */

static void expire_misc(kvt_conn_h c, uint64_t now)
{
    for (kvtc__orphan_t **pp = &c->orphans; *pp != NULL;) {
        kvtc__orphan_t *o = *pp;
        if (kvtc__since(now, o->t) > c->waiting_ms ||
            o->sess->state == KVTC__SESS_DEAD) {
            if (o->sess->state != KVTC__SESS_DEAD)
                kvtc__ctrl_status(c, o->sess, KVTC__CM_NAK, o->room, 0, 0,
                                  KVT_ERR_TIMEDOUT,
                                  "no prefill request for this room "
                                  "arrived in time");
            *pp = o->next;
            kvtc__room_msg_clear(&o->req);
            kvtc__sess_unref(o->sess);
            free(o);
            continue;
        }
        pp = &o->next;
    }
    for (kvtc__tomb_t **pp = &c->tombs; *pp != NULL;) {
        kvtc__tomb_t *t = *pp;
        if (kvtc__since(now, t->t) > c->bootstrap_ms) {
            *pp = t->next;
            free(t);
            continue;
        }
        pp = &t->next;
    }
    for (kvtc__reasm_t **pp = &c->reasm; *pp != NULL;) {
        kvtc__reasm_t *r = *pp;
        if (kvtc__since(now, r->t) > c->peer_ms) {
            *pp = r->next;
            c->reasm_bytes -= r->total;
            free(r->buf);
            free(r);
            continue;
        }
        pp = &r->next;
    }
}

/*
 * One round: control messages and sessions, then every room (submit,
 * poll, complete, fail), then timers. Rounds run back to back while
 * anything asks for one (kvtc__conn_wake) or a watched batch runs idle
 * (kvtc__conn_batch_watch), and otherwise every BUSY_POLL_NS while
 * batches are in flight (timeouts) and every IDLE_POLL_NS when none is.
 */
static void *worker_main(void *arg)
{
    kvt_conn_h c = arg;

    pthread_setname_np(pthread_self(), "kvt-conn-w");
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        uint64_t now = kvtc__conn_now_ms();
        uint32_t kicks = atomic_load(&c->kicks);
        int busy;

        if (c->t_round != 0 && kvtc__since(now, c->t_round) > STALL_MS)
            kvtc__sess_forgive(c, now - c->t_round);
        c->t_round = now;
        c->work = 0;
        busy = kvtc__sess_tick(c, now);
        /* Every room's submissions queued before the engine's workers
         * wake (kvt_submit_plug()). */
        kvt_submit_plug();
        for (struct kvt_room *r = c->rooms; r != NULL; r = r->next) {
            if (r->role == KVT_ROLE_PREFILL)
                busy |= kvtc__prefill_tick(c, r, now);
            else
                busy |= kvtc__decode_tick(c, r, now);
        }
        kvt_submit_unplug();
        kvtc__rooms_tick(c, now);
        expire_misc(c, now);
        busy |= kvtc__sess_tick(c, now);
        if (c->work || atomic_load(&c->kicks) != kicks)
            continue;
        kvtc__timed_wait(&c->wake, &c->lock,
                         busy ? BUSY_POLL_NS : IDLE_POLL_NS);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* c->threads counts the threads started, in the order rx, worker, slow,
 * so that kvtc__threads_stop() joins those and no others. */
static kvt_status_t start_thread(kvt_conn_h c, pthread_t *tid,
                                 void *(*fn)(void *))
{
    int rc = pthread_create(tid, NULL, fn, c);
    if (rc != 0) {
        KVTC__LOG_E("connector: pthread_create: %s", strerror(rc));
        return KVT_ERR_NO_MEMORY;
    }
    c->threads++;
    return KVT_OK;
}

kvt_status_t kvtc__threads_start(kvt_conn_h c)
{
    kvt_status_t st;

    if ((st = start_thread(c, &c->rx_tid, rx_main)) == KVT_OK &&
        (st = start_thread(c, &c->worker_tid, worker_main)) == KVT_OK)
        st = start_thread(c, &c->slow_tid, slow_main);
    return st;
}

void kvtc__threads_stop(kvt_conn_h c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_broadcast(&c->wake);
    pthread_cond_broadcast(&c->slow_cv);
    pthread_mutex_unlock(&c->lock);
    if (c->threads >= 1)
        pthread_join(c->rx_tid, NULL);
    if (c->threads >= 2)
        pthread_join(c->worker_tid, NULL);
    if (c->threads >= 3)
        pthread_join(c->slow_tid, NULL);
    c->threads = 0;
}
