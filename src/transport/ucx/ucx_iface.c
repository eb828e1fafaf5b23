/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's life in an engine: the ucp context and its workers,
 * the descriptor section (the workers' addresses), memory registration
 * (ucp_mem_map, packed keys), registry changes, and the table.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "transport/ucx/ucx.h"
#include "util/log.h"
#include "util/time.h"

kvt_status_t kvt__ucx_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return KVT_OK;
    case UCS_ERR_NO_MEMORY:
        return KVT_ERR_NO_MEMORY;
    case UCS_ERR_CANCELED:
        return KVT_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return KVT_ERR_TIMEDOUT;
    case UCS_ERR_UNREACHABLE:
        return KVT_ERR_UNREACHABLE;
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_UNSUPPORTED:
        return KVT_ERR_PROTOCOL;
    default:
        return KVT_ERR_CONN_LOST;
    }
}

/* Set a ucp setting unless the environment has (UCX_@name). */
void kvt__ucx_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;

    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

void kvt__ucx_abstime(struct timespec *ts, uint64_t ns_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ns_from_now / 1000000000ull);
    ts->tv_nsec += (long)(ns_from_now % 1000000000ull);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void kvt__ucx_regchg_ack(kvt__ucx_t *ucx, uint64_t gen)
{
    pthread_mutex_lock(&ucx->lock);
    if (ucx->chg.gen == gen && ucx->chg.acks_left > 0)
        ucx->chg.acks_left--;
    pthread_cond_broadcast(&ucx->cond);
    pthread_mutex_unlock(&ucx->lock);
}

static void config_default(ucp_config_t *c, const char *name, const char *v)
{
    char env[64];
    ucs_status_t st;

    snprintf(env, sizeof(env), "UCX_%s", name);
    if (getenv(env) != NULL)
        return;
    st = ucp_config_modify(c, name, v);
    if (st != UCS_OK)
        KVT_LOG_W("ucx: cannot set %s=%s: %s", name, v, ucs_status_string(st));
}

static kvt_status_t context_create(kvt__ucx_t *ucx)
{
    const kvt__engine_cfg_t *cfg = ucx->cfg;
    ucp_params_t p = {0};
    ucp_config_t *c;
    ucs_status_t st;
    char v[64];

    st = ucp_config_read(NULL, NULL, &c);
    if (st != UCS_OK) {
        KVT_LOG_E("ucx: cannot read its configuration: %s",
                  ucs_status_string(st));
        return KVT_ERR_IO;
    }
    if (cfg->net_devices[0] != '\0')
        config_default(c, "NET_DEVICES", cfg->net_devices);
    else if (strncmp(cfg->host, "127.", 4) == 0 ||
             strcmp(cfg->host, "localhost") == 0)
        /* An engine that listens on loopback talks to this host only. */
        config_default(c, "NET_DEVICES", "lo");
    /* A dead peer is found by keepalive within about a second (a third
     * of the transfer timeout when that is shorter), well before its
     * transfers time out. */
    snprintf(v, sizeof(v), "%llums",
             (unsigned long long)(cfg->timeout_ns / 3000000ull < 1000
                                      ? (cfg->timeout_ns / 3000000ull > 10
                                             ? cfg->timeout_ns / 3000000ull
                                             : 10)
                                      : 1000));
    config_default(c, "KEEPALIVE_INTERVAL", v);
    p.field_mask = UCP_PARAM_FIELD_FEATURES |
                   UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1; /* memory is mapped from any thread */
    p.name = "kvt";
    st = ucp_init(&p, c, &ucx->ctx);
    ucp_config_release(c);
    if (st != UCS_OK) {
        KVT_LOG_E("ucx: ucp_init failed: %s", ucs_status_string(st));
        return KVT_ERR_IO;
    }
#ifdef KVT_HAVE_CUDA
    {
        /* Device memory, when this UCX was built for it (CUDA transports,
         * GPUDirect RDMA): its regions are then mapped with their memory
         * type; otherwise ucx leaves device memory to other transports. */
        ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
        if (ucp_context_query(ucx->ctx, &a) == UCS_OK &&
            (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA))) {
            ucx->base.local_mem |= KVT__MEM_BIT(KVT_MEM_CUDA);
            ucx->base.remote_mem |= KVT__MEM_BIT(KVT_MEM_CUDA);
            KVT_LOG_I("ucx: this UCX moves CUDA memory");
        }
    }
#endif
    return KVT_OK;
}

static void worker_fini(ucx_worker_t *wk)
{
    free(wk->closing);
    if (wk->addr != NULL)
        ucp_worker_release_address(wk->w, (ucp_address_t *)wk->addr);
    if (wk->w != NULL)
        ucp_worker_destroy(wk->w);
    if (wk->epfd >= 0)
        close(wk->epfd);
    if (wk->evfd >= 0)
        close(wk->evfd);
    pthread_mutex_destroy(&wk->lock);
}

static kvt_status_t worker_init(kvt__ucx_t *ucx, ucx_worker_t *wk, unsigned id)
{
    ucp_worker_params_t wp = {0};
    struct epoll_event ev;
    ucp_address_t *a;
    ucs_status_t st;

    wk->ucx = ucx;
    wk->id = id;
    wk->epfd = wk->evfd = wk->efd = -1;
    pthread_mutex_init(&wk->lock, NULL);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(ucx->ctx, &wp, &wk->w);
    if (st != UCS_OK) {
        wk->w = NULL;
        KVT_LOG_E("ucx: ucp_worker_create failed: %s", ucs_status_string(st));
        return KVT_ERR_IO;
    }
    st = ucp_worker_get_address(wk->w, &a, &wk->addr_len);
    if (st != UCS_OK || wk->addr_len > UCX_ADDR_MAX) {
        KVT_LOG_E("ucx: no worker address: %s", ucs_status_string(st));
        return KVT_ERR_IO;
    }
    wk->addr = (uint8_t *)a;
    st = ucp_worker_get_efd(wk->w, &wk->efd);
    wk->epfd = epoll_create1(EPOLL_CLOEXEC);
    wk->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st != UCS_OK || wk->epfd < 0 || wk->evfd < 0) {
        KVT_LOG_E("ucx: no event descriptors: %s",
                  st != UCS_OK ? ucs_status_string(st) : strerror(errno));
        return KVT_ERR_IO;
    }
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = wk->evfd};
    epoll_ctl(wk->epfd, EPOLL_CTL_ADD, wk->evfd, &ev);
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = wk->efd};
    epoll_ctl(wk->epfd, EPOLL_CTL_ADD, wk->efd, &ev);
    return kvt__ucx_am_setup(wk);
}

/* The section: u32 count, then per worker u32 length and its address. */
static kvt_status_t section_build(kvt__ucx_t *ucx)
{
    size_t len = 4;
    uint8_t *p;

    for (unsigned i = 0; i < ucx->nworkers; i++)
        len += 4 + ucx->workers[i].addr_len;
    p = ucx->section = malloc(len);
    if (p == NULL)
        return KVT_ERR_NO_MEMORY;
    ucx->section_len = (uint32_t)len;
    memcpy(p, &ucx->nworkers, 4);
    p += 4;
    for (unsigned i = 0; i < ucx->nworkers; i++) {
        uint32_t l = (uint32_t)ucx->workers[i].addr_len;
        memcpy(p, &l, 4);
        memcpy(p + 4, ucx->workers[i].addr, l);
        p += 4 + l;
    }
    return KVT_OK;
}

static void ucx_free(kvt__ucx_t *ucx)
{
    if (ucx->workers != NULL) {
        for (unsigned i = 0; i < ucx->nworkers; i++)
            if (ucx->workers[i].ucx != NULL)
                worker_fini(&ucx->workers[i]);
        free(ucx->workers);
    }
    if (ucx->ctx != NULL)
        ucp_cleanup(ucx->ctx);
    free(ucx->section);
    pthread_mutex_destroy(&ucx->reg_serial);
    pthread_mutex_destroy(&ucx->lock);
    pthread_cond_destroy(&ucx->cond);
    free(ucx);
}

static _Atomic unsigned inbound_max;

void kvt__ucx_inbound_max_set(unsigned n)
{
    atomic_store(&inbound_max, n);
}

static kvt_status_t ucx_create(kvt_engine_h e, kvt__tl_t **tl_p)
{
    kvt__ucx_t *ucx;
    kvt_status_t st;

    ucx = calloc(1, sizeof(*ucx));
    if (ucx == NULL)
        return KVT_ERR_NO_MEMORY;
    kvt__tl_init(&ucx->base, &kvt__tl_ucx, e);
    ucx->e = e;
    ucx->cfg = kvt__engine_cfg(e);
    ucx->max_inbound = atomic_load(&inbound_max);
    if (ucx->max_inbound == 0)
        ucx->max_inbound = UCX_INBOUND_MAX;
    pthread_mutex_init(&ucx->reg_serial, NULL);
    pthread_mutex_init(&ucx->lock, NULL);
    kvt__ucx_cond_init(&ucx->cond);
    atomic_store(&ucx->next_token, (kvt__now_ns() << 16) | 1);
    st = context_create(ucx);
    if (st != KVT_OK)
        goto err;
    ucx->nworkers = ucx->cfg->num_workers;
    ucx->workers = calloc(ucx->nworkers, sizeof(*ucx->workers));
    if (ucx->workers == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err;
    }
    for (unsigned i = 0; i < ucx->nworkers; i++) {
        st = worker_init(ucx, &ucx->workers[i], i);
        if (st != KVT_OK)
            goto err;
    }
    st = section_build(ucx);
    if (st != KVT_OK)
        goto err;
    *tl_p = &ucx->base;
    return KVT_OK;

err:
    ucx_free(ucx);
    return st;
}

static kvt_status_t ucx_start(kvt__tl_t *tl)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;

    for (unsigned i = 0; i < ucx->nworkers; i++) {
        if (pthread_create(&ucx->workers[i].thread, NULL, kvt__ucx_worker_main,
                           &ucx->workers[i]) != 0) {
            KVT_LOG_E("ucx: cannot start worker threads");
            atomic_store(&ucx->stopping, 1);
            for (unsigned j = 0; j < i; j++) {
                kvt__ucx_wake(&ucx->workers[j]);
                pthread_join(ucx->workers[j].thread, NULL);
            }
            return KVT_ERR_IO;
        }
    }
    ucx->started = 1;
    return KVT_OK;
}

static void ucx_stop(kvt__tl_t *tl)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;

    if (!ucx->started || atomic_exchange(&ucx->stopping, 1))
        return;
    for (unsigned i = 0; i < ucx->nworkers; i++)
        kvt__ucx_wake(&ucx->workers[i]);
    for (unsigned i = 0; i < ucx->nworkers; i++)
        pthread_join(ucx->workers[i].thread, NULL);
    /* A registry change waiting for acknowledgements gives up. */
    pthread_mutex_lock(&ucx->lock);
    ucx->chg.workers_left = ucx->chg.acks_left = 0;
    pthread_cond_broadcast(&ucx->cond);
    pthread_mutex_unlock(&ucx->lock);
}

static void ucx_destroy(kvt__tl_t *tl)
{
    ucx_free((kvt__ucx_t *)tl);
}

/* The section: u64 registry generation (read before the core lists the
 * regions), then the workers' addresses (section_build()). */
static kvt_status_t ucx_describe(kvt__tl_t *tl, kvt__segdesc_t *d)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;
    uint64_t gen = atomic_load(&ucx->gen);
    uint8_t *body = malloc(8 + ucx->section_len);
    kvt_status_t st;

    if (body == NULL)
        return KVT_ERR_NO_MEMORY;
    memcpy(body, &gen, 8);
    memcpy(body + 8, ucx->section, ucx->section_len);
    st = kvt__segdesc_add_tl(d, kvt__tl_ucx.id, kvt__tl_ucx.name,
                             UCX_SECTION_VERSION, body, 8 + ucx->section_len);
    free(body);
    return st;
}

/* ---- Memory ----------------------------------------------------------------
 */

static kvt_status_t ucx_mem_reg(kvt__tl_t *tl, const kvt__region_t *r,
                                kvt__tl_key_t *key)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;
    ucp_mem_map_params_t mp = {0};
    ucp_mem_h memh;
    void *buf;
    size_t len;
    ucs_status_t st;

    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
        UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = (void *)(uintptr_t)r->start;
    mp.length = r->end - r->start;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    if (r->access & KVT_ACCESS_REMOTE_READ)
        mp.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
    if (r->access & KVT_ACCESS_REMOTE_WRITE)
        mp.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
    mp.memory_type =
        r->kind == KVT_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    st = ucp_mem_map(ucx->ctx, &mp, &memh);
    if (st != UCS_OK) {
        KVT_LOG_E("ucx: ucp_mem_map of %#llx+%llu failed: %s",
                  (unsigned long long)r->start,
                  (unsigned long long)(r->end - r->start),
                  ucs_status_string(st));
        return kvt__ucx_status(st);
    }
    st = ucp_rkey_pack(ucx->ctx, memh, &buf, &len);
    if (st != UCS_OK || len > KVT_SEGDESC_KEY_MAX) {
        KVT_LOG_E("ucx: cannot pack the key of %#llx: %s",
                  (unsigned long long)r->start,
                  st != UCS_OK ? ucs_status_string(st) : "too long");
        if (st == UCS_OK)
            ucp_rkey_buffer_release(buf);
        ucp_mem_unmap(ucx->ctx, memh);
        return KVT_ERR_IO;
    }
    key->rkey = malloc(len);
    if (key->rkey == NULL) {
        ucp_rkey_buffer_release(buf);
        ucp_mem_unmap(ucx->ctx, memh);
        return KVT_ERR_NO_MEMORY;
    }
    memcpy(key->rkey, buf, len);
    key->rkey_len = (uint32_t)len;
    key->memh = memh;
    ucp_rkey_buffer_release(buf);
    return KVT_OK;
}

static void ucx_mem_dereg(kvt__tl_t *tl, const kvt__region_t *r,
                          kvt__tl_key_t *key)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;

    (void)r;
    if (key->memh != NULL)
        ucp_mem_unmap(ucx->ctx, key->memh);
    key->memh = NULL;
}

/*
 * Every initiator is told (REG_CHANGED) and acknowledges once nothing it
 * posted under the old keys is in flight. Waits at most the transfer
 * timeout (5 s at the most); a peer that has not acknowledged by then is
 * dropped (its back endpoint closed) and said so.
 */
static void ucx_mem_changed(kvt__tl_t *tl)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;
    uint64_t wait_ns = ucx->cfg->timeout_ns < 5000000000ull
                           ? ucx->cfg->timeout_ns
                           : 5000000000ull;
    uint64_t deadline = kvt__now_ns() + wait_ns, gen;
    int late = 0;

    if (!ucx->started || atomic_load(&ucx->stopping))
        return;
    pthread_mutex_lock(&ucx->reg_serial);
    gen = atomic_fetch_add(&ucx->gen, 1) + 1;
    if (atomic_load(&ucx->ninbound) == 0) {
        /* Nobody to tell: an initiator whose HELLO comes later sees that
         * its descriptor predates @gen (on_hello()). */
        pthread_mutex_unlock(&ucx->reg_serial);
        return;
    }
    pthread_mutex_lock(&ucx->lock);
    ucx->chg = (ucx_regchg_t){gen, ucx->nworkers, 0};
    pthread_mutex_unlock(&ucx->lock);
    for (unsigned i = 0; i < ucx->nworkers; i++) {
        ucx_msg_t *m = calloc(1, sizeof(*m));
        if (m == NULL) {
            kvt__ucx_regchg_done(ucx, gen, 0);
            continue;
        }
        m->kind = MSG_REG_CHANGED;
        m->gen = gen;
        kvt__ucx_post(&ucx->workers[i], m, 1);
    }
    pthread_mutex_lock(&ucx->lock);
    while (ucx->chg.workers_left > 0 || ucx->chg.acks_left > 0) {
        uint64_t now = kvt__now_ns();
        struct timespec ts;
        if (now >= deadline) {
            late = 1;
            break;
        }
        kvt__ucx_abstime(&ts, deadline - now);
        pthread_cond_timedwait(&ucx->cond, &ucx->lock, &ts);
    }
    ucx->chg.gen = 0;
    pthread_mutex_unlock(&ucx->lock);
    if (late) {
        KVT_LOG_W("ucx: a peer did not confirm a registry change within "
                  "%llu ms; it is dropped",
                  (unsigned long long)(wait_ns / 1000000));
        for (unsigned i = 0; i < ucx->nworkers; i++) {
            ucx_msg_t *m = calloc(1, sizeof(*m));
            if (m == NULL)
                continue;
            m->kind = MSG_REG_CHANGED;
            m->gen = 0; /* drop those that still owe an acknowledgement */
            kvt__ucx_post(&ucx->workers[i], m, 1);
        }
    }
    pthread_mutex_unlock(&ucx->reg_serial);
}

void kvt__ucx_regchg_done(kvt__ucx_t *ucx, uint64_t gen, unsigned acks)
{
    pthread_mutex_lock(&ucx->lock);
    if (ucx->chg.gen == gen && ucx->chg.workers_left > 0) {
        ucx->chg.workers_left--;
        ucx->chg.acks_left += acks;
    }
    pthread_cond_broadcast(&ucx->cond);
    pthread_mutex_unlock(&ucx->lock);
}

static int ucx_reachable(kvt__tl_t *tl, const kvt__segdesc_t *peer,
                         const char **why_p)
{
    const kvt__segdesc_tl_t *sec = kvt__segdesc_tl(peer, kvt__tl_ucx.id);
    uint32_t n;

    (void)tl;
    if (sec == NULL || sec->version != UCX_SECTION_VERSION || sec->len < 12) {
        *why_p = "its ucx section is of another version";
        return 0;
    }
    memcpy(&n, sec->body + 8, 4);
    if (n == 0) {
        *why_p = "it has no ucx workers";
        return 0;
    }
    return 1;
}

/* UCX's version and the transports and devices its context took, as UCX
 * prints them ("resource N : md M dev D flags -- tcp/eth0"). */
static void ucx_host_info(kvt__tl_t *tl, char *buf, size_t cap)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;
    char *text = NULL, *line, *save = NULL;
    size_t len = 0, n;
    FILE *f;

    n = (size_t)snprintf(buf, cap, "UCX %s", ucp_get_version_string());
    f = open_memstream(&text, &len);
    if (f == NULL)
        return;
    ucp_context_print_info(ucx->ctx, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL && n < cap;
         line = strtok_r(NULL, "\n", &save)) {
        const char *r = strstr(line, "resource"), *dash = strstr(line, "-- ");
        if (r == NULL || dash == NULL)
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s",
                              strstr(buf, ": ") ? ", " : ": ", dash + 3);
    }
    free(text);
}

/* clang-format off */
KVT_TRANSPORT_REGISTER(ucx, {
    .name = "ucx",
    .id = KVT_TRANSPORT_UCX,
    .caps = {.local_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .remote_mem = KVT__MEM_BIT(KVT_MEM_HOST),
             .flags = KVT__TL_STRIDED | KVT__TL_EXPLICIT,
             .priority = 20},
    .create = ucx_create,
    .start = ucx_start,
    .stop = ucx_stop,
    .destroy = ucx_destroy,
    .describe = ucx_describe,
    .mem_reg = ucx_mem_reg,
    .mem_dereg = ucx_mem_dereg,
    .mem_changed = ucx_mem_changed,
    .reachable = ucx_reachable,
    .open = kvt__ucx_open,
    .submit = kvt__ucx_submit,
    .flush = kvt__ucx_flush_tl,
    .kill = kvt__ucx_kill,
    .host_info = ucx_host_info,
    .destroy_session = kvt__ucx_session_destroy,
});
/* clang-format on */
