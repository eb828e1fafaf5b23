/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The PD bootstrap table of `kvt metad`. A few hundred entries at most in
 * practice (KVT_BOOT_MAX_RANKS in theory), looked up once per peer by
 * decode ranks: a flat array under one mutex is simple and fast enough.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h> /* IWYU pragma: keep */

#include "meta/bootstrap.h"

typedef struct {
    uint32_t dp_group;
    uint32_t tp_rank;
    uint16_t rank_port;
    uint64_t expires_ms; /* 0: never */
    char rank_ip[KVT_META_HOST_MAX + 1];
} boot_entry_t;

/* Invariant: tp_size and dp_size are those of the live entries, all equal;
 * both are 0 while the table holds no live entry. */
struct kvt__boot_table {
    pthread_mutex_t lock;
    boot_entry_t *e;
    size_t n, cap;
    uint32_t tp_size, dp_size;
};

kvt_status_t kvt__boot_table_create(kvt__boot_table_t **t_p)
{
    kvt__boot_table_t *t = calloc(1, sizeof(*t));

    if (t == NULL)
        goto err;
    if (pthread_mutex_init(&t->lock, NULL) != 0)
        goto err_t;
    *t_p = t;
    return KVT_OK;

err_t:
    free(t);
err:
    return KVT_ERR_NO_MEMORY;
}

void kvt__boot_table_destroy(kvt__boot_table_t *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->e);
    free(t);
}

static int live(const boot_entry_t *e, uint64_t now_ms)
{
    return e->expires_ms == 0 || now_ms < e->expires_ms;
}

/* Drop expired entries and reset the sizes when none is left. Called with
 * the lock held. */
static size_t sweep(kvt__boot_table_t *t, uint64_t now_ms)
{
    size_t w = 0, before = t->n;

    for (size_t i = 0; i < t->n; i++)
        if (live(&t->e[i], now_ms))
            t->e[w++] = t->e[i];
    t->n = w;
    if (t->n == 0)
        t->tp_size = t->dp_size = 0;
    return before - w;
}

static boot_entry_t *find(kvt__boot_table_t *t, uint32_t dp, uint32_t tp)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->e[i].dp_group == dp && t->e[i].tp_rank == tp)
            return &t->e[i];
    return NULL;
}

int kvt__boot_table_put(kvt__boot_table_t *t, const kvt__boot_rank_t *r,
                        uint64_t expires_ms, uint64_t now_ms)
{
    uint32_t dp = kvt__boot_dp_group(r), tp = kvt__boot_tp_rank(r);
    boot_entry_t *e;
    int code = 200;

    pthread_mutex_lock(&t->lock);
    sweep(t, now_ms);
    if (t->n > 0 && (t->tp_size != r->tp_size || t->dp_size != r->dp_size)) {
        code = 409;
        goto unlock;
    }
    e = find(t, dp, tp);
    if (e == NULL) {
        if (t->n == KVT_BOOT_MAX_RANKS) {
            code = 507;
            goto unlock;
        }
        if (t->n == t->cap) {
            size_t nc = t->cap ? t->cap * 2 : 16;
            boot_entry_t *ne = realloc(t->e, nc * sizeof(*ne));
            if (ne == NULL) {
                code = 500;
                goto unlock;
            }
            t->e = ne;
            t->cap = nc;
        }
        e = &t->e[t->n++];
        e->dp_group = dp;
        e->tp_rank = tp;
    }
    e->rank_port = r->rank_port;
    e->expires_ms = expires_ms;
    strcpy(e->rank_ip, r->rank_ip);
    t->tp_size = r->tp_size;
    t->dp_size = r->dp_size;
unlock:
    pthread_mutex_unlock(&t->lock);
    return code;
}

/* Serialise @o into a malloc'd string; puts @o. 200 or 500. */
static int finish(json_object *o, int oom, char **json_p, size_t *len_p)
{
    const char *s;
    size_t len;
    char *out = NULL;

    if (o != NULL && !oom) {
        s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN, &len);
        if (s != NULL && (out = malloc(len + 1)) != NULL) {
            memcpy(out, s, len + 1);
            *json_p = out;
            *len_p = len;
        }
    }
    json_object_put(o);
    return out != NULL ? 200 : 500;
}

static void add(json_object *o, const char *k, json_object *v, int *oom)
{
    if (o == NULL || v == NULL || json_object_object_add(o, k, v) != 0) {
        json_object_put(v);
        *oom = 1;
    }
}

int kvt__boot_table_get(kvt__boot_table_t *t, int64_t rank, int64_t dp_group,
                        uint64_t now_ms, char **json_p, size_t *len_p)
{
    json_object *o = NULL;
    boot_entry_t *e;
    int code = 404, oom = 0;

    if ((rank == -1) != (dp_group == -1) || rank < -1 || dp_group < -1)
        return 400;
    pthread_mutex_lock(&t->lock);
    sweep(t, now_ms);
    if (rank == -1 && t->n > 0) {
        o = json_object_new_object();
        add(o, "prefill_tp_size", json_object_new_int64(t->tp_size), &oom);
        add(o, "prefill_dp_size", json_object_new_int64(t->dp_size), &oom);
    } else if (rank >= 0 &&
               (e = find(t, (uint32_t)dp_group, (uint32_t)rank)) != NULL) {
        o = json_object_new_object();
        add(o, "rank_ip", json_object_new_string(e->rank_ip), &oom);
        add(o, "rank_port", json_object_new_int(e->rank_port), &oom);
    }
    pthread_mutex_unlock(&t->lock);
    if (o != NULL || oom)
        code = finish(o, oom, json_p, len_p);
    return code;
}

int kvt__boot_table_del(kvt__boot_table_t *t, int64_t rank, int64_t dp_group,
                        uint64_t now_ms)
{
    boot_entry_t *e;
    int code = 404;

    if (rank < 0 || dp_group < 0)
        return 400;
    pthread_mutex_lock(&t->lock);
    sweep(t, now_ms);
    e = find(t, (uint32_t)dp_group, (uint32_t)rank);
    if (e != NULL) {
        *e = t->e[--t->n];
        if (t->n == 0)
            t->tp_size = t->dp_size = 0;
        code = 200;
    }
    pthread_mutex_unlock(&t->lock);
    return code;
}

static int cmp_entry(const void *a, const void *b)
{
    const boot_entry_t *x = a, *y = b;
    if (x->dp_group != y->dp_group)
        return x->dp_group < y->dp_group ? -1 : 1;
    return x->tp_rank < y->tp_rank ? -1 : x->tp_rank > y->tp_rank;
}

int kvt__boot_table_topology(kvt__boot_table_t *t, uint64_t now_ms,
                             char **json_p, size_t *len_p)
{
    json_object *o = json_object_new_object(), *ranks;
    int oom = 0;

    ranks = json_object_new_array();
    pthread_mutex_lock(&t->lock);
    sweep(t, now_ms);
    if (t->n > 0) /* an empty table has no array to sort */
        qsort(t->e, t->n, sizeof(*t->e), cmp_entry);
    add(o, "prefill_tp_size", json_object_new_int64(t->tp_size), &oom);
    add(o, "prefill_dp_size", json_object_new_int64(t->dp_size), &oom);
    for (size_t i = 0; ranks != NULL && i < t->n; i++) {
        const boot_entry_t *e = &t->e[i];
        uint32_t per = t->tp_size / t->dp_size;
        json_object *r = json_object_new_object();
        add(r, "dp_group", json_object_new_int64(e->dp_group), &oom);
        add(r, "tp_rank", json_object_new_int64(e->tp_rank), &oom);
        add(r, "engine_rank",
            json_object_new_int64((int64_t)e->dp_group * per + e->tp_rank),
            &oom);
        add(r, "rank_ip", json_object_new_string(e->rank_ip), &oom);
        add(r, "rank_port", json_object_new_int(e->rank_port), &oom);
        if (r == NULL || json_object_array_add(ranks, r) != 0) {
            json_object_put(r);
            oom = 1;
        }
    }
    pthread_mutex_unlock(&t->lock);
    add(o, "ranks", ranks, &oom);
    return finish(o, oom, json_p, len_p);
}

size_t kvt__boot_table_purge(kvt__boot_table_t *t, uint64_t now_ms)
{
    size_t n;

    pthread_mutex_lock(&t->lock);
    n = sweep(t, now_ms);
    pthread_mutex_unlock(&t->lock);
    return n;
}

size_t kvt__boot_table_count(kvt__boot_table_t *t)
{
    size_t n;

    pthread_mutex_lock(&t->lock);
    n = t->n;
    pthread_mutex_unlock(&t->lock);
    return n;
}
