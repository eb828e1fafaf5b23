/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches: slot bookkeeping, validation and dispatch of descriptors to the
 * sessions' transports, and waiting.
 *
 * Accounting invariant: @pending counts submitted slots that are not final.
 * It is raised by the whole submission before any descriptor can complete,
 * and lowered exactly once per slot by kvt__comp_done() when the slot's
 * last piece completes. A waiter sleeps on @pending as a futex word.
 */
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/engine_int.h"
#include "core/tl.h"
#include "util/futex.h"
#include "util/time.h"

#define BATCH_MAX_CAPACITY (1u << 20)

/* Marks the start and the end of a run of completions on @batch. */
static inline void batch_enter(kvt_batch_h b)
{
    atomic_fetch_add_explicit(&b->busy, 1, memory_order_acquire);
}
static inline void batch_leave(kvt_batch_h b)
{
    atomic_fetch_sub_explicit(&b->busy, 1, memory_order_release);
}

void kvt__comp_done(kvt__comp_t *s, kvt_status_t status)
{
    kvt_batch_h b = s->batch;
    int32_t final;

    batch_enter(b);
    if (status != KVT_OK) {
        int32_t zero = 0;
        atomic_compare_exchange_strong_explicit(
            &s->err, &zero, status, memory_order_relaxed, memory_order_relaxed);
    }
    if (atomic_fetch_sub_explicit(&s->remaining, 1, memory_order_acq_rel) != 1)
        goto out;
    final = atomic_load_explicit(&s->err, memory_order_relaxed);
    kvt__stats_done(&b->engine->stats, s->st_tl, s->st_op, s->st_bytes,
                    s->st_t0, final);
    atomic_store_explicit(&s->status, final, memory_order_release);
    if (final != KVT_OK) {
        int32_t zero = 0;
        atomic_fetch_add_explicit(&b->failed, 1, memory_order_relaxed);
        atomic_compare_exchange_strong(&b->first_error, &zero, final);
    }
    /* Sequentially consistent with the waiter's "sleepers++, re-read
     * pending": either it sees pending at 0, or this sees it asleep. The
     * idle call runs after the last decrement, so that kvt_batch_query()
     * in it, or in the thread it wakes, sees the batch idle (called
     * before, the woken thread would find it busy and wait for nothing);
     * kvt_batch_wait() waits for it to end (drain_completers()). */
    if (atomic_fetch_sub(&b->pending, 1) == 1) {
        kvt_batch_idle_cb_t fn =
            atomic_load_explicit(&b->on_idle, memory_order_acquire);
        if (fn != NULL)
            fn(b, b->on_idle_arg);
        if (atomic_load(&b->sleepers))
            kvt__futex_wake_all(&b->pending);
    }
out:
    batch_leave(b);
}

/* A slot failed before any transport took it. */
static void comp_fail(kvt__comp_t *c, kvt_status_t st)
{
    c->st_tl = 0xff;
    kvt__comp_expect(c, 1);
    kvt__comp_done(c, st);
}

kvt_status_t kvt_batch_create(kvt_engine_h e, size_t capacity,
                              kvt_batch_h *batch_p)
{
    kvt_batch_h b;

    if (e == NULL || batch_p == NULL || capacity == 0 ||
        capacity > BATCH_MAX_CAPACITY)
        return KVT_ERR_INVALID_PARAM;
    b = calloc(1, sizeof(*b));
    if (b == NULL)
        return KVT_ERR_NO_MEMORY;
    b->slots = calloc(capacity, sizeof(*b->slots));
    if (b->slots == NULL) {
        free(b);
        return KVT_ERR_NO_MEMORY;
    }
    b->engine = e;
    b->capacity = capacity;
    for (size_t i = 0; i < capacity; i++)
        b->slots[i].batch = b;
    pthread_mutex_lock(&e->batch_lock);
    b->next = e->batches;
    if (e->batches)
        e->batches->prev = b;
    e->batches = b;
    pthread_mutex_unlock(&e->batch_lock);
    *batch_p = b;
    return KVT_OK;
}

/*
 * Check @d and write its normalised form into @x (the rules of
 * kvt_xfer_desc_t, in one place): flags and reserved fields 0; a known
 * opcode; for READ and WRITE a
 * non-zero length, a piece count of at least 1, strides of at least the
 * length (0: packed), neither span wrapping, and the local span inside
 * one registered region (registry read lock held); for NOTIFY a message
 * of at most KVT_NOTIFY_MAX bytes.
 */
static kvt_status_t xfer_init(kvt_engine_h e, const kvt_xfer_desc_t *d,
                              kvt__xfer_t *x, unsigned *lkind_p,
                              uint64_t *rspan_p)
{
    const kvt__region_t *lr;
    uint64_t c, ls, rs, lspan, rspan;

    if (d->flags != 0 || d->reserved32 != 0 || d->reserved[0] != 0 ||
        d->reserved[1] != 0)
        return KVT_ERR_INVALID_PARAM;
    if (d->opcode == KVT_OP_NOTIFY) {
        if (d->length > KVT_NOTIFY_MAX)
            return KVT_ERR_OVERFLOW;
        if (d->length > 0 && d->local_addr == NULL)
            return KVT_ERR_INVALID_PARAM;
        *x = (kvt__xfer_t){.op = KVT_OP_NOTIFY,
                           .count = 1,
                           .len = d->length,
                           .laddr = (uint64_t)(uintptr_t)d->local_addr,
                           .lstride = d->length,
                           .rstride = d->length,
                           .ldev = -1};
        *lkind_p = KVT_MEM_HOST;
        *rspan_p = 0;
        return KVT_OK;
    }
    if ((d->opcode != KVT_OP_READ && d->opcode != KVT_OP_WRITE) ||
        d->length == 0 || d->local_addr == NULL)
        return KVT_ERR_INVALID_PARAM;
    c = d->count > 1 ? d->count : 1;
    ls = rs = d->length;
    if (c > 1) {
        if (d->local_stride)
            ls = d->local_stride;
        if (d->remote_stride)
            rs = d->remote_stride;
        if (ls < d->length || rs < d->length ||
            ls > (UINT64_MAX - d->length) / (c - 1) ||
            rs > (UINT64_MAX - d->length) / (c - 1))
            return KVT_ERR_INVALID_PARAM;
    }
    rspan = rs * (c - 1) + d->length;
    lspan = ls * (c - 1) + d->length;
    if (d->remote_addr > UINT64_MAX - rspan)
        return KVT_ERR_INVALID_PARAM;
    lr = kvt__memreg_find_locked(&e->reg, (uint64_t)(uintptr_t)d->local_addr,
                                 lspan);
    if (lr == NULL)
        return KVT_ERR_NOT_REGISTERED;
    *lkind_p = lr->kind;
    *rspan_p = rspan;
    *x = (kvt__xfer_t){.op = d->opcode,
                       .count = (uint32_t)c,
                       .len = d->length,
                       .laddr = (uint64_t)(uintptr_t)d->local_addr,
                       .lstride = ls,
                       .raddr = d->remote_addr,
                       .rstride = rs,
                       .lkind = (uint8_t)lr->kind,
                       .ldev = lr->device};
    return KVT_OK;
}

/*
 * The submission plug (kvt_submit_plug()): per thread, the depth and the
 * engines whose transports were handed plugged submissions; the last
 * unplug flushes their transports. A submission to a fifth engine while
 * plugged is not held back.
 */
#define PLUG_ENGINES 4
static _Thread_local struct {
    unsigned depth, n;
    kvt_engine_h e[PLUG_ENGINES];
} plug;

void kvt_submit_plug(void)
{
    plug.depth++;
}

void kvt_submit_unplug(void)
{
    if (plug.depth == 0 || --plug.depth > 0)
        return;
    for (unsigned k = 0; k < plug.n; k++) {
        kvt_engine_h e = plug.e[k];
        for (unsigned i = 0; i < e->ntl; i++)
            if (e->tl[i]->ops->flush != NULL)
                e->tl[i]->ops->flush(e->tl[i]);
    }
    plug.n = 0;
}

/* Whether this thread's submission to @e may be held back. */
static int plugged(kvt_engine_h e)
{
    if (plug.depth == 0)
        return 0;
    for (unsigned k = 0; k < plug.n; k++)
        if (plug.e[k] == e)
            return 1;
    if (plug.n == PLUG_ENGINES)
        return 0;
    plug.e[plug.n++] = e;
    return 1;
}

/* Record where a session's share of a submission went (kvt__sub_t).
 * The batch holds a reference on the session it may drive. */
static void batch_hint(kvt_batch_h b, kvt__session_t *s, const kvt__sub_t *h)
{
    if (h->many || h->where == NULL ||
        (b->hint != NULL && (b->hint != h->where || b->hint_sess != s)))
        b->hint_multi = 1;
    if (b->hint_sess != s) {
        kvt__session_hold(s);
        if (b->hint_sess != NULL)
            kvt__session_release(b->hint_sess);
        b->hint_sess = s;
    }
    b->hint = h->where;
}

static void batch_unhint(kvt_batch_h b)
{
    if (b->hint_sess != NULL)
        kvt__session_release(b->hint_sess);
    b->hint_sess = NULL;
    b->hint = NULL;
    b->hint_multi = 0;
}

/* For kvt_batch_submit_wait(): the session and the place where a
 * transport attached the submitting thread (kvt__sub_t.attached), kept
 * until the wait takes the attachment over or ends it. The batch holds
 * the session meanwhile (dispatch()). */
typedef struct {
    kvt__session_t *sess;
    void *where;
} attach_t;

/* Hand @n descriptors to their session; a refusal fails them. @att: the
 * submitting thread waits as soon as the submission is made. */
static void dispatch(kvt_batch_h b, kvt__session_t *s, const kvt__xfer_t *x,
                     size_t n, attach_t *att)
{
    /* The wait drives this session itself (kvt_batch_wait()) when the
     * batch's work is all in it; only then may the transport attach. */
    kvt__sub_t h = {.plugged = plugged(b->engine),
                    .will_wait = att != NULL && att->sess == NULL &&
                                 !b->hint_multi &&
                                 (b->hint_sess == NULL || b->hint_sess == s) &&
                                 s->ops->progress != NULL};

    if (s->ops->submit(s, x, n, &h) != KVT_OK) {
        for (size_t j = 0; j < n; j++)
            comp_fail(x[j].comp, KVT_ERR_NO_MEMORY);
        h.many = 1;
    }
    batch_hint(b, s, &h);
    if (h.attached != NULL) {
        /* The batch holds @s now (hint_sess), and keeps it until it is
         * reset or freed, which the thread in kvt_batch_submit_wait()
         * does not do before its wait ends (one thread at a time). */
        att->sess = s;
        att->where = h.attached;
    }
}

/* Scratch per descriptor in batch_submit(): two kvt__xfer_t, a session
 * and a segment pointer. */
#define SUBMIT_PER_DESC                                                        \
    (2 * sizeof(kvt__xfer_t) + sizeof(kvt__session_t *) + sizeof(kvt__seg_t *))
#define SUBMIT_STACK 4

static kvt_status_t batch_submit(kvt_batch_h b, const kvt_xfer_desc_t *descs,
                                 size_t count, attach_t *att)
{
    _Alignas(max_align_t) unsigned char small[SUBMIT_STACK * SUBMIT_PER_DESC];
    kvt_engine_h e;
    size_t base, nvalid = 0;
    kvt__xfer_t *xf, *grp;
    kvt__session_t **sess;
    kvt__seg_t **held;
    kvt_segment_t last_id = 0;
    kvt__seg_t *last = NULL;
    size_t nheld = 0;
    uint64_t t0;
    int one = 1;

    if (b == NULL || (descs == NULL && count > 0))
        return KVT_ERR_INVALID_PARAM;
    if (count == 0)
        return KVT_OK;
    if (count > b->capacity - b->used)
        return KVT_ERR_NO_SPACE;
    e = b->engine;
    /* A few descriptors (a synchronous transfer): on the stack. */
    if (count <= SUBMIT_STACK)
        xf = (kvt__xfer_t *)small;
    else
        xf = malloc(count * SUBMIT_PER_DESC);
    if (xf == NULL)
        return KVT_ERR_NO_MEMORY;
    grp = xf + count;
    sess = (kvt__session_t **)(grp + count);
    held = (kvt__seg_t **)(sess + count);

    base = b->used;
    b->used += count;
    t0 = 0;
    {
        kvt__stats_shard_t *sh = kvt__stats_shard(&e->stats);
        if (sh != NULL) {
            t0 = kvt__stats_ticks();
            KVT__BUMP(sh->batches, 1);
            KVT__BUMP(sh->descs, count);
        }
    }
    for (size_t i = 0; i < count; i++) {
        kvt__comp_t *s = &b->slots[base + i];
        s->st_t0 = t0;
        s->st_op = (uint8_t)descs[i].opcode;
        s->st_bytes =
            descs[i].opcode == KVT_OP_NOTIFY
                ? 0
                : descs[i].length * (descs[i].count > 1 ? descs[i].count : 1);
        atomic_store_explicit(&s->status, KVT_INPROGRESS, memory_order_relaxed);
        atomic_store_explicit(&s->err, KVT_OK, memory_order_relaxed);
        atomic_store_explicit(&s->remaining, 0, memory_order_relaxed);
        s->user_data = descs[i].user_data;
    }
    atomic_fetch_add_explicit(&b->pending, (uint32_t)count,
                              memory_order_release);

    /* Validate and normalise; fail the bad slots at once; note each good
     * one's session (its segment held until the end of the call). */
    kvt__memreg_rdlock(&e->reg);
    for (size_t i = 0; i < count; i++) {
        const kvt_xfer_desc_t *d = &descs[i];
        kvt__xfer_t *x = &xf[nvalid];
        unsigned lkind = KVT_MEM_HOST;
        uint64_t rspan = 0;
        kvt_status_t st = xfer_init(e, d, x, &lkind, &rspan);
        kvt__session_t *s = NULL;

        if (st == KVT_OK) {
            if (d->segment != last_id || last == NULL) {
                last = kvt__seg_get(e, d->segment);
                last_id = d->segment;
                if (last != NULL)
                    held[nheld++] = last;
            }
            if (last != NULL)
                s = kvt__seg_route(last, lkind, x->raddr, rspan);
            if (last == NULL)
                st = KVT_ERR_NOT_FOUND;
            else if (s == NULL)
                st = KVT_ERR_NOT_SUPPORTED;
            else if (atomic_load(&s->dead))
                st = atomic_load(&s->dead);
            else if (x->count > 1 &&
                     (s->ops->caps.flags & KVT__TL_STRIDED) == 0)
                st = KVT_ERR_NOT_SUPPORTED;
        }
        if (st != KVT_OK) {
            comp_fail(&b->slots[base + i], st);
            continue;
        }
        x->comp = &b->slots[base + i];
        x->comp->st_tl = (uint8_t)s->tl->index;
        if (nvalid > 0 && sess[nvalid - 1] != s)
            one = 0;
        sess[nvalid++] = s;
    }
    kvt__memreg_unlock(&e->reg);

    /* Hand each session its descriptors, in submission order. */
    if (nvalid > 0 && one) {
        dispatch(b, sess[0], xf, nvalid, att); /* one session */
    } else {
        for (size_t i = 0; i < nvalid; i++) {
            kvt__session_t *s = sess[i];
            size_t m = 0;
            if (s == NULL)
                continue;
            for (size_t j = i; j < nvalid; j++) {
                if (sess[j] == s) {
                    grp[m++] = xf[j];
                    sess[j] = NULL;
                }
            }
            dispatch(b, s, grp, m, NULL); /* several: nothing to attach */
        }
    }
    for (size_t i = 0; i < nheld; i++)
        kvt__seg_unref(held[i]);
    if (xf != (kvt__xfer_t *)small)
        free(xf);
    return KVT_OK;
}

kvt_status_t kvt_batch_submit(kvt_batch_h b, const kvt_xfer_desc_t *descs,
                              size_t count)
{
    return batch_submit(b, descs, count, NULL);
}

kvt_status_t kvt_batch_query(kvt_batch_h b, kvt_batch_state_t *state_p)
{
    uint32_t pending, failed;
    int32_t first;

    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    pending = atomic_load_explicit(&b->pending, memory_order_acquire);
    failed = atomic_load_explicit(&b->failed, memory_order_relaxed);
    first = atomic_load_explicit(&b->first_error, memory_order_relaxed);
    /* kvt__comp_done() counts a slot failed just before it stops being
     * pending: read in between, the slot would be counted twice and
     * completed could wrap below 0. No count wraps here; the split is
     * exact once the batch is idle. */
    if (failed > b->used - pending)
        failed = (uint32_t)(b->used - pending);
    if (state_p != NULL) {
        state_p->submitted = b->used;
        state_p->pending = pending;
        state_p->failed = failed;
        state_p->completed = b->used - pending - failed;
        state_p->first_error = first;
    }
    if (pending > 0)
        return KVT_INPROGRESS;
    return first;
}

kvt_status_t kvt_batch_entry(kvt_batch_h b, size_t index, uint64_t *user_data_p)
{
    if (b == NULL || index >= b->used)
        return KVT_ERR_INVALID_PARAM;
    if (user_data_p)
        *user_data_p = b->slots[index].user_data;
    return atomic_load_explicit(&b->slots[index].status, memory_order_acquire);
}

/* Wait until no completer is still inside the batch. Completers leave
 * within a few instructions of the last decrement (and the idle call). */
static void drain_completers(kvt_batch_h b)
{
    while (atomic_load_explicit(&b->busy, memory_order_acquire) != 0)
        sched_yield();
}

/* kvt_batch_wait(); @att: an attachment kvt_batch_submit_wait()'s
 * submission made, taken over by progress() or ended here. */
static kvt_status_t batch_wait(kvt_batch_h b, int64_t timeout_ms, attach_t *att)
{
    uint64_t deadline = 0;
    /* All of the batch's work went to one place, which this thread can
     * drive itself. */
    int drive = b->hint != NULL && !b->hint_multi &&
                b->hint_sess->ops->progress != NULL &&
                atomic_load_explicit(&b->pending, memory_order_acquire) != 0;

    if (timeout_ms >= 0)
        deadline = kvt__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    if (att != NULL && att->sess != NULL) {
        kvt__session_t *s = att->sess;
        if (drive && b->hint == att->where && b->hint_sess == s)
            s->ops->progress(s, att->where, &b->pending,
                             timeout_ms >= 0 ? deadline : 0, 1);
        else
            s->ops->detach(s, att->where);
        att->sess = NULL;
    } else if (drive) {
        b->hint_sess->ops->progress(b->hint_sess, b->hint, &b->pending,
                                    timeout_ms >= 0 ? deadline : 0, 0);
    }
    for (;;) {
        uint32_t p = atomic_load_explicit(&b->pending, memory_order_acquire);
        int64_t left = -1;
        if (p == 0)
            break;
        if (timeout_ms >= 0) {
            uint64_t now = kvt__now_ns();
            if (now >= deadline)
                break;
            left = (int64_t)(deadline - now);
        }
        atomic_fetch_add(&b->sleepers, 1);
        if (atomic_load(&b->pending) == p)
            kvt__futex_wait(&b->pending, p, left);
        atomic_fetch_sub(&b->sleepers, 1);
    }
    /* Idle: let the idle call that made it so end first, so that the
     * caller sees its effects. */
    if (atomic_load_explicit(&b->pending, memory_order_acquire) == 0 &&
        atomic_load_explicit(&b->on_idle, memory_order_relaxed) != NULL)
        drain_completers(b);
    return kvt_batch_query(b, NULL);
}

kvt_status_t kvt_batch_wait(kvt_batch_h b, int64_t timeout_ms)
{
    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    return batch_wait(b, timeout_ms, NULL);
}

kvt_status_t kvt_batch_submit_wait(kvt_batch_h b, const kvt_xfer_desc_t *descs,
                                   size_t count, int64_t timeout_ms)
{
    attach_t att = {NULL, NULL};
    kvt_status_t st = batch_submit(b, descs, count, &att);

    if (st != KVT_OK) {
        /* Nothing was submitted, so nothing is attached. */
        return st;
    }
    return batch_wait(b, timeout_ms, &att);
}

kvt_status_t kvt_batch_set_idle_cb(kvt_batch_h b, kvt_batch_idle_cb_t cb,
                                   void *arg)
{
    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (cb != NULL) {
        b->on_idle_arg = arg;
        atomic_store_explicit(&b->on_idle, cb, memory_order_release);
        return KVT_OK;
    }
    atomic_store(&b->on_idle, NULL);
    drain_completers(b);
    return KVT_OK;
}

kvt_status_t kvt_batch_reset(kvt_batch_h b)
{
    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (atomic_load_explicit(&b->pending, memory_order_acquire) != 0)
        return KVT_ERR_BUSY;
    drain_completers(b);
    b->used = 0;
    batch_unhint(b);
    atomic_store(&b->failed, 0);
    atomic_store(&b->first_error, 0);
    return KVT_OK;
}

kvt_status_t kvt_batch_free(kvt_batch_h b)
{
    kvt_engine_h e;

    if (b == NULL)
        return KVT_OK;
    if (atomic_load_explicit(&b->pending, memory_order_acquire) != 0)
        return KVT_ERR_BUSY;
    drain_completers(b);
    batch_unhint(b);
    e = b->engine;
    pthread_mutex_lock(&e->batch_lock);
    if (b->prev)
        b->prev->next = b->next;
    else
        e->batches = b->next;
    if (b->next)
        b->next->prev = b->prev;
    pthread_mutex_unlock(&e->batch_lock);
    free(b->slots);
    free(b);
    return KVT_OK;
}

kvt_status_t kvt_notify_send(kvt_engine_h e, kvt_segment_t segment,
                             const void *msg, size_t length)
{
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;
    kvt_status_t st;

    if (e == NULL || (msg == NULL && length > 0))
        return KVT_ERR_INVALID_PARAM;
    if (length > KVT_NOTIFY_MAX)
        return KVT_ERR_OVERFLOW;
    st = kvt_batch_create(e, 1, &b);
    if (st != KVT_OK)
        return st;
    d.opcode = KVT_OP_NOTIFY;
    d.segment = segment;
    d.local_addr = (void *)msg;
    d.length = length;
    st = kvt_batch_submit(b, &d, 1);
    if (st == KVT_OK)
        st = kvt_batch_wait(b, -1);
    kvt_batch_free(b);
    return st;
}
