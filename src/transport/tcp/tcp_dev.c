/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory over tcp: staging through pinned host memory (tcp.h).
 *
 * Receiving (a target's WRITE into device memory, an initiator's READ
 * into it): the payload of a device segment is read into the current
 * chunk of the connection's ring; a full chunk (or the segment's last
 * bytes) is copied to the device asynchronously and marked, and the next
 * chunk is received meanwhile; a chunk is reused once its copy completed.
 * When the frame's payload is in, its copies are waited for: a WRITE is
 * acknowledged, a READ completed, only after its bytes are in device
 * memory, and a piece whose copy failed gets KVT_ERR_IO.
 *
 * Sending (a WRITE from device memory, a READ_RESP from it): the device
 * bytes are copied into one pinned buffer of the frame, and the frame
 * sends from there. A WRITE's copies are queued when the frame behind it
 * starts to send: the next TX_AHEAD device frames of the queue are copied
 * on the connection's own stream (under tx_lock), each followed by a
 * marker, while the head goes out; a frame reaching the head waits for
 * its marker only, so device-to-host copies overlap the socket. A frame
 * that reaches the head uncopied (the first, or one of another device)
 * is copied then, through the transport's stream of its device.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mem/dev.h"
#include "transport/tcp/tcp.h"
#include "util/log.h"

#define STAGE_KEEP 32 /* pinned buffers kept for reuse */
#define TX_AHEAD 2    /* device WRITE frames copied ahead of the head */

struct mem_stage {
    kvt__dstream_t *ds; /* the stream of the device copied to now (dev) */
    int dev;
    /* A stream per device the connection copied to, kept until it
     * closes: pieces for several devices each go through their own
     * device's context. */
    kvt__dstream_t *_Atomic by_dev[KVT__DEV_MAX];
    int switch_failed; /* a copy on the previous device's stream failed */
    uint8_t *buf;      /* STAGE_CHUNKS * STAGE_CHUNK, pinned */
    unsigned cur;      /* the chunk being filled */
    uint64_t fill;     /* bytes in it */
    uint64_t dst;      /* where its first byte goes */
    uint8_t busy[STAGE_CHUNKS];
    int queued; /* copies queued for the frame being received */
    int failed;
};

/* ---- Pinned buffers ----------------------------------------------------- */

void *kvt__tcp_stage_get(kvt__tcp_t *tcp, uint64_t len, int dev)
{
    void *p = NULL;

    if (len <= tcp->cfg->slice_size) {
        pthread_mutex_lock(&tcp->dev_lock);
        if (tcp->nstage_free > 0)
            p = tcp->stage_free[--tcp->nstage_free];
        pthread_mutex_unlock(&tcp->dev_lock);
        if (p == NULL)
            p = kvt__dev_host_alloc(tcp->cfg->slice_size, dev);
        return p;
    }
    return kvt__dev_host_alloc(len, dev);
}

void kvt__tcp_stage_put(kvt__tcp_t *tcp, void *p, uint64_t len)
{
    if (len <= tcp->cfg->slice_size) {
        pthread_mutex_lock(&tcp->dev_lock);
        if (tcp->stage_free == NULL)
            tcp->stage_free = calloc(STAGE_KEEP, sizeof(void *));
        if (tcp->stage_free != NULL && tcp->nstage_free < STAGE_KEEP) {
            tcp->stage_free[tcp->nstage_free++] = p;
            p = NULL;
        }
        pthread_mutex_unlock(&tcp->dev_lock);
    }
    kvt__dev_host_free(p);
}

void kvt__tcp_dev_fini(kvt__tcp_t *tcp)
{
    for (unsigned i = 0; i < tcp->nstage_free; i++)
        kvt__dev_host_free(tcp->stage_free[i]);
    free(tcp->stage_free);
    tcp->stage_free = NULL;
    tcp->nstage_free = 0;
    for (unsigned i = 0; i < TCP_DEV_STREAMS; i++) {
        kvt__dev_stream_free(tcp->tx_stream[i]);
        tcp->tx_stream[i] = NULL;
    }
}

/* Queue the copies of @f's device segments into f->stage on @ds: 0 or
 * -1 (some may be queued: wait for @ds before the buffer is reused). */
static int stage_queue(kvt__dstream_t *ds, tcp_frame_t *f)
{
    uint64_t off = 0;
    int rc = 0;

    for (uint32_t k = 0; rc == 0 && k < f->nlsegs; k++) {
        if (f->lseg_dev1[k] == 0)
            continue;
        rc = kvt__dev_copy(ds, (uint8_t *)f->stage + off, f->lsegs[k].iov_base,
                           f->lsegs[k].iov_len);
        off += f->lsegs[k].iov_len;
    }
    return rc;
}

/* Point @f's device segments at its pinned copy (@ok), or at zeros with
 * its pieces to fail. */
static void stage_point(kvt__tcp_t *tcp, tcp_frame_t *f, int ok)
{
    uint64_t off = 0;

    for (uint32_t k = 0; k < f->nlsegs; k++) {
        if (f->lseg_dev1[k] == 0)
            continue;
        f->lsegs[k].iov_base =
            ok ? (void *)((uint8_t *)f->stage + off) : tcp->zeros;
        off += f->lsegs[k].iov_len;
    }
    if (!ok)
        atomic_store(&f->dev_failed, 1);
}

/* Copy ahead the device WRITE frames behind the head, from @t on (tx_lock
 * held). */
static void frame_prefetch(tcp_conn_t *c, tcp_tx_t *t)
{
    kvt__tcp_t *tcp = c->w->tcp;
    unsigned n = 0;

    for (; t != NULL && n < TX_AHEAD; t = t->next) {
        tcp_frame_t *f = (tcp_frame_t *)t;
        int rc;
        if (t->is_resp || f->type != KVT_WIRE_WRITE || f->lseg_dev1 == NULL)
            continue;
        n++;
        if (f->stage != NULL || f->stage_ds != NULL ||
            atomic_load(&f->dev_failed) || f->stage_mixed)
            continue; /* several devices: staged at the head */
        if (c->tx_ds == NULL) {
            c->tx_ds = kvt__dev_stream_new(f->stage_dev);
            c->tx_ds_dev = f->stage_dev;
            if (c->tx_ds == NULL)
                return; /* staged at the head instead */
        }
        if (c->tx_ds_dev != f->stage_dev)
            continue;
        f->stage = kvt__tcp_stage_get(tcp, f->stage_len, f->stage_dev);
        f->stage_tcp = tcp;
        if (f->stage == NULL)
            continue; /* staged at the head, which says why */
        rc = stage_queue(c->tx_ds, f);
        f->stage_mark = c->tx_mark++ % KVT__DEV_MARKS;
        if (rc == 0)
            rc = kvt__dev_mark(c->tx_ds, f->stage_mark);
        if (rc != 0) {
            kvt__dev_sync(c->tx_ds);
            stage_point(tcp, f, 0);
            continue;
        }
        f->stage_ds = c->tx_ds;
    }
}

void kvt__tcp_frame_ready(tcp_conn_t *c, tcp_frame_t *f)
{
    kvt__tcp_t *tcp = c->w->tcp;

    if (f->stage_ds != NULL) {
        /* Copied ahead: pointed at the copy once it completed. The
         * markers cycle, so a later frame's may have been recorded over
         * this one's: it then waits for that one too, which follows it on
         * the same stream. */
        stage_point(tcp, f,
                    kvt__dev_mark_wait(f->stage_ds, f->stage_mark) == 0);
        f->stage_ds = NULL;
    } else if (f->stage == NULL && !atomic_load(&f->dev_failed)) {
        kvt__tcp_frame_stage(tcp, f);
    }
    frame_prefetch(c, f->tx.next);
}

void kvt__tcp_tx_quiesce(tcp_conn_t *c, tcp_tx_t *list)
{
    if (c->tx_ds != NULL)
        kvt__dev_sync(c->tx_ds);
    for (tcp_tx_t *t = list; t != NULL; t = t->next)
        if (!t->is_resp)
            ((tcp_frame_t *)t)->stage_ds = NULL;
}

/*
 * A WRITE frame with device segments reached the head of the send queue
 * uncopied (tx_lock held, nothing of it sent): copy them into one pinned
 * buffer and send from there. On failure the frame sends zeros for them
 * and its pieces fail with KVT_ERR_IO (the target may hold the zeros: a
 * write that failed may have landed).
 */
void kvt__tcp_frame_stage(kvt__tcp_t *tcp, tcp_frame_t *f)
{
    uint8_t used[KVT__DEV_MAX] = {0};
    uint64_t off = 0;
    int rc = 0;

    f->stage = kvt__tcp_stage_get(tcp, f->stage_len, f->stage_dev);
    f->stage_tcp = tcp;
    if (f->stage == NULL)
        rc = -1;
    pthread_mutex_lock(&tcp->dev_lock);
    /* Each segment on the stream of its own device (its copies under its
     * context), then every stream used waited for. */
    for (uint32_t k = 0; rc == 0 && k < f->nlsegs; k++) {
        struct kvt__dstream **ts;
        int dev = (int)f->lseg_dev1[k] - 1;
        if (f->lseg_dev1[k] == 0)
            continue;
        ts = &tcp->tx_stream[dev];
        if (*ts == NULL)
            *ts = kvt__dev_stream_new(dev);
        if (*ts == NULL)
            rc = -1;
        else
            rc = kvt__dev_copy(*ts, (uint8_t *)f->stage + off,
                               f->lsegs[k].iov_base, f->lsegs[k].iov_len);
        used[dev] = 1;
        off += f->lsegs[k].iov_len;
    }
    for (unsigned d = 0; d < KVT__DEV_MAX; d++)
        if (used[d] && tcp->tx_stream[d] != NULL &&
            kvt__dev_sync(tcp->tx_stream[d]) != 0)
            rc = -1;
    pthread_mutex_unlock(&tcp->dev_lock);
    stage_point(tcp, f, rc == 0);
}

/* ---- Receiving ---------------------------------------------------------- */

/* Leave the current device's stream for another: everything queued on it
 * is waited for (the ring's markers are the stream's), a failure kept for
 * the frame. */
static void stage_switch(mem_stage_t *m)
{
    for (unsigned i = 0; i < STAGE_CHUNKS; i++)
        if (m->busy[i] && kvt__dev_mark_wait(m->ds, i) != 0)
            m->switch_failed = 1;
    memset(m->busy, 0, sizeof(m->busy));
    if (kvt__dev_sync(m->ds) != 0)
        m->switch_failed = 1;
}

/* The connection's staging for copies to and from device @dev, on its
 * stream; NULL when there is none (logged). */
static mem_stage_t *stage_of(tcp_conn_t *c, int dev)
{
    mem_stage_t *m = atomic_load(&c->stage);
    kvt__dstream_t *ds;

    if (m == NULL) {
        m = calloc(1, sizeof(*m));
        if (m == NULL)
            return NULL;
        m->dev = -1;
        m->buf = kvt__dev_host_alloc((size_t)STAGE_CHUNKS * STAGE_CHUNK, dev);
        atomic_store(&c->stage, m); /* complete before others see it */
        atomic_store(&c->w->tcp->dev_staged, 1);
        if (m->buf == NULL)
            KVT_LOG_E("tcp: no staging for device memory on a connection "
                      "with %s; its device pieces fail",
                      c->who);
    }
    if (m->buf == NULL || dev < 0 || dev >= KVT__DEV_MAX)
        return NULL;
    if (m->ds != NULL && m->dev == dev)
        return m;
    ds = atomic_load(&m->by_dev[dev]);
    if (ds == NULL) {
        ds = kvt__dev_stream_new(dev);
        if (ds == NULL) {
            KVT_LOG_E("tcp: no stream on cuda:%d for a connection with %s; "
                      "its device pieces fail",
                      dev, c->who);
            return NULL;
        }
        atomic_store(&m->by_dev[dev], ds);
    }
    if (m->ds != NULL)
        stage_switch(m);
    m->ds = ds;
    m->dev = dev;
    return m;
}

static void flush_chunk(mem_stage_t *m)
{
    if (m->fill == 0)
        return;
    if (kvt__dev_copy(m->ds, (void *)(uintptr_t)m->dst,
                      m->buf + (size_t)m->cur * STAGE_CHUNK, m->fill) != 0 ||
        kvt__dev_mark(m->ds, m->cur) != 0) {
        m->failed = 1;
    } else {
        m->busy[m->cur] = 1;
    }
    m->queued = 1;
    m->cur = (m->cur + 1) % STAGE_CHUNKS;
    m->fill = 0;
}

/*
 * Receive the current segment, device memory, through the ring. Returns 1
 * when the segment is complete (or refused: its piece fails with
 * KVT_ERR_IO and its bytes go to scratch), 0 when the socket is drained,
 * -1 on EOF or error.
 */
int kvt__tcp_rx_dev(tcp_conn_t *c)
{
    uint32_t s0 = c->rx_seg;
    rx_seg_t *g = &c->rx_segs[s0];
    mem_stage_t *m = stage_of(c, (int)g->dev1 - 1);

    if (m == NULL) {
        c->rx_pstatus[g->piece] = KVT_ERR_IO;
        g->valid = 0;
        return 1;
    }
    while (c->rx_seg == s0) {
        uint64_t left = g->len - c->rx_seg_off, want;
        uint8_t *chunk = m->buf + (size_t)m->cur * STAGE_CHUNK;
        ssize_t got;

        if (m->fill == 0) {
            if (m->busy[m->cur]) {
                if (kvt__dev_mark_wait(m->ds, m->cur) != 0)
                    m->failed = 1;
                m->busy[m->cur] = 0;
            }
            m->dst = g->addr + c->rx_seg_off;
        }
        want = STAGE_CHUNK - m->fill;
        if (want > left)
            want = left;
        got = (ssize_t)kvt__tcp_pre_take(c, chunk + m->fill, want);
        if (got == 0)
            got = recv(c->fd, chunk + m->fill, want, MSG_DONTWAIT);
        if (got == 0)
            return -1;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno == EAGAIN ? 0 : -1;
        m->fill += (uint64_t)got;
        c->rx_seg_off += (uint64_t)got;
        kvt__tcp_rx_took(c, (uint64_t)got);
        if (c->rx_seg_off == g->len) {
            c->rx_seg++;
            c->rx_seg_off = 0;
        }
        if (m->fill == STAGE_CHUNK || c->rx_seg != s0)
            flush_chunk(m);
    }
    return 1;
}

/*
 * The frame's payload is in: wait for its copies to the device. A failed
 * copy fails every piece of the frame that went to device memory. 0.
 */
int kvt__tcp_rx_dev_finish(tcp_conn_t *c)
{
    mem_stage_t *m = atomic_load(&c->stage);
    int failed;

    if (m == NULL || !m->queued)
        return 0;
    flush_chunk(m);
    failed = m->failed || m->switch_failed;
    /* Each chunk's marker reports a copy before it that failed. */
    for (unsigned i = 0; i < STAGE_CHUNKS; i++)
        if (m->busy[i] && kvt__dev_mark_wait(m->ds, i) != 0)
            failed = 1;
    if (kvt__dev_sync(m->ds) != 0)
        failed = 1;
    memset(m->busy, 0, sizeof(m->busy));
    m->queued = 0;
    m->failed = 0;
    m->switch_failed = 0;
    if (failed)
        for (uint32_t s = 0; s < c->rx_nsegs; s++)
            if (c->rx_segs[s].dev1 != 0 &&
                c->rx_pstatus[c->rx_segs[s].piece] == KVT_OK)
                c->rx_pstatus[c->rx_segs[s].piece] = KVT_ERR_IO;
    return 0;
}

/* ---- A worker's copies out of device memory (READ_RESP) ------------------ */

int kvt__tcp_dev_read_stage(tcp_conn_t *c, void *dst, uint64_t src,
                            uint64_t len, int dev)
{
    mem_stage_t *m = stage_of(c, dev);

    if (m == NULL)
        return -1;
    if (kvt__dev_copy(m->ds, dst, (const void *)(uintptr_t)src, len) != 0)
        return -1;
    m->queued = 1;
    return 0;
}

/* Wait for the copies queued by kvt__tcp_dev_read_stage(): through a
 * marker of its own, which reports a copy before it that failed whoever
 * else waits on the stream (kvt__tcp_mem_changed()). */
#define READ_MARK (KVT__DEV_MARKS - 1)

int kvt__tcp_dev_read_sync(tcp_conn_t *c)
{
    mem_stage_t *m = atomic_load(&c->stage);
    int rc;

    if (m == NULL || m->ds == NULL)
        return -1;
    rc = kvt__dev_mark(m->ds, READ_MARK) != 0 ||
                 kvt__dev_mark_wait(m->ds, READ_MARK) != 0 || m->switch_failed
             ? -1
             : 0;
    m->queued = 0;
    m->switch_failed = 0;
    return rc;
}

/* Wait for the connection's queued device copies (a failing connection,
 * before its frames complete); the next frame starts with an empty ring. */
void kvt__tcp_dev_quiesce(tcp_conn_t *c)
{
    mem_stage_t *m = atomic_load(&c->stage);

    if (m == NULL || m->ds == NULL)
        return;
    kvt__dev_sync(m->ds);
    memset(m->busy, 0, sizeof(m->busy));
    m->fill = 0;
    m->queued = 0;
    m->failed = 0;
    m->switch_failed = 0;
}

/* The current segment's region left the registry while part of a chunk
 * for it was received: those bytes are dropped, never copied. */
void kvt__tcp_rx_dev_drop(tcp_conn_t *c)
{
    mem_stage_t *m = atomic_load(&c->stage);

    if (m != NULL)
        m->fill = 0;
}

void kvt__tcp_conn_stage_free(tcp_conn_t *c)
{
    mem_stage_t *m = atomic_exchange(&c->stage, NULL);

    kvt__dev_stream_free(c->tx_ds); /* waits for what is queued */
    c->tx_ds = NULL;

    if (m == NULL)
        return;
    for (unsigned i = 0; i < KVT__DEV_MAX; i++)
        kvt__dev_stream_free(m->by_dev[i]); /* waits for what is queued */
    kvt__dev_host_free(m->buf);
    free(m);
}

/*
 * The registry changed. Copies into device memory are queued with the
 * registry's read lock held, against the registry of that moment, and
 * complete later: wait for every inbound connection's queued copies, so
 * that when an unregistration returns none lands in the region. Nothing
 * to wait for while no device memory was ever staged.
 */
void kvt__tcp_mem_changed(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    if (!atomic_load(&tcp->dev_staged))
        return;
    pthread_mutex_lock(&tcp->in_lock);
    for (tcp_conn_t *c = tcp->inbound; c != NULL; c = c->inext) {
        mem_stage_t *m = atomic_load(&c->stage);
        for (unsigned i = 0; m != NULL && i < KVT__DEV_MAX; i++) {
            kvt__dstream_t *ds = atomic_load(&m->by_dev[i]);
            if (ds != NULL)
                kvt__dev_sync(ds);
        }
    }
    pthread_mutex_unlock(&tcp->in_lock);
}
