/* SPDX-License-Identifier: Apache-2.0 */
#include "core/wire.h"

#include <stdlib.h>
#include <string.h>

/* Little-endian helpers; the compiler turns these into plain loads and
 * stores on little-endian machines. */
static inline void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

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
    if (len < KVT_WIRE_HDR_LEN || get16(buf) != KVT_WIRE_MAGIC)
        return KVT_ERR_PROTOCOL;
    hdr_p->ver_major = buf[2];
    hdr_p->ver_minor = buf[3];
    hdr_p->type = buf[4];
    hdr_p->flags = buf[5];
    hdr_p->body_len = get32(buf + 8);
    hdr_p->status = (int32_t)get32(buf + 12);
    hdr_p->payload_len = get64(buf + 16);
    hdr_p->req_id = get64(buf + 24);
    if (hdr_p->ver_major != KVT_WIRE_VERSION_MAJOR)
        return KVT_ERR_VERSION;
    if (hdr_p->type == 0 || hdr_p->type > KVT_WIRE_TYPE_MAX ||
        hdr_p->body_len > KVT_WIRE_MAX_BODY ||
        hdr_p->payload_len > KVT_WIRE_MAX_PAYLOAD || get16(buf + 6) != 0)
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

kvt_status_t kvt__wire_fails_decode(const uint8_t *body, size_t body_len,
                                    uint32_t npieces,
                                    void (*cb)(void *arg, uint32_t index,
                                               kvt_status_t status),
                                    void *arg)
{
    if (body_len % KVT_WIRE_FAIL_LEN != 0)
        return KVT_ERR_PROTOCOL;
    /* Check everything before reporting anything: a bad list changes
     * nothing. */
    for (size_t off = 0; off < body_len; off += KVT_WIRE_FAIL_LEN) {
        if (get32(body + off) >= npieces ||
            (int32_t)get32(body + off + 4) >= 0)
            return KVT_ERR_PROTOCOL;
    }
    for (size_t off = 0; off < body_len; off += KVT_WIRE_FAIL_LEN)
        cb(arg, get32(body + off), (kvt_status_t)(int32_t)get32(body + off + 4));
    return KVT_OK;
}

static size_t put_str(uint8_t *out, const char *s)
{
    size_t n = strlen(s);
    put16(out, (uint16_t)n);
    memcpy(out + 2, s, n);
    return 2 + n;
}

/* Reads a length-prefixed string of at most KVT_WIRE_NAME_MAX bytes with
 * no NUL inside. Returns bytes consumed, 0 on error. */
static size_t get_str(const uint8_t *buf, size_t len, char *out)
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
    if (cap < 16 + 2 + strlen(h->name))
        return 0;
    put64(out, h->session_id);
    put32(out + 8, h->conn_index);
    put32(out + 12, h->nconns);
    return 16 + put_str(out + 16, h->name);
}

kvt_status_t kvt__wire_hello_decode(const uint8_t *buf, size_t len,
                                    kvt__wire_hello_t *h)
{
    size_t n;
    if (len < 18)
        return KVT_ERR_PROTOCOL;
    h->session_id = get64(buf);
    h->conn_index = get32(buf + 8);
    h->nconns = get32(buf + 12);
    n = get_str(buf + 16, len - 16, h->name);
    if (n == 0 || 16 + n != len || h->nconns == 0 || h->nconns > 64 ||
        h->conn_index >= h->nconns)
        return KVT_ERR_PROTOCOL;
    return KVT_OK;
}

/*
 * Segment descriptor layout: u32 format version (1), name, host (u16
 * length + bytes), u16 port, u32 transports, u64 host id, u32 pid,
 * u32 region count, then per region u64 addr, u64 length, u32 access,
 * u32 kind.
 */
#define SEGDESC_FORMAT 1
#define SEGDESC_REGION_LEN 24

kvt_status_t kvt__segdesc_encode(const kvt__segdesc_t *d, uint8_t **buf_p,
                                 size_t *len_p)
{
    size_t len = 4 + 2 + strlen(d->name) + 2 + strlen(d->host) + 2 + 4 + 8 +
                 4 + 4 + (size_t)d->nregions * SEGDESC_REGION_LEN;
    uint8_t *buf, *p;

    if (d->nregions > KVT_SEGDESC_MAX_REGIONS)
        return KVT_ERR_OVERFLOW;
    buf = malloc(len);
    if (buf == NULL)
        return KVT_ERR_NO_MEMORY;
    p = buf;
    put32(p, SEGDESC_FORMAT);
    p += 4;
    p += put_str(p, d->name);
    p += put_str(p, d->host);
    put16(p, d->port);
    put32(p + 2, d->transports);
    put64(p + 6, d->host_id);
    put32(p + 14, d->pid);
    put32(p + 18, d->nregions);
    p += 22;
    for (uint32_t i = 0; i < d->nregions; i++, p += SEGDESC_REGION_LEN) {
        put64(p, d->regions[i].addr);
        put64(p + 8, d->regions[i].length);
        put32(p + 16, d->regions[i].access);
        put32(p + 20, d->regions[i].kind);
    }
    *buf_p = buf;
    *len_p = len;
    return KVT_OK;
}

kvt_status_t kvt__segdesc_decode(const uint8_t *buf, size_t len,
                                 kvt__segdesc_t *d)
{
    const uint8_t *p = buf, *end = buf + len;
    size_t n;

    memset(d, 0, sizeof(*d));
    if (len < 4 || get32(p) != SEGDESC_FORMAT)
        return KVT_ERR_PROTOCOL;
    p += 4;
    if ((n = get_str(p, (size_t)(end - p), d->name)) == 0)
        return KVT_ERR_PROTOCOL;
    p += n;
    if ((n = get_str(p, (size_t)(end - p), d->host)) == 0)
        return KVT_ERR_PROTOCOL;
    p += n;
    if ((size_t)(end - p) < 22)
        return KVT_ERR_PROTOCOL;
    d->port = get16(p);
    d->transports = get32(p + 2);
    d->host_id = get64(p + 6);
    d->pid = get32(p + 14);
    d->nregions = get32(p + 18);
    p += 22;
    if (d->nregions > KVT_SEGDESC_MAX_REGIONS ||
        (size_t)(end - p) != (size_t)d->nregions * SEGDESC_REGION_LEN) {
        d->nregions = 0;
        return KVT_ERR_PROTOCOL;
    }
    if (d->nregions == 0)
        return KVT_OK;
    d->regions = calloc(d->nregions, sizeof(*d->regions));
    if (d->regions == NULL) {
        d->nregions = 0;
        return KVT_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < d->nregions; i++, p += SEGDESC_REGION_LEN) {
        kvt_remote_region_t *r = &d->regions[i];
        r->addr = get64(p);
        r->length = get64(p + 8);
        r->access = get32(p + 16);
        r->kind = get32(p + 20);
        if (r->length == 0 || r->addr > UINT64_MAX - r->length) {
            kvt__segdesc_clear(d);
            return KVT_ERR_PROTOCOL;
        }
    }
    return KVT_OK;
}

void kvt__segdesc_clear(kvt__segdesc_t *d)
{
    free(d->regions);
    d->regions = NULL;
    d->nregions = 0;
}

const char *kvt__wire_type_name(unsigned type)
{
    static const char *const names[] = {
        "?",     "HELLO",     "HELLO_ACK", "ERROR",     "SEG_QUERY",
        "SEG_DESC", "WRITE",  "WRITE_ACK", "READ",      "READ_RESP",
        "NOTIFY", "NOTIFY_ACK", "PING",    "PONG"};
    return type <= KVT_WIRE_TYPE_MAX ? names[type] : "?";
}
