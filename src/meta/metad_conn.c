/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt metad's connections: the stage each is in, since when, and the
 * limits that drop idle, slow and surplus ones.
 */
#include "meta/metad_conn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/*
 * Each connection's stage and the time it entered it live in one atomic
 * word (since_ms << 8 | stage), so that the request path changes stages
 * with a compare-and-swap and no lock. The lock guards the list of
 * connections, `kept`, and the move to DROPPED, which only a holder of
 * the lock makes and nothing undoes: the sweeper and the eviction scan
 * the list under it, and a connection leaves the list (remove) under it
 * too, before its descriptor is closed.
 */
struct kvt__conn {
    struct kvt__conn *prev, *next;
    _Atomic uint64_t state;
    int fd;
};

#define STAGE_OF(st) ((kvt__conn_stage_t)((st)&0xffu))
#define SINCE_OF(st) ((st) >> 8)
#define STATE(since, stage) ((since) << 8 | (uint64_t)(stage))

struct kvt__conns {
    pthread_mutex_t lock;
    kvt__conn_t *head; /* every connection not yet removed */
    size_t kept;       /* connections not dropped */
    unsigned max_conns;
    uint32_t header_ms, body_ms;
    kvt__conns_drop_cb_t drop;
    void *arg;
    _Atomic uint64_t dropped[KVT__DROP_NREASONS];
};

kvt_status_t kvt__conns_create(unsigned max_conns, uint32_t header_ms,
                               uint32_t body_ms, kvt__conns_drop_cb_t drop,
                               void *arg, kvt__conns_t **t_p)
{
    kvt__conns_t *t = calloc(1, sizeof(*t));

    if (t == NULL)
        goto err;
    if (pthread_mutex_init(&t->lock, NULL) != 0)
        goto err_t;
    t->max_conns = max_conns > 0 ? max_conns : 1;
    t->header_ms = header_ms > 0 ? header_ms : 1;
    t->body_ms = body_ms > 0 ? body_ms : 1;
    t->drop = drop;
    t->arg = arg;
    *t_p = t;
    return KVT_OK;

err_t:
    free(t);
err:
    return KVT_ERR_NO_MEMORY;
}

void kvt__conns_destroy(kvt__conns_t *t)
{
    kvt__conn_t *c, *next;

    if (t == NULL)
        return;
    for (c = t->head; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/*
 * Under the lock: drop @c if its state is still @seen (a connection that
 * moved on meanwhile is spared). Returns whether it was dropped.
 */
static int drop_locked(kvt__conns_t *t, kvt__conn_t *c, uint64_t seen,
                       kvt__drop_reason_t why)
{
    if (!atomic_compare_exchange_strong(
            &c->state, &seen, STATE(SINCE_OF(seen), KVT__CONN_DROPPED)))
        return 0;
    t->kept--;
    atomic_fetch_add_explicit(&t->dropped[why], 1, memory_order_relaxed);
    t->drop(t->arg, c->fd);
    return 1;
}

kvt__conn_t *kvt__conns_add(kvt__conns_t *t, int fd, uint64_t now_ms)
{
    kvt__conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->fd = fd;
    atomic_init(&c->state, STATE(now_ms, KVT__CONN_HEADER));
    pthread_mutex_lock(&t->lock);
    c->next = t->head;
    if (t->head != NULL)
        t->head->prev = c;
    t->head = c;
    t->kept++;
    /* Past the cap, the connection that has waited longest for a header
     * goes (an O(n) scan, only at the cap); when none other waits for
     * one, the new connection itself. */
    while (t->kept > t->max_conns) {
        kvt__conn_t *victim = c;
        uint64_t vst = atomic_load(&c->state);
        for (kvt__conn_t *o = c->next; o != NULL; o = o->next) {
            uint64_t st = atomic_load(&o->state);
            if (STAGE_OF(st) == KVT__CONN_HEADER &&
                (victim == c || SINCE_OF(st) <= SINCE_OF(vst))) {
                victim = o;
                vst = st;
            }
        }
        if (!drop_locked(t, victim, vst, KVT__DROP_EVICTED) && victim == c)
            break; /* cannot happen: only lock holders drop */
    }
    pthread_mutex_unlock(&t->lock);
    return c;
}

void kvt__conns_stage(kvt__conns_t *t, kvt__conn_t *c, kvt__conn_stage_t stage,
                      uint64_t now_ms)
{
    uint64_t st;

    (void)t;
    if (c == NULL || stage >= KVT__CONN_DROPPED)
        return;
    st = atomic_load_explicit(&c->state, memory_order_relaxed);
    do {
        if (STAGE_OF(st) == KVT__CONN_DROPPED)
            return;
    } while (
        !atomic_compare_exchange_weak(&c->state, &st, STATE(now_ms, stage)));
}

void kvt__conns_remove(kvt__conns_t *t, kvt__conn_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        t->head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    /* Under the lock nobody else drops it: the state is final. */
    if (STAGE_OF(atomic_load(&c->state)) != KVT__CONN_DROPPED)
        t->kept--;
    pthread_mutex_unlock(&t->lock);
    free(c);
}

size_t kvt__conns_sweep(kvt__conns_t *t, uint64_t now_ms)
{
    size_t n = 0;

    pthread_mutex_lock(&t->lock);
    for (kvt__conn_t *c = t->head; c != NULL; c = c->next) {
        uint64_t st = atomic_load(&c->state), since = SINCE_OF(st);
        kvt__conn_stage_t stage = STAGE_OF(st);
        if (stage == KVT__CONN_HEADER && now_ms >= since &&
            now_ms - since >= t->header_ms)
            n += (size_t)drop_locked(t, c, st, KVT__DROP_HEADER);
        else if (stage == KVT__CONN_BODY && now_ms >= since &&
                 now_ms - since >= t->body_ms)
            n += (size_t)drop_locked(t, c, st, KVT__DROP_BODY);
    }
    pthread_mutex_unlock(&t->lock);
    return n;
}

size_t kvt__conns_count(kvt__conns_t *t)
{
    size_t n;

    pthread_mutex_lock(&t->lock);
    n = t->kept;
    pthread_mutex_unlock(&t->lock);
    return n;
}

uint64_t kvt__conns_dropped(kvt__conns_t *t, kvt__drop_reason_t why)
{
    return atomic_load_explicit(&t->dropped[why], memory_order_relaxed);
}
