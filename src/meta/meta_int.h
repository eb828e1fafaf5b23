/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_META_INT_H
#define KVT_META_META_INT_H

/*
 * Inside the metadata client: the backend ops table and the handle. Each
 * backend (meta_http.c, meta_redis.c, meta_etcd.c) fills one table with
 * designated initialisers; meta.c dispatches to it with the handle's lock
 * held, so ops never run concurrently on one handle and may keep one
 * connection without locking of their own.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/meta.h"

/* A key this handle publishes, with the value to re-create it from. */
typedef struct {
    char *key;
    uint8_t *val;
    size_t len;
} kvt__meta_owned_t;

/* A growing list of keys, for the list op. */
typedef struct {
    char **keys;
    size_t n, cap;
} kvt__meta_keys_t;

/* Append a copy of @len bytes of @key. KVT_ERR_OVERFLOW beyond
 * KVT_META_LIST_MAX, KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__meta_keys_add(kvt__meta_keys_t *kl, const char *key,
                                size_t len);

#define KVT_META_MAX_OWNED 1024u

typedef struct kvt__meta_ops {
    const char *name;
    /* Set up m->be from m->uri; no network traffic. */
    kvt_status_t (*open)(kvt__meta_t *m);
    /* Free m->be (after meta.c deleted the owned keys). */
    void (*close)(kvt__meta_t *m);
    /* Store a value; @expiring: with the handle's TTL (lease, EX). */
    kvt_status_t (*put)(kvt__meta_t *m, const char *key, const void *val,
                        size_t len, int expiring);
    /* On KVT_OK *val_p is malloc'd with a NUL after *len_p bytes. */
    kvt_status_t (*get)(kvt__meta_t *m, const char *key, uint8_t **val_p,
                        size_t *len_p);
    kvt_status_t (*del)(kvt__meta_t *m, const char *key);
    kvt_status_t (*list)(kvt__meta_t *m, const char *prefix,
                         kvt__meta_keys_t *out);
    /* One liveness round over m->owned; NULL: put every owned key again. */
    kvt_status_t (*refresh)(kvt__meta_t *m);
} kvt__meta_ops_t;

struct kvt__meta {
    kvt__meta_uri_t uri;
    const kvt__meta_ops_t *ops;
    uint64_t timeout_ms;
    uint32_t ttl_s;
    kvt__auth_t auth; /* signs the http backend's requests */
    void *be;         /* backend state */

    /* Serialises ops and guards the owned list. */
    pthread_mutex_t lock;
    kvt__meta_owned_t *owned;
    size_t nowned;

    /* Heartbeat thread, when started. */
    int hb_started;
    pthread_t hb;
    pthread_mutex_t hb_lock;
    pthread_cond_t hb_cond;
    int hb_stop; /* under hb_lock */
};

/* Whether a status means the server could not be reached or answered too
 * late, so that a round of calls should stop rather than wait again. */
static inline int kvt__meta_is_down(kvt_status_t st)
{
    return st == KVT_ERR_UNREACHABLE || st == KVT_ERR_TIMEDOUT;
}

extern const kvt__meta_ops_t kvt__meta_http_ops;
extern const kvt__meta_ops_t kvt__meta_redis_ops;
extern const kvt__meta_ops_t kvt__meta_etcd_ops;

#endif
