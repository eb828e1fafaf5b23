/* SPDX-License-Identifier: Apache-2.0 */
/* Validation of PD bootstrap registrations (PUT /route bodies). */
#include <stdio.h>
#include <string.h>

#include "meta/bootstrap.h"
#include "meta/json_parse.h"

/*
 * An integer field in [lo, hi], given as a JSON integer or as a decimal
 * string of at most 10 digits (SGLang casts with int()). 0 or -1.
 */
static int get_int(json_object *o, const char *key, int64_t lo, int64_t hi,
                   int64_t *v_p)
{
    json_object *v;
    int64_t x = 0;

    if (!json_object_object_get_ex(o, key, &v))
        return -1;
    if (json_object_is_type(v, json_type_int)) {
        x = json_object_get_int64(v);
    } else if (json_object_is_type(v, json_type_string)) {
        const char *s = json_object_get_string(v);
        int n = json_object_get_string_len(v), i = 0, neg = 0;
        if (n > 0 && s[0] == '-') {
            neg = 1;
            i = 1;
        }
        if (n - i < 1 || n - i > 10)
            return -1;
        for (; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                return -1;
            x = x * 10 + (s[i] - '0');
        }
        if (neg)
            x = -x;
    } else {
        return -1;
    }
    if (x < lo || x > hi)
        return -1;
    *v_p = x;
    return 0;
}

static int valid_host(const char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
            return 0;
    return 1;
}

static const char *check(json_object *o, kvt__boot_rank_t *r)
{
    const char *s;
    int64_t tp, dp, rank, port;

    if ((s = kvt__json_str(o, "role", KVT_BOOT_ROLE_MAX)) == NULL)
        return "role must be a string of 1..31 bytes";
    strcpy(r->role, s);
    if (get_int(o, "tp_size", 1, KVT_BOOT_MAX_RANKS, &tp) != 0 &&
        get_int(o, "world_size", 1, KVT_BOOT_MAX_RANKS, &tp) != 0)
        return "tp_size (or world_size) must be an integer in 1..4096";
    if (get_int(o, "dp_size", 1, tp, &dp) != 0 || tp % dp != 0)
        return "dp_size must be an integer in 1..tp_size that divides it";
    if (get_int(o, "engine_rank", 0, tp - 1, &rank) != 0)
        return "engine_rank must be an integer in 0..tp_size-1";
    if ((s = kvt__json_str(o, "rank_ip", KVT_META_HOST_MAX)) == NULL ||
        !valid_host(s))
        return "rank_ip must be a host name or address of 1..255 bytes";
    strcpy(r->rank_ip, s);
    if (get_int(o, "rank_port", 1, 65535, &port) != 0)
        return "rank_port must be an integer in 1..65535";
    r->tp_size = (uint32_t)tp;
    r->dp_size = (uint32_t)dp;
    r->engine_rank = (uint32_t)rank;
    r->rank_port = (uint16_t)port;
    return NULL;
}

kvt_status_t kvt__boot_parse(const char *body, size_t len, kvt__boot_rank_t *r,
                             const char **why_p)
{
    json_object *o = kvt__json_parse(body, len);
    const char *why;
    kvt_status_t st = KVT_ERR_PROTOCOL;

    memset(r, 0, sizeof(*r));
    if (o == NULL || !json_object_is_type(o, json_type_object)) {
        why = "body is not a JSON object";
        goto err_obj;
    }
    st = KVT_ERR_INVALID_PARAM;
    why = check(o, r);
    if (why != NULL)
        goto err_obj;
    json_object_put(o);
    return KVT_OK;

err_obj:
    json_object_put(o);
    *why_p = why;
    return st;
}

/* An integer field of an answer given as a JSON integer or a decimal
 * string, at most @max. 0 or -1. */
static int answer_uint(json_object *o, const char *key, uint64_t max,
                       uint64_t *v_p)
{
    json_object *v;
    uint64_t x;

    if (!json_object_object_get_ex(o, key, &v))
        return -1;
    if (json_object_is_type(v, json_type_string)) {
        const char *s = json_object_get_string(v);
        int n = json_object_get_string_len(v);
        x = 0;
        if (n < 1 || n > 10)
            return -1;
        for (int i = 0; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                return -1;
            x = x * 10 + (uint64_t)(s[i] - '0');
        }
    } else if (kvt__json_u64(v, &x) != 0) {
        return -1;
    }
    if (x > max)
        return -1;
    *v_p = x;
    return 0;
}

/* The answer as a JSON object; NULL (and *why_p) otherwise. */
static json_object *answer_object(const char *body, size_t len,
                                  const char **why_p)
{
    json_object *o = kvt__json_parse(body, len);

    if (o != NULL && !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        o = NULL;
    }
    if (o == NULL)
        *why_p = "the answer is not a JSON object";
    return o;
}

kvt_status_t kvt__boot_sizes_parse(const char *body, size_t len, uint32_t *tp_p,
                                   uint32_t *dp_p, const char **why_p)
{
    json_object *o = answer_object(body, len, why_p);
    uint64_t tp, dp;
    kvt_status_t st = KVT_ERR_PROTOCOL;

    if (o == NULL)
        return st;
    if (answer_uint(o, "prefill_tp_size", 1u << 20, &tp) != 0 ||
        answer_uint(o, "prefill_dp_size", 1u << 20, &dp) != 0 || tp == 0 ||
        dp == 0 || tp % dp != 0) {
        *why_p = "bad prefill sizes";
    } else {
        *tp_p = (uint32_t)tp;
        *dp_p = (uint32_t)dp;
        st = KVT_OK;
    }
    json_object_put(o);
    return st;
}

kvt_status_t kvt__boot_route_parse(const char *body, size_t len, char *name,
                                   size_t cap, const char **why_p)
{
    json_object *o = answer_object(body, len, why_p);
    const char *ip;
    uint64_t port;
    kvt_status_t st = KVT_ERR_PROTOCOL;
    int n;

    if (o == NULL)
        return st;
    ip = kvt__json_str(o, "rank_ip", KVT_META_HOST_MAX);
    if (ip == NULL || !valid_host(ip) ||
        answer_uint(o, "rank_port", 65535, &port) != 0 || port == 0) {
        *why_p = "bad address";
        goto out;
    }
    n = snprintf(name, cap, strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip,
                 (unsigned)port);
    if (n < 0 || (size_t)n >= cap) {
        *why_p = "address too long";
        goto out;
    }
    st = KVT_OK;
out:
    json_object_put(o);
    return st;
}
