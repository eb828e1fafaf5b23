/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's queue of received notifications: filled by the transports
 * (kvt__notify_push()), drained by kvt_notify_recv(), bounded overall
 * and per sender.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "util/hash.h"
#include "util/log.h"

#define NOTIFY_QUEUE_MAX 65536u
#define NOTIFY_PEER_MAX 8192u

/*
 * Bounds: at most NOTIFY_QUEUE_MAX entries, and NOTIFY_PEER_MAX from one
 * sender. A sender at its quota loses its own oldest entry to the new
 * one; a full queue drops the oldest entry of the sender that holds the
 * most (the newcomer's own when it ties). So a sender's flood never
 * evicts another sender's entries while that one holds fewer. Every drop
 * is counted (notifies_dropped) and logged, rate-limited.
 */
static uint32_t peer_hash(const char *name)
{
    return (uint32_t)kvt__fnv1a(KVT_FNV1A_SEED, name, strlen(name)) %
           KVT__NOTIFY_BUCKETS;
}

/* The sender's entry, created on its first message. nq_lock held. */
static kvt__notify_peer_t *peer_get(kvt_engine_h e, const char *name)
{
    kvt__notify_peer_t **b = &e->nq_peers[peer_hash(name)], *p;

    for (p = *b; p != NULL; p = p->hnext)
        if (strcmp(p->name, name) == 0)
            return p;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->hnext = *b;
    *b = p;
    return p;
}

/* A sender with nothing queued goes. nq_lock held. */
static void peer_put(kvt_engine_h e, kvt__notify_peer_t *p)
{
    kvt__notify_peer_t **pp;

    if (p->count != 0)
        return;
    for (pp = &e->nq_peers[peer_hash(p->name)]; *pp != NULL;
         pp = &(*pp)->hnext) {
        if (*pp == p) {
            *pp = p->hnext;
            break;
        }
    }
    free(p);
}

/* Take @p's oldest entry off both lists; the caller frees it and puts
 * the peer. nq_lock held. */
static kvt__notify_node_t *peer_pop(kvt_engine_h e, kvt__notify_peer_t *p)
{
    kvt__notify_node_t *n = p->head;

    p->head = n->pnext;
    if (p->head == NULL)
        p->tail = NULL;
    p->count--;
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        e->nq_head = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        e->nq_tail = n->prev;
    e->nq_len--;
    return n;
}

/* The sender holding the most entries, @p on a tie. nq_lock held. */
static kvt__notify_peer_t *peer_largest(kvt_engine_h e, kvt__notify_peer_t *p)
{
    kvt__notify_peer_t *best = p;

    for (unsigned i = 0; i < KVT__NOTIFY_BUCKETS; i++)
        for (kvt__notify_peer_t *q = e->nq_peers[i]; q != NULL; q = q->hnext)
            if (q->count > best->count)
                best = q;
    return best;
}

void kvt__notify_push(kvt_engine_h e, const char *from, const void *data,
                      size_t len)
{
    kvt__notify_node_t *n = malloc(sizeof(*n) + len), *old = NULL;
    kvt__notify_peer_t *p, *victim = NULL;

    atomic_fetch_add_explicit(&e->stats.notifies_received, 1,
                              memory_order_relaxed);
    pthread_mutex_lock(&e->nq_lock);
    p = n != NULL ? peer_get(e, from) : NULL;
    if (p == NULL) {
        pthread_mutex_unlock(&e->nq_lock);
        free(n);
        atomic_fetch_add_explicit(&e->stats.notifies_dropped, 1,
                                  memory_order_relaxed);
        KVT_LOG_E_RL("out of memory: dropping a notification");
        return;
    }
    if (p->count >= NOTIFY_PEER_MAX)
        victim = p;
    else if (e->nq_len >= NOTIFY_QUEUE_MAX)
        victim = peer_largest(e, p);
    if (victim != NULL && victim->count > 0) {
        old = peer_pop(e, victim);
        victim->dropped++;
    }
    n->next = NULL;
    n->prev = e->nq_tail;
    n->pnext = NULL;
    n->peer = p;
    n->length = (uint32_t)len;
    if (len > 0) /* an empty message may come without a buffer */
        memcpy(n->data, data, len);
    if (e->nq_tail)
        e->nq_tail->next = n;
    else
        e->nq_head = n;
    e->nq_tail = n;
    e->nq_len++;
    if (p->tail)
        p->tail->pnext = n;
    else
        p->head = n;
    p->tail = n;
    p->count++;
    pthread_cond_signal(&e->nq_cond);
    if (old != NULL) {
        char esc[KVT_LOG_ESC_MAX];
        uint64_t dropped = victim->dropped;
        const char *why = victim == p
                              ? "it holds its quota"
                              : "the queue is full and it holds the most";
        kvt__log_escape(esc, sizeof(esc), victim->name);
        peer_put(e, victim);
        pthread_mutex_unlock(&e->nq_lock);
        free(old);
        atomic_fetch_add_explicit(&e->stats.notifies_dropped, 1,
                                  memory_order_relaxed);
        KVT_LOG_W_RL("notification queue: dropped the oldest of \"%s\" "
                     "(%llu of its so far; %s)",
                     esc, (unsigned long long)dropped, why);
        return;
    }
    pthread_mutex_unlock(&e->nq_lock);
}

kvt_status_t kvt_notify_recv(kvt_engine_h e, kvt_notify_t *out, size_t max,
                             size_t *count_p, int64_t timeout_ms)
{
    size_t got = 0;

    if (e == NULL || count_p == NULL || (out == NULL && max > 0))
        return KVT_ERR_INVALID_PARAM;
    /* Pairs with the release after each landed write. */
    (void)atomic_load_explicit(&e->landed, memory_order_acquire);
    pthread_mutex_lock(&e->nq_lock);
    if (e->nq_head == NULL && timeout_ms > 0 && max > 0) {
        struct timespec ts;
        uint64_t ns;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        while (e->nq_head == NULL) {
            if (pthread_cond_timedwait(&e->nq_cond, &e->nq_lock, &ts) ==
                ETIMEDOUT)
                break;
        }
    }
    while (got < max && e->nq_head != NULL) {
        /* The oldest entry is its sender's oldest too. */
        kvt__notify_peer_t *p = e->nq_head->peer;
        kvt__notify_node_t *n = peer_pop(e, p);
        kvt_notify_t *o = &out[got++];
        memcpy(o->from, p->name, sizeof(p->name));
        o->length = n->length;
        memcpy(o->data, n->data, n->length);
        peer_put(e, p);
        free(n);
    }
    pthread_mutex_unlock(&e->nq_lock);
    *count_p = got;
    return KVT_OK;
}

/* Everything still queued, at the engine's destruction. */
void kvt__notify_free_all(kvt_engine_h e)
{
    kvt__notify_node_t *n, *nn;

    for (n = e->nq_head; n != NULL; n = nn) {
        nn = n->next;
        free(n);
    }
    for (unsigned i = 0; i < KVT__NOTIFY_BUCKETS; i++) {
        kvt__notify_peer_t *p, *pn;
        for (p = e->nq_peers[i]; p != NULL; p = pn) {
            pn = p->hnext;
            free(p);
        }
    }
}
