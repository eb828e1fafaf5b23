/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches: slot bookkeeping, validation and dispatch of descriptors to the
 * sessions' transports, and waiting.
 *
 * Accounting invariant: @pending counts submitted slots that are not final.
 * It is raised by the whole submission before any descriptor can complete,
 * and lowered exactly once per slot by kvt__slot_done() when the slot's
 * last piece completes. A waiter sleeps on @pending as a futex word.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "util/futex.h"
#include "util/log.h"
#include "util/time.h"

#define BATCH_MAX_CAPACITY (1u << 20)

void kvt__slot_done(kvt_batch_h b, uint32_t index, kvt_status_t status)
{
    kvt__slot_t *s = &b->slots[index];
    int32_t final;

    if (status != KVT_OK) {
        int32_t zero = 0;
        atomic_compare_exchange_strong_explicit(&s->err, &zero, status,
                                                memory_order_relaxed,
                                                memory_order_relaxed);
    }
    if (atomic_fetch_sub_explicit(&s->remaining, 1, memory_order_acq_rel) != 1)
        return;
    final = atomic_load_explicit(&s->err, memory_order_relaxed);
    atomic_store_explicit(&s->status, final, memory_order_release);
    if (final != KVT_OK) {
        int32_t zero = 0;
        atomic_fetch_add_explicit(&b->failed, 1, memory_order_relaxed);
        atomic_compare_exchange_strong(&b->first_error, &zero, final);
    }
    /* Sequentially consistent with the waiter's "sleepers++, re-read
     * pending": either it sees pending at 0, or this sees it asleep. */
    if (atomic_fetch_sub(&b->pending, 1) == 1) {
        void (*fn)(void *) = atomic_load_explicit(&b->on_idle,
                                                  memory_order_acquire);
        if (atomic_load(&b->sleepers))
            kvt__futex_wake_all(&b->pending);
        if (fn != NULL)
            fn(b->on_idle_arg);
    }
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
    pthread_mutex_lock(&e->batch_lock);
    b->next = e->batches;
    if (e->batches)
        e->batches->prev = b;
    e->batches = b;
    pthread_mutex_unlock(&e->batch_lock);
    *batch_p = b;
    return KVT_OK;
}

static kvt_status_t validate(kvt_engine_h e, const kvt_xfer_desc_t *d)
{
    uint64_t span, c;

    if (d->opcode == KVT_OP_NOTIFY) {
        if (d->length > KVT_NOTIFY_MAX)
            return KVT_ERR_OVERFLOW;
        if (d->length > 0 && d->local_addr == NULL)
            return KVT_ERR_INVALID_PARAM;
        return KVT_OK;
    }
    if ((d->opcode != KVT_OP_READ && d->opcode != KVT_OP_WRITE) ||
        d->length == 0 || d->local_addr == NULL)
        return KVT_ERR_INVALID_PARAM;
    c = d->count > 1 ? d->count : 1;
    if (c > 1) {
        uint64_t ls = d->local_stride ? d->local_stride : d->length;
        uint64_t rs = d->remote_stride ? d->remote_stride : d->length;
        if (ls < d->length || rs < d->length ||
            ls > (UINT64_MAX - d->length) / (c - 1) ||
            rs > (UINT64_MAX - d->length) / (c - 1))
            return KVT_ERR_INVALID_PARAM;
        span = rs * (c - 1) + d->length;
        if (d->remote_addr > UINT64_MAX - span)
            return KVT_ERR_INVALID_PARAM;
        span = ls * (c - 1) + d->length;
    } else {
        span = d->length;
        if (d->remote_addr > UINT64_MAX - span)
            return KVT_ERR_INVALID_PARAM;
    }
    if (!kvt__memreg_contains_locked(&e->reg, (uint64_t)(uintptr_t)d->local_addr,
                                     span, 0))
        return KVT_ERR_NOT_REGISTERED;
    return KVT_OK;
}

kvt_status_t kvt_batch_submit(kvt_batch_h b, const kvt_xfer_desc_t *descs,
                              size_t count)
{
    kvt_engine_h e;
    size_t base, nvalid = 0;
    uint32_t *idx, *grp;
    kvt__session_t **sess;
    kvt_segment_t last_id = 0;
    kvt__session_t *last = NULL;

    if (b == NULL || (descs == NULL && count > 0))
        return KVT_ERR_INVALID_PARAM;
    if (count == 0)
        return KVT_OK;
    if (count > b->capacity - b->used)
        return KVT_ERR_NO_SPACE;
    e = b->engine;
    idx = malloc(count * (2 * sizeof(uint32_t) + sizeof(*sess)));
    if (idx == NULL)
        return KVT_ERR_NO_MEMORY;
    grp = idx + count;
    sess = (kvt__session_t **)(grp + count);

    base = b->used;
    b->used += count;
    for (size_t i = 0; i < count; i++) {
        kvt__slot_t *s = &b->slots[base + i];
        atomic_store_explicit(&s->status, KVT_INPROGRESS, memory_order_relaxed);
        atomic_store_explicit(&s->err, KVT_OK, memory_order_relaxed);
        atomic_store_explicit(&s->remaining, 0, memory_order_relaxed);
        s->user_data = descs[i].user_data;
    }
    atomic_fetch_add_explicit(&b->pending, (uint32_t)count,
                              memory_order_release);

    /* Validate; fail the bad slots at once; note each good one's session. */
    kvt__batch_enter(b);
    kvt__memreg_rdlock(&e->reg);
    for (size_t i = 0; i < count; i++) {
        const kvt_xfer_desc_t *d = &descs[i];
        kvt_status_t st = validate(e, d);
        kvt__session_t *s = NULL;

        if (st == KVT_OK) {
            if (d->segment != last_id || last == NULL) {
                last = kvt__engine_find_session(e, d->segment);
                last_id = d->segment;
            }
            s = last;
            if (s == NULL)
                st = KVT_ERR_NOT_FOUND;
            else if (atomic_load(&s->dead))
                st = atomic_load(&s->dead);
        }
        if (st != KVT_OK) {
            atomic_store_explicit(&b->slots[base + i].remaining, 1,
                                  memory_order_relaxed);
            kvt__slot_done(b, (uint32_t)(base + i), st);
            continue;
        }
        idx[nvalid] = (uint32_t)i;
        sess[nvalid] = s;
        nvalid++;
    }
    kvt__memreg_unlock(&e->reg);
    kvt__batch_leave(b);

    /* Hand each session its descriptors, in submission order. */
    for (size_t i = 0; i < nvalid; i++) {
        kvt__session_t *s = sess[i];
        size_t m = 0;
        if (s == NULL)
            continue;
        for (size_t j = i; j < nvalid; j++) {
            if (sess[j] == s) {
                grp[m++] = idx[j];
                sess[j] = NULL;
            }
        }
        if (s->ops->submit(s, b, descs, grp, m, base) != KVT_OK) {
            kvt__batch_enter(b);
            for (size_t j = 0; j < m; j++) {
                atomic_store(&b->slots[base + grp[j]].remaining, 1);
                kvt__slot_done(b, (uint32_t)(base + grp[j]), KVT_ERR_NO_MEMORY);
            }
            kvt__batch_leave(b);
        }
    }
    free(idx);
    return KVT_OK;
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

kvt_status_t kvt_batch_entry(kvt_batch_h b, size_t index,
                             uint64_t *user_data_p)
{
    if (b == NULL || index >= b->used)
        return KVT_ERR_INVALID_PARAM;
    if (user_data_p)
        *user_data_p = b->slots[index].user_data;
    return atomic_load_explicit(&b->slots[index].status, memory_order_acquire);
}

kvt_status_t kvt_batch_wait(kvt_batch_h b, int64_t timeout_ms)
{
    uint64_t deadline = 0;

    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (timeout_ms >= 0)
        deadline = kvt__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    if (b->hint != NULL && !b->hint_multi && b->hint_ops->wait != NULL &&
        atomic_load_explicit(&b->pending, memory_order_acquire) != 0)
        b->hint_ops->wait(b->hint, b, timeout_ms >= 0 ? deadline : 0);
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
    return kvt_batch_query(b, NULL);
}

/* Wait until no completer is still inside the batch. Completers leave
 * within a few instructions of the last decrement. */
static void drain_completers(kvt_batch_h b)
{
    while (atomic_load_explicit(&b->busy, memory_order_acquire) != 0)
        sched_yield();
}

void kvt__batch_on_idle(kvt_batch_h b, void (*fn)(void *), void *arg)
{
    if (fn != NULL) {
        b->on_idle_arg = arg;
        atomic_store_explicit(&b->on_idle, fn, memory_order_release);
        return;
    }
    atomic_store(&b->on_idle, NULL);
    drain_completers(b);
}

kvt_status_t kvt_batch_reset(kvt_batch_h b)
{
    if (b == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (atomic_load_explicit(&b->pending, memory_order_acquire) != 0)
        return KVT_ERR_BUSY;
    drain_completers(b);
    b->used = 0;
    b->hint = NULL;
    b->hint_ops = NULL;
    b->hint_multi = 0;
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
