/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control plane's client (ctrl.h): blocking calls on a fresh socket,
 * each bounded by a deadline. Both sides check the protocol's major
 * version: a peer that answers with another one, or refuses ours with
 * ERROR/KVT_ERR_VERSION, fails the call with KVT_ERR_VERSION and a log
 * line naming both versions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "core/ctrl.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

/* The trace of the fetch this thread is making, if it asked for one. */
static __thread kvt__ctrl_trace_t *trace;
static __thread uint64_t trace_t0;

static double since_ms(void)
{
    return (double)(kvt__now_ns() - trace_t0) / 1e6;
}

/*
 * Send one request and read its response. On success *body_p holds a
 * malloc'd body (or NULL when empty) and, when @payload_p is given,
 * *payload_p a malloc'd payload of *plen_p bytes (at most
 * KVT_WIRE_MAX_PAYLOAD); a response with a payload is a protocol error
 * otherwise.
 */
static kvt_status_t call(int fd, uint8_t type, const void *body, size_t len,
                         uint8_t expect, uint64_t deadline, const char *peer,
                         uint8_t **body_p, size_t *blen_p, uint8_t **payload_p,
                         size_t *plen_p)
{
    uint8_t hb[KVT_WIRE_HDR_LEN], *rb = NULL, *pl = NULL;
    kvt__wire_hdr_t h = {0};
    kvt_status_t st;

    h.ver_major = KVT_WIRE_VERSION_MAJOR;
    h.ver_minor = KVT_WIRE_VERSION_MINOR;
    h.type = type;
    h.body_len = (uint32_t)len;
    kvt__wire_hdr_encode(&h, hb);
    st = kvt__sock_send_all(fd, hb, sizeof(hb), deadline);
    if (st == KVT_OK && len)
        st = kvt__sock_send_all(fd, body, len, deadline);
    if (st == KVT_OK)
        st = kvt__sock_recv_all(fd, hb, sizeof(hb), deadline);
    if (st != KVT_OK)
        goto err;
    st = kvt__wire_hdr_decode(hb, sizeof(hb), &h);
    if (trace != NULL && trace->peer_major < 0 &&
        (st == KVT_OK || st == KVT_ERR_VERSION)) {
        trace->peer_major = h.ver_major;
        trace->peer_minor = h.ver_minor;
    }
    if (st == KVT_ERR_VERSION) {
        KVT_LOG_E("peer %s speaks kvt protocol %u.%u, this engine %d.%d", peer,
                  h.ver_major, h.ver_minor, KVT_WIRE_VERSION_MAJOR,
                  KVT_WIRE_VERSION_MINOR);
        return st;
    }
    if (st != KVT_OK)
        goto err;
    if (h.body_len) {
        rb = malloc(h.body_len + 1);
        if (rb == NULL)
            return KVT_ERR_NO_MEMORY;
        st = kvt__sock_recv_all(fd, rb, h.body_len, deadline);
        if (st != KVT_OK)
            goto err_free;
        rb[h.body_len] = '\0';
    }
    if (h.type == KVT_WIRE_ERROR) {
        /* The peer's reason, when it is one a refusal can have. Access
         * refused during the handshake is authentication refused (the
         * wire says KVT_ERR_ACCESS, as peers before KVT_ERR_AUTH do). */
        st = h.status == KVT_ERR_VERSION || h.status == KVT_ERR_NOT_SUPPORTED ||
                     h.status == KVT_ERR_BUSY || h.status == KVT_ERR_AUTH
                 ? h.status
             : h.status == KVT_ERR_ACCESS ? KVT_ERR_AUTH
                                          : KVT_ERR_PROTOCOL;
        if (trace != NULL) {
            if (st == KVT_ERR_AUTH)
                trace->auth = 4;
            snprintf(trace->peer_reason, sizeof(trace->peer_reason), "%s",
                     rb ? (const char *)rb : "");
        }
        KVT_LOG_E("peer %s refused the connection (%s): %.200s", peer,
                  kvt_status_name(st),
                  rb ? (const char *)rb : kvt_status_str(st));
        goto err_free;
    }
    if (h.type == KVT_WIRE_HELLO_ACK && expect == KVT_WIRE_AUTH_CHALLENGE) {
        /* A target that does not prove the token is not the one meant. */
        KVT_LOG_E("authentication failed: segment %s does not authenticate "
                  "(no auth token set there); refusing it",
                  peer);
        if (trace != NULL)
            trace->auth = 2;
        st = KVT_ERR_AUTH;
        goto err_free;
    }
    if (h.type != expect || (h.payload_len != 0 && payload_p == NULL)) {
        st = KVT_ERR_PROTOCOL;
        goto err_free;
    }
    if (h.payload_len != 0) {
        pl = malloc(h.payload_len);
        if (pl == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto err_free;
        }
        st = kvt__sock_recv_all(fd, pl, h.payload_len, deadline);
        if (st != KVT_OK)
            goto err_free;
    }
    if (h.status != KVT_OK) {
        /* A request the peer could not answer (it ran out of memory
         * describing itself, say): a failure of the call. */
        st = h.status == KVT_ERR_NO_MEMORY || h.status == KVT_ERR_OVERFLOW
                 ? h.status
                 : KVT_ERR_PROTOCOL;
        goto err_free;
    }
    *body_p = rb;
    *blen_p = h.body_len;
    if (payload_p != NULL) {
        *payload_p = pl;
        *plen_p = h.payload_len;
    }
    return KVT_OK;

err_free:
    free(pl);
    free(rb);
err:
    if (st == KVT_ERR_CONN_LOST)
        KVT_LOG_W("peer %s closed the connection during the handshake", peer);
    return st;
}

/*
 * Answer the target's AUTH_CHALLENGE (*body_p, which this replaces with
 * the HELLO_ACK's body) once it has proved the token: send AUTH and read
 * HELLO_ACK. KVT_ERR_AUTH (logged) when the target proved nothing or
 * refused our proof.
 */
static kvt_status_t prove(kvt_engine_h e, int fd, const char *name,
                          const uint8_t *hello, size_t hlen, uint8_t **body_p,
                          size_t *blen_p, uint64_t deadline)
{
    uint8_t mac[KVT_WIRE_MAC_LEN];
    kvt_status_t st =
        kvt__ctrl_auth_answer(&e->cfg.auth, hello, hlen, *body_p, *blen_p, mac);

    free(*body_p);
    *body_p = NULL;
    if (st == KVT_ERR_ACCESS) {
        KVT_LOG_E("authentication failed: segment %s did not prove the auth "
                  "token (another token?); refusing it",
                  name);
        if (trace != NULL)
            trace->auth = 3;
        st = KVT_ERR_AUTH;
    } else if (st != KVT_OK)
        KVT_LOG_E("segment %s sent a malformed AUTH_CHALLENGE", name);
    if (st == KVT_OK)
        st = call(fd, KVT_WIRE_AUTH, mac, sizeof(mac), KVT_WIRE_HELLO_ACK,
                  deadline, name, body_p, blen_p, NULL, NULL);
    return st;
}

kvt_status_t kvt__ctrl_dial(kvt_engine_h e, const char *name, const char *addr,
                            kvt__wire_hello_t *hello, uint64_t deadline,
                            int *fd_p)
{
    char host[KVT_WIRE_NAME_MAX + 1];
    uint8_t hb[KVT_WIRE_HELLO_MAX], *body = NULL;
    uint64_t now = kvt__now_ns();
    size_t blen, hl;
    uint16_t port;
    kvt_status_t st;
    int fd;

    st = kvt__sock_split_hostport(addr, host, sizeof(host), &port);
    if (st != KVT_OK) {
        KVT_LOG_E("address '%s' of segment '%s' is not host:port", addr, name);
        return st;
    }
    if (now >= deadline)
        return KVT_ERR_TIMEDOUT;
    st = kvt__sock_connect(host, port, (deadline - now) / 1000000 + 1, &fd);
    if (st != KVT_OK) {
        KVT_LOG_W("cannot connect to %s (%s): %s", name, addr,
                  kvt_status_str(st));
        atomic_fetch_add_explicit(&e->stats.hs_failed, 1, memory_order_relaxed);
        return st;
    }
    if (trace != NULL)
        trace->connected_ms = since_ms();
    kvt__sock_tune(fd, e->cfg.timeout_ns / 1000000);
    snprintf(hello->name, sizeof(hello->name), "%s", e->cfg.seg_name);
    hello->auth = e->cfg.auth.on;
    if (hello->auth)
        st = kvt__auth_random(hello->nonce, sizeof(hello->nonce));
    hl = kvt__wire_hello_encode(hello, hb, sizeof(hb));
    if (st == KVT_OK)
        st = call(fd, KVT_WIRE_HELLO, hb, hl,
                  hello->auth ? KVT_WIRE_AUTH_CHALLENGE : KVT_WIRE_HELLO_ACK,
                  deadline, name, &body, &blen, NULL, NULL);
    if (st == KVT_OK && trace != NULL)
        trace->hello_ms = since_ms();
    if (st == KVT_OK && hello->auth) {
        st = prove(e, fd, name, hb, hl, &body, &blen, deadline);
        if (st == KVT_OK && trace != NULL) {
            trace->auth_ms = since_ms();
            trace->auth = 1;
        }
    }
    free(body);
    if (st != KVT_OK) {
        atomic_fetch_add_explicit(&e->stats.hs_failed, 1, memory_order_relaxed);
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVT_OK;
}

kvt_status_t kvt__ctrl_fetch(kvt_engine_h e, const char *name, const char *addr,
                             kvt__segdesc_t *desc)
{
    uint64_t deadline = kvt__now_ns() + e->cfg.connect_timeout_ms * 1000000ull;
    kvt__wire_hello_t hello = {.nconns = 1};
    uint8_t *body = NULL, *payload = NULL;
    size_t blen = 0, plen = 0;
    kvt_status_t st;
    int fd;

    st = kvt__ctrl_dial(e, name, addr, &hello, deadline, &fd);
    if (st != KVT_OK)
        return st;
    st = call(fd, KVT_WIRE_SEG_QUERY, NULL, 0, KVT_WIRE_SEG_DESC, deadline,
              name, &body, &blen, &payload, &plen);
    close(fd);
    free(body);
    if (st != KVT_OK)
        return st;
    st = kvt__segdesc_decode(payload, plen, desc);
    free(payload);
    if (st == KVT_ERR_VERSION)
        KVT_LOG_E("segment %s describes itself in another descriptor format",
                  name);
    else if (st != KVT_OK)
        KVT_LOG_E("malformed segment descriptor from %s", name);
    return st;
}

kvt_status_t kvt__ctrl_fetch_traced(kvt_engine_h e, const char *name,
                                    const char *addr, kvt__segdesc_t *desc,
                                    kvt__ctrl_trace_t *tr)
{
    kvt_status_t st;

    tr->connected_ms = tr->hello_ms = tr->auth_ms = tr->desc_ms = -1;
    tr->peer_major = tr->peer_minor = -1;
    tr->auth_here = e->cfg.auth.on;
    tr->auth = 0;
    tr->peer_reason[0] = '\0';
    trace = tr;
    trace_t0 = kvt__now_ns();
    st = kvt__ctrl_fetch(e, name, addr, desc);
    if (st == KVT_OK)
        tr->desc_ms = since_ms();
    trace = NULL;
    return st;
}
