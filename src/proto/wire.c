/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The frame codec (wire.h, docs/protocol.md): encoders and parsers of the
 * header and of each frame type's body, without I/O.
 */
#include "proto/wire.h"

#include <string.h>

#include <kvt/engine.h>

#include "util/le.h"

#define put16 kvt__put16
#define put32 kvt__put32
#define put64 kvt__put64
#define get16 kvt__get16
#define get32 kvt__get32
#define get64 kvt__get64

void kvt__wire_hdr_encode(const kvt__wire_hdr_t *hdr,
                          uint8_t out[KVT_WIRE_HDR_LEN])
{
    put16(out + 0, KVT_WIRE_MAGIC);
    out[2] = hdr->ver_major;
    out[3] = hdr->ver_minor;
    out[4] = hdr->type;
    out[5] = hdr->flags;
    put16(out + 6, 0);
    put32(out + 8, hdr->body_len);
    put32(out + 12, (uint32_t)hdr->status);
    put64(out + 16, hdr->payload_len);
    put64(out + 24, hdr->req_id);
}

kvt_status_t kvt__wire_hdr_decode(const uint8_t *buf, size_t len,
                                  kvt__wire_hdr_t *hdr_p)
{
    if (len < KVT_WIRE_HDR_LEN)
        return KVT_ERR_PROTOCOL;
    /* Every field is decoded even from a header that is refused: the
     * ERROR that answers it echoes req_id. */
    hdr_p->ver_major = buf[2];
    hdr_p->ver_minor = buf[3];
    hdr_p->type = buf[4];
    hdr_p->flags = buf[5];
    hdr_p->body_len = get32(buf + 8);
    hdr_p->status = (int32_t)get32(buf + 12);
    hdr_p->payload_len = get64(buf + 16);
    hdr_p->req_id = get64(buf + 24);
    if (get16(buf) != KVT_WIRE_MAGIC)
        return KVT_ERR_PROTOCOL;
    if (hdr_p->ver_major != KVT_WIRE_VERSION_MAJOR)
        return KVT_ERR_VERSION;
    if (hdr_p->type == 0 || hdr_p->type > KVT_WIRE_TYPE_MAX ||
        hdr_p->body_len > KVT_WIRE_MAX_BODY ||
        hdr_p->payload_len > KVT_WIRE_MAX_PAYLOAD || hdr_p->flags != 0 ||
        get16(buf + 6) != 0)
        return KVT_ERR_PROTOCOL;
    return KVT_OK;
}

void kvt__wire_piece_encode(const kvt__wire_piece_t *p, uint8_t *out)
{
    put64(out, p->addr);
    put32(out + 8, p->len);
    put32(out + 12, p->count);
    put64(out + 16, p->stride);
}

kvt_status_t kvt__wire_pieces_decode(const uint8_t *body, size_t body_len,
                                     uint64_t payload_len,
                                     kvt__wire_piece_t *pieces, size_t max,
                                     uint32_t *npieces_p, uint32_t *nsegs_p)
{
    size_t n = body_len / KVT_WIRE_PIECE_LEN;
    uint64_t total = 0, segs = 0;

    if (body_len % KVT_WIRE_PIECE_LEN != 0 || n == 0 ||
        n > KVT_WIRE_MAX_PIECES || n > max)
        return KVT_ERR_PROTOCOL;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = body + i * KVT_WIRE_PIECE_LEN;
        kvt__wire_piece_t *p = &pieces[i];
        uint64_t span;

        p->addr = get64(b);
        p->len = get32(b + 8);
        p->count = get32(b + 12);
        p->stride = get64(b + 16);
        if (p->len == 0 || p->count == 0 || p->count > KVT_WIRE_MAX_SEGS)
            return KVT_ERR_PROTOCOL;
        if (p->count == 1) {
            p->stride = p->len;
        } else if (p->stride < p->len ||
                   p->stride > (UINT64_MAX - p->len) / (p->count - 1)) {
            return KVT_ERR_PROTOCOL;
        }
        span = p->stride * (p->count - 1) + p->len;
        if (p->addr > UINT64_MAX - span)
            return KVT_ERR_PROTOCOL;
        segs += p->count;
        total += (uint64_t)p->len * p->count;
        if (segs > KVT_WIRE_MAX_SEGS || total > KVT_WIRE_MAX_PAYLOAD)
            return KVT_ERR_PROTOCOL;
    }
    if (total != payload_len)
        return KVT_ERR_PROTOCOL;
    *npieces_p = (uint32_t)n;
    *nsegs_p = (uint32_t)segs;
    return KVT_OK;
}

kvt_status_t kvt__wire_fails_decode(
    const uint8_t *body, size_t body_len, uint32_t npieces,
    void (*cb)(void *arg, uint32_t index, kvt_status_t status), void *arg)
{
    if (body_len % KVT_WIRE_FAIL_LEN != 0)
        return KVT_ERR_PROTOCOL;
    /* Check everything before reporting anything: a bad list changes
     * nothing. */
    for (size_t off = 0; off < body_len; off += KVT_WIRE_FAIL_LEN) {
        if (get32(body + off) >= npieces || (int32_t)get32(body + off + 4) >= 0)
            return KVT_ERR_PROTOCOL;
    }
    for (size_t off = 0; off < body_len; off += KVT_WIRE_FAIL_LEN)
        cb(arg, get32(body + off),
           (kvt_status_t)(int32_t)get32(body + off + 4));
    return KVT_OK;
}

size_t kvt__wire_put_str(uint8_t *out, const char *s)
{
    size_t n = strlen(s);
    put16(out, (uint16_t)n);
    memcpy(out + 2, s, n);
    return 2 + n;
}

/* Reads a length-prefixed string of at most KVT_WIRE_NAME_MAX bytes with
 * no NUL inside. Returns bytes consumed, 0 on error. */
size_t kvt__wire_get_str(const uint8_t *buf, size_t len, char *out)
{
    size_t n;
    if (len < 2)
        return 0;
    n = get16(buf);
    if (n > KVT_WIRE_NAME_MAX || n > len - 2 || memchr(buf + 2, 0, n))
        return 0;
    memcpy(out, buf + 2, n);
    out[n] = '\0';
    return 2 + n;
}

size_t kvt__wire_hello_encode(const kvt__wire_hello_t *h, uint8_t *out,
                              size_t cap)
{
    size_t n;

    if (cap < 24 + 2 + strlen(h->name) + (h->auth ? KVT_WIRE_NONCE_LEN : 0))
        return 0;
    put64(out, h->session_id);
    put32(out + 8, h->conn_index);
    put32(out + 12, h->nconns);
    put32(out + 16, h->transport);
    put32(out + 20, h->fence);
    n = 24 + kvt__wire_put_str(out + 24, h->name);
    if (h->auth) {
        memcpy(out + n, h->nonce, KVT_WIRE_NONCE_LEN);
        n += KVT_WIRE_NONCE_LEN;
    }
    return n;
}

kvt_status_t kvt__wire_hello_decode(const uint8_t *buf, size_t len,
                                    kvt__wire_hello_t *h)
{
    size_t n;
    if (len < 26)
        return KVT_ERR_PROTOCOL;
    h->session_id = get64(buf);
    h->conn_index = get32(buf + 8);
    h->nconns = get32(buf + 12);
    h->transport = get32(buf + 16);
    h->fence = get32(buf + 20);
    n = kvt__wire_get_str(buf + 24, len - 24, h->name);
    /* An initiator with a token ends the body with its nonce. */
    h->auth = n != 0 && 24 + n + KVT_WIRE_NONCE_LEN == len;
    if (h->auth)
        memcpy(h->nonce, buf + 24 + n, KVT_WIRE_NONCE_LEN);
    /* The transport is 0 (control) or one bit; a fence names earlier
     * sessions only. */
    if (n == 0 || (24 + n != len && !h->auth) || h->nconns == 0 ||
        h->nconns > 64 || h->conn_index >= h->nconns ||
        (h->transport & (h->transport - 1)) != 0 ||
        (h->fence != 0 && h->fence >= (uint32_t)h->session_id))
        return KVT_ERR_PROTOCOL;
    return KVT_OK;
}

const char *kvt__wire_type_name(unsigned type)
{
    static const char *const names[] = {
        "?",         "HELLO",     "HELLO_ACK",      "ERROR",
        "SEG_QUERY", "SEG_DESC",  "WRITE",          "WRITE_ACK",
        "READ",      "READ_RESP", "NOTIFY",         "NOTIFY_ACK",
        "PING",      "PONG",      "AUTH_CHALLENGE", "AUTH"};
    return type <= KVT_WIRE_TYPE_MAX ? names[type] : "?";
}

static const struct {
    uint32_t id;
    const char *name;
} tl_names[] = {
    {KVT_TRANSPORT_TCP, "tcp"},
    {KVT_TRANSPORT_SHM, "shm"},
    {KVT_TRANSPORT_UCX, "ucx"},
};

const char *kvt__wire_tl_name(uint32_t id)
{
    for (size_t i = 0; i < sizeof(tl_names) / sizeof(tl_names[0]); i++)
        if (tl_names[i].id == id)
            return tl_names[i].name;
    return NULL;
}

uint32_t kvt__wire_tl_id(const char *name)
{
    for (size_t i = 0; i < sizeof(tl_names) / sizeof(tl_names[0]); i++)
        if (strcmp(tl_names[i].name, name) == 0)
            return tl_names[i].id;
    return 0;
}
