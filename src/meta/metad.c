/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvt metad` on libmicrohttpd. Request parsing lives in http_parse.c and
 * bootstrap_json.c (pure, fuzzed); the route handlers in metad_routes.c;
 * storage in metad_store.c and metad_boot.c; which connections to drop in
 * metad_conn.c. This file is the plumbing: it takes requests and their
 * bodies, refuses what must not be read, dispatches, answers and counts,
 * and tells metad_conn.c where each connection stands (accepted, header
 * in, answered, request done).
 *
 * Request lifecycle. MHD hands us the raw request target in the URI log
 * callback, before any decoding: we copy it into a per-request context,
 * which the access handler receives as *req_cls and the completion
 * callback frees. Requests without a body are answered at the first call
 * of the access handler. PUT bodies are collected up to max_body; an
 * announced Content-Length beyond it is answered with 413 at once, a
 * chunked body that grows beyond it is read and discarded (up to 4 times
 * the limit, then the connection is dropped) and answered with 413. A
 * body is reserved against max_bytes while it is read (507 when it does
 * not fit). Every 4xx and 5xx answer leaves the stores unchanged.
 */
#include "meta/metad.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "meta/meta.h"
#include "util/log.h"

#if defined(KVT_WITH_HTTP_SERVER) && defined(KVT_WITH_JSON)

#include <microhttpd.h>

#include "meta/metad_int.h"
#include "util/sock.h"
#include "util/thread.h"

#define DEFAULT_MAX_BYTES ((size_t)1 << 30)
/* Loopback unless the caller names an address: anyone who reaches the
 * server may rewrite every key and route, so being reachable from the
 * network is a choice the operator makes (docs/metadata.md). */
#define DEFAULT_HOST "127.0.0.1"
/* The sweeper drops connections past their deadline every tick and
 * frees expired entries every SWEEP_INTERVAL_MS. */
#define TICK_MS 100
#define SWEEP_INTERVAL_MS 1000
#define TIMEOUT_MAX_MS 3600000u
#define MAX_CONNS_MAX 1000000u

const unsigned kvt__metad_codes[KVT__METAD_NCODES] = {
    200, 400, 401, 404, 405, 409, 413, 414, 431, 500, 503, 507, 0};

typedef kvt__metad_req_t req_t;

uint64_t kvt__metad_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The connection's entry in md->conns (NULL once it was removed). */
static kvt__conn_t *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

static unsigned code_index(unsigned code)
{
    for (unsigned i = 0; i + 1 < KVT__METAD_NCODES; i++)
        if (kvt__metad_codes[i] == code)
            return i;
    return KVT__METAD_NCODES - 1;
}

/*
 * Queue @resp with @code and count it. Takes ownership of @resp (which
 * may be NULL after a failed allocation: the connection is then closed,
 * the only thing left to do without memory).
 */
enum MHD_Result kvt__metad_send(kvt__metad_t *md, struct MHD_Connection *c,
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
        kvt__conns_stage(md->conns, conn_of(c), KVT__CONN_ANSWER,
                         kvt__metad_now_ms());
        atomic_fetch_add_explicit(
            &md->requests[rq->route][rq->method][code_index(code)], 1,
            memory_order_relaxed);
    }
    return ret;
}

struct MHD_Response *kvt__metad_text(const char *text, const char *ctype)
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
enum MHD_Result kvt__metad_answer(kvt__metad_t *md, struct MHD_Connection *c,
                                  req_t *rq, unsigned code, const char *text)
{
    return kvt__metad_send(md, c, rq, code,
                           kvt__metad_text(text, "application/json"));
}

/* A malloc'd JSON body; takes ownership of @json. */
enum MHD_Result kvt__metad_answer_json(kvt__metad_t *md,
                                       struct MHD_Connection *c, req_t *rq,
                                       unsigned code, char *json, size_t len)
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
    return kvt__metad_send(md, c, rq, code, r);
}

enum MHD_Result kvt__metad_not_allowed(kvt__metad_t *md,
                                       struct MHD_Connection *c, req_t *rq,
                                       const char *allow)
{
    struct MHD_Response *r =
        kvt__metad_text("Method not allowed", "text/plain");

    if (r != NULL &&
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow) != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return kvt__metad_send(md, c, rq, 405, r);
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

static enum MHD_Result count_length(void *cls, enum MHD_ValueKind kind,
                                    const char *key, const char *value)
{
    (void)kind;
    (void)value;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
        (*(unsigned *)cls)++;
    return MHD_YES;
}

/*
 * The first call of the access handler, before any body is read: refuse
 * what must not be read at all (a target too long to have been kept, two
 * Content-Length headers, which a proxy in front may have read otherwise
 * (RFC 9112 section 6.3), a body announced beyond the limit). Answering
 * now makes MHD close the connection afterwards, which is what these
 * requests deserve; every other request is answered at the final call so
 * that keep-alive holds.
 */
static enum MHD_Result first_call(kvt__metad_t *md, struct MHD_Connection *c,
                                  req_t *rq)
{
    kvt__http_req_t hr;
    const char *cl;
    unsigned lengths = 0;
    uint64_t len;
    int too_large;

    MHD_get_connection_values(c, MHD_HEADER_KIND, count_length, &lengths);
    cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    too_large = cl != NULL && kvt__http_parse_length(cl, &len) == 0 &&
                len > md->max_body;
    if (!rq->too_long && !too_large && lengths <= 1) {
        /* An announced body counts against --max-bytes from now on, so
         * that uploads in flight cannot hold more than the store may. */
        if (cl == NULL || kvt__http_parse_length(cl, &len) != 0 || len == 0)
            return MHD_YES;
        if (kvt__kvstore_reserve(md->store, (size_t)len) == KVT_OK) {
            rq->held = (size_t)len;
            return MHD_YES;
        }
        rq->nospace = 1;
    }
    /* For the route label of the answer only. */
    kvt__http_parse_target(rq->target, rq->target_len, &hr);
    rq->route = hr.route;
    if (rq->too_long)
        return kvt__metad_answer(md, c, rq, 414, kvt__metad_code_text(414));
    if (lengths > 1)
        return kvt__metad_answer(md, c, rq, 400,
                                 "more than one Content-Length");
    if (rq->nospace)
        return kvt__metad_answer(md, c, rq, 507, kvt__metad_code_text(507));
    return kvt__metad_answer(md, c, rq, 413, kvt__metad_code_text(413));
}

/*
 * Whether the request may change the stores, decided here alone: 0 to go
 * on, or the status to refuse with. Writes are PUT and DELETE on the two
 * routes that hold state; any peer that reaches the server may make them
 * (it listens on loopback unless told otherwise).
 */
static int write_check(kvt__metad_t *md, struct MHD_Connection *c,
                       const req_t *rq, const kvt__http_req_t *hr)
{
    (void)md;
    (void)c;
    if (hr->route != KVT__ROUTE_METADATA && hr->route != KVT__ROUTE_ROUTE)
        return 405;
    if (rq->method != KVT__METHOD_PUT && rq->method != KVT__METHOD_DELETE)
        return 405;
    return 0;
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
    now = kvt__metad_now_ms();
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

    rq->route = hr.route;
    if (code != 0)
        return kvt__metad_answer(md, c, rq, (unsigned)code,
                                 kvt__metad_code_text(code));
    if (rq->oversize)
        return kvt__metad_answer(md, c, rq, 413, kvt__metad_code_text(413));
    if (rq->nospace)
        return kvt__metad_answer(md, c, rq, 507, kvt__metad_code_text(507));
    if (hr.route == KVT__ROUTE_NONE)
        return kvt__metad_answer(md, c, rq, 404, "Not found");
    if (!read_like && (code = write_check(md, c, rq, &hr)) != 0)
        return code == 405
                   ? kvt__metad_not_allowed(md, c, rq, allowed[hr.route])
                   : kvt__metad_answer(md, c, rq, (unsigned)code,
                                       kvt__metad_code_text(code));
    if (auth_refused(md, c, rq, !read_like))
        return kvt__metad_answer(md, c, rq, 401, "authentication failed");
    if (hr.route == KVT__ROUTE_METADATA && (!hr.has_key || hr.key_len == 0))
        return kvt__metad_answer(md, c, rq, 400, "missing key");
    switch (hr.route) {
    case KVT__ROUTE_METADATA:
        if (rq->method == KVT__METHOD_PUT)
            return kvt__metad_metadata_put(md, c, rq, &hr);
        if (rq->method == KVT__METHOD_DELETE)
            return kvt__metad_metadata_del(md, c, rq, &hr);
        return kvt__metad_metadata_get(md, c, rq, &hr);
    case KVT__ROUTE_KEYS:
        return kvt__metad_metadata_keys(md, c, rq, &hr);
    case KVT__ROUTE_ROUTE:
        if (rq->method == KVT__METHOD_PUT)
            return kvt__metad_route_put(md, c, rq, &hr);
        if (rq->method == KVT__METHOD_DELETE)
            return kvt__metad_route_del(md, c, rq, &hr);
        return kvt__metad_route_get(md, c, rq, &hr);
    case KVT__ROUTE_TOPOLOGY:
        return kvt__metad_topology(md, c, rq);
    case KVT__ROUTE_HEALTH:
        return kvt__metad_answer(md, c, rq, 200, "OK");
    case KVT__ROUTE_METRICS:
        return kvt__metad_metrics(md, c, rq);
    default:
        return kvt__metad_answer(md, c, rq, 404, "Not found");
    }
}

/* Stop keeping the body: it is refused (413 or 507), and its bytes and
 * reservation are given back at once. */
static void drop_body(kvt__metad_t *md, req_t *rq)
{
    free(rq->body);
    rq->body = NULL;
    rq->body_len = rq->body_cap = 0;
    kvt__kvstore_release(md->store, rq->held);
    rq->held = 0;
}

/*
 * Append an upload chunk, or count it as discarded past the limits. The
 * buffer's capacity is reserved in the store before it grows (the
 * announced length at once, see first_call()); a chunked body that cannot
 * be reserved is read, discarded and answered with 507.
 */
static enum MHD_Result take_chunk(kvt__metad_t *md, req_t *rq, const char *data,
                                  size_t n)
{
    if (!rq->oversize && !rq->nospace && rq->body_len + n > md->max_body) {
        rq->oversize = 1;
        drop_body(md, rq);
    }
    if (rq->oversize || rq->nospace) {
        rq->discarded += n;
        /* Bounded work for a client that never stops sending. */
        return rq->discarded > 4 * (uint64_t)md->max_body ? MHD_NO : MHD_YES;
    }
    if (rq->body_len + n > rq->body_cap) {
        size_t nc = rq->body_cap ? rq->body_cap : 1024;
        char *nb;
        if (nc < rq->held)
            nc = rq->held;
        while (nc < rq->body_len + n)
            nc *= 2;
        if (nc > md->max_body)
            nc = md->max_body;
        if (nc > rq->held) {
            if (kvt__kvstore_reserve(md->store, nc - rq->held) != KVT_OK) {
                rq->nospace = 1;
                drop_body(md, rq);
                rq->discarded += n;
                return MHD_YES;
            }
            rq->held = nc;
        }
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
        /* The header is in: the body deadline runs from now. */
        kvt__conns_stage(md->conns, conn_of(c), KVT__CONN_BODY,
                         kvt__metad_now_ms());
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

    (void)toe;
    /* Kept alive, the connection waits for its next header from now. */
    kvt__conns_stage(md->conns, conn_of(c), KVT__CONN_HEADER,
                     kvt__metad_now_ms());
    if (rq == NULL)
        return;
    if (!rq->answered)
        atomic_fetch_add_explicit(&md->aborted, 1, memory_order_relaxed);
    kvt__kvstore_release(md->store, rq->held);
    free(rq->body);
    free(rq);
    *req_cls = NULL;
}

/*
 * MHD's connection callback: every accepted connection enters md->conns
 * (which may evict another), and leaves it when MHD closes it. MHD calls
 * this with CLOSED before it closes the descriptor, so the sweeper, which
 * drops connections under the table's lock, never touches a closed or
 * reused descriptor.
 */
static void on_connection(void *cls, struct MHD_Connection *c, void **sock_ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    kvt__metad_t *md = cls;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci == NULL)
            return;
        *sock_ctx =
            kvt__conns_add(md->conns, ci->connect_fd, kvt__metad_now_ms());
        if (*sock_ctx == NULL) /* out of memory: not kept either */
            shutdown(ci->connect_fd, SHUT_RDWR);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        kvt__conns_remove(md->conns, *sock_ctx);
        *sock_ctx = NULL;
    }
}

/* Drop a connection from another thread: its thread sees the end of the
 * stream (or a failed send) and closes it, which ends its request. */
static void drop_fd(void *arg, int fd)
{
    (void)arg;
    shutdown(fd, SHUT_RDWR);
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
    uint64_t last_purge = kvt__metad_now_ms();
    struct timespec ts;

    kvt__thread_name("kvt-metad-sweep");
    pthread_mutex_lock(&md->sweep_lock);
    while (!md->sweep_stop) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&md->sweep_cond, &md->sweep_lock, &ts);
        if (md->sweep_stop)
            break;
        pthread_mutex_unlock(&md->sweep_lock);
        kvt__conns_sweep(md->conns, kvt__metad_now_ms());
        if (kvt__metad_now_ms() - last_purge >= SWEEP_INTERVAL_MS) {
            last_purge = kvt__metad_now_ms();
            atomic_fetch_add(&md->expired_keys,
                             kvt__kvstore_purge(md->store, last_purge));
            atomic_fetch_add(&md->expired_ranks,
                             kvt__boot_table_purge(md->boot, last_purge));
        }
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
    unsigned max_conns;
    uint32_t header_ms, body_ms;
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
    max_conns = (m & KVT__METAD_PARAM_MAX_CONNS) ? params->max_conns
                                                 : KVT__METAD_MAX_CONNS;
    header_ms = (m & KVT__METAD_PARAM_HEADER_TIMEOUT)
                    ? params->header_timeout_ms
                    : KVT__METAD_HEADER_MS;
    body_ms = (m & KVT__METAD_PARAM_BODY_TIMEOUT) ? params->body_timeout_ms
                                                  : KVT__METAD_BODY_MS;
    if (md->threads < 1 || md->threads > 64 ||
        md->max_body > KVT_META_VALUE_MAX) {
        KVT_LOG_E("metad: threads must be 1..64 and max_body at most %u",
                  KVT_META_VALUE_MAX);
        goto err_md;
    }
    if (max_conns < 1 || max_conns > MAX_CONNS_MAX || header_ms < 1 ||
        header_ms > TIMEOUT_MAX_MS || body_ms < 1 || body_ms > TIMEOUT_MAX_MS) {
        KVT_LOG_E("metad: max_conns must be 1..%u and the timeouts 1..%u ms",
                  MAX_CONNS_MAX, TIMEOUT_MAX_MS);
        goto err_md;
    }
    md->started_ms = kvt__metad_now_ms();
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
    st = kvt__conns_create(max_conns, header_ms, body_ms, drop_fd, md,
                           &md->conns);
    if (st != KVT_OK)
        goto err_boot;
    if (host == NULL || *host == '\0')
        host = DEFAULT_HOST;
    st = kvt__sock_listen(host, port, &fd, &md->port);
    if (st != KVT_OK)
        goto err_conns;
    st = sweeper_start(md);
    if (st != KVT_OK)
        goto err_fd;
    /* MHD's own limit (shared among its threads) stays above ours, so
     * that a new connection always reaches on_connection(), which evicts;
     * MHD's inactivity timeout bounds answers left unread. */
    md->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, md, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, md->threads > 1 ? md->threads : 0,
        MHD_OPTION_CONNECTION_LIMIT, max_conns * md->threads + 64,
        MHD_OPTION_CONNECTION_TIMEOUT, (body_ms + 999) / 1000,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, md,
        MHD_OPTION_URI_LOG_CALLBACK, uri_logged, md,
        MHD_OPTION_NOTIFY_COMPLETED, completed, md, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, md, MHD_OPTION_END);
    if (md->daemon == NULL) {
        KVT_LOG_E("metad: libmicrohttpd did not start on port %u", md->port);
        st = KVT_ERR_IO;
        goto err_sweeper;
    }
    KVT_LOG_I("metad: listening on %s:%u with %u threads", host, md->port,
              md->threads);
    *h_p = md;
    return KVT_OK;

err_sweeper:
    sweeper_stop(md);
err_fd:
    close(fd);
err_conns:
    kvt__conns_destroy(md->conns);
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
    kvt__conns_destroy(h->conns);
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
