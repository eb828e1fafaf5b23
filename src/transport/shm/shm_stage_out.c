/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The target's half of staging: copying out the slots initiators filled,
 * each run checked against the registry first, by the service thread and
 * a helper thread beside it.
 */
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <unistd.h> /* IWYU pragma: keep */

#include "core/memreg.h"
#include "mem/md.h"
#include "transport/shm/shm.h"
#include "util/log.h"
#include "util/thread.h"

#ifdef KVT_TSAN
/* Copies into this process's memory vouched for by the initiator's
 * protocol, which ThreadSanitizer cannot see: issue them as a system call
 * (as the TCP transport does its payload reads). */
static void stage_copy(void *dst, const void *src, size_t len)
{
    struct iovec l = {(void *)src, len}, r = {dst, len};
    syscall(SYS_process_vm_writev, (long)getpid(), &l, 1ul, &r, 1ul, 0ul);
}
#endif

static void *helper_main(void *arg);

/* Copy one piece between the slot and registered memory of @r (host
 * memory with this thread's stores; device memory through the driver):
 * 1, or 0 when a device copy failed. */
static int piece_copy(const kvt__region_t *r, uint8_t *mem, uint8_t *slot,
                      uint64_t len, uint32_t op)
{
    const kvt__md_ops_t *md;

    if (r->kind == KVT_MEM_HOST) {
#ifdef KVT_TSAN
        if (op == KVT_OP_WRITE)
            stage_copy(mem, slot, len);
        else
            stage_copy(slot, mem, len);
#else
        if (op == KVT_OP_WRITE)
            kvt__shm_copy(mem, slot, len, 1);
        else
            memcpy(slot, mem, len);
#endif
        return 1;
    }
    md = kvt__md_of((kvt_mem_kind_t)r->kind);
    if (md == NULL || md->copy == NULL)
        return 0;
    return op == KVT_OP_WRITE ? md->copy(mem, slot, len) == 1
                              : md->copy(slot, mem, len) == 1;
}

/*
 * One staged run (untrusted, read once into @r): each piece must lie in
 * one registered region with the access @op needs; a run whose span lies
 * in one host region is copied in one strided pass. With the registry's
 * read lock held. 1 when every piece was copied, else 0 (possibly after
 * some were).
 */
static int run_copy(const kvt__shm_run_t *r, uint8_t *data, kvt__memreg_t *reg,
                    uint32_t op)
{
    uint32_t access =
        op == KVT_OP_WRITE ? KVT_ACCESS_REMOTE_WRITE : KVT_ACCESS_REMOTE_READ;
    const kvt__region_t *g;
    uint64_t span = 0;
    uint8_t *src;

    if (!kvt__shm_run_check(r, &span))
        return 0;
    src = data + r->off;
    g = kvt__memreg_find_locked(reg, r->raddr, span);
    if (g != NULL && (g->access & access) == access &&
        g->kind == KVT_MEM_HOST && op == KVT_OP_WRITE) {
#ifdef KVT_TSAN
        for (uint64_t p = 0; p < r->count; p++, src += r->len)
            stage_copy((void *)(uintptr_t)(r->raddr + p * r->rstride), src,
                       r->len);
#else
        kvt__shm_copy_strided((void *)(uintptr_t)r->raddr, r->rstride, src,
                              r->len, r->len, r->count, 1);
#endif
        return 1;
    }
    for (uint64_t p = 0; p < r->count; p++, src += r->len) {
        uint64_t a = r->raddr + p * r->rstride;
        g = kvt__memreg_find_locked(reg, a, r->len);
        if (g == NULL || (g->access & access) != access ||
            !piece_copy(g, (uint8_t *)(uintptr_t)a, src, r->len, op))
            return 0;
    }
    return 1;
}

/* Have the helper thread copy out slots beside the service thread,
 * starting it the first time. Service thread only. */
static void helper_call(kvt__shm_t *shm)
{
    if (!shm->helper_running) {
        if (shm->helper_failed)
            return;
        if (pthread_create(&shm->helper, NULL, helper_main, shm) != 0) {
            shm->helper_failed = 1;
            return;
        }
        shm->helper_running = 1;
        KVT_LOG_D("shm: stage helper started");
    }
    atomic_fetch_add(&shm->helper_seq, 1);
    kvt__shm_futex_wake(&shm->helper_seq);
}

/*
 * Copy out the slots the initiator made full: each run is checked against
 * the registry (under its read lock, which the copies also hold, so a
 * range being unregistered is either copied before or refused) and gets
 * its verdict. Everything read from the slot is untrusted: runs and
 * their data must lie within the slot, or the run is refused. Called by
 * the service thread and by the helper (@helper; under chan_lock): each
 * slot is taken (full to busy) by one of them. The service thread calls
 * the helper when it takes a slot and sees another one full.
 */
void kvt__shm_consume_stage(kvt__shm_t *shm, shm_tchan_t *c, int helper)
{
    kvt__shm_chan_t *ch = c->ch;
    kvt__memreg_t *reg = shm->reg;
    int any = 0;

    for (uint32_t k = 0; k < KVT_SHM_STAGE_SLOTS; k++) {
        kvt__shm_slot_t *sl = &ch->stage[k];
        uint32_t nruns, op;

        uint32_t full = KVT_SHM_SLOT_FULL;

        if (atomic_load_explicit(&sl->state, memory_order_relaxed) !=
                KVT_SHM_SLOT_FULL ||
            !atomic_compare_exchange_strong_explicit(
                &sl->state, &full, KVT_SHM_SLOT_BUSY, memory_order_acquire,
                memory_order_relaxed))
            continue;
        for (uint32_t q = k + 1; !helper && q < KVT_SHM_STAGE_SLOTS; q++)
            if (atomic_load_explicit(&ch->stage[q].state,
                                     memory_order_relaxed) ==
                KVT_SHM_SLOT_FULL) {
                helper_call(shm);
                break;
            }
        nruns = sl->nruns < KVT_SHM_STAGE_RUNS ? sl->nruns : KVT_SHM_STAGE_RUNS;
        op = sl->op; /* one read of what the peer can change */
        kvt__memreg_rdlock(reg);
        for (uint32_t i = 0; i < nruns; i++) {
            kvt__shm_run_t run;
            int ok;
            /* One read of what the peer can change at any time. */
            memcpy(&run, &sl->runs[i], sizeof(run));
            ok = (op == KVT_OP_WRITE || op == KVT_OP_READ) &&
                 run_copy(&run, sl->data, reg, op);
            sl->runs[i].st = ok ? KVT_OK : KVT_ERR_ACCESS;
        }
        kvt__memreg_unlock(reg);
        atomic_store_explicit(&sl->state, KVT_SHM_SLOT_DONE,
                              memory_order_release);
        any = 1;
    }
    if (!any)
        return;
    atomic_fetch_add_explicit(&ch->stage_seq, 1, memory_order_release);
    /* As in kvt__shm_consume_notes(): either the waiter sees the new value or
     * this sees it asleep. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&ch->waiters) != 0)
        kvt__shm_futex_wake(&ch->stage_seq);
}

/*
 * The helper: copies out full slots of every channel when the service
 * thread calls it, so that a target written by several initiators (or by
 * one faster than one thread copies out) copies with two threads. It
 * holds chan_lock while it looks, so channels cannot go away under it.
 */
static void *helper_main(void *arg)
{
    kvt__shm_t *shm = arg;

    kvt__thread_name("kvt-shm-stage");
    while (!atomic_load(&shm->helper_stop)) {
        uint32_t seq = atomic_load(&shm->helper_seq);
        pthread_mutex_lock(&shm->chan_lock);
        for (shm_tchan_t *c = shm->chans; c != NULL; c = c->next)
            if (!c->dead)
                kvt__shm_consume_stage(shm, c, 1);
        pthread_mutex_unlock(&shm->chan_lock);
        if (atomic_load(&shm->helper_seq) == seq)
            kvt__shm_futex_wait(&shm->helper_seq, seq, -1);
    }
    return NULL;
}
