/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Rooms: the state changes both sides share, lookup, timeouts and
 * freeing, and the public calls on a room of either side (poll, info,
 * wait, abort, destroy). The calls that create and feed senders and
 * receivers are in prefill.c and decode.c.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "conn_int.h"

const char *kvt_poll_str(kvt_poll_t state)
{
    switch (state) {
    case KVT_POLL_FAILED:
        return "Failed";
    case KVT_POLL_BOOTSTRAPPING:
        return "Bootstrapping";
    case KVT_POLL_WAITING_FOR_INPUT:
        return "WaitingForInput";
    case KVT_POLL_TRANSFERRING:
        return "Transferring";
    case KVT_POLL_SUCCESS:
        return "Success";
    }
    return "unknown";
}

static unsigned room_hash(uint64_t id)
{
    return (unsigned)((id * 0x9e3779b97f4a7c15ull) >> 54) % KVTC__ROOM_HASH;
}

struct kvt_room *kvtc__room_find(kvt_conn_h c, uint64_t id)
{
    for (struct kvt_room *r = c->hash[room_hash(id)]; r != NULL; r = r->hnext)
        if (r->id == id)
            return r;
    return NULL;
}

/* Count @r leaving its state for @state, now (@now_ns). */
static void room_account(struct kvt_room *r, kvt_poll_t state, uint64_t now_ns)
{
    kvtc__conn_stats_t *st = &r->conn->stats;
    unsigned from = (unsigned)r->state, to = (unsigned)state;

    if (from < 5) {
        atomic_fetch_sub(&st->rooms[from], 1);
        atomic_fetch_add(&st->left[from], 1);
        atomic_fetch_add(&st->state_ns[from],
                         now_ns > r->t_state_ns ? now_ns - r->t_state_ns : 0);
    }
    if (to < 5) {
        atomic_fetch_add(&st->rooms[to], 1);
        atomic_fetch_add(&st->entered[to], 1);
    }
    if (state == KVT_POLL_SUCCESS && r->role == KVT_ROLE_PREFILL &&
        r->t_last_ns != 0) {
        uint64_t ns = now_ns > r->t_last_ns ? now_ns - r->t_last_ns : 0;
        unsigned b = 0;
        while (b < KVT_STATS_LATENCY_BUCKETS - 1 &&
               ns / 1000 > kvt_stats_latency_bound_us(b))
            b++;
        atomic_fetch_add(&st->tail[b], 1);
        atomic_fetch_add(&st->tail_ns, ns);
        atomic_fetch_add(&st->tails, 1);
    }
}

void kvtc__room_set(struct kvt_room *r, kvt_poll_t state, const char *fmt, ...)
{
    va_list ap;
    uint64_t now_ns;

    if (kvtc__room_is_final(r) || r->state == state)
        return;
    now_ns = kvtc__conn_now_ns();
    room_account(r, state, now_ns);
    r->state = state;
    r->t_state = kvtc__conn_now_ms();
    r->t_state_ns = now_ns;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    KVTC__LOG_D("connector: %s room %" PRIu64 ": %s (%s)",
                kvtc__role_str(r->role), r->id, kvt_poll_str(state), r->reason);
    pthread_cond_broadcast(&r->conn->changed);
}

void kvtc__room_fail(struct kvt_room *r, kvt_status_t err, const char *fmt, ...)
{
    va_list ap;

    if (kvtc__room_is_final(r) || r->failing)
        return;
    r->failing = 1;
    r->ferr = err;
    va_start(ap, fmt);
    vsnprintf(r->freason, sizeof(r->freason), fmt, ap);
    va_end(ap);
    r->dirty = 1;
    KVTC__LOG_I("connector: %s room %" PRIu64 " fails: %s",
                kvtc__role_str(r->role), r->id, r->freason);
    kvtc__conn_wake(r->conn);
}

void kvtc__room_final(struct kvt_room *r, kvt_poll_t state)
{
    if (kvtc__room_is_final(r))
        return;
    if (state == KVT_POLL_FAILED) {
        r->error = r->ferr;
        snprintf(r->reason, sizeof(r->reason), "%s", r->freason);
    }
    room_account(r, state, kvtc__conn_now_ns());
    r->state = state;
    r->t_state = kvtc__conn_now_ms();
    r->t_state_ns = kvtc__conn_now_ns();
    pthread_cond_broadcast(&r->conn->changed);
}

kvt_status_t kvtc__room_new(kvt_conn_h c, uint64_t id, int role,
                            struct kvt_room **r_p)
{
    struct kvt_room *r;
    unsigned h = room_hash(id);

    if (kvtc__room_find(c, id) != NULL)
        return KVT_ERR_EXISTS;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVT_ERR_NO_MEMORY;
    r->conn = c;
    r->id = id;
    r->serial = ++c->next_serial;
    r->role = role;
    r->state = KVT_POLL_BOOTSTRAPPING;
    atomic_fetch_add(&c->stats.rooms[KVT_POLL_BOOTSTRAPPING], 1);
    atomic_fetch_add(&c->stats.entered[KVT_POLL_BOOTSTRAPPING], 1);
    r->t_created = r->t_state = kvtc__conn_now_ms();
    r->t_state_ns = kvtc__conn_now_ns();
    r->chunk_tail = &r->chunks;
    r->group = -1;
    r->hnext = c->hash[h];
    c->hash[h] = r;
    r->next = c->rooms;
    c->rooms = r;
    *r_p = r;
    return KVT_OK;
}

/* Expand the caller's aux slots to one per aux buffer, checked against
 * the buffers' item counts. */
kvt_status_t kvtc__room_aux(kvt_conn_h c, const uint64_t *slots, size_t n,
                            uint64_t **aux_p)
{
    uint64_t *aux;

    *aux_p = NULL;
    if (n == 0)
        return KVT_OK;
    if (slots == NULL || c->lay.naux == 0 || (n != 1 && n != c->lay.naux))
        return KVT_ERR_INVALID_PARAM;
    aux = malloc(c->lay.naux * sizeof(*aux));
    if (aux == NULL)
        return KVT_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < c->lay.naux; i++) {
        aux[i] = slots[n == 1 ? 0 : i];
        if (aux[i] >= c->lay.aux[i].count) {
            free(aux);
            return KVT_ERR_INVALID_PARAM;
        }
    }
    *aux_p = aux;
    return KVT_OK;
}

/* A room's jobs (prefill.c makes them) go with the room; a batch the
 * engine still holds is left to it. */
static void job_free(kvtc__job_t *j)
{
    if (j->batch != NULL) {
        kvtc__conn_batch_forget(j->batch);
        if (kvt_batch_free(j->batch) != KVT_OK)
            KVTC__LOG_W("connector: leaving a busy batch to the engine");
    }
    free(j->runs);
    free(j);
}

static void jobs_free(struct kvt_room *r)
{
    while (r->jobs != NULL) {
        kvtc__job_t *j = r->jobs;
        r->jobs = j->next;
        job_free(j);
    }
}

/* Unlink from the list and the hash, release everything. The room must
 * be quiescent (final, or the connector is being destroyed after its
 * threads stopped). */
void kvtc__room_free(kvt_conn_h c, struct kvt_room *r)
{
    struct kvt_room **pp;

    for (pp = &c->hash[room_hash(r->id)]; *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == r) {
            *pp = r->hnext;
            break;
        }
    }
    for (pp = &c->rooms; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    if ((unsigned)r->state < 5)
        atomic_fetch_sub(&c->stats.rooms[r->state], 1);
    jobs_free(r);
    while (r->chunks != NULL) {
        kvtc__chunk_t *k = r->chunks;
        r->chunks = k->next;
        free(k->ids);
        free(k);
    }
    for (uint32_t i = 0; i < r->npeers; i++) {
        kvtc__room_msg_clear(&r->peers[i].req);
        kvtc__sess_unref(r->peers[i].sess);
    }
    free(r->peers);
    free(r->ids);
    free(r->aux);
    free(r);
}

/* Free a final room whose handle is gone. A prefill room that failed
 * leaves a tombstone, so that a decode rank announcing it late is refused
 * at once rather than after the waiting timeout. */
static void room_retire(kvt_conn_h c, struct kvt_room *r)
{
    kvtc__tomb_t *t;

    if (r->role == KVT_ROLE_PREFILL && r->state == KVT_POLL_FAILED &&
        (t = calloc(1, sizeof(*t))) != NULL) {
        t->room = r->id;
        t->t = kvtc__conn_now_ms();
        snprintf(t->why, sizeof(t->why), "the room failed on prefill: %s",
                 r->reason);
        t->next = c->tombs;
        c->tombs = t;
    }
    kvtc__room_free(c, r);
}

/*
 * Timeouts of the non-final states, and freeing of final rooms whose
 * handle was destroyed. A failing room has no timeout of its own: what it
 * waits for (writes, acknowledgements) is bounded by the engine's
 * transfer timeout and the peer timeout.
 */
void kvtc__rooms_tick(kvt_conn_h c, uint64_t now)
{
    struct kvt_room *r = c->rooms, *next;

    for (; r != NULL; r = next) {
        next = r->next;
        if (kvtc__room_is_final(r)) {
            if (r->detached)
                room_retire(c, r);
            continue;
        }
        if (r->failing)
            continue;
        switch (r->state) {
        case KVT_POLL_BOOTSTRAPPING:
            if (kvtc__since(now, r->t_created) > c->bootstrap_ms)
                kvtc__room_fail(r, KVT_ERR_TIMEDOUT,
                                "bootstrap timed out after %" PRIu64 " ms: %s",
                                c->bootstrap_ms,
                                r->wait_why[0] ? r->wait_why
                                : r->role == KVT_ROLE_PREFILL
                                    ? "no decode rank announced the room"
                                    : "the prefill ranks did not answer");
            break;
        case KVT_POLL_WAITING_FOR_INPUT:
            if (kvtc__since(now, r->t_state) > c->waiting_ms)
                kvtc__room_fail(r, KVT_ERR_TIMEDOUT,
                                "waited %" PRIu64 " ms for %s", c->waiting_ms,
                                r->role == KVT_ROLE_PREFILL
                                    ? "the blocks to send"
                                : r->inited ? "prefill to start sending"
                                            : "init()");
            break;
        case KVT_POLL_TRANSFERRING:
            if (kvtc__since(now, r->t_state) > c->transfer_ms)
                kvtc__room_fail(r, KVT_ERR_TIMEDOUT,
                                "the transfer took longer than %" PRIu64 " ms",
                                c->transfer_ms);
            break;
        default:
            break;
        }
    }
}

/* ---- Public calls -------------------------------------------------------- */

kvt_poll_t kvt_room_poll(struct kvt_room *r)
{
    kvt_poll_t s;

    if (r == NULL)
        return KVT_POLL_FAILED;
    pthread_mutex_lock(&r->conn->lock);
    s = r->state;
    pthread_mutex_unlock(&r->conn->lock);
    return s;
}

kvt_status_t kvt_room_info(struct kvt_room *r, kvt_room_info_t *info_p)
{
    if (r == NULL || info_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&r->conn->lock);
    info_p->room = r->id;
    info_p->state = r->state;
    info_p->error = r->state == KVT_POLL_FAILED ? r->error : KVT_OK;
    snprintf(info_p->reason, sizeof(info_p->reason), "%s", r->reason);
    info_p->changed_ns = r->t_state_ns;
    pthread_mutex_unlock(&r->conn->lock);
    return KVT_OK;
}

static void wait_until(pthread_cond_t *cv, pthread_mutex_t *m,
                       const struct timespec *ts)
{
    if (ts == NULL)
        pthread_cond_wait(cv, m);
    else
        pthread_cond_timedwait(cv, m, ts);
}

kvt_poll_t kvt_room_wait(struct kvt_room *r, int64_t timeout_ms)
{
    struct timespec ts, *tsp = NULL;
    kvt_poll_t s;

    if (r == NULL)
        return KVT_POLL_FAILED;
    if (timeout_ms >= 0) {
        uint64_t ns;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        tsp = &ts;
    }
    pthread_mutex_lock(&r->conn->lock);
    while (!kvtc__room_is_final(r)) {
        struct timespec now;
        if (tsp != NULL) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec > ts.tv_sec ||
                (now.tv_sec == ts.tv_sec && now.tv_nsec >= ts.tv_nsec))
                break;
        }
        wait_until(&r->conn->changed, &r->conn->lock, tsp);
    }
    s = r->state;
    pthread_mutex_unlock(&r->conn->lock);
    return s;
}

kvt_status_t kvt_room_abort(struct kvt_room *r, const char *reason)
{
    if (r == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&r->conn->lock);
    kvtc__room_fail(r, KVT_ERR_CANCELED, "aborted by %s: %s",
                    kvtc__role_str(r->role),
                    reason && *reason ? reason : "no reason given");
    pthread_mutex_unlock(&r->conn->lock);
    return KVT_OK;
}

void kvt_room_destroy(struct kvt_room *r)
{
    kvt_conn_h c;

    if (r == NULL)
        return;
    c = r->conn;
    pthread_mutex_lock(&c->lock);
    kvtc__room_fail(r, KVT_ERR_CANCELED, "the %s side released the room",
                    kvtc__role_str(r->role));
    while (!kvtc__room_is_final(r))
        pthread_cond_wait(&c->changed, &c->lock);
    r->detached = 1;
    kvtc__conn_wake(c);
    pthread_mutex_unlock(&c->lock);
}
