/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The target side: checking the pieces of a WRITE or READ against the
 * registry (the security boundary, docs/protocol.md), acknowledgements,
 * READ responses sent from registered memory, and the dispatch of
 * requests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "transport/tcp/tcp.h"
#include "util/log.h"

/*
 * READ_RESP payload comes from registered memory: with the registry read
 * lock held, check that nothing was unregistered since validation, and
 * point any segment that left the registry at zero pages.
 */
void kvt__tcp_resp_revalidate(kvt__tcp_t *tcp, tcp_resp_t *r)
{
    kvt__memreg_t *reg = tcp->reg;
    uint64_t gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    int cur;

    if (gen == r->gen)
        return;
    r->gen = gen;
    cur = (int)(r->tx.cur - r->iov);
    for (uint32_t i = 0; i < r->nsegs; i++) {
        int k = (int)r->first_seg + (int)i;
        struct iovec *v = &r->iov[k];
        if (k < cur || r->seg_addr[i] == 0)
            continue;
        if (!kvt__memreg_contains_locked(reg, r->seg_addr[i], v->iov_len,
                                         KVT_ACCESS_REMOTE_READ)) {
            uint64_t sent = (uint64_t)(uintptr_t)v->iov_base - r->seg_addr[i];
            if (k > cur)
                sent = 0;
            v->iov_base = (char *)tcp->zeros + sent;
            r->seg_addr[i] = 0;
            r->late++;
            r->late_status = KVT_ERR_ACCESS;
        }
    }
    {
        uint8_t *t = r->trailer;
        uint32_t late = r->late;
        int32_t lst = r->late_status;
        memcpy(t, &late, 4);
        memcpy(t + 4, &lst, 4);
    }
}

int kvt__tcp_ensure_rx_arrays(tcp_conn_t *c)
{
    if (c->rx_segs != NULL)
        return 0;
    c->rx_segs = calloc(KVT_WIRE_MAX_SEGS, sizeof(*c->rx_segs));
    c->rx_pieces = calloc(KVT_WIRE_MAX_PIECES, sizeof(*c->rx_pieces));
    c->rx_pstatus = calloc(KVT_WIRE_MAX_PIECES, sizeof(*c->rx_pstatus));
    return (c->rx_segs && c->rx_pieces && c->rx_pstatus) ? 0 : -1;
}

/* Validate the pieces of a WRITE or READ against the registry and lay out
 * the segments. Refused pieces get KVT_ERR_ACCESS and invalid segments. */
static void layout_pieces(tcp_conn_t *c, uint32_t need)
{
    kvt__memreg_t *reg = c->w->tcp->reg;
    uint32_t s = 0;

    kvt__memreg_rdlock(reg);
    c->rx_gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    for (uint32_t i = 0; i < c->rx_npieces; i++) {
        const kvt__wire_piece_t *p = &c->rx_pieces[i];
        uint64_t span = p->stride * (p->count - 1) + p->len;
        /* One lookup for the whole span when it lies in one region (the
         * strided pieces of head slicing do); run by run otherwise. */
        int ok = kvt__memreg_contains_locked(reg, p->addr, span, need);
        if (!ok && p->count > 1) {
            ok = 1;
            for (uint32_t k = 0; k < p->count && ok; k++)
                ok = kvt__memreg_contains_locked(reg, p->addr + k * p->stride,
                                                 p->len, need);
        }
        c->rx_pstatus[i] = ok ? KVT_OK : KVT_ERR_ACCESS;
        for (uint32_t k = 0; k < p->count; k++, s++) {
            uint64_t a = p->addr + k * p->stride;
            uint32_t dev1 = 0;
            if (ok && reg->ndev > 0) {
                const kvt__region_t *r =
                    kvt__memreg_find_locked(reg, a, p->len);
                if (r != NULL && r->kind != KVT_MEM_HOST)
                    dev1 = (uint32_t)r->device + 1;
            }
            c->rx_segs[s] = (rx_seg_t){a, p->len, i, (uint32_t)ok, dev1, 0};
        }
    }
    kvt__memreg_unlock(reg);
    c->rx_nsegs = s;
    c->rx_seg = 0;
    c->rx_seg_off = 0;
}

static size_t encode_fails(const tcp_conn_t *c, uint8_t *out, int32_t *first_p)
{
    size_t n = 0;
    *first_p = KVT_OK;
    for (uint32_t i = 0; i < c->rx_npieces; i++) {
        int32_t st = c->rx_pstatus[i];
        if (st == KVT_OK)
            continue;
        if (*first_p == KVT_OK)
            *first_p = st;
        memcpy(out + n, &i, 4);
        memcpy(out + n + 4, &st, 4);
        n += KVT_WIRE_FAIL_LEN;
    }
    return n;
}

static size_t count_fails(const tcp_conn_t *c)
{
    size_t n = 0;
    for (uint32_t i = 0; i < c->rx_npieces; i++)
        n += c->rx_pstatus[i] != KVT_OK;
    return n;
}

/* Add to this worker's served counters (@k: 0 writes, 1 reads) the
 * pieces of the request that succeeded and their bytes. */
static void count_served(tcp_conn_t *c, unsigned k, size_t nf)
{
    _Atomic uint64_t *v = c->w->served;
    uint64_t bytes = 0;

    if (!c->w->tcp->cfg->metrics_on)
        return; /* KVT_METRICS=off */
    for (uint32_t s = 0; s < c->rx_nsegs; s++)
        if (c->rx_segs[s].valid && c->rx_pstatus[c->rx_segs[s].piece] == KVT_OK)
            bytes += c->rx_segs[s].len;
    atomic_store_explicit(&v[k],
                          atomic_load_explicit(&v[k], memory_order_relaxed) +
                              (c->rx_npieces - nf),
                          memory_order_relaxed);
    atomic_store_explicit(
        &v[2 + k],
        atomic_load_explicit(&v[2 + k], memory_order_relaxed) + bytes,
        memory_order_relaxed);
}

void kvt__tcp_send_write_ack(tcp_conn_t *c)
{
    size_t nf = count_fails(c);
    kvt__wire_hdr_t h;
    tcp_resp_t *r;
    int32_t first;

    count_served(c, 0, nf);
    if (nf == 0) {
        /* Every piece landed: the header alone. */
        kvt__tcp_send_simple(c, KVT_WIRE_WRITE_ACK, c->rx_hdr.req_id, KVT_OK,
                             NULL, 0);
        return;
    }
    r = kvt__tcp_resp_alloc(2, nf * KVT_WIRE_FAIL_LEN, 0);
    if (r == NULL) {
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    kvt__tcp_hdr_init(&h, KVT_WIRE_WRITE_ACK, c->rx_hdr.req_id);
    h.body_len = (uint32_t)encode_fails(c, r->body, &first);
    h.status = first;
    kvt__wire_hdr_encode(&h, r->hdr);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, h.body_len};
    r->tx.cnt = 2;
    kvt__tcp_send_resp(c, r);
}

static void handle_read(tcp_conn_t *c)
{
    kvt__tcp_t *tcp = c->w->tcp;
    size_t nf, nvalid = 0;
    uint64_t payload = 0, dev_bytes = 0;
    uint8_t *stage = NULL;
    kvt__wire_hdr_t h;
    tcp_resp_t *r;
    int32_t first;
    uint32_t k = 2, j = 0;

    layout_pieces(c, KVT_ACCESS_REMOTE_READ);
    for (uint32_t s = 0; s < c->rx_nsegs; s++) {
        if (c->rx_segs[s].valid) {
            nvalid++;
            payload += c->rx_segs[s].len;
            if (c->rx_segs[s].dev1 != 0)
                dev_bytes += c->rx_segs[s].len;
        }
    }
    if (dev_bytes > 0) {
        /* Device memory is sent from a pinned copy, made now; a piece
         * whose copy failed is refused with KVT_ERR_IO. */
        uint64_t off = 0;
        int failed, queued = 0, changed = 0;
        int sdev = 0;
        for (uint32_t s = 0; s < c->rx_nsegs; s++)
            if (c->rx_segs[s].valid && c->rx_segs[s].dev1 != 0) {
                sdev = (int)c->rx_segs[s].dev1 - 1;
                break;
            }
        stage = kvt__tcp_stage_get(tcp, dev_bytes, sdev);
        failed = stage == NULL;
        /* Under the registry's read lock, checked again, until the copies
         * completed: an unregistration waits for them. */
        kvt__memreg_rdlock(tcp->reg);
        for (uint32_t s = 0; !failed && s < c->rx_nsegs; s++) {
            rx_seg_t *g = &c->rx_segs[s];
            if (!g->valid || g->dev1 == 0)
                continue;
            if (!kvt__memreg_contains_locked(tcp->reg, g->addr, g->len,
                                             KVT_ACCESS_REMOTE_READ)) {
                /* Unregistered since the layout: this piece is refused,
                 * as on the host path (its bytes leave the payload). */
                c->rx_pstatus[g->piece] = KVT_ERR_ACCESS;
                changed = 1;
                continue;
            }
            g->soff = off;
            failed = kvt__tcp_dev_read_stage(c, stage + off, g->addr, g->len,
                                             (int)g->dev1 - 1) != 0;
            queued |= !failed;
            off += g->len;
        }
        /* Waited for even after a failure: the buffer goes back to the
         * pool only once nothing writes into it. */
        if (queued && kvt__tcp_dev_read_sync(c) != 0)
            failed = 1;
        kvt__memreg_unlock(tcp->reg);
        if (failed) {
            for (uint32_t s = 0; s < c->rx_nsegs; s++)
                if (c->rx_segs[s].valid && c->rx_segs[s].dev1 != 0)
                    c->rx_pstatus[c->rx_segs[s].piece] = KVT_ERR_IO;
            changed = 1;
        }
        if (changed) {
            /* Every segment of a failed piece leaves the payload. */
            payload = 0;
            nvalid = 0;
            for (uint32_t s = 0; s < c->rx_nsegs; s++) {
                rx_seg_t *g = &c->rx_segs[s];
                if (g->valid && c->rx_pstatus[g->piece] != KVT_OK)
                    g->valid = 0;
                if (g->valid) {
                    nvalid++;
                    payload += g->len;
                }
            }
        }
        if (failed) {
            if (stage != NULL)
                kvt__tcp_stage_put(tcp, stage, dev_bytes);
            stage = NULL;
            dev_bytes = 0;
        }
    }
    nf = count_fails(c);
    r = kvt__tcp_resp_alloc(3 + nvalid, nf * KVT_WIRE_FAIL_LEN, nvalid);
    if (r == NULL) {
        if (stage != NULL)
            kvt__tcp_stage_put(tcp, stage, dev_bytes);
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    count_served(c, 1, nf);
    r->stage = stage;
    r->stage_len = dev_bytes;
    r->tcp = tcp;
    kvt__tcp_hdr_init(&h, KVT_WIRE_READ_RESP, c->rx_hdr.req_id);
    h.body_len = (uint32_t)encode_fails(c, r->body, &first);
    h.status = first;
    h.payload_len = payload;
    kvt__wire_hdr_encode(&h, r->hdr);
    r->iov[0] = (struct iovec){r->hdr, KVT_WIRE_HDR_LEN};
    r->iov[1] = (struct iovec){r->body, h.body_len};
    r->first_seg = 2;
    for (uint32_t s = 0; s < c->rx_nsegs; s++) {
        if (!c->rx_segs[s].valid)
            continue;
        if (c->rx_segs[s].dev1 != 0) {
            /* From the pinned copy, which no unregistration affects
             * (seg_addr 0: not revalidated). */
            r->iov[k++] =
                (struct iovec){stage + c->rx_segs[s].soff, c->rx_segs[s].len};
            r->seg_addr[j++] = 0;
            continue;
        }
        r->iov[k++] = (struct iovec){(void *)(uintptr_t)c->rx_segs[s].addr,
                                     c->rx_segs[s].len};
        r->seg_addr[j++] = c->rx_segs[s].addr;
    }
    r->nsegs = j;
    r->gen = c->rx_gen;
    r->iov[k++] = (struct iovec){r->trailer, KVT_WIRE_TRAILER_LEN};
    r->tx.cnt = (int)k;
    if (h.body_len == 0) {
        /* Drop the empty body entry so the vector has no holes. */
        memmove(&r->iov[1], &r->iov[2], (k - 2) * sizeof(struct iovec));
        r->first_seg = 1;
        r->tx.cnt = (int)k - 1;
    }
    /* The trailer reports pieces whose region was unregistered while
     * their bytes were being sent; kvt__tcp_resp_revalidate() fills it in. */
    kvt__tcp_send_resp(c, r);
}

/* A complete request header and body are in; act on it. Returns 0 to go on
 * reading, -1 after the connection was shut down. */
int kvt__tcp_inbound_dispatch(tcp_conn_t *c)
{
    kvt_engine_h e = c->w->tcp->e;
    const kvt__wire_hdr_t *h = &c->rx_hdr;
    uint32_t nsegs;

    switch (h->type) {
    case KVT_WIRE_WRITE:
    case KVT_WIRE_READ:
        if (kvt__tcp_ensure_rx_arrays(c) != 0 ||
            kvt__wire_pieces_decode(c->rx_body, h->body_len, h->payload_len,
                                    c->rx_pieces, KVT_WIRE_MAX_PIECES,
                                    &c->rx_npieces, &nsegs) != KVT_OK) {
            KVT_LOG_W_RL("malformed %s from %s; closing",
                         kvt__wire_type_name(h->type), c->who);
            goto err_protocol;
        }
        if (h->type == KVT_WIRE_READ) {
            handle_read(c);
            return 0;
        }
        layout_pieces(c, KVT_ACCESS_REMOTE_WRITE);
        c->rx_left = h->payload_len;
        c->rx_state = RX_PAYLOAD;
        return 0;
    case KVT_WIRE_NOTIFY:
        if (h->body_len > KVT_NOTIFY_MAX) {
            kvt__tcp_send_simple(c, KVT_WIRE_NOTIFY_ACK, h->req_id,
                                 KVT_ERR_OVERFLOW, NULL, 0);
            return 0;
        }
        kvt__notify_push(e, c->peer, c->rx_body, h->body_len);
        kvt__tcp_send_simple(c, KVT_WIRE_NOTIFY_ACK, h->req_id, KVT_OK, NULL,
                             0);
        return 0;
    case KVT_WIRE_PING:
        kvt__tcp_send_simple(c, KVT_WIRE_PONG, h->req_id, KVT_OK, NULL, 0);
        return 0;
    default:
        KVT_LOG_W_RL("unexpected %s from %s; closing",
                     kvt__wire_type_name(h->type), c->who);
        goto err_protocol;
    }
err_protocol:
    kvt__tcp_send_simple(c, KVT_WIRE_ERROR, h->req_id, KVT_ERR_PROTOCOL,
                         "protocol error", 14);
    shutdown(c->fd, SHUT_RDWR);
    return -1;
}
