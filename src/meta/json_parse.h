/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_JSON_PARSE_H
#define KVT_META_JSON_PARSE_H

/*
 * Strict JSON parsing of a bounded buffer with json-c, shared by the
 * descriptor and bootstrap decoders. Header-only so that each fuzz target
 * compiles it together with the decoder it exercises.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <json-c/json.h>

/* Nesting deeper than this is refused (descriptors need 4 levels). */
#define KVT_JSON_DEPTH 16

/*
 * Parse @len bytes (no NUL needed) as one strict JSON value, followed by
 * nothing but whitespace. Returns a new object (the caller puts it) or
 * NULL for anything malformed, truncated or too deep.
 */
static inline json_object *kvt__json_parse(const char *buf, size_t len)
{
    json_tokener *tok;
    json_object *obj = NULL;
    size_t end;
    int ok;

    if (len == 0 || len > INT32_MAX)
        return NULL;
    tok = json_tokener_new_ex(KVT_JSON_DEPTH);
    if (tok == NULL)
        return NULL;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
                                    JSON_TOKENER_ALLOW_TRAILING_CHARS);
    obj = json_tokener_parse_ex(tok, buf, (int)len);
    ok = json_tokener_get_error(tok) == json_tokener_success && obj != NULL;
    for (end = json_tokener_get_parse_end(tok); ok && end < len; end++)
        ok = buf[end] == ' ' || buf[end] == '\t' || buf[end] == '\r' ||
             buf[end] == '\n';
    if (!ok) {
        json_object_put(obj);
        obj = NULL;
    }
    json_tokener_free(tok);
    return obj;
}

/* The string at @key of object @o, with no NUL inside and 1..@max bytes;
 * NULL otherwise. */
static inline const char *kvt__json_str(json_object *o, const char *key,
                                        size_t max)
{
    json_object *v;
    const char *s;
    int n;

    if (!json_object_object_get_ex(o, key, &v) ||
        !json_object_is_type(v, json_type_string))
        return NULL;
    s = json_object_get_string(v);
    n = json_object_get_string_len(v);
    if (n <= 0 || (size_t)n > max || strlen(s) != (size_t)n)
        return NULL;
    return s;
}

/* An integer JSON value in [0, UINT64_MAX]: 0 and *v_p set, or -1
 * (not an integer, negative). */
static inline int kvt__json_u64(json_object *v, uint64_t *v_p)
{
    if (v == NULL || !json_object_is_type(v, json_type_int))
        return -1;
    if (json_object_get_int64(v) < 0)
        return -1;
    *v_p = json_object_get_uint64(v);
    return 0;
}

#endif
