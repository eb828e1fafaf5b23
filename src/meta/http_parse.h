/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_HTTP_PARSE_H
#define KVT_META_HTTP_PARSE_H

/*
 * Request parsing for `kvt metad`, apart from the server so that it can be
 * fuzzed: pure functions over bytes, no I/O, no allocation, no logging.
 * Each returns 0 when the input is acceptable and otherwise the HTTP status
 * the server answers with (400, 414); the server changes nothing then.
 */
#include <stddef.h>
#include <stdint.h>

#include "meta/meta.h"

typedef enum {
    KVT__ROUTE_NONE = 0, /* unknown path: 404 */
    KVT__ROUTE_METADATA, /* /metadata: Mooncake's key/value routes */
    KVT__ROUTE_KEYS,     /* /metadata/keys: kvt's prefix listing */
    KVT__ROUTE_ROUTE,    /* /route: SGLang's PD bootstrap routes */
    KVT__ROUTE_TOPOLOGY, /* /topology: every registered prefill rank */
    KVT__ROUTE_HEALTH,   /* /health */
    KVT__ROUTE_METRICS,  /* /metrics */
    KVT__ROUTE_COUNT,
} kvt__route_t;

typedef enum {
    KVT__METHOD_GET = 0,
    KVT__METHOD_PUT,
    KVT__METHOD_DELETE,
    KVT__METHOD_HEAD,
    KVT__METHOD_POST,
    KVT__METHOD_OTHER,
    KVT__METHOD_COUNT,
} kvt__method_t;

/* Longest request target (path and query) the parser accepts: a key of
 * KVT_META_KEY_MAX bytes fully percent-encoded, plus room for the rest. */
#define KVT_HTTP_TARGET_MAX (3u * KVT_META_KEY_MAX + 512u)
/* Largest ?ttl= in seconds (one year); 0 means no expiry. */
#define KVT_HTTP_TTL_MAX 31536000u

/* The parts of a request target that the routes use. Strings are
 * percent-decoded and NUL-terminated; has_* says which were present. */
typedef struct {
    kvt__route_t route;
    int has_key, has_prefix, has_ttl, has_engine_rank, has_dp_group;
    size_t key_len, prefix_len;
    uint32_t ttl_s;
    int64_t engine_rank;
    int64_t dp_group; /* SGLang's target_dp_group */
    char key[KVT_META_KEY_MAX + 1];
    char prefix[KVT_META_KEY_MAX + 1];
} kvt__http_req_t;

kvt__method_t kvt__http_method(const char *method);
const char *kvt__http_method_name(kvt__method_t m);
const char *kvt__http_route_name(kvt__route_t r);

/*
 * Parse a request target ("/path?query", not NUL-terminated, @len bytes)
 * into @r. Path: exact match against the routes above (no decoding; an
 * unknown path is route KVT__ROUTE_NONE and still returns 0). Query:
 * '&'-separated name=value pairs, percent-decoded with '+' as a space; the
 * first occurrence of a name wins, unknown names are ignored. Recognised:
 * key and prefix (valid UTF-8 without a NUL byte, at most KVT_META_KEY_MAX
 * bytes decoded; the key stripped of surrounding ASCII whitespace, as
 * Mooncake's servers do, so that it may come out empty), ttl
 * (0..KVT_HTTP_TTL_MAX), engine_rank and target_dp_group (decimal,
 * optionally negative, |v| < 2^31).
 *
 * Returns 0, 400 (target not starting with '/', bad escape, NUL in a
 * string, key or prefix not valid UTF-8, malformed number) or 414 (target
 * longer than KVT_HTTP_TARGET_MAX, key or prefix too long).
 */
int kvt__http_parse_target(const char *target, size_t len, kvt__http_req_t *r);

/* Whether @s (@n bytes) is well-formed UTF-8: no overlong forms, no
 * surrogates, nothing beyond U+10FFFF. */
int kvt__utf8_valid(const char *s, size_t n);

/*
 * Parse a Content-Length value: decimal digits only, no sign or spaces
 * around, at most 19 digits. 0 with *v_p set, or 400.
 */
int kvt__http_parse_length(const char *s, uint64_t *v_p);

#endif
