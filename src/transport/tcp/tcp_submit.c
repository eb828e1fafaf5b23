/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Submission: cutting normalised descriptors into wire pieces (slices
 * of large ones, runs of strided pieces) and the pieces into frames spread
 * over the session's connections; notifications.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp/tcp.h"
#include "util/time.h"

typedef struct {
    kvt__comp_t *comp;
    uint32_t count;
    uint64_t len;
    uint64_t raddr, rstride;
    uint64_t laddr, lstride;
    uint32_t ldev1; /* local device memory of device ldev1 - 1; 0: host */
} pspec_t;

/* Descriptors, and wire pieces, that a submission keeps on the stack
 * (a synchronous transfer's); more are allocated. */
#define SPEC_STACK 8

/* Pieces of a strided descriptor that one wire piece carries. */
static inline uint64_t strided_k(uint64_t len, uint64_t slice)
{
    uint64_t k = slice / len;
    return k > KVT_WIRE_MAX_SEGS ? KVT_WIRE_MAX_SEGS : k;
}

static inline uint32_t spec_lsegs(const pspec_t *p)
{
    return (p->count == 1 || p->lstride == p->len) ? 1 : p->count;
}

/*
 * Local device memory (tcp_dev.c): note which local segments are device
 * memory; a WRITE is staged when it is sent, a READ's are received
 * through the connection's ring. KVT_OK or KVT_ERR_NO_MEMORY.
 */
static kvt_status_t frame_dev(tcp_frame_t *f, const pspec_t *ps, size_t np)
{
    uint32_t *dev1 = malloc(f->nlsegs * sizeof(*dev1));

    if (dev1 == NULL)
        return KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < np; i++) {
        for (uint32_t k = f->piece_seg[i]; k < f->piece_seg[i + 1]; k++) {
            dev1[k] = ps[i].ldev1;
            if (ps[i].ldev1 != 0) {
                if (f->stage_len > 0 && f->stage_dev != (int)ps[i].ldev1 - 1)
                    f->stage_mixed = 1;
                else
                    f->stage_dev = (int)ps[i].ldev1 - 1;
                f->stage_len += f->lsegs[k].iov_len;
            }
        }
    }
    f->lseg_dev1 = dev1;
    return KVT_OK;
}

static tcp_frame_t *frame_build(tcp_session_t *s, uint8_t type,
                                const pspec_t *ps, size_t np,
                                kvt_status_t *st_p)
{
    int has_dev = 0;
    kvt__tcp_t *tcp = s->tcp;
    uint32_t nlsegs = 0;
    size_t table = np * KVT_WIRE_PIECE_LEN, niov, sz;
    uint64_t payload = 0;
    kvt__wire_hdr_t h;
    tcp_frame_t *f;
    uint8_t *p;
    uint32_t k = 0;
    int flat;

    *st_p = KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < np; i++) {
        nlsegs += spec_lsegs(&ps[i]);
        payload += ps[i].len * ps[i].count;
        has_dev |= ps[i].ldev1 != 0;
    }
    niov = 2 + nlsegs;
    flat = type == KVT_WIRE_WRITE && !has_dev &&
           KVT_WIRE_HDR_LEN + table + payload <= FLAT_MAX;
    sz = sizeof(*f) + niov * sizeof(struct iovec) + np * sizeof(kvt__comp_t *) +
         (np + 1) * 4 + table + (flat ? KVT_WIRE_HDR_LEN + (size_t)payload : 0);
    f = kvt__tcp_frame_alloc(sz);
    if (f == NULL)
        return NULL;
    atomic_init(&f->refs, 2);
    f->type = type;
    f->npieces = (uint32_t)np;
    f->nlsegs = nlsegs;
    f->bytes = payload;
    f->req_id =
        atomic_fetch_add_explicit(&tcp->next_req, 1, memory_order_relaxed);
    f->deadline = kvt__now_coarse_ns() + tcp->cfg->timeout_ns;
    p = (uint8_t *)(f->iov + niov);
    f->comps = (kvt__comp_t **)p;
    f->piece_seg = (uint32_t *)(f->comps + np);
    /* Flat: room for the header before the piece table, the payload
     * after it, so that the three are one run. */
    f->body =
        (uint8_t *)(f->piece_seg + np + 1) + (flat ? KVT_WIRE_HDR_LEN : 0);
    f->lsegs = f->iov + 2;
    for (size_t i = 0; i < np; i++) {
        const pspec_t *q = &ps[i];
        kvt__wire_piece_t wp = {q->raddr, (uint32_t)q->len, q->count,
                                q->count > 1 ? q->rstride : q->len};
        kvt__wire_piece_encode(&wp, f->body + i * KVT_WIRE_PIECE_LEN);
        f->comps[i] = q->comp;
        f->piece_seg[i] = k;
        if (spec_lsegs(q) == 1) {
            f->lsegs[k++] =
                (struct iovec){(void *)(uintptr_t)q->laddr, q->len * q->count};
        } else {
            for (uint32_t j = 0; j < q->count; j++)
                f->lsegs[k++] = (struct iovec){
                    (void *)(uintptr_t)(q->laddr + j * q->lstride), q->len};
        }
    }
    f->piece_seg[np] = k;
    kvt__tcp_hdr_init(&h, type, f->req_id);
    h.body_len = (uint32_t)table;
    h.payload_len = payload;
    kvt__wire_hdr_encode(&h, f->hdr);
    f->iov[0] = (struct iovec){f->hdr, KVT_WIRE_HDR_LEN};
    f->iov[1] = (struct iovec){f->body, table};
    f->tx.cur = f->iov;
    f->tx.cnt = type == KVT_WIRE_WRITE ? (int)niov : 2;
    if (flat) {
        /* One contiguous copy, sent with send() (kvt__tcp_flush_locked()):
         * cheaper for the kernel than a message of several vectors, by
         * more than the copy costs (FLAT_MAX). The source is read now,
         * before the call returns, which its contract allows. */
        uint8_t *q0 = f->body - KVT_WIRE_HDR_LEN, *q = f->body + table;
        memcpy(q0, f->hdr, KVT_WIRE_HDR_LEN);
        for (uint32_t i = 0; i < nlsegs; i++) {
            memcpy(q, f->lsegs[i].iov_base, f->lsegs[i].iov_len);
            q += f->lsegs[i].iov_len;
        }
        f->iov[0] = (struct iovec){q0, (size_t)(q - q0)};
        f->tx.cnt = 1;
    }
    if (type == KVT_WIRE_READ) {
        /* The send vector must not alias the receive segments, which the
         * sender's cursor would trim. */
        f->lsegs = f->iov + 2;
    }
    if (has_dev && (*st_p = frame_dev(f, ps, np)) != KVT_OK) {
        atomic_store(&f->refs, 1);
        kvt__tcp_frame_put(f);
        return NULL;
    }
    *st_p = KVT_OK;
    return f;
}

/*
 * Cut the READ or WRITE descriptors @x[0..n) into wire pieces and the
 * pieces into frames, then enqueue the frames on the least loaded
 * connections. Every descriptor's piece count is set before any frame is
 * enqueued.
 */
static void submit_op(tcp_session_t *s, uint8_t type,
                      const kvt__xfer_t *const *x, size_t n, kvt__sub_t *hint)
{
    uint64_t slice = s->tcp->cfg->slice_size, total = 0, target;
    size_t cap = 0, np = 0, start;
    pspec_t small[SPEC_STACK], *ps = NULL;
    tcp_frame_t *frames = NULL, **ftail = &frames;
    int single; /* the submission went as one frame */

    if (n == 0)
        return;
    if (n == 1 && x[0]->count == 1 && x[0]->len <= slice) {
        /* One piece, as a synchronous transfer's often is: nothing to
         * cut or to spread. */
        const kvt__xfer_t *d = x[0];
        kvt_status_t fst;
        small[0] = (pspec_t){
            .comp = d->comp,
            .count = 1,
            .len = d->len,
            .raddr = d->raddr,
            .laddr = d->laddr,
            .ldev1 = d->lkind != KVT_MEM_HOST ? (uint32_t)d->ldev + 1 : 0};
        kvt__comp_expect(d->comp, 1);
        frames = frame_build(s, type, small, 1, &fst);
        if (frames == NULL) {
            kvt__comp_done(d->comp, fst);
            return;
        }
        goto put;
    }
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = x[i];
        total += kvt__xfer_bytes(d);
        if (d->count == 1 || d->len > slice || d->len > UINT32_MAX)
            cap += d->count * ((d->len + slice - 1) / slice);
        else
            cap += (d->count + strided_k(d->len, slice) - 1) /
                   strided_k(d->len, slice);
    }
    ps = cap <= SPEC_STACK ? small : malloc(cap * sizeof(*ps));
    if (ps == NULL)
        goto err_fail_all;
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = x[i];
        uint32_t c = d->count;
        uint64_t L = d->len, ls = d->lstride, rs = d->rstride, la = d->laddr;
        uint32_t dv = d->lkind != KVT_MEM_HOST ? (uint32_t)d->ldev + 1 : 0;
        size_t first = np;

        if (c == 1 || L > slice || L > UINT32_MAX) {
            for (uint32_t j = 0; j < c; j++)
                for (uint64_t off = 0; off < L; off += slice)
                    ps[np++] = (pspec_t){d->comp,
                                         1,
                                         L - off < slice ? L - off : slice,
                                         d->raddr + j * rs + off,
                                         0,
                                         la + j * ls + off,
                                         0,
                                         dv};
        } else {
            uint64_t k = strided_k(L, slice);
            for (uint64_t j = 0; j < c; j += k) {
                uint32_t cnt = (uint32_t)(c - j < k ? c - j : k);
                ps[np++] = (pspec_t){d->comp,     cnt, L, d->raddr + j * rs, rs,
                                     la + j * ls, ls,  dv};
            }
        }
        kvt__comp_expect(d->comp, (uint32_t)(np - first));
    }

    /* Frame size: one slice, or the whole submission when it is smaller.
     * Each frame goes to the least loaded connection, so that larger
     * submissions, and the next submission while this one is in flight,
     * spread over the connections. (Cutting a submission of one slice or
     * less into a frame per connection costs a hand-over between threads
     * and an acknowledgement per frame at both ends: with 4 KiB pieces
     * scattered, 128 a batch, two batches in flight, 0.70 of the matched
     * ceiling against 0.78 for a frame per batch; docs/benchmarks.md.) */
    target = total;
    if (target < MIN_FRAME)
        target = MIN_FRAME;
    if (target > slice)
        target = slice;
    start = 0;
    while (start < np) {
        uint64_t bytes = 0;
        uint32_t rsegs = 0, lsegs = 0;
        size_t end = start;
        kvt_status_t fst;
        tcp_frame_t *f;

        while (end < np) {
            const pspec_t *q = &ps[end];
            uint64_t b = q->len * q->count;
            if (end > start &&
                (bytes + b > target || end - start >= KVT_WIRE_MAX_PIECES ||
                 rsegs + q->count > KVT_WIRE_MAX_SEGS ||
                 lsegs + spec_lsegs(q) > KVT_WIRE_MAX_SEGS))
                break;
            bytes += b;
            rsegs += q->count;
            lsegs += spec_lsegs(q);
            end++;
        }
        f = frame_build(s, type, ps + start, end - start, &fst);
        if (f == NULL) {
            for (size_t i = start; i < np; i++)
                kvt__comp_done(ps[i].comp, fst);
            break;
        }
        *ftail = f;
        ftail = (tcp_frame_t **)&f->tx.next;
        start = end;
    }
    if (ps != small)
        free(ps);
put:
    single = frames != NULL && frames->tx.next == NULL;
    while (frames != NULL) {
        tcp_frame_t *f = frames, *next = (tcp_frame_t *)f->tx.next;
        /* A thread that waits at once reads the response itself: attached
         * before the request goes out from here, it leaves the worker
         * asleep however soon the response comes. Only for a submission
         * of one request (more may go to other connections), and never
         * waiting for a reader that holds the connection now. */
        int attach = single && hint->will_wait && hint->attached == NULL &&
                     !hint->plugged && kvt__tcp_sends_inline(f);
        /* A READ request carries no payload, so room in a send queue
         * says nothing of the load it brings (its response): READs are
         * bound when submitted, to the connection with the fewest bytes
         * outstanding, responses counted. */
        tcp_conn_t *c = attach || type != KVT_WIRE_WRITE
                            ? kvt__tcp_pick_conn(s, attach)
                            : kvt__tcp_place(s, f);
        kvt__sub_note(hint, c); /* NULL: in the backlog, any connection's */
        if (c == NULL) {
            frames = next;
            continue;
        }
        if (attach && kvt__tcp_waiter_attach(c, 1) == 0)
            hint->attached = c;
        kvt__tcp_conn_enqueue(c, f);
        frames = next;
    }
    return;

err_fail_all:
    for (size_t i = 0; i < n; i++) {
        kvt__comp_expect(x[i]->comp, 1);
        kvt__comp_done(x[i]->comp, KVT_ERR_NO_MEMORY);
    }
}

static void submit_notify(tcp_session_t *s, const kvt__xfer_t *d,
                          kvt__sub_t *hint)
{
    size_t len = d->len;
    tcp_frame_t *f = calloc(1, sizeof(*f) + 2 * sizeof(struct iovec) +
                                   2 * sizeof(kvt__comp_t *) + 8 + len);
    kvt__wire_hdr_t h;
    int parked = 0;

    kvt__comp_expect(d->comp, 1);
    kvt__sub_note(hint, NULL); /* may be released by a worker */
    if (f == NULL) {
        kvt__comp_done(d->comp, KVT_ERR_NO_MEMORY);
        return;
    }
    atomic_init(&f->refs, 2);
    f->type = KVT_WIRE_NOTIFY;
    f->npieces = 1;
    f->comps = (kvt__comp_t **)(f->iov + 2);
    f->comps[0] = d->comp;
    f->body = (uint8_t *)(f->comps + 2);
    if (len > 0)
        memcpy(f->body, (const void *)(uintptr_t)d->laddr, len);
    f->req_id = atomic_fetch_add(&s->tcp->next_req, 1);
    f->deadline = kvt__now_coarse_ns() + s->tcp->cfg->timeout_ns;
    kvt__tcp_hdr_init(&h, KVT_WIRE_NOTIFY, f->req_id);
    h.body_len = (uint32_t)len;
    kvt__wire_hdr_encode(&h, f->hdr);
    f->iov[0] = (struct iovec){f->hdr, KVT_WIRE_HDR_LEN};
    f->iov[1] = (struct iovec){f->body, len};
    f->tx.cur = f->iov;
    f->tx.cnt = len ? 2 : 1;

    /* Ordering: wait for every frame enqueued so far on every connection
     * of this session to be answered, the backlog's put on them first. */
    kvt__tcp_backlog_spread(s);
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->nconns; i++)
        f->snap[i] = atomic_load(&s->conns[i]->enq_seq);
    if (s->parked_head != NULL || !kvt__tcp_notify_ready(s, f)) {
        f->next_out = NULL;
        if (s->parked_tail)
            s->parked_tail->next_out = f;
        else
            s->parked_head = f;
        s->parked_tail = f;
        atomic_fetch_add(&s->nparked, 1);
        parked = 1;
    }
    pthread_mutex_unlock(&s->lock);
    if (!parked) {
        kvt__tcp_conn_enqueue(s->conns[0], f);
    } else {
        /* An answer may have come in between the snapshot and parking. */
        kvt__tcp_release_parked(s);
        if (atomic_load(&s->base.dead))
            kvt__tcp_session_kill(&s->base, atomic_load(&s->base.dead));
    }
}

kvt_status_t kvt__tcp_submit(kvt__session_t *base, const kvt__xfer_t *x,
                             size_t n, kvt__sub_t *hint)
{
    tcp_session_t *s = (tcp_session_t *)base;
    const kvt__xfer_t *small[2 * SPEC_STACK], **w, **r;
    size_t i = 0;

    w = n <= SPEC_STACK ? small : malloc(2 * n * sizeof(*w));
    if (w == NULL)
        return KVT_ERR_NO_MEMORY;
    r = w + n;
    /* Writes and reads are cut into frames separately; a NOTIFY ends the
     * run before it so that it follows every write submitted earlier. */
    while (i < n) {
        size_t nw = 0, nr = 0;
        for (; i < n && x[i].op != KVT_OP_NOTIFY; i++) {
            if (x[i].op == KVT_OP_WRITE)
                w[nw++] = &x[i];
            else
                r[nr++] = &x[i];
        }
        submit_op(s, KVT_WIRE_WRITE, w, nw, hint);
        submit_op(s, KVT_WIRE_READ, r, nr, hint);
        if (i < n) {
            submit_notify(s, &x[i], hint);
            i++;
        }
    }
    if (w != small)
        free(w);
    return KVT_OK;
}
