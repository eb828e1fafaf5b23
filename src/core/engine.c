/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's lifetime: kvt_engine_create() applies the parameters,
 * starts the control plane and every transport allowed, and publishes
 * the descriptor to the metadata backend; kvt_engine_destroy() undoes it
 * in the reverse order. Also what transports read of the engine (its
 * settings, its registry) and the descriptor it serves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "core/ctrl.h"
#include "core/tl.h"
#include "meta/meta.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/thread.h"

#define DEFAULT_TIMEOUT_MS 30000ull
#define DEFAULT_CONNECT_TIMEOUT_MS 5000ull

/* Two engines may use same-host transports only when both the boot id and
 * the pid namespace match. */
uint64_t kvt__host_identity(void)
{
    uint64_t h = KVT_FNV1A_SEED;
    char buf[128];
    struct stat st;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    if (f != NULL) {
        if (fgets(buf, sizeof(buf), f) != NULL)
            h = kvt__fnv1a(h, buf, strlen(buf));
        fclose(f);
    }
    if (stat("/proc/self/ns/pid", &st) == 0)
        h = kvt__fnv1a(h, &st.st_ino, sizeof(st.st_ino));
    return h;
}

static kvt_status_t apply_params(kvt_engine_h e, const kvt_engine_params_t *p)
{
    uint64_t m = p ? p->field_mask : 0;
    const char *host = "127.0.0.1";
    uint64_t timeout_ms = 0;

    e->cfg.num_workers = 2;
    e->cfg.conns_per_peer = 2;
    e->transports = KVT_TRANSPORT_ALL;
    e->cfg.slice_size = 4u << 20;
    e->cfg.connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;

    if ((m & KVT_ENGINE_PARAM_LOCAL_HOST) && p->local_host && *p->local_host)
        host = p->local_host;
    if (strlen(host) > KVT_WIRE_NAME_MAX - 8)
        return KVT_ERR_INVALID_PARAM;
    snprintf(e->cfg.host, sizeof(e->cfg.host), "%s", host);
    if (((m & KVT_ENGINE_PARAM_AUTH_TOKEN)
             ? kvt__auth_init(&e->cfg.auth, p->auth_token)
             : kvt__auth_init_env(&e->cfg.auth)) != KVT_OK) {
        KVT_LOG_E("the auth token is longer than %d bytes", KVT_AUTH_TOKEN_MAX);
        return KVT_ERR_INVALID_PARAM;
    }
    if (m & KVT_ENGINE_PARAM_PORT)
        e->cfg.port = p->port;
    if (m & KVT_ENGINE_PARAM_NUM_WORKERS) {
        if (p->num_workers < 1 || p->num_workers > 64)
            return KVT_ERR_INVALID_PARAM;
        e->cfg.num_workers = p->num_workers;
    }
    if ((m & KVT_ENGINE_PARAM_METADATA_URI) && p->metadata_uri) {
        kvt__meta_params_t mp = {0};
        uint64_t ttl_ms = 0;
        kvt__meta_t *meta;
        kvt_status_t st;

        kvt__env_seconds_ms("KVT_METADATA_TTL", 2, 3600, &ttl_ms);
        if (ttl_ms > 0) {
            mp.field_mask = KVT__META_PARAM_TTL;
            mp.ttl_s = (uint32_t)((ttl_ms + 999) / 1000);
        }
        mp.field_mask |= KVT__META_PARAM_AUTH;
        mp.auth = e->cfg.auth;
        st = kvt__meta_create(p->metadata_uri, &mp, &meta);
        if (st != KVT_OK) {
            KVT_LOG_E("metadata backend '%s': %s", p->metadata_uri,
                      kvt_status_str(st));
            return st;
        }
        if (kvt__meta_kind(meta) == KVT__META_P2P)
            kvt__meta_destroy(meta);
        else
            e->meta = meta;
    }
    if (m & KVT_ENGINE_PARAM_TRANSPORTS) {
        if (p->transports == 0)
            return KVT_ERR_INVALID_PARAM;
        e->transports = p->transports;
    }
    if (m & KVT_ENGINE_PARAM_CONNS_PER_PEER) {
        if (p->conns_per_peer < 1 || p->conns_per_peer > 16)
            return KVT_ERR_INVALID_PARAM;
        e->cfg.conns_per_peer = p->conns_per_peer;
    }
    if (m & KVT_ENGINE_PARAM_TRANSFER_TIMEOUT) {
        if (p->transfer_timeout_ms == 0)
            return KVT_ERR_INVALID_PARAM;
        timeout_ms = p->transfer_timeout_ms;
    }
    if (timeout_ms == 0)
        kvt__env_seconds_ms("KVT_TRANSFER_TIMEOUT", 0.001, 1e7, &timeout_ms);
    if (timeout_ms == 0)
        kvt__env_seconds_ms("MC_TRANSFER_TIMEOUT", 0.001, 1e7, &timeout_ms);
    if (timeout_ms == 0)
        timeout_ms = DEFAULT_TIMEOUT_MS;
    e->cfg.timeout_ns = timeout_ms * 1000000ull;
    if (m & KVT_ENGINE_PARAM_SLICE_SIZE) {
        if (p->slice_size < 4096 || p->slice_size > KVT_WIRE_MAX_PAYLOAD)
            return KVT_ERR_INVALID_PARAM;
        e->cfg.slice_size = p->slice_size;
    }
    if (m & KVT_ENGINE_PARAM_CONNECT_TIMEOUT) {
        if (p->connect_timeout_ms == 0)
            return KVT_ERR_INVALID_PARAM;
        e->cfg.connect_timeout_ms = p->connect_timeout_ms;
    }
    if (e->cfg.connect_timeout_ms > timeout_ms)
        e->cfg.connect_timeout_ms = timeout_ms;
    if ((m & KVT_ENGINE_PARAM_SEGMENT_NAME) && p->segment_name &&
        *p->segment_name) {
        if (strlen(p->segment_name) > KVT_WIRE_NAME_MAX)
            return KVT_ERR_INVALID_PARAM;
        snprintf(e->cfg.seg_name, sizeof(e->cfg.seg_name), "%s",
                 p->segment_name);
    }
    if ((m & KVT_ENGINE_PARAM_NET_DEVICES) && p->net_devices) {
        if (strlen(p->net_devices) >= sizeof(e->cfg.net_devices))
            return KVT_ERR_INVALID_PARAM;
        snprintf(e->cfg.net_devices, sizeof(e->cfg.net_devices), "%s",
                 p->net_devices);
    }
    return KVT_OK;
}

/* ---- Publishing to a metadata backend ---------------------------------- */

static kvt_status_t publish_now(kvt_engine_h e)
{
    kvt__segdesc_t d;
    kvt_status_t st = kvt__engine_segdesc_fill(e, &d);
    if (st != KVT_OK)
        return st;
    st = kvt__meta_publish_segdesc(e->meta, &d);
    kvt__segdesc_clear(&d);
    return st;
}

/*
 * The publisher stores the descriptor again after every change of the
 * registered regions, off the caller's thread (registration never waits
 * for the network). Bursts of changes coalesce into one publish.
 */
static void *publisher_main(void *arg)
{
    kvt_engine_h e = arg;

    kvt__thread_name("kvt-publish");
    pthread_mutex_lock(&e->pub_lock);
    while (!e->pub_stop) {
        kvt_status_t st;
        if (!e->pub_dirty) {
            pthread_cond_wait(&e->pub_cond, &e->pub_lock);
            continue;
        }
        e->pub_dirty = 0;
        pthread_mutex_unlock(&e->pub_lock);
        st = publish_now(e);
        if (st != KVT_OK)
            KVT_LOG_W("publishing segment %s: %s (the heartbeat retries)",
                      e->cfg.seg_name, kvt_status_str(st));
        pthread_mutex_lock(&e->pub_lock);
    }
    pthread_mutex_unlock(&e->pub_lock);
    return NULL;
}

/* First publish in the caller's thread, so that peers can look this
 * engine up as soon as kvt_engine_create() returns (when the server is
 * up; otherwise the heartbeat stores it once the server answers). */
static void publish_start(kvt_engine_h e)
{
    kvt_status_t st = publish_now(e);
    if (st != KVT_OK)
        KVT_LOG_E("cannot publish segment %s to the metadata backend: %s; "
                  "retrying in the background",
                  e->cfg.seg_name, kvt_status_str(st));
    st = kvt__meta_heartbeat_start(e->meta);
    if (st != KVT_OK)
        KVT_LOG_E("metadata heartbeat: %s", kvt_status_str(st));
    if (pthread_create(&e->pub_thread, NULL, publisher_main, e) == 0)
        e->pub_started = 1;
    else
        KVT_LOG_E("cannot start the metadata publisher thread");
}

static void publish_stop(kvt_engine_h e)
{
    if (!e->pub_started)
        return;
    pthread_mutex_lock(&e->pub_lock);
    e->pub_stop = 1;
    pthread_cond_signal(&e->pub_cond);
    pthread_mutex_unlock(&e->pub_lock);
    pthread_join(e->pub_thread, NULL);
    e->pub_started = 0;
}

void kvt__engine_publish_soon(kvt_engine_h e)
{
    if (e->meta == NULL)
        return;
    pthread_mutex_lock(&e->pub_lock);
    e->pub_dirty = 1;
    pthread_cond_signal(&e->pub_cond);
    pthread_mutex_unlock(&e->pub_lock);
}

/* ---- Transports ---------------------------------------------------------- */

/*
 * Create and start an instance of every transport built in that the user
 * allows. One that cannot be set up is left out and said so (its peers
 * use the others); none at all fails the engine.
 */
static kvt_status_t transports_create(kvt_engine_h e)
{
    const kvt__tl_ops_t *ops;

    for (size_t i = 0; (ops = kvt__tl_registered(i)) != NULL; i++) {
        kvt__tl_t *tl = NULL;
        kvt_status_t st;

        if ((e->transports & ops->id) == 0 || e->ntl == KVT__TL_MAX ||
            !kvt__tl_ops_sound(ops))
            continue;
        /* An explicit transport runs only when named. */
        if ((ops->caps.flags & KVT__TL_EXPLICIT) &&
            e->transports == KVT_TRANSPORT_ALL)
            continue;
        st = ops->create(e, &tl);
        if (st == KVT_OK && ops->start != NULL) {
            st = ops->start(tl);
            if (st != KVT_OK)
                ops->destroy(tl);
        }
        if (st != KVT_OK) {
            KVT_LOG_W("transport %s is not available: %s", ops->name,
                      kvt_status_str(st));
            if (e->ntl_off < KVT__TL_MAX) {
                e->tl_off[e->ntl_off] = ops;
                e->tl_off_st[e->ntl_off++] = st;
            }
            continue;
        }
        tl->index = e->ntl;
        e->tl[e->ntl++] = tl;
        if (ops->accept != NULL)
            kvt__ctrl_add_taker(e->ctrl, tl);
    }
    if (e->ntl == 0) {
        KVT_LOG_E("no transport is available (allowed: %#x)", e->transports);
        return KVT_ERR_NOT_SUPPORTED;
    }
    return KVT_OK;
}

static void transports_stop(kvt_engine_h e)
{
    for (unsigned i = e->ntl; i-- > 0;)
        if (e->tl[i]->ops->stop != NULL)
            e->tl[i]->ops->stop(e->tl[i]);
}

static void transports_destroy(kvt_engine_h e)
{
    for (unsigned i = e->ntl; i-- > 0;)
        e->tl[i]->ops->destroy(e->tl[i]);
    e->ntl = 0;
}

kvt_status_t kvt__transport_sections(kvt_engine_h e, kvt__segdesc_t *d)
{
    for (unsigned i = 0; i < e->ntl; i++) {
        const kvt__tl_ops_t *ops = e->tl[i]->ops;
        kvt_status_t st =
            ops->describe != NULL
                ? ops->describe(e->tl[i], d)
                : kvt__segdesc_add_tl(d, ops->id, ops->name, 1, NULL, 0);
        if (st != KVT_OK)
            return st;
    }
    return KVT_OK;
}

/* ---- What transports read of the engine --------------------------------- */

const kvt__engine_cfg_t *kvt__engine_cfg(kvt_engine_h e)
{
    return &e->cfg;
}

kvt__memreg_t *kvt__engine_reg(kvt_engine_h e)
{
    return &e->reg;
}

void kvt__engine_landed(kvt_engine_h e)
{
    atomic_fetch_add_explicit(&e->landed, 1, memory_order_release);
}

void kvt__engine_refused(kvt_engine_h e)
{
    atomic_fetch_add_explicit(&e->stats.hs_refused, 1, memory_order_relaxed);
}

kvt_status_t kvt_engine_create(const kvt_engine_params_t *params,
                               kvt_engine_h *engine_p)
{
    pthread_condattr_t ca;
    kvt_engine_h e;
    kvt_status_t st;

    kvt__log_init();
    if (engine_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    st = kvt__env_check(); /* a bad setting: refused, said why */
    if (st != KVT_OK)
        return st;
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return KVT_ERR_NO_MEMORY;
    st = apply_params(e, params);
    if (st != KVT_OK) {
        KVT_LOG_E("engine parameters: %s", kvt_status_str(st));
        goto err_meta;
    }
    e->cfg.host_id = kvt__host_identity();
    st = kvt__memreg_init(&e->reg);
    if (st != KVT_OK)
        goto err_meta;
    st = kvt__stats_init(e);
    if (st != KVT_OK) {
        kvt__memreg_fini(&e->reg);
        goto err_meta;
    }
    pthread_mutex_init(&e->sess_lock, NULL);
    pthread_mutex_init(&e->nq_lock, NULL);
    pthread_mutex_init(&e->batch_lock, NULL);
    pthread_mutex_init(&e->alloc_lock, NULL);
    pthread_mutex_init(&e->pub_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->nq_cond, &ca);
    pthread_cond_init(&e->pub_cond, &ca);
    pthread_condattr_destroy(&ca);

    st = kvt__ctrl_create(e, e->cfg.host, e->cfg.port, &e->cfg.port, &e->ctrl);
    if (st != KVT_OK)
        goto err_locks;
    if (e->cfg.seg_name[0] == '\0')
        snprintf(e->cfg.seg_name, sizeof(e->cfg.seg_name),
                 strchr(e->cfg.host, ':') ? "[%s]:%u" : "%s:%u", e->cfg.host,
                 e->cfg.port);
    st = transports_create(e);
    if (st != KVT_OK)
        goto err_ctrl;
    /* The name is final and the transports run before the control plane
     * answers anyone. */
    st = kvt__ctrl_start(e->ctrl);
    if (st != KVT_OK)
        goto err_transports;
    if (e->meta != NULL)
        publish_start(e);
    KVT_LOG_I("engine %s up: %u workers, %u connections per peer, "
              "transfer timeout %.1f s%s",
              e->cfg.seg_name, e->cfg.num_workers, e->cfg.conns_per_peer,
              (double)e->cfg.timeout_ns / 1e9,
              e->cfg.auth.on ? ", peers must prove the auth token" : "");
    *engine_p = e;
    return KVT_OK;

err_transports:
    transports_stop(e);
    transports_destroy(e);
err_ctrl:
    kvt__ctrl_destroy(e->ctrl);
err_locks:
    pthread_cond_destroy(&e->pub_cond);
    pthread_mutex_destroy(&e->pub_lock);
    pthread_cond_destroy(&e->nq_cond);
    pthread_mutex_destroy(&e->alloc_lock);
    pthread_mutex_destroy(&e->batch_lock);
    pthread_mutex_destroy(&e->nq_lock);
    pthread_mutex_destroy(&e->sess_lock);
    kvt__memreg_fini(&e->reg);
    kvt__stats_fini(e);
err_meta:
    kvt__meta_destroy(e->meta);
    free(e);
    return st;
}

void kvt_engine_destroy(kvt_engine_h e)
{
    struct kvt_batch *b, *bn;

    if (e == NULL)
        return;
    kvt__stats_unlist(e); /* off /metrics before anything goes */
    atomic_store(&e->stopping, 1);
    /* No transfer ordered on a CUDA stream starts from here on. */
    kvt__streams_close(e);
    /* Withdraw from the metadata backend first, so that peers stop
     * finding this engine. */
    publish_stop(e);
    kvt__meta_destroy(e->meta);
    e->meta = NULL;
    /* No new peers; then each transport fails everything in flight with
     * KVT_ERR_CANCELED and stops its threads, and the sessions go. */
    kvt__ctrl_stop(e->ctrl);
    transports_stop(e);
    kvt__segs_free_all(e);
    kvt__mem_release_all(e);
    transports_destroy(e);
    kvt__ctrl_destroy(e->ctrl);
    for (b = e->batches; b != NULL; b = bn) {
        bn = b->next;
        free(b->slots);
        free(b);
    }
    kvt__alloc_free_all(e);
    kvt__streams_release(e);
    pthread_mutex_destroy(&e->alloc_lock);
    kvt__notify_free_all(e);
    pthread_cond_destroy(&e->pub_cond);
    pthread_mutex_destroy(&e->pub_lock);
    pthread_cond_destroy(&e->nq_cond);
    pthread_mutex_destroy(&e->batch_lock);
    pthread_mutex_destroy(&e->nq_lock);
    pthread_mutex_destroy(&e->sess_lock);
    kvt__memreg_fini(&e->reg);
    kvt__stats_fini(e);
    kvt__wipe(&e->cfg.auth, sizeof(e->cfg.auth));
    free(e);
}

const char *kvt_engine_segment_name(kvt_engine_h e)
{
    return e ? e->cfg.seg_name : "";
}

uint16_t kvt_engine_rpc_port(kvt_engine_h e)
{
    return e ? e->cfg.port : 0;
}

/* ---- Memory ---------------------------------------------------------------
 */

kvt_status_t kvt__engine_segdesc_fill(kvt_engine_h e, kvt__segdesc_t *d)
{
    kvt_status_t st;

    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "%s", e->cfg.seg_name);
    snprintf(d->host, sizeof(d->host), "%s", e->cfg.host);
    d->port = e->cfg.port;
    d->host_id = e->cfg.host_id;
    d->pid = (uint32_t)getpid();
    st = kvt__transport_sections(e, d);
    if (st == KVT_OK)
        st = kvt__mem_describe(e, d);
    if (st != KVT_OK)
        kvt__segdesc_clear(d);
    return st;
}

kvt_status_t kvt__engine_segdesc(kvt_engine_h e, uint8_t **buf_p, size_t *len_p)
{
    kvt__segdesc_t d;
    kvt_status_t st;

    st = kvt__engine_segdesc_fill(e, &d);
    if (st != KVT_OK)
        return st;
    st = kvt__segdesc_encode(&d, buf_p, len_p);
    kvt__segdesc_clear(&d);
    return st;
}
