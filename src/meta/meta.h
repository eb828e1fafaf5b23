/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_META_H
#define KVT_META_META_H

/*
 * The metadata layer: a small key/value client with liveness, behind one
 * interface for every backend, selected by a URI (docs/metadata.md):
 *
 *   p2p                          no server; every data call answers
 *                                KVT_ERR_NOT_SUPPORTED ("not applicable")
 *   http://HOST[:PORT][/PATH]    Mooncake's HTTP metadata protocol
 *                                (GET/PUT/DELETE PATH?key=K, PATH defaults
 *                                to /metadata), e.g. `kvt metad`
 *   redis://[:PASS@]HOST[:PORT][/DB]          hiredis
 *   etcd://HOST[:PORT][,HOST[:PORT]...]       etcd v3 JSON gateway
 *
 * Every call is bounded by the handle's timeout (default 3 s) and returns a
 * kvt_status_t. A handle may be used from any thread: calls on one handle
 * are serialised by a lock held for at most one backend round trip each
 * (one timeout), so a slow server delays other callers by that much.
 *
 * Liveness. kvt__meta_put() stores a key for good. kvt__meta_publish()
 * stores it with the handle's TTL and remembers it as owned: the owner
 * must then call kvt__meta_refresh() at least every ttl/3 seconds, or let
 * kvt__meta_heartbeat_start() do it from a thread. An owner that stops
 * (crash, kill, partition) loses its keys at most ttl seconds after its
 * last successful refresh: redis expires them (SET EX), etcd revokes them
 * with their lease, `kvt metad` drops them (PUT ?ttl=). A plain Mooncake
 * HTTP server ignores ?ttl= and keeps them until they are deleted; the
 * client warns once when the server does not acknowledge the TTL.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

#include "proto/wire.h" /* IWYU pragma: keep */
#include "util/auth.h"

/* Longest key, in bytes, not counting the terminating NUL. */
#define KVT_META_KEY_MAX 1024u
/* Largest value a client stores or accepts back. */
#define KVT_META_VALUE_MAX (16u << 20)
/* Most keys one kvt__meta_list() returns. */
#define KVT_META_LIST_MAX 65536u
/* Most etcd endpoints in one URI. */
#define KVT_META_MAX_ENDPOINTS 8u
#define KVT_META_HOST_MAX 255u

/* Key layout (docs/metadata.md). The version in the prefix changes only
 * when the meaning of the keys below it changes. */
#define KVT_META_SEGMENT_PREFIX "kvt/v1/segment/"
#define KVT_META_BOOTSTRAP_PREFIX "kvt/v1/bootstrap/"

typedef enum {
    KVT__META_P2P = 0,
    KVT__META_HTTP = 1,
    KVT__META_REDIS = 2,
    KVT__META_ETCD = 3,
} kvt__meta_kind_t;

typedef struct {
    char host[KVT_META_HOST_MAX + 1]; /* without IPv6 brackets */
    uint16_t port;
} kvt__meta_endpoint_t;

/* A parsed backend URI. */
typedef struct {
    kvt__meta_kind_t kind;
    unsigned nendpoints; /* 0 for p2p, 1 for http and redis, 1..8 etcd */
    kvt__meta_endpoint_t ep[KVT_META_MAX_ENDPOINTS];
    char path[256];     /* http: request path, default "/metadata" */
    unsigned db;        /* redis: database number, default 0 */
    char user[128];     /* redis: ACL user name, empty for the default */
    char password[256]; /* redis: AUTH password, empty for none */
} kvt__meta_uri_t;

/*
 * Parse a backend URI (grammar above) into @u. Pure: no I/O, no logging,
 * no allocation; @u is fully written on success and unspecified otherwise.
 * Returns KVT_OK, or KVT_ERR_INVALID_PARAM for an unknown scheme, a bad
 * host, port, path or database number, too many endpoints or too long a
 * field.
 */
kvt_status_t kvt__meta_uri_parse(const char *uri, kvt__meta_uri_t *u);

const char *kvt__meta_kind_name(kvt__meta_kind_t kind);

/* The backends built in, e.g. "p2p, http, redis, etcd", and whether
 * `kvt metad` is (for `kvt info`). Static strings. */
const char *kvt__meta_backends_built(void);
int kvt__meta_server_built(void);

/* ---- Client ------------------------------------------------------------ */

typedef struct kvt__meta kvt__meta_t;

enum {
    KVT__META_PARAM_TIMEOUT = 1u << 0,
    KVT__META_PARAM_TTL = 1u << 1,
    KVT__META_PARAM_AUTH = 1u << 2,
};

typedef struct {
    uint64_t field_mask;
    /* Bound on each backend call (connect + request + answer), in ms.
     * Default 3000; 1..600000. */
    uint64_t timeout_ms;
    /* Lifetime of published keys that are not refreshed, in seconds.
     * Default 10; 2..3600 (etcd rounds up to its minimum lease). */
    uint32_t ttl_s;
    /* The engine's key: the http backend signs its requests with it
     * (docs/security.md). Default: from KVT_AUTH_TOKEN, off when unset. */
    kvt__auth_t auth;
} kvt__meta_params_t;

/*
 * Create a client for @uri. @params may be NULL (defaults). No network
 * traffic happens here: servers are contacted on first use, so an engine
 * can be created before its metadata server is up.
 *
 * "p2p" (also "P2PHANDSHAKE" and "") gives a valid handle of kind
 * KVT__META_P2P whose data calls return KVT_ERR_NOT_SUPPORTED without
 * logging; callers use kvt__meta_kind() to take the p2p path instead.
 *
 * Returns KVT_OK (*m_p set), KVT_ERR_INVALID_PARAM (malformed URI or
 * parameter), KVT_ERR_NOT_SUPPORTED (backend not built in; logged),
 * KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__meta_create(const char *uri, const kvt__meta_params_t *params,
                              kvt__meta_t **m_p);

/*
 * Stop the heartbeat thread if any, delete every key this handle still
 * publishes (best effort, each bounded by the timeout; after the first
 * sign that the server is down the rest are left to expire), close
 * connections and free the handle. NULL does nothing. Must not race with other
 * calls on the handle.
 */
void kvt__meta_destroy(kvt__meta_t *m);

kvt__meta_kind_t kvt__meta_kind(const kvt__meta_t *m);
uint32_t kvt__meta_ttl_s(const kvt__meta_t *m);

/*
 * Store @len bytes at @key, replacing any value; no expiry. @key is a
 * NUL-terminated string of 1..KVT_META_KEY_MAX bytes; @value may hold any
 * bytes and is copied. Returns KVT_OK, KVT_ERR_INVALID_PARAM, KVT_ERR_OVERFLOW
 * (value larger than KVT_META_VALUE_MAX or refused by the server as too
 * large), KVT_ERR_UNREACHABLE, KVT_ERR_TIMEDOUT, KVT_ERR_AUTH (http:
 * the server wants an auth token this client lacks or does not share;
 * redis: the password refused), KVT_ERR_ACCESS (redis: a command refused),
 * KVT_ERR_IO (the server answered with an error; logged),
 * KVT_ERR_PROTOCOL (the answer is malformed or beyond the client's bounds,
 * such as a redis array of more than KVT_REDIS_ARRAY_MAX elements; logged),
 * KVT_ERR_NOT_SUPPORTED (p2p).
 */
kvt_status_t kvt__meta_put(kvt__meta_t *m, const char *key, const void *value,
                           size_t len);

/*
 * Fetch @key. On KVT_OK *value_p is a malloc'd copy of the stored bytes
 * with a NUL after them (not counted in *len_p); the caller frees it.
 * KVT_ERR_NOT_FOUND when the key is absent or expired (not logged), and the
 * errors of kvt__meta_put(). Outputs are set on success only.
 */
kvt_status_t kvt__meta_get(kvt__meta_t *m, const char *key, uint8_t **value_p,
                           size_t *len_p);

/*
 * Delete @key (and stop refreshing it if this handle published it).
 * KVT_OK, KVT_ERR_NOT_FOUND when there was nothing to delete, and the
 * errors of kvt__meta_put().
 */
kvt_status_t kvt__meta_del(kvt__meta_t *m, const char *key);

/*
 * List the keys that start with @prefix (may be ""). On KVT_OK *keys_p is a
 * malloc'd array of *n_p malloc'd strings, sorted; free it with
 * kvt__meta_list_free(). KVT_ERR_OVERFLOW beyond KVT_META_LIST_MAX keys;
 * KVT_ERR_NOT_SUPPORTED for p2p and for HTTP servers that lack kvt's
 * /metadata/keys route (plain Mooncake servers).
 */
kvt_status_t kvt__meta_list(kvt__meta_t *m, const char *prefix, char ***keys_p,
                            size_t *n_p);
void kvt__meta_list_free(char **keys, size_t n);

/*
 * Store @key like kvt__meta_put() but with the handle's TTL, and own it:
 * later refreshes keep it alive and re-create it if it vanished (after a
 * server restart, a lease lost in a partition). Publishing an owned key
 * again replaces its value. At most 1024 keys per handle
 * (KVT_ERR_NO_SPACE beyond). Same errors as kvt__meta_put(). When the
 * server cannot be reached, answers late or fails (KVT_ERR_UNREACHABLE,
 * KVT_ERR_TIMEDOUT, KVT_ERR_IO) the key is owned all the same, so that
 * the next refresh stores it; on any other error it is not owned.
 */
kvt_status_t kvt__meta_publish(kvt__meta_t *m, const char *key,
                               const void *value, size_t len);

/*
 * One liveness round for every owned key: redis EXPIRE (SET again when
 * gone), etcd lease keep-alive (new lease and PUTs when it was lost),
 * http PUT again with ?ttl=. Returns KVT_OK when every key is live again,
 * otherwise the first error (the round still tries every key). KVT_OK at
 * once when nothing is owned.
 */
kvt_status_t kvt__meta_refresh(kvt__meta_t *m);

/*
 * Run kvt__meta_refresh() from an internal thread every ttl/3 seconds
 * (at least every second) until kvt__meta_destroy(). A failed round is
 * logged once per change of status and retried at the next tick.
 * KVT_OK, KVT_ERR_EXISTS (already running), KVT_ERR_NOT_SUPPORTED (p2p),
 * KVT_ERR_NO_MEMORY (thread could not start).
 */
kvt_status_t kvt__meta_heartbeat_start(kvt__meta_t *m);

/* ---- Segment descriptors ----------------------------------------------- */

/*
 * Write "kvt/v1/segment/<name>" into @buf. KVT_ERR_INVALID_PARAM for an
 * empty name, KVT_ERR_OVERFLOW when it does not fit.
 */
kvt_status_t kvt__meta_segment_key(const char *name, char *buf, size_t cap);

/*
 * Publish (with TTL and ownership, as kvt__meta_publish()) the JSON form of
 * @d under kvt__meta_segment_key(d->name). Call again whenever the
 * descriptor changes. Errors of kvt__segdesc_to_json() and
 * kvt__meta_publish().
 */
kvt_status_t kvt__meta_publish_segdesc(kvt__meta_t *m, const kvt__segdesc_t *d);

/*
 * Fetch and decode the descriptor of segment @name into @d (which then
 * owns a malloc'd region array: kvt__segdesc_clear()). KVT_ERR_NOT_FOUND
 * when no live engine publishes it, KVT_ERR_VERSION (incompatible peer),
 * KVT_ERR_PROTOCOL (malformed, or its name is not @name), and the errors
 * of kvt__meta_get().
 */
kvt_status_t kvt__meta_lookup_segdesc(kvt__meta_t *m, const char *name,
                                      kvt__segdesc_t *d);

/* ---- JSON descriptor codec (segdesc_json.c) ---------------------------- */

#define KVT_SEGDESC_JSON_VERSION 1
/* Largest JSON descriptor accepted (65536 regions fit). */
#define KVT_SEGDESC_JSON_MAX (16u << 20)

/*
 * The compatibility hash: FNV-1a of the wire protocol's major version, the
 * JSON schema version, byte order and pointer width. Two engines can talk
 * only when their hashes are equal.
 */
uint64_t kvt__segdesc_compat_hash(void);

/*
 * Encode @d as the versioned JSON document of docs/metadata.md. On KVT_OK
 * *json_p is a malloc'd NUL-terminated string of *len_p bytes. Returns
 * KVT_ERR_INVALID_PARAM (empty name or host, a region of length 0),
 * KVT_ERR_OVERFLOW (too many regions), KVT_ERR_NOT_SUPPORTED (built
 * without JSON), KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__segdesc_to_json(const kvt__segdesc_t *d, char **json_p,
                                  size_t *len_p);

/*
 * Decode and check @len bytes of JSON (need not be NUL-terminated) into
 * @d, which is zeroed first and on KVT_OK owns a malloc'd region array.
 * Pure apart from logging the reason of a refusal at warning level.
 * KVT_ERR_VERSION for another schema version or compatibility hash,
 * KVT_ERR_PROTOCOL for anything malformed (syntax, missing or mistyped
 * field, out-of-range number, overflowing region), KVT_ERR_NOT_SUPPORTED
 * (built without JSON), KVT_ERR_NO_MEMORY. Nothing is left allocated on
 * error.
 */
kvt_status_t kvt__segdesc_from_json(const char *json, size_t len,
                                    kvt__segdesc_t *d);

#endif
