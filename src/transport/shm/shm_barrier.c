/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry barrier (the bounds guarantee explained in shm_target.c):
 * snapshots of the registry in every channel, the lease closed, drained
 * and reopened around each change; and the Yama ptracer grant that lets
 * the same-host initiator this process serves attach to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include "transport/shm/shm.h"
#include "util/log.h"
#include "util/time.h"

/*
 * The Yama ptracer grant. Where ptrace_scope is 1, attaching to this
 * process (process_vm_readv/writev) is allowed to its ancestors and to the
 * one process it names with PR_SET_PTRACER (and that one's descendants).
 * The attribute belongs to the whole process and names one pid, so every
 * engine of the process serves shm channels to one peer process at a
 * time: the first admitted is granted; channels of other processes are
 * refused (KVT_ERR_BUSY: their sessions fall back to tcp) until its last
 * channel closes and the grant is withdrawn. KVT_SHM_PTRACER_ANY=1 in the
 * environment grants PR_SET_PTRACER_ANY instead, while any channel is
 * open: every process of the same user may then attach (docs/shm.md).
 * With scope 0 nothing is needed (any process of the user may attach
 * anyway); with 2 or 3 attaching is impossible and the initiator's probe
 * fails.
 */
static pthread_mutex_t ptracer_lock = PTHREAD_MUTEX_INITIALIZER;
static long ptracer_pid;  /* granted to; 0: none */
static int ptracer_chans; /* channels admitted under the grant */
static int scope_override = -2;

/* A child of fork() serves none of its parent's channels, and the kernel
 * does not carry the parent's grant into it: it starts with none, and the
 * lock free (a thread of the parent may have held it at the fork). The
 * engines it inherits are the parent's, not its own: like every engine
 * copied by fork(), they are not to be used or destroyed in the child. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&ptracer_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&ptracer_lock);
}

static void fork_child(void)
{
    ptracer_pid = 0;
    ptracer_chans = 0;
    pthread_mutex_unlock(&ptracer_lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int kvt__shm_yama_scope(void)
{
    FILE *f;
    int v = -1;

    if (scope_override != -2)
        return scope_override;
    f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (f == NULL)
        return -1;
    if (fscanf(f, "%d", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

void kvt__shm_yama_scope_set(int scope)
{
    scope_override = scope;
}

int kvt__shm_ptracer_admit(pid_t pid, long *holder_p)
{
    const char *any = getenv("KVT_SHM_PTRACER_ANY");
    long want = any != NULL && strcmp(any, "1") == 0 ? (long)PR_SET_PTRACER_ANY
                                                     : (long)pid;
    int ok = 1;

    if (kvt__shm_yama_scope() != 1)
        return 0;
    pthread_once(&fork_once, fork_handlers);
    pthread_mutex_lock(&ptracer_lock);
    if (ptracer_chans == 0) {
        ptracer_pid = want;
        if (prctl(PR_SET_PTRACER, (unsigned long)want, 0, 0, 0) != 0)
            KVT_LOG_D("shm: PR_SET_PTRACER: %s", strerror(errno));
    } else if (ptracer_pid != want && ptracer_pid != (long)PR_SET_PTRACER_ANY) {
        ok = 0;
    }
    if (ok)
        ptracer_chans++;
    *holder_p = ptracer_pid;
    pthread_mutex_unlock(&ptracer_lock);
    return ok ? 1 : -1;
}

void kvt__shm_ptracer_release(void)
{
    pthread_mutex_lock(&ptracer_lock);
    if (ptracer_chans > 0 && --ptracer_chans == 0) {
        ptracer_pid = 0;
        prctl(PR_SET_PTRACER, 0, 0, 0, 0);
    }
    pthread_mutex_unlock(&ptracer_lock);
}

size_t kvt__shm_sock_name(char *out, uint64_t host_id, uint32_t pid,
                          uint16_t port)
{
    int n = snprintf(out + 1, 107, "kvt-shm/%016llx/%u/%u",
                     (unsigned long long)host_id, pid, port);
    out[0] = '\0'; /* abstract namespace */
    return 1 + (size_t)n;
}

static int cmp_alloc(const void *a, const void *b)
{
    const kvt__alloc_ref_t *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

/*
 * The registry as a malloc'd snapshot, each region tagged with the
 * allocation that holds it. Takes the registry read lock, then alloc_lock.
 * On failure *regs_p is NULL and the caller publishes an empty snapshot,
 * which refuses everything: a stale one could admit a removed range.
 */
void kvt__shm_snap_build(kvt__shm_t *shm, kvt__shm_region_t **regs_p,
                         uint32_t *n_p, uint32_t *trunc_p)
{
    kvt__shm_region_t *regs = NULL;
    kvt__alloc_ref_t *al = NULL;
    size_t n, na = 0;

    kvt__memreg_rdlock(shm->reg);
    n = kvt__memreg_count_locked(shm->reg);
    *trunc_p = n > KVT_SHM_MAX_REGIONS;
    if (n > KVT_SHM_MAX_REGIONS)
        n = KVT_SHM_MAX_REGIONS;
    regs = malloc((n ? n : 1) * sizeof(*regs));
    if (regs == NULL)
        goto out_unlock;
    if (kvt__alloc_list(shm->e, &al, &na) != KVT_OK) {
        free(regs);
        regs = NULL;
        goto out_unlock;
    }
    if (na > 1)
        qsort(al, na, sizeof(*al), cmp_alloc);
    for (size_t i = 0; i < n; i++) {
        const kvt__region_t *r = kvt__memreg_at_locked(shm->reg, i);
        size_t lo = 0, hi = na;
        /* Device memory is reached through the driver's sharing (an
         * IPC request names the region by its serial). */
        regs[i] = (kvt__shm_region_t){.start = r->start,
                                      .end = r->end,
                                      .access = r->access,
                                      .serial = r->serial,
                                      .kind = r->kind,
                                      .device = r->device};
        while (lo < hi) { /* last allocation starting at or below */
            size_t mid = lo + (hi - lo) / 2;
            if (al[mid].addr <= r->start)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (r->kind == KVT_MEM_HOST && lo > 0 &&
            r->end <= al[lo - 1].addr + al[lo - 1].length)
            regs[i].map_id = al[lo - 1].id;
    }
out_unlock:
    kvt__memreg_unlock(shm->reg);
    free(al);
    if (regs == NULL) {
        KVT_LOG_E("shm: out of memory for a registry snapshot; same-host "
                  "peers are refused until the next change");
        n = 0;
    }
    *regs_p = regs;
    *n_p = (uint32_t)n;
}

/* Write a snapshot into a channel whose lease is closed and drained (or
 * which no initiator has seen yet). Called with chan_lock held. */
void kvt__shm_publish(kvt__shm_t *shm, shm_tchan_t *c,
                      const kvt__shm_region_t *regs, uint32_t n, uint32_t trunc)
{
    kvt__shm_chan_t *ch = c->ch;

    if (n > 0)
        memcpy(ch->regions, regs, n * sizeof(*regs));
    ch->nregions = n;
    ch->truncated = trunc || regs == NULL;
    ch->snap_seq = ++shm->snap_seq;
}

/* Close a channel from this side: no lease is granted any more, and the
 * initiator sees `closed' and a hang-up. Called with chan_lock held. */
void kvt__shm_sever(shm_tchan_t *c, kvt_status_t why)
{
    if (c->dead)
        return;
    c->dead = 1;
    atomic_store(&c->ch->closed, why);
    shutdown(c->fd, SHUT_RDWR);
    kvt__shm_futex_wake(&c->ch->lease);
}

static int peer_hung_up(const shm_tchan_t *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

/* Wait for the copies running under a closed lease to end; severs the
 * channel after KVT_SHM_DRAIN_NS. Called with chan_lock held. */
static void drain(shm_tchan_t *c)
{
    uint64_t t0 = kvt__now_ns();

    for (;;) {
        uint32_t a = atomic_load(&c->ch->active);
        uint64_t now;
        if (a == 0)
            return;
        if (peer_hung_up(c)) {
            kvt__shm_sever(c, KVT_ERR_CONN_LOST);
            return;
        }
        now = kvt__now_ns();
        if (now - t0 > KVT_SHM_DRAIN_NS) {
            KVT_LOG_E("shm: peer %s (pid %d) kept a copy running for %.1f s "
                      "across a registry change; severing its channel",
                      c->peer, (int)c->peer_pid, (double)(now - t0) / 1e9);
            kvt__shm_sever(c, KVT_ERR_TIMEDOUT);
            return;
        }
        kvt__shm_futex_wait(&c->ch->active, a, 10 * 1000000);
    }
}

/*
 * The registry barrier (see the top of this file). Holds chan_lock
 * throughout, so that two changes and a channel being set up are
 * serialised; blocks at most KVT_SHM_DRAIN_NS per stalled initiator.
 */
void kvt__shm_registry_changed(kvt__tl_t *tl)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    kvt__shm_region_t *regs;
    uint32_t n, trunc;
    shm_tchan_t *c;

    pthread_mutex_lock(&shm->chan_lock);
    if (shm->chans == NULL)
        goto out;
    for (c = shm->chans; c != NULL; c = c->next)
        if (!c->dead)
            atomic_fetch_add(&c->ch->lease, 1); /* odd -> even: closed */
    for (c = shm->chans; c != NULL; c = c->next)
        if (!c->dead)
            drain(c);
    kvt__shm_snap_build(shm, &regs, &n, &trunc);
    for (c = shm->chans; c != NULL; c = c->next) {
        if (c->dead)
            continue;
        kvt__shm_publish(shm, c, regs, n, trunc);
        atomic_fetch_add(&c->ch->lease, 1); /* even -> odd: open */
        if (atomic_load(&c->ch->lease_waiters) != 0)
            kvt__shm_futex_wake(&c->ch->lease);
    }
    free(regs);
out:
    pthread_mutex_unlock(&shm->chan_lock);
}
