/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connector object: parameters, memory registration, the bootstrap
 * registration of prefill ranks, the three threads, and forward steps.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conn_int.h"

#define DEFAULT_BOOTSTRAP_MS 30000ull
#define DEFAULT_WAITING_MS 300000ull
#define DEFAULT_TRANSFER_MS 60000ull
#define DEFAULT_HEARTBEAT_MS 1000ull
#define DEFAULT_PEER_MS 10000ull
#define DEFAULT_TTL_S 30u
#define REGISTER_TIMEOUT_MS 5000ull
#define HTTP_TIMEOUT_MS 3000ull
#define RX_BATCH 16
/* The worker looks at batches this often while any is in flight; their
 * completion wakes it anyway (batch_idle), so this only bounds a missed
 * wake-up. */
#define BUSY_POLL_NS 2000000ull
#define IDLE_POLL_NS 10000000ull

uint64_t kvtc__conn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvtc__conn_now_ms(void)
{
    return kvtc__conn_now_ns() / 1000000ull;
}

/* xorshift64*, seeded at create; called under the lock. */
uint64_t kvtc__conn_random(kvt_conn_h c)
{
    uint64_t x = c->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->rng = x;
    return x * 2685821657736338717ull;
}

void kvtc__conn_wake(kvt_conn_h c)
{
    c->work = 1;
    pthread_cond_signal(&c->wake);
}

/*
 * A batch of the connector has nothing pending. Called by an engine
 * completer, perhaps with engine locks held, perhaps by a thread that
 * holds c->lock and is submitting: never wait for c->lock. With the lock,
 * the worker is waiting or has yet to check: no wake-up is lost. Without
 * it, the worker (if it holds the lock) sees @kicks move before it waits;
 * the narrow miss left (raised between that check and the wait) costs one
 * BUSY_POLL_NS.
 */
static void batch_idle(kvt_batch_h batch, void *arg)
{
    kvt_conn_h c = arg;

    (void)batch;
    atomic_fetch_add(&c->kicks, 1);
    if (pthread_mutex_trylock(&c->lock) == 0) {
        kvtc__conn_wake(c);
        pthread_mutex_unlock(&c->lock);
    } else {
        pthread_cond_signal(&c->wake);
    }
}

void kvtc__conn_batch_watch(kvt_conn_h c, kvt_batch_h batch)
{
    kvt_batch_set_idle_cb(batch, batch_idle, c);
}

void kvtc__conn_batch_forget(kvt_batch_h batch)
{
    kvt_batch_set_idle_cb(batch, NULL, NULL);
}

int kvtc__conn_descs(kvt_conn_h c, size_t n)
{
    kvt_xfer_desc_t *d;
    size_t cap = c->cap_descs ? c->cap_descs : 256;

    if (n <= c->cap_descs)
        return 0;
    while (cap < n)
        cap *= 2;
    d = realloc(c->descs, cap * sizeof(*d));
    if (d == NULL)
        return -1;
    c->descs = d;
    c->cap_descs = cap;
    return 0;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ns += (uint64_t)ts.tv_nsec;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(cv, m, &ts);
}

/* ---- Steps ------------------------------------------------------------- */

static kvtc__step_t *step_find(kvt_conn_h c, uint64_t id, size_t *idx_p)
{
    for (size_t i = 0; i < c->nsteps; i++) {
        if (c->steps[i].id == id) {
            if (idx_p)
                *idx_p = i;
            return &c->steps[i];
        }
    }
    return NULL;
}

void kvtc__step_state(kvt_conn_h c, uint64_t step, uint32_t *ready_p,
                      int *aux_p)
{
    kvtc__step_t *s = step ? step_find(c, step, NULL) : NULL;

    *ready_p = s ? s->ready : c->lay.nlayers;
    *aux_p = s == NULL;
}

kvt_status_t kvt_conn_step_begin(kvt_conn_h c, uint64_t *step_p)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (c == NULL || step_p == NULL || c->role != KVT_ROLE_PREFILL)
        return st;
    pthread_mutex_lock(&c->lock);
    if (c->nsteps == c->cap_steps) {
        size_t cap = c->cap_steps ? 2 * c->cap_steps : 8;
        kvtc__step_t *s = realloc(c->steps, cap * sizeof(*s));
        if (s == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto out;
        }
        c->steps = s;
        c->cap_steps = cap;
    }
    c->steps[c->nsteps++] = (kvtc__step_t){++c->next_step, 0};
    *step_p = c->next_step;
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_conn_layer_ready(kvt_conn_h c, uint64_t step, uint32_t layer)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;
    kvtc__step_t *s;

    if (c == NULL || c->role != KVT_ROLE_PREFILL || layer >= c->lay.nlayers)
        return st;
    pthread_mutex_lock(&c->lock);
    if (step == 0 || step > c->next_step)
        goto out;
    s = step_find(c, step, NULL);
    if (s != NULL && s->ready < layer + 1) {
        s->ready = layer + 1;
        kvtc__conn_wake(c);
    }
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_conn_step_end(kvt_conn_h c, uint64_t step)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;
    size_t i;

    if (c == NULL || c->role != KVT_ROLE_PREFILL)
        return st;
    pthread_mutex_lock(&c->lock);
    if (step == 0 || step > c->next_step)
        goto out;
    if (step_find(c, step, &i) != NULL) {
        c->steps[i] = c->steps[--c->nsteps];
        kvtc__conn_wake(c);
    }
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* ---- Topology cache (decode) ------------------------------------------- */

kvtc__topo_t *kvtc__topo_get(kvt_conn_h c, const char *server)
{
    kvtc__topo_t *t;

    for (t = c->topos; t != NULL; t = t->next)
        if (strcmp(t->server, server) == 0)
            return t;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    snprintf(t->server, sizeof(t->server), "%s", server);
    t->backoff_ms = 50;
    t->next = c->topos;
    c->topos = t;
    pthread_cond_signal(&c->slow_cv);
    return t;
}

/* A session to @name died: the next room looks the instance up again, in
 * case the prefill rank restarted elsewhere. */
void kvtc__topo_forget(kvt_conn_h c, const char *name)
{
    for (kvtc__topo_t *t = c->topos; t != NULL; t = t->next) {
        if (t->state != KVTC__TOPO_OK)
            continue;
        for (uint32_t i = 0; i < t->tp_total; i++) {
            if (strcmp(t->names[i], name) == 0) {
                t->state = KVTC__TOPO_NONE;
                break;
            }
        }
    }
}

static void topo_free_all(kvt_conn_h c)
{
    while (c->topos != NULL) {
        kvtc__topo_t *t = c->topos;
        c->topos = t->next;
        free(t->names);
        free(t->need);
        free(t);
    }
}

static void topo_error(kvtc__topo_t *t, kvt_status_t st, const char *why)
{
    t->err = st;
    snprintf(t->why, sizeof(t->why), "%s", why);
    t->t_retry = kvtc__conn_now_ms() + t->backoff_ms;
    if (t->backoff_ms < 1000)
        t->backoff_ms *= 2;
}

/* Fetch the sizes (the lock released). */
static void topo_fetch_sizes(kvt_conn_h c, kvt_bootc_h bc, kvtc__topo_t *t)
{
    char server[KVTC__NAME_MAX], why[KVTC__WHY_MAX] = "";
    uint32_t tp = 0, dp = 0;
    kvt_status_t st = KVT_ERR_NOT_SUPPORTED;

    t->state = KVTC__TOPO_FETCHING;
    snprintf(server, sizeof(server), "%s", t->server);
    pthread_mutex_unlock(&c->lock);
    if (bc != NULL)
        st = kvt_bootc_sizes(bc, server, &tp, &dp, HTTP_TIMEOUT_MS, why,
                             sizeof(why));
    else
        snprintf(why, sizeof(why),
                 "no bootstrap client: built without "
                 "libcurl and json-c");
    pthread_mutex_lock(&c->lock);
    if (st == KVT_OK) {
        char(*names)[KVTC__NAME_MAX] = calloc(tp, sizeof(*names));
        uint8_t *need = calloc(tp, 1);
        if (names == NULL || need == NULL) {
            free(names);
            free(need);
            st = KVT_ERR_NO_MEMORY;
            snprintf(why, sizeof(why), "out of memory");
        } else {
            free(t->names);
            free(t->need);
            t->names = names;
            t->need = need;
            t->tp_total = tp;
            t->dp = dp;
            t->state = KVTC__TOPO_OK;
            t->backoff_ms = 50;
            t->t_retry = 0;
            t->why[0] = '\0';
            return;
        }
    }
    t->state = KVTC__TOPO_ERR;
    topo_error(t, st, why);
}

/* Look up the ranks rooms need (the lock released during each). */
static void topo_fetch_ranks(kvt_conn_h c, kvt_bootc_h bc, kvtc__topo_t *t)
{
    uint32_t P = t->tp_total / t->dp;

    t->fetching = 1;
    for (uint32_t i = 0; i < t->tp_total && t->state == KVTC__TOPO_OK; i++) {
        char server[KVTC__NAME_MAX], name[KVTC__NAME_MAX];
        char why[KVTC__WHY_MAX] = "";
        kvt_status_t st;
        if (!t->need[i] || t->names[i][0] != '\0')
            continue;
        snprintf(server, sizeof(server), "%s", t->server);
        pthread_mutex_unlock(&c->lock);
        st = kvt_bootc_route(bc, server, i % P, i / P, name, sizeof(name),
                             HTTP_TIMEOUT_MS, why, sizeof(why));
        pthread_mutex_lock(&c->lock);
        if (t->state != KVTC__TOPO_OK)
            break;
        if (st != KVT_OK) {
            topo_error(t, st, why);
            break;
        }
        snprintf(t->names[i], sizeof(t->names[i]), "%s", name);
        t->need[i] = 0;
        t->backoff_ms = 50;
        t->why[0] = '\0';
    }
    t->fetching = 0;
}

static int topo_wants_ranks(const kvtc__topo_t *t, uint64_t now)
{
    if (t->state != KVTC__TOPO_OK || t->fetching || now < t->t_retry)
        return 0;
    for (uint32_t i = 0; i < t->tp_total; i++)
        if (t->need[i] && t->names[i][0] == '\0')
            return 1;
    return 0;
}

/* ---- The slow thread ----------------------------------------------------- */

static int slow_register(kvt_conn_h c, kvt_bootc_h bc, char *why, size_t wl)
{
    kvt_status_t st = KVT_ERR_NOT_SUPPORTED;

    if (bc != NULL)
        st = kvt_bootc_register(bc, c->server, c->host, c->port,
                                c->tp_size * c->dp_size, c->dp_size,
                                c->dp_rank * c->tp_size + c->tp_rank, c->ttl_s,
                                HTTP_TIMEOUT_MS, why, wl);
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
        kvtc__topo_t *t;
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
        for (t = c->topos; t != NULL; t = t->next)
            if (t->state == KVTC__TOPO_NONE ||
                (t->state == KVTC__TOPO_ERR && now >= t->t_retry) ||
                topo_wants_ranks(t, now))
                break;
        if (t != NULL) {
            if (t->state == KVTC__TOPO_OK)
                topo_fetch_ranks(c, bc, t);
            else
                topo_fetch_sizes(c, bc, t);
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
        timed_wait(&c->slow_cv, &c->lock, 50000000ull);
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
 * anything asks for one (kvtc__conn_wake) or a batch completes
 * (batch_idle), and otherwise every BUSY_POLL_NS while batches are in
 * flight (timeouts) and every IDLE_POLL_NS when none is.
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
        timed_wait(&c->wake, &c->lock, busy ? BUSY_POLL_NS : IDLE_POLL_NS);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* ---- Memory -------------------------------------------------------------- */

static int range_cmp(const void *a, const void *b)
{
    const kvtc__range_t *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/*
 * Register every cache and aux buffer, merging ranges that overlap or
 * touch (caches are often views of one tensor), so that each byte is
 * registered once. All or nothing.
 */
static kvt_status_t register_memory(kvt_conn_h c)
{
    size_t n = c->lay.ncaches + c->lay.naux, m = 0, done = 0;
    kvtc__range_t *r = malloc(n * sizeof(*r));
    uint32_t access = c->role == KVT_ROLE_DECODE ? KVT_ACCESS_REMOTE_WRITE : 0;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (r == NULL)
        goto err;
    for (uint32_t i = 0; i < c->lay.ncaches; i++)
        r[i] = (kvtc__range_t){c->lay.caches[i].base,
                               c->lay.caches[i].block_bytes *
                                   c->lay.caches[i].num_blocks};
    for (uint32_t i = 0; i < c->lay.naux; i++)
        r[c->lay.ncaches + i] = (kvtc__range_t){
            c->lay.aux[i].base, c->lay.aux[i].item_bytes * c->lay.aux[i].count};
    qsort(r, n, sizeof(*r), range_cmp);
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && r[i].base <= r[m - 1].base + r[m - 1].len) {
            uint64_t end = r[i].base + r[i].len;
            if (end > r[m - 1].base + r[m - 1].len)
                r[m - 1].len = end - r[m - 1].base;
            continue;
        }
        r[m++] = r[i];
    }
    for (done = 0; done < m; done++) {
        st = kvt_mem_register(c->engine, (void *)(uintptr_t)r[done].base,
                              r[done].len, access);
        if (st != KVT_OK) {
            KVTC__LOG_E("connector: registering %#" PRIx64 "+%" PRIu64 ": %s%s",
                        r[done].base, r[done].len, kvt_status_str(st),
                        st == KVT_ERR_EXISTS
                            ? " (the memory is registered already: pass "
                              "KVT_CONN_NO_REGISTER)"
                            : "");
            goto err_unregister;
        }
    }
    c->ranges = r;
    c->nranges = m;
    return KVT_OK;

err_unregister:
    while (done-- > 0)
        kvt_mem_unregister(c->engine, (void *)(uintptr_t)r[done].base);
    free(r);
err:
    return st;
}

static void unregister_memory(kvt_conn_h c)
{
    for (size_t i = 0; i < c->nranges; i++)
        kvt_mem_unregister(c->engine, (void *)(uintptr_t)c->ranges[i].base);
    free(c->ranges);
    c->ranges = NULL;
    c->nranges = 0;
}

/* ---- Create and destroy -------------------------------------------------- */

#define P_HAS(p, bit) (((p)->field_mask & (bit)) != 0)

static kvt_status_t bad(const char *what)
{
    KVTC__LOG_E("connector: %s", what);
    return KVT_ERR_INVALID_PARAM;
}

static kvt_status_t apply_params(kvt_conn_h c, const kvt_conn_params_t *p)
{
    char why[KVTC__WHY_MAX];
    kvt_status_t st;

    if (p == NULL)
        return bad("no parameters");
    if (!P_HAS(p, KVT_CONN_PARAM_ROLE) ||
        (p->role != KVT_ROLE_PREFILL && p->role != KVT_ROLE_DECODE))
        return bad("role must be KVT_ROLE_PREFILL or KVT_ROLE_DECODE");
    if (!P_HAS(p, KVT_CONN_PARAM_ENGINE) || p->engine == NULL)
        return bad("an engine is required");
    c->role = p->role;
    c->engine = p->engine;
    c->tp_size = c->dp_size = 1;
    c->bootstrap_ms = DEFAULT_BOOTSTRAP_MS;
    c->waiting_ms = DEFAULT_WAITING_MS;
    c->transfer_ms = DEFAULT_TRANSFER_MS;
    c->heartbeat_ms = DEFAULT_HEARTBEAT_MS;
    c->peer_ms = DEFAULT_PEER_MS;
    c->submit_interval = 1;
    c->ttl_s = DEFAULT_TTL_S;
    if (P_HAS(p, KVT_CONN_PARAM_TP_SIZE))
        c->tp_size = p->tp_size;
    if (P_HAS(p, KVT_CONN_PARAM_TP_RANK))
        c->tp_rank = p->tp_rank;
    if (P_HAS(p, KVT_CONN_PARAM_DP_SIZE))
        c->dp_size = p->dp_size;
    if (P_HAS(p, KVT_CONN_PARAM_DP_RANK))
        c->dp_rank = p->dp_rank;
    if (c->tp_size == 0 || c->tp_size > 4096 || c->tp_rank >= c->tp_size)
        return bad("tp_rank must be below tp_size (1..4096)");
    if (c->dp_size == 0 || c->dp_size > 4096 || c->dp_rank >= c->dp_size ||
        (uint64_t)c->dp_size * c->tp_size > 4096)
        return bad("dp_rank must be below dp_size, and tp_size * dp_size "
                   "at most 4096");
#define TIMEOUT(bit, field, dst)                                               \
    if (P_HAS(p, bit)) {                                                       \
        if (p->field == 0)                                                     \
            return bad(#field " must be positive");                            \
        c->dst = p->field;                                                     \
    }
    TIMEOUT(KVT_CONN_PARAM_BOOTSTRAP_TIMEOUT, bootstrap_timeout_ms,
            bootstrap_ms)
    TIMEOUT(KVT_CONN_PARAM_WAITING_TIMEOUT, waiting_timeout_ms, waiting_ms)
    TIMEOUT(KVT_CONN_PARAM_TRANSFER_TIMEOUT, transfer_timeout_ms, transfer_ms)
    TIMEOUT(KVT_CONN_PARAM_HEARTBEAT, heartbeat_ms, heartbeat_ms)
    TIMEOUT(KVT_CONN_PARAM_PEER_TIMEOUT, peer_timeout_ms, peer_ms)
#undef TIMEOUT
    if (P_HAS(p, KVT_CONN_PARAM_SUBMIT_INTERVAL)) {
        if (p->submit_interval == 0)
            return bad("submit_interval must be positive");
        c->submit_interval = p->submit_interval;
    }
    if (P_HAS(p, KVT_CONN_PARAM_FLAGS)) {
        if (p->flags & ~(uint32_t)KVT_CONN_NO_REGISTER)
            return bad("unknown flags");
        c->flags = p->flags;
    }
    if (P_HAS(p, KVT_CONN_PARAM_REGISTER_TTL))
        c->ttl_s = p->register_ttl_s;
    if (P_HAS(p, KVT_CONN_PARAM_BOOTSTRAP_ADDR) && p->bootstrap_addr &&
        *p->bootstrap_addr) {
        if (strlen(p->bootstrap_addr) >= sizeof(c->server))
            return bad("bootstrap_addr is too long");
        snprintf(c->server, sizeof(c->server), "%s", p->bootstrap_addr);
    }
    if (c->role == KVT_ROLE_PREFILL && c->server[0] == '\0')
        return bad("a prefill connector needs bootstrap_addr");
    if (!P_HAS(p, KVT_CONN_PARAM_LAYOUT))
        return bad("a layout is required");
    st = kvtc__layout_from_public(&c->lay, p->layout, why, sizeof(why));
    if (st != KVT_OK) {
        KVTC__LOG_E("connector: invalid layout: %s", why);
        return st;
    }
    return KVT_OK;
}

/* The host and port prefill registers: its segment name, which must be
 * the default "host:port" of its listener. */
static kvt_status_t own_address(kvt_conn_h c)
{
    const char *name = kvt_engine_segment_name(c->engine);
    const char *colon = name ? strrchr(name, ':') : NULL;
    size_t hl;

    c->port = kvt_engine_rpc_port(c->engine);
    snprintf(c->seg_name, sizeof(c->seg_name), "%s", name ? name : "");
    if (colon == NULL || (unsigned)atoi(colon + 1) != c->port)
        return c->role == KVT_ROLE_PREFILL
                   ? bad("the engine's segment name must be its default "
                         "host:port on prefill")
                   : KVT_OK;
    hl = (size_t)(colon - name);
    if (hl > 1 && name[0] == '[' && name[hl - 1] == ']') {
        name++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(c->host))
        return bad("cannot read a host from the engine's segment name");
    memcpy(c->host, name, hl);
    c->host[hl] = '\0';
    return KVT_OK;
}

static void conn_free(kvt_conn_h c)
{
    kvtc__layout_clear(&c->lay);
    free(c->steps);
    free(c->descs);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->slow_cv);
    pthread_cond_destroy(&c->changed);
    free(c);
}

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

static void stop_threads(kvt_conn_h c)
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

kvt_status_t kvt_conn_create(const kvt_conn_params_t *params,
                             kvt_conn_h *conn_p)
{
    pthread_condattr_t ca;
    kvt_conn_h c;
    kvt_status_t st;

    if (conn_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVT_ERR_NO_MEMORY;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->wake, &ca);
    pthread_cond_init(&c->slow_cv, &ca);
    pthread_cond_init(&c->changed, &ca);
    pthread_condattr_destroy(&ca);
    c->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
             (uint64_t)(uintptr_t)c ^ 0x9e3779b97f4a7c15ull;
    c->rng |= 1;
    /* Message ids start at random, so that fragments of a peer's earlier
     * incarnation cannot be mistaken for this one's. */
    c->next_msg_id = kvtc__conn_random(c);
    st = apply_params(c, params);
    if (st != KVT_OK)
        goto err_free;
    st = own_address(c);
    if (st != KVT_OK)
        goto err_free;
    if (!(c->flags & KVT_CONN_NO_REGISTER)) {
        st = register_memory(c);
        if (st != KVT_OK)
            goto err_free;
    }
    if (c->role == KVT_ROLE_PREFILL) {
        kvt_bootc_h bc = NULL;
        char why[KVTC__WHY_MAX] = "";
        st = kvt_bootc_create(&bc);
        if (st == KVT_OK)
            st = kvt_bootc_register(
                bc, c->server, c->host, c->port, c->tp_size * c->dp_size,
                c->dp_size, c->dp_rank * c->tp_size + c->tp_rank, c->ttl_s,
                REGISTER_TIMEOUT_MS, why, sizeof(why));
        kvt_bootc_destroy(bc);
        if (st != KVT_OK) {
            KVTC__LOG_E("connector: prefill rank %u could not register: %s",
                        c->tp_rank,
                        why[0] ? why : "built without libcurl and json-c");
            goto err_unregister;
        }
        if (c->ttl_s > 0)
            c->t_register = kvtc__conn_now_ms() + c->ttl_s * 1000ull / 3;
    }
    if ((st = start_thread(c, &c->rx_tid, rx_main)) != KVT_OK ||
        (st = start_thread(c, &c->worker_tid, worker_main)) != KVT_OK ||
        (st = start_thread(c, &c->slow_tid, slow_main)) != KVT_OK)
        goto err_threads;
    KVTC__LOG_I("connector: %s rank %u/%u (dp %u/%u) on %s, %u layers",
                kvtc__role_str(c->role), c->tp_rank, c->tp_size, c->dp_rank,
                c->dp_size, c->seg_name, c->lay.nlayers);
    /* Served by the process's /metrics listener, if one runs (a failure
     * only leaves the connector out of it). */
    kvt_metrics_source_add(c, kvtc__conn_metrics_text);
    *conn_p = c;
    return KVT_OK;

err_threads:
    stop_threads(c);
    if (c->role == KVT_ROLE_PREFILL) {
        kvt_bootc_h bc = NULL;
        if (kvt_bootc_create(&bc) == KVT_OK)
            kvt_bootc_unregister(bc, c->server, c->tp_rank, c->dp_rank,
                                 HTTP_TIMEOUT_MS);
        kvt_bootc_destroy(bc);
    }
err_unregister:
    unregister_memory(c);
err_free:
    conn_free(c);
    return st;
}

static int all_final(kvt_conn_h c)
{
    for (struct kvt_room *r = c->rooms; r != NULL; r = r->next)
        if (!kvtc__room_is_final(r))
            return 0;
    return 1;
}

/*
 * Withdraw from the bootstrap server first (no new decode finds this
 * rank), abort what is not final and give the rooms the peer timeout
 * (plus a margin) to become final, then stop the threads and free. A
 * batch still in flight then (only possible if a peer never answered) is
 * left to the engine, which frees it when it is destroyed.
 */
void kvt_conn_destroy(kvt_conn_h c)
{
    uint64_t deadline;

    if (c == NULL)
        return;
    kvt_metrics_source_del(c);
    if (c->role == KVT_ROLE_PREFILL) {
        kvt_bootc_h bc = NULL;
        if (kvt_bootc_create(&bc) == KVT_OK)
            kvt_bootc_unregister(bc, c->server, c->tp_rank, c->dp_rank,
                                 HTTP_TIMEOUT_MS);
        kvt_bootc_destroy(bc);
    }
    pthread_mutex_lock(&c->lock);
    c->t_register = 0;
    for (struct kvt_room *r = c->rooms; r != NULL; r = r->next)
        if (!kvtc__room_is_final(r))
            kvtc__room_fail(r, KVT_ERR_CANCELED,
                            "the %s connector was "
                            "destroyed",
                            kvtc__role_str(c->role));
    kvtc__conn_wake(c);
    deadline = kvtc__conn_now_ms() + 2 * c->peer_ms + 1000;
    while (!all_final(c) && kvtc__conn_now_ms() < deadline)
        timed_wait(&c->changed, &c->lock, 20000000ull);
    pthread_mutex_unlock(&c->lock);
    stop_threads(c);

    while (c->rooms != NULL) {
        struct kvt_room *r = c->rooms;
        c->rooms = r->next;
        kvtc__room_free(c, r);
    }
    while (c->ctrls != NULL) {
        kvtc__ctrl_t *m = c->ctrls;
        c->ctrls = m->next;
        kvtc__conn_batch_forget(m->batch);
        if (kvt_batch_wait(m->batch, 0) != KVT_INPROGRESS)
            kvt_batch_free(m->batch);
        kvtc__sess_unref(m->sess);
        free(m);
    }
    while (c->orphans != NULL) {
        kvtc__orphan_t *o = c->orphans;
        c->orphans = o->next;
        kvtc__room_msg_clear(&o->req);
        kvtc__sess_unref(o->sess);
        free(o);
    }
    while (c->replies != NULL) {
        kvtc__reply_t *q = c->replies;
        c->replies = q->next;
        kvtc__sess_unref(q->sess);
        free(q);
    }
    while (c->tombs != NULL) {
        kvtc__tomb_t *t = c->tombs;
        c->tombs = t->next;
        free(t);
    }
    while (c->reasm != NULL) {
        kvtc__reasm_t *r = c->reasm;
        c->reasm = r->next;
        free(r->buf);
        free(r);
    }
    kvtc__sess_free_all(c);
    topo_free_all(c);
    unregister_memory(c);
    conn_free(c);
}
