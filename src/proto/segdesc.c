/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The segment descriptor codec (segdesc.h; docs/protocol.md is the spec).
 *
 *   u32 format (2)   u32 nsections
 *   then per section: u16 type, u16 version, u32 length, length bytes
 *
 *   COMMON v1     str name, str host, u16 port, u64 host_id, u32 pid
 *   REGIONS v1    u32 count, then per region u64 addr, u64 length,
 *                 u32 access, u16 kind, u16 device
 *   TRANSPORT v1  u32 id, str name, u16 version, the transport's bytes
 *   KEYS v1       u32 transport id, u32 count, then per key u32 region,
 *                 u16 length, the key's bytes
 *
 * A str is a u16 length and that many bytes, no NUL.
 */
#include "proto/segdesc.h"

#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "util/le.h"

#define SEC_HDR 8
#define REGION_LEN 24
#define MAX_SECTIONS (2 + 2 * KVT_SEGDESC_MAX_TL)

static size_t str_len(const char *s)
{
    return 2 + strlen(s);
}

static uint8_t *put_str(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    kvt__put16(p, (uint16_t)n);
    memcpy(p + 2, s, n);
    return p + 2 + n;
}

/* A string of at most @max bytes into @out (room for max + 1). */
static const uint8_t *get_str(const uint8_t *p, const uint8_t *end, char *out,
                              size_t max)
{
    size_t n;
    if (end - p < 2)
        return NULL;
    n = kvt__get16(p);
    p += 2;
    if (n > max || (size_t)(end - p) < n || memchr(p, 0, n) != NULL)
        return NULL;
    memcpy(out, p, n);
    out[n] = '\0';
    return p + n;
}

static uint8_t *sec_begin(uint8_t *p, uint16_t type, uint32_t len)
{
    kvt__put16(p, type);
    kvt__put16(p + 2, 1);
    kvt__put32(p + 4, len);
    return p + SEC_HDR;
}

kvt_status_t kvt__segdesc_encode(const kvt__segdesc_t *d, uint8_t **buf_p,
                                 size_t *len_p)
{
    size_t common, total, nsec = 2;
    uint8_t *buf, *p;

    if (d->nregions > KVT_SEGDESC_MAX_REGIONS || d->ntl > KVT_SEGDESC_MAX_TL ||
        strlen(d->name) > KVT_SEGDESC_STR_MAX ||
        strlen(d->host) > KVT_SEGDESC_STR_MAX)
        return KVT_ERR_OVERFLOW;
    common = str_len(d->name) + str_len(d->host) + 2 + 8 + 4;
    total =
        8 + SEC_HDR + common + SEC_HDR + 4 + (size_t)d->nregions * REGION_LEN;
    for (uint32_t t = 0; t < d->ntl; t++) {
        const kvt__segdesc_tl_t *tl = &d->tl[t];
        if (strlen(tl->name) > KVT_SEGDESC_TL_NAME_MAX)
            return KVT_ERR_OVERFLOW;
        total += SEC_HDR + 4 + str_len(tl->name) + 2 + tl->len;
        nsec++;
        if (tl->nkeys == 0)
            continue;
        total += SEC_HDR + 8;
        nsec++;
        for (uint32_t k = 0; k < tl->nkeys; k++) {
            if (tl->keys[k].len > KVT_SEGDESC_KEY_MAX)
                return KVT_ERR_OVERFLOW;
            total += 6 + tl->keys[k].len;
        }
    }
    if (total > KVT_WIRE_MAX_PAYLOAD)
        return KVT_ERR_OVERFLOW;
    buf = malloc(total);
    if (buf == NULL)
        return KVT_ERR_NO_MEMORY;
    kvt__put32(buf, KVT_SEGDESC_FORMAT);
    kvt__put32(buf + 4, (uint32_t)nsec);
    p = sec_begin(buf + 8, KVT__SD_COMMON, (uint32_t)common);
    p = put_str(p, d->name);
    p = put_str(p, d->host);
    kvt__put16(p, d->port);
    kvt__put64(p + 2, d->host_id);
    kvt__put32(p + 10, d->pid);
    p += 14;
    p = sec_begin(p, KVT__SD_REGIONS, 4 + d->nregions * REGION_LEN);
    kvt__put32(p, d->nregions);
    p += 4;
    for (uint32_t i = 0; i < d->nregions; i++, p += REGION_LEN) {
        const kvt_remote_region_t *r = &d->regions[i];
        kvt__put64(p, r->addr);
        kvt__put64(p + 8, r->length);
        kvt__put32(p + 16, r->access);
        kvt__put16(p + 20, (uint16_t)r->kind);
        kvt__put16(p + 22, (uint16_t)r->device);
    }
    for (uint32_t t = 0; t < d->ntl; t++) {
        const kvt__segdesc_tl_t *tl = &d->tl[t];
        uint32_t klen = 8;
        p = sec_begin(p, KVT__SD_TRANSPORT,
                      (uint32_t)(4 + str_len(tl->name) + 2 + tl->len));
        kvt__put32(p, tl->id);
        p = put_str(p + 4, tl->name);
        kvt__put16(p, tl->version);
        p += 2;
        if (tl->len > 0)
            memcpy(p, tl->body, tl->len);
        p += tl->len;
        if (tl->nkeys == 0)
            continue;
        for (uint32_t k = 0; k < tl->nkeys; k++)
            klen += 6 + tl->keys[k].len;
        p = sec_begin(p, KVT__SD_KEYS, klen);
        kvt__put32(p, tl->id);
        kvt__put32(p + 4, tl->nkeys);
        p += 8;
        for (uint32_t k = 0; k < tl->nkeys; k++) {
            kvt__put32(p, tl->keys[k].region);
            kvt__put16(p + 4, (uint16_t)tl->keys[k].len);
            memcpy(p + 6, tl->keys[k].data, tl->keys[k].len);
            p += 6 + tl->keys[k].len;
        }
    }
    *buf_p = buf;
    *len_p = (size_t)(p - buf);
    return KVT_OK;
}

static kvt_status_t dec_common(const uint8_t *p, const uint8_t *end,
                               kvt__segdesc_t *d)
{
    p = get_str(p, end, d->name, KVT_SEGDESC_STR_MAX);
    if (p == NULL || d->name[0] == '\0')
        return KVT_ERR_PROTOCOL;
    p = get_str(p, end, d->host, KVT_SEGDESC_STR_MAX);
    if (p == NULL || end - p != 14)
        return KVT_ERR_PROTOCOL;
    d->port = kvt__get16(p);
    d->host_id = kvt__get64(p + 2);
    d->pid = kvt__get32(p + 10);
    return KVT_OK;
}

static kvt_status_t dec_regions(const uint8_t *p, const uint8_t *end,
                                kvt__segdesc_t *d)
{
    uint32_t n;

    if (end - p < 4)
        return KVT_ERR_PROTOCOL;
    n = kvt__get32(p);
    p += 4;
    if (n > KVT_SEGDESC_MAX_REGIONS ||
        (size_t)(end - p) != (size_t)n * REGION_LEN)
        return KVT_ERR_PROTOCOL;
    if (n == 0)
        return KVT_OK;
    d->regions = calloc(n, sizeof(*d->regions));
    if (d->regions == NULL)
        return KVT_ERR_NO_MEMORY;
    d->nregions = n;
    for (uint32_t i = 0; i < n; i++, p += REGION_LEN) {
        kvt_remote_region_t *r = &d->regions[i];
        uint16_t dev = kvt__get16(p + 22);
        r->addr = kvt__get64(p);
        r->length = kvt__get64(p + 8);
        r->access = kvt__get32(p + 16);
        r->kind = kvt__get16(p + 20);
        r->device = dev == 0xffff ? -1 : (int32_t)dev;
        if (r->length == 0 || r->addr > UINT64_MAX - r->length ||
            (r->access & ~(uint32_t)KVT_ACCESS_REMOTE_RW) != 0)
            return KVT_ERR_PROTOCOL;
    }
    return KVT_OK;
}

static kvt_status_t dec_transport(const uint8_t *p, const uint8_t *end,
                                  kvt__segdesc_t *d)
{
    kvt__segdesc_tl_t *tl;
    uint32_t id;

    if (d->ntl == KVT_SEGDESC_MAX_TL || end - p < 4)
        return KVT_ERR_PROTOCOL;
    id = kvt__get32(p);
    /* One bit, not seen before. */
    if (id == 0 || (id & (id - 1)) != 0 || (d->transports & id) != 0)
        return KVT_ERR_PROTOCOL;
    tl = &d->tl[d->ntl];
    memset(tl, 0, sizeof(*tl));
    tl->id = id;
    p = get_str(p + 4, end, tl->name, KVT_SEGDESC_TL_NAME_MAX);
    if (p == NULL || tl->name[0] == '\0' || end - p < 2)
        return KVT_ERR_PROTOCOL;
    tl->version = kvt__get16(p);
    p += 2;
    tl->len = (uint32_t)(end - p);
    if (tl->len > 0) {
        tl->body = malloc(tl->len);
        if (tl->body == NULL)
            return KVT_ERR_NO_MEMORY;
        memcpy(tl->body, p, tl->len);
    }
    d->ntl++;
    d->transports |= id;
    return KVT_OK;
}

static kvt_status_t dec_keys(const uint8_t *p, const uint8_t *end,
                             kvt__segdesc_t *d)
{
    kvt__segdesc_tl_t *tl = NULL;
    const uint8_t *q;
    uint32_t id, n;
    size_t blob = 0;
    uint8_t *b;

    if (end - p < 8)
        return KVT_ERR_PROTOCOL;
    id = kvt__get32(p);
    n = kvt__get32(p + 4);
    p += 8;
    for (uint32_t t = 0; t < d->ntl; t++)
        if (d->tl[t].id == id)
            tl = &d->tl[t];
    /* Keys follow their transport's section, once, for known regions. */
    if (tl == NULL || tl->keys != NULL || n == 0 || n > d->nregions)
        return KVT_ERR_PROTOCOL;
    for (q = p; q < end;) {
        uint32_t klen;
        if (end - q < 6)
            return KVT_ERR_PROTOCOL;
        klen = kvt__get16(q + 4);
        if (klen == 0 || klen > KVT_SEGDESC_KEY_MAX ||
            (size_t)(end - q - 6) < klen)
            return KVT_ERR_PROTOCOL;
        q += 6 + klen;
        blob += klen;
    }
    tl->keys = calloc(n, sizeof(*tl->keys));
    tl->keyblob = malloc(blob ? blob : 1);
    if (tl->keys == NULL || tl->keyblob == NULL)
        return KVT_ERR_NO_MEMORY;
    b = tl->keyblob;
    for (q = p; q < end && tl->nkeys < n;) {
        kvt__segdesc_key_t *k = &tl->keys[tl->nkeys];
        k->region = kvt__get32(q);
        k->len = kvt__get16(q + 4);
        if (k->region >= d->nregions ||
            (tl->nkeys > 0 && k->region <= tl->keys[tl->nkeys - 1].region))
            return KVT_ERR_PROTOCOL;
        memcpy(b, q + 6, k->len);
        k->data = b;
        b += k->len;
        q += 6 + k->len;
        tl->nkeys++;
    }
    if (q != end || tl->nkeys != n)
        return KVT_ERR_PROTOCOL;
    return KVT_OK;
}

kvt_status_t kvt__segdesc_decode(const uint8_t *buf, size_t len,
                                 kvt__segdesc_t *d)
{
    const uint8_t *p = buf, *end;
    uint32_t nsec;
    int seen_common = 0, seen_regions = 0;
    kvt_status_t st = KVT_OK;

    memset(d, 0, sizeof(*d));
    /* An empty descriptor may come as NULL: no arithmetic on it. */
    if (len < 8)
        return KVT_ERR_PROTOCOL;
    end = buf + len;
    if (kvt__get32(p) != KVT_SEGDESC_FORMAT)
        return KVT_ERR_VERSION;
    nsec = kvt__get32(p + 4);
    p += 8;
    if (nsec > MAX_SECTIONS + 64)
        return KVT_ERR_PROTOCOL;
    for (uint32_t i = 0; i < nsec && st == KVT_OK; i++) {
        uint16_t type, ver;
        uint32_t slen;
        const uint8_t *body;
        if (end - p < SEC_HDR) {
            st = KVT_ERR_PROTOCOL;
            break;
        }
        type = kvt__get16(p);
        ver = kvt__get16(p + 2);
        slen = kvt__get32(p + 4);
        body = p + SEC_HDR;
        if ((size_t)(end - body) < slen) {
            st = KVT_ERR_PROTOCOL;
            break;
        }
        p = body + slen;
        switch (type) {
        case KVT__SD_COMMON:
            if (seen_common++)
                st = KVT_ERR_PROTOCOL;
            else if (ver != 1)
                st = KVT_ERR_VERSION;
            else
                st = dec_common(body, p, d);
            break;
        case KVT__SD_REGIONS:
            if (seen_regions++)
                st = KVT_ERR_PROTOCOL;
            else if (ver != 1)
                st = KVT_ERR_VERSION;
            else
                st = dec_regions(body, p, d);
            break;
        case KVT__SD_TRANSPORT:
            if (ver == 1)
                st = dec_transport(body, p, d);
            break;
        case KVT__SD_KEYS:
            if (ver == 1)
                st = dec_keys(body, p, d);
            break;
        default: /* a newer engine's: skipped */
            break;
        }
    }
    if (st == KVT_OK && (p != end || !seen_common))
        st = KVT_ERR_PROTOCOL;
    if (st != KVT_OK)
        kvt__segdesc_clear(d);
    return st;
}

void kvt__segdesc_clear(kvt__segdesc_t *d)
{
    free(d->regions);
    d->regions = NULL;
    d->nregions = 0;
    for (uint32_t t = 0; t < d->ntl; t++) {
        free(d->tl[t].body);
        free(d->tl[t].keys);
        free(d->tl[t].keyblob);
    }
    memset(d->tl, 0, sizeof(d->tl));
    d->ntl = 0;
    d->transports = 0;
}

void kvt__segdesc_move(kvt__segdesc_t *dst, kvt__segdesc_t *src)
{
    kvt__segdesc_clear(dst);
    *dst = *src;
    src->regions = NULL;
    src->nregions = 0;
    memset(src->tl, 0, sizeof(src->tl));
    src->ntl = 0;
    src->transports = 0;
}

const kvt__segdesc_tl_t *kvt__segdesc_tl(const kvt__segdesc_t *d, uint32_t id)
{
    for (uint32_t t = 0; t < d->ntl; t++)
        if (d->tl[t].id == id)
            return &d->tl[t];
    return NULL;
}

kvt_status_t kvt__segdesc_add_tl(kvt__segdesc_t *d, uint32_t id,
                                 const char *name, uint16_t version,
                                 const void *body, uint32_t len)
{
    kvt__segdesc_tl_t *tl;

    if (d->ntl == KVT_SEGDESC_MAX_TL || strlen(name) > KVT_SEGDESC_TL_NAME_MAX)
        return KVT_ERR_OVERFLOW;
    tl = &d->tl[d->ntl];
    memset(tl, 0, sizeof(*tl));
    if (len > 0) {
        tl->body = malloc(len);
        if (tl->body == NULL)
            return KVT_ERR_NO_MEMORY;
        memcpy(tl->body, body, len);
    }
    tl->id = id;
    tl->version = version;
    tl->len = len;
    memcpy(tl->name, name, strlen(name) + 1);
    d->ntl++;
    d->transports |= id;
    return KVT_OK;
}

const uint8_t *kvt__segdesc_key(const kvt__segdesc_tl_t *tl, uint32_t region,
                                uint32_t *len_p)
{
    uint32_t lo = 0, hi = tl->nkeys;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (tl->keys[mid].region < region)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == tl->nkeys || tl->keys[lo].region != region)
        return NULL;
    *len_p = tl->keys[lo].len;
    return tl->keys[lo].data;
}
