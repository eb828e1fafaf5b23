/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions: opening one to a peer on this host (through the socket its
 * descriptor section names), cutting a submission into jobs, waiter
 * progress, kill, release and destroy, and the transport's table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* Unmap and close everything the session holds on the target. */
static void release_resources(shm_session_t *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    for (size_t i = 0; i < s->nmaps; i++)
        munmap(s->maps[i].local, s->maps[i].len);
    s->nmaps = 0;
    atomic_store(&s->mapped, 0);
    pthread_rwlock_unlock(&s->map_lock);
    kvt__shm_ipcs_release(s);
    if (s->ch != NULL)
        munmap(s->ch, s->ch_len);
    s->ch = NULL;
    if (s->sock >= 0)
        close(s->sock);
    if (s->pidfd >= 0)
        close(s->pidfd);
    if (s->statfd >= 0)
        close(s->statfd);
    s->sock = s->pidfd = s->statfd = -1;
}

static void pool_unlink(shm_session_t *s)
{
    kvt__shm_t *shm = s->shm;
    shm_session_t **pp;

    pthread_mutex_lock(&shm->pool_lock);
    for (pp = &shm->sessions; s->linked && *pp != NULL; pp = &(*pp)->next_all) {
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    }
    s->linked = 0;
    pthread_mutex_unlock(&shm->pool_lock);
}

/*
 * Once dead with nothing in flight (by whoever observes that first):
 * kvt__shm_release what the session holds on the target, leave the pool's list
 * and drop the session's reference. The session may be freed before
 * this returns; the caller does not touch it afterwards.
 */
void kvt__shm_release(shm_session_t *s)
{
    release_resources(s);
    pool_unlink(s);
    kvt__session_release(&s->base);
}

typedef struct {
    job_t *jobs; /* NULL: count only */
    seg_t *segs;
    size_t nj, ns; /* used so far */
    job_t *cur;    /* the job being filled (fill run only) */
    int open;
    uint32_t cur_op;
    uint32_t cur_nsegs;
    kvt__comp_t *cur_comp; /* of its last segment */
    uint64_t cur_bytes;
    uint32_t *pieces; /* per descriptor of the submission */
    /* The bytes not yet planned and the open job's size
     * (kvt__shm_job_size()). */
    uint64_t left, target;
    unsigned share;
} plan_t;

uint64_t kvt__shm_job_size(uint64_t left, unsigned share)
{
    uint64_t t = share ? left / share : JOB_MAX;

    return t < JOB_MIN ? JOB_MIN : t > JOB_MAX ? JOB_MAX : t;
}

static void plan_open(plan_t *p, uint32_t op, uint64_t dl)
{
    if (p->jobs != NULL) {
        job_t *j = &p->jobs[p->nj];
        memset(j, 0, sizeof(*j));
        j->op = op;
        j->deadline = dl;
        j->segs = &p->segs[p->ns];
        p->cur = j;
    }
    p->nj++;
    p->open = 1;
    p->cur_op = op;
    p->cur_nsegs = 0;
    p->cur_bytes = 0;
    p->target = kvt__shm_job_size(p->left, p->share);
}

/* Append a segment to the open job; a descriptor's pieces are the jobs
 * its segments fall in. */
static void plan_add(plan_t *p, size_t i, const seg_t *g)
{
    uint64_t bytes = g->len * g->count;

    if (p->cur_nsegs == 0 || p->cur_comp != g->comp)
        p->pieces[i]++;
    if (p->jobs != NULL) {
        p->cur->segs[p->cur_nsegs] = *g;
        p->cur->nsegs++;
        p->cur->bytes += bytes;
    }
    p->cur_comp = g->comp;
    p->cur_nsegs++;
    p->cur_bytes += bytes;
    p->left -= p->left < bytes ? p->left : bytes;
    p->ns++;
}

/*
 * Cut descriptors into jobs. Run twice: with p->jobs NULL it only counts
 * jobs, segments and each descriptor's pieces; then it fills the arrays
 * the first run sized. A descriptor's remote range is what must lie in one
 * region (each piece's, for the strided form), so that one crossing a
 * region's end is refused whole even when it is cut across jobs.
 */
static void plan_run(plan_t *p, const kvt__xfer_t *x, size_t n, uint64_t total,
                     uint64_t dl)
{
    p->left = total;
    for (size_t i = 0; i < n; i++) {
        const kvt__xfer_t *d = &x[i];
        kvt__comp_t *comp = d->comp;
        uint32_t c = d->count;
        uint64_t L = d->len, ls = d->lstride, rs = d->rstride, la = d->laddr;
        int32_t ldev = d->lkind != KVT_MEM_HOST ? d->ldev : -1;

        p->pieces[i] = 0;
        if (d->op == KVT_OP_NOTIFY) {
            seg_t g = {.count = 1, .st = KVT_OK, .ldev = -1, .comp = comp};
            plan_open(p, KVT_OP_NOTIFY, dl);
            if (p->jobs != NULL) {
                p->cur->nlen = (uint32_t)L;
                p->cur->msg = (uint8_t *)(uintptr_t)la; /* copied later */
            }
            plan_add(p, i, &g);
            p->open = 0;
            continue;
        }
        /* Small strided pieces: runs of whole pieces, as many as the
         * job has room for, the run's span in one region. */
        for (uint32_t k = 0; c > 1 && L <= PACK_MAX && k < c;) {
            uint64_t room, cnt;
            seg_t g;
            if (!p->open || p->cur_op != d->op || p->cur_bytes >= p->target ||
                p->cur_nsegs >= JOB_SEGS)
                plan_open(p, d->op, dl);
            room = p->target - p->cur_bytes;
            cnt = room / L ? room / L : 1;
            if (cnt > c - k)
                cnt = c - k;
            g = (seg_t){.laddr = la + k * ls,
                        .raddr = d->raddr + k * rs,
                        .len = L,
                        .lstride = ls,
                        .rstride = rs,
                        .count = (uint32_t)cnt,
                        .st = KVT_OK,
                        .ldev = ldev,
                        .comp = comp};
            g.vlo = g.raddr;
            g.vhi = g.raddr + (cnt - 1) * rs + L;
            plan_add(p, i, &g);
            k += (uint32_t)cnt;
        }
        for (uint32_t k = 0; !(c > 1 && L <= PACK_MAX) && k < c; k++) {
            uint64_t ra = d->raddr + k * rs, off = 0;
            uint64_t vlo = c == 1 ? d->raddr : ra;
            while (off < L) {
                seg_t g;
                if (!p->open || p->cur_op != d->op ||
                    p->cur_bytes >= p->target || p->cur_nsegs >= JOB_SEGS)
                    plan_open(p, d->op, dl);
                g = (seg_t){.laddr = la + k * ls + off,
                            .raddr = ra + off,
                            .len = L - off,
                            .count = 1,
                            .vlo = vlo,
                            .vhi = vlo + L,
                            .st = KVT_OK,
                            .ldev = ldev,
                            .comp = comp};
                if (g.len > p->target - p->cur_bytes)
                    g.len = p->target - p->cur_bytes;
                g.lstride = g.rstride = g.len;
                plan_add(p, i, &g);
                off += g.len;
            }
        }
    }
}

static kvt_status_t shm_submit(kvt__session_t *base, const kvt__xfer_t *x,
                               size_t n, kvt__sub_t *hint)
{
    shm_session_t *s = (shm_session_t *)base;
    kvt__shm_t *shm = s->shm;
    uint64_t total = 0, dl;
    unsigned copiers;
    plan_t p = {0};
    job_block_t *blk;
    size_t msgs = 0, nj, ns;
    uint8_t *mp;
    job_t *list = NULL;
    int dead;

    p.pieces = malloc(n * sizeof(uint32_t));
    if (p.pieces == NULL)
        return KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (x[i].op == KVT_OP_NOTIFY)
            msgs += x[i].len;
        else
            total += kvt__xfer_bytes(&x[i]);
    }
    /* Spread a large submission over every executor that may copy at
     * once (kvt__shm_room()), in jobs that shrink towards its end
     * (kvt__shm_job_size()); keep a small one in one job, whose hand-off
     * would cost more than the copy it shares. */
    copiers = 1 + shm->nworkers < shm->ncpu ? 1 + shm->nworkers : shm->ncpu;
    p.share = total < SPLIT_MIN || copiers < 2 ? 0 : 2 * copiers;
    dl = kvt__now_ns() + shm->cfg->timeout_ns;
    plan_run(&p, x, n, total, dl);
    nj = p.nj;
    ns = p.ns;
    blk = malloc(sizeof(*blk) + nj * sizeof(job_t) + ns * sizeof(seg_t) + msgs);
    if (blk == NULL) {
        free(p.pieces);
        return KVT_ERR_NO_MEMORY;
    }
    atomic_init(&blk->refs, (uint32_t)nj);
    p.jobs = (job_t *)(blk + 1);
    p.segs = (seg_t *)(p.jobs + nj);
    mp = (uint8_t *)(p.segs + ns);
    p.nj = p.ns = 0;
    p.open = 0;
    plan_run(&p, x, n, total, dl);
    for (size_t i = 0; i < nj; i++) {
        job_t *j = &p.jobs[i];
        j->blk = blk;
        j->next = i + 1 < nj ? &p.jobs[i + 1] : NULL;
        if (j->op == KVT_OP_NOTIFY) { /* copied at submission */
            memcpy(mp, j->msg, j->nlen);
            j->msg = mp;
            mp += j->nlen;
        }
    }
    /* Every descriptor's count is set before any job can complete. */
    for (size_t i = 0; i < n; i++)
        kvt__comp_expect(x[i].comp, p.pieces[i]);
    free(p.pieces);
    if (nj > 0)
        list = &p.jobs[0];

    kvt__sub_note(hint, s);
    pthread_mutex_lock(&s->lock);
    dead = atomic_load(&s->base.dead);
    if (!dead && list != NULL) {
        if (s->tail)
            s->tail->next = list;
        else
            s->head = list;
        s->tail = &p.jobs[nj - 1];
    }
    pthread_mutex_unlock(&s->lock);
    if (dead) {
        kvt__shm_fail_list(list, dead);
        return KVT_OK;
    }
    /* A thread that waits at once runs a job itself (shm_progress()):
     * no worker is woken for that one. */
    kvt__shm_submit_wake(shm, (unsigned)nj - (hint->will_wait && nj > 0),
                         hint->plugged);
    return KVT_OK;
}

/*
 * Waiter progress: run this session's jobs from the thread waiting for
 * them until *@until reads 0, the queue offers nothing, or @deadline_ns
 * passes; the caller then sleeps on the batch. Only jobs whose own
 * deadline comes no later than @deadline_ns: a job that waits for its
 * target would otherwise hold the thread past the wait's timeout.
 */
static kvt_status_t shm_progress(kvt__session_t *base, void *where,
                                 const _Atomic uint32_t *until,
                                 uint64_t deadline_ns, int attached)
{
    shm_session_t *s = where;
    int left = 0;

    (void)attached; /* shm attaches nothing (kvt__sub_t.attached) */
    kvt__shm_copier_enter(s->shm, 1);
    while (atomic_load_explicit(until, memory_order_acquire) != 0) {
        job_t *j = NULL;
        int late = deadline_ns != 0 && kvt__now_ns() >= deadline_ns;
        pthread_mutex_lock(&s->lock);
        /* A job may wait for its target up to its own deadline (staged
         * pieces, a stopped target): this thread runs it only when that
         * cannot outlast the wait's. */
        if (!late && (deadline_ns == 0 ||
                      (s->head != NULL && s->head->deadline <= deadline_ns)))
            j = kvt__shm_take_locked(s);
        left = j == NULL && s->head != NULL;
        pthread_mutex_unlock(&s->lock);
        if (j == NULL)
            break;
        kvt__shm_job_run(s, j, deadline_ns);
    }
    /* Jobs this thread leaves queued while its batch is pending (their
     * deadline outlasts the wait's, or the wait's passed) go to a worker:
     * their submitter may have woken none, counting on this thread
     * (kvt__sub_t.will_wait). */
    if (left)
        kvt__shm_pool_wake(s->shm, 1);
    /* What is left is running on a worker (which may have taken the job
     * before this thread came) and usually ends within microseconds:
     * poll for it rather than sleep and be woken. */
    {
        uint64_t end = kvt__now_ns() + WAIT_SPIN_NS;
        if (deadline_ns != 0 && deadline_ns < end)
            end = deadline_ns;
        while (atomic_load_explicit(until, memory_order_acquire) != 0 &&
               kvt__now_ns() < end)
            cpu_relax();
    }
    kvt__shm_copier_leave(s->shm);
    return KVT_OK;
}

void kvt__shm_session_kill(kvt__session_t *base, kvt_status_t why)
{
    shm_session_t *s = (shm_session_t *)base;
    int32_t zero = 0;
    int release_now = 0, idle;
    job_t *list, *parked;

    if (!atomic_compare_exchange_strong(&base->dead, &zero, why))
        return;
    kvt__session_evict(base);
    pthread_mutex_lock(&s->lock);
    list = s->head;
    s->head = s->tail = NULL;
    parked = s->parked;
    s->parked = NULL;
    idle = list == NULL && parked == NULL && s->inflight == 0;
    if (s->inflight == 0 && !s->released) {
        s->released = 1;
        release_now = 1;
    }
    pthread_mutex_unlock(&s->lock);
    /* A peer gone while nothing was in flight (it exited, or destroyed
     * its engine) left in order: nothing failed. */
    if (why == KVT_ERR_CONN_LOST && idle)
        KVT_LOG_I("shm session to %s: the peer left, nothing in flight",
                  base->name);
    else if (why != KVT_ERR_CANCELED)
        KVT_LOG_W("shm session to %s failed: %s", base->name,
                  kvt_status_str(why));
    kvt__shm_session_unhold(s);
    kvt__shm_fail_list(list, why);
    kvt__shm_parked_end(s, parked, why); /* the last one releases */
    if (release_now)
        kvt__shm_release(s);
}

/*
 * Free the session: it released itself (dead, nothing in flight), or the
 * engine is being torn down with the pool stopped and every session
 * killed (kvt__shm_stop()).
 */
static void session_destroy(kvt__session_t *base)
{
    shm_session_t *s = (shm_session_t *)base;

    if (!s->released)
        release_resources(s);
    pool_unlink(s);
    free(s->maps);
    free(s->ipcs);
    pthread_mutex_destroy(&s->sock_lock);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static kvt_status_t shm_session_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                                     kvt__session_t **s_p, const char **why)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    uint64_t t0 = kvt__now_ns();
    kvt__segdesc_t d = {0};
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t plen = 0;
    pthread_rwlockattr_t ra;
    shm_session_t *s;
    kvt_status_t st;
    int bad;

    memcpy(d.name, peer->desc->name, sizeof(d.name));
    d.host_id = peer->desc->host_id;
    d.pid = peer->desc->pid;
    bad = kvt__shm_section_sock(kvt__segdesc_tl(peer->desc, KVT_TRANSPORT_SHM),
                                path, &plen);
    if (bad) {
        *why = "the peer's shm section is malformed";
        return KVT_ERR_PROTOCOL;
    }

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        *why = "out of memory";
        return KVT_ERR_NO_MEMORY;
    }
    s->sock = s->pidfd = s->statfd = -1;
    s->pid = (pid_t)d.pid;
    s->shm = shm;
    snprintf(s->base.name, sizeof(s->base.name), "%s", peer->name);
    st = kvt__shm_chan_connect(s, &d, path, plen, why);
    if (st != KVT_OK)
        goto err_free;

    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->sock_lock, NULL);
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->map_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    atomic_store(&s->map_seq, UINT64_MAX);
    /* Half of what is left of the connect timeout at most. */
    {
        uint64_t now = kvt__now_ns();
        uint64_t end = t0 + shm->cfg->connect_timeout_ms * 1000000ull;
        if (now < end)
            kvt__shm_maps_prefetch(s, now + (end - now) / 2);
    }

    pthread_mutex_lock(&shm->pool_lock);
    st = kvt__shm_pool_start_locked(shm);
    if (st == KVT_OK) {
        kvt__session_init(&s->base, tl, peer);
        s->next_all = shm->sessions;
        shm->sessions = s;
        s->linked = 1;
    }
    pthread_mutex_unlock(&shm->pool_lock);
    if (st != KVT_OK) {
        *why = "cannot start worker threads";
        for (size_t i = 0; i < s->nmaps; i++)
            munmap(s->maps[i].local, s->maps[i].len);
        free(s->maps);
        pthread_rwlock_destroy(&s->map_lock);
        pthread_mutex_destroy(&s->sock_lock);
        pthread_mutex_destroy(&s->lock);
        goto err_free;
    }
    *s_p = &s->base;
    return KVT_OK;

err_free:
    if (s->ch != NULL)
        munmap(s->ch, s->ch_len);
    if (s->sock >= 0)
        close(s->sock);
    if (s->pidfd >= 0)
        close(s->pidfd);
    if (s->statfd >= 0)
        close(s->statfd);
    free(s);
    return st;
}

/* A peer is reachable when its shm section names a socket (the open then
 * checks that the process behind it is the one the descriptor names). */
static int shm_reachable(kvt__tl_t *tl, const kvt__segdesc_t *d,
                         const char **why_p)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t len;

    (void)tl;
    if (kvt__shm_section_sock(kvt__segdesc_tl(d, KVT_TRANSPORT_SHM), path,
                              &len) != 0) {
        *why_p = "the peer's shm section is malformed";
        return 0;
    }
    return 1;
}

/* Device memory through the driver's same-host sharing (shm_dev.c), when a
 * device memory domain is built; an engine whose process finds no driver
 * leaves it out (kvt__shm_create()). */
#ifdef KVT_HAVE_CUDA
#define SHM_MEM (KVT__MEM_BIT(KVT_MEM_HOST) | KVT__MEM_BIT(KVT_MEM_CUDA))
#else
#define SHM_MEM KVT__MEM_BIT(KVT_MEM_HOST)
#endif

/* clang-format off */
KVT_TRANSPORT_REGISTER(shm, {
    .name = "shm",
    .id = KVT_TRANSPORT_SHM,
    .caps = {.local_mem = SHM_MEM,
             .remote_mem = SHM_MEM,
             .flags = KVT__TL_SAME_HOST | KVT__TL_STRIDED | KVT__TL_DEV_DRIVER,
             .priority = 100},
    .create = kvt__shm_create,
    .stop = kvt__shm_stop,
    .destroy = kvt__shm_destroy,
    .describe = kvt__shm_describe,
    .mem_changed = kvt__shm_registry_changed,
    .reachable = shm_reachable,
    .open = shm_session_open,
    .submit = shm_submit,
    .progress = shm_progress,
    .flush = kvt__shm_flush,
    .kill = kvt__shm_session_kill,
    .served = kvt__shm_served,
    .destroy_session = session_destroy,
});
/* clang-format on */
