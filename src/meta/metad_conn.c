/* SPDX-License-Identifier: Apache-2.0 */
#include "meta/metad_conn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/*
 * Invariant: each connection is on the list of its stage, and each list
 * is sorted by `since`, oldest first, because a connection only ever
 * enters a list at its tail with the current (monotonic) time. So the
 * oldest idle connection is the head of the HEADER list, and a sweep
 * stops at the first head that is still within its deadline.
 */
struct kvt__conn {
    struct kvt__conn *prev, *next;
    kvt__conn_stage_t stage;
    int fd;
    uint64_t since_ms;
};

typedef struct {
    kvt__conn_t *head, *tail;
} list_t;

struct kvt__conns {
    pthread_mutex_t lock;
    list_t lists[KVT__CONN_NSTAGES];
    size_t kept; /* connections not dropped */
    unsigned max_conns;
    uint32_t header_ms, body_ms;
    kvt__conns_drop_cb_t drop;
    void *arg;
    _Atomic uint64_t dropped[KVT__DROP_NREASONS];
};

/* Append @c; its time is raised to the tail's when a thread that read the
 * clock earlier got the lock later, which keeps the list sorted. */
static void list_push(list_t *l, kvt__conn_t *c)
{
    if (l->tail != NULL && c->since_ms < l->tail->since_ms)
        c->since_ms = l->tail->since_ms;
    c->next = NULL;
    c->prev = l->tail;
    if (l->tail != NULL)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
}

static void list_unlink(list_t *l, kvt__conn_t *c)
{
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    c->prev = c->next = NULL;
}

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
    if (t == NULL)
        return;
    for (int s = 0; s < KVT__CONN_NSTAGES; s++) {
        kvt__conn_t *c = t->lists[s].head, *next;
        for (; c != NULL; c = next) {
            next = c->next;
            free(c);
        }
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* Under the lock: drop @c (not yet dropped) for @why. */
static void drop_locked(kvt__conns_t *t, kvt__conn_t *c, kvt__drop_reason_t why)
{
    list_unlink(&t->lists[c->stage], c);
    c->stage = KVT__CONN_DROPPED;
    list_push(&t->lists[KVT__CONN_DROPPED], c);
    t->kept--;
    atomic_fetch_add_explicit(&t->dropped[why], 1, memory_order_relaxed);
    t->drop(t->arg, c->fd);
}

kvt__conn_t *kvt__conns_add(kvt__conns_t *t, int fd, uint64_t now_ms)
{
    kvt__conn_t *c = calloc(1, sizeof(*c)), *victim;

    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->since_ms = now_ms;
    c->stage = KVT__CONN_HEADER;
    pthread_mutex_lock(&t->lock);
    /* The oldest idle connection goes first: it is the head of the HEADER
     * list, unless that is the new one, when nobody else is idle. */
    if (t->kept >= t->max_conns) {
        victim = t->lists[KVT__CONN_HEADER].head;
        list_push(&t->lists[KVT__CONN_HEADER], c);
        t->kept++;
        drop_locked(t, victim != NULL ? victim : c, KVT__DROP_EVICTED);
    } else {
        list_push(&t->lists[KVT__CONN_HEADER], c);
        t->kept++;
    }
    pthread_mutex_unlock(&t->lock);
    return c;
}

void kvt__conns_stage(kvt__conns_t *t, kvt__conn_t *c, kvt__conn_stage_t stage,
                      uint64_t now_ms)
{
    if (c == NULL || stage >= KVT__CONN_DROPPED)
        return;
    pthread_mutex_lock(&t->lock);
    if (c->stage != KVT__CONN_DROPPED) {
        list_unlink(&t->lists[c->stage], c);
        c->stage = stage;
        c->since_ms = now_ms;
        list_push(&t->lists[stage], c);
    }
    pthread_mutex_unlock(&t->lock);
}

void kvt__conns_remove(kvt__conns_t *t, kvt__conn_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    list_unlink(&t->lists[c->stage], c);
    if (c->stage != KVT__CONN_DROPPED)
        t->kept--;
    pthread_mutex_unlock(&t->lock);
    free(c);
}

size_t kvt__conns_sweep(kvt__conns_t *t, uint64_t now_ms)
{
    static const struct {
        kvt__conn_stage_t stage;
        kvt__drop_reason_t why;
    } rules[] = {{KVT__CONN_HEADER, KVT__DROP_HEADER},
                 {KVT__CONN_BODY, KVT__DROP_BODY}};
    size_t n = 0;

    pthread_mutex_lock(&t->lock);
    for (size_t r = 0; r < sizeof(rules) / sizeof(rules[0]); r++) {
        uint32_t limit =
            rules[r].stage == KVT__CONN_HEADER ? t->header_ms : t->body_ms;
        kvt__conn_t *c;
        while ((c = t->lists[rules[r].stage].head) != NULL &&
               now_ms - c->since_ms >= limit) {
            drop_locked(t, c, rules[r].why);
            n++;
        }
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
