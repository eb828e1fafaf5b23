/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The target's half of staging: copying out the slots initiators filled,
 * each run checked against the registry first, by the service thread and
 * a helper thread beside it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/log.h"
#include "util/time.h"

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
        uint32_t nruns;

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
        kvt__memreg_rdlock(reg);
        for (uint32_t i = 0; i < nruns; i++) {
            kvt__shm_run_t run, *r = &run;
            uint64_t len, cnt, span = 0;
            int ok;
            /* One read of what the peer can change at any time. */
            memcpy(&run, &sl->runs[i], sizeof(run));
            len = run.len;
            cnt = run.count;
            ok = kvt__shm_run_check(&run, &span);
            /* The span in one region, or else each piece in one. */
            /* Host memory only: this thread copies with its own hands. */
            if (ok && !kvt__memreg_contains_host_locked(
                          reg, r->raddr, span, KVT_ACCESS_REMOTE_WRITE)) {
                for (uint64_t p = 0; ok && p < cnt; p++)
                    ok = kvt__memreg_contains_host_locked(
                        reg, r->raddr + p * r->rstride, len,
                        KVT_ACCESS_REMOTE_WRITE);
            }
            if (ok) {
                const uint8_t *src = sl->data + r->off;
#ifdef KVT_TSAN
                for (uint64_t p = 0; p < cnt; p++, src += len)
                    stage_copy((void *)(uintptr_t)(r->raddr + p * r->rstride),
                               src, len);
#else
                kvt__shm_copy_strided((void *)(uintptr_t)r->raddr, r->rstride,
                                      src, len, len, cnt, 1);
#endif
            }
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
