/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt metad's key-value store: sharded hash tables bounded in bytes, with
 * expiring entries.
 */
#include "meta/metad_store.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"

#define NSHARDS 64u
#define MIN_BUCKETS 16u

/*
 * One heap block per entry: the header, the key and its NUL, then the
 * value. Keys are at most KVT_META_KEY_MAX bytes and values at most
 * KVT_META_VALUE_MAX, so both lengths fit 32 bits.
 */
typedef struct entry {
    struct entry *next;
    uint64_t hash;
    uint64_t expires_ms; /* 0: never */
    uint32_t klen;
    uint32_t vlen;
    char key[]; /* klen bytes, a NUL, then vlen bytes of value */
} entry_t;

/* Invariant: count entries in nbuckets chains (a power of two), each
 * chain holding the entries whose hash >> 6 maps to it. */
typedef struct {
    pthread_rwlock_t lock;
    entry_t **buckets;
    size_t nbuckets;
    size_t count;
} shard_t;

struct kvt__kvstore {
    shard_t shards[NSHARDS];
    size_t max_bytes;
    _Atomic size_t bytes;
    _Atomic size_t count;
};

static uint64_t hash_key(const char *key, size_t klen)
{
    return kvt__fnv1a(KVT_FNV1A_SEED, key, klen);
}

static inline shard_t *shard_of(kvt__kvstore_t *s, uint64_t h)
{
    return &s->shards[h & (NSHARDS - 1)];
}

static inline entry_t **chain_of(shard_t *sh, uint64_t h)
{
    return &sh->buckets[(h >> 6) & (sh->nbuckets - 1)];
}

static inline int is_live(const entry_t *e, uint64_t now_ms)
{
    return e->expires_ms == 0 || now_ms < e->expires_ms;
}

static inline const uint8_t *value_of(const entry_t *e)
{
    return (const uint8_t *)e->key + e->klen + 1;
}

/*
 * What an entry costs, charged against the byte limit: its heap block as
 * the allocator sized it, the allocator's header in front of it, and its
 * share of the hash table (a table grows to at most one bucket per
 * entry). So the limit bounds the memory the store really holds, within
 * the fixed tables of the empty store.
 */
static inline size_t charge(const entry_t *e)
{
    return malloc_usable_size((void *)e) + sizeof(size_t) + sizeof(entry_t *);
}

/* Find @key in its chain; returns the link that points at it, or NULL. */
static entry_t **find(shard_t *sh, uint64_t h, const char *key, size_t klen)
{
    entry_t **link = chain_of(sh, h);
    for (; *link != NULL; link = &(*link)->next) {
        entry_t *e = *link;
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return link;
    }
    return NULL;
}

kvt_status_t kvt__kvstore_create(size_t max_bytes, kvt__kvstore_t **s_p)
{
    kvt__kvstore_t *s = calloc(1, sizeof(*s));
    unsigned i;

    if (s == NULL)
        goto err;
    s->max_bytes = max_bytes;
    for (i = 0; i < NSHARDS; i++) {
        shard_t *sh = &s->shards[i];
        sh->buckets = calloc(MIN_BUCKETS, sizeof(*sh->buckets));
        if (sh->buckets == NULL)
            goto err_shards;
        sh->nbuckets = MIN_BUCKETS;
        if (pthread_rwlock_init(&sh->lock, NULL) != 0) {
            free(sh->buckets);
            goto err_shards;
        }
    }
    *s_p = s;
    return KVT_OK;

err_shards:
    while (i-- > 0) {
        pthread_rwlock_destroy(&s->shards[i].lock);
        free(s->shards[i].buckets);
    }
    free(s);
err:
    return KVT_ERR_NO_MEMORY;
}

static void entry_free(entry_t *e)
{
    free(e);
}

void kvt__kvstore_destroy(kvt__kvstore_t *s)
{
    if (s == NULL)
        return;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard_t *sh = &s->shards[i];
        for (size_t b = 0; b < sh->nbuckets; b++) {
            entry_t *e = sh->buckets[b], *next;
            for (; e != NULL; e = next) {
                next = e->next;
                entry_free(e);
            }
        }
        free(sh->buckets);
        pthread_rwlock_destroy(&sh->lock);
    }
    free(s);
}

/* Double the shard's table when it is loaded beyond 2 entries per chain.
 * A failed allocation leaves the table as it was (still correct). */
static void maybe_grow(shard_t *sh)
{
    size_t n = sh->nbuckets * 2;
    entry_t **nb;

    if (sh->count <= sh->nbuckets * 2)
        return;
    nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return;
    for (size_t b = 0; b < sh->nbuckets; b++) {
        entry_t *e = sh->buckets[b], *next;
        for (; e != NULL; e = next) {
            entry_t **chain = &nb[(e->hash >> 6) & (n - 1)];
            next = e->next;
            e->next = *chain;
            *chain = e;
        }
    }
    free(sh->buckets);
    sh->buckets = nb;
    sh->nbuckets = n;
}

/*
 * Reserve @add bytes and release @sub against the limit, atomically.
 * Returns 0, or -1 (nothing reserved) when the limit would be passed.
 */
static int reserve(kvt__kvstore_t *s, size_t add, size_t sub)
{
    size_t cur = atomic_load_explicit(&s->bytes, memory_order_relaxed);
    for (;;) {
        size_t next = cur - (sub < cur ? sub : cur) + add;
        if (add > sub && next > s->max_bytes)
            return -1;
        if (atomic_compare_exchange_weak_explicit(&s->bytes, &cur, next,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
            return 0;
    }
}

kvt_status_t kvt__kvstore_reserve(kvt__kvstore_t *s, size_t n)
{
    return reserve(s, n, 0) == 0 ? KVT_OK : KVT_ERR_NO_SPACE;
}

void kvt__kvstore_release(kvt__kvstore_t *s, size_t n)
{
    reserve(s, 0, n);
}

kvt_status_t kvt__kvstore_put(kvt__kvstore_t *s, const char *key, size_t klen,
                              const void *val, size_t vlen, uint64_t expires_ms,
                              unsigned flags, size_t held, uint64_t now_ms,
                              int *same_p)
{
    uint64_t h = hash_key(key, klen);
    shard_t *sh = shard_of(s, h);
    entry_t *fresh, **link, *gone = NULL;
    kvt_status_t st = KVT_ERR_NO_MEMORY;
    int same = 0;

    if (klen > UINT32_MAX || vlen > UINT32_MAX) {
        st = KVT_ERR_NO_SPACE;
        goto err;
    }
    fresh = malloc(sizeof(*fresh) + klen + 1 + vlen);
    if (fresh == NULL)
        goto err;
    fresh->hash = h;
    fresh->expires_ms = expires_ms;
    fresh->klen = (uint32_t)klen;
    fresh->vlen = (uint32_t)vlen;
    memcpy(fresh->key, key, klen);
    fresh->key[klen] = '\0';
    if (vlen > 0)
        memcpy(fresh->key + klen + 1, val, vlen);

    st = KVT_OK;
    pthread_rwlock_wrlock(&sh->lock);
    link = find(sh, h, key, klen);
    if (link != NULL) {
        entry_t *e = *link;
        int live = is_live(e, now_ms);
        same = live && e->vlen == vlen && memcmp(value_of(e), val, vlen) == 0;
        if ((flags & KVT__KVSTORE_ONCE) && live && !same) {
            st = KVT_ERR_EXISTS;
        } else if (reserve(s, charge(fresh), charge(e) + held) != 0) {
            st = KVT_ERR_NO_SPACE;
        } else {
            /* The new block takes the old one's place in the chain. */
            fresh->next = e->next;
            *link = fresh;
            gone = e;
        }
    } else if (reserve(s, charge(fresh), held) != 0) {
        st = KVT_ERR_NO_SPACE;
    } else {
        entry_t **chain = chain_of(sh, h);
        fresh->next = *chain;
        *chain = fresh;
        sh->count++;
        atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
        maybe_grow(sh);
    }
    pthread_rwlock_unlock(&sh->lock);
    if (st != KVT_OK)
        goto err_fresh;
    entry_free(gone);
    if (same_p != NULL)
        *same_p = same;
    return KVT_OK;

err_fresh:
    free(fresh);
err:
    return st;
}

kvt_status_t kvt__kvstore_get(kvt__kvstore_t *s, const char *key, size_t klen,
                              uint64_t now_ms, kvt__kvstore_visit_cb_t cb,
                              void *arg)
{
    uint64_t h = hash_key(key, klen);
    shard_t *sh = shard_of(s, h);
    entry_t **link;
    kvt_status_t st = KVT_ERR_NOT_FOUND;

    pthread_rwlock_rdlock(&sh->lock);
    link = find(sh, h, key, klen);
    if (link != NULL && is_live(*link, now_ms)) {
        cb(arg, value_of(*link), (*link)->vlen);
        st = KVT_OK;
    }
    pthread_rwlock_unlock(&sh->lock);
    return st;
}

/* Unlink the entry at @link and account for it; the caller frees it. */
static entry_t *unlink_entry(kvt__kvstore_t *s, shard_t *sh, entry_t **link)
{
    entry_t *e = *link;
    *link = e->next;
    sh->count--;
    atomic_fetch_sub_explicit(&s->count, 1, memory_order_relaxed);
    reserve(s, 0, charge(e));
    return e;
}

kvt_status_t kvt__kvstore_del(kvt__kvstore_t *s, const char *key, size_t klen,
                              uint64_t now_ms)
{
    uint64_t h = hash_key(key, klen);
    shard_t *sh = shard_of(s, h);
    entry_t **link, *gone = NULL;
    kvt_status_t st = KVT_ERR_NOT_FOUND;

    pthread_rwlock_wrlock(&sh->lock);
    link = find(sh, h, key, klen);
    if (link != NULL) {
        if (is_live(*link, now_ms))
            st = KVT_OK;
        gone = unlink_entry(s, sh, link);
    }
    pthread_rwlock_unlock(&sh->lock);
    if (gone != NULL)
        entry_free(gone);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

kvt_status_t kvt__kvstore_keys(kvt__kvstore_t *s, const char *prefix,
                               size_t plen, uint64_t now_ms, size_t max,
                               char ***keys_p, size_t *n_p)
{
    char **keys = NULL;
    size_t n = 0, cap = 0;
    kvt_status_t st = KVT_OK;

    for (unsigned i = 0; i < NSHARDS && st == KVT_OK; i++) {
        shard_t *sh = &s->shards[i];
        pthread_rwlock_rdlock(&sh->lock);
        for (size_t b = 0; b < sh->nbuckets && st == KVT_OK; b++) {
            for (entry_t *e = sh->buckets[b]; e != NULL; e = e->next) {
                if (!is_live(e, now_ms) || e->klen < plen ||
                    memcmp(e->key, prefix, plen) != 0)
                    continue;
                if (n == max) {
                    st = KVT_ERR_OVERFLOW;
                    break;
                }
                if (n == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    char **nk = realloc(keys, nc * sizeof(*nk));
                    if (nk == NULL) {
                        st = KVT_ERR_NO_MEMORY;
                        break;
                    }
                    keys = nk;
                    cap = nc;
                }
                if ((keys[n] = strdup(e->key)) == NULL) {
                    st = KVT_ERR_NO_MEMORY;
                    break;
                }
                n++;
            }
        }
        pthread_rwlock_unlock(&sh->lock);
    }
    if (st != KVT_OK)
        goto err_keys;
    if (n > 1)
        qsort(keys, n, sizeof(*keys), cmp_str);
    *keys_p = keys;
    *n_p = n;
    return KVT_OK;

err_keys:
    free_keys(keys, n);
    return st;
}

size_t kvt__kvstore_purge(kvt__kvstore_t *s, uint64_t now_ms)
{
    size_t purged = 0;

    for (unsigned i = 0; i < NSHARDS; i++) {
        shard_t *sh = &s->shards[i];
        entry_t *dead = NULL;

        pthread_rwlock_wrlock(&sh->lock);
        for (size_t b = 0; b < sh->nbuckets; b++) {
            entry_t **link = &sh->buckets[b];
            while (*link != NULL) {
                if (is_live(*link, now_ms)) {
                    link = &(*link)->next;
                    continue;
                }
                entry_t *e = unlink_entry(s, sh, link);
                e->next = dead;
                dead = e;
                purged++;
            }
        }
        pthread_rwlock_unlock(&sh->lock);
        while (dead != NULL) {
            entry_t *next = dead->next;
            entry_free(dead);
            dead = next;
        }
    }
    return purged;
}

size_t kvt__kvstore_count(kvt__kvstore_t *s)
{
    return atomic_load_explicit(&s->count, memory_order_relaxed);
}

size_t kvt__kvstore_bytes(kvt__kvstore_t *s)
{
    return atomic_load_explicit(&s->bytes, memory_order_relaxed);
}
