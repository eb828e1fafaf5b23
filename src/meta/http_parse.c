/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An HTTP/1.1 request parser for kvt metad: request line, headers and
 * body framing, without I/O, so that it can be fuzzed.
 */
#include "meta/http_parse.h"

#include <string.h>

#include "util/hex.h"

static const char *const method_names[KVT__METHOD_COUNT] = {
    "GET", "PUT", "DELETE", "HEAD", "POST", "OTHER",
};

static const struct {
    const char *path;
    kvt__route_t route;
} routes[] = {
    {"/metadata", KVT__ROUTE_METADATA}, {"/metadata/keys", KVT__ROUTE_KEYS},
    {"/route", KVT__ROUTE_ROUTE},       {"/topology", KVT__ROUTE_TOPOLOGY},
    {"/health", KVT__ROUTE_HEALTH},     {"/metrics", KVT__ROUTE_METRICS},
};

static const char *const route_names[KVT__ROUTE_COUNT] = {
    "other", "metadata", "keys", "route", "topology", "health", "metrics",
};

kvt__method_t kvt__http_method(const char *method)
{
    for (int i = 0; i < KVT__METHOD_OTHER; i++)
        if (strcmp(method, method_names[i]) == 0)
            return (kvt__method_t)i;
    return KVT__METHOD_OTHER;
}

const char *kvt__http_method_name(kvt__method_t m)
{
    return (unsigned)m < KVT__METHOD_COUNT ? method_names[m] : "OTHER";
}

const char *kvt__http_route_name(kvt__route_t r)
{
    return (unsigned)r < KVT__ROUTE_COUNT ? route_names[r] : "other";
}

/*
 * Percent-decode [s, e) into @out (room for @cap bytes plus a NUL).
 * Returns the decoded length, -400 for a bad escape or a NUL byte, -414
 * when the result does not fit.
 */
static long decode(const char *s, const char *e, char *out, size_t cap)
{
    size_t n = 0;

    while (s < e) {
        int c = (unsigned char)*s;
        if (c == '%') {
            int hi, lo;
            if (e - s < 3 || (hi = kvt__hex_val(s[1])) < 0 ||
                (lo = kvt__hex_val(s[2])) < 0)
                return -400;
            c = hi * 16 + lo;
            s += 3;
        } else {
            if (c == '+')
                c = ' ';
            s++;
        }
        if (c == 0)
            return -400;
        if (n == cap)
            return -414;
        out[n++] = (char)c;
    }
    out[n] = '\0';
    return (long)n;
}

int kvt__utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *e = p + n;

    while (p < e) {
        unsigned c = *p++, need, min, cp;
        if (c < 0x80)
            continue;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
            min = 0x80;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            min = 0x800;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            min = 0x10000;
            cp = c & 0x07;
        } else {
            return 0; /* a continuation byte, 0xc0, 0xc1 or beyond 0xf4 */
        }
        if ((size_t)(e - p) < need)
            return 0;
        for (unsigned i = 0; i < need; i++, p++) {
            if ((*p & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (*p & 0x3fu);
        }
        /* Overlong forms, UTF-16 surrogates, beyond U+10FFFF. */
        if (cp < min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return 0;
    }
    return 1;
}

/* The whitespace Python's str.strip() removes from ASCII text. */
static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Strip surrounding whitespace from the NUL-terminated @s of @n bytes in
 * place; returns the new length. */
static size_t strip(char *s, size_t n)
{
    size_t b = 0;

    while (n > 0 && is_space(s[n - 1]))
        n--;
    while (b < n && is_space(s[b]))
        b++;
    memmove(s, s + b, n - b);
    s[n - b] = '\0';
    return n - b;
}

/* A decimal integer with an optional '-', |v| < 2^31, in a decoded
 * string of @n bytes. */
static int parse_int(const char *s, size_t n, int64_t *v_p)
{
    int neg = 0;
    int64_t v = 0;

    if (n > 0 && s[0] == '-') {
        neg = 1;
        s++;
        n--;
    }
    if (n == 0 || n > 10)
        return 400;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 400;
        v = v * 10 + (s[i] - '0');
    }
    if (v >= (int64_t)1 << 31)
        return 400;
    *v_p = neg ? -v : v;
    return 0;
}

/* Handle one decoded-name parameter whose raw value is [vs, ve). */
static int take_param(kvt__http_req_t *r, const char *name, const char *vs,
                      const char *ve)
{
    char num[32];
    long n;
    int64_t v;

    if (strcmp(name, "key") == 0 || strcmp(name, "prefix") == 0) {
        int is_key = name[0] == 'k';
        int *has = is_key ? &r->has_key : &r->has_prefix;
        char *out = is_key ? r->key : r->prefix;
        if (*has)
            return 0;
        n = decode(vs, ve, out, KVT_META_KEY_MAX);
        if (n < 0)
            return (int)-n;
        /* Keys travel in JSON answers (/metadata/keys), which must stay
         * valid for every client. */
        if (!kvt__utf8_valid(out, (size_t)n))
            return 400;
        *has = 1;
        if (is_key)
            r->key_len = strip(out, (size_t)n);
        else
            r->prefix_len = (size_t)n;
        return 0;
    }
    if (strcmp(name, "ttl") != 0 && strcmp(name, "engine_rank") != 0 &&
        strcmp(name, "target_dp_group") != 0)
        return 0;
    n = decode(vs, ve, num, sizeof(num) - 1);
    if (n < 0)
        return 400;
    if (parse_int(num, (size_t)n, &v) != 0)
        return 400;
    if (name[0] == 't' && name[1] == 't') {
        if (r->has_ttl)
            return 0;
        if (v < 0 || v > KVT_HTTP_TTL_MAX)
            return 400;
        r->ttl_s = (uint32_t)v;
        r->has_ttl = 1;
    } else if (name[0] == 'e') {
        if (!r->has_engine_rank) {
            r->engine_rank = v;
            r->has_engine_rank = 1;
        }
    } else if (!r->has_dp_group) {
        r->dp_group = v;
        r->has_dp_group = 1;
    }
    return 0;
}

int kvt__http_parse_target(const char *target, size_t len, kvt__http_req_t *r)
{
    const char *end = target + len, *q, *p;
    size_t plen;

    memset(r, 0, offsetof(kvt__http_req_t, key));
    r->key[0] = r->prefix[0] = '\0';
    if (len > KVT_HTTP_TARGET_MAX)
        return 414;
    if (len == 0 || target[0] != '/')
        return 400;
    q = target;
    while (q < end && *q != '?' && *q != '#')
        q++;
    plen = (size_t)(q - target);
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strlen(routes[i].path) == plen &&
            memcmp(routes[i].path, target, plen) == 0)
            r->route = routes[i].route;
    if (q == end || *q == '#')
        return 0;
    p = q + 1;
    while (p < end && *p != '#') {
        const char *amp = p, *eq, *ve;
        char name[24];
        long n;
        int st;

        while (amp < end && *amp != '&' && *amp != '#')
            amp++;
        eq = memchr(p, '=', (size_t)(amp - p));
        ve = amp;
        if (eq == NULL)
            eq = amp;
        /* Names we do not know are skipped, whatever they hold. */
        n = decode(p, eq, name, sizeof(name) - 1);
        if (n == -400)
            return 400;
        if (n >= 0 && (size_t)n == strlen(name)) {
            st = take_param(r, name, eq < amp ? eq + 1 : amp, ve);
            if (st != 0)
                return st;
        }
        if (amp == end || *amp == '#')
            break;
        p = amp + 1;
    }
    return 0;
}

int kvt__http_parse_length(const char *s, uint64_t *v_p)
{
    uint64_t v = 0;
    size_t n = 0;

    if (s == NULL)
        return 400;
    for (; s[n] != '\0'; n++) {
        if (s[n] < '0' || s[n] > '9' || n >= 19)
            return 400;
        v = v * 10 + (uint64_t)(s[n] - '0');
    }
    if (n == 0)
        return 400;
    *v_p = v;
    return 0;
}
