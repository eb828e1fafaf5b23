/* SPDX-License-Identifier: Apache-2.0 */
/* The control messages' codec: the header, the typed bodies and FRAG
 * pieces (msg.h has the wire format). Pure and bounded. */
#include "msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HELLO_FIXED 40u
#define HELLO_CACHE 48u
#define HELLO_AUX 24u
#define STATUS_FIXED 24u
#define ROOM_FIXED 32u

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

kvt_status_t kvtc__cm_parse(const void *buf, size_t len, kvtc__cm_t *m)
{
    const uint8_t *p = buf;
    uint32_t body;

    if (buf == NULL || len < KVTC__CM_HDR || len > KVTC__CM_MAX)
        return KVT_ERR_PROTOCOL;
    if (get_u32(p) != KVTC__CM_MAGIC)
        return KVT_ERR_PROTOCOL;
    if (p[4] != KVTC__CM_VERSION)
        return KVT_ERR_VERSION;
    if (p[5] == 0 || p[5] > KVTC__CM_TYPE_MAX)
        return KVT_ERR_PROTOCOL;
    body = get_u32(p + 24);
    if ((size_t)body != len - KVTC__CM_HDR)
        return KVT_ERR_PROTOCOL;
    m->type = p[5];
    m->session = get_u64(p + 8);
    m->room = get_u64(p + 16);
    m->body = p + KVTC__CM_HDR;
    m->len = body;
    return KVT_OK;
}

/* ---- Encoding ---------------------------------------------------------- */

static uint8_t *cmb_room(kvtc__cmb_t *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        uint8_t *nb;
        while (nc < b->len + n)
            nc *= 2;
        nb = realloc(b->buf, nc);
        if (nb == NULL) {
            b->oom = 1;
            return NULL;
        }
        b->buf = nb;
        b->cap = nc;
    }
    b->len += n;
    return b->buf + b->len - n;
}

void kvtc__cmb_init(kvtc__cmb_t *b, uint8_t type, uint64_t session,
                    uint64_t room)
{
    uint8_t *p;

    memset(b, 0, sizeof(*b));
    p = cmb_room(b, KVTC__CM_HDR);
    if (p == NULL)
        return;
    memset(p, 0, KVTC__CM_HDR);
    put_u32(p, KVTC__CM_MAGIC);
    p[4] = KVTC__CM_VERSION;
    p[5] = type;
    put_u64(p + 8, session);
    put_u64(p + 16, room);
}

void kvtc__cmb_u32(kvtc__cmb_t *b, uint32_t v)
{
    uint8_t *p = cmb_room(b, 4);
    if (p != NULL)
        put_u32(p, v);
}

void kvtc__cmb_u64(kvtc__cmb_t *b, uint64_t v)
{
    uint8_t *p = cmb_room(b, 8);
    if (p != NULL)
        put_u64(p, v);
}

void kvtc__cmb_reason(kvtc__cmb_t *b, const char *s)
{
    size_t n = s ? strnlen(s, KVTC__CM_REASON_MAX) : 0;
    uint8_t *p;

    kvtc__cmb_u32(b, (uint32_t)n);
    p = cmb_room(b, n);
    if (p != NULL && n > 0)
        memcpy(p, s, n);
}

kvt_status_t kvtc__cmb_finish(kvtc__cmb_t *b)
{
    if (b->oom) {
        kvtc__cmb_free(b);
        return KVT_ERR_NO_MEMORY;
    }
    if (b->len > KVTC__CM_MAX) {
        kvtc__cmb_free(b);
        return KVT_ERR_OVERFLOW;
    }
    put_u32(b->buf + 24, (uint32_t)(b->len - KVTC__CM_HDR));
    return KVT_OK;
}

void kvtc__cmb_free(kvtc__cmb_t *b)
{
    free(b->buf);
    memset(b, 0, sizeof(*b));
}

/* ---- HELLO ------------------------------------------------------------- */

void kvtc__cm_hello_encode(kvtc__cmb_t *b, const kvtc__hello_t *h,
                           const kvtc__layout_t *l)
{
    kvtc__cmb_u32(b, h->role);
    kvtc__cmb_u32(b, h->tp_rank);
    kvtc__cmb_u32(b, h->tp_size);
    kvtc__cmb_u32(b, h->dp_rank);
    kvtc__cmb_u32(b, h->dp_size);
    kvtc__cmb_u32(b, l->num_layers);
    kvtc__cmb_u32(b, l->num_draft);
    kvtc__cmb_u32(b, l->ncaches);
    kvtc__cmb_u32(b, l->naux);
    kvtc__cmb_u32(b, 0);
    for (uint32_t i = 0; i < l->ncaches; i++) {
        const kvtc__cache_t *c = &l->caches[i];
        kvtc__cmb_u32(b, c->layer);
        kvtc__cmb_u32(b, c->kind);
        kvtc__cmb_u32(b, c->block_layout);
        kvtc__cmb_u32(b, c->tokens);
        kvtc__cmb_u32(b, c->heads);
        kvtc__cmb_u32(b, c->head_bytes);
        kvtc__cmb_u64(b, c->base);
        kvtc__cmb_u64(b, c->block_bytes);
        kvtc__cmb_u64(b, c->num_blocks);
    }
    for (uint32_t i = 0; i < l->naux; i++) {
        kvtc__cmb_u64(b, l->aux[i].base);
        kvtc__cmb_u64(b, l->aux[i].item_bytes);
        kvtc__cmb_u64(b, l->aux[i].count);
    }
}

kvt_status_t kvtc__cm_hello_decode(const kvtc__cm_t *m, kvtc__hello_t *h,
                                   kvtc__layout_t *l, char *why, size_t wl)
{
    const uint8_t *p = m->body;
    uint32_t nl, nd, nc, na;
    kvtc__cache_t *c = NULL;
    kvtc__aux_t *a = NULL;
    kvt_status_t st = KVT_ERR_PROTOCOL;

    if (m->type != KVTC__CM_HELLO || m->len < HELLO_FIXED)
        goto err;
    h->role = get_u32(p);
    h->tp_rank = get_u32(p + 4);
    h->tp_size = get_u32(p + 8);
    h->dp_rank = get_u32(p + 12);
    h->dp_size = get_u32(p + 16);
    nl = get_u32(p + 20);
    nd = get_u32(p + 24);
    nc = get_u32(p + 28);
    na = get_u32(p + 32);
    if (nc > 6u * KVTC__LAY_MAX_LAYERS || na > KVTC__LAY_MAX_AUX ||
        m->len !=
            HELLO_FIXED + (uint64_t)nc * HELLO_CACHE + (uint64_t)na * HELLO_AUX)
        goto err;
    st = KVT_ERR_NO_MEMORY;
    c = malloc((nc ? nc : 1) * sizeof(*c));
    a = malloc((na ? na : 1) * sizeof(*a));
    if (c == NULL || a == NULL)
        goto err;
    p += HELLO_FIXED;
    for (uint32_t i = 0; i < nc; i++, p += HELLO_CACHE)
        c[i] =
            (kvtc__cache_t){get_u32(p),      get_u32(p + 4),  get_u32(p + 8),
                            get_u32(p + 12), get_u32(p + 16), get_u32(p + 20),
                            get_u64(p + 24), get_u64(p + 32), get_u64(p + 40)};
    for (uint32_t i = 0; i < na; i++, p += HELLO_AUX)
        a[i] = (kvtc__aux_t){get_u64(p), get_u64(p + 8), get_u64(p + 16)};
    st = kvtc__layout_build(l, nl, nd, c, nc, a, na, why, wl);
err:
    if (st == KVT_ERR_PROTOCOL && why != NULL && wl > 0)
        snprintf(why, wl, "malformed handshake");
    free(c);
    free(a);
    return st;
}

/* ---- Status messages --------------------------------------------------- */

void kvtc__cm_status_encode(kvtc__cmb_t *b, const kvtc__status_msg_t *s)
{
    kvtc__cmb_u32(b, (uint32_t)s->status);
    kvtc__cmb_u32(b, s->who.tp_rank);
    kvtc__cmb_u32(b, s->who.tp_size);
    kvtc__cmb_u32(b, s->who.dp_rank);
    kvtc__cmb_u32(b, s->who.dp_size);
    kvtc__cmb_reason(b, s->reason);
}

kvt_status_t kvtc__cm_status_decode(const kvtc__cm_t *m, kvtc__status_msg_t *s)
{
    const uint8_t *p = m->body;
    uint32_t n;

    if (m->len < STATUS_FIXED)
        return KVT_ERR_PROTOCOL;
    n = get_u32(p + 20);
    if (n > KVTC__CM_REASON_MAX || m->len != STATUS_FIXED + n)
        return KVT_ERR_PROTOCOL;
    memset(s, 0, sizeof(*s));
    s->status = (int32_t)get_u32(p);
    s->who.tp_rank = get_u32(p + 4);
    s->who.tp_size = get_u32(p + 8);
    s->who.dp_rank = get_u32(p + 12);
    s->who.dp_size = get_u32(p + 16);
    /* A reason is shown to users and logged: printable ASCII only. */
    for (uint32_t i = 0; i < n; i++) {
        uint8_t ch = p[STATUS_FIXED + i];
        s->reason[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    s->reason[n] = '\0';
    return KVT_OK;
}

/* ---- ROOM -------------------------------------------------------------- */

void kvtc__cm_room_encode(kvtc__cmb_t *b, const kvtc__room_msg_t *r)
{
    kvtc__cmb_u32(b, r->tp_rank);
    kvtc__cmb_u32(b, r->tp_size);
    kvtc__cmb_u32(b, r->flags);
    kvtc__cmb_u32(b, r->naux);
    kvtc__cmb_u64(b, r->first_block);
    kvtc__cmb_u64(b, r->nblocks);
    for (uint32_t i = 0; i < r->naux; i++)
        kvtc__cmb_u64(b, r->aux_slots[i]);
    for (uint64_t i = 0; i < r->nblocks; i++)
        kvtc__cmb_u32(b, r->ids[i]);
}

void kvtc__room_msg_clear(kvtc__room_msg_t *r)
{
    free(r->aux_slots);
    free(r->ids);
    r->aux_slots = NULL;
    r->ids = NULL;
}

kvt_status_t kvtc__cm_room_decode(const kvtc__cm_t *m, kvtc__room_msg_t *r)
{
    const uint8_t *p = m->body;
    uint64_t nb;
    uint32_t na;

    memset(r, 0, sizeof(*r));
    if (m->type != KVTC__CM_ROOM || m->len < ROOM_FIXED)
        return KVT_ERR_PROTOCOL;
    na = get_u32(p + 12);
    nb = get_u64(p + 24);
    if (na > KVTC__LAY_MAX_AUX || nb > KVTC__CM_MAX / 4 ||
        m->len != ROOM_FIXED + 8ull * na + 4ull * nb)
        return KVT_ERR_PROTOCOL;
    r->tp_rank = get_u32(p);
    r->tp_size = get_u32(p + 4);
    r->flags = get_u32(p + 8);
    r->naux = na;
    r->first_block = get_u64(p + 16);
    r->nblocks = nb;
    r->aux_slots = malloc((na ? na : 1) * sizeof(uint64_t));
    r->ids = malloc((nb ? nb : 1) * sizeof(uint32_t));
    if (r->aux_slots == NULL || r->ids == NULL) {
        kvtc__room_msg_clear(r);
        return KVT_ERR_NO_MEMORY;
    }
    p += ROOM_FIXED;
    for (uint32_t i = 0; i < na; i++, p += 8)
        r->aux_slots[i] = get_u64(p);
    for (uint64_t i = 0; i < nb; i++, p += 4)
        r->ids[i] = get_u32(p);
    return KVT_OK;
}

/* ---- Fragments --------------------------------------------------------- */

kvt_status_t kvtc__cm_frag_decode(const kvtc__cm_t *m, kvtc__frag_t *f)
{
    const uint8_t *p = m->body;

    if (m->type != KVTC__CM_FRAG || m->len < KVTC__CM_FRAG_HDR)
        return KVT_ERR_PROTOCOL;
    f->inner_type = p[0];
    f->offset = get_u32(p + 4);
    f->total = get_u32(p + 8);
    f->msg_id = get_u64(p + 16);
    f->data = p + KVTC__CM_FRAG_HDR;
    f->len = m->len - KVTC__CM_FRAG_HDR;
    if (f->total < KVTC__CM_HDR || f->total > KVTC__CM_MAX || f->len == 0 ||
        f->offset > f->total || f->len > f->total - f->offset)
        return KVT_ERR_PROTOCOL;
    return KVT_OK;
}

kvt_status_t kvtc__cm_fragment(const uint8_t *msg, size_t len, uint64_t msg_id,
                               size_t max, uint8_t **out_p, size_t **sizes_p,
                               size_t *n_p)
{
    size_t room = max - KVTC__CM_HDR - KVTC__CM_FRAG_HDR;
    size_t n = (len + room - 1) / room, pos = 0;
    uint8_t *out = malloc(n * max);
    size_t *sizes = malloc(n * sizeof(*sizes));
    kvtc__cm_t hdr;

    if (out == NULL || sizes == NULL) {
        free(out);
        free(sizes);
        return KVT_ERR_NO_MEMORY;
    }
    (void)kvtc__cm_parse(msg, len, &hdr);
    for (size_t i = 0; i < n; i++) {
        size_t take = len - pos < room ? len - pos : room;
        kvtc__cmb_t b;
        kvtc__cmb_init(&b, KVTC__CM_FRAG, hdr.session, hdr.room);
        kvtc__cmb_u32(&b, msg[5]);
        kvtc__cmb_u32(&b, (uint32_t)pos);
        kvtc__cmb_u32(&b, (uint32_t)len);
        kvtc__cmb_u32(&b, 0);
        kvtc__cmb_u64(&b, msg_id);
        if (!b.oom) {
            uint8_t *p = cmb_room(&b, take);
            if (p != NULL)
                memcpy(p, msg + pos, take);
        }
        if (kvtc__cmb_finish(&b) != KVT_OK) {
            free(out);
            free(sizes);
            return KVT_ERR_NO_MEMORY;
        }
        memcpy(out + i * max, b.buf, b.len);
        sizes[i] = b.len;
        kvtc__cmb_free(&b);
        pos += take;
    }
    *out_p = out;
    *sizes_p = sizes;
    *n_p = n;
    return KVT_OK;
}
