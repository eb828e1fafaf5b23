/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory on the same-host transport, initiator side.
 *
 * The target's device regions are reached through the driver's sharing:
 * the initiator asks the target (an IPC request on the socket, naming the
 * region by its start and serial) for the handle of the allocation that
 * holds it, opens it once per region and keeps it open while the region
 * is in the snapshot (under map_lock, as mappings are). A job's segments
 * that touch device memory on either side are copied by the device, on a
 * stream the executor takes for the job from a pool: into the opened
 * allocation, or into the target's host memory through its mapping, with
 * a 2-D copy for strided pieces. Device memory here and host memory there
 * that is not mapped goes through a pinned bounce buffer and cross-memory
 * attach. The executor waits for the job's copies (an event after them)
 * before it releases the lease: a registry change, and so an
 * unregistration, still finds no copy of this session running; and a
 * NOTIFY, which runs only when nothing of its session does, follows the
 * device copies before it.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* The bounce buffer of one executor at a time. */
#define BOUNCE_BYTES (2u * 1024u * 1024u)
/* Idle bounce buffers kept for later jobs. */
#define BOUNCE_KEEP 8u

/* With map_lock held. */
const ipc_t *kvt__shm_ipc_find(shm_session_t *s, uint32_t serial)
{
    for (size_t i = 0; i < s->nipcs; i++)
        if (s->ipcs[i].serial == serial)
            return &s->ipcs[i];
    return NULL;
}

/* With map_lock held. */
int kvt__shm_ipc_refused(shm_session_t *s, uint32_t serial)
{
    for (unsigned i = 0; i < s->nnoipc; i++)
        if (s->noipc[i] == serial)
            return 1;
    return 0;
}

static void ipc_close(ipc_t *x)
{
    KVT_LOG_D("shm: closing device allocation %#llx of the target",
              (unsigned long long)x->base);
    if (x->dev >= 0)
        kvt__dev_ipc_close(x->local, x->dev);
}

void kvt__shm_dev_refused(shm_session_t *s, const char *why)
{
    if (!atomic_exchange(&s->dev_said, 1))
        KVT_LOG_W("shm: device memory of %s cannot be opened in this "
                  "process (%s); transfers with it are staged through the "
                  "target's memory",
                  s->base.name, why);
}

/* Wait for the socket to be readable until @deadline: KVT_OK, or
 * KVT_ERR_TIMEDOUT. */
static kvt_status_t sock_wait(int sock, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        uint64_t now = kvt__now_ns();
        int ms, r;
        if (now >= deadline)
            return KVT_ERR_TIMEDOUT;
        ms = (int)((deadline - now + 999999) / 1000000);
        r = poll(&pf, 1, ms > 100 ? 100 : ms);
        if (r > 0)
            return KVT_OK;
        if (r < 0 && errno != EINTR)
            return KVT_OK; /* the receive says what is wrong */
    }
}

/*
 * Ask the target for the handle of device region @serial (starting at
 * @start) and open it, outside the lease (the target answers from its
 * service thread). A refusal is remembered until the snapshot changes.
 * Returns KVT_OK once answered (opened or refused), KVT_ERR_TIMEDOUT when
 * no answer came by @deadline (a stopped target), KVT_ERR_CONN_LOST when
 * the socket broke.
 */
kvt_status_t kvt__shm_ipc_request(shm_session_t *s, uint32_t serial,
                                  uint64_t start, uint64_t deadline)
{
    kvt__shm_msg_t m, a;
    const char *why = "a malformed answer";
    char wbuf[sizeof(a.name)];
    void *local = NULL;
    int fd = -1, known, dev = -1, opened = 0;
    kvt_status_t st = KVT_OK;

    pthread_mutex_lock(&s->sock_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    known =
        kvt__shm_ipc_find(s, serial) != NULL || kvt__shm_ipc_refused(s, serial);
    pthread_rwlock_unlock(&s->map_lock);
    if (known)
        goto out;
    kvt__shm_msg_init(&m, KVT_SHM_IPC);
    m.id = serial;
    m.addr = start;
    m.seq = ++s->req_seq;
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m)) {
        st = errno == EAGAIN ? KVT_ERR_TIMEDOUT : KVT_ERR_CONN_LOST;
        goto out;
    }
    for (;;) { /* skip answers to requests that timed out earlier */
        ssize_t got;
        st = sock_wait(s->sock, deadline);
        if (st != KVT_OK)
            goto out;
        got = kvt__shm_recv_msg(s->sock, &a, &fd);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got != (ssize_t)sizeof(a) || a.magic != KVT_SHM_MAGIC ||
            (a.type != KVT_SHM_MAP_ACK && a.type != KVT_SHM_IPC_ACK) ||
            (a.seq == m.seq && a.type != KVT_SHM_IPC_ACK)) {
            st = KVT_ERR_CONN_LOST;
            goto out;
        }
        if (fd >= 0)
            close(fd); /* no answer to an IPC request carries one */
        fd = -1;
        if (a.seq == m.seq)
            break;
    }
    if (a.status != KVT_OK) {
        memcpy(wbuf, a.name, sizeof(wbuf));
        wbuf[sizeof(wbuf) - 1] = '\0';
        why = wbuf;
        goto record;
    }
    /* The allocation must hold the region's start. */
    why = "a malformed answer";
    if (a.id != serial || a.length == 0 || a.addr > UINT64_MAX - a.length ||
        start < a.addr || start >= a.addr + a.length || a.pid > INT16_MAX)
        goto record;
    if (s->pid == getpid()) {
        /* An engine of this process: its device addresses are ours. */
        local = (void *)(uintptr_t)a.addr;
        opened = 1;
    } else {
        /* Under the context of the device that holds it, or else the
         * first device (the numbering may differ between processes). */
        dev = (int)a.pid;
        opened = kvt__dev_ipc_open(a.handle, dev, &local, &why) == 0;
        if (!opened && dev != 0) {
            dev = 0;
            opened = kvt__dev_ipc_open(a.handle, dev, &local, &why) == 0;
        }
    }
record:
    pthread_rwlock_wrlock(&s->map_lock);
    if (opened && s->nipcs == s->icap) {
        size_t cap = s->icap ? 2 * s->icap : 8;
        ipc_t *n = realloc(s->ipcs, cap * sizeof(*n));
        if (n == NULL) {
            if (dev >= 0)
                kvt__dev_ipc_close(local, dev);
            opened = 0;
            why = "out of memory";
        } else {
            s->ipcs = n;
            s->icap = cap;
        }
    }
    if (opened) {
        s->ipcs[s->nipcs++] =
            (ipc_t){serial, dev, a.addr, a.length, (uint8_t *)local};
        KVT_LOG_D("shm: opened device allocation %#llx (%llu bytes) of %s",
                  (unsigned long long)a.addr, (unsigned long long)a.length,
                  s->base.name);
    } else {
        if (s->nnoipc < NOMAP_MAX)
            s->noipc[s->nnoipc++] = serial;
        kvt__shm_dev_refused(s, why);
    }
    pthread_rwlock_unlock(&s->map_lock);
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&s->sock_lock);
    return st;
}

/* Close the openings of device regions that left the snapshot, and
 * forget refusals. With map_lock held for writing, under the lease. */
void kvt__shm_ipcs_reconcile_locked(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    size_t k = 0;

    for (size_t i = 0; i < s->nipcs; i++) {
        int named = 0;
        for (uint32_t r = 0; r < n && !named; r++)
            named = ch->regions[r].kind != KVT_MEM_HOST &&
                    ch->regions[r].serial == s->ipcs[i].serial;
        if (named)
            s->ipcs[k++] = s->ipcs[i];
        else
            ipc_close(&s->ipcs[i]);
    }
    s->nipcs = k;
    s->nnoipc = 0;
}

/* Close every opening (the session is released). */
void kvt__shm_ipcs_release(shm_session_t *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    for (size_t i = 0; i < s->nipcs; i++)
        ipc_close(&s->ipcs[i]);
    s->nipcs = 0;
    pthread_rwlock_unlock(&s->map_lock);
}

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
