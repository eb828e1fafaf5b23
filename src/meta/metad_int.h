/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_METAD_INT_H
#define KVT_META_METAD_INT_H

/*
 * Inside `kvt metad`: what the server plumbing (metad.c: libmicrohttpd's
 * callbacks, request bodies, connections, the sweeper) and the route
 * handlers (metad_routes.c) share. Only built with libmicrohttpd and
 * json-c.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "meta/bootstrap.h"
#include "meta/http_parse.h"
#include "meta/metad.h"
#include "meta/metad_conn.h"
#include "meta/metad_store.h"

/* Status codes counted in /metrics; the last (0) counts any other. */
#define KVT__METAD_NCODES 13
extern const unsigned kvt__metad_codes[KVT__METAD_NCODES];

struct kvt__metad {
    struct MHD_Daemon *daemon;
    kvt__kvstore_t *store;
    kvt__boot_table_t *boot;
    kvt__conns_t *conns;
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

    _Atomic uint64_t
        requests[KVT__ROUTE_COUNT][KVT__METHOD_COUNT][KVT__METAD_NCODES];
    _Atomic uint64_t expired_keys;
    _Atomic uint64_t expired_ranks;
    _Atomic uint64_t aborted;
};

/* Per-request context, created by uri_logged(), freed by completed()
 * (metad.c). */
typedef struct kvt__metad_req {
    int started;
    int answered;
    int too_long;
    int oversize;
    int nospace; /* the body could not be reserved: 507 */
    size_t held; /* bytes reserved in the store for the body */
    kvt__method_t method;
    kvt__route_t route;
    uint64_t discarded;
    char *body;
    size_t body_len, body_cap;
    size_t target_len;
    char target[];
} kvt__metad_req_t;

/* Monotonic milliseconds. */
uint64_t kvt__metad_now_ms(void);

/*
 * Queue @resp with @code for @rq on @c and count it. Takes ownership of
 * @resp, which may be NULL after a failed allocation: the connection is
 * then closed, the only thing left to do without memory.
 */
enum MHD_Result kvt__metad_send(kvt__metad_t *md, struct MHD_Connection *c,
                                kvt__metad_req_t *rq, unsigned code,
                                struct MHD_Response *resp);

/* A response over the static @text, with Content-Type @ctype (or none);
 * NULL when out of memory. */
struct MHD_Response *kvt__metad_text(const char *text, const char *ctype);

/* Answer a short static text, labelled application/json as SGLang's
 * server does. */
enum MHD_Result kvt__metad_answer(kvt__metad_t *md, struct MHD_Connection *c,
                                  kvt__metad_req_t *rq, unsigned code,
                                  const char *text);

/* Answer the malloc'd JSON @json of @len bytes; takes ownership of it. */
enum MHD_Result kvt__metad_answer_json(kvt__metad_t *md,
                                       struct MHD_Connection *c,
                                       kvt__metad_req_t *rq, unsigned code,
                                       char *json, size_t len);

/* 405 with the methods of @allow. */
enum MHD_Result kvt__metad_not_allowed(kvt__metad_t *md,
                                       struct MHD_Connection *c,
                                       kvt__metad_req_t *rq, const char *allow);

/* The answer text of an error status. */
const char *kvt__metad_code_text(int code);

/* The routes (metad_routes.c), called once the whole request is in and
 * the method is allowed; each answers. */
enum MHD_Result kvt__metad_metadata_get(kvt__metad_t *md,
                                        struct MHD_Connection *c,
                                        kvt__metad_req_t *rq,
                                        const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_metadata_put(kvt__metad_t *md,
                                        struct MHD_Connection *c,
                                        kvt__metad_req_t *rq,
                                        const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_metadata_del(kvt__metad_t *md,
                                        struct MHD_Connection *c,
                                        kvt__metad_req_t *rq,
                                        const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_metadata_keys(kvt__metad_t *md,
                                         struct MHD_Connection *c,
                                         kvt__metad_req_t *rq,
                                         const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_route_put(kvt__metad_t *md, struct MHD_Connection *c,
                                     kvt__metad_req_t *rq,
                                     const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_route_get(kvt__metad_t *md, struct MHD_Connection *c,
                                     kvt__metad_req_t *rq,
                                     const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_route_del(kvt__metad_t *md, struct MHD_Connection *c,
                                     kvt__metad_req_t *rq,
                                     const kvt__http_req_t *hr);
enum MHD_Result kvt__metad_topology(kvt__metad_t *md, struct MHD_Connection *c,
                                    kvt__metad_req_t *rq);
enum MHD_Result kvt__metad_metrics(kvt__metad_t *md, struct MHD_Connection *c,
                                   kvt__metad_req_t *rq);

#endif
