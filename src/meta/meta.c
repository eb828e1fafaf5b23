/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metadata client: URI dispatch, argument checks, ownership of
 * published keys and the heartbeat thread. Backends only move bytes.
 */
#include "meta/meta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meta/meta_int.h"
#include "util/log.h"
#include "util/thread.h"

#define DEFAULT_TIMEOUT_MS 3000u
#define DEFAULT_TTL_S 10u

/* ---- p2p and backends that are not built --------------------------------- */

static kvt_status_t p2p_open(kvt__meta_t *m)
{
    (void)m;
    return KVT_OK;
}

static const kvt__meta_ops_t p2p_ops = {
    .name = "p2p",
    .open = p2p_open,
};

static const kvt__meta_ops_t *backend_ops(kvt__meta_kind_t kind,
                                          const char **lacks_p)
{
    switch (kind) {
    case KVT__META_P2P:
        return &p2p_ops;
    case KVT__META_HTTP:
#ifdef KVT_WITH_CURL
        return &kvt__meta_http_ops;
#else
        *lacks_p = "libcurl (KVT_WITH_CURL)";
        return NULL;
#endif
    case KVT__META_REDIS:
#ifdef KVT_WITH_REDIS
        return &kvt__meta_redis_ops;
#else
        *lacks_p = "hiredis (KVT_WITH_REDIS)";
        return NULL;
#endif
    case KVT__META_ETCD:
#if defined(KVT_WITH_CURL) && defined(KVT_WITH_JSON)
        return &kvt__meta_etcd_ops;
#else
        *lacks_p = "libcurl and json-c (KVT_WITH_CURL, KVT_WITH_JSON)";
        return NULL;
#endif
    }
    *lacks_p = "a backend for this scheme";
    return NULL;
}

const char *kvt__meta_backends_built(void)
{
    return "p2p"
#ifdef KVT_WITH_CURL
           ", http"
#endif
#ifdef KVT_WITH_REDIS
           ", redis"
#endif
#if defined(KVT_WITH_CURL) && defined(KVT_WITH_JSON)
           ", etcd"
#endif
        ;
}

int kvt__meta_server_built(void)
{
#if defined(KVT_WITH_HTTP_SERVER) && defined(KVT_WITH_JSON)
    return 1;
#else
    return 0;
#endif
}

/* ---- Create and destroy -------------------------------------------------- */

kvt_status_t kvt__meta_create(const char *uri, const kvt__meta_params_t *params,
                              kvt__meta_t **m_p)
{
    kvt__meta_t *m;
    const char *lacks = "";
    uint64_t fm = params ? params->field_mask : 0;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    kvt__log_init();
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err;
    }
    if (kvt__meta_uri_parse(uri ? uri : "", &m->uri) != KVT_OK) {
        KVT_LOG_E("metadata URI '%s' is malformed: expected p2p, "
                  "http://HOST[:PORT][/PATH], redis://HOST[:PORT][/DB] or "
                  "etcd://HOST[:PORT][,HOST[:PORT]...]",
                  uri);
        goto err_m;
    }
    m->timeout_ms = (fm & KVT__META_PARAM_TIMEOUT) ? params->timeout_ms
                                                   : DEFAULT_TIMEOUT_MS;
    m->ttl_s = (fm & KVT__META_PARAM_TTL) ? params->ttl_s : DEFAULT_TTL_S;
    if (fm & KVT__META_PARAM_AUTH)
        m->auth = params->auth;
    else
        kvt__auth_init_env(&m->auth);
    if (m->timeout_ms < 1 || m->timeout_ms > 600000 || m->ttl_s < 2 ||
        m->ttl_s > 3600) {
        KVT_LOG_E("metadata timeout must be 1..600000 ms and ttl 2..3600 s");
        goto err_m;
    }
    m->ops = backend_ops(m->uri.kind, &lacks);
    if (m->ops == NULL) {
        KVT_LOG_E("metadata backend '%s' is not built in: it needs %s",
                  kvt__meta_kind_name(m->uri.kind), lacks);
        st = KVT_ERR_NOT_SUPPORTED;
        goto err_m;
    }
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        st = KVT_ERR_NO_MEMORY;
        goto err_m;
    }
    st = m->ops->open(m);
    if (st != KVT_OK)
        goto err_lock;
    *m_p = m;
    return KVT_OK;

err_lock:
    pthread_mutex_destroy(&m->lock);
err_m:
    free(m);
err:
    return st;
}

static void heartbeat_stop(kvt__meta_t *m);

static void owned_free(kvt__meta_owned_t *o)
{
    free(o->key);
    free(o->val);
}

void kvt__meta_destroy(kvt__meta_t *m)
{
    kvt_status_t down = KVT_OK;

    if (m == NULL)
        return;
    heartbeat_stop(m);
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->nowned; i++) {
        kvt_status_t st = down ? down : KVT_OK;
        if (m->ops->del != NULL && !down)
            st = m->ops->del(m, m->owned[i].key);
        /* One wait for a dead server, not one per key. */
        if (kvt__meta_is_down(st))
            down = st;
        if (st != KVT_OK && st != KVT_ERR_NOT_FOUND)
            KVT_LOG_W("could not withdraw metadata key '%s' (%s): it "
                      "expires within %u s",
                      m->owned[i].key, kvt_status_str(st), m->ttl_s);
        owned_free(&m->owned[i]);
    }
    free(m->owned);
    m->owned = NULL;
    m->nowned = 0;
    pthread_mutex_unlock(&m->lock);
    if (m->ops->close != NULL)
        m->ops->close(m);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

kvt__meta_kind_t kvt__meta_kind(const kvt__meta_t *m)
{
    return m->uri.kind;
}

uint32_t kvt__meta_ttl_s(const kvt__meta_t *m)
{
    return m->ttl_s;
}

/* ---- Data calls ---------------------------------------------------------- */

/* Common checks; logs what it refuses. p2p answers "not applicable". */
static kvt_status_t check_call(kvt__meta_t *m, const char *key, int need_key,
                               int need_op)
{
    size_t n;

    if (m == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (!need_op)
        return KVT_ERR_NOT_SUPPORTED;
    if (!need_key)
        return KVT_OK;
    if (key == NULL || (n = strlen(key)) == 0 || n > KVT_META_KEY_MAX) {
        KVT_LOG_E("metadata key must be 1..%u bytes", KVT_META_KEY_MAX);
        return KVT_ERR_INVALID_PARAM;
    }
    return KVT_OK;
}

static kvt_status_t check_value(const void *value, size_t len)
{
    if (value == NULL && len > 0) {
        KVT_LOG_E("metadata value is NULL");
        return KVT_ERR_INVALID_PARAM;
    }
    if (len > KVT_META_VALUE_MAX) {
        KVT_LOG_E("metadata value of %zu bytes exceeds %u", len,
                  KVT_META_VALUE_MAX);
        return KVT_ERR_OVERFLOW;
    }
    return KVT_OK;
}

kvt_status_t kvt__meta_put(kvt__meta_t *m, const char *key, const void *value,
                           size_t len)
{
    kvt_status_t st = check_call(m, key, 1, m && m->ops->put);

    if (st == KVT_OK)
        st = check_value(value, len);
    if (st != KVT_OK)
        return st;
    pthread_mutex_lock(&m->lock);
    st = m->ops->put(m, key, value ? value : "", len, 0);
    pthread_mutex_unlock(&m->lock);
    return st;
}

kvt_status_t kvt__meta_get(kvt__meta_t *m, const char *key, uint8_t **value_p,
                           size_t *len_p)
{
    kvt_status_t st = check_call(m, key, 1, m && m->ops->get);

    if (st != KVT_OK)
        return st;
    pthread_mutex_lock(&m->lock);
    st = m->ops->get(m, key, value_p, len_p);
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* Index of an owned key, or -1. Called with the lock held. */
static long owned_find(kvt__meta_t *m, const char *key)
{
    for (size_t i = 0; i < m->nowned; i++)
        if (strcmp(m->owned[i].key, key) == 0)
            return (long)i;
    return -1;
}

kvt_status_t kvt__meta_del(kvt__meta_t *m, const char *key)
{
    kvt_status_t st = check_call(m, key, 1, m && m->ops->del);
    long i;

    if (st != KVT_OK)
        return st;
    pthread_mutex_lock(&m->lock);
    i = owned_find(m, key);
    if (i >= 0) {
        owned_free(&m->owned[i]);
        m->owned[i] = m->owned[--m->nowned];
    }
    st = m->ops->del(m, key);
    pthread_mutex_unlock(&m->lock);
    return st;
}

kvt_status_t kvt__meta_keys_add(kvt__meta_keys_t *kl, const char *key,
                                size_t len)
{
    char *copy;

    if (kl->n == KVT_META_LIST_MAX) {
        KVT_LOG_E("more than %u metadata keys match; use a longer prefix",
                  KVT_META_LIST_MAX);
        return KVT_ERR_OVERFLOW;
    }
    if (kl->n == kl->cap) {
        size_t nc = kl->cap ? kl->cap * 2 : 16;
        char **nk = realloc(kl->keys, nc * sizeof(*nk));
        if (nk == NULL)
            return KVT_ERR_NO_MEMORY;
        kl->keys = nk;
        kl->cap = nc;
    }
    copy = malloc(len + 1);
    if (copy == NULL)
        return KVT_ERR_NO_MEMORY;
    memcpy(copy, key, len);
    copy[len] = '\0';
    kl->keys[kl->n++] = copy;
    return KVT_OK;
}

void kvt__meta_list_free(char **keys, size_t n)
{
    for (size_t i = 0; keys != NULL && i < n; i++)
        free(keys[i]);
    free(keys);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

kvt_status_t kvt__meta_list(kvt__meta_t *m, const char *prefix, char ***keys_p,
                            size_t *n_p)
{
    kvt__meta_keys_t kl = {NULL, 0, 0};
    kvt_status_t st = check_call(m, NULL, 0, m && m->ops->list);

    if (st != KVT_OK)
        goto err;
    if (prefix == NULL || strlen(prefix) > KVT_META_KEY_MAX) {
        KVT_LOG_E("metadata prefix must be 0..%u bytes", KVT_META_KEY_MAX);
        st = KVT_ERR_INVALID_PARAM;
        goto err;
    }
    pthread_mutex_lock(&m->lock);
    st = m->ops->list(m, prefix, &kl);
    pthread_mutex_unlock(&m->lock);
    if (st != KVT_OK)
        goto err_keys;
    if (kl.n > 1) {
        size_t w = 1;
        /* Sorted and unique: redis SCAN may return a key twice. */
        qsort(kl.keys, kl.n, sizeof(*kl.keys), cmp_str);
        for (size_t i = 1; i < kl.n; i++) {
            if (strcmp(kl.keys[i], kl.keys[w - 1]) == 0)
                free(kl.keys[i]);
            else
                kl.keys[w++] = kl.keys[i];
        }
        kl.n = w;
    }
    *keys_p = kl.keys;
    *n_p = kl.n;
    return KVT_OK;

err_keys:
    kvt__meta_list_free(kl.keys, kl.n);
err:
    return st;
}

/* ---- Liveness ------------------------------------------------------------ */

kvt_status_t kvt__meta_publish(kvt__meta_t *m, const char *key,
                               const void *value, size_t len)
{
    kvt_status_t st = check_call(m, key, 1, m && m->ops->put);
    kvt__meta_owned_t fresh = {NULL, NULL, 0};
    long i;

    if (st == KVT_OK)
        st = check_value(value, len);
    if (st != KVT_OK)
        goto err;
    st = KVT_ERR_NO_MEMORY;
    fresh.key = strdup(key);
    fresh.val = malloc(len > 0 ? len : 1);
    if (fresh.key == NULL || fresh.val == NULL)
        goto err_fresh;
    if (len > 0)
        memcpy(fresh.val, value, len);
    fresh.len = len;
    pthread_mutex_lock(&m->lock);
    i = owned_find(m, key);
    if (i < 0 && m->nowned == KVT_META_MAX_OWNED) {
        KVT_LOG_E("a metadata handle publishes at most %u keys",
                  KVT_META_MAX_OWNED);
        st = KVT_ERR_NO_SPACE;
        goto err_unlock;
    }
    if (i < 0 && m->nowned % 16 == 0) {
        kvt__meta_owned_t *no =
            realloc(m->owned, (m->nowned + 16) * sizeof(*no));
        if (no == NULL)
            goto err_unlock;
        m->owned = no;
    }
    st = m->ops->put(m, key, fresh.val, len, 1);
    /* The server being down or failing is what the refresh is for: the
     * key stays owned and the next refresh tries again. */
    if (st != KVT_OK && !kvt__meta_is_down(st) && st != KVT_ERR_IO)
        goto err_unlock;
    if (i >= 0) {
        owned_free(&m->owned[i]);
        m->owned[i] = fresh;
    } else {
        m->owned[m->nowned++] = fresh;
    }
    pthread_mutex_unlock(&m->lock);
    return st;

err_unlock:
    pthread_mutex_unlock(&m->lock);
err_fresh:
    owned_free(&fresh);
err:
    return st;
}

/* Put every owned key again; stops early when the server is down. */
static kvt_status_t republish_all(kvt__meta_t *m)
{
    kvt_status_t first = KVT_OK;

    for (size_t i = 0; i < m->nowned; i++) {
        kvt__meta_owned_t *o = &m->owned[i];
        kvt_status_t st = m->ops->put(m, o->key, o->val, o->len, 1);
        if (st != KVT_OK && first == KVT_OK)
            first = st;
        if (kvt__meta_is_down(st))
            break;
    }
    return first;
}

kvt_status_t kvt__meta_refresh(kvt__meta_t *m)
{
    kvt_status_t st = check_call(m, NULL, 0, m && m->ops->put);

    if (st != KVT_OK)
        return st;
    pthread_mutex_lock(&m->lock);
    if (m->nowned > 0)
        st = m->ops->refresh ? m->ops->refresh(m) : republish_all(m);
    pthread_mutex_unlock(&m->lock);
    return st;
}

/*
 * The heartbeat: one refresh round every ttl/3, timed on the monotonic
 * clock from the start of the previous round, so that a live owner's keys
 * are renewed about three times per TTL. Logs a failure when the status
 * changes only, so that an outage gives one line, not one per tick.
 */
static void *heartbeat_main(void *arg)
{
    kvt__meta_t *m = arg;
    uint64_t interval_ms = (uint64_t)m->ttl_s * 1000u / 3u;
    kvt_status_t last = KVT_OK;
    struct timespec ts;

    kvt__thread_name("kvt-meta-hb");
    pthread_mutex_lock(&m->hb_lock);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    while (!m->hb_stop) {
        uint64_t ns = (uint64_t)ts.tv_nsec + (interval_ms % 1000u) * 1000000u;
        kvt_status_t st;

        ts.tv_sec += (time_t)(interval_ms / 1000u + ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        while (!m->hb_stop && pthread_cond_timedwait(&m->hb_cond, &m->hb_lock,
                                                     &ts) != ETIMEDOUT)
            ;
        if (m->hb_stop)
            break;
        pthread_mutex_unlock(&m->hb_lock);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        st = kvt__meta_refresh(m);
        if (st != last) {
            if (st != KVT_OK)
                KVT_LOG_W("metadata heartbeat to %s failed: %s; retrying "
                          "every %llu ms",
                          kvt__meta_kind_name(m->uri.kind), kvt_status_str(st),
                          (unsigned long long)interval_ms);
            else
                KVT_LOG_I("metadata heartbeat to %s works again",
                          kvt__meta_kind_name(m->uri.kind));
            last = st;
        }
        pthread_mutex_lock(&m->hb_lock);
    }
    pthread_mutex_unlock(&m->hb_lock);
    return NULL;
}

kvt_status_t kvt__meta_heartbeat_start(kvt__meta_t *m)
{
    pthread_condattr_t ca;
    kvt_status_t st = check_call(m, NULL, 0, m && m->ops->put);

    if (st != KVT_OK)
        goto err;
    if (m->hb_started) {
        st = KVT_ERR_EXISTS;
        goto err;
    }
    st = KVT_ERR_NO_MEMORY;
    if (pthread_condattr_init(&ca) != 0)
        goto err;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&m->hb_cond, &ca) != 0)
        goto err_attr;
    if (pthread_mutex_init(&m->hb_lock, NULL) != 0)
        goto err_cond;
    m->hb_stop = 0;
    if (pthread_create(&m->hb, NULL, heartbeat_main, m) != 0) {
        KVT_LOG_E("cannot start the metadata heartbeat thread");
        goto err_mutex;
    }
    m->hb_started = 1;
    pthread_condattr_destroy(&ca);
    return KVT_OK;

err_mutex:
    pthread_mutex_destroy(&m->hb_lock);
err_cond:
    pthread_cond_destroy(&m->hb_cond);
err_attr:
    pthread_condattr_destroy(&ca);
err:
    return st;
}

static void heartbeat_stop(kvt__meta_t *m)
{
    if (!m->hb_started)
        return;
    pthread_mutex_lock(&m->hb_lock);
    m->hb_stop = 1;
    pthread_cond_signal(&m->hb_cond);
    pthread_mutex_unlock(&m->hb_lock);
    pthread_join(m->hb, NULL);
    pthread_cond_destroy(&m->hb_cond);
    pthread_mutex_destroy(&m->hb_lock);
    m->hb_started = 0;
}

/* ---- Segment descriptors ------------------------------------------------- */

kvt_status_t kvt__meta_segment_key(const char *name, char *buf, size_t cap)
{
    int n;

    if (name == NULL || *name == '\0') {
        KVT_LOG_E("segment name is empty");
        return KVT_ERR_INVALID_PARAM;
    }
    n = snprintf(buf, cap, "%s%s", KVT_META_SEGMENT_PREFIX, name);
    if (n < 0 || (size_t)n >= cap || (size_t)n > KVT_META_KEY_MAX) {
        KVT_LOG_E("segment name '%s' is too long for a metadata key", name);
        return KVT_ERR_OVERFLOW;
    }
    return KVT_OK;
}

kvt_status_t kvt__meta_publish_segdesc(kvt__meta_t *m, const kvt__segdesc_t *d)
{
    char key[KVT_META_KEY_MAX + 1];
    char *json;
    size_t len;
    kvt_status_t st;

    st = kvt__meta_segment_key(d->name, key, sizeof(key));
    if (st != KVT_OK)
        goto err;
    st = kvt__segdesc_to_json(d, &json, &len);
    if (st != KVT_OK)
        goto err;
    st = kvt__meta_publish(m, key, json, len);
    free(json);
err:
    return st;
}

kvt_status_t kvt__meta_lookup_segdesc(kvt__meta_t *m, const char *name,
                                      kvt__segdesc_t *d)
{
    char key[KVT_META_KEY_MAX + 1];
    uint8_t *val;
    size_t len;
    kvt_status_t st;

    memset(d, 0, sizeof(*d));
    st = kvt__meta_segment_key(name, key, sizeof(key));
    if (st != KVT_OK)
        goto err;
    st = kvt__meta_get(m, key, &val, &len);
    if (st != KVT_OK)
        goto err;
    st = kvt__segdesc_from_json((const char *)val, len, d);
    free(val);
    if (st != KVT_OK)
        goto err;
    if (strcmp(d->name, name) != 0) {
        KVT_LOG_W("descriptor stored under segment '%s' names '%s'", name,
                  d->name);
        kvt__segdesc_clear(d);
        st = KVT_ERR_PROTOCOL;
    }
err:
    return st;
}
