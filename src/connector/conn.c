/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connector object: its parameters, its memory registration, the
 * bootstrap registration of prefill ranks, and create and destroy, which
 * start and stop the threads (conn_threads.c).
 */
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
    st = kvtc__threads_start(c);
    if (st != KVT_OK)
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
    kvtc__threads_stop(c);
    if (c->role == KVT_ROLE_PREFILL) {
        kvt_bootc_h bc = NULL;
        if (kvt_bootc_create(&bc) == KVT_OK)
            kvt_bootc_unregister(bc, c->server, c->tp_rank, c->dp_rank,
                                 KVTC__HTTP_TIMEOUT_MS);
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
                                 KVTC__HTTP_TIMEOUT_MS);
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
        kvtc__timed_wait(&c->changed, &c->lock, 20000000ull);
    pthread_mutex_unlock(&c->lock);
    kvtc__threads_stop(c);

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
    kvtc__topo_free_all(c);
    unregister_memory(c);
    conn_free(c);
}
