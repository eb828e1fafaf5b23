/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Running jobs: checking every segment against the target's snapshot
 * under the lease and choosing how to copy it (mapping, staging, cross-
 * memory attach), the copies, the two jobs of a pair, and the accounting
 * of a job that has run (completed, parked for a stopped target, failed).
 */
#include <stdio.h>
#include <stdlib.h>

#include "transport/shm/shm_sess.h"
#include "util/time.h"

static void job_done(shm_session_t *s, job_t *j);
static void job_end(shm_session_t *s, job_t *j, int park);

const kvt__shm_region_t *kvt__shm_region_find(const kvt__shm_chan_t *ch,
                                              uint32_t n, uint64_t lo,
                                              uint64_t hi, uint32_t access)
{
    uint32_t a = 0, b = n;

    while (a < b) { /* first region ending above lo */
        uint32_t mid = a + (b - a) / 2;
        if (ch->regions[mid].end <= lo)
            a = mid + 1;
        else
            b = mid;
    }
    if (a >= n || ch->regions[a].start > lo || hi > ch->regions[a].end ||
        (ch->regions[a].access & access) != access)
        return NULL;
    return &ch->regions[a];
}

/* Whether each piece of a strided segment lies in one region with
 * @access (the segment's span need not). */
static int pieces_registered(const kvt__shm_chan_t *ch, uint32_t n,
                             const seg_t *g, uint32_t access)
{
    for (uint32_t q = 0; q < g->count; q++) {
        uint64_t a = g->raddr + q * g->rstride;
        if (kvt__shm_region_find(ch, n, a, a + g->len, access) == NULL)
            return 0;
    }
    return 1;
}

/* Whether some piece of a strided segment lies in device memory there
 * (each piece is registered). */
static int pieces_on_device(const kvt__shm_chan_t *ch, uint32_t n,
                            const seg_t *g, uint32_t access)
{
    for (uint32_t q = 0; q < g->count; q++) {
        uint64_t a = g->raddr + q * g->rstride;
        const kvt__shm_region_t *r =
            kvt__shm_region_find(ch, n, a, a + g->len, access);
        if (r != NULL && r->kind != KVT_MEM_HOST)
            return 1;
    }
    return 0;
}

/* The device of the job's stream: this side's, else the one the target's
 * memory was opened under. */
static void dev_stream_of(rw_plan_t *p, const seg_t *g, int dev)
{
    if (p->ndev + p->nbounce == 0)
        p->sdev = g->ldev >= 0 ? g->ldev : dev >= 0 ? dev : 0;
}

/*
 * Plan segment @i of @j, which touches device memory on either side
 * (@r: the region holding its span, or NULL when only each piece lies in
 * one). Device memory there needs the target's allocation opened here;
 * host memory there with device memory here, a mapping (else the bounce
 * buffer). What is not at hand yet is asked for (p->need: the job is
 * tried again once it is) unless @final or refused before: device memory
 * there then goes through the staging slots, which the target copies.
 */
static void dev_plan(shm_session_t *s, const kvt__shm_chan_t *ch, uint32_t n,
                     seg_t *g, uint32_t i, const kvt__shm_region_t *r,
                     uint32_t access, rw_plan_t *p, int final)
{
    uint64_t end = g->raddr + (g->count - 1) * g->rstride + g->len;

    if (r == NULL) {
        int stage = 0, miss = 0;
        if (!pieces_on_device(ch, n, g, access)) {
            dev_stream_of(p, g, -1);
            p->how[i] = HOW_BOUNCE;
            p->nbounce++;
            return;
        }
        /* Each piece reachable here (shm_dev.c resolves them one by one):
         * its device region opened (every one missing is asked for), its
         * host region mapped; else the segment goes through the staging
         * slots. */
        for (uint32_t q = 0; q < g->count && !stage; q++) {
            uint64_t a = g->raddr + q * g->rstride;
            const kvt__shm_region_t *x =
                kvt__shm_region_find(ch, n, a, a + g->len, access);
            if (x->kind == KVT_MEM_HOST) {
                stage =
                    x->map_id == 0 || kvt__shm_map_find(s, x->map_id) == NULL;
            } else if (kvt__shm_ipc_find(s, x->serial) == NULL) {
                if (final || kvt__shm_ipc_refused(s, x->serial)) {
                    kvt__shm_dev_refused(s, "its device memory could not be "
                                            "opened");
                    stage = 1;
                } else {
                    kvt__shm_ipc_want(p, x->serial, x->start);
                    miss = 1;
                }
            }
        }
        if (!stage && miss) {
            p->need++;
            return;
        }
        if (stage) {
            p->how[i] = HOW_STAGE;
            p->nstage++;
            return;
        }
        dev_stream_of(p, g, -1);
        p->how[i] = HOW_DEV;
        p->dloc[i] = NULL;
        p->ndev++;
        return;
    }
    if (r->kind != KVT_MEM_HOST) {
        const ipc_t *x = kvt__shm_ipc_find(s, r->serial);
        uint8_t *at =
            x ? kvt__shm_at(x->local, x->base, x->len, g->raddr, end) : NULL;
        if (at != NULL) {
            dev_stream_of(p, g, x->dev);
            p->how[i] = HOW_DEV;
            p->dloc[i] = at;
            p->ndev++;
            return;
        }
        if (x == NULL && !final && !kvt__shm_ipc_refused(s, r->serial)) {
            kvt__shm_ipc_want(p, r->serial, r->start);
            p->need++;
            return;
        }
        /* Not shared by the driver (or past the allocation it holds):
         * through the target, which copies the slots itself. */
        kvt__shm_dev_refused(s, "its device memory could not be opened");
        p->how[i] = HOW_STAGE;
        p->nstage++;
        return;
    }
    /* Host memory there, device memory here. */
    if (r->map_id != 0) {
        const map_t *m = kvt__shm_map_find(s, r->map_id);
        uint8_t *at =
            m ? kvt__shm_at(m->local, m->base, m->len, g->raddr, end) : NULL;
        if (at != NULL) {
            dev_stream_of(p, g, -1);
            p->how[i] = HOW_DEV;
            p->dloc[i] = at;
            p->ndev++;
            return;
        }
        if (m == NULL && !final && !kvt__shm_map_refused(s, r->map_id)) {
            p->want_map = r->map_id;
            p->need++;
            return;
        }
    }
    dev_stream_of(p, g, -1);
    p->how[i] = HOW_BOUNCE;
    p->nbounce++;
}

/* Fail the segments of [from, to) that are still OK. */
void kvt__shm_segs_fail(job_t *j, uint32_t from, uint32_t to, kvt_status_t st)
{
    for (uint32_t i = from; i < to; i++)
        if (j->segs[i].st == KVT_OK)
            j->segs[i].st = st;
}

/*
 * Take the lease and map_lock (read) and check every segment of a READ or
 * WRITE job against the snapshot: one outside the target's registry (or
 * its access rights) fails with KVT_ERR_ACCESS and is not touched; the
 * others are marked for a mapping, the staging slots or cross-memory
 * attach. 0: both held, @p filled. -1: the lease could not be had (the
 * job failed, the session killed). With @try, nothing is waited for: 1
 * when the lease is closed, the mappings are to be reconciled or
 * map_lock is taken (nothing held, nothing done; run the job alone).
 */
static int rw_begin(shm_session_t *s, job_t *j, rw_plan_t *p, int try,
                    int final)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t access = j->op == KVT_OP_WRITE ? KVT_ACCESS_REMOTE_WRITE
                                            : KVT_ACCESS_REMOTE_READ;
    uint32_t n;
    kvt_status_t st;

    if (try) {
        uint32_t l;
        if (kvt__shm_session_status(s) != KVT_OK || !kvt__shm_lease_try(s, &l))
            return 1;
        if (ch->snap_seq != atomic_load(&s->map_seq) ||
            pthread_rwlock_tryrdlock(&s->map_lock) != 0) {
            kvt__shm_lease_release(s);
            return 1;
        }
    } else {
        st = kvt__shm_lease_acquire(s, j->deadline);
        if (st != KVT_OK) {
            kvt__shm_segs_fail(j, 0, j->nsegs, st);
            kvt__shm_session_kill(&s->base, st);
            return -1;
        }
        if (ch->snap_seq != atomic_load(&s->map_seq))
            kvt__shm_maps_reconcile(s);
        pthread_rwlock_rdlock(&s->map_lock);
    }
    p->ncma = p->nmap = p->nstage = p->want_map = 0;
    p->ndev = p->nbounce = p->need = p->nwant = 0;
    p->map_seq = atomic_load(&s->map_seq);
    p->ds = NULL;
    n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    for (uint32_t i = 0; i < j->nsegs; i++) {
        seg_t *g = &j->segs[i];
        const kvt__shm_region_t *r =
            kvt__shm_region_find(ch, n, g->vlo, g->vhi, access);
        const map_t *m = NULL;
        uint64_t end = g->raddr + (g->count - 1) * g->rstride + g->len;

        p->how[i] = HOW_NONE;
        p->loc[i] = NULL;
        /* Without a region for the span, a strided segment may still have
         * each piece in one (never then in one mapping). */
        if (r == NULL &&
            !(g->count > 1 && pieces_registered(ch, n, g, access))) {
            g->st = KVT_ERR_ACCESS;
            continue;
        }
        if (g->ldev >= 0 || (r != NULL ? r->kind != KVT_MEM_HOST
                                       : pieces_on_device(ch, n, g, access))) {
            dev_plan(s, ch, n, g, i, r, access, p, final);
            continue;
        }
        if (r != NULL && r->map_id != 0) {
            m = kvt__shm_map_find(s, r->map_id);
            if (m == NULL && p->want_map == 0)
                p->want_map = r->map_id;
        }
        if (m != NULL && (p->loc[i] = kvt__shm_at(m->local, m->base, m->len,
                                                  g->raddr, end)) != NULL) {
            p->how[i] = HOW_MAP;
            p->nmap++;
        } else if (j->op == KVT_OP_WRITE && g->count > 1 &&
                   g->len <= STAGE_PIECE_MAX &&
                   (g->rstride != g->len || g->lstride != g->len)) {
            p->how[i] = HOW_STAGE;
            p->nstage++;
        } else {
            p->how[i] = HOW_CMA;
            p->ncma++;
        }
    }
    return 0;
}

/* After the mapped copies of a job begun with rw_begin(): cross-memory
 * attach (under map_lock), the device copies waited for (shm_dev.c), then
 * map_lock and the lease are released. */
static void rw_release(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    kvt_status_t st;

    p->st = p->ncma > 0 ? kvt__shm_cma_run(s, j, p->how) : KVT_OK;
    st = kvt__shm_dev_finish(s, j, p);
    if (p->st == KVT_OK)
        p->st = st;
    pthread_rwlock_unlock(&s->map_lock);
    kvt__shm_lease_release(s);
}

/* Give up a job begun with rw_begin() before copying anything (what it
 * needs is asked for first). */
static void rw_abort(shm_session_t *s)
{
    pthread_rwlock_unlock(&s->map_lock);
    kvt__shm_lease_release(s);
}

/* rw_finish() and the rest: the job is accounted for (job_end()) with
 * RW_DONE or RW_PARK; RW_UNCHECKED, its copies done, waits for a look at
 * the target's state that follows them (run_end()). */
enum { RW_DONE, RW_PARK, RW_UNCHECKED };

/*
 * After the copies of a job (@stopped: kvt__shm_target_check() said the
 * target is stopped or dying, with *@st_p the session's state): fail it
 * when the target is gone, or it is stopped past the job's deadline
 * (*@st_p then KVT_ERR_TIMEDOUT); RW_PARK when it is stopped before the
 * deadline.
 */
static int rw_checked(shm_session_t *s, job_t *j, int stopped,
                      kvt_status_t *st_p)
{
    if (*st_p == KVT_OK && stopped) {
        if (kvt__now_ns() < j->deadline)
            return RW_PARK;
        *st_p = KVT_ERR_TIMEDOUT;
    }
    if (*st_p != KVT_OK) {
        kvt__shm_segs_fail(j, 0, j->nsegs, *st_p);
        kvt__shm_session_kill(&s->base, *st_p);
    }
    return RW_DONE;
}

/* A job begun with rw_begin() that copies host memory, mapped or
 * attached, and needs nothing more: nothing of it waits for the target. */
static int rw_plain(const rw_plan_t *p)
{
    return p->need == 0 && p->nstage == 0 && p->ndev == 0 && p->nbounce == 0 &&
           p->want_map == 0 && p->ncma + p->nmap > 0;
}

/*
 * The end of a job after rw_release(): the staged segments are written
 * and success is checked: it needs the target alive and running
 * (kvt__shm_target_check()). No target thread takes part in a mapped or
 * attached copy: it costs the target no wake-up. Returns RW_PARK when the
 * target is stopped and the job's deadline has not passed: the job is to
 * be parked (job_end()) rather than holding its executor until the target
 * runs. With @defer, a job of host memory only, mapped or attached, that
 * needs nothing more returns RW_UNCHECKED before the check: one check
 * after the copies of a run of such jobs vouches for them all
 * (kvt__shm_job_run()).
 */
static int rw_finish(shm_session_t *s, job_t *j, rw_plan_t *p, int defer)
{
    kvt_status_t st = p->st;
    int stopped = 0;

    if (defer && st == KVT_OK && rw_plain(p))
        return RW_UNCHECKED;
    if (st == KVT_OK && p->nstage > 0)
        st = kvt__shm_stage_run(s, j, p->how);
    if (st == KVT_OK && p->ncma + p->nmap + p->ndev + p->nbounce > 0)
        stopped = kvt__shm_target_check(s, &st);
    if (rw_checked(s, j, stopped, &st) == RW_PARK)
        return RW_PARK;
    if (p->want_map != 0 && st == KVT_OK) {
        kvt__shm_copier_waits(1); /* the target answers */
        kvt__shm_map_request(s, p->want_map);
        kvt__shm_copier_waits(0);
    }
    return RW_DONE;
}

/* Everything of a job begun with rw_begin() that is its own; as
 * rw_finish(). */
static int rw_rest(shm_session_t *s, job_t *j, rw_plan_t *p, int defer)
{
    kvt__shm_dev_issue(s, j, p); /* the device's copies overlap the rest */
    kvt__shm_rw_copy_maps(j, p);
    rw_release(s, j, p);
    return rw_finish(s, j, p, defer);
}

/* Ask for what a job begun with rw_begin() needs (p->need): every
 * device region it lacks in one exchange, and a mapping. Fails the job
 * and the session when the target does not answer by the job's deadline
 * or the socket broke: -1. */
static int rw_fetch(shm_session_t *s, job_t *j, rw_plan_t *p)
{
    kvt_status_t st = KVT_OK;

    kvt__shm_copier_waits(1); /* the target answers */
    if (p->nwant > 0)
        st = kvt__shm_ipc_fetch(s, p->want, p->nwant, p->map_seq, j->deadline);
    if (st == KVT_OK && p->want_map != 0)
        kvt__shm_map_request(s, p->want_map);
    kvt__shm_copier_waits(0);
    if (st != KVT_OK) {
        kvt__shm_segs_fail(j, 0, j->nsegs, st);
        kvt__shm_session_kill(&s->base, st);
        return -1;
    }
    return 0;
}

/* Jobs an executor copies in a row before one look at the target's state
 * vouches for them all (kvt__shm_job_run()): at most RUN_MAX, of
 * RUN_BYTES in all. The look costs as much as copying 16 KiB: beside a
 * run of 4 MiB it is nothing, and a completion waits for at most that
 * much copying more (about a millisecond). */
#define RUN_MAX 8
#define RUN_BYTES (4u * 1024u * 1024u)

/* Tries of a job that needs openings or mappings (each try gets every
 * opening it lacks, up to IPC_WANT_MAX, and one mapping, or their
 * refusal) before the rest is staged or bounced. */
#define NEED_TRIES 8

/* Run a READ or WRITE job alone; as rw_finish(). */
static int rw_run(shm_session_t *s, job_t *j, int defer)
{
    rw_plan_t p; /* 21 KiB */

    for (unsigned t = 0;; t++) {
        if (rw_begin(s, j, &p, 0, t + 1 >= NEED_TRIES) != 0)
            return RW_DONE;
        if (p.need == 0)
            return rw_rest(s, j, &p, defer);
        rw_abort(s);
        if (rw_fetch(s, j, &p) != 0)
            return RW_DONE;
    }
}

/*
 * Two pieces of one source row: segments with the same geometry whose
 * pieces are disjoint parts of the same rows (two peers' heads of this
 * rank's cache).
 */
int kvt__shm_seg_siblings(const seg_t *a, const seg_t *b)
{
    uint64_t d =
        a->laddr > b->laddr ? a->laddr - b->laddr : b->laddr - a->laddr;

    return a->count > 1 && a->count == b->count && a->len == b->len &&
           a->lstride == b->lstride && a->lstride > a->len && d >= a->len &&
           d + a->len <= a->lstride;
}

/*
 * Run and account for two WRITE jobs of different sessions taken
 * together (kvt__shm_take_pair()): each source row is read once for both.
 * Segments that are siblings (kvt__shm_seg_siblings()) and mapped on both sides
 * are copied piece by piece in step, both parts of a row one after the
 * other: reading one part of every row and later the other costs nearly
 * twice the memory traffic of reading each row once (the hardware
 * prefetches whole rows). The rest of each job is run as rw_run() would.
 * The partner's lease and mappings are only tried: when either is not at
 * hand at once, it runs alone after the first (holding one lease while
 * waiting for another could wait on a target that waits on this one).
 * Both leases are released before either job's end; a job whose target
 * is stopped is parked (job_end()), so it holds back neither the other
 * nor the executor.
 */
void kvt__shm_job_run_pair(shm_session_t *s, job_t *j, shm_session_t *s2,
                           job_t *j2)
{
    rw_plan_t p[2]; /* 42 KiB */
    int r2;

    if (rw_begin(s, j, &p[0], 0, 0) != 0) {
        job_done(s, j);
        kvt__shm_job_run(s2, j2, 0);
        return;
    }
    if (p[0].need > 0) { /* each alone, once what it needs is at hand */
        rw_abort(s);
        if (rw_fetch(s, j, &p[0]) != 0)
            job_done(s, j);
        else
            kvt__shm_job_run(s, j, 0);
        kvt__shm_job_run(s2, j2, 0);
        return;
    }
    r2 = rw_begin(s2, j2, &p[1], 1, 0);
    if (r2 == 0 && p[1].need > 0) { /* alone, after the first */
        rw_abort(s2);
        r2 = 1;
    }
    if (r2 != 0) {
        job_end(s, j, rw_rest(s, j, &p[0], 0));
        kvt__shm_job_run(s2, j2, 0);
        return;
    }
    for (uint32_t i = 0; i < j->nsegs && i < j2->nsegs; i++) {
        const seg_t *a = &j->segs[i], *b = &j2->segs[i];
        if (p[0].loc[i] == NULL || p[1].loc[i] == NULL ||
            !kvt__shm_seg_siblings(a, b))
            continue;
        kvt__shm_copy_pair(p[0].loc[i], a->rstride,
                           (const void *)(uintptr_t)a->laddr, p[1].loc[i],
                           b->rstride, (const void *)(uintptr_t)b->laddr,
                           a->lstride, a->len, a->count);
        p[0].loc[i] = p[1].loc[i] = NULL;
        atomic_fetch_add_explicit(&s->shm->paired, 1, memory_order_relaxed);
    }
    kvt__shm_dev_issue(s2, j2, &p[1]);
    kvt__shm_dev_issue(s, j, &p[0]);
    kvt__shm_rw_copy_maps(j2, &p[1]);
    kvt__shm_rw_copy_maps(j, &p[0]);
    rw_release(s2, j2, &p[1]);
    rw_release(s, j, &p[0]);
    job_end(s, j, rw_finish(s, j, &p[0], 0));
    job_end(s2, j2, rw_finish(s2, j2, &p[1], 0));
}

static void job_unref(job_t *j)
{
    if (atomic_fetch_sub_explicit(&j->blk->refs, 1, memory_order_acq_rel) == 1)
        free(j->blk);
}

/* Complete each descriptor of @j once, with the first failure of its
 * run of segments. */
static void job_complete(job_t *j)
{
    kvt__comp_run_begin();
    for (uint32_t i = 0; i < j->nsegs;) {
        kvt__comp_t *c = j->segs[i].comp;
        kvt_status_t st = KVT_OK;
        for (; i < j->nsegs && j->segs[i].comp == c; i++)
            if (st == KVT_OK)
                st = j->segs[i].st;
        kvt__comp_done(c, st);
    }
    kvt__comp_run_end();
    job_unref(j);
}

void kvt__shm_fail_list(job_t *list, kvt_status_t st)
{
    while (list != NULL) {
        job_t *next = list->next;
        kvt__shm_segs_fail(list, 0, list->nsegs, st);
        job_complete(list);
        list = next;
    }
}

/* Account for a job that has run: complete it, and kvt__shm_release the session
 * or hand its NOTIFY on when that was the last one in flight. */
static void job_done(shm_session_t *s, job_t *j)
{
    kvt__shm_t *shm = s->shm;
    int release_now = 0, notify_ready = 0;

    if ((j->op == KVT_OP_WRITE || j->op == KVT_OP_READ) && s->ch != NULL &&
        s->shm->cfg->metrics_on) {
        /* For the target's metrics: the descriptors that succeeded and
         * their bytes. */
        unsigned k = j->op == KVT_OP_READ;
        uint64_t ops = 0, bytes = 0;
        for (uint32_t i = 0; i < j->nsegs;) {
            kvt__comp_t *c = j->segs[i].comp;
            int ok = 1;
            uint64_t b = 0;
            for (; i < j->nsegs && j->segs[i].comp == c; i++) {
                ok &= j->segs[i].st == KVT_OK;
                b += j->segs[i].len * j->segs[i].count;
            }
            if (ok) {
                ops++;
                bytes += b;
            }
        }
        atomic_fetch_add_explicit(&s->ch->served[k], ops, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->ch->served[2 + k], bytes,
                                  memory_order_relaxed);
    }
    job_complete(j);
    pthread_mutex_lock(&s->lock);
    s->inflight--;
    if (s->inflight == 0 && atomic_load(&s->base.dead) && !s->released) {
        s->released = 1;
        release_now = 1;
    }
    notify_ready =
        s->inflight == 0 && s->head != NULL && s->head->op == KVT_OP_NOTIFY;
    pthread_mutex_unlock(&s->lock);
    if (notify_ready)
        kvt__shm_pool_wake(shm, 1);
    if (release_now)
        kvt__shm_release(s);
}

/*
 * Park a job whose copies are done but whose target is stopped: it stays
 * in flight (a NOTIFY behind it still waits for it) without holding the
 * thread that ran it; kvt__shm_stopped_poll() ends it once the target runs
 * again, is gone, or the job's deadline passes, and kvt__shm_session_kill()
 * fails it.
 */
void kvt__shm_job_park(shm_session_t *s, job_t *j)
{
    kvt_status_t dead;

    pthread_mutex_lock(&s->lock);
    dead = atomic_load(&s->base.dead);
    if (dead == KVT_OK) {
        j->next = s->parked;
        s->parked = j;
        atomic_fetch_add(&s->shm->nparked, 1);
    }
    pthread_mutex_unlock(&s->lock);
    if (dead != KVT_OK) { /* killed since the check: not delivered */
        kvt__shm_segs_fail(j, 0, j->nsegs, dead);
        job_done(s, j);
    }
}

/* Account for a job that has run, or park it (@park: rw_finish()'s
 * RW_DONE or RW_PARK). */
static void job_end(shm_session_t *s, job_t *j, int park)
{
    if (park == RW_PARK)
        kvt__shm_job_park(s, j);
    else
        job_done(s, j);
}

/* End each job of @list (taken off a parked list) with @st. */
void kvt__shm_parked_end(shm_session_t *s, job_t *list, kvt_status_t st)
{
    while (list != NULL) {
        job_t *next = list->next;
        atomic_fetch_sub(&s->shm->nparked, 1);
        if (st != KVT_OK)
            kvt__shm_segs_fail(list, 0, list->nsegs, st);
        job_done(s, list);
        list = next;
    }
}

/*
 * The next job of @s for the executor that ran @first and has not looked
 * at the target since (kvt__shm_job_run()): one of the same submission
 * or an earlier one (a deadline no later than @first's, so that a waiting
 * thread, which took @first only when it could wait for it, can wait for
 * this one too), READ or WRITE, of @room bytes at most; NULL when the
 * queue holds none or @until_ns has passed.
 */
static job_t *run_next(shm_session_t *s, const job_t *first, uint64_t room,
                       uint64_t until_ns)
{
    job_t *j = NULL;

    if (until_ns != 0 && kvt__now_ns() >= until_ns)
        return NULL;
    pthread_mutex_lock(&s->lock);
    if (s->head != NULL && s->head->op != KVT_OP_NOTIFY &&
        s->head->deadline <= first->deadline && s->head->bytes <= room)
        j = kvt__shm_take_locked(s);
    pthread_mutex_unlock(&s->lock);
    return j;
}

/*
 * Copy job @j of a run whose earlier jobs wait for their look at the
 * target (kvt__shm_job_run()), only when it starts at once and waits for
 * nothing: the lease and the mappings at hand (a try), host memory
 * mapped or attached. RW_UNCHECKED after its copies; -1 when it was not
 * begun (the run is then ended, and the job run alone); else as
 * rw_finish(), a failed copy.
 */
static int run_more(shm_session_t *s, job_t *j)
{
    rw_plan_t p; /* 21 KiB */

    if (rw_begin(s, j, &p, 1, 0) != 0)
        return -1;
    if (!rw_plain(&p)) {
        rw_abort(s);
        return -1;
    }
    return rw_rest(s, j, &p, 1);
}

/* Account for the @n jobs of @run, whose copies are done (RW_UNCHECKED),
 * after one look at the target's state for all of them. */
static void run_end(shm_session_t *s, job_t *const *run, unsigned n)
{
    kvt_status_t st;
    int stopped = kvt__shm_target_check(s, &st);

    for (unsigned i = 0; i < n; i++) {
        kvt_status_t sti = st;
        job_end(s, run[i], rw_checked(s, run[i], stopped, &sti));
    }
}

/*
 * A job mapped or attached into host memory is reported only once a look
 * at the target's /proc state after its copies finds it running
 * (rw_finish()); that read costs as much as copying 16 KiB, a tenth of a
 * small job's time. So the executor goes on with the next queued job of
 * the same submission (or an earlier one) while it starts at once and
 * copies host memory only (run_more()), up to RUN_MAX jobs and RUN_BYTES
 * in a row, and one look after the last copies vouches for all of them:
 * a job's completion waits for at most RUN_BYTES of copies more. A job
 * that would wait for anything ends the run first and runs alone.
 */
void kvt__shm_job_run(shm_session_t *s, job_t *j, uint64_t until_ns)
{
    job_t *run[RUN_MAX];
    unsigned n = 0;
    uint64_t bytes = 0;

    if (j->op == KVT_OP_NOTIFY) {
        kvt_status_t st = kvt__shm_notify_run(s, j);
        if (st != KVT_OK) {
            kvt__shm_segs_fail(j, 0, j->nsegs, st);
            kvt__shm_session_kill(&s->base, st);
        }
        job_end(s, j, RW_DONE);
        return;
    }
    while (j != NULL) {
        int r = n > 0 ? run_more(s, j) : rw_run(s, j, 1);
        if (r < 0) { /* not begun: alone, after the run */
            run_end(s, run, n);
            n = 0;
            bytes = 0;
            continue;
        }
        if (r != RW_UNCHECKED) {
            job_end(s, j, r);
            break;
        }
        run[n++] = j;
        bytes += j->bytes;
        j = n < RUN_MAX && bytes < RUN_BYTES
                ? run_next(s, run[0], RUN_BYTES - bytes, until_ns)
                : NULL;
    }
    if (n > 0)
        run_end(s, run, n);
}
