/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory on the same-host transport, initiator side: the openings.
 *
 * The target's device regions are reached through the driver's sharing:
 * the initiator asks the target (an IPC request on the socket, naming the
 * region by its start and serial) for the handle of the allocation that
 * holds it, opens it once per region and keeps it open while the region
 * is in the snapshot (under map_lock, as mappings are). The copies through
 * the openings are shm_dev.c's.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* With map_lock held. */
const ipc_t *kvt__shm_ipc_find(shm_session_t *s, uint32_t serial)
{
    for (size_t i = 0; i < s->nipcs; i++)
        if (s->ipcs[i].serial == serial)
            return &s->ipcs[i];
    return NULL;
}

/* With map_lock held. */
int kvt__shm_ipc_refused(shm_session_t *s, uint32_t serial)
{
    for (unsigned i = 0; i < s->nnoipc; i++)
        if (s->noipc[i] == serial)
            return 1;
    return 0;
}

static void ipc_close(ipc_t *x)
{
    KVT_LOG_D("shm: closing device allocation %#llx of the target",
              (unsigned long long)x->base);
    if (x->dev >= 0)
        kvt__dev_ipc_close(x->local, x->dev);
}

void kvt__shm_dev_refused(shm_session_t *s, const char *why)
{
    if (!atomic_exchange(&s->dev_said, 1))
        KVT_LOG_W("shm: device memory of %s cannot be opened in this "
                  "process (%s); transfers with it are staged through the "
                  "target's memory",
                  s->base.name, why);
}

/* Wait for the socket to be readable until @deadline: KVT_OK, or
 * KVT_ERR_TIMEDOUT. */
static kvt_status_t sock_wait(int sock, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        uint64_t now = kvt__now_ns();
        int ms, r;
        if (now >= deadline)
            return KVT_ERR_TIMEDOUT;
        ms = (int)((deadline - now + 999999) / 1000000);
        r = poll(&pf, 1, ms > 100 ? 100 : ms);
        if (r > 0)
            return KVT_OK;
        if (r < 0 && errno != EINTR)
            return KVT_OK; /* the receive says what is wrong */
    }
}

/*
 * Ask the target for the handle of device region @serial (starting at
 * @start) and open it, outside the lease (the target answers from its
 * service thread). A refusal is remembered until the snapshot changes.
 * Returns KVT_OK once answered (opened or refused), KVT_ERR_TIMEDOUT when
 * no answer came by @deadline (a stopped target), KVT_ERR_CONN_LOST when
 * the socket broke.
 */
kvt_status_t kvt__shm_ipc_request(shm_session_t *s, uint32_t serial,
                                  uint64_t start, uint64_t deadline)
{
    kvt__shm_msg_t m, a;
    const char *why = "a malformed answer";
    char wbuf[sizeof(a.name)];
    void *local = NULL;
    int fd = -1, known, dev = -1, opened = 0;
    kvt_status_t st = KVT_OK;

    pthread_mutex_lock(&s->sock_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    known =
        kvt__shm_ipc_find(s, serial) != NULL || kvt__shm_ipc_refused(s, serial);
    pthread_rwlock_unlock(&s->map_lock);
    if (known)
        goto out;
    kvt__shm_msg_init(&m, KVT_SHM_IPC);
    m.id = serial;
    m.addr = start;
    m.seq = ++s->req_seq;
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m)) {
        st = errno == EAGAIN ? KVT_ERR_TIMEDOUT : KVT_ERR_CONN_LOST;
        goto out;
    }
    for (;;) { /* skip answers to requests that timed out earlier */
        ssize_t got;
        st = sock_wait(s->sock, deadline);
        if (st != KVT_OK)
            goto out;
        got = kvt__shm_recv_msg(s->sock, &a, &fd);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got != (ssize_t)sizeof(a) || a.magic != KVT_SHM_MAGIC ||
            (a.type != KVT_SHM_MAP_ACK && a.type != KVT_SHM_IPC_ACK) ||
            (a.seq == m.seq && a.type != KVT_SHM_IPC_ACK)) {
            st = KVT_ERR_CONN_LOST;
            goto out;
        }
        if (fd >= 0)
            close(fd); /* no answer to an IPC request carries one */
        fd = -1;
        if (a.seq == m.seq)
            break;
    }
    if (a.status != KVT_OK) {
        memcpy(wbuf, a.name, sizeof(wbuf));
        wbuf[sizeof(wbuf) - 1] = '\0';
        why = wbuf;
        goto record;
    }
    /* The allocation must hold the region's start. */
    why = "a malformed answer";
    if (a.id != serial || a.length == 0 || a.addr > UINT64_MAX - a.length ||
        start < a.addr || start >= a.addr + a.length || a.pid > INT16_MAX)
        goto record;
    if (s->pid == getpid()) {
        /* An engine of this process: its device addresses are ours. */
        local = (void *)(uintptr_t)a.addr;
        opened = 1;
    } else {
        /* Under the context of the device that holds it, or else the
         * first device (the numbering may differ between processes). */
        dev = (int)a.pid;
        opened = kvt__dev_ipc_open(a.handle, dev, &local, &why) == 0;
        if (!opened && dev != 0) {
            dev = 0;
            opened = kvt__dev_ipc_open(a.handle, dev, &local, &why) == 0;
        }
    }
record:
    pthread_rwlock_wrlock(&s->map_lock);
    if (opened && s->nipcs == s->icap) {
        size_t cap = s->icap ? 2 * s->icap : 8;
        ipc_t *n = realloc(s->ipcs, cap * sizeof(*n));
        if (n == NULL) {
            if (dev >= 0)
                kvt__dev_ipc_close(local, dev);
            opened = 0;
            why = "out of memory";
        } else {
            s->ipcs = n;
            s->icap = cap;
        }
    }
    if (opened) {
        s->ipcs[s->nipcs++] =
            (ipc_t){serial, dev, a.addr, a.length, (uint8_t *)local};
        KVT_LOG_D("shm: opened device allocation %#llx (%llu bytes) of %s",
                  (unsigned long long)a.addr, (unsigned long long)a.length,
                  s->base.name);
    } else {
        if (s->nnoipc < NOMAP_MAX)
            s->noipc[s->nnoipc++] = serial;
        kvt__shm_dev_refused(s, why);
    }
    pthread_rwlock_unlock(&s->map_lock);
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&s->sock_lock);
    return st;
}

/* Close the openings of device regions that left the snapshot, and
 * forget refusals. With map_lock held for writing, under the lease. */
void kvt__shm_ipcs_reconcile_locked(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    size_t k = 0;

    for (size_t i = 0; i < s->nipcs; i++) {
        int named = 0;
        for (uint32_t r = 0; r < n && !named; r++)
            named = ch->regions[r].kind != KVT_MEM_HOST &&
                    ch->regions[r].serial == s->ipcs[i].serial;
        if (named)
            s->ipcs[k++] = s->ipcs[i];
        else
            ipc_close(&s->ipcs[i]);
    }
    s->nipcs = k;
    s->nnoipc = 0;
}

/* Close every opening (the session is released). */
void kvt__shm_ipcs_release(shm_session_t *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    for (size_t i = 0; i < s->nipcs; i++)
        ipc_close(&s->ipcs[i]);
    s->nipcs = 0;
    pthread_rwlock_unlock(&s->map_lock);
}
