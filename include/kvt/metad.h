/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_METAD_H
#define KVT_METAD_H

/*
 * The metadata and bootstrap server (`kvt metad`) and the bootstrap
 * client, for programs that embed them (docs/metadata.md has the routes):
 *
 *   GET|PUT|DELETE /metadata?key=K[&ttl=S]   Mooncake's metadata store
 *   PUT /route, GET|DELETE /route?engine_rank=R&target_dp_group=G
 *                                             SGLang's prefill bootstrap
 *   GET /health, GET /metrics                 liveness, Prometheus text
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/defs.h>
#include <kvt/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * kvt_meta_backends() - the metadata backends this build has, as a
 * comma-separated list of URI schemes ("p2p, http, redis, etcd"); a static
 * string. kvt_metad_available() - whether it has the server (libmicrohttpd
 * and json-c were found at build time). Thread-safe, do not block.
 */
KVT_API const char *kvt_meta_backends(void);
KVT_API int kvt_metad_available(void);

/* ---- The server ---------------------------------------------------------- */

typedef struct kvt_metad *kvt_metad_h;

/* Bits of kvt_metad_params_t.field_mask: a field is read only when set. */
enum {
    KVT_METAD_PARAM_HOST = 1u << 0,
    KVT_METAD_PARAM_PORT = 1u << 1,
    KVT_METAD_PARAM_THREADS = 1u << 2,
    KVT_METAD_PARAM_MAX_BODY = 1u << 3,
    KVT_METAD_PARAM_MAX_BYTES = 1u << 4,
    KVT_METAD_PARAM_MAX_CONNS = 1u << 5,
    KVT_METAD_PARAM_HEADER_TIMEOUT = 1u << 6,
    KVT_METAD_PARAM_BODY_TIMEOUT = 1u << 7,
    KVT_METAD_PARAM_AUTH_TOKEN = 1u << 8,
    KVT_METAD_PARAM_AUTH_READS = 1u << 9,
};

/* The largest body a request may carry (and the default limit). */
#define KVT_METAD_MAX_BODY (16u << 20)

typedef struct {
    uint64_t field_mask;
    /* Address to listen on. NULL or "" (the default): 127.0.0.1 only,
     * since anyone who reaches the server can rewrite every key and
     * route; "0.0.0.0" listens on every IPv4 address. */
    const char *host;
    /* Port; 0 picks a free one (kvt_metad_port()). Default 8080. */
    uint16_t port;
    /* Server threads, 1..64. Default 2. */
    unsigned threads;
    /* Largest request body; larger ones get 413. Default and at most
     * KVT_METAD_MAX_BODY. */
    size_t max_body;
    /* Bytes the store may hold (its entries as the heap holds them, and
     * the request bodies being read); a PUT beyond gets 507. Default
     * 1 GiB. */
    size_t max_bytes;
    /* Connections kept at most, 1..1000000; one more drops the one that
     * has waited longest for a request header. Default 1000. Each takes
     * a descriptor: keep RLIMIT_NOFILE above it. */
    unsigned max_conns;
    /* Milliseconds a connection has to send a whole request header, from
     * its accept or from its previous answer, however often it sends a
     * byte; then it is closed. 1..3600000, default 5000. */
    uint32_t header_timeout_ms;
    /* Milliseconds a request has to send its whole body once its header
     * is in, and the longest an answer may stay unread. 1..3600000,
     * default 30000. */
    uint32_t body_timeout_ms;
    /* Shared secret that PUT and DELETE requests (of /metadata keys and
     * /route entries) must prove with an "Authorization: KVT-HMAC ..."
     * header (docs/security.md); others get 401. NULL or "": none, even
     * where the environment sets one. Without this bit: KVT_AUTH_TOKEN
     * from the environment, if set; else writes are open to anyone. */
    const char *auth_token;
    /* Non-zero: reads (GET, HEAD) need the proof too. Default 0: reads
     * are open. Meaningless without a token. */
    int auth_reads;
} kvt_metad_params_t;

/*
 * kvt_metad_start() - start a server in this process. @params may be NULL
 * (every default); strings are copied. Returns once the socket listens
 * and the threads run: KVT_OK with *server_p set, KVT_ERR_INVALID_PARAM
 * (the host does not resolve, a bad parameter), KVT_ERR_IO (cannot bind
 * or listen; logged), KVT_ERR_NOT_SUPPORTED (built without the server),
 * KVT_ERR_NO_MEMORY. Thread-safe.
 */
KVT_API kvt_status_t kvt_metad_start(const kvt_metad_params_t *params,
                                     kvt_metad_h *server_p);

/* kvt_metad_port() - the port the server is bound to (0 for NULL). */
KVT_API uint16_t kvt_metad_port(kvt_metad_h server);

/*
 * kvt_metad_stop() - stop accepting, close every connection, join the
 * threads and free everything, stored keys included. NULL does nothing.
 * Must not race with another call on the same server.
 */
KVT_API void kvt_metad_stop(kvt_metad_h server);

/* ---- The bootstrap client ------------------------------------------------ */

/*
 * A client of the bootstrap routes: prefill ranks register with PUT /route
 * and withdraw with DELETE /route; decode ranks read the prefill sizes
 * and each rank's address with GET /route. One client is used by one
 * thread at a time (it keeps an HTTP connection open). Every call is
 * bounded by @timeout_ms and, on failure, writes a sentence into @why
 * (@why_len bytes; @why may be NULL).
 */
typedef struct kvt_bootc *kvt_bootc_h;

/* kvt_bootc_create() - a client. When KVT_AUTH_TOKEN is set in the
 * environment at this call, every request carries its proof (an
 * Authorization: KVT-HMAC header, docs/security.md). Returns KVT_OK,
 * KVT_ERR_NOT_SUPPORTED (built without libcurl or json-c),
 * KVT_ERR_NO_MEMORY. */
KVT_API kvt_status_t kvt_bootc_create(kvt_bootc_h *client_p);
/* NULL does nothing. */
KVT_API void kvt_bootc_destroy(kvt_bootc_h client);

/*
 * kvt_bootc_register() - register a prefill rank with @server ("host:port",
 * or with "http://"): engine rank @engine_rank of @tp_total ranks in
 * @dp_size groups, reachable at @ip:@port, expiring after @ttl_s seconds
 * (0: never). Returns KVT_OK, KVT_ERR_UNREACHABLE, KVT_ERR_TIMEDOUT,
 * KVT_ERR_AUTH (the server needs an auth token this client lacks or
 * does not share: KVT_AUTH_TOKEN, docs/security.md), KVT_ERR_IO (the
 * server refused it otherwise), KVT_ERR_NOT_SUPPORTED.
 */
KVT_API kvt_status_t kvt_bootc_register(kvt_bootc_h client, const char *server,
                                        const char *ip, uint16_t port,
                                        uint32_t tp_total, uint32_t dp_size,
                                        uint32_t engine_rank, uint32_t ttl_s,
                                        uint64_t timeout_ms, char *why,
                                        size_t why_len);

/* kvt_bootc_unregister() - withdraw rank @rank of group @group (best
 * effort). Returns KVT_OK, or why the request failed (KVT_ERR_UNREACHABLE,
 * KVT_ERR_TIMEDOUT, KVT_ERR_IO, KVT_ERR_NOT_SUPPORTED). */
KVT_API kvt_status_t kvt_bootc_unregister(kvt_bootc_h client,
                                          const char *server, uint32_t rank,
                                          uint32_t group, uint64_t timeout_ms);

/*
 * kvt_bootc_sizes() - the prefill instance's total tensor-parallel size and
 * data-parallel size. Returns KVT_OK, KVT_ERR_NOT_FOUND while no prefill
 * rank is registered, KVT_ERR_PROTOCOL for an answer that is not what the
 * routes promise, or as kvt_bootc_register() otherwise.
 */
KVT_API kvt_status_t kvt_bootc_sizes(kvt_bootc_h client, const char *server,
                                     uint32_t *tp_total_p, uint32_t *dp_p,
                                     uint64_t timeout_ms, char *why,
                                     size_t why_len);

/*
 * kvt_bootc_route() - the address of rank @rank of group @group as
 * "ip:port" ("[v6]:port") in @name (@cap bytes). Returns KVT_OK,
 * KVT_ERR_NOT_FOUND while it is not registered, or as kvt_bootc_sizes()
 * otherwise.
 */
KVT_API kvt_status_t kvt_bootc_route(kvt_bootc_h client, const char *server,
                                     uint32_t rank, uint32_t group, char *name,
                                     size_t cap, uint64_t timeout_ms, char *why,
                                     size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
