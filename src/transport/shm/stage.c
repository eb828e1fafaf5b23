/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging: small strided pieces written into memory that is not mapped
 * go through the channel's slots, packed here and copied out by the
 * target, which checks each run against its registry.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* Give a slot back and tell whoever waits for one. */
static void slot_free(shm_session_t *s, uint32_t k)
{
    kvt__shm_chan_t *ch = s->ch;

    atomic_store_explicit(&ch->stage[k].state, KVT_SHM_SLOT_FREE,
                          memory_order_release);
    atomic_fetch_add(&ch->stage_seq, 1);
    if (atomic_load(&ch->waiters) != 0)
        kvt__shm_futex_wake(&ch->stage_seq);
}

/* Take the verdicts of the held slots the target is done with (all of
 * them with @all, waiting for the target) and free those slots. */
static kvt_status_t held_collect(shm_session_t *s, job_t *j, held_t *h, int all)
{
    kvt__shm_chan_t *ch = s->ch;

    while (h->n > 0) {
        uint32_t seq = atomic_load(&ch->stage_seq), kept = 0;
        for (uint32_t x = 0; x < h->n; x++) {
            kvt__shm_slot_t *sl = &ch->stage[h->slot[x]];
            if (atomic_load_explicit(&sl->state, memory_order_acquire) !=
                KVT_SHM_SLOT_DONE) {
                if (kept != x) {
                    h->slot[kept] = h->slot[x];
                    h->nruns[kept] = h->nruns[x];
                    memcpy(h->seg[kept], h->seg[x], sizeof(h->seg[x]));
                }
                kept++;
                continue;
            }
            for (uint32_t r = 0; r < h->nruns[x]; r++) {
                seg_t *g = &j->segs[h->seg[x][r]];
                if (g->st == KVT_OK && sl->runs[r].st != KVT_OK)
                    g->st = KVT_ERR_ACCESS;
            }
            slot_free(s, h->slot[x]);
        }
        h->n = kept;
        if (!all || h->n == 0)
            return KVT_OK;
        {
            kvt_status_t st =
                kvt__shm_ring_wait(s, &ch->stage_seq, seq, j->deadline);
            if (st != KVT_OK)
                return st;
        }
    }
    return KVT_OK;
}

/* Claim a free slot for @h, collecting this job's finished ones first
 * when none is free, and waiting (bounded by the job's deadline). */
static kvt_status_t slot_claim(shm_session_t *s, job_t *j, held_t *h,
                               uint32_t *k_p)
{
    kvt__shm_chan_t *ch = s->ch;

    for (;;) {
        uint32_t seq = atomic_load(&ch->stage_seq);
        kvt_status_t st;
        for (uint32_t k = 0; k < KVT_SHM_STAGE_SLOTS; k++) {
            uint32_t f = KVT_SHM_SLOT_FREE;
            if (atomic_compare_exchange_strong(&ch->stage[k].state, &f,
                                               KVT_SHM_SLOT_CLAIMED)) {
                *k_p = k;
                return KVT_OK;
            }
        }
        st = held_collect(s, j, h, 0);
        if (st != KVT_OK)
            return st;
        if (atomic_load(&ch->stage_seq) != seq)
            continue;
        st = kvt__shm_ring_wait(s, &ch->stage_seq, seq, j->deadline);
        if (st != KVT_OK)
            return st;
    }
}

/*
 * Take back the held slots the target has not taken (full to free), when
 * the job fails: a target that runs again later must not copy them out
 * over what a new session wrote meanwhile. A slot it took is being copied
 * by its service thread or its helper (under chan_lock), which both end
 * that copy before the target answers another HELLO.
 */
static void held_retract(shm_session_t *s, held_t *h)
{
    kvt__shm_chan_t *ch = s->ch;

    for (uint32_t x = 0; x < h->n; x++) {
        uint32_t full = KVT_SHM_SLOT_FULL;
        atomic_compare_exchange_strong(&ch->stage[h->slot[x]].state, &full,
                                       KVT_SHM_SLOT_FREE);
    }
}

/*
 * Write the pieces of the segments marked HOW_STAGE through the staging
 * slots: pack runs of pieces into a claimed slot, hand it to the target
 * (full, and a bell), and once every slot is done take the target's
 * verdict per run. No lease is held: the target checks each run against
 * its registry itself. Returns a status for the whole session when the
 * target does not answer (dead, or stopped past the deadline).
 */
kvt_status_t kvt__shm_stage_run(shm_session_t *s, job_t *j, const uint8_t *how)
{
    kvt__shm_chan_t *ch = s->ch;
    held_t h; /* 4 KiB */
    kvt__shm_slot_t *sl = NULL;
    uint32_t k = 0, *segof = NULL;
    uint64_t used = 0;
    kvt_status_t st = KVT_OK, cst;

    h.n = 0;

    for (uint32_t i = 0; i < j->nsegs && st == KVT_OK; i++) {
        const seg_t *g = &j->segs[i];
        uint32_t p = 0;

        if (how[i] != HOW_STAGE || g->st != KVT_OK)
            continue;
        while (p < g->count) {
            kvt__shm_run_t *r;
            uint64_t n;
            const uint8_t *src;
            uint8_t *dst;

            if (sl != NULL && (h.nruns[h.n - 1] == KVT_SHM_STAGE_RUNS ||
                               KVT_SHM_STAGE_BYTES - used < g->len)) {
                atomic_store_explicit(&sl->state, KVT_SHM_SLOT_FULL,
                                      memory_order_release);
                kvt__shm_ring_bell(s);
                sl = NULL;
            }
            if (sl == NULL) {
                st = slot_claim(s, j, &h, &k);
                if (st != KVT_OK)
                    break;
                sl = &ch->stage[k];
                sl->nruns = 0;
                used = 0;
                h.slot[h.n] = k;
                h.nruns[h.n] = 0;
                segof = h.seg[h.n++];
            }
            n = (KVT_SHM_STAGE_BYTES - used) / g->len;
            if (n > g->count - p)
                n = g->count - p;
            r = &sl->runs[h.nruns[h.n - 1]];
            r->raddr = g->raddr + p * g->rstride;
            r->rstride = g->rstride;
            r->off = used;
            r->len = (uint32_t)g->len;
            r->count = (uint32_t)n;
            r->st = KVT_OK;
            segof[h.nruns[h.n - 1]++] = i;
            sl->nruns = h.nruns[h.n - 1];
            src = (const uint8_t *)(uintptr_t)(g->laddr + p * g->lstride);
            dst = sl->data + used;
            /* Plain stores: the target reads the slot next. */
            kvt__shm_copy_strided(dst, g->len, src, g->lstride, g->len, n, 0);
            used += n * g->len;
            p += (uint32_t)n;
        }
    }
    if (sl != NULL) {
        atomic_store_explicit(&sl->state, KVT_SHM_SLOT_FULL,
                              memory_order_release);
        kvt__shm_ring_bell(s);
    }
    /* Also after a failure: what the target finishes is freed; what it
     * has not taken is taken back; what it took and never finishes stays
     * with the dying session. */
    cst = held_collect(s, j, &h, 1);
    if (st != KVT_OK || cst != KVT_OK)
        held_retract(s, &h);
    return st != KVT_OK ? st : cst;
}
