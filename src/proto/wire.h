/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_PROTO_WIRE_H
#define KVT_PROTO_WIRE_H

/*
 * The engine's wire protocol (docs/protocol.md is the spec). Every frame is
 * a 32-byte header, a body of body_len bytes and a payload of payload_len
 * bytes. All integers are little-endian. The functions here are pure
 * parsers and encoders, without I/O, so that they can be fuzzed.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

#include "proto/segdesc.h" /* IWYU pragma: keep */

#define KVT_WIRE_MAGIC 0x544b /* "KT" on the wire */
#define KVT_WIRE_VERSION_MAJOR 2
#define KVT_WIRE_VERSION_MINOR 1
#define KVT_WIRE_HDR_LEN 32
#define KVT_WIRE_MAX_BODY (256u * 1024u)
#define KVT_WIRE_MAX_PAYLOAD (64ull << 20)
#define KVT_WIRE_MAX_PIECES 4096u
#define KVT_WIRE_MAX_SEGS 1024u /* sum of piece counts in one frame */
#define KVT_WIRE_PIECE_LEN 24
#define KVT_WIRE_FAIL_LEN 8
#define KVT_WIRE_TRAILER_LEN 8
#define KVT_WIRE_NAME_MAX 127
#define KVT_WIRE_NONCE_LEN 32

typedef enum {
    KVT_WIRE_HELLO = 1,
    KVT_WIRE_HELLO_ACK = 2,
    KVT_WIRE_ERROR = 3,
    KVT_WIRE_SEG_QUERY = 4,
    KVT_WIRE_SEG_DESC = 5,
    KVT_WIRE_WRITE = 6,
    KVT_WIRE_WRITE_ACK = 7,
    KVT_WIRE_READ = 8,
    KVT_WIRE_READ_RESP = 9,
    KVT_WIRE_NOTIFY = 10,
    KVT_WIRE_NOTIFY_ACK = 11,
    KVT_WIRE_PING = 12,
    KVT_WIRE_PONG = 13,
    KVT_WIRE_AUTH_CHALLENGE = 14,
    KVT_WIRE_AUTH = 15,
    KVT_WIRE_TYPE_MAX = 15,
} kvt__wire_type_t;

typedef struct {
    uint8_t ver_major;
    uint8_t ver_minor;
    uint8_t type;
    uint8_t flags;
    uint32_t body_len;
    int32_t status;
    uint64_t payload_len;
    uint64_t req_id;
} kvt__wire_hdr_t;

/* A run of remote memory: @count pieces of @len bytes, @stride apart. */
typedef struct {
    uint64_t addr;
    uint32_t len;
    uint32_t count;
    uint64_t stride;
} kvt__wire_piece_t;

/* A failed piece in an acknowledgement. */
typedef struct {
    uint32_t index;
    int32_t status;
} kvt__wire_fail_t;

void kvt__wire_hdr_encode(const kvt__wire_hdr_t *hdr,
                          uint8_t out[KVT_WIRE_HDR_LEN]);

/*
 * Decode and check a header: magic, version, known type, body and payload
 * within limits, flags and reserved bits zero. @hdr_p is filled whenever
 * @len is a whole header, even when the header is refused (so the caller
 * can report both versions, or echo req_id in an ERROR).
 * KVT_ERR_VERSION for another major version, KVT_ERR_PROTOCOL for
 * anything else that is wrong.
 */
kvt_status_t kvt__wire_hdr_decode(const uint8_t *buf, size_t len,
                                  kvt__wire_hdr_t *hdr_p);

void kvt__wire_piece_encode(const kvt__wire_piece_t *p, uint8_t *out);

/*
 * Decode a piece table of @body_len bytes into @pieces (room for @max).
 * Checks: a whole number of pieces, at most KVT_WIRE_MAX_PIECES, each with
 * len > 0, count >= 1, stride >= len when count > 1, no address overflow,
 * sum of counts <= KVT_WIRE_MAX_SEGS, and total bytes == @payload_len.
 * *npieces_p and *nsegs_p are set on success.
 */
kvt_status_t kvt__wire_pieces_decode(const uint8_t *body, size_t body_len,
                                     uint64_t payload_len,
                                     kvt__wire_piece_t *pieces, size_t max,
                                     uint32_t *npieces_p, uint32_t *nsegs_p);

/*
 * Decode a failure list (acknowledgements): @body_len / 8 entries, each
 * index < @npieces and status < 0. Calls @cb for each.
 */
kvt_status_t kvt__wire_fails_decode(
    const uint8_t *body, size_t body_len, uint32_t npieces,
    void (*cb)(void *arg, uint32_t index, kvt_status_t status), void *arg);

/* HELLO body: session id (the initiator's instance in the upper 32 bits,
 * its session counter in the lower), this connection's index and the
 * count, what the connection is for (0: the control plane; else the
 * KVT_TRANSPORT_* bit of the data transport that takes it over), the
 * fence (every earlier session of the same instance whose counter is at
 * most this is dead: the target drops its connections before accepting
 * this one; 0: none), and the sender's segment name. */
typedef struct {
    uint64_t session_id;
    uint32_t conn_index;
    uint32_t nconns;
    uint32_t transport;
    uint32_t fence;
    char name[KVT_WIRE_NAME_MAX + 1];
    /* Since 2.1: the initiator holds an auth token and offers its nonce
     * (the body ends with it); the target must answer AUTH_CHALLENGE. */
    int auth;
    uint8_t nonce[KVT_WIRE_NONCE_LEN];
} kvt__wire_hello_t;

#define KVT_WIRE_HELLO_MAX (8 + 16 + 2 + KVT_WIRE_NAME_MAX + KVT_WIRE_NONCE_LEN)

/* AUTH_CHALLENGE body: the target's nonce, its MAC, its segment name (a
 * str). AUTH body: the initiator's MAC. (docs/protocol.md, Handshake) */
#define KVT_WIRE_MAC_LEN 32
#define KVT_WIRE_CHALLENGE_MIN (KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN + 2)

size_t kvt__wire_hello_encode(const kvt__wire_hello_t *h, uint8_t *out,
                              size_t cap);
kvt_status_t kvt__wire_hello_decode(const uint8_t *buf, size_t len,
                                    kvt__wire_hello_t *h);

/* A u16 length and that many bytes (a name: at most KVT_WIRE_NAME_MAX,
 * no NUL). put returns the bytes written; get the bytes read, or 0 for
 * a malformed string. */
size_t kvt__wire_put_str(uint8_t *out, const char *s);
size_t kvt__wire_get_str(const uint8_t *buf, size_t len, char *out);

const char *kvt__wire_type_name(unsigned type);

/* The transports by their ids on the wire (the KVT_TRANSPORT_* bits, in
 * HELLO and the descriptor) and the names their descriptor sections and
 * JSON descriptors give them, whether this build has them or not: name
 * of an id (NULL for one unknown), id of a name (0). A unit test holds
 * each transport's own table to these. */
const char *kvt__wire_tl_name(uint32_t id);
uint32_t kvt__wire_tl_id(const char *name);

#endif
