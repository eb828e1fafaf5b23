/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd backend, over etcd's v3 JSON gateway (grpc-gateway): POST
 * /v3/kv/put, /v3/kv/range, /v3/kv/deleterange, /v3/lease/grant,
 * /v3/lease/keepalive, /v3/lease/revoke, with keys and values in base64
 * and 64-bit integers as decimal strings.
 *
 * Endpoints: a call starts at the endpoint that answered last and moves
 * on to the next one when an endpoint cannot be reached, all within the
 * handle's timeout for the whole call.
 *
 * Liveness: one lease per handle, granted with the handle's TTL on the
 * first publish; published keys are attached to it. A refresh is one
 * keep-alive of the lease. When etcd no longer knows the lease (it
 * expired during a partition, or etcd lost it), a new one is granted and
 * every owned key is put again. etcd deletes the keys of a lease that is
 * not kept alive within its TTL (checked about every 500 ms).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/base64.h"
#include "meta/json_parse.h"
#include "meta/meta_answer.h"
#include "meta/meta_curl.h"
#include "meta/meta_int.h"
#include "util/log.h"
#include "util/time.h"

typedef struct {
    kvt__curl_t curl;
    unsigned cur;  /* endpoint to try first */
    int64_t lease; /* 0: none granted yet */
} etcd_be_t;

static kvt_status_t etcd_open(kvt__meta_t *m)
{
    etcd_be_t *b = calloc(1, sizeof(*b));
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (b == NULL)
        goto err;
    st = kvt__curl_init(&b->curl);
    if (st != KVT_OK)
        goto err_b;
    m->be = b;
    return KVT_OK;

err_b:
    free(b);
err:
    return st;
}

/* A base64 JSON string of @n bytes; NULL when out of memory. */
static json_object *b64_json(const void *data, size_t n)
{
    char *enc = malloc(kvt__b64_enc_len(n) + 1);
    json_object *o;

    if (enc == NULL)
        return NULL;
    kvt__b64_encode(data, n, enc);
    o = json_object_new_string(enc);
    free(enc);
    return o;
}

/* Add @v to @o; on failure put @v and count it in @oom. */
static void add(json_object *o, const char *k, json_object *v, int *oom)
{
    if (o == NULL || v == NULL || json_object_object_add(o, k, v) != 0) {
        json_object_put(v);
        *oom = 1;
    }
}

static json_object *i64_json(int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return json_object_new_string(buf);
}

/* A 64-bit integer field, as the gateway writes it (a decimal string) or
 * as a JSON integer. Absent or malformed: @def. */
static int64_t get_i64(json_object *o, const char *key, int64_t def)
{
    json_object *v;
    char *end;
    long long x;

    if (o == NULL || !json_object_object_get_ex(o, key, &v))
        return def;
    if (json_object_is_type(v, json_type_int))
        return json_object_get_int64(v);
    if (!json_object_is_type(v, json_type_string))
        return def;
    x = strtoll(json_object_get_string(v), &end, 10);
    return *end == '\0' ? (int64_t)x : def;
}

/*
 * POST @req (consumed) to @path on the endpoints in turn, within the
 * handle's timeout. On KVT_OK *code_p is the HTTP status and *resp_p the
 * parsed answer (NULL when it is not JSON); the caller puts it.
 */
static kvt_status_t call(kvt__meta_t *m, const char *path, json_object *req,
                         json_object **resp_p, long *code_p)
{
    etcd_be_t *b = m->be;
    uint64_t deadline = kvt__now_ns() + m->timeout_ms * 1000000u;
    const char *body;
    size_t len;
    char url[KVT_META_HOST_MAX + 64];
    kvt__curl_resp_t r;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    body =
        req ? json_object_to_json_string_length(
                  req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                  &len)
            : NULL;
    if (body == NULL)
        goto err_req;
    for (unsigned i = 0; i < m->uri.nendpoints; i++) {
        const kvt__meta_endpoint_t *ep = &m->uri.ep[b->cur];
        uint64_t now = kvt__now_ns();
        int v6 = strchr(ep->host, ':') != NULL;

        if (now >= deadline) {
            st = KVT_ERR_TIMEDOUT;
            break;
        }
        snprintf(url, sizeof(url), "http://%s%s%s:%u%s", v6 ? "[" : "",
                 ep->host, v6 ? "]" : "", ep->port, path);
        st = kvt__curl_request(&b->curl, "etcd metadata", "POST", url,
                               "application/json", body, len,
                               (deadline - now + 999999u) / 1000000u,
                               2u * KVT_META_VALUE_MAX, &r);
        if (!kvt__meta_is_down(st))
            break;
        b->cur = (b->cur + 1) % m->uri.nendpoints;
    }
    if (st != KVT_OK)
        goto err_req;
    *code_p = r.code;
    *resp_p = r.body ? kvt__json_parse((const char *)r.body, r.len) : NULL;
    kvt__curl_resp_free(&r);
err_req:
    json_object_put(req);
    return st;
}

/* Log an error answer of the gateway; returns the status for it. */
static kvt_status_t answer_error(const char *what, long code, json_object *resp)
{
    json_object *v;
    const char *msg = "";

    if (resp != NULL && (json_object_object_get_ex(resp, "message", &v) ||
                         json_object_object_get_ex(resp, "error", &v)))
        msg = json_object_get_string(v);
    if (code == 404)
        /* Not etcd's gateway: most often another metadata server behind
         * an address given without a scheme, which Mooncake (and kvt)
         * take as etcd's. */
        KVT_LOG_E("etcd metadata: %s answered %ld%s%.200s: the server is not "
                  "an etcd v3 gateway; an address without a scheme is taken "
                  "as etcd's (as Mooncake does): for kvt metad or another "
                  "HTTP metadata server write http://HOST:PORT/metadata",
                  what, code, msg != NULL && msg[0] ? ": " : "",
                  msg != NULL ? msg : "");
    else
        KVT_LOG_W("etcd metadata: %s answered %ld: %.200s", what, code, msg);
    return KVT_ERR_IO;
}

static int lease_missing(json_object *resp)
{
    json_object *v;
    const char *msg;

    if (resp == NULL || (!json_object_object_get_ex(resp, "message", &v) &&
                         !json_object_object_get_ex(resp, "error", &v)))
        return 0;
    msg = json_object_get_string(v);
    return msg != NULL && strstr(msg, "lease not found") != NULL;
}

/* A new lease with the handle's TTL; etcd may round the TTL up to its
 * minimum. */
static kvt_status_t grant(kvt__meta_t *m)
{
    etcd_be_t *b = m->be;
    json_object *req = json_object_new_object(), *resp = NULL;
    long code;
    int oom = 0;
    kvt_status_t st;

    add(req, "TTL", i64_json(m->ttl_s), &oom);
    if (oom) {
        json_object_put(req);
        return KVT_ERR_NO_MEMORY;
    }
    st = call(m, "/v3/lease/grant", req, &resp, &code);
    if (st != KVT_OK)
        goto err;
    if (code != 200 || get_i64(resp, "ID", 0) == 0) {
        st = answer_error("lease grant", code, resp);
        goto err_resp;
    }
    b->lease = get_i64(resp, "ID", 0);
err_resp:
    json_object_put(resp);
err:
    return st;
}

/* One put; @lease 0 for none. KVT_ERR_NOT_FOUND when the lease is gone. */
static kvt_status_t put_once(kvt__meta_t *m, const char *key, const void *val,
                             size_t len, int64_t lease)
{
    json_object *req = json_object_new_object(), *resp = NULL;
    long code;
    int oom = 0;
    kvt_status_t st;

    add(req, "key", b64_json(key, strlen(key)), &oom);
    add(req, "value", b64_json(val, len), &oom);
    if (lease != 0)
        add(req, "lease", i64_json(lease), &oom);
    if (oom) {
        json_object_put(req);
        return KVT_ERR_NO_MEMORY;
    }
    st = call(m, "/v3/kv/put", req, &resp, &code);
    if (st == KVT_OK && code != 200)
        st = lease != 0 && lease_missing(resp)
                 ? KVT_ERR_NOT_FOUND
                 : answer_error("put", code, resp);
    json_object_put(resp);
    return st;
}

/* A new lease, and every owned key put again under it. */
static kvt_status_t regrant(kvt__meta_t *m)
{
    etcd_be_t *b = m->be;
    kvt_status_t st = grant(m);

    for (size_t i = 0; st == KVT_OK && i < m->nowned; i++) {
        kvt__meta_owned_t *o = &m->owned[i];
        st = put_once(m, o->key, o->val, o->len, b->lease);
        if (st == KVT_ERR_NOT_FOUND) {
            KVT_LOG_W("etcd metadata: a lease granted just now is gone");
            st = KVT_ERR_IO;
        }
    }
    return st;
}

/* Put, with the handle's lease when @expiring (granted on first use); a
 * lease found gone is replaced and every owned key put again first. */
static kvt_status_t etcd_put(kvt__meta_t *m, const char *key, const void *val,
                             size_t len, int expiring)
{
    etcd_be_t *b = m->be;
    kvt_status_t st = KVT_OK;

    if (expiring && b->lease == 0)
        st = grant(m);
    if (st == KVT_OK)
        st = put_once(m, key, val, len, expiring ? b->lease : 0);
    if (st == KVT_ERR_NOT_FOUND) {
        KVT_LOG_I("etcd metadata: lease %" PRId64 " expired; granting a "
                  "new one and publishing again",
                  b->lease);
        st = regrant(m);
        if (st == KVT_OK)
            st = put_once(m, key, val, len, b->lease);
        if (st == KVT_ERR_NOT_FOUND)
            st = KVT_ERR_IO;
    }
    return st;
}

/* Range over one key; the value comes back base64 in kvs[0].value. */
static kvt_status_t etcd_get(kvt__meta_t *m, const char *key, uint8_t **val_p,
                             size_t *len_p)
{
    json_object *req = json_object_new_object(), *resp = NULL;
    long code;
    int oom = 0;
    kvt_status_t st;

    add(req, "key", b64_json(key, strlen(key)), &oom);
    if (oom) {
        json_object_put(req);
        return KVT_ERR_NO_MEMORY;
    }
    st = call(m, "/v3/kv/range", req, &resp, &code);
    if (st != KVT_OK)
        goto err;
    if (code != 200 || resp == NULL)
        st = answer_error("range", code, resp);
    else
        st = kvt__etcd_range_value(resp, key, val_p, len_p);
    json_object_put(resp);
err:
    return st;
}

/* Deleterange of one key; "deleted" says whether it existed. */
static kvt_status_t etcd_del(kvt__meta_t *m, const char *key)
{
    json_object *req = json_object_new_object(), *resp = NULL;
    long code;
    int oom = 0;
    kvt_status_t st;

    add(req, "key", b64_json(key, strlen(key)), &oom);
    if (oom) {
        json_object_put(req);
        return KVT_ERR_NO_MEMORY;
    }
    st = call(m, "/v3/kv/deleterange", req, &resp, &code);
    if (st == KVT_OK && code != 200)
        st = answer_error("deleterange", code, resp);
    else if (st == KVT_OK && get_i64(resp, "deleted", 0) == 0)
        st = KVT_ERR_NOT_FOUND;
    json_object_put(resp);
    return st;
}

/* A keys-only range over [prefix, prefix end), limited to one more key
 * than the list may hold so that overflow is seen. */
static kvt_status_t etcd_list(kvt__meta_t *m, const char *prefix,
                              kvt__meta_keys_t *out)
{
    size_t plen = strlen(prefix), elen = plen;
    unsigned char *end = malloc(plen + 1);
    json_object *req, *resp = NULL;
    long code;
    int oom = 0;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (end == NULL)
        goto err;
    /* range_end: the prefix with its last byte below 0xff incremented and
     * the rest cut; "\0" (every key from the prefix on) if there is none. */
    memcpy(end, prefix, plen);
    while (elen > 0 && end[elen - 1] == 0xff)
        elen--;
    if (elen > 0)
        end[elen - 1]++;
    else
        end[elen++] = 0;
    req = json_object_new_object();
    add(req, "key", b64_json(plen ? prefix : "", plen ? plen : 1), &oom);
    add(req, "range_end", b64_json(end, elen), &oom);
    add(req, "keys_only", json_object_new_boolean(1), &oom);
    add(req, "limit", i64_json(KVT_META_LIST_MAX + 1), &oom);
    if (oom) {
        json_object_put(req);
        goto err_end;
    }
    st = call(m, "/v3/kv/range", req, &resp, &code);
    if (st != KVT_OK)
        goto err_end;
    if (code != 200 || resp == NULL) {
        st = answer_error("range", code, resp);
        goto err_resp;
    }
    st = kvt__etcd_range_keys(resp, out);
err_resp:
    json_object_put(resp);
err_end:
    free(end);
err:
    return st;
}

/* One keep-alive of the handle's lease; a new lease and puts of every
 * owned key when etcd no longer knows it. */
static kvt_status_t etcd_refresh(kvt__meta_t *m)
{
    etcd_be_t *b = m->be;
    json_object *req, *resp = NULL, *res;
    long code;
    int oom = 0;
    kvt_status_t st;

    if (b->lease == 0)
        return regrant(m);
    req = json_object_new_object();
    add(req, "ID", i64_json(b->lease), &oom);
    if (oom) {
        json_object_put(req);
        return KVT_ERR_NO_MEMORY;
    }
    st = call(m, "/v3/lease/keepalive", req, &resp, &code);
    if (st != KVT_OK)
        goto err;
    /* A stream of one answer: {"result": {"ID": .., "TTL": ..}}; a TTL of
     * 0 (omitted) means the lease is gone. */
    if (code != 200 && !lease_missing(resp)) {
        st = answer_error("lease keepalive", code, resp);
        goto err_resp;
    }
    if (!json_object_object_get_ex(resp, "result", &res))
        res = NULL;
    if (get_i64(res, "TTL", 0) <= 0) {
        KVT_LOG_I("etcd metadata: lease %" PRId64 " is gone; granting a "
                  "new one and publishing again",
                  b->lease);
        st = regrant(m);
    }
err_resp:
    json_object_put(resp);
err:
    return st;
}

/* Revoke the lease (best effort: its keys were deleted already, and it
 * expires anyway), then free the handle's state. */
static void etcd_close(kvt__meta_t *m)
{
    etcd_be_t *b = m->be;
    json_object *req, *resp = NULL;
    long code;
    int oom = 0;

    if (b->lease != 0) {
        req = json_object_new_object();
        add(req, "ID", i64_json(b->lease), &oom);
        if (!oom && call(m, "/v3/lease/revoke", req, &resp, &code) == KVT_OK)
            json_object_put(resp);
        else if (oom)
            json_object_put(req);
    }
    kvt__curl_fini(&b->curl);
    free(b);
    m->be = NULL;
}

const kvt__meta_ops_t kvt__meta_etcd_ops = {
    .name = "etcd",
    .open = etcd_open,
    .close = etcd_close,
    .put = etcd_put,
    .get = etcd_get,
    .del = etcd_del,
    .list = etcd_list,
    .refresh = etcd_refresh,
};
