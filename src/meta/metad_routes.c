/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The routes of `kvt metad` (docs/metadata.md): Mooncake's /metadata
 * store, SGLang's /route bootstrap, /topology and /metrics. Each handler
 * runs once the whole request is in, in one of libmicrohttpd's threads,
 * and answers; the stores do their own locking.
 */
#if defined(KVT_WITH_HTTP_SERVER) && defined(KVT_WITH_JSON)

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h> /* IWYU pragma: keep */

#include "meta/meta.h"
#include "meta/metad_int.h"
#include "util/log.h"

typedef kvt__metad_req_t req_t;

const char *kvt__metad_code_text(int code)
{
    switch (code) {
    case 400:
        return "Bad request";
    case 404:
        return "Not found";
    case 409:
        return "Conflicting parallel sizes";
    case 413:
        return "Request body too large";
    case 414:
        return "Request target or key too long";
    case 507:
        return "Store full";
    default:
        return "Internal error";
    }
}

/* ---- /metadata ----------------------------------------------------------- */

struct get_ctx {
    struct MHD_Response *resp;
};

/* Runs under the store's shard lock: copy the value into a response. */
static void copy_value(void *arg, const uint8_t *val, size_t len)
{
    struct get_ctx *g = arg;
    g->resp = MHD_create_response_from_buffer(len, (void *)(uintptr_t)val,
                                              MHD_RESPMEM_MUST_COPY);
}

/* GET /metadata: the stored bytes unchanged, copied while the shard's
 * read lock is held so that a concurrent PUT cannot tear them. */
enum MHD_Result kvt__metad_metadata_get(kvt__metad_t *md,
                                        struct MHD_Connection *c, req_t *rq,
                                        const kvt__http_req_t *hr)
{
    struct get_ctx g = {NULL};

    if (kvt__kvstore_get(md->store, hr->key, hr->key_len, kvt__metad_now_ms(),
                         copy_value, &g) != KVT_OK)
        return kvt__metad_answer(md, c, rq, 404, "metadata not found");
    if (g.resp != NULL &&
        MHD_add_response_header(g.resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "application/json") != MHD_YES) {
        MHD_destroy_response(g.resp);
        g.resp = NULL;
    }
    return kvt__metad_send(md, c, rq, 200, g.resp);
}

/*
 * PUT /metadata: store the body under the key, with the deadline of
 * ?ttl= when given, and acknowledge the TTL with X-Kvt-Ttl so that kvt
 * clients know it is enforced. 507 when the byte limit would be passed.
 * Keys containing "rpc_meta" (Mooncake's `mooncake/rpc_meta/<segment>`,
 * an engine's rpc address) follow Mooncake's servers: while one lives,
 * only the same bytes are accepted ("metadata unchanged", which renews a
 * TTL); other bytes are 400, so that a second engine cannot silently take
 * over a name.
 */
enum MHD_Result kvt__metad_metadata_put(kvt__metad_t *md,
                                        struct MHD_Connection *c, req_t *rq,
                                        const kvt__http_req_t *hr)
{
    uint64_t now = kvt__metad_now_ms(), expires = 0;
    unsigned flags = 0;
    struct MHD_Response *r;
    char ttl[16];
    kvt_status_t st;
    int same = 0;

    if (hr->has_ttl && hr->ttl_s > 0)
        expires = now + (uint64_t)hr->ttl_s * 1000u;
    if (memmem(hr->key, hr->key_len, "rpc_meta", 8) != NULL)
        flags |= KVT__KVSTORE_ONCE;
    st = kvt__kvstore_put(md->store, hr->key, hr->key_len,
                          rq->body ? rq->body : "", rq->body_len, expires,
                          flags, rq->held, now, &same);
    if (st == KVT_OK)
        rq->held = 0; /* now the entry's */
    if (st == KVT_ERR_EXISTS)
        return kvt__metad_answer(md, c, rq, 400,
                                 "Duplicate rpc_meta key not allowed");
    if (st == KVT_ERR_NO_SPACE)
        return kvt__metad_answer(md, c, rq, 507, "metadata store full");
    if (st != KVT_OK)
        return kvt__metad_answer(md, c, rq, 500, "out of memory");
    r = kvt__metad_text((flags & KVT__KVSTORE_ONCE) && same
                            ? "metadata unchanged"
                            : "metadata updated",
                        "application/json");
    /* Tells kvt clients that this server enforces the TTL. */
    snprintf(ttl, sizeof(ttl), "%u", hr->has_ttl ? hr->ttl_s : 0);
    if (r != NULL && hr->has_ttl &&
        MHD_add_response_header(r, "X-Kvt-Ttl", ttl) != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return kvt__metad_send(md, c, rq, 200, r);
}

/* DELETE /metadata: 200 when a live entry was removed, 404 otherwise. */
enum MHD_Result kvt__metad_metadata_del(kvt__metad_t *md,
                                        struct MHD_Connection *c, req_t *rq,
                                        const kvt__http_req_t *hr)
{
    if (kvt__kvstore_del(md->store, hr->key, hr->key_len,
                         kvt__metad_now_ms()) != KVT_OK)
        return kvt__metad_answer(md, c, rq, 404, "metadata not found");
    return kvt__metad_answer(md, c, rq, 200, "metadata deleted");
}

/* GET /metadata/keys: the live keys under ?prefix=, as a JSON array. */
enum MHD_Result kvt__metad_metadata_keys(kvt__metad_t *md,
                                         struct MHD_Connection *c, req_t *rq,
                                         const kvt__http_req_t *hr)
{
    json_object *a;
    char **keys;
    size_t n, len;
    const char *s;
    char *out = NULL;
    kvt_status_t st;

    st = kvt__kvstore_keys(md->store, hr->has_prefix ? hr->prefix : "",
                           hr->prefix_len, kvt__metad_now_ms(),
                           KVT_META_LIST_MAX, &keys, &n);
    if (st == KVT_ERR_OVERFLOW)
        return kvt__metad_answer(
            md, c, rq, 400, "more than 65536 keys match; use a longer prefix");
    if (st != KVT_OK)
        return kvt__metad_answer(md, c, rq, 500, "out of memory");
    a = json_object_new_array_ext(n > 0 ? (int)n : 1);
    for (size_t i = 0; a != NULL && i < n; i++) {
        json_object *k = json_object_new_string(keys[i]);
        if (k == NULL || json_object_array_add(a, k) != 0) {
            json_object_put(k);
            json_object_put(a);
            a = NULL;
        }
    }
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    s = a ? json_object_to_json_string_length(
                a, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                &len)
          : NULL;
    if (s != NULL && (out = malloc(len + 1)) != NULL)
        memcpy(out, s, len + 1);
    json_object_put(a);
    if (out == NULL)
        return kvt__metad_answer(md, c, rq, 500, "out of memory");
    return kvt__metad_answer_json(md, c, rq, 200, out, len);
}

/* ---- /route, /topology --------------------------------------------------- */

/*
 * PUT /route: validate the registration (400 with the reason), keep
 * prefill ranks (409 on conflicting sizes), acknowledge the others.
 */
enum MHD_Result kvt__metad_route_put(kvt__metad_t *md, struct MHD_Connection *c,
                                     req_t *rq, const kvt__http_req_t *hr)
{
    kvt__boot_rank_t r;
    const char *why = NULL;
    uint64_t now = kvt__metad_now_ms(), expires = 0;
    int code;

    if (kvt__boot_parse(rq->body, rq->body_len, &r, &why) != KVT_OK) {
        KVT_LOG_D("metad: PUT /route refused: %s", why);
        return kvt__metad_answer(md, c, rq, 400, why);
    }
    /* SGLang's server records prefill ranks only and acknowledges the
     * rest. */
    if (strcmp(r.role, "Prefill") != 0)
        return kvt__metad_answer(md, c, rq, 200, "OK");
    if (hr->has_ttl && hr->ttl_s > 0)
        expires = now + (uint64_t)hr->ttl_s * 1000u;
    code = kvt__boot_table_put(md->boot, &r, expires, now);
    if (code == 409)
        return kvt__metad_answer(
            md, c, rq, 409, "tp_size/dp_size differ from the registered ranks");
    return kvt__metad_answer(md, c, rq, (unsigned)code,
                             code == 200 ? "OK" : kvt__metad_code_text(code));
}

/* GET /route: one rank, or the sizes for engine_rank=-1 and
 * target_dp_group=-1, as SGLang's decode side asks. */
enum MHD_Result kvt__metad_route_get(kvt__metad_t *md, struct MHD_Connection *c,
                                     req_t *rq, const kvt__http_req_t *hr)
{
    char *json = NULL;
    size_t len = 0;
    int code;

    if (!hr->has_engine_rank || !hr->has_dp_group)
        return kvt__metad_answer(md, c, rq, 400,
                                 "Missing inputs for bootstrap server.");
    code = kvt__boot_table_get(md->boot, hr->engine_rank, hr->dp_group,
                               kvt__metad_now_ms(), &json, &len);
    if (code != 200)
        return kvt__metad_answer(md, c, rq, (unsigned)code,
                                 code == 404 ? "Bootstrap info not Found"
                                             : kvt__metad_code_text(code));
    return kvt__metad_answer_json(md, c, rq, 200, json, len);
}

enum MHD_Result kvt__metad_route_del(kvt__metad_t *md, struct MHD_Connection *c,
                                     req_t *rq, const kvt__http_req_t *hr)
{
    int code;

    if (!hr->has_engine_rank || !hr->has_dp_group)
        return kvt__metad_answer(md, c, rq, 400,
                                 "Missing inputs for bootstrap server.");
    code = kvt__boot_table_del(md->boot, hr->engine_rank, hr->dp_group,
                               kvt__metad_now_ms());
    return kvt__metad_answer(md, c, rq, (unsigned)code,
                             code == 200   ? "OK"
                             : code == 404 ? "Bootstrap info not Found"
                                           : kvt__metad_code_text(code));
}

enum MHD_Result kvt__metad_topology(kvt__metad_t *md, struct MHD_Connection *c,
                                    req_t *rq)
{
    char *json = NULL;
    size_t len = 0;
    int code =
        kvt__boot_table_topology(md->boot, kvt__metad_now_ms(), &json, &len);

    if (code != 200)
        return kvt__metad_answer(md, c, rq, (unsigned)code,
                                 kvt__metad_code_text(code));
    return kvt__metad_answer_json(md, c, rq, 200, json, len);
}

/* ---- /metrics ------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_printf(sbuf_t *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf_t *sb, const char *fmt, ...)
{
    va_list ap;
    int n;

    for (int tries = 0; tries < 2 && !sb->oom; tries++) {
        va_start(ap, fmt);
        n = vsnprintf(sb->buf + sb->len, sb->cap - sb->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            sb->oom = 1;
        } else if ((size_t)n < sb->cap - sb->len) {
            sb->len += (size_t)n;
            return;
        } else {
            size_t nc = (sb->cap + (size_t)n + 1) * 2;
            char *nb = realloc(sb->buf, nc);
            if (nb == NULL)
                sb->oom = 1;
            else {
                sb->buf = nb;
                sb->cap = nc;
            }
        }
    }
}

/*
 * GET /metrics in Prometheus text format (version 0.0.4). Counters are
 * read with relaxed loads: each value is exact, the set is a snapshot
 * taken over a few microseconds.
 */
enum MHD_Result kvt__metad_metrics(kvt__metad_t *md, struct MHD_Connection *c,
                                   req_t *rq)
{
    sbuf_t sb = {malloc(4096), 0, 4096, 0};
    struct MHD_Response *r;

    if (sb.buf == NULL)
        return kvt__metad_answer(md, c, rq, 500, "out of memory");
    sb_printf(&sb, "# HELP kvt_metad_requests_total HTTP requests answered, "
                   "by route, method and status code.\n"
                   "# TYPE kvt_metad_requests_total counter\n");
    for (int ro = 0; ro < KVT__ROUTE_COUNT; ro++)
        for (int me = 0; me < KVT__METHOD_COUNT; me++)
            for (unsigned co = 0; co < KVT__METAD_NCODES; co++) {
                uint64_t v = atomic_load_explicit(&md->requests[ro][me][co],
                                                  memory_order_relaxed);
                char code[16];
                if (v == 0)
                    continue;
                if (kvt__metad_codes[co] != 0)
                    snprintf(code, sizeof(code), "%u", kvt__metad_codes[co]);
                else
                    strcpy(code, "other");
                sb_printf(&sb,
                          "kvt_metad_requests_total{route=\"%s\","
                          "method=\"%s\",code=\"%s\"} %llu\n",
                          kvt__http_route_name((kvt__route_t)ro),
                          kvt__http_method_name((kvt__method_t)me), code,
                          (unsigned long long)v);
            }
    sb_printf(&sb,
              "# HELP kvt_metad_keys Keys in the /metadata store (expired "
              "ones until the next sweep, at most 1 s).\n"
              "# TYPE kvt_metad_keys gauge\n"
              "kvt_metad_keys %zu\n"
              "# HELP kvt_metad_store_bytes Bytes charged against the "
              "store's limit: its entries and the bodies being read.\n"
              "# TYPE kvt_metad_store_bytes gauge\n"
              "kvt_metad_store_bytes %zu\n"
              "# HELP kvt_metad_bootstrap_ranks Prefill ranks registered "
              "through /route.\n"
              "# TYPE kvt_metad_bootstrap_ranks gauge\n"
              "kvt_metad_bootstrap_ranks %zu\n"
              "# HELP kvt_metad_expired_total Entries dropped because their "
              "TTL passed.\n"
              "# TYPE kvt_metad_expired_total counter\n"
              "kvt_metad_expired_total{store=\"metadata\"} %llu\n"
              "kvt_metad_expired_total{store=\"bootstrap\"} %llu\n",
              kvt__kvstore_count(md->store), kvt__kvstore_bytes(md->store),
              kvt__boot_table_count(md->boot),
              (unsigned long long)atomic_load(&md->expired_keys),
              (unsigned long long)atomic_load(&md->expired_ranks));
    {
        uint64_t client = 0, server = 0;
        for (int ro = 0; ro < KVT__ROUTE_COUNT; ro++)
            for (int me = 0; me < KVT__METHOD_COUNT; me++)
                for (unsigned co = 0; co < KVT__METAD_NCODES; co++) {
                    uint64_t v = atomic_load_explicit(&md->requests[ro][me][co],
                                                      memory_order_relaxed);
                    if (kvt__metad_codes[co] >= 400 &&
                        kvt__metad_codes[co] < 500)
                        client += v;
                    else if (kvt__metad_codes[co] >= 500 ||
                             kvt__metad_codes[co] == 0)
                        server += v;
                }
        sb_printf(
            &sb,
            "# HELP kvt_metad_errors_total Requests answered with an "
            "error, and requests dropped without an answer.\n"
            "# TYPE kvt_metad_errors_total counter\n"
            "kvt_metad_errors_total{kind=\"client\"} %llu\n"
            "kvt_metad_errors_total{kind=\"server\"} %llu\n"
            "kvt_metad_errors_total{kind=\"aborted\"} %llu\n"
            "# HELP kvt_metad_connections Connections open.\n"
            "# TYPE kvt_metad_connections gauge\n"
            "kvt_metad_connections %zu\n"
            "# HELP kvt_metad_dropped_total Connections the server "
            "dropped: past the header or body deadline, or evicted "
            "at the connection cap.\n"
            "# TYPE kvt_metad_dropped_total counter\n"
            "kvt_metad_dropped_total{reason=\"header_timeout\"} %llu\n"
            "kvt_metad_dropped_total{reason=\"body_timeout\"} %llu\n"
            "kvt_metad_dropped_total{reason=\"evicted\"} %llu\n"
            "# HELP kvt_metad_uptime_seconds Seconds since start.\n"
            "# TYPE kvt_metad_uptime_seconds gauge\n"
            "kvt_metad_uptime_seconds %.3f\n",
            (unsigned long long)client, (unsigned long long)server,
            (unsigned long long)atomic_load(&md->aborted),
            kvt__conns_count(md->conns),
            (unsigned long long)kvt__conns_dropped(md->conns, KVT__DROP_HEADER),
            (unsigned long long)kvt__conns_dropped(md->conns, KVT__DROP_BODY),
            (unsigned long long)kvt__conns_dropped(md->conns,
                                                   KVT__DROP_EVICTED),
            (double)(kvt__metad_now_ms() - md->started_ms) / 1000.0);
    }
    if (sb.oom) {
        free(sb.buf);
        return kvt__metad_answer(md, c, rq, 500, "out of memory");
    }
    r = MHD_create_response_from_buffer(sb.len, sb.buf, MHD_RESPMEM_MUST_FREE);
    if (r == NULL)
        free(sb.buf);
    else if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                     "text/plain; version=0.0.4") != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return kvt__metad_send(md, c, rq, 200, r);
}

#else

/* ISO C wants something in every file. */
typedef int kvt__metad_routes_unused_t;

#endif
