/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The receive path: one state machine per connection (header, body,
 * payload read straight into its destination, trailer), and on
 * the initiator side the matching of responses to requests.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <unistd.h> /* IWYU pragma: keep */

#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/tsan.h"

/* Complete every piece of @f: @pst[i] when given, else @st. @c: the
 * connection it was put on (its bytes leave c->inflight), NULL for a
 * frame put on none (parked, or in the backlog). */
void kvt__tcp_frame_complete(tcp_conn_t *c, tcp_frame_t *f, kvt_status_t st,
                             const int32_t *pst)
{
    if (c != NULL)
        atomic_fetch_sub_explicit(&c->inflight, f->bytes, memory_order_relaxed);
    /* A copy out of device memory failed: zeros were sent for it. */
    if (atomic_load(&f->dev_failed) && st == KVT_OK) {
        st = KVT_ERR_IO;
        pst = NULL;
    }
    kvt__comp_run_begin();
    for (uint32_t i = 0; i < f->npieces; i++)
        kvt__comp_done(f->comps[i], pst ? pst[i] : st);
    kvt__comp_run_end();
    kvt__tcp_frame_put(f);
}

static void pstatus_fail_cb(void *arg, uint32_t index, kvt_status_t status)
{
    ((int32_t *)arg)[index] = status;
}

/* Whether response header @h answers frame @f, the head of the
 * outstanding FIFO (NULL: none). */
static int answers(const kvt__wire_hdr_t *h, const tcp_frame_t *f)
{
    if (f == NULL || f->req_id != h->req_id)
        return 0;
    switch (h->type) {
    case KVT_WIRE_WRITE_ACK:
        return f->type == KVT_WIRE_WRITE;
    case KVT_WIRE_READ_RESP:
        return f->type == KVT_WIRE_READ;
    case KVT_WIRE_NOTIFY_ACK:
        return f->type == KVT_WIRE_NOTIFY;
    default:
        return 0;
    }
}

/* Take @f, the head, off the outstanding FIFO (out_lock held). */
static void out_pop_head_locked(tcp_conn_t *c, const tcp_frame_t *f)
{
    c->out_head = f->next_out;
    if (c->out_head == NULL)
        c->out_tail = NULL;
}

static void out_pop_head(tcp_conn_t *c, const tcp_frame_t *f)
{
    pthread_mutex_lock(&c->out_lock);
    out_pop_head_locked(c, f);
    pthread_mutex_unlock(&c->out_lock);
}

/* @f, taken off the outstanding FIFO, is answered. */
static void response_done(tcp_conn_t *c, tcp_frame_t *f, kvt_status_t st,
                          const int32_t *pst)
{
    kvt__tcp_frame_complete(c, f, st, pst);
    atomic_fetch_add_explicit(&c->done_seq, 1, memory_order_release);
    if (atomic_load_explicit(&c->sess->nparked, memory_order_acquire))
        kvt__tcp_release_parked(c->sess);
}

/* Returns 0 to go on, or a failure status for the connection. */
static kvt_status_t outbound_dispatch(tcp_conn_t *c)
{
    const kvt__wire_hdr_t *h = &c->rx_hdr;
    tcp_frame_t *f;
    int ok, taken;

    if (h->type == KVT_WIRE_ERROR) {
        KVT_LOG_E("peer %s refused us: %s (%.*s)", c->sess->base.name,
                  kvt_status_str(h->status), (int)h->body_len,
                  (const char *)c->rx_body);
        return h->status < 0 ? h->status : KVT_ERR_PROTOCOL;
    }
    /* A frame stays at the head, where the timeout and a failure of the
     * connection find it, until nothing can fail before it completes: an
     * acknowledgement without a body takes it off at once, in the same
     * hold of out_lock as the look at it. */
    pthread_mutex_lock(&c->out_lock);
    f = c->out_head;
    ok = answers(h, f);
    taken = ok && (h->type == KVT_WIRE_NOTIFY_ACK ||
                   (h->type == KVT_WIRE_WRITE_ACK && h->body_len == 0));
    if (taken)
        out_pop_head_locked(c, f);
    pthread_mutex_unlock(&c->out_lock);
    if (!ok) {
        KVT_LOG_E("unexpected %s (request %llu) from %s",
                  kvt__wire_type_name(h->type), (unsigned long long)h->req_id,
                  c->sess->base.name);
        return KVT_ERR_PROTOCOL;
    }
    if (h->type == KVT_WIRE_NOTIFY_ACK) {
        response_done(c, f, h->status > 0 ? KVT_ERR_PROTOCOL : h->status, NULL);
        return KVT_OK;
    }
    if (taken) {
        /* A WRITE_ACK with no piece refused. */
        response_done(c, f, KVT_OK, NULL);
        return KVT_OK;
    }
    if (kvt__tcp_ensure_rx_arrays(c) != 0)
        return KVT_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < f->npieces; i++)
        c->rx_pstatus[i] = KVT_OK;
    if (kvt__wire_fails_decode(c->rx_body, h->body_len, f->npieces,
                               pstatus_fail_cb, c->rx_pstatus) != KVT_OK)
        return KVT_ERR_PROTOCOL;
    if (h->type == KVT_WIRE_WRITE_ACK) {
        out_pop_head(c, f);
        response_done(c, f, KVT_OK, c->rx_pstatus);
        return KVT_OK;
    }
    /* READ_RESP: the payload holds the accepted pieces, in order. */
    {
        uint64_t expect = 0;
        uint32_t s = 0;
        for (uint32_t i = 0; i < f->npieces; i++) {
            if (c->rx_pstatus[i] != KVT_OK)
                continue;
            for (uint32_t k = f->piece_seg[i]; k < f->piece_seg[i + 1]; k++) {
                c->rx_segs[s++] =
                    (rx_seg_t){(uint64_t)(uintptr_t)f->lsegs[k].iov_base,
                               f->lsegs[k].iov_len,
                               i,
                               1,
                               f->lseg_dev1 != NULL ? f->lseg_dev1[k] : 0,
                               0};
                expect += f->lsegs[k].iov_len;
            }
        }
        if (expect != h->payload_len)
            return KVT_ERR_PROTOCOL;
        c->rx_nsegs = s;
        c->rx_seg = 0;
        c->rx_seg_off = 0;
        c->rx_frame = f;
        c->rx_state = RX_PAYLOAD;
    }
    return KVT_OK;
}

static void read_resp_finish(tcp_conn_t *c)
{
    tcp_frame_t *f = c->rx_frame;
    uint32_t late;
    int32_t lst;

    memcpy(&late, c->rx_trailer, 4);
    memcpy(&lst, c->rx_trailer + 4, 4);
    if (late > 0) {
        /* Some region went away while the target was sending: the frame's
         * accepted pieces cannot be trusted as a whole. */
        if (lst >= 0)
            lst = KVT_ERR_ACCESS;
        for (uint32_t i = 0; i < f->npieces; i++)
            if (c->rx_pstatus[i] == KVT_OK)
                c->rx_pstatus[i] = lst;
    }
    c->rx_frame = NULL;
    out_pop_head(c, f); /* the head (outbound_dispatch()) */
    response_done(c, f, KVT_OK, c->rx_pstatus);
}

/* Re-check inbound WRITE segments after the registry changed. Called with
 * the registry read lock held. */
static void rx_revalidate(tcp_conn_t *c, kvt__memreg_t *reg)
{
    uint64_t gen = atomic_load_explicit(&reg->gen, memory_order_acquire);
    if (gen == c->rx_gen)
        return;
    c->rx_gen = gen;
    for (uint32_t s = c->rx_seg; s < c->rx_nsegs; s++) {
        rx_seg_t *g = &c->rx_segs[s];
        if (g->valid && !kvt__memreg_contains_locked(reg, g->addr, g->len,
                                                     KVT_ACCESS_REMOTE_WRITE)) {
            g->valid = 0;
            c->rx_pstatus[g->piece] = KVT_ERR_ACCESS;
            if (g->dev1 != 0 && s == c->rx_seg)
                kvt__tcp_rx_dev_drop(c);
        }
    }
}

/* Advance the segment cursor by @got bytes. */
static void rx_advance(tcp_conn_t *c, uint64_t got)
{
    kvt__tcp_rx_took(c, got);
    while (got > 0) {
        uint64_t left = c->rx_segs[c->rx_seg].len - c->rx_seg_off;
        if (got < left) {
            c->rx_seg_off += got;
            got = 0;
        } else {
            got -= left;
            c->rx_seg++;
            c->rx_seg_off = 0;
        }
    }
}

/* Bytes read ahead and not yet taken. */
static inline uint32_t pre_left(const tcp_conn_t *c)
{
    return c->rx_pre_len - c->rx_pre_off;
}

/* Read into a fixed buffer until @want bytes are there, taking what was
 * read ahead first; a want smaller than the read-ahead buffer reads into
 * it, so that what follows comes with the same call. 1 done, 0 drained,
 * -1 EOF/error. A read shorter than asked drained the socket: no second
 * read is made to be told so. */
static int rx_fill(tcp_conn_t *c, uint8_t *buf, size_t want)
{
    while (c->rx_have < want) {
        size_t need = want - c->rx_have, ask = need;
        uint8_t *to = buf + c->rx_have;
        ssize_t n;

        if (pre_left(c) > 0) {
            c->rx_have += kvt__tcp_pre_take(c, to, need);
            continue;
        }
        if (c->rx_drained)
            return 0;
        if (need < RX_PRE) {
            to = c->rx_pre;
            ask = RX_PRE;
        }
        n = recv(c->fd, to, ask, MSG_DONTWAIT);
        if (n == 0)
            return -1;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? 0 : -1;
        if ((size_t)n < ask && c->rx_short_ok)
            c->rx_drained = 1;
        if (to == c->rx_pre) {
            c->rx_pre_off = 0;
            c->rx_pre_len = (uint32_t)n;
        } else {
            c->rx_have += (size_t)n;
        }
    }
    return 1;
}

/* Payload bytes read ahead into the current host segments (those refused
 * are skipped), up to the first device segment. Under the registry lock
 * on an inbound connection, as a read into them is. */
static void rx_payload_pre(tcp_conn_t *c)
{
    while (pre_left(c) > 0 && c->rx_seg < c->rx_nsegs) {
        const rx_seg_t *g = &c->rx_segs[c->rx_seg];
        uint64_t m = g->len - c->rx_seg_off;

        if (g->valid && g->dev1 != 0)
            return;
        if (g->valid) {
            /* Into registered memory, as a readv() would have: ordered
             * with the application's accesses by the peers' protocol. */
            KVT_TSAN_IGNORE_WRITES_BEGIN();
            m = kvt__tcp_pre_take(c, (char *)(uintptr_t)g->addr + c->rx_seg_off,
                                  m);
            KVT_TSAN_IGNORE_WRITES_END();
        } else {
            if (m > pre_left(c))
                m = pre_left(c);
            c->rx_pre_off += (uint32_t)m; /* refused: skipped */
        }
        rx_advance(c, m);
    }
}

/*
 * Read payload bytes for the current segments: first what was read ahead
 * (rx_payload_pre()), then valid runs straight into their destination with
 * one vectored read (neighbouring segments merged into one vector), refused
 * ones into scratch. (Reading runs of small pieces into scratch and copying
 * them out was measured slower than a vectored read with a vector per 512-byte
 * piece.) The
 * read that ends the payload also asks for RX_PRE_TAIL bytes of what
 * follows (a trailer, the next frame). A read shorter than asked leaves the
 * socket drained (c->rx_drained), so no read is made only to be told EAGAIN.
 * Returns 1 when the payload is complete, 0 when the socket is drained,
 * -1 on EOF/error.
 */
static int rx_payload(tcp_conn_t *c)
{
    kvt__memreg_t *reg = c->w->tcp->reg;
    int check = !c->outbound;

    while (c->rx_seg < c->rx_nsegs) {
        struct iovec iov[RX_IOV];
        int n = 0, ends;
        ssize_t got;
        uint64_t rest = 0, asked; /* payload bytes asked for; all asked */
        uint32_t s;

        if (check) {
            kvt__memreg_rdlock(reg);
            rx_revalidate(c, reg);
        }
        /* Read-ahead bytes first. The payload may be in then, or the
         * socket drained with nothing left read ahead; bytes still read
         * ahead after this are a device segment's. */
        rx_payload_pre(c);
        if (c->rx_seg == c->rx_nsegs || (pre_left(c) == 0 && c->rx_drained)) {
            if (check)
                kvt__memreg_unlock(reg);
            if (c->rx_seg == c->rx_nsegs)
                break;
            return 0;
        }
        s = c->rx_seg;
        if (c->rx_segs[s].valid && c->rx_segs[s].dev1 != 0) {
            int r = kvt__tcp_rx_dev(c);
            if (check)
                kvt__memreg_unlock(reg);
            if (r <= 0)
                return r;
            continue;
        }
        if (!c->rx_segs[s].valid) {
            uint64_t left = c->rx_segs[s].len - c->rx_seg_off;
            rest = left < SCRATCH_LEN ? left : SCRATCH_LEN;
            iov[n++] = (struct iovec){c->w->scratch, rest};
            ends = rest == left && s + 1 == c->rx_nsegs;
        } else {
            uint64_t off = c->rx_seg_off;
            for (; s < c->rx_nsegs && c->rx_segs[s].valid &&
                   c->rx_segs[s].dev1 == 0;
                 s++) {
                char *p = (char *)(uintptr_t)c->rx_segs[s].addr + off;
                uint64_t len = c->rx_segs[s].len - off;
                off = 0;
                if (n > 0 &&
                    (char *)iov[n - 1].iov_base + iov[n - 1].iov_len == p) {
                    iov[n - 1].iov_len += len;
                } else if (n < RX_IOV) {
                    iov[n++] = (struct iovec){p, len};
                } else {
                    break;
                }
                rest += len;
            }
            ends = s == c->rx_nsegs;
        }
        asked = rest;
        /* The rest of this frame's payload: what follows may come with it
         * (never past IOV_MAX vectors). */
        if (ends && n < RX_IOV) {
            iov[n++] = (struct iovec){c->rx_pre, RX_PRE_TAIL};
            asked += RX_PRE_TAIL;
        }
        {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            got = payload_recvmsg(c->fd, &mh, MSG_DONTWAIT);
        }
        if (check)
            kvt__memreg_unlock(reg);
        if (got == 0)
            return -1;
        if (got < 0 && errno == EINTR)
            continue; /* no edge would report what is still there */
        if (got < 0)
            return errno == EAGAIN ? 0 : -1;
        if ((uint64_t)got < asked && c->rx_short_ok)
            c->rx_drained = 1;
        if ((uint64_t)got > rest) {
            /* Bytes of what follows: the payload is complete. */
            c->rx_pre_off = 0;
            c->rx_pre_len = (uint32_t)((uint64_t)got - rest);
            got = (ssize_t)rest;
        }
        rx_advance(c, (uint64_t)got);
    }
    /* Answered or completed only once its bytes are in device memory. */
    kvt__tcp_rx_dev_finish(c);
    return 1;
}

/* An inbound connection drained, its worker about to sleep: wake it
 * again when RX_LOWAT bytes are in, while the payload being read has as
 * many to come; for anything else, as soon as a byte is. The kernel caps
 * the mark at half the socket's receive buffer (which then still holds
 * it), and wakes the reader whatever the mark on an end of stream, an
 * error, or memory pressure. Outbound connections never get a mark: a
 * waiter's blocking read would wait for it. A refusal leaves the mark as
 * it was, and is asked again at the next drain. */
static void rx_lowat(tcp_conn_t *c)
{
    int want =
        c->rx_state == RX_PAYLOAD && c->rx_left >= RX_LOWAT ? (int)RX_LOWAT : 1;

    if (want == c->rx_lowat)
        return;
    if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0)
        c->rx_lowat = want;
}

/*
 * Read and handle what @c has, until the socket is drained (the worker,
 * edge-triggered) or, when @stop is given, as soon as *@stop reads 0
 * between two frames (a waiter, which polls: whatever it
 * leaves is reported to the worker when input is watched again). @ev: the
 * epoll events that brought the call, 0 when not known. A short read is
 * taken to have drained the socket only when they did not report the
 * peer's end: an end of stream that came before them raises no other edge,
 * and only a read that returns 0 finds it.
 */
void kvt__tcp_conn_rx(tcp_conn_t *c, const _Atomic uint32_t *stop, uint32_t ev)
{
    kvt_status_t fail = KVT_ERR_CONN_LOST;
    int r = 0;

    c->rx_drained = 0;
    c->rx_short_ok = ev != 0 && !(ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR));
    for (;;) {
        /* A waiter leaves between two frames, and with nothing read
         * ahead: the worker learns only of what is in the socket. */
        if (stop != NULL && c->rx_state == RX_HDR && pre_left(c) == 0 &&
            atomic_load_explicit(stop, memory_order_acquire) == 0)
            return;
        if (!c->outbound && c->rx_state == RX_HDR) {
            /* Backpressure: a peer that does not read its responses
             * gets no more of them; what it sends waits in the socket.
             * The worker calls again as the queue drains. */
            uint64_t q =
                atomic_load_explicit(&c->out_bytes, memory_order_relaxed);
            if (q > (c->rx_held ? OUT_RESUME : OUT_HOLD)) {
                c->rx_held = 1;
                r = 0;
                goto out;
            }
            c->rx_held = 0;
        }
        switch (c->rx_state) {
        case RX_HDR: {
            kvt_status_t st;
            r = rx_fill(c, c->rx_hdrbuf, KVT_WIRE_HDR_LEN);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            st = kvt__wire_hdr_decode(c->rx_hdrbuf, KVT_WIRE_HDR_LEN,
                                      &c->rx_hdr);
            if (st == KVT_ERR_VERSION) {
                char msg[96];
                int n = snprintf(msg, sizeof(msg),
                                 "kvt protocol %d.%d required, peer sent %u.%u",
                                 KVT_WIRE_VERSION_MAJOR, KVT_WIRE_VERSION_MINOR,
                                 c->rx_hdr.ver_major, c->rx_hdr.ver_minor);
                if (c->outbound)
                    KVT_LOG_E("refusing peer %s: %s", c->who, msg);
                else
                    KVT_LOG_E_RL("refusing peer %s: %s", c->who, msg);
                if (!c->outbound)
                    kvt__tcp_send_simple(c, KVT_WIRE_ERROR, c->rx_hdr.req_id,
                                         KVT_ERR_VERSION, msg, (size_t)n);
                fail = KVT_ERR_VERSION;
                goto fail;
            }
            if (st != KVT_OK) {
                KVT_LOG_W_RL("malformed frame header from %s; closing", c->who);
                /* As for any protocol error, the target says why before
                 * it closes (docs/protocol.md). */
                if (!c->outbound)
                    kvt__tcp_send_simple(c, KVT_WIRE_ERROR, c->rx_hdr.req_id,
                                         KVT_ERR_PROTOCOL, "malformed frame",
                                         15);
                fail = KVT_ERR_PROTOCOL;
                goto fail;
            }
            if (c->rx_hdr.body_len > c->rx_body_cap) {
                uint8_t *nb = realloc(c->rx_body, c->rx_hdr.body_len);
                if (nb == NULL) {
                    fail = KVT_ERR_NO_MEMORY;
                    goto fail;
                }
                c->rx_body = nb;
                c->rx_body_cap = c->rx_hdr.body_len;
            }
            c->rx_state = RX_BODY;
        }
            /* fall through */
        case RX_BODY:
            r = rx_fill(c, c->rx_body, c->rx_hdr.body_len);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            c->rx_state = RX_HDR;
            if (c->outbound) {
                kvt_status_t st;
                if (c->rx_hdr.type != KVT_WIRE_READ_RESP &&
                    c->rx_hdr.payload_len != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
                st = outbound_dispatch(c);
                if (st != KVT_OK) {
                    fail = st;
                    goto fail;
                }
            } else {
                if (c->rx_hdr.type != KVT_WIRE_WRITE &&
                    c->rx_hdr.type != KVT_WIRE_READ &&
                    c->rx_hdr.payload_len != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
                if (kvt__tcp_inbound_dispatch(c) != 0) {
                    fail = KVT_ERR_PROTOCOL;
                    goto fail;
                }
            }
            break;
        case RX_PAYLOAD:
            r = rx_payload(c);
            if (r <= 0)
                goto out;
            if (c->outbound) {
                c->rx_state = RX_TRAILER;
                c->rx_have = 0;
            } else {
                c->rx_state = RX_HDR;
                kvt__engine_landed(c->w->tcp->e);
                kvt__tcp_send_write_ack(c);
            }
            break;
        case RX_TRAILER:
            r = rx_fill(c, c->rx_trailer, KVT_WIRE_TRAILER_LEN);
            if (r <= 0)
                goto out;
            c->rx_have = 0;
            c->rx_state = RX_HDR;
            read_resp_finish(c);
            break;
        }
    }
out:
    if (r == 0) {
        if (!c->outbound)
            rx_lowat(c);
        return;
    }
fail : {
    int32_t why = atomic_load(&c->fail_status);
    kvt__tcp_conn_fail(c, why != 0 ? why : fail);
}
}
