/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CONNECTOR_MSG_H
#define KVT_CONNECTOR_MSG_H

/*
 * Control messages of the PD protocol. They travel as engine
 * notifications (KVT_OP_NOTIFY), so they are ordered after the writes
 * submitted before them and need no socket of their own. Every message
 * starts with a 32-byte header, all integers little-endian:
 *
 *   0  u32 magic "KVCM"      4  u8 version (1)   5  u8 type   6  u16 0
 *   8  u64 session id       16  u64 room        24  u32 body length
 *  28  u32 0
 *
 * A message longer than one notification travels as FRAG messages that
 * carry consecutive slices of its full encoding. docs/connector.md lists
 * the bodies. The decoders below are pure and bounded: every length is
 * checked before use, and they have a fuzz target.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

#include "layout.h"

#define KVTC__CM_MAGIC 0x4d43564bu /* "KVCM" */
#define KVTC__CM_VERSION 1
#define KVTC__CM_HDR 32u
#define KVTC__CM_FRAG_HDR 24u /* after the message header */
/* Largest reassembled message (a layout of 65536 layers x 6 caches). */
#define KVTC__CM_MAX (24u << 20)
#define KVTC__CM_REASON_MAX 255u

enum {
    KVTC__CM_HELLO = 1,     /* decode -> prefill: handshake, decode layout */
    KVTC__CM_HELLO_ACK = 2, /* prefill -> decode: status, reason */
    KVTC__CM_ROOM = 3,      /* decode -> prefill: blocks and aux slots */
    KVTC__CM_NAK = 4,       /* prefill -> decode: room refused */
    KVTC__CM_STARTED = 5,   /* prefill -> decode: first write submitted */
    KVTC__CM_DONE = 6,      /* prefill -> decode: every write landed */
    KVTC__CM_ABORT = 7,     /* either way: stop; the sender is quiescent */
    KVTC__CM_ABORT_ACK = 8, /* either way: abort seen, quiescent */
    KVTC__CM_PING = 9,      /* either way: liveness */
    KVTC__CM_FRAG = 10,     /* a slice of a longer message */
    KVTC__CM_PONG = 11,     /* either way: the session is known here */
    KVTC__CM_TYPE_MAX = 11,
};

/* ROOM flags: this prefill rank sends no replicated cache and no aux
 * (another rank of the group does). */
#define KVTC__ROOM_DUMMY 1u

typedef struct {
    uint8_t type;
    uint64_t session;
    uint64_t room;
    const uint8_t *body;
    uint32_t len;
} kvtc__cm_t;

/* Parse the header of @len bytes at @buf: KVT_OK, or KVT_ERR_PROTOCOL
 * (short, bad magic or type, length mismatch) or KVT_ERR_VERSION. */
kvt_status_t kvtc__cm_parse(const void *buf, size_t len, kvtc__cm_t *m);

/* ---- Encoding ---------------------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    int oom;
} kvtc__cmb_t;

/* Start a message (the header's length is filled by finish). */
void kvtc__cmb_init(kvtc__cmb_t *b, uint8_t type, uint64_t session,
                    uint64_t room);
void kvtc__cmb_u32(kvtc__cmb_t *b, uint32_t v);
void kvtc__cmb_u64(kvtc__cmb_t *b, uint64_t v);
void kvtc__cmb_reason(kvtc__cmb_t *b, const char *s);
/* KVT_OK, KVT_ERR_NO_MEMORY or KVT_ERR_OVERFLOW (over KVTC__CM_MAX);
 * on failure the buffer is freed. */
kvt_status_t kvtc__cmb_finish(kvtc__cmb_t *b);
void kvtc__cmb_free(kvtc__cmb_t *b);

/* ---- Typed bodies ------------------------------------------------------ */

typedef struct {
    uint32_t role, tp_rank, tp_size, dp_rank, dp_size;
} kvtc__hello_t;

void kvtc__cm_hello_encode(kvtc__cmb_t *b, const kvtc__hello_t *h,
                           const kvtc__layout_t *l);
/* Decode and validate (kvtc__layout_build) the decode layout; on failure
 * KVT_ERR_PROTOCOL (malformed) or KVT_ERR_INVALID_PARAM (a bad layout)
 * with @why set. */
kvt_status_t kvtc__cm_hello_decode(const kvtc__cm_t *m, kvtc__hello_t *h,
                                   kvtc__layout_t *l, char *why, size_t wl);

/* HELLO_ACK, NAK and ABORT: a status and a reason. HELLO_ACK also
 * carries the prefill rank's parameters. */
typedef struct {
    int32_t status;
    kvtc__hello_t who;
    char reason[KVTC__CM_REASON_MAX + 1];
} kvtc__status_msg_t;

void kvtc__cm_status_encode(kvtc__cmb_t *b, const kvtc__status_msg_t *s);
kvt_status_t kvtc__cm_status_decode(const kvtc__cm_t *m, kvtc__status_msg_t *s);

typedef struct {
    uint32_t tp_rank, tp_size, flags;
    uint64_t first_block;
    uint32_t naux;
    uint64_t *aux_slots; /* malloc'd, naux (UINT64_MAX: none), or NULL */
    uint64_t nblocks;
    uint32_t *ids; /* malloc'd, nblocks, or NULL */
} kvtc__room_msg_t;

void kvtc__cm_room_encode(kvtc__cmb_t *b, const kvtc__room_msg_t *r);
/* KVT_OK with the arrays malloc'd (free with kvtc__room_msg_clear),
 * KVT_ERR_PROTOCOL or KVT_ERR_NO_MEMORY. */
kvt_status_t kvtc__cm_room_decode(const kvtc__cm_t *m, kvtc__room_msg_t *r);
void kvtc__room_msg_clear(kvtc__room_msg_t *r);

typedef struct {
    uint8_t inner_type;
    uint64_t msg_id;
    uint32_t total, offset;
    const uint8_t *data;
    uint32_t len;
} kvtc__frag_t;

/* Checks offset + len <= total <= KVTC__CM_MAX. */
kvt_status_t kvtc__cm_frag_decode(const kvtc__cm_t *m, kvtc__frag_t *f);

/*
 * Cut the finished message @msg (@len bytes) into FRAG messages of at
 * most @max bytes each (max > KVTC__CM_HDR + KVTC__CM_FRAG_HDR), written
 * one after another into *out_p (malloc'd) with their sizes in *sizes_p
 * (malloc'd, *n_p entries). KVT_OK or KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvtc__cm_fragment(const uint8_t *msg, size_t len, uint64_t msg_id,
                               size_t max, uint8_t **out_p, size_t **sizes_p,
                               size_t *n_p);

#endif
