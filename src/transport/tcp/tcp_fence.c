/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fences (tcp.h explains why): on the initiator, the live sessions that a
 * fence must spare and the fence each new session's HELLO carries; on the
 * target, the inbound connections by initiator and session, and the
 * admission of a data connection once the connections its fence names
 * are closed by their workers.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/time.h"

kvt_status_t kvt__tcp_fence_init(kvt__tcp_t *tcp)
{
    pthread_condattr_t ca;
    uint32_t inst = 0;

    if (getrandom(&inst, sizeof(inst), GRND_NONBLOCK) != sizeof(inst))
        inst = (uint32_t)(kvt__now_ns() ^ ((uint64_t)getpid() << 16));
    tcp->inst = inst != 0 ? inst : 1;
    atomic_store(&tcp->next_counter, 1);
    if (pthread_condattr_init(&ca) != 0)
        return KVT_ERR_NO_MEMORY;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&tcp->in_lock, NULL);
    pthread_cond_init(&tcp->in_cond, &ca);
    pthread_condattr_destroy(&ca);
    return KVT_OK;
}

void kvt__tcp_fence_fini(kvt__tcp_t *tcp)
{
    pthread_cond_destroy(&tcp->in_cond);
    pthread_mutex_destroy(&tcp->in_lock);
}

/* ---- Initiator ------------------------------------------------------------
 */

/*
 * Give @s its counter, list it as live, and return the fence its HELLOs
 * carry: every earlier session to @peer is dead but those still live (a
 * concurrent open of the same name), which the fence stops below.
 * Counters wrap after 2^32 - 1 sessions of one engine; 0 is never one.
 */
uint32_t kvt__tcp_live_add(kvt__tcp_t *tcp, tcp_session_t *s, const char *peer)
{
    uint32_t fence;

    snprintf(s->pname, sizeof(s->pname), "%s", peer);
    pthread_mutex_lock(&tcp->in_lock);
    do
        s->counter = atomic_fetch_add(&tcp->next_counter, 1);
    while (s->counter == 0);
    fence = s->counter - 1;
    for (tcp_session_t *o = tcp->live; o != NULL; o = o->lnext)
        if (o->counter <= fence && strcmp(o->pname, s->pname) == 0)
            fence = o->counter - 1;
    s->lnext = tcp->live;
    tcp->live = s;
    s->listed = 1;
    pthread_mutex_unlock(&tcp->in_lock);
    return fence;
}

/* @s is dead (or was never opened): later fences may name it. */
void kvt__tcp_live_del(tcp_session_t *s)
{
    kvt__tcp_t *tcp = s->tcp;

    pthread_mutex_lock(&tcp->in_lock);
    if (s->listed) {
        for (tcp_session_t **pp = &tcp->live; *pp != NULL; pp = &(*pp)->lnext) {
            if (*pp == s) {
                *pp = s->lnext;
                break;
            }
        }
        s->listed = 0;
    }
    pthread_mutex_unlock(&tcp->in_lock);
}

/* ---- Target ---------------------------------------------------------------
 */

void kvt__tcp_inbound_add(kvt__tcp_t *tcp, tcp_conn_t *c,
                          const kvt__wire_hello_t *hello)
{
    c->inst = (uint32_t)(hello->session_id >> 32);
    c->counter = (uint32_t)hello->session_id;
    pthread_mutex_lock(&tcp->in_lock);
    c->iprev = NULL;
    c->inext = tcp->inbound;
    if (tcp->inbound != NULL)
        tcp->inbound->iprev = c;
    tcp->inbound = c;
    c->listed = 1;
    pthread_mutex_unlock(&tcp->in_lock);
}

/* @c is being freed. */
void kvt__tcp_inbound_del(kvt__tcp_t *tcp, tcp_conn_t *c)
{
    pthread_mutex_lock(&tcp->in_lock);
    if (c->listed) {
        if (c->iprev != NULL)
            c->iprev->inext = c->inext;
        else
            tcp->inbound = c->inext;
        if (c->inext != NULL)
            c->inext->iprev = c->iprev;
        c->listed = 0;
        if (atomic_load(&c->fenced))
            atomic_fetch_sub(&c->w->nfenced, 1);
        pthread_cond_broadcast(&tcp->in_cond);
    }
    pthread_mutex_unlock(&tcp->in_lock);
}

/* Whether inbound connection @c belongs to a session @hello's fence names. */
static int fenced_by(const tcp_conn_t *c, const kvt__wire_hello_t *hello)
{
    return c->inst == (uint32_t)(hello->session_id >> 32) &&
           c->counter <= hello->fence && strcmp(c->peer, hello->name) == 0;
}

/*
 * The table's admit(): a HELLO with a fence waits until every inbound
 * connection of the sessions it names is closed by its worker, at most
 * KVT__TL_ADMIT_NS; past that it is refused with KVT_ERR_BUSY (the
 * initiator's open fails, and may be tried again).
 */
kvt_status_t kvt__tcp_admit(kvt__tl_t *tl, const kvt__wire_hello_t *hello,
                            const char **why_p)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;
    uint64_t deadline = kvt__now_ns() + KVT__TL_ADMIT_NS;
    kvt_status_t st = KVT_OK;
    unsigned nmarked = 0;

    if (hello->fence == 0)
        return KVT_OK;
    if (atomic_load(&tcp->stopping)) {
        *why_p = "the engine is stopping";
        return KVT_ERR_BUSY;
    }
    pthread_mutex_lock(&tcp->in_lock);
    for (tcp_conn_t *c = tcp->inbound; c != NULL; c = c->inext) {
        int zero = 0;
        if (fenced_by(c, hello) &&
            atomic_compare_exchange_strong(&c->fenced, &zero, 1)) {
            uint64_t one = 1;
            atomic_fetch_add(&c->w->nfenced, 1);
            if (write(c->w->evfd, &one, sizeof(one)) < 0)
                (void)0;
            nmarked++;
        }
    }
    for (;;) {
        struct timespec ts;
        uint64_t now;
        int left = 0;

        for (tcp_conn_t *c = tcp->inbound; c != NULL && !left; c = c->inext)
            left = fenced_by(c, hello);
        if (!left)
            break;
        now = kvt__now_ns();
        if (now >= deadline || atomic_load(&tcp->stopping)) {
            *why_p = "the connections of an earlier session of this peer are "
                     "still open";
            st = KVT_ERR_BUSY;
            break;
        }
        ts.tv_sec = (time_t)(deadline / 1000000000ull);
        ts.tv_nsec = (long)(deadline % 1000000000ull);
        pthread_cond_timedwait(&tcp->in_cond, &tcp->in_lock, &ts);
    }
    pthread_mutex_unlock(&tcp->in_lock);
    if (nmarked > 0)
        KVT_LOG_I("%s: closed %u connection%s of its failed session%s",
                  hello->name, nmarked, nmarked == 1 ? "" : "s",
                  st == KVT_OK ? "" : " (not all)");
    return st;
}

/*
 * In a worker, between two rounds of events: close the inbound
 * connections a fence marked. Unread requests on them are dropped.
 */
void kvt__tcp_fence_sweep(tcp_worker_t *w)
{
    tcp_conn_t *v[64];
    size_t n = 0;

    pthread_mutex_lock(&w->lock);
    for (tcp_conn_t *c = w->conns; c != NULL && n < 64; c = c->wnext)
        if (!c->outbound && atomic_load(&c->fenced))
            v[n++] = c;
    pthread_mutex_unlock(&w->lock);
    for (size_t i = 0; i < n; i++)
        kvt__tcp_conn_fail(v[i], KVT_ERR_CANCELED); /* frees it */
}
