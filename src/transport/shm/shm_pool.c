/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor pool: worker threads that take jobs from the sessions in
 * turn (and a partner job of another session that copies the other part
 * of the same rows), the periodic check for dead targets and timed out
 * jobs, parked jobs, and waking workers (now, or at the unplug).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/thread.h"
#include "util/time.h"

/*
 * Admission. Every thread that copies a job takes a CPU; with more of
 * them than the process may use, they take turns, each preempted in the
 * middle of its pages, and the copy costs more per byte than it would on
 * fewer threads (docs/benchmarks.md, "Copiers on every CPU"). A thread
 * waiting on its batch runs that batch's jobs itself (it would otherwise
 * sleep while they run), so the workers leave it a CPU: a worker takes a
 * job only while the workers in a job and the waiting threads running
 * jobs leave one free, and always when no other worker runs one, so that
 * jobs no waiting thread runs (another session's, an asynchronous
 * caller's) never wait for one. A thread waiting for its target holds
 * no CPU and is not counted.
 */
static _Thread_local kvt__shm_t *copier_shm;
static _Thread_local _Atomic unsigned *copier_count; /* busy or drivers */
static _Thread_local unsigned copier_waits;

/* Since when no waiting thread has run jobs (0: one runs them now). */
static uint64_t pool_since(kvt__shm_t *shm, uint64_t now)
{
    uint64_t left = atomic_load(&shm->drove_ns);

    if (atomic_load(&shm->drivers) > 0 || now <= left)
        return 0;
    return now - left;
}

/* How many more workers may take a job now (kvt__shm_room()). */
static unsigned pool_room(kvt__shm_t *shm, uint64_t now)
{
    return kvt__shm_room(atomic_load(&shm->busy), atomic_load(&shm->drivers),
                         pool_since(shm, now), shm->ncpu);
}

unsigned kvt__shm_room(unsigned busy, unsigned drivers, uint64_t idle_ns,
                       unsigned ncpu)
{
    if (drivers == 0 && idle_ns < DRIVE_GRACE_NS)
        drivers = 1;
    if (busy + drivers < ncpu)
        return ncpu - busy - drivers;
    return busy == 0;
}

void kvt__shm_copier_enter(kvt__shm_t *shm, int driver)
{
    unsigned b, peak;

    copier_waits = 0;
    copier_shm = shm;
    if (driver) {
        copier_count = &shm->drivers;
        atomic_fetch_add_explicit(&shm->drivers, 1, memory_order_relaxed);
        return;
    }
    copier_count = &shm->busy;
    b = atomic_fetch_add_explicit(&shm->busy, 1, memory_order_relaxed) + 1;
    atomic_fetch_add_explicit(&shm->worker_jobs, 1, memory_order_relaxed);
    if (b + atomic_load_explicit(&shm->drivers, memory_order_relaxed) >
        shm->ncpu)
        atomic_fetch_add_explicit(&shm->over_jobs, 1, memory_order_relaxed);
    peak = atomic_load_explicit(&shm->busy_peak, memory_order_relaxed);
    while (b > peak && !atomic_compare_exchange_weak_explicit(
                           &shm->busy_peak, &peak, b, memory_order_relaxed,
                           memory_order_relaxed))
        ;
}

void kvt__shm_copier_leave(kvt__shm_t *shm)
{
    _Atomic unsigned *c = copier_count;

    copier_count = NULL;
    copier_shm = NULL;
    if (c == NULL)
        return;
    /* A waiting thread is counted on for DRIVE_GRACE_NS from now: the
     * time is set before the count drops. */
    if (c == &shm->drivers)
        atomic_store(&shm->drove_ns, kvt__now_ns());
    if (copier_waits == 0)
        atomic_fetch_sub(c, 1);
    copier_waits = 0;
    /* A worker that found no room while this thread ran jobs, with no
     * other worker in a job now to take the next one, looks again: this
     * thread may not come back. */
    if (c == &shm->drivers && atomic_load(&shm->declined) > 0 &&
        atomic_load(&shm->busy) == 0)
        kvt__shm_pool_wake(shm, 1);
}

void kvt__shm_copier_waits(int on)
{
    if (copier_count == NULL)
        return;
    if (on && copier_waits++ == 0) {
        atomic_fetch_sub(copier_count, 1);
        /* Its CPU is free while it waits: a worker that found no room
         * takes the next job. */
        if (atomic_load(&copier_shm->declined) > 0)
            kvt__shm_pool_wake(copier_shm, 1);
    } else if (!on && --copier_waits == 0)
        atomic_fetch_add_explicit(copier_count, 1, memory_order_relaxed);
}

/* Whether a worker may take a job now (kvt__shm_room()); if not, *@retry_ns:
 * when to look again unless woken. */
static int pool_admit(kvt__shm_t *shm, uint64_t now, uint64_t *retry_ns)
{
    uint64_t since = pool_since(shm, now);

    if (kvt__shm_room(atomic_load(&shm->busy), atomic_load(&shm->drivers),
                      since, shm->ncpu) > 0)
        return 1;
    /* Until the grace ends; while a thread runs jobs, until a copier
     * makes room (kvt__shm_copier_leave(), kvt__shm_copier_waits(), a
     * worker ending a job) or the tick. */
    *retry_ns =
        since > 0 && since < DRIVE_GRACE_NS ? DRIVE_GRACE_NS - since : TICK_NS;
    return 0;
}

/* Whether any session has a job queued. Called with pool_lock held. */
static int pool_queued(kvt__shm_t *shm)
{
    int any = 0;

    for (shm_session_t *s = shm->sessions; s != NULL && !any; s = s->next_all) {
        pthread_mutex_lock(&s->lock);
        any = s->head != NULL;
        pthread_mutex_unlock(&s->lock);
    }
    return any;
}

/* The next job an executor may take, with the session lock held. */
job_t *kvt__shm_take_locked(shm_session_t *s)
{
    job_t *j = s->head;

    if (j == NULL || atomic_load(&s->base.dead) || atomic_load(&s->held) ||
        (j->op == KVT_OP_NOTIFY && s->inflight > 0))
        return NULL;
    s->head = j->next;
    if (s->head == NULL)
        s->tail = NULL;
    s->inflight++;
    return j;
}

unsigned kvt__shm_pool_wake(kvt__shm_t *shm, unsigned n)
{
    unsigned i;

    pthread_mutex_lock(&shm->pool_lock);
    for (i = 0; i < n && i < shm->idle; i++)
        pthread_cond_signal(&shm->pool_cond);
    pthread_mutex_unlock(&shm->pool_lock);
    return i;
}

/*
 * Wake workers for @n new jobs, or, for a plugged submission, count them
 * for flush() at the submitter's last unplug (kvt_submit_plug()): the
 * jobs of one round to several peers are then all queued before any of
 * them runs, and the workers can pair them (kvt__shm_take_pair()).
 */
void kvt__shm_submit_wake(kvt__shm_t *shm, unsigned n, int plugged)
{
    unsigned room;

    if (plugged) {
        atomic_fetch_add(&shm->deferred, n);
        return;
    }
    /* Counted before the polling worker is looked for: a worker that
     * stops polling looks at the queues again (pool_spin()). */
    atomic_fetch_add(&shm->submits, 1);
    /* No more than may take a job (kvt__shm_room()): a worker woken
     * without room would only go back to sleep. Those busy take the jobs
     * as they end theirs, and a waiting thread runs its own. */
    room = pool_room(shm, kvt__now_ns());
    if (n > room)
        n = room;
    /* A worker polling for this submission takes a job without a wake. */
    if (n > 0 && atomic_load(&shm->spinning) > 0)
        n--;
    if (n > 0 && kvt__shm_pool_wake(shm, n) > 0)
        atomic_fetch_add_explicit(&shm->submit_wakes, 1, memory_order_relaxed);
}

void kvt__shm_flush(kvt__tl_t *tl)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    unsigned n = atomic_exchange(&shm->deferred, 0);

    if (n > 0)
        kvt__shm_submit_wake(shm, n, 0);
}

/*
 * Every TICK_NS one worker looks for sessions whose target died or whose
 * oldest queued job is past its deadline, and fails them, as the TCP
 * workers do for their connections.
 */
static void pool_tick(kvt__shm_t *shm)
{
    shm_session_t *bad[32];
    kvt_status_t why[32];
    size_t nbad = 0;
    uint64_t now = kvt__now_ns();

    pthread_mutex_lock(&shm->pool_lock);
    for (shm_session_t *s = shm->sessions; s != NULL && nbad < 32;
         s = s->next_all) {
        kvt_status_t st = KVT_OK;
        pthread_mutex_lock(&s->lock);
        if (!s->released && !atomic_load(&s->base.dead)) {
            st = kvt__shm_peer_status(s);
            if (st == KVT_OK && s->head != NULL && now > s->head->deadline)
                st = KVT_ERR_TIMEDOUT;
        }
        pthread_mutex_unlock(&s->lock);
        if (st != KVT_OK) {
            kvt__session_hold(&s->base);
            bad[nbad] = s;
            why[nbad++] = st;
        }
    }
    pthread_mutex_unlock(&shm->pool_lock);
    for (size_t i = 0; i < nbad; i++) {
        kvt__shm_session_kill(&bad[i]->base, why[i]);
        kvt__session_release(&bad[i]->base);
    }
}

/*
 * The sessions on the pool's list, each held (kvt__session_hold()), in a
 * malloc'd array: a list to walk without pool_lock while sessions leave
 * it. Every one of them is released with sessions_put().
 */
static shm_session_t **sessions_get(kvt__shm_t *shm, size_t *n_p)
{
    shm_session_t **v = NULL;
    size_t n = 0, k = 0;

    pthread_mutex_lock(&shm->pool_lock);
    for (shm_session_t *s = shm->sessions; s != NULL; s = s->next_all)
        n++;
    if (n > 0)
        v = malloc(n * sizeof(*v));
    for (shm_session_t *s = shm->sessions; v != NULL && s != NULL;
         s = s->next_all) {
        kvt__session_hold(&s->base);
        v[k++] = s;
    }
    pthread_mutex_unlock(&shm->pool_lock);
    *n_p = k;
    return v;
}

static void sessions_put(shm_session_t **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvt__session_release(&v[i]->base);
    free(v);
}

int kvt__shm_still_stopped(int *ran, int stopped, kvt_status_t st)
{
    if (!stopped && st == KVT_OK && !*ran) {
        *ran = 1;
        return 1;
    }
    *ran = 0;
    return stopped;
}

/*
 * End the parked jobs (kvt__shm_job_park()) whose target runs again (delivered)
 * or is gone (failed with the session), and those past their deadline
 * (KVT_ERR_TIMEDOUT, which fails the session, as a job that waited for
 * the target would have); let the executors take the jobs of a held
 * session (kvt__shm_session_hold()) whose target runs again. One pool worker at
 * a time runs it, every STOPPED_POLL_NS while any job is parked or any session
 * held. Sessions may leave the list meanwhile: it walks a held copy
 * (sessions_get()).
 */
void kvt__shm_stopped_poll(kvt__shm_t *shm)
{
    uint64_t now = kvt__now_ns();
    shm_session_t **all;
    size_t nall;

    all = sessions_get(shm, &nall);
    for (size_t k = 0; k < nall; k++) {
        shm_session_t *s = all[k];
        job_t *done = NULL, **pp;
        kvt_status_t st = KVT_OK;
        int any, stopped = 0;

        pthread_mutex_lock(&s->lock);
        any = s->parked != NULL;
        pthread_mutex_unlock(&s->lock);
        if (any || atomic_load(&s->held)) {
            stopped = kvt__shm_target_check(s, &st);
            stopped = kvt__shm_still_stopped(&s->ran, stopped, st);
        }
        if (!stopped && st == KVT_OK && kvt__shm_session_unhold(s))
            kvt__shm_pool_wake(shm, ~0u); /* every idle worker */
        pthread_mutex_lock(&s->lock);
        for (pp = &s->parked; any && *pp != NULL;) {
            job_t *j = *pp;
            if (stopped && now < j->deadline) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            j->next = done;
            done = j;
        }
        pthread_mutex_unlock(&s->lock);
        if (stopped && done != NULL)
            st = KVT_ERR_TIMEDOUT;
        /* The session dies before its jobs fail, so that whoever sees a
         * failure and opens the segment again gets a new session. */
        if (st != KVT_OK)
            kvt__shm_session_kill(&s->base, st);
        kvt__shm_parked_end(s, done, st);
    }
    sessions_put(all, nall);
}

/*
 * A job for a pool worker, from the sessions in turn: the scan starts
 * after the session the last job was taken from, so that sessions with
 * queued jobs are served alternately rather than the first one in the
 * list until it is empty (a large batch to one peer does not hold back
 * the transfers to the others). Called with pool_lock held; NULL when
 * nothing is queued.
 */
static shm_session_t *take_next(kvt__shm_t *shm, job_t **j_p)
{
    shm_session_t *s = shm->sessions;
    unsigned n = 0, start;

    for (; s != NULL; s = s->next_all)
        n++;
    if (n == 0)
        return NULL;
    start = shm->rr % n;
    s = shm->sessions;
    for (unsigned k = 0; k < start; k++)
        s = s->next_all;
    for (unsigned k = 0; k < n; k++) {
        job_t *j;
        pthread_mutex_lock(&s->lock);
        j = kvt__shm_take_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (j != NULL) {
            shm->rr = (start + k + 1) % n;
            *j_p = j;
            return s;
        }
        s = s->next_all != NULL ? s->next_all : shm->sessions;
    }
    return NULL;
}

/* How far into another session's queue kvt__shm_take_pair() looks. */
#define PAIR_LOOK 8

/*
 * A job of another session to run with @j (kvt__shm_job_run_pair()): when @j
 * writes pieces that are parts of rows here (a strided source), the
 * first job among the next PAIR_LOOK queued in another session, before
 * any NOTIFY, whose first segment is the sibling of @j's (the other part
 * of the same rows) is taken too. Jobs of one session may run in any
 * order; a NOTIFY waits for those taken before it. Only between
 * sessions that map memory of their targets: staged jobs gain nothing
 * from running together, and run better side by side on two workers,
 * each in step with its own target. Called with pool_lock held; NULL when
 * there is none.
 */
shm_session_t *kvt__shm_take_pair(kvt__shm_t *shm, shm_session_t *s, job_t *j,
                                  job_t **j2_p)
{
    if (j->op != KVT_OP_WRITE || j->nsegs == 0 || j->segs[0].count < 2 ||
        j->segs[0].lstride <= j->segs[0].len ||
        atomic_load_explicit(&s->mapped, memory_order_relaxed) == 0)
        return NULL;
    for (shm_session_t *o = shm->sessions; o != NULL; o = o->next_all) {
        job_t *prev, *c;
        unsigned k = 0;

        if (o == s ||
            atomic_load_explicit(&o->mapped, memory_order_relaxed) == 0)
            continue;
        pthread_mutex_lock(&o->lock);
        /* As kvt__shm_take_locked(): none of a dead or held session. */
        if (atomic_load(&o->base.dead) || atomic_load(&o->held)) {
            pthread_mutex_unlock(&o->lock);
            continue;
        }
        for (prev = NULL, c = o->head; c != NULL && k < PAIR_LOOK;
             prev = c, c = c->next, k++) {
            if (c->op == KVT_OP_NOTIFY)
                break;
            if (c->op != KVT_OP_WRITE || c->nsegs != j->nsegs ||
                !kvt__shm_seg_siblings(&j->segs[0], &c->segs[0]))
                continue;
            if (prev == NULL)
                o->head = c->next;
            else
                prev->next = c->next;
            if (o->tail == c)
                o->tail = prev;
            o->inflight++;
            pthread_mutex_unlock(&o->lock);
            *j2_p = c;
            return o;
        }
        pthread_mutex_unlock(&o->lock);
    }
    return NULL;
}

/* Whether any job is parked or any session held. */
static int stopped_any(kvt__shm_t *shm)
{
    return atomic_load(&shm->nparked) > 0 || atomic_load(&shm->nheld) > 0;
}

/*
 * Poll for a submission after @seen (shm->submits) until @until, with
 * pool_lock dropped, rather than sleep: a worker that just ended a job
 * is likely to be given the next one within microseconds (the next batch
 * of a thread that submits one at a time), and a sleeping worker takes
 * tens of microseconds to be woken and costs its waker a system call.
 * One worker polls at a time; none while there is no job for it (a
 * copier has no more use of a CPU then) and never longer than
 * IDLE_SPIN_NS after a job, so that an idle pool sleeps. Returns 0 when
 * another worker polls (the caller sleeps), 1 after polling, with
 * pool_lock held again: the caller looks at the queues again, so that a
 * submission that counted on this worker (kvt__shm_submit_wake()) is not
 * left unseen when it stopped polling just after.
 */
static int pool_spin(kvt__shm_t *shm, uint64_t seen, uint64_t until)
{
    unsigned zero = 0;

    if (!atomic_compare_exchange_strong(&shm->spinning, &zero, 1))
        return 0;
    pthread_mutex_unlock(&shm->pool_lock);
    while (atomic_load(&shm->submits) == seen && kvt__now_ns() < until) {
        for (int k = 0; k < 32; k++)
            cpu_relax();
    }
    atomic_store(&shm->spinning, 0);
    pthread_mutex_lock(&shm->pool_lock);
    return 1;
}

static void *worker_main(void *arg)
{
    kvt__shm_t *shm = arg;
    uint64_t last_tick = kvt__now_ns();
    uint64_t ended = 0; /* when this worker last ended a job */

    kvt__thread_name("kvt-shm-w");
    pthread_mutex_lock(&shm->pool_lock);
    while (!shm->stopping) {
        shm_session_t *s;
        job_t *j = NULL;
        uint64_t now, retry, seen;
        int room, declined;

        /* Parked jobs and held sessions are looked at between jobs too,
         * so that a busy pool does not leave them waiting. */
        now = stopped_any(shm) && !shm->park_polling ? kvt__now_ns() : 0;
        if (now != 0 && now - shm->park_polled >= STOPPED_POLL_NS) {
            shm->park_polling = 1;
            shm->park_polled = now;
            pthread_mutex_unlock(&shm->pool_lock);
            kvt__shm_stopped_poll(shm);
            pthread_mutex_lock(&shm->pool_lock);
            shm->park_polling = 0;
        }
        /* Counted among those that found no room before looking, so that
         * a copier making room after the look sees it and wakes it
         * (kvt__shm_copier_waits(), kvt__shm_copier_leave(): each changes
         * its count, then reads this one; both sequentially consistent). */
        atomic_fetch_add(&shm->declined, 1);
        /* Read before the queues are: a submission after it is seen by
         * pool_spin(). */
        seen = atomic_load(&shm->submits);
        retry = 0;
        room = pool_admit(shm, kvt__now_ns(), &retry);
        s = room ? take_next(shm, &j) : NULL;
        declined = !room && j == NULL && pool_queued(shm);
        if (!declined)
            atomic_fetch_sub(&shm->declined, 1);
        if (j != NULL) {
            job_t *j2 = NULL;
            shm_session_t *s2 = kvt__shm_take_pair(shm, s, j, &j2);
            pthread_mutex_unlock(&shm->pool_lock);
            kvt__shm_copier_enter(shm, 0);
            if (j2 != NULL)
                kvt__shm_job_run_pair(s, j, s2, j2);
            else
                kvt__shm_job_run(s, j, 0);
            kvt__shm_copier_leave(shm);
            ended = kvt__now_ns();
            pthread_mutex_lock(&shm->pool_lock);
            /* Room for this worker and one that found none (the waiting
             * thread left and did not come back): wake it. */
            if (atomic_load(&shm->declined) > 0 &&
                pool_room(shm, kvt__now_ns()) >= 2)
                pthread_cond_signal(&shm->pool_cond);
            continue;
        }
        now = kvt__now_ns();
        if (now - last_tick >= TICK_NS) {
            last_tick = now;
            if (declined)
                atomic_fetch_sub(&shm->declined, 1);
            pthread_mutex_unlock(&shm->pool_lock);
            pool_tick(shm);
            pthread_mutex_lock(&shm->pool_lock);
            continue;
        }
        if (!declined && ended != 0 && now - ended < IDLE_SPIN_NS &&
            pool_spin(shm, seen, ended + IDLE_SPIN_NS))
            continue;
        {
            struct timespec ts;
            uint64_t ns, wait = stopped_any(shm) ? STOPPED_POLL_NS : TICK_NS;
            if (declined && retry < wait)
                wait = retry;
            clock_gettime(CLOCK_REALTIME, &ts);
            ns = (uint64_t)ts.tv_nsec + wait;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            shm->idle++;
            pthread_cond_timedwait(&shm->pool_cond, &shm->pool_lock, &ts);
            if (declined)
                atomic_fetch_sub(&shm->declined, 1);
            shm->idle--;
        }
    }
    pthread_mutex_unlock(&shm->pool_lock);
    return NULL;
}

/* Start the workers with the first session. Called with pool_lock held. */
kvt_status_t kvt__shm_pool_start_locked(kvt__shm_t *shm)
{
    unsigned n = shm->cfg->num_workers;

    if (shm->workers != NULL)
        return KVT_OK;
    shm->workers = calloc(n, sizeof(pthread_t));
    if (shm->workers == NULL)
        return KVT_ERR_NO_MEMORY;
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&shm->workers[i], NULL, worker_main, shm) != 0) {
            KVT_LOG_E("shm: cannot start worker threads");
            break;
        }
        shm->nworkers++;
    }
    return shm->nworkers > 0 ? KVT_OK : KVT_ERR_IO;
}

void kvt__shm_sessions_stop(kvt__shm_t *shm)
{
    shm_session_t **all;
    size_t nall;

    pthread_mutex_lock(&shm->pool_lock);
    shm->stopping = 1;
    pthread_cond_broadcast(&shm->pool_cond);
    pthread_mutex_unlock(&shm->pool_lock);
    for (unsigned i = 0; i < shm->nworkers; i++)
        pthread_join(shm->workers[i], NULL);
    shm->nworkers = 0;
    all = sessions_get(shm, &nall);
    for (size_t k = 0; k < nall; k++)
        kvt__shm_session_kill(&all[k]->base, KVT_ERR_CANCELED);
    sessions_put(all, nall);
}
