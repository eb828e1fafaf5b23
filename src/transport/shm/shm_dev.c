/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory on the same-host transport, initiator side: the copies.
 *
 * A job's segments that touch device memory on either side are copied by
 * the device, on a stream the executor takes for the job from a pool:
 * into the target's allocation opened here (shm_ipc.c), or into the
 * target's host memory through its mapping, with a 2-D copy for strided
 * pieces. Device memory here and host memory there that is not mapped
 * goes through a pinned bounce buffer and cross-memory attach. The
 * executor waits for the job's copies (an event after them) before it
 * releases the lease: a registry change, and so an unregistration, still
 * finds no copy of this session running; and a NOTIFY, which runs only
 * when nothing of its session does, follows the device copies before it.
 */
#include <stdlib.h>

#include "transport/shm/shm_sess.h"

/* The bounce buffer of one executor at a time. */
#define BOUNCE_BYTES (2u * 1024u * 1024u)
/* Idle bounce buffers kept for later jobs. */
#define BOUNCE_KEEP 8u
/* ---- Streams and bounce buffers ---------------------------------------- */

struct kvt__shm_dstream *kvt__shm_dstream_get(kvt__shm_t *shm, int dev)
{
    struct kvt__shm_dstream **pp, *d = NULL;

    pthread_mutex_lock(&shm->dev_lock);
    for (pp = &shm->dstreams; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->dev == dev) {
            d = *pp;
            *pp = d->next;
            break;
        }
    }
    pthread_mutex_unlock(&shm->dev_lock);
    if (d != NULL)
        return d;
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->dev = dev;
    d->s = kvt__dev_stream_new(dev);
    if (d->s == NULL) {
        free(d);
        return NULL;
    }
    return d;
}

void kvt__shm_dstream_put(kvt__shm_t *shm, struct kvt__shm_dstream *d)
{
    pthread_mutex_lock(&shm->dev_lock);
    d->next = shm->dstreams;
    shm->dstreams = d;
    pthread_mutex_unlock(&shm->dev_lock);
}

static struct kvt__shm_bounce *bounce_get(kvt__shm_t *shm, int dev)
{
    struct kvt__shm_bounce *b;

    pthread_mutex_lock(&shm->dev_lock);
    b = shm->bounces;
    if (b != NULL) {
        shm->bounces = b->next;
        shm->nbounces--;
    }
    pthread_mutex_unlock(&shm->dev_lock);
    if (b != NULL)
        return b;
    b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->buf = kvt__dev_host_alloc(BOUNCE_BYTES, dev);
    if (b->buf == NULL) {
        free(b);
        return NULL;
    }
    return b;
}

static void bounce_put(kvt__shm_t *shm, struct kvt__shm_bounce *b)
{
    pthread_mutex_lock(&shm->dev_lock);
    if (shm->nbounces < BOUNCE_KEEP) {
        b->next = shm->bounces;
        shm->bounces = b;
        shm->nbounces++;
        b = NULL;
    }
    pthread_mutex_unlock(&shm->dev_lock);
    if (b != NULL) {
        kvt__dev_host_free(b->buf);
        free(b);
    }
}

void kvt__shm_dev_fini(kvt__shm_t *shm)
{
    while (shm->dstreams != NULL) {
        struct kvt__shm_dstream *d = shm->dstreams;
        shm->dstreams = d->next;
        kvt__dev_stream_free(d->s);
        free(d);
    }
    while (shm->bounces != NULL) {
        struct kvt__shm_bounce *b = shm->bounces;
        shm->bounces = b->next;
        kvt__dev_host_free(b->buf);
        free(b);
    }
    shm->nbounces = 0;
}

/* ---- Copies -------------------------------------------------------------- */

/* Where piece [ra, +len) of the target is here, through an opening or a
 * mapping, or NULL. Under the lease and map_lock. */
static uint8_t *piece_ptr(shm_session_t *s, uint64_t ra, uint64_t len,
                          uint32_t access)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    const kvt__shm_region_t *r =
        kvt__shm_region_find(ch, n, ra, ra + len, access);

    if (r == NULL)
        return NULL;
    if (r->kind != KVT_MEM_HOST) {
        const ipc_t *x = kvt__shm_ipc_find(s, r->serial);
        if (x != NULL)
            return kvt__shm_at(x->local, x->base, x->len, ra, ra + len);
    } else if (r->map_id != 0) {
        const map_t *m = kvt__shm_map_find(s, r->map_id);
        if (m != NULL)
            return kvt__shm_at(m->local, m->base, m->len, ra, ra + len);
    }
    return NULL;
}

/* Queue segment @g's copy between here and @there (the target's side as
 * seen here) on @ds: 0 or -1. */
static int seg_queue(kvt__dstream_t *ds, uint32_t op, const seg_t *g,
                     uint8_t *there)
{
    uint8_t *here = (uint8_t *)(uintptr_t)g->laddr;

    if (op == KVT_OP_WRITE)
        return kvt__dev_copy2d(ds, there, g->rstride, here, g->lstride, g->len,
                               g->count);
    return kvt__dev_copy2d(ds, here, g->lstride, there, g->rstride, g->len,
                           g->count);
}

/*
 * Queue the device copies of the segments of @j marked HOW_DEV on a
 * stream of the job (p->ds, taken here also for the bounce copies), then
 * an event after them. A segment whose copy cannot be queued fails with
 * KVT_ERR_IO; a piece that is no longer reachable (resolved one by one)
 * with KVT_ERR_NOT_SUPPORTED. Under the lease and map_lock.
 */
void kvt__shm_dev_issue(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    uint32_t access = j->op == KVT_OP_WRITE ? KVT_ACCESS_REMOTE_WRITE
                                            : KVT_ACCESS_REMOTE_READ;

    p->ds = NULL;
    p->dfail = 0;
    if (p->ndev + p->nbounce == 0)
        return;
    p->ds = kvt__shm_dstream_get(s->shm, p->sdev);
    if (p->ds == NULL) {
        for (uint32_t i = 0; i < j->nsegs; i++)
            if (p->how[i] == HOW_DEV || p->how[i] == HOW_BOUNCE)
                if (j->segs[i].st == KVT_OK)
                    j->segs[i].st = KVT_ERR_IO;
        return;
    }
    for (uint32_t i = 0; i < j->nsegs && p->ndev > 0; i++) {
        seg_t *g = &j->segs[i];
        if (p->how[i] != HOW_DEV || g->st != KVT_OK)
            continue;
        if (p->dloc[i] != NULL) {
            if (seg_queue(p->ds->s, j->op, g, p->dloc[i]) != 0)
                g->st = KVT_ERR_IO, p->dfail = 1;
            continue;
        }
        for (uint32_t q = 0; q < g->count && g->st == KVT_OK; q++) {
            seg_t one = *g;
            uint8_t *there;
            one.laddr = g->laddr + q * g->lstride;
            one.raddr = g->raddr + q * g->rstride;
            one.count = 1;
            one.lstride = one.rstride = g->len;
            there = piece_ptr(s, one.raddr, one.len, access);
            if (there == NULL)
                g->st = KVT_ERR_NOT_SUPPORTED;
            else if (seg_queue(p->ds->s, j->op, &one, there) != 0)
                g->st = KVT_ERR_IO, p->dfail = 1;
        }
    }
    if (p->ndev > 0 && kvt__dev_mark(p->ds->s, 0) != 0)
        for (uint32_t i = 0; i < j->nsegs; i++)
            if (p->how[i] == HOW_DEV && j->segs[i].st == KVT_OK)
                j->segs[i].st = KVT_ERR_IO, p->dfail = 1;
}

/* Run one bounce chunk: @cnt pieces of @len bytes from piece @q of @g,
 * through @buf. Returns a status for the whole session (cross-memory
 * attach lost the target), else KVT_OK with g->st set on failure. */
static kvt_status_t bounce_chunk(shm_session_t *s, job_t *j, seg_t *g,
                                 kvt__dstream_t *ds, uint8_t *buf, uint64_t off,
                                 uint64_t len, uint64_t q, uint64_t cnt)
{
    uint8_t *here = (uint8_t *)(uintptr_t)(g->laddr + q * g->lstride + off);
    seg_t t = {.laddr = (uint64_t)(uintptr_t)buf,
               .raddr = g->raddr + q * g->rstride + off,
               .len = len,
               .lstride = len,
               .rstride = cnt > 1 ? g->rstride : len,
               .count = (uint32_t)cnt,
               .st = KVT_OK,
               .ldev = -1};
    job_t tj = {.op = j->op, .nsegs = 1, .segs = &t};
    uint8_t how = HOW_CMA;
    kvt_status_t st;

    if (j->op == KVT_OP_WRITE) {
        if (kvt__dev_copy2d(ds, buf, len, here, g->lstride, len, cnt) != 0 ||
            kvt__dev_mark(ds, 1) != 0 || kvt__dev_mark_wait(ds, 1) != 0) {
            g->st = KVT_ERR_IO;
            return KVT_OK;
        }
    }
    st = kvt__shm_cma_run(s, &tj, &how);
    if (st != KVT_OK)
        return st;
    if (t.st != KVT_OK) {
        g->st = t.st;
        return KVT_OK;
    }
    if (j->op == KVT_OP_READ &&
        (kvt__dev_copy2d(ds, here, g->lstride, buf, len, len, cnt) != 0 ||
         kvt__dev_mark(ds, 1) != 0 || kvt__dev_mark_wait(ds, 1) != 0))
        g->st = KVT_ERR_IO;
    return KVT_OK;
}

/* The segments marked HOW_BOUNCE, a bounce buffer's worth at a time. */
static kvt_status_t bounce_run(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    struct kvt__shm_bounce *b = NULL;
    kvt_status_t st = KVT_OK;

    for (uint32_t i = 0; i < j->nsegs && st == KVT_OK; i++) {
        seg_t *g = &j->segs[i];
        if (p->how[i] != HOW_BOUNCE || g->st != KVT_OK)
            continue;
        if (b == NULL && (b = bounce_get(s->shm, p->sdev)) == NULL) {
            g->st = KVT_ERR_IO;
            continue;
        }
        if (g->count == 1) {
            for (uint64_t off = 0;
                 off < g->len && g->st == KVT_OK && st == KVT_OK;) {
                uint64_t n =
                    g->len - off < BOUNCE_BYTES ? g->len - off : BOUNCE_BYTES;
                st = bounce_chunk(s, j, g, p->ds->s, b->buf, off, n, 0, 1);
                off += n;
            }
            continue;
        }
        /* Strided pieces are at most PACK_MAX bytes. */
        for (uint64_t q = 0; q < g->count && g->st == KVT_OK && st == KVT_OK;) {
            uint64_t per = BOUNCE_BYTES / g->len, cnt = g->count - q;
            if (cnt > per)
                cnt = per;
            st = bounce_chunk(s, j, g, p->ds->s, b->buf, 0, g->len, q, cnt);
            q += cnt;
        }
    }
    if (b != NULL)
        bounce_put(s->shm, b);
    return st;
}

/*
 * Wait for the job's device copies (a copy failing on the device fails
 * its segments with KVT_ERR_IO), run the bounced segments and give the
 * stream back. Before the lease is released. Returns a status for the
 * whole session, as kvt__shm_cma_run() does.
 */
kvt_status_t kvt__shm_dev_finish(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    kvt_status_t st = KVT_OK;

    if (p->ds == NULL)
        return KVT_OK;
    /* After a copy could not be queued, those queued before it may still
     * run: wait for the whole stream. */
    if (p->dfail)
        kvt__dev_sync(p->ds->s);
    if (p->ndev > 0 && kvt__dev_mark_wait(p->ds->s, 0) != 0) {
        for (uint32_t i = 0; i < j->nsegs; i++)
            if (p->how[i] == HOW_DEV && j->segs[i].st == KVT_OK)
                j->segs[i].st = KVT_ERR_IO;
    }
    if (p->nbounce > 0)
        st = bounce_run(s, j, p);
    kvt__shm_dstream_put(s->shm, p->ds);
    p->ds = NULL;
    return st;
}
