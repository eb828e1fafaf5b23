/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_METAD_STORE_H
#define KVT_META_METAD_STORE_H

/*
 * The key/value store behind `kvt metad`: a hash table in 64 shards, each
 * under its own reader/writer lock, so that GETs on different keys never
 * contend and GETs on one key share the lock. Values are opaque bytes.
 *
 * Expiry: an entry stored with a TTL is invisible (get, del, keys) from
 * its deadline on, whatever the sweep has done; kvt__kvstore_purge()
 * frees such entries. Time is passed in by the caller (monotonic ms), so
 * the store itself never reads a clock.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

typedef struct kvt__kvstore kvt__kvstore_t;

/* Called under the entry's shard lock (read mode): must not block or call
 * back into the store. */
typedef void (*kvt__kvstore_visit_cb_t)(void *arg, const uint8_t *val,
                                        size_t len);

/* Create a store holding at most @max_bytes of entries, counted as the
 * heap they really take (key, value, header, allocator overhead and a
 * share of the hash table). KVT_OK or KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__kvstore_create(size_t max_bytes, kvt__kvstore_t **s_p);
void kvt__kvstore_destroy(kvt__kvstore_t *s);

/* Flags of kvt__kvstore_put(). */
enum {
    /* Mooncake's rule for its rpc_meta keys: a live entry is replaced only
     * by the same bytes (which renews its expiry), so that a second
     * engine cannot take over a name that is in use. */
    KVT__KVSTORE_ONCE = 1u << 0,
};

/*
 * Count @n bytes against the limit for data on its way to the store (a
 * request body being read), so that uploads in flight cannot hold more
 * than the limit. KVT_OK or KVT_ERR_NO_SPACE (nothing reserved).
 * kvt__kvstore_release() gives them back.
 */
kvt_status_t kvt__kvstore_reserve(kvt__kvstore_t *s, size_t n);
void kvt__kvstore_release(kvt__kvstore_t *s, size_t n);

/*
 * Store a copy of @val under @key (@klen bytes), replacing any value, to
 * expire at @expires_ms (0: never). With KVT__KVSTORE_ONCE in @flags, a
 * live entry with other bytes stays. @held: bytes the caller reserved for
 * this value (kvt__kvstore_reserve()); they count as free for this put
 * and are consumed when it returns KVT_OK, left to the caller otherwise.
 * *@same_p (when not NULL) is set on KVT_OK to whether a live entry held
 * these bytes already. KVT_OK, KVT_ERR_EXISTS (KVT__KVSTORE_ONCE and other
 * bytes are stored; nothing changes), KVT_ERR_NO_SPACE (the byte limit
 * would be passed; nothing changes), KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__kvstore_put(kvt__kvstore_t *s, const char *key, size_t klen,
                              const void *val, size_t vlen, uint64_t expires_ms,
                              unsigned flags, size_t held, uint64_t now_ms,
                              int *same_p);

/* Call @cb with the live value of @key. KVT_OK or KVT_ERR_NOT_FOUND. */
kvt_status_t kvt__kvstore_get(kvt__kvstore_t *s, const char *key, size_t klen,
                              uint64_t now_ms, kvt__kvstore_visit_cb_t cb,
                              void *arg);

/* Remove @key. KVT_OK, or KVT_ERR_NOT_FOUND when absent or expired. */
kvt_status_t kvt__kvstore_del(kvt__kvstore_t *s, const char *key, size_t klen,
                              uint64_t now_ms);

/*
 * The live keys starting with @prefix, sorted, as a malloc'd array of
 * malloc'd strings (free with kvt__meta_list_free()). KVT_ERR_OVERFLOW
 * when more than @max match, KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__kvstore_keys(kvt__kvstore_t *s, const char *prefix,
                               size_t plen, uint64_t now_ms, size_t max,
                               char ***keys_p, size_t *n_p);

/* Free expired entries; returns how many. */
size_t kvt__kvstore_purge(kvt__kvstore_t *s, uint64_t now_ms);

/* Entries stored (expired ones count until purged), and bytes charged:
 * the entries' and the reservations'. */
size_t kvt__kvstore_count(kvt__kvstore_t *s);
size_t kvt__kvstore_bytes(kvt__kvstore_t *s);

#endif
