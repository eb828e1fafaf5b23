/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The http backend: Mooncake's HTTP metadata protocol, as `kvt metad`,
 * Mooncake's own metadata servers and SGLang's early bootstrap server
 * speak it:
 *
 *   PUT    PATH?key=K   body = value     200 stored
 *   GET    PATH?key=K                    200 value byte for byte, 404
 *   DELETE PATH?key=K                    200, 404
 *
 * kvt adds two things that other servers ignore or lack: "&ttl=S" on PUT
 * (kvt metad drops the key S seconds after the last PUT and says so with
 * an X-Kvt-Ttl header), and GET PATH/keys?prefix=P (a JSON array of keys).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/meta_curl.h"
#include "meta/meta_int.h"
#include "util/log.h"

#include "meta/meta_answer.h"

typedef struct {
    kvt__curl_t curl;
    char base[KVT_META_HOST_MAX + 300]; /* http://host:port/path */
    int warned_ttl;
} http_be_t;

static kvt_status_t http_open(kvt__meta_t *m)
{
    http_be_t *b = calloc(1, sizeof(*b));
    const kvt__meta_endpoint_t *ep = &m->uri.ep[0];
    int v6 = strchr(ep->host, ':') != NULL;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (b == NULL)
        goto err;
    st = kvt__curl_init(&b->curl);
    if (st != KVT_OK)
        goto err_b;
    b->curl.auth = m->auth;
    snprintf(b->base, sizeof(b->base), "http://%s%s%s:%u%s", v6 ? "[" : "",
             ep->host, v6 ? "]" : "", ep->port, m->uri.path);
    m->be = b;
    return KVT_OK;

err_b:
    free(b);
err:
    return st;
}

static void http_close(kvt__meta_t *m)
{
    http_be_t *b = m->be;
    kvt__curl_fini(&b->curl);
    free(b);
    m->be = NULL;
}

/* A malloc'd URL: base + @suffix + "?" + @param + "=" + escaped @value +
 * @extra. NULL when out of memory. */
static char *make_url(http_be_t *b, const char *suffix, const char *param,
                      const char *value, const char *extra)
{
    char *esc = kvt__curl_escape(&b->curl, value), *url = NULL;
    size_t n;

    if (esc == NULL)
        return NULL;
    n = strlen(b->base) + strlen(suffix) + strlen(param) + strlen(esc) +
        strlen(extra) + 4;
    url = malloc(n);
    if (url != NULL)
        snprintf(url, n, "%s%s?%s=%s%s", b->base, suffix, param, esc, extra);
    curl_free(esc);
    return url;
}

/* Map an unexpected HTTP status to a kvt status, and log it. */
static kvt_status_t bad_code(const char *method, const char *key,
                             const kvt__curl_resp_t *r)
{
    if (r->code == 401) {
        KVT_LOG_E("http metadata: authentication failed: %s key '%s' "
                  "refused (401): this engine's auth token is missing or "
                  "not the server's",
                  method, key);
        return KVT_ERR_AUTH;
    }
    KVT_LOG_W("http metadata: %s key '%s' answered %ld: %.200s", method, key,
              r->code, r->body ? (const char *)r->body : "");
    if (r->code == 413 || r->code == 414 || r->code == 431)
        return KVT_ERR_OVERFLOW;
    if (r->code == 507)
        return KVT_ERR_NO_SPACE;
    if (r->code == 400)
        return KVT_ERR_INVALID_PARAM;
    return KVT_ERR_IO;
}

/* PUT ?key=K (&ttl=S when @expiring); warns once when the server does
 * not acknowledge the TTL. */
static kvt_status_t http_put(kvt__meta_t *m, const char *key, const void *val,
                             size_t len, int expiring)
{
    http_be_t *b = m->be;
    kvt__curl_resp_t r;
    char extra[32] = "";
    char *url;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (expiring)
        snprintf(extra, sizeof(extra), "&ttl=%u", m->ttl_s);
    url = make_url(b, "", "key", key, extra);
    if (url == NULL)
        goto err;
    st = kvt__curl_request(&b->curl, "http metadata", "PUT", url,
                           "application/json", val, len, m->timeout_ms, 4096,
                           &r);
    if (st != KVT_OK)
        goto err_url;
    if (r.code != 200 && r.code != 201 && r.code != 204)
        st = bad_code("PUT", key, &r);
    else if (expiring && !r.ttl_ack && !b->warned_ttl) {
        KVT_LOG_W("http metadata server %s does not enforce TTLs (not kvt "
                  "metad?): entries of dead engines stay until deleted",
                  b->base);
        b->warned_ttl = 1;
    }
    kvt__curl_resp_free(&r);
err_url:
    free(url);
err:
    return st;
}

/* GET ?key=K: 200 is the value, 404 not found, anything else an error. */
static kvt_status_t http_get(kvt__meta_t *m, const char *key, uint8_t **val_p,
                             size_t *len_p)
{
    http_be_t *b = m->be;
    kvt__curl_resp_t r;
    char *url = make_url(b, "", "key", key, "");
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (url == NULL)
        goto err;
    st = kvt__curl_request(&b->curl, "http metadata", "GET", url, NULL, NULL, 0,
                           m->timeout_ms, KVT_META_VALUE_MAX, &r);
    if (st != KVT_OK)
        goto err_url;
    if (r.code == 404) {
        st = KVT_ERR_NOT_FOUND;
    } else if (r.code != 200) {
        st = bad_code("GET", key, &r);
    } else {
        if (r.body == NULL && (r.body = calloc(1, 1)) == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto err_url;
        }
        *val_p = r.body;
        *len_p = r.len;
        r.body = NULL;
    }
    kvt__curl_resp_free(&r);
err_url:
    free(url);
err:
    return st;
}

static kvt_status_t http_del(kvt__meta_t *m, const char *key)
{
    http_be_t *b = m->be;
    kvt__curl_resp_t r;
    char *url = make_url(b, "", "key", key, "");
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (url == NULL)
        goto err;
    st = kvt__curl_request(&b->curl, "http metadata", "DELETE", url, NULL, NULL,
                           0, m->timeout_ms, 4096, &r);
    if (st != KVT_OK)
        goto err_url;
    if (r.code == 404)
        st = KVT_ERR_NOT_FOUND;
    else if (r.code != 200 && r.code != 204)
        st = bad_code("DELETE", key, &r);
    kvt__curl_resp_free(&r);
err_url:
    free(url);
err:
    return st;
}

/* GET PATH/keys?prefix=P, kvt metad's listing; other servers answer 404
 * or 405, which is KVT_ERR_NOT_SUPPORTED. */
static kvt_status_t http_list(kvt__meta_t *m, const char *prefix,
                              kvt__meta_keys_t *out)
{
#ifdef KVT_WITH_JSON
    http_be_t *b = m->be;
    kvt__curl_resp_t r;
    char *url = make_url(b, "/keys", "prefix", prefix, "");
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (url == NULL)
        goto err;
    st = kvt__curl_request(&b->curl, "http metadata", "GET", url, NULL, NULL, 0,
                           m->timeout_ms, KVT_META_VALUE_MAX, &r);
    if (st != KVT_OK)
        goto err_url;
    if (r.code == 404 || r.code == 405) {
        KVT_LOG_W("http metadata server %s cannot list keys (no %s/keys "
                  "route: not kvt metad?)",
                  b->base, m->uri.path);
        st = KVT_ERR_NOT_SUPPORTED;
    } else if (r.code != 200) {
        st = bad_code("LIST", prefix, &r);
    } else {
        st = kvt__http_keys_parse(r.body, r.len, out);
    }
    kvt__curl_resp_free(&r);
err_url:
    free(url);
err:
    return st;
#else
    (void)m;
    (void)prefix;
    (void)out;
    KVT_LOG_E("listing http metadata keys needs json-c (KVT_WITH_JSON)");
    return KVT_ERR_NOT_SUPPORTED;
#endif
}

const kvt__meta_ops_t kvt__meta_http_ops = {
    .name = "http",
    .open = http_open,
    .close = http_close,
    .put = http_put,
    .get = http_get,
    .del = http_del,
    .list = http_list,
};
