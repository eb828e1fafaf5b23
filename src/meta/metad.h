/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_METAD_H
#define KVT_META_METAD_H

/*
 * `kvt metad`: the metadata and PD bootstrap HTTP server, embeddable in
 * any process (an engine, a test) or run by the kvt command. Routes
 * (docs/metadata.md):
 *
 *   GET|PUT|DELETE /metadata?key=K[&ttl=S]   Mooncake's metadata store
 *   GET /metadata/keys?prefix=P              keys under a prefix (kvt)
 *   PUT /route, GET /route?engine_rank=R&target_dp_group=G,
 *   DELETE /route?engine_rank=R&target_dp_group=G   SGLang's bootstrap
 *   GET /topology                            every prefill rank (kvt)
 *   GET /health, GET /metrics                liveness, Prometheus text
 *
 * The server runs on libmicrohttpd's internal epoll threads (a pool of
 * `threads`, default 2) plus one sweeper thread that drops expired
 * entries every second and connections past their deadline (metad_conn.h)
 * every 100 ms.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

#include "util/auth.h"

typedef struct kvt__metad kvt__metad_t;

enum {
    KVT__METAD_PARAM_THREADS = 1u << 0,
    KVT__METAD_PARAM_MAX_BODY = 1u << 1,
    KVT__METAD_PARAM_MAX_BYTES = 1u << 2,
    KVT__METAD_PARAM_MAX_CONNS = 1u << 3,
    KVT__METAD_PARAM_HEADER_TIMEOUT = 1u << 4,
    KVT__METAD_PARAM_BODY_TIMEOUT = 1u << 5,
    KVT__METAD_PARAM_AUTH = 1u << 6,
};

/* Defaults of the connection limits (docs/metadata.md). */
#define KVT__METAD_MAX_CONNS 1000u
#define KVT__METAD_HEADER_MS 5000u
#define KVT__METAD_BODY_MS 30000u

typedef struct {
    uint64_t field_mask;
    /* Server threads, 1..64. Default 2. */
    unsigned threads;
    /* Largest request body (PUT /metadata, PUT /route); larger ones get
     * 413. Default and maximum KVT_META_VALUE_MAX (16 MiB). */
    size_t max_body;
    /* Bytes of keys and values the store may hold, bodies being read
     * included; a PUT beyond gets 507. Default 1 GiB. */
    size_t max_bytes;
    /* Connections kept at most, 1..1000000; one more evicts the one idle
     * the longest. Default KVT__METAD_MAX_CONNS. */
    unsigned max_conns;
    /* Milliseconds a connection may take to send a whole request header,
     * from its accept or its previous answer; then it is dropped.
     * 1..3600000, default KVT__METAD_HEADER_MS. */
    uint32_t header_timeout_ms;
    /* Milliseconds a request may take to send its whole body after its
     * header, and the longest a client may leave an answer unread.
     * 1..3600000, default KVT__METAD_BODY_MS. */
    uint32_t body_timeout_ms;
    /* With a key: writes need its proof, and reads too when auth_reads
     * (docs/security.md). Default: none, everything open. */
    kvt__auth_t auth;
    int auth_reads;
} kvt__metad_params_t;

/*
 * Start a server listening on @host (NULL or "": 127.0.0.1 only; "0.0.0.0"
 * for every IPv4 address) and
 * @port (0 picks a free one: see kvt__metad_port()). @params may be NULL.
 * Returns once the socket listens and the threads run: KVT_OK with *h_p
 * set, KVT_ERR_INVALID_PARAM (host does not resolve, bad parameter),
 * KVT_ERR_IO (cannot bind or listen; logged), KVT_ERR_NOT_SUPPORTED (built
 * without libmicrohttpd or json-c; logged), KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__metad_start(const char *host, uint16_t port,
                              const kvt__metad_params_t *params,
                              kvt__metad_t **h_p);

/* The port the server is bound to. */
uint16_t kvt__metad_port(const kvt__metad_t *h);

/*
 * Stop accepting, close every connection, join the threads and free
 * everything, stored keys included. NULL does nothing. Must not race with
 * another stop of the same handle.
 */
void kvt__metad_stop(kvt__metad_t *h);

#endif
