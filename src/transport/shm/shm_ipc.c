/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory on the same-host transport, initiator side: the openings.
 *
 * The target's device regions are reached through the driver's sharing:
 * the initiator asks the target (an IPC request on the socket, naming the
 * region by its start and serial) for the handle of the allocation that
 * holds it, and opens that allocation. The copies through the openings
 * are shm_dev.c's.
 *
 * A job asks for every device region it lacks at once (up to
 * IPC_WANT_MAX): the requests go out back to back and the answers are
 * taken as they come, at most IPC_WINDOW unanswered at a time, so one
 * exchange costs one round trip however many regions it names (vLLM
 * registers K and V per layer: 64 to 160 regions, all met by the first
 * job).
 *
 * An allocation is opened once, however many of its regions are asked
 * for: the openings (ipc_t) are kept sorted by the allocation's base in
 * the target, and each region is linked to its opening (ipc_link_t,
 * sorted by serial); a region is found in O(log n). Both change under
 * map_lock for writing, as the mappings do, and only while the snapshot
 * they were asked against is the session's (map_seq): two regions of one
 * snapshot that answer the same base are in the same allocation, so an
 * answer is linked to an opening of that base without calling the driver
 * again. A new snapshot drops the links of regions no longer in it and
 * closes the openings left without one, in O(n log n).
 *
 * A refusal is remembered until the snapshot changes: up to NOMAP_MAX of
 * them by serial, and past that every region not linked counts as
 * refused (its transfers are staged through the target, which is right
 * for any device region, only slower), so a target whose driver shares
 * nothing is asked once per snapshot, not once per region per try.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/log.h"
#include "util/time.h"

/* Requests sent and not yet answered, at most. The target answers each
 * with a blocking send: this many answers (256 bytes each, about 1 KiB
 * of socket buffer) stay far below the default socket buffer (208 KiB),
 * so its service thread does not wait on this side. */
#define IPC_WINDOW 64u

/* The opening of the allocation at @base there, or NULL. With map_lock
 * held. */
static ipc_t *opening_at(shm_session_t *s, uint64_t base)
{
    size_t a = 0, b = s->nipcs;

    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (s->ipcs[mid].base < base)
            a = mid + 1;
        else
            b = mid;
    }
    return a < s->nipcs && s->ipcs[a].base == base ? &s->ipcs[a] : NULL;
}

/* With map_lock held. */
const ipc_t *kvt__shm_ipc_find(shm_session_t *s, uint32_t serial)
{
    size_t a = 0, b = s->nlinks;

    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (s->links[mid].serial < serial)
            a = mid + 1;
        else
            b = mid;
    }
    if (a == s->nlinks || s->links[a].serial != serial)
        return NULL;
    return opening_at(s, s->links[a].base);
}

/* With map_lock held. */
int kvt__shm_ipc_refused(shm_session_t *s, uint32_t serial)
{
    if (s->noipc_over)
        return 1;
    for (unsigned i = 0; i < s->nnoipc; i++)
        if (s->noipc[i] == serial)
            return 1;
    return 0;
}

static int want_cmp(const void *a, const void *b)
{
    uint32_t x = ((const ipc_want_t *)a)->serial;
    uint32_t y = ((const ipc_want_t *)b)->serial;

    return (x > y) - (x < y);
}

/* Sort @w by serial and drop repeats: the number left. */
static uint32_t want_unique(ipc_want_t *w, uint32_t n)
{
    uint32_t k = 0;

    qsort(w, n, sizeof(*w), want_cmp);
    for (uint32_t i = 0; i < n; i++)
        if (k == 0 || w[k - 1].serial != w[i].serial)
            w[k++] = w[i];
    return k;
}

void kvt__shm_ipc_want(rw_plan_t *p, uint32_t serial, uint64_t start)
{
    if (p->nwant > 0 && p->want[p->nwant - 1].serial == serial)
        return; /* the segments of a region often follow each other */
    if (p->nwant == IPC_WANT_MAX)
        p->nwant = want_unique(p->want, p->nwant);
    if (p->nwant < IPC_WANT_MAX)
        p->want[p->nwant++] = (ipc_want_t){start, serial};
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

/* Wait until the socket is ready for @events or @deadline passes: KVT_OK,
 * or KVT_ERR_TIMEDOUT. */
static kvt_status_t sock_wait(int sock, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = {.fd = sock, .events = events};
        uint64_t now = kvt__now_ns();
        int ms, r;
        if (now >= deadline)
            return KVT_ERR_TIMEDOUT;
        ms = (int)((deadline - now + 999999) / 1000000);
        r = poll(&pf, 1, ms > 100 ? 100 : ms);
        if (r > 0)
            return KVT_OK;
        if (r < 0 && errno != EINTR)
            return KVT_OK; /* the send or receive says what is wrong */
    }
}

/* What the answer to one request came to, until it is recorded. */
enum {
    ANS_NONE,    /* not answered yet */
    ANS_REFUSED, /* refused, malformed, or not opened here */
    ANS_LINKED,  /* its allocation is open already, or opened for another */
    ANS_OPENED,  /* its allocation opened for it */
};

typedef struct {
    uint64_t base, len; /* the allocation, in the target */
    uint8_t *local;     /* ANS_OPENED: its base here */
    int dev;            /* ANS_OPENED: the context; -1: not opened */
    int state;
} ans_t;

/* One exchange: the requests, their answers, and why the first refusal
 * was refused. */
typedef struct {
    const ipc_want_t *want;
    ans_t *ans;
    uint32_t n;
    uint64_t first;  /* the seq of want[0]'s request */
    const char *why; /* the first refusal's reason */
    char wbuf[KVT_WIRE_NAME_MAX + 1];
} xchg_t;

static void refuse(xchg_t *x, ans_t *an, const char *why)
{
    an->state = ANS_REFUSED;
    if (x->why == NULL) {
        snprintf(x->wbuf, sizeof(x->wbuf), "%s", why);
        x->why = x->wbuf;
    }
}

/* The UUID an IPC answer carries (shm.h): present when not all zero. */
static int ack_has_uuid(const kvt__shm_msg_t *a)
{
    for (unsigned i = 0; i < KVT_SHM_UUID_BYTES; i++)
        if (a->name[i] != 0)
            return 1;
    return 0;
}

/* The device of this process an IPC answer names by UUID, or -1 (none
 * sent, or not a device of this process: logged once). */
static int ack_device(const kvt__shm_msg_t *a)
{
    static _Atomic int said;
    int dev;

    if (!ack_has_uuid(a))
        return -1;
    dev = kvt__dev_of_uuid((const uint8_t *)a->name);
    if (dev < 0 && !atomic_exchange(&said, 1))
        KVT_LOG_W("shm: a same-host target's device memory is on a device "
                  "this process does not see (CUDA_VISIBLE_DEVICES?); "
                  "opening it under its ordinal");
    return dev;
}

/*
 * Take answer @a to request @i: link it to an opening of its allocation
 * (in the session's table, or made for an earlier answer of this
 * exchange), else open the allocation through the driver.
 */
static void take_answer(shm_session_t *s, xchg_t *x, uint32_t i,
                        const kvt__shm_msg_t *a)
{
    ans_t *an = &x->ans[i];
    uint64_t start = x->want[i].start;
    const char *why = "the driver refused it";
    const ipc_t *o;
    int found, clash = 0, ok;
    void *local = NULL;

    if (a->status != KVT_OK) {
        char w[sizeof(a->name)];
        memcpy(w, a->name, sizeof(w));
        w[sizeof(w) - 1] = '\0';
        refuse(x, an, w);
        return;
    }
    /* The allocation must hold the region's start. */
    if (a->id != x->want[i].serial || a->length == 0 ||
        a->addr > UINT64_MAX - a->length || start < a->addr ||
        start >= a->addr + a->length || a->pid > INT16_MAX) {
        refuse(x, an, "a malformed answer");
        return;
    }
    an->base = a->addr;
    an->len = a->length;
    pthread_rwlock_rdlock(&s->map_lock);
    o = opening_at(s, an->base);
    found = o != NULL;
    clash = found && o->len != an->len;
    pthread_rwlock_unlock(&s->map_lock);
    for (uint32_t k = 0; !found && k < x->n; k++) {
        found = x->ans[k].state == ANS_OPENED && x->ans[k].base == an->base;
        clash = found && x->ans[k].len != an->len;
    }
    if (found) {
        /* Two regions of one snapshot at one base are in one allocation:
         * of one length, unless the target lies. */
        if (clash)
            refuse(x, an, "a malformed answer");
        else
            an->state = ANS_LINKED;
        return;
    }
    if (s->pid == getpid()) {
        /* An engine of this process: its device addresses are ours. */
        an->local = (uint8_t *)(uintptr_t)a->addr;
        an->dev = -1;
        an->state = ANS_OPENED;
        return;
    }
    /* Under the context of the device that holds it: found by its UUID,
     * as the two processes may number the devices differently
     * (CUDA_VISIBLE_DEVICES); else, from a target that sends none, by
     * the target's ordinal, and then the first device. */
    an->dev = ack_device(a);
    if (an->dev < 0)
        an->dev = (int)a->pid;
    ok = kvt__dev_ipc_open(a->handle, an->dev, &local, &why) == 0;
    if (!ok && an->dev != 0 && !ack_has_uuid(a)) {
        an->dev = 0;
        ok = kvt__dev_ipc_open(a->handle, 0, &local, &why) == 0;
    }
    if (!ok) {
        refuse(x, an, why);
        return;
    }
    an->local = local;
    an->state = ANS_OPENED;
}

/* Receive one message and take it if it answers a request of @x sent so
 * far (@sent); others are stale (an earlier request that timed out).
 * KVT_OK (taken or skipped), else the session's failure. */
static kvt_status_t recv_answer(shm_session_t *s, xchg_t *x, uint32_t sent,
                                uint32_t *got_p, uint64_t deadline)
{
    kvt__shm_msg_t a;
    kvt_status_t st = sock_wait(s->sock, POLLIN, deadline);
    ssize_t got;
    int fd = -1;
    uint64_t i;

    if (st != KVT_OK)
        return st;
    got = kvt__shm_recv_msg(s->sock, &a, &fd);
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return KVT_OK;
    if (fd >= 0)
        close(fd); /* a stale MAP answer's; no IPC answer carries one */
    if (got != (ssize_t)sizeof(a) || a.magic != KVT_SHM_MAGIC ||
        (a.type != KVT_SHM_MAP_ACK && a.type != KVT_SHM_IPC_ACK))
        return KVT_ERR_CONN_LOST;
    if (a.seq < x->first)
        return KVT_OK;
    i = a.seq - x->first;
    if (i >= sent || a.type != KVT_SHM_IPC_ACK || x->ans[i].state != ANS_NONE)
        return KVT_ERR_CONN_LOST; /* unasked, or answered twice */
    take_answer(s, x, (uint32_t)i, &a);
    (*got_p)++;
    return KVT_OK;
}

/*
 * Send the requests of @x back to back and take their answers as they
 * come, at most IPC_WINDOW unanswered: when that many are out, or the
 * socket's buffer is full, answers are read before more is sent, so
 * neither side waits on the other with both buffers full. KVT_OK once
 * every request is answered, KVT_ERR_TIMEDOUT when @deadline passed
 * first, KVT_ERR_CONN_LOST when the socket broke.
 */
static kvt_status_t exchange(shm_session_t *s, xchg_t *x, uint64_t deadline)
{
    uint32_t sent = 0, got = 0;
    kvt_status_t st = KVT_OK;

    x->first = s->req_seq + 1;
    s->req_seq += x->n;
    while (got < x->n && st == KVT_OK) {
        while (sent < x->n && sent - got < IPC_WINDOW) {
            kvt__shm_msg_t m;
            ssize_t r;
            kvt__shm_msg_init(&m, KVT_SHM_IPC);
            m.id = x->want[sent].serial;
            m.addr = x->want[sent].start;
            m.seq = x->first + sent;
            r = send(s->sock, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r == (ssize_t)sizeof(m))
                sent++;
            else if (r >= 0 || (errno != EAGAIN && errno != EINTR))
                return KVT_ERR_CONN_LOST;
            else if (errno == EAGAIN)
                break;
        }
        if (sent == got) /* nothing out, and no room: wait for room */
            st = sock_wait(s->sock, POLLOUT, deadline);
        else
            st = recv_answer(s, x, sent, &got, deadline);
    }
    return st;
}

static int opening_cmp(const void *a, const void *b)
{
    uint64_t x = ((const ipc_t *)a)->base, y = ((const ipc_t *)b)->base;

    return (x > y) - (x < y);
}

/*
 * Record the answers of @x: the new openings merged into the table by
 * base, the regions linked merged by serial (@x's requests are in serial
 * order), the refusals remembered; @fresh: room for @x->n openings. With
 * map_lock held for writing, the snapshot the requests were made for
 * still the session's. 0, or -1 when the tables cannot grow (nothing
 * recorded).
 */
static int record_locked(shm_session_t *s, xchg_t *x, ipc_t *fresh)
{
    size_t no = 0, nl = 0, i, k;

    for (i = 0; i < x->n; i++) {
        const ans_t *an = &x->ans[i];
        if (an->state == ANS_OPENED)
            fresh[no++] = (ipc_t){.base = an->base,
                                  .len = an->len,
                                  .local = an->local,
                                  .dev = an->dev};
        nl += an->state == ANS_OPENED || an->state == ANS_LINKED;
    }
    if (s->nipcs + no > s->icap) {
        size_t cap = s->icap ? s->icap : 8;
        ipc_t *n;
        while (cap < s->nipcs + no)
            cap *= 2;
        if ((n = realloc(s->ipcs, cap * sizeof(*n))) == NULL)
            return -1;
        s->ipcs = n;
        s->icap = cap;
    }
    if (s->nlinks + nl > s->lcap) {
        size_t cap = s->lcap ? s->lcap : 8;
        ipc_link_t *n;
        while (cap < s->nlinks + nl)
            cap *= 2;
        if ((n = realloc(s->links, cap * sizeof(*n))) == NULL)
            return -1;
        s->links = n;
        s->lcap = cap;
    }
    /* Both merged from the back: O(n + k). */
    qsort(fresh, no, sizeof(*fresh), opening_cmp);
    for (i = s->nipcs, k = no; k > 0;) {
        if (i > 0 && s->ipcs[i - 1].base > fresh[k - 1].base)
            s->ipcs[i + k - 1] = s->ipcs[i - 1], i--;
        else
            s->ipcs[i + k - 1] = fresh[k - 1], k--;
    }
    s->nipcs += no;
    i = s->nlinks;
    k = x->n;
    s->nlinks += nl;
    for (size_t w = s->nlinks; k > 0;) {
        const ans_t *an = &x->ans[k - 1];
        const ipc_want_t *q = &x->want[k - 1];
        if (an->state != ANS_OPENED && an->state != ANS_LINKED) {
            k--;
            continue;
        }
        if (i > 0 && s->links[i - 1].serial > q->serial)
            s->links[--w] = s->links[--i];
        else
            s->links[--w] = (ipc_link_t){q->serial, q->start, an->base}, k--;
    }
    for (i = 0; i < x->n; i++) {
        const ans_t *an = &x->ans[i];
        if (an->state == ANS_OPENED || an->state == ANS_LINKED) {
            opening_at(s, an->base)->links++;
        } else if (s->nnoipc < NOMAP_MAX) {
            s->noipc[s->nnoipc++] = x->want[i].serial;
        } else {
            s->noipc_over = 1;
        }
    }
    return 0;
}

/* Undo the openings of @x (not recorded): every answer is taken as
 * refused. */
static void close_fresh(xchg_t *x)
{
    for (uint32_t i = 0; i < x->n; i++) {
        if (x->ans[i].state == ANS_OPENED && x->ans[i].dev >= 0)
            kvt__dev_ipc_close(x->ans[i].local, x->ans[i].dev);
        x->ans[i].state = ANS_REFUSED;
    }
}

/* Remember @n refusals of @want. With map_lock held for writing. */
static void refused_locked(shm_session_t *s, const ipc_want_t *want, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (s->nnoipc < NOMAP_MAX)
            s->noipc[s->nnoipc++] = want[i].serial;
        else
            s->noipc_over = 1;
    }
}

kvt_status_t kvt__shm_ipc_fetch(shm_session_t *s, ipc_want_t *want, uint32_t n,
                                uint64_t seq, uint64_t deadline)
{
    xchg_t x = {.want = want};
    ipc_t *fresh = NULL;
    kvt_status_t st = KVT_OK;
    unsigned opened = 0, linked = 0;

    n = want_unique(want, n);
    pthread_mutex_lock(&s->sock_lock);
    pthread_rwlock_rdlock(&s->map_lock);
    if (atomic_load(&s->map_seq) == seq) /* else the job plans again */
        for (uint32_t i = 0; i < n; i++)
            if (kvt__shm_ipc_find(s, want[i].serial) == NULL &&
                !kvt__shm_ipc_refused(s, want[i].serial))
                want[x.n++] = want[i];
    pthread_rwlock_unlock(&s->map_lock);
    if (x.n == 0)
        goto out;
    x.ans = calloc(x.n, sizeof(*x.ans));
    fresh = calloc(x.n, sizeof(*fresh));
    if (x.ans == NULL || fresh == NULL) {
        pthread_rwlock_wrlock(&s->map_lock);
        if (atomic_load(&s->map_seq) == seq)
            refused_locked(s, want, x.n);
        pthread_rwlock_unlock(&s->map_lock);
        kvt__shm_dev_refused(s, "out of memory");
        goto out;
    }
    st = exchange(s, &x, deadline);
    if (st != KVT_OK) {
        close_fresh(&x);
        goto out;
    }
    pthread_rwlock_wrlock(&s->map_lock);
    if (atomic_load(&s->map_seq) != seq) {
        /* A new snapshot since the job was planned: it plans again. */
        pthread_rwlock_unlock(&s->map_lock);
        close_fresh(&x);
        goto out;
    }
    if (record_locked(s, &x, fresh) != 0) {
        close_fresh(&x);
        refused_locked(s, want, x.n);
        x.why = "out of memory";
    }
    pthread_rwlock_unlock(&s->map_lock);
    for (uint32_t i = 0; i < x.n; i++) {
        if (x.ans[i].state == ANS_OPENED)
            KVT_LOG_D("shm: opened device allocation %#llx (%llu bytes) of "
                      "%s",
                      (unsigned long long)x.ans[i].base,
                      (unsigned long long)x.ans[i].len, s->base.name);
        opened += x.ans[i].state == ANS_OPENED;
        linked += x.ans[i].state == ANS_LINKED;
    }
    KVT_LOG_D("shm: %u device regions of %s asked for in one exchange: %u "
              "allocations opened, %u regions linked to one open already, %u "
              "refused",
              x.n, s->base.name, opened, linked, x.n - opened - linked);
    if (x.why != NULL)
        kvt__shm_dev_refused(s, x.why);
out:
    pthread_mutex_unlock(&s->sock_lock);
    free(x.ans);
    free(fresh);
    return st;
}

/* Drop the links of device regions that left the snapshot, close the
 * openings left without one, and forget refusals: O(n log n). With
 * map_lock held for writing, under the lease. */
void kvt__shm_ipcs_reconcile_locked(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t n =
        ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions : KVT_SHM_MAX_REGIONS;
    size_t k = 0;

    for (size_t i = 0; i < s->nlinks; i++) {
        const ipc_link_t *l = &s->links[i];
        const kvt__shm_region_t *r =
            kvt__shm_region_find(ch, n, l->start, l->start + 1, 0);
        ipc_t *x;
        if (r != NULL && r->start == l->start && r->serial == l->serial &&
            r->kind != KVT_MEM_HOST) {
            s->links[k++] = *l;
        } else if ((x = opening_at(s, l->base)) != NULL) {
            x->links--;
        }
    }
    s->nlinks = k;
    k = 0;
    for (size_t i = 0; i < s->nipcs; i++) {
        if (s->ipcs[i].links > 0)
            s->ipcs[k++] = s->ipcs[i];
        else
            ipc_close(&s->ipcs[i]);
    }
    s->nipcs = k;
    s->nnoipc = 0;
    s->noipc_over = 0;
}

/* Close every opening (the session is released). */
void kvt__shm_ipcs_release(shm_session_t *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    for (size_t i = 0; i < s->nipcs; i++)
        ipc_close(&s->ipcs[i]);
    s->nipcs = 0;
    free(s->links);
    s->links = NULL;
    s->nlinks = s->lcap = 0;
    pthread_rwlock_unlock(&s->map_lock);
}
