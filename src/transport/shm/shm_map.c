/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mappings of the target's kvt_mem_alloc() memory: asked for over the
 * socket, mapped, reconciled with the registry snapshot, and the copies
 * through them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* With map_lock held. */
map_t *kvt__shm_map_find(shm_session_t *s, uint32_t id)
{
    for (size_t i = 0; i < s->nmaps; i++)
        if (s->maps[i].id == id)
            return &s->maps[i];
    return NULL;
}

/* Whether a request for allocation @id's memfd was refused since the
 * last snapshot. With map_lock held. */
int kvt__shm_map_refused(shm_session_t *s, uint32_t id)
{
    for (unsigned i = 0; i < s->nnomap; i++)
        if (s->nomap[i] == id)
            return 1;
    return 0;
}

/* Release the mappings of allocations that left the snapshot. Called
 * under the lease, so the snapshot is stable and no copy of this session
 * uses a mapping it does not name. */
void kvt__shm_maps_reconcile(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;

    pthread_rwlock_wrlock(&s->map_lock);
    if (atomic_load(&s->map_seq) != ch->snap_seq) {
        size_t k = 0;
        for (size_t i = 0; i < s->nmaps; i++) {
            int named = 0;
            for (uint32_t r = 0; r < n && !named; r++)
                named = ch->regions[r].map_id == s->maps[i].id;
            if (named) {
                s->maps[k++] = s->maps[i];
            } else {
                KVT_LOG_D("shm: releasing the mapping of allocation %u of %s",
                          s->maps[i].id, s->base.name);
                munmap(s->maps[i].local, s->maps[i].len);
            }
        }
        s->nmaps = k;
        atomic_store(&s->mapped, (uint32_t)k);
        s->nnomap = 0;
        kvt__shm_ipcs_reconcile_locked(s);
        atomic_store(&s->map_seq, ch->snap_seq);
    }
    pthread_rwlock_unlock(&s->map_lock);
}

/*
 * Ask the target for allocation @id's memfd and map it, outside the lease
 * (the target answers from its service thread). A refusal is remembered
 * until the snapshot changes. Bounded by the socket's receive timeout.
 *
 * The mapping is not populated nor touched here: the first copy through
 * it faults in the pages it uses, and only those. A peer's KV memory is
 * often far larger than what one transfer reaches, and where the first
 * access to each page of a new mapping traps to the hypervisor (several
 * microseconds a page on some virtual machines), warming all of it made
 * every open cost tens of milliseconds per 64 MiB, paid again by every
 * process that opens the segment.
 */
void kvt__shm_map_request(shm_session_t *s, uint32_t id)
{
    kvt__shm_msg_t m;
    int fd = -1, known;
    uint8_t *p;

    pthread_mutex_lock(&s->sock_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    known = kvt__shm_map_find(s, id) != NULL || kvt__shm_map_refused(s, id);
    pthread_rwlock_unlock(&s->map_lock);
    if (known)
        goto out;
    kvt__shm_msg_init(&m, KVT_SHM_MAP);
    m.id = id;
    m.seq = ++s->req_seq;
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
        goto out;
    for (;;) { /* skip answers to requests that timed out earlier */
        kvt__shm_msg_t a;
        if (kvt__shm_recv_msg(s->sock, &a, &fd) != (ssize_t)sizeof(a) ||
            a.magic != KVT_SHM_MAGIC ||
            (a.type != KVT_SHM_MAP_ACK && a.type != KVT_SHM_IPC_ACK) ||
            (a.seq == m.seq && a.type != KVT_SHM_MAP_ACK))
            goto out;
        if (a.seq == m.seq) {
            m = a;
            break;
        }
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    p = MAP_FAILED;
    if (m.status == KVT_OK && fd >= 0 && m.id == id && m.length > 0 &&
        m.addr <= UINT64_MAX - m.length && kvt__shm_memfd_sound(fd, m.length))
        p = mmap(NULL, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_rwlock_wrlock(&s->map_lock);
    if (p != MAP_FAILED) {
        if (s->nmaps == s->mcap) {
            size_t cap = s->mcap ? 2 * s->mcap : 8;
            map_t *n = realloc(s->maps, cap * sizeof(*n));
            if (n == NULL) {
                munmap(p, m.length);
                p = MAP_FAILED;
            } else {
                s->maps = n;
                s->mcap = cap;
            }
        }
    }
    if (p != MAP_FAILED) {
        s->maps[s->nmaps++] = (map_t){id, m.addr, m.length, p};
        atomic_store(&s->mapped, (uint32_t)s->nmaps);
        KVT_LOG_D("shm: mapped allocation %u of %s (%llu bytes)", id,
                  s->base.name, (unsigned long long)m.length);
    } else if (s->nnomap < NOMAP_MAX) {
        s->nomap[s->nnomap++] = id;
    }
    pthread_rwlock_unlock(&s->map_lock);
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&s->sock_lock);
}

/* The mapped segments of @j not yet copied (loc set), merged while
 * contiguous on both sides; strided ones as one strided copy each. A
 * write streams each run from 4 KiB up (kvt__shm_copy_piece()) and
 * fences once after the last. */
void kvt__shm_rw_copy_maps(job_t *j, rw_plan_t *p)
{
    int fence = 0;

    for (uint32_t i = 0; i < j->nsegs && p->nmap > 0;) {
        const seg_t *g = &j->segs[i];
        uint8_t **loc = p->loc;
        uint64_t len = g->len;
        uint32_t k;

        if (loc[i] == NULL) {
            i++;
            continue;
        }
        if (g->count > 1) {
            uint8_t *l = (uint8_t *)(uintptr_t)g->laddr;
            if (j->op == KVT_OP_WRITE)
                kvt__shm_copy_strided(loc[i], g->rstride, l, g->lstride, g->len,
                                      g->count, 1);
            else
                kvt__shm_copy_strided(l, g->lstride, loc[i], g->rstride, g->len,
                                      g->count, 0);
            i++;
            continue;
        }
        for (k = i + 1;
             k < j->nsegs && j->segs[k].count == 1 && loc[k] == loc[i] + len &&
             j->segs[k].laddr == g->laddr + len;
             k++)
            len += j->segs[k].len;
        if (j->op == KVT_OP_WRITE)
            fence |= kvt__shm_copy_piece(
                loc[i], (const void *)(uintptr_t)g->laddr, len);
        else
            kvt__shm_copy((void *)(uintptr_t)g->laddr, loc[i], len, 0);
        i = k;
    }
    if (fence)
        kvt__shm_copy_fence();
}

/*
 * Map the allocations the first snapshot names, before the session is
 * used, while @deadline allows: the target's KV memory is then ready for
 * the first transfers. Anything left is mapped on first use (cross-memory
 * attach carries those transfers meanwhile).
 */
void kvt__shm_maps_prefetch(shm_session_t *s, uint64_t deadline)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t ids[16], nids = 0, n;

    atomic_fetch_add(&ch->active, 1);
    if (atomic_load(&ch->lease) & 1) {
        n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions
                                               : KVT_SHM_MAX_REGIONS;
        for (uint32_t r = 0; r < n && nids < 16; r++) {
            uint32_t id = ch->regions[r].map_id, k = 0;
            while (k < nids && ids[k] != id)
                k++;
            if (id != 0 && k == nids)
                ids[nids++] = id;
        }
    }
    kvt__shm_lease_release(s);
    for (uint32_t i = 0; i < nids && kvt__now_ns() < deadline; i++)
        kvt__shm_map_request(s, ids[i]);
}
