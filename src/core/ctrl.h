/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_CTRL_H
#define KVT_CORE_CTRL_H

/*
 * The control plane: the engine's listener, the handshake, and segment
 * descriptors (docs/protocol.md). Every connection to an engine's port
 * starts with HELLO. A control connection (HELLO for transport 0) asks
 * for the descriptor (SEG_QUERY, answered by SEG_DESC with the
 * descriptor as payload) or pings; a data connection (HELLO naming a
 * data transport) is answered HELLO_ACK and handed to that transport,
 * which owns the socket from then on. The server is one thread: it
 * accepts, reads handshakes and requests without blocking, bounds how
 * long a connection may take to say HELLO or sit idle, and how many
 * connections may wait at once.
 *
 * The client side dials a peer (blocking, bounded by a deadline): for the
 * descriptor, or for a data transport's connections.
 */
#include <stdint.h>

#include "proto/wire.h"
#include "core/tl.h"

typedef struct kvt__ctrl kvt__ctrl_t;

/* Bind the listener on the engine's host and port (@port_p: the one
 * bound); no thread runs until kvt__ctrl_start(). KVT_ERR_IO (logged),
 * KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__ctrl_create(kvt_engine_h e, const char *host, uint16_t port,
                              uint16_t *port_p, kvt__ctrl_t **ctrl_p);
/* A transport that takes data connections (its accept()), before start:
 * the socket (non-blocking, tuned) and the HELLO that opened it, after
 * HELLO_ACK was sent. */
kvt_status_t kvt__ctrl_add_taker(kvt__ctrl_t *ctrl, kvt__tl_t *tl);
kvt_status_t kvt__ctrl_start(kvt__ctrl_t *ctrl);
/* Stop serving: close the listener and every connection not handed over,
 * join the thread. NULL does nothing. */
void kvt__ctrl_stop(kvt__ctrl_t *ctrl);
void kvt__ctrl_destroy(kvt__ctrl_t *ctrl);

/* The client side (kvt__ctrl_dial(), kvt__ctrl_fetch()) is declared in
 * core/tl.h, as the transports dial through it too. */

/* What one fetch went through, step by step (kvt_doctor_run()). Times in
 * milliseconds from the start, negative for a step not reached. */
typedef struct {
    double connected_ms; /* TCP connection up */
    double hello_ms;     /* the answer to HELLO read */
    double auth_ms;      /* the answer to AUTH read (authenticated only) */
    double desc_ms;      /* the descriptor read */
    int peer_major, peer_minor; /* of the first answer's header; -1 none */
    int auth_here;              /* this engine has a token */
    /* How authentication went: 0 not reached or not asked; 1 both proved
     * the token; 2 the peer answered without a proof (it has no token);
     * 3 the peer's proof did not check (another token); 4 the peer
     * refused this engine (it wants a token this one lacks, or ours did
     * not check there). */
    int auth;
    char peer_reason[160]; /* the text of the peer's refusal, if any */
} kvt__ctrl_trace_t;

/* kvt__ctrl_fetch() with its steps recorded into @tr. */
kvt_status_t kvt__ctrl_fetch_traced(kvt_engine_h e, const char *name,
                                    const char *addr, kvt__segdesc_t *desc,
                                    kvt__ctrl_trace_t *tr);

/* ---- Authentication (auth.c) ------------------------------------------ */

/*
 * Target: a fresh nonce into @nonce_t and the AUTH_CHALLENGE body into
 * @out (room for KVT_WIRE_CHALLENGE_MIN + KVT_WIRE_NAME_MAX bytes): the
 * nonce, the MAC proving the key over the HELLO body @hello, this
 * engine's name @name_t and the nonce, and the name. KVT_ERR_IO when the
 * kernel has no random bytes.
 */
kvt_status_t kvt__ctrl_auth_challenge(const kvt__auth_t *a,
                                      const uint8_t *hello, size_t hlen,
                                      const char *name_t,
                                      uint8_t nonce_t[KVT_WIRE_NONCE_LEN],
                                      uint8_t *out, size_t *len_p);
/* Target: 1 when the AUTH body @body proves the key for this handshake. */
int kvt__ctrl_auth_verify(const kvt__auth_t *a, const uint8_t *hello,
                          size_t hlen, const char *name_t,
                          const uint8_t nonce_t[KVT_WIRE_NONCE_LEN],
                          const uint8_t *body, size_t blen);
/*
 * Initiator: check the target's AUTH_CHALLENGE @chal against the HELLO
 * body @hello it answers, and compute the AUTH body into @mac.
 * KVT_ERR_ACCESS when the target did not prove the key, KVT_ERR_PROTOCOL
 * for a malformed challenge.
 */
kvt_status_t kvt__ctrl_auth_answer(const kvt__auth_t *a, const uint8_t *hello,
                                   size_t hlen, const uint8_t *chal,
                                   size_t clen, uint8_t mac[KVT_WIRE_MAC_LEN]);

#endif
