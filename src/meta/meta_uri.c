/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Backend URI parsing. Pure (no I/O, no logging, no allocation) so that it
 * can be fuzzed; kvt__meta_create() logs what it refuses.
 */
#include <string.h>
#include <strings.h>

#include "meta/meta.h"

const char *kvt__meta_kind_name(kvt__meta_kind_t kind)
{
    switch (kind) {
    case KVT__META_P2P:
        return "p2p";
    case KVT__META_HTTP:
        return "http";
    case KVT__META_REDIS:
        return "redis";
    case KVT__META_ETCD:
        return "etcd";
    }
    return "unknown";
}

static int is_host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

static int is_v6_char(char c)
{
    return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
           (c >= '0' && c <= '9') || c == ':' || c == '.';
}

/* Parse a decimal number of 1..10 digits in [s, e) no larger than @max. */
static int parse_uint(const char *s, const char *e, unsigned long max,
                      unsigned long *out)
{
    unsigned long v = 0;

    if (s == e || e - s > 10)
        return -1;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

/*
 * Parse "host[:port]" or "[v6]:port" in [s, e) into @ep. The host is
 * stored without brackets; a missing port takes @def_port.
 */
static int parse_hostport(const char *s, const char *e, uint16_t def_port,
                          kvt__meta_endpoint_t *ep)
{
    const char *h = s, *he, *colon = NULL;
    unsigned long port = def_port;

    if (s == e)
        return -1;
    if (*s == '[') {
        h = s + 1;
        he = memchr(h, ']', (size_t)(e - h));
        if (he == NULL || he == h)
            return -1;
        for (const char *p = h; p < he; p++)
            if (!is_v6_char(*p))
                return -1;
        if (he + 1 < e) {
            if (he[1] != ':')
                return -1;
            colon = he + 1;
        }
    } else {
        he = e;
        for (const char *p = s; p < e; p++) {
            if (*p == ':') {
                he = p;
                colon = p;
                break;
            }
            if (!is_host_char(*p))
                return -1;
        }
        if (he == h)
            return -1;
    }
    if ((size_t)(he - h) > KVT_META_HOST_MAX)
        return -1;
    if (colon != NULL && parse_uint(colon + 1, e, 65535, &port) != 0)
        return -1;
    if (port == 0)
        return -1;
    memcpy(ep->host, h, (size_t)(he - h));
    ep->host[he - h] = '\0';
    ep->port = (uint16_t)port;
    return 0;
}

/* Copy [s, e) into @dst of @cap bytes as a string; -1 when too long. */
static int copy_span(char *dst, size_t cap, const char *s, const char *e)
{
    if ((size_t)(e - s) >= cap)
        return -1;
    memcpy(dst, s, (size_t)(e - s));
    dst[e - s] = '\0';
    return 0;
}

static int parse_http(const char *rest, kvt__meta_uri_t *u)
{
    const char *end = rest + strlen(rest);
    const char *slash = memchr(rest, '/', (size_t)(end - rest));
    const char *auth_end = slash ? slash : end;

    if (parse_hostport(rest, auth_end, 80, &u->ep[0]) != 0)
        return -1;
    u->nendpoints = 1;
    if (slash == NULL || end - slash == 1) {
        strcpy(u->path, "/metadata");
        return 0;
    }
    for (const char *p = slash; p < end; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f ||
            *p == '?' || *p == '#')
            return -1;
    return copy_span(u->path, sizeof(u->path), slash, end);
}

static int parse_redis(const char *rest, kvt__meta_uri_t *u)
{
    const char *end = rest + strlen(rest);
    const char *slash = memchr(rest, '/', (size_t)(end - rest));
    const char *auth_end = slash ? slash : end;
    const char *at = NULL;
    unsigned long db = 0;

    for (const char *p = rest; p < auth_end; p++)
        if (*p == '@')
            at = p;
    if (at != NULL) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        if (colon == NULL)
            return -1;
        if (copy_span(u->user, sizeof(u->user), rest, colon) != 0 ||
            copy_span(u->password, sizeof(u->password), colon + 1, at) != 0)
            return -1;
        rest = at + 1;
    }
    if (parse_hostport(rest, auth_end, 6379, &u->ep[0]) != 0)
        return -1;
    u->nendpoints = 1;
    if (slash != NULL && end - slash > 1 &&
        parse_uint(slash + 1, end, 65535, &db) != 0)
        return -1;
    u->db = (unsigned)db;
    return 0;
}

static int parse_etcd(const char *rest, kvt__meta_uri_t *u)
{
    const char *end = rest + strlen(rest);
    const char *p = rest;

    if (end > rest && end[-1] == '/')
        end--;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;

        if (u->nendpoints == KVT_META_MAX_ENDPOINTS)
            return -1;
        if (parse_hostport(p, e, 2379, &u->ep[u->nendpoints]) != 0)
            return -1;
        u->nendpoints++;
        if (comma == NULL)
            break;
        p = comma + 1;
        if (p == end)
            return -1;
    }
    return u->nendpoints > 0 ? 0 : -1;
}

kvt_status_t kvt__meta_uri_parse(const char *uri, kvt__meta_uri_t *u)
{
    static const struct {
        const char *scheme;
        kvt__meta_kind_t kind;
        int (*parse)(const char *, kvt__meta_uri_t *);
    } schemes[] = {
        {"http://", KVT__META_HTTP, parse_http},
        {"redis://", KVT__META_REDIS, parse_redis},
        {"etcd://", KVT__META_ETCD, parse_etcd},
    };

    if (uri == NULL || u == NULL)
        return KVT_ERR_INVALID_PARAM;
    memset(u, 0, sizeof(*u));
    if (*uri == '\0' || strcasecmp(uri, "p2p") == 0 ||
        strcmp(uri, "P2PHANDSHAKE") == 0) {
        u->kind = KVT__META_P2P;
        return KVT_OK;
    }
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t n = strlen(schemes[i].scheme);
        if (strncasecmp(uri, schemes[i].scheme, n) != 0)
            continue;
        u->kind = schemes[i].kind;
        if (schemes[i].parse(uri + n, u) != 0)
            return KVT_ERR_INVALID_PARAM;
        return KVT_OK;
    }
    return KVT_ERR_INVALID_PARAM;
}
