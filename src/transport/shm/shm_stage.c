/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging: small strided pieces written into memory that is not mapped
 * go through the channel's slots, packed here and copied out by the
 * target, which checks each run against its registry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/shm/shm_sess.h"

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

/* Copy a READ run's bytes out of the slot to where they go here (@ds:
 * a stream for device memory here): 0, or -1 (a device copy failed). */
static int run_out(const job_t *j, const hrun_t *r, const kvt__shm_slot_t *sl,
                   kvt__dstream_t *ds)
{
    const seg_t *g = &j->segs[r->seg];
    uint8_t *dst = (uint8_t *)(uintptr_t)r->laddr;
    const uint8_t *src = sl->data + r->off;
    uint64_t ls = r->count > 1 ? g->lstride : r->len;

    if (g->ldev < 0) {
        kvt__shm_copy_strided(dst, ls, src, r->len, r->len, r->count, 0);
        return 0;
    }
    if (ds == NULL ||
        kvt__dev_copy2d(ds, dst, ls, src, r->len, r->len, r->count) != 0)
        return -1;
    return kvt__dev_sync(ds);
}

/* Take the verdicts of the held slots the target is done with (all of
 * them with @all, waiting for the target), copy a READ slot's bytes out,
 * and free those slots. */
static kvt_status_t held_collect(shm_session_t *s, job_t *j, held_t *h, int all,
                                 kvt__dstream_t *ds)
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
                    memcpy(h->run[kept], h->run[x],
                           h->nruns[x] * sizeof(h->run[x][0]));
                }
                kept++;
                continue;
            }
            for (uint32_t r = 0; r < h->nruns[x]; r++) {
                const hrun_t *hr = &h->run[x][r];
                seg_t *g = &j->segs[hr->seg];
                if (g->st != KVT_OK)
                    continue;
                if (sl->runs[r].st != KVT_OK)
                    g->st = KVT_ERR_ACCESS;
                else if (j->op == KVT_OP_READ && run_out(j, hr, sl, ds) != 0)
                    g->st = KVT_ERR_IO;
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
                               kvt__dstream_t *ds, uint32_t *k_p)
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
        st = held_collect(s, j, h, 0, ds);
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
 * Move the pieces of the segments marked HOW_STAGE through the staging
 * slots: pack runs of pieces (a piece larger than a slot in slot-sized
 * parts) into a claimed slot, with their bytes for a WRITE, hand it to
 * the target (full, and a bell), and once every slot is done take the
 * target's verdict per run, and for a READ the bytes. Device memory here
 * is copied through a stream of the job. No lease is held: the target
 * checks each run against its registry itself. Returns a status for the
 * whole session when the target does not answer (dead, or stopped past
 * the deadline).
 */
kvt_status_t kvt__shm_stage_run(shm_session_t *s, job_t *j, const uint8_t *how)
{
    kvt__shm_chan_t *ch = s->ch;
    held_t *h = malloc(sizeof(*h)); /* 48 KiB */
    struct kvt__shm_dstream *dsp = NULL;
    kvt__dstream_t *ds = NULL;
    kvt__shm_slot_t *sl = NULL;
    uint32_t k = 0;
    uint64_t used = 0;
    kvt_status_t st = KVT_OK, cst;

    if (h == NULL) {
        kvt__shm_segs_fail(j, 0, j->nsegs, KVT_ERR_NO_MEMORY);
        return KVT_OK;
    }
    h->n = 0;
    for (uint32_t i = 0; i < j->nsegs; i++) {
        if (how[i] == HOW_STAGE && j->segs[i].st == KVT_OK &&
            j->segs[i].ldev >= 0) {
            dsp = kvt__shm_dstream_get(s->shm, j->segs[i].ldev);
            ds = dsp != NULL ? dsp->s : NULL;
            break;
        }
    }

    for (uint32_t i = 0; i < j->nsegs && st == KVT_OK; i++) {
        seg_t *g = &j->segs[i];
        /* A piece: whole, or in parts of at most a slot. */
        uint64_t part =
            g->len < KVT_SHM_STAGE_BYTES ? g->len : KVT_SHM_STAGE_BYTES;
        uint32_t p = 0;
        uint64_t off = 0;

        if (how[i] != HOW_STAGE || g->st != KVT_OK)
            continue;
        if (g->ldev >= 0 && ds == NULL) {
            g->st = KVT_ERR_IO;
            continue;
        }
        while (p < g->count && g->st == KVT_OK) {
            kvt__shm_run_t *r;
            hrun_t *hr;
            uint64_t n, len = part < g->len - off ? part : g->len - off;
            uint8_t *data;

            if (sl != NULL && (h->nruns[h->n - 1] == KVT_SHM_STAGE_RUNS ||
                               KVT_SHM_STAGE_BYTES - used < len)) {
                atomic_store_explicit(&sl->state, KVT_SHM_SLOT_FULL,
                                      memory_order_release);
                kvt__shm_ring_bell(s);
                sl = NULL;
            }
            if (sl == NULL) {
                st = slot_claim(s, j, h, ds, &k);
                if (st != KVT_OK)
                    break;
                sl = &ch->stage[k];
                sl->nruns = 0;
                sl->op = j->op;
                used = 0;
                h->slot[h->n] = k;
                h->nruns[h->n++] = 0;
            }
            /* Whole pieces as many as fit; a part of a large one alone. */
            n = len == g->len ? (KVT_SHM_STAGE_BYTES - used) / len : 1;
            if (n > g->count - p)
                n = g->count - p;
            r = &sl->runs[h->nruns[h->n - 1]];
            hr = &h->run[h->n - 1][h->nruns[h->n - 1]];
            r->raddr = g->raddr + p * g->rstride + off;
            r->rstride = n > 1 ? g->rstride : len;
            r->off = used;
            r->len = (uint32_t)len;
            r->count = (uint32_t)n;
            r->st = KVT_OK;
            *hr = (hrun_t){g->laddr + p * g->lstride + off, i, (uint32_t)used,
                           (uint32_t)len, (uint32_t)n};
            sl->nruns = ++h->nruns[h->n - 1];
            data = sl->data + used;
            if (j->op == KVT_OP_WRITE) {
                const uint8_t *src = (const uint8_t *)(uintptr_t)hr->laddr;
                uint64_t ls = n > 1 ? g->lstride : len;
                if (g->ldev < 0) {
                    /* Plain stores: the target reads the slot next. */
                    kvt__shm_copy_strided(data, len, src, ls, len, n, 0);
                } else if (kvt__dev_copy2d(ds, data, len, src, ls, len, n) !=
                               0 ||
                           kvt__dev_sync(ds) != 0) {
                    g->st = KVT_ERR_IO; /* the run is refused below */
                    r->count = 0;
                }
            }
            used += n * len;
            off += len;
            if (off == g->len) {
                off = 0;
                p += (uint32_t)n;
            }
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
    cst = held_collect(s, j, h, 1, ds);
    if (st != KVT_OK || cst != KVT_OK)
        held_retract(s, h);
    free(h);
    if (dsp != NULL)
        kvt__shm_dstream_put(s->shm, dsp);
    return st != KVT_OK ? st : cst;
}
