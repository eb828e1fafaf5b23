/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvt metad` on libmicrohttpd. Request parsing lives in http_parse.c and
 * bootstrap_json.c (pure, fuzzed); storage in metad_store.c and
 * metad_boot.c; this file only routes, answers and counts.
 *
 * Request lifecycle. MHD hands us the raw request target in the URI log
 * callback, before any decoding: we copy it into a per-request context,
 * which the access handler receives as *req_cls and the completion
 * callback frees. Requests without a body are answered at the first call
 * of the access handler. PUT bodies are collected up to max_body; an
 * announced Content-Length beyond it is answered with 413 at once, a
 * chunked body that grows beyond it is read and discarded (up to 4 times
 * the limit, then the connection is dropped) and answered with 413. Every
 * 4xx answer leaves the stores unchanged.
 */
#include "meta/metad.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "meta/meta.h"
#include "util/log.h"

#if defined(KVT_WITH_HTTP_SERVER) && defined(KVT_WITH_JSON)

#include <microhttpd.h>

#include <json-c/json.h>

#include "meta/bootstrap.h"
#include "meta/http_parse.h"
#include "meta/metad_store.h"
#include "util/sock.h"

#define DEFAULT_MAX_BYTES ((size_t)1 << 30)
#define SWEEP_INTERVAL_MS 1000

/* Status codes counted in /metrics; anything else counts as "other". */
static const unsigned codes[] = {200, 400, 401, 404, 405, 409, 413,
                                 414, 431, 500, 503, 507, 0};
#define NCODES (sizeof(codes) / sizeof(codes[0]))

struct kvt__metad {
    struct MHD_Daemon *daemon;
    kvt__kvstore_t *store;
    kvt__boot_table_t *boot;
    unsigned threads;
    size_t max_body;
    uint16_t port;
    uint64_t started_ms;
    kvt__auth_t auth; /* on: writes (and reads with auth_reads) need proof */
    int auth_reads;
    _Atomic uint64_t auth_warned_ms;

    pthread_t sweeper;
    pthread_mutex_t sweep_lock;
    pthread_cond_t sweep_cond;
    int sweep_stop; /* under sweep_lock */

    _Atomic uint64_t requests[KVT__ROUTE_COUNT][KVT__METHOD_COUNT][NCODES];
    _Atomic uint64_t expired_keys;
    _Atomic uint64_t expired_ranks;
    _Atomic uint64_t aborted;
};

/* Per-request context, created by uri_logged(), freed by completed(). */
typedef struct {
    int started;
    int answered;
    int too_long;
    int oversize;
    kvt__method_t method;
    kvt__route_t route;
    uint64_t discarded;
    char *body;
    size_t body_len, body_cap;
    size_t target_len;
    char target[];
} req_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static unsigned code_index(unsigned code)
{
    for (unsigned i = 0; i + 1 < NCODES; i++)
        if (codes[i] == code)
            return i;
    return NCODES - 1;
}

/*
 * Queue @resp with @code and count it. Takes ownership of @resp (which
 * may be NULL after a failed allocation: the connection is then closed,
 * the only thing left to do without memory).
 */
static enum MHD_Result send_resp(kvt__metad_t *md, struct MHD_Connection *c,
                                 req_t *rq, unsigned code,
                                 struct MHD_Response *resp)
{
    enum MHD_Result ret = MHD_NO;

    if (resp != NULL) {
        ret = MHD_queue_response(c, code, resp);
        MHD_destroy_response(resp);
    }
    if (ret == MHD_YES) {
        rq->answered = 1;
        atomic_fetch_add_explicit(
            &md->requests[rq->route][rq->method][code_index(code)], 1,
            memory_order_relaxed);
    }
    return ret;
}

static struct MHD_Response *text_resp(const char *text, const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_PERSISTENT);

    if (r != NULL && ctype != NULL &&
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype) !=
            MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return r;
}

/* A short static answer; SGLang's server labels them application/json. */
static enum MHD_Result answer(kvt__metad_t *md, struct MHD_Connection *c,
                              req_t *rq, unsigned code, const char *text)
{
    return send_resp(md, c, rq, code, text_resp(text, "application/json"));
}

/* A malloc'd JSON body; takes ownership of @json. */
static enum MHD_Result answer_json(kvt__metad_t *md, struct MHD_Connection *c,
                                   req_t *rq, unsigned code, char *json,
                                   size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, json, MHD_RESPMEM_MUST_FREE);

    if (r == NULL) {
        free(json);
    } else if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                       "application/json") != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return send_resp(md, c, rq, code, r);
}

static enum MHD_Result not_allowed(kvt__metad_t *md, struct MHD_Connection *c,
                                   req_t *rq, const char *allow)
{
    struct MHD_Response *r = text_resp("Method not allowed", "text/plain");

    if (r != NULL &&
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow) != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return send_resp(md, c, rq, 405, r);
}

static const char *code_text(int code)
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
static enum MHD_Result metadata_get(kvt__metad_t *md, struct MHD_Connection *c,
                                    req_t *rq, const kvt__http_req_t *hr)
{
    struct get_ctx g = {NULL};

    if (kvt__kvstore_get(md->store, hr->key, hr->key_len, now_ms(), copy_value,
                         &g) != KVT_OK)
        return answer(md, c, rq, 404, "metadata not found");
    if (g.resp != NULL &&
        MHD_add_response_header(g.resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "application/json") != MHD_YES) {
        MHD_destroy_response(g.resp);
        g.resp = NULL;
    }
    return send_resp(md, c, rq, 200, g.resp);
}

/*
 * PUT /metadata: store the body under the key, with the deadline of
 * ?ttl= when given, and acknowledge the TTL with X-Kvt-Ttl so that kvt
 * clients know it is enforced. 507 when the byte limit would be passed.
 */
static enum MHD_Result metadata_put(kvt__metad_t *md, struct MHD_Connection *c,
                                    req_t *rq, const kvt__http_req_t *hr)
{
    uint64_t now = now_ms(), expires = 0;
    struct MHD_Response *r;
    char ttl[16];
    kvt_status_t st;

    if (hr->has_ttl && hr->ttl_s > 0)
        expires = now + (uint64_t)hr->ttl_s * 1000u;
    st = kvt__kvstore_put(md->store, hr->key, hr->key_len,
                          rq->body ? rq->body : "", rq->body_len, expires, now);
    if (st == KVT_ERR_NO_SPACE)
        return answer(md, c, rq, 507, "metadata store full");
    if (st != KVT_OK)
        return answer(md, c, rq, 500, "out of memory");
    r = text_resp("metadata updated", "application/json");
    /* Tells kvt clients that this server enforces the TTL. */
    snprintf(ttl, sizeof(ttl), "%u", hr->has_ttl ? hr->ttl_s : 0);
    if (r != NULL && hr->has_ttl &&
        MHD_add_response_header(r, "X-Kvt-Ttl", ttl) != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return send_resp(md, c, rq, 200, r);
}

/* DELETE /metadata: 200 when a live entry was removed, 404 otherwise. */
static enum MHD_Result metadata_del(kvt__metad_t *md, struct MHD_Connection *c,
                                    req_t *rq, const kvt__http_req_t *hr)
{
    if (kvt__kvstore_del(md->store, hr->key, hr->key_len, now_ms()) != KVT_OK)
        return answer(md, c, rq, 404, "metadata not found");
    return answer(md, c, rq, 200, "metadata deleted");
}

/* GET /metadata/keys: the live keys under ?prefix=, as a JSON array. */
static enum MHD_Result metadata_keys(kvt__metad_t *md, struct MHD_Connection *c,
                                     req_t *rq, const kvt__http_req_t *hr)
{
    json_object *a;
    char **keys;
    size_t n, len;
    const char *s;
    char *out = NULL;
    kvt_status_t st;

    st = kvt__kvstore_keys(md->store, hr->has_prefix ? hr->prefix : "",
                           hr->prefix_len, now_ms(), KVT_META_LIST_MAX, &keys,
                           &n);
    if (st == KVT_ERR_OVERFLOW)
        return answer(md, c, rq, 400,
                      "more than 65536 keys match; use a longer prefix");
    if (st != KVT_OK)
        return answer(md, c, rq, 500, "out of memory");
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
        return answer(md, c, rq, 500, "out of memory");
    return answer_json(md, c, rq, 200, out, len);
}

/* ---- /route, /topology --------------------------------------------------- */

/*
 * PUT /route: validate the registration (400 with the reason), keep
 * prefill ranks (409 on conflicting sizes), acknowledge the others.
 */
static enum MHD_Result route_put(kvt__metad_t *md, struct MHD_Connection *c,
                                 req_t *rq, const kvt__http_req_t *hr)
{
    kvt__boot_rank_t r;
    const char *why = NULL;
    uint64_t now = now_ms(), expires = 0;
    int code;

    if (kvt__boot_parse(rq->body, rq->body_len, &r, &why) != KVT_OK) {
        KVT_LOG_D("metad: PUT /route refused: %s", why);
        return answer(md, c, rq, 400, why);
    }
    /* SGLang's server records prefill ranks only and acknowledges the
     * rest. */
    if (strcmp(r.role, "Prefill") != 0)
        return answer(md, c, rq, 200, "OK");
    if (hr->has_ttl && hr->ttl_s > 0)
        expires = now + (uint64_t)hr->ttl_s * 1000u;
    code = kvt__boot_table_put(md->boot, &r, expires, now);
    if (code == 409)
        return answer(md, c, rq, 409,
                      "tp_size/dp_size differ from the registered ranks");
    return answer(md, c, rq, (unsigned)code,
                  code == 200 ? "OK" : code_text(code));
}

/* GET /route: one rank, or the sizes for engine_rank=-1 and
 * target_dp_group=-1, as SGLang's decode side asks. */
static enum MHD_Result route_get(kvt__metad_t *md, struct MHD_Connection *c,
                                 req_t *rq, const kvt__http_req_t *hr)
{
    char *json = NULL;
    size_t len = 0;
    int code;

    if (!hr->has_engine_rank || !hr->has_dp_group)
        return answer(md, c, rq, 400, "Missing inputs for bootstrap server.");
    code = kvt__boot_table_get(md->boot, hr->engine_rank, hr->dp_group,
                               now_ms(), &json, &len);
    if (code != 200)
        return answer(md, c, rq, (unsigned)code,
                      code == 404 ? "Bootstrap info not Found"
                                  : code_text(code));
    return answer_json(md, c, rq, 200, json, len);
}

static enum MHD_Result route_del(kvt__metad_t *md, struct MHD_Connection *c,
                                 req_t *rq, const kvt__http_req_t *hr)
{
    int code;

    if (!hr->has_engine_rank || !hr->has_dp_group)
        return answer(md, c, rq, 400, "Missing inputs for bootstrap server.");
    code =
        kvt__boot_table_del(md->boot, hr->engine_rank, hr->dp_group, now_ms());
    return answer(md, c, rq, (unsigned)code,
                  code == 200   ? "OK"
                  : code == 404 ? "Bootstrap info not Found"
                                : code_text(code));
}

static enum MHD_Result topology(kvt__metad_t *md, struct MHD_Connection *c,
                                req_t *rq)
{
    char *json = NULL;
    size_t len = 0;
    int code = kvt__boot_table_topology(md->boot, now_ms(), &json, &len);

    if (code != 200)
        return answer(md, c, rq, (unsigned)code, code_text(code));
    return answer_json(md, c, rq, 200, json, len);
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
static enum MHD_Result metrics(kvt__metad_t *md, struct MHD_Connection *c,
                               req_t *rq)
{
    sbuf_t sb = {malloc(4096), 0, 4096, 0};
    struct MHD_Response *r;

    if (sb.buf == NULL)
        return answer(md, c, rq, 500, "out of memory");
    sb_printf(&sb, "# HELP kvt_metad_requests_total HTTP requests answered, "
                   "by route, method and status code.\n"
                   "# TYPE kvt_metad_requests_total counter\n");
    for (int ro = 0; ro < KVT__ROUTE_COUNT; ro++)
        for (int me = 0; me < KVT__METHOD_COUNT; me++)
            for (unsigned co = 0; co < NCODES; co++) {
                uint64_t v = atomic_load_explicit(&md->requests[ro][me][co],
                                                  memory_order_relaxed);
                char code[16];
                if (v == 0)
                    continue;
                if (codes[co] != 0)
                    snprintf(code, sizeof(code), "%u", codes[co]);
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
              "# HELP kvt_metad_store_bytes Bytes charged to the /metadata "
              "store.\n"
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
                for (unsigned co = 0; co < NCODES; co++) {
                    uint64_t v = atomic_load_explicit(&md->requests[ro][me][co],
                                                      memory_order_relaxed);
                    if (codes[co] >= 400 && codes[co] < 500)
                        client += v;
                    else if (codes[co] >= 500 || codes[co] == 0)
                        server += v;
                }
        sb_printf(&sb,
                  "# HELP kvt_metad_errors_total Requests answered with an "
                  "error, and requests dropped without an answer.\n"
                  "# TYPE kvt_metad_errors_total counter\n"
                  "kvt_metad_errors_total{kind=\"client\"} %llu\n"
                  "kvt_metad_errors_total{kind=\"server\"} %llu\n"
                  "kvt_metad_errors_total{kind=\"aborted\"} %llu\n"
                  "# HELP kvt_metad_uptime_seconds Seconds since start.\n"
                  "# TYPE kvt_metad_uptime_seconds gauge\n"
                  "kvt_metad_uptime_seconds %.3f\n",
                  (unsigned long long)client, (unsigned long long)server,
                  (unsigned long long)atomic_load(&md->aborted),
                  (double)(now_ms() - md->started_ms) / 1000.0);
    }
    if (sb.oom) {
        free(sb.buf);
        return answer(md, c, rq, 500, "out of memory");
    }
    r = MHD_create_response_from_buffer(sb.len, sb.buf, MHD_RESPMEM_MUST_FREE);
    if (r == NULL)
        free(sb.buf);
    else if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                     "text/plain; version=0.0.4") != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return send_resp(md, c, rq, 200, r);
}

/* ---- Dispatch ------------------------------------------------------------ */

static const char *const allowed[KVT__ROUTE_COUNT] = {
    [KVT__ROUTE_METADATA] = "GET, HEAD, PUT, DELETE",
    [KVT__ROUTE_KEYS] = "GET, HEAD",
    [KVT__ROUTE_ROUTE] = "GET, HEAD, PUT, DELETE",
    [KVT__ROUTE_TOPOLOGY] = "GET, HEAD",
    [KVT__ROUTE_HEALTH] = "GET, HEAD",
    [KVT__ROUTE_METRICS] = "GET, HEAD",
};

/*
 * The first call of the access handler, before any body is read: refuse
 * what must not be read at all (a target too long to have been kept, a
 * body announced beyond the limit). Answering now makes MHD close the
 * connection afterwards, which is what these requests deserve; every other
 * request is answered at the final call so that keep-alive holds.
 */
static enum MHD_Result first_call(kvt__metad_t *md, struct MHD_Connection *c,
                                  req_t *rq)
{
    kvt__http_req_t hr;
    const char *cl;
    uint64_t len;
    int too_large;

    cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    too_large = cl != NULL && kvt__http_parse_length(cl, &len) == 0 &&
                len > md->max_body;
    if (!rq->too_long && !too_large)
        return MHD_YES;
    /* For the route label of the answer only. */
    kvt__http_parse_target(rq->target, rq->target_len, &hr);
    rq->route = hr.route;
    if (rq->too_long)
        return answer(md, c, rq, 414, code_text(414));
    return answer(md, c, rq, 413, code_text(413));
}

/*
 * The token's proof (docs/security.md): with a token, a write (and a read
 * with auth_reads) must carry an Authorization header whose MAC covers
 * its method, target, time and body. 1 when the request is refused; the
 * reason is logged, at most once a second.
 */
static int auth_refused(kvt__metad_t *md, struct MHD_Connection *c,
                        const req_t *rq, int writes)
{
    const char *why = NULL;
    uint64_t now, last;

    if (!md->auth.on || (!writes && !md->auth_reads))
        return 0;
    if (kvt__auth_http_verify(
            &md->auth,
            MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                        MHD_HTTP_HEADER_AUTHORIZATION),
            kvt__http_method_name(rq->method), rq->target, rq->target_len,
            rq->body, rq->body_len, time(NULL), &why))
        return 0;
    now = now_ms();
    last = atomic_load_explicit(&md->auth_warned_ms, memory_order_relaxed);
    if (now - last >= 1000 &&
        atomic_compare_exchange_strong(&md->auth_warned_ms, &last, now))
        KVT_LOG_W("metad: authentication failed: %s %s refused: %s",
                  kvt__http_method_name(rq->method),
                  kvt__http_route_name(rq->route), why);
    return 1;
}

/* The final call: the whole request is in. */
static enum MHD_Result final_call(kvt__metad_t *md, struct MHD_Connection *c,
                                  req_t *rq)
{
    kvt__http_req_t hr;
    int code = kvt__http_parse_target(rq->target, rq->target_len, &hr);
    int read_like =
        rq->method == KVT__METHOD_GET || rq->method == KVT__METHOD_HEAD;
    int writes =
        rq->method == KVT__METHOD_PUT || rq->method == KVT__METHOD_DELETE;

    rq->route = hr.route;
    if (code != 0)
        return answer(md, c, rq, (unsigned)code, code_text(code));
    if (rq->oversize)
        return answer(md, c, rq, 413, code_text(413));
    if (hr.route == KVT__ROUTE_NONE)
        return answer(md, c, rq, 404, "Not found");
    if (!read_like && !(writes && (hr.route == KVT__ROUTE_METADATA ||
                                   hr.route == KVT__ROUTE_ROUTE)))
        return not_allowed(md, c, rq, allowed[hr.route]);
    if (auth_refused(md, c, rq, writes))
        return answer(md, c, rq, 401, "authentication failed");
    if (hr.route == KVT__ROUTE_METADATA && (!hr.has_key || hr.key_len == 0))
        return answer(md, c, rq, 400, "missing key");
    switch (hr.route) {
    case KVT__ROUTE_METADATA:
        if (rq->method == KVT__METHOD_PUT)
            return metadata_put(md, c, rq, &hr);
        if (rq->method == KVT__METHOD_DELETE)
            return metadata_del(md, c, rq, &hr);
        return metadata_get(md, c, rq, &hr);
    case KVT__ROUTE_KEYS:
        return metadata_keys(md, c, rq, &hr);
    case KVT__ROUTE_ROUTE:
        if (rq->method == KVT__METHOD_PUT)
            return route_put(md, c, rq, &hr);
        if (rq->method == KVT__METHOD_DELETE)
            return route_del(md, c, rq, &hr);
        return route_get(md, c, rq, &hr);
    case KVT__ROUTE_TOPOLOGY:
        return topology(md, c, rq);
    case KVT__ROUTE_HEALTH:
        return answer(md, c, rq, 200, "OK");
    case KVT__ROUTE_METRICS:
        return metrics(md, c, rq);
    default:
        return answer(md, c, rq, 404, "Not found");
    }
}

/* Append an upload chunk, or count it as discarded past the limit. */
static enum MHD_Result take_chunk(kvt__metad_t *md, req_t *rq, const char *data,
                                  size_t n)
{
    if (!rq->oversize && rq->body_len + n > md->max_body) {
        rq->oversize = 1;
        free(rq->body);
        rq->body = NULL;
        rq->body_len = rq->body_cap = 0;
    }
    if (rq->oversize) {
        rq->discarded += n;
        /* Bounded work for a client that never stops sending. */
        return rq->discarded > 4 * (uint64_t)md->max_body ? MHD_NO : MHD_YES;
    }
    if (rq->body_len + n > rq->body_cap) {
        size_t nc = rq->body_cap ? rq->body_cap : 1024;
        char *nb;
        while (nc < rq->body_len + n)
            nc *= 2;
        if (nc > md->max_body)
            nc = md->max_body;
        nb = realloc(rq->body, nc);
        if (nb == NULL)
            return MHD_NO;
        rq->body = nb;
        rq->body_cap = nc;
    }
    memcpy(rq->body + rq->body_len, data, n);
    rq->body_len += n;
    return MHD_YES;
}

/*
 * MHD's access handler, called at least twice per request: once when the
 * headers are in (first_call), once per body chunk, and once when the
 * request is complete (final_call), which answers.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls)
{
    kvt__metad_t *md = cls;
    req_t *rq = *req_cls;

    (void)url;
    (void)version;
    if (rq == NULL) /* no URI callback ran: cannot happen with MHD 0.9 */
        return MHD_NO;
    if (!rq->started) {
        rq->started = 1;
        rq->method = kvt__http_method(method);
        return first_call(md, c, rq);
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        return take_chunk(md, rq, upload, n);
    }
    return final_call(md, c, rq);
}

/* MHD's URI callback: the raw target, before MHD decodes anything, into
 * a new request context (NULL when out of memory: MHD then closes). */
static void *uri_logged(void *cls, const char *uri, struct MHD_Connection *c)
{
    size_t n = strlen(uri);
    int too_long = n > KVT_HTTP_TARGET_MAX;
    req_t *rq;

    (void)cls;
    (void)c;
    /* Too long to keep: keep the path alone (when short) so that the 414
     * is counted under its route. */
    if (too_long) {
        n = strcspn(uri, "?#");
        if (n > 256)
            n = 0;
    }
    rq = calloc(1, sizeof(*rq) + n + 1);
    if (rq == NULL)
        return NULL;
    rq->too_long = too_long;
    rq->target_len = n;
    memcpy(rq->target, uri, n);
    return rq;
}

/* MHD's completion callback: counts requests that got no answer and frees
 * the context. Called for every request that had one. */
static void completed(void *cls, struct MHD_Connection *c, void **req_cls,
                      enum MHD_RequestTerminationCode toe)
{
    kvt__metad_t *md = cls;
    req_t *rq = *req_cls;

    (void)c;
    (void)toe;
    if (rq == NULL)
        return;
    if (!rq->answered)
        atomic_fetch_add_explicit(&md->aborted, 1, memory_order_relaxed);
    free(rq->body);
    free(rq);
    *req_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];

    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    KVT_LOG_D("metad: libmicrohttpd: %s", msg);
}

/* ---- Sweeper ------------------------------------------------------------- */

/* Every SWEEP_INTERVAL_MS, free expired entries of both stores, so that
 * memory and the gauges follow the TTLs; lookups never need it. */
static void *sweeper_main(void *arg)
{
    kvt__metad_t *md = arg;
    struct timespec ts;

    pthread_mutex_lock(&md->sweep_lock);
    while (!md->sweep_stop) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += SWEEP_INTERVAL_MS / 1000;
        pthread_cond_timedwait(&md->sweep_cond, &md->sweep_lock, &ts);
        if (md->sweep_stop)
            break;
        pthread_mutex_unlock(&md->sweep_lock);
        atomic_fetch_add(&md->expired_keys,
                         kvt__kvstore_purge(md->store, now_ms()));
        atomic_fetch_add(&md->expired_ranks,
                         kvt__boot_table_purge(md->boot, now_ms()));
        pthread_mutex_lock(&md->sweep_lock);
    }
    pthread_mutex_unlock(&md->sweep_lock);
    return NULL;
}

static kvt_status_t sweeper_start(kvt__metad_t *md)
{
    pthread_condattr_t ca;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (pthread_condattr_init(&ca) != 0)
        goto err;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&md->sweep_cond, &ca) != 0)
        goto err_attr;
    if (pthread_mutex_init(&md->sweep_lock, NULL) != 0)
        goto err_cond;
    if (pthread_create(&md->sweeper, NULL, sweeper_main, md) != 0) {
        KVT_LOG_E("metad: cannot start the sweeper thread");
        goto err_mutex;
    }
    pthread_condattr_destroy(&ca);
    return KVT_OK;

err_mutex:
    pthread_mutex_destroy(&md->sweep_lock);
err_cond:
    pthread_cond_destroy(&md->sweep_cond);
err_attr:
    pthread_condattr_destroy(&ca);
err:
    return st;
}

static void sweeper_stop(kvt__metad_t *md)
{
    pthread_mutex_lock(&md->sweep_lock);
    md->sweep_stop = 1;
    pthread_cond_signal(&md->sweep_cond);
    pthread_mutex_unlock(&md->sweep_lock);
    pthread_join(md->sweeper, NULL);
    pthread_cond_destroy(&md->sweep_cond);
    pthread_mutex_destroy(&md->sweep_lock);
}

/* ---- Start and stop ------------------------------------------------------ */

kvt_status_t kvt__metad_start(const char *host, uint16_t port,
                              const kvt__metad_params_t *params,
                              kvt__metad_t **h_p)
{
    kvt__metad_t *md;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_USE_TURBO | MHD_USE_ERROR_LOG;
    uint64_t m = params ? params->field_mask : 0;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;
    int fd = -1;

    kvt__log_init();
    md = calloc(1, sizeof(*md));
    if (md == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err;
    }
    md->threads = (m & KVT__METAD_PARAM_THREADS) ? params->threads : 2;
    md->max_body =
        (m & KVT__METAD_PARAM_MAX_BODY) ? params->max_body : KVT_META_VALUE_MAX;
    if (md->threads < 1 || md->threads > 64 ||
        md->max_body > KVT_META_VALUE_MAX) {
        KVT_LOG_E("metad: threads must be 1..64 and max_body at most %u",
                  KVT_META_VALUE_MAX);
        goto err_md;
    }
    md->started_ms = now_ms();
    if (m & KVT__METAD_PARAM_AUTH) {
        md->auth = params->auth;
        md->auth_reads = params->auth_reads;
    }
    st = kvt__kvstore_create((m & KVT__METAD_PARAM_MAX_BYTES)
                                 ? params->max_bytes
                                 : DEFAULT_MAX_BYTES,
                             &md->store);
    if (st != KVT_OK)
        goto err_md;
    st = kvt__boot_table_create(&md->boot);
    if (st != KVT_OK)
        goto err_store;
    st = kvt__sock_listen(host && *host ? host : "0.0.0.0", port, &fd,
                          &md->port);
    if (st != KVT_OK)
        goto err_boot;
    st = sweeper_start(md);
    if (st != KVT_OK)
        goto err_fd;
    md->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, md, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, md->threads > 1 ? md->threads : 0,
        MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_URI_LOG_CALLBACK,
        uri_logged, md, MHD_OPTION_NOTIFY_COMPLETED, completed, md,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, md, MHD_OPTION_END);
    if (md->daemon == NULL) {
        KVT_LOG_E("metad: libmicrohttpd did not start on port %u", md->port);
        st = KVT_ERR_IO;
        goto err_sweeper;
    }
    KVT_LOG_I("metad: listening on %s:%u with %u threads",
              host && *host ? host : "0.0.0.0", md->port, md->threads);
    *h_p = md;
    return KVT_OK;

err_sweeper:
    sweeper_stop(md);
err_fd:
    close(fd);
err_boot:
    kvt__boot_table_destroy(md->boot);
err_store:
    kvt__kvstore_destroy(md->store);
err_md:
    free(md);
err:
    return st;
}

uint16_t kvt__metad_port(const kvt__metad_t *h)
{
    return h->port;
}

void kvt__metad_stop(kvt__metad_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon); /* closes the listening socket too */
    sweeper_stop(h);
    kvt__boot_table_destroy(h->boot);
    kvt__kvstore_destroy(h->store);
    free(h);
}

#else /* no libmicrohttpd or no json-c */

kvt_status_t kvt__metad_start(const char *host, uint16_t port,
                              const kvt__metad_params_t *params,
                              kvt__metad_t **h_p)
{
    (void)host;
    (void)port;
    (void)params;
    (void)h_p;
    KVT_LOG_E("metad needs libmicrohttpd and json-c, which this build lacks "
              "(KVT_WITH_HTTP_SERVER or KVT_WITH_JSON is OFF)");
    return KVT_ERR_NOT_SUPPORTED;
}

uint16_t kvt__metad_port(const kvt__metad_t *h)
{
    (void)h;
    return 0;
}

void kvt__metad_stop(kvt__metad_t *h)
{
    (void)h;
}

#endif
