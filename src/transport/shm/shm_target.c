/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host transport, target side: the abstract Unix socket, one
 * channel per connected initiator, and the service thread that accepts
 * initiators, answers their requests for allocation memfds, copies out
 * the pieces they stage (with a helper thread when there is more than
 * one slot to copy), and delivers their notifications.
 *
 * The bounds guarantee. Initiators copy into this process themselves, so
 * the target cannot check each access as the TCP worker does; instead it
 * controls *which registry they check against, and when*. A channel's
 * lease is open (odd) while its snapshot equals the registry. An
 * initiator raises the channel's active count, then checks that the lease
 * is open, and only then validates its ranges against the snapshot and
 * copies; it lowers the count after the copy. kvt__shm_registry_changed(),
 * which the engine calls after every register and unregister, closes the
 * lease (even), waits until the active count is zero, publishes the new
 * snapshot and reopens the lease. Both sides use sequentially consistent
 * operations on the two words, so either the initiator sees the lease
 * closed (and copies nothing), or the target sees its count and waits for
 * the copy to end. Hence, when kvt_mem_unregister() returns, no copy that
 * was validated against a registry holding the region is still running,
 * and every later copy is validated against one without it.
 *
 * The wait is bounded: an initiator that keeps a copy running for more
 * than KVT_SHM_DRAIN_NS (stopped by a signal in the middle of one) has
 * its channel severed, and unregister returns. That initiator may then
 * finish the copy it was in, at most one job (8 MiB) that lands late; it
 * reports the job failed, and it can start no other. This is the one case
 * where the guarantee is weaker than over TCP, and it needs an initiator
 * that stalls mid-copy for a whole second.
 *
 * Locks. chan_lock guards the channel list, every channel's dead flag and
 * the snapshot and lease words; it is held across a registry change,
 * including the bounded drain. Order: chan_lock -> registry read lock ->
 * alloc_lock; nothing here is taken inside another lock of the engine.
 * Only the service thread accepts, frees channels and reads their
 * sockets; the thread of a registry change only marks channels dead and
 * shuts their sockets down, so the service thread sees a hang-up and does
 * the freeing.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/log.h"
#include "util/thread.h"
#include "util/time.h"

static kvt_status_t send_msg(int fd, const kvt__shm_msg_t *m, int pass_fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {(void *)m, sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

    if (pass_fd >= 0) {
        struct cmsghdr *cm;
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof(u.buf);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(*m))
        return KVT_ERR_IO;
    return KVT_OK;
}

/* Deliver the notifications the initiator queued, in order. */
int kvt__shm_consume_notes(kvt__shm_t *shm, shm_tchan_t *c)
{
    kvt__shm_chan_t *ch = c->ch;
    uint32_t tail = atomic_load_explicit(&ch->nq_tail, memory_order_acquire);
    uint8_t buf[KVT_NOTIFY_MAX];
    int any = 0;

    if (tail - c->head > KVT_SHM_NOTES)
        return -1;
    while (c->head != tail) {
        const kvt__shm_note_t *nt = &ch->notes[c->head % KVT_SHM_NOTES];
        uint32_t len = nt->len;
        if (len > KVT_NOTIFY_MAX)
            return -1;
        memcpy(buf, nt->data, len);
        /* Every write the notification vouches for landed before the
         * initiator queued it; pair with kvt_notify_recv(). */
        kvt__engine_landed(shm->e);
        kvt__notify_push(shm->e, c->peer, buf, len);
        c->head++;
        atomic_store_explicit(&ch->nq_head, c->head, memory_order_release);
        any = 1;
    }
    /* Sequentially consistent with the initiator's "waiters++, re-read the
     * word in futex_wait": either it sees the new value, or this sees it
     * asleep. The stores above are only release, hence the fence. */
    atomic_thread_fence(memory_order_seq_cst);
    if (any && atomic_load(&ch->waiters) != 0)
        kvt__shm_futex_wake(&ch->nq_head);
    return 0;
}

/* Answer a MAP request with a duplicate of the allocation's memfd, if it
 * exists and some of it is registered. */
static int serve_map(kvt__shm_t *shm, shm_tchan_t *c, const kvt__shm_msg_t *req)
{
    kvt__shm_msg_t m;
    int fd = -1, rc;

    kvt__shm_msg_init(&m, KVT_SHM_MAP_ACK);
    m.id = req->id;
    m.seq = req->seq;
    m.status = KVT_ERR_NOT_FOUND;
    if (req->id <= UINT32_MAX &&
        kvt__alloc_export(shm->e, (uint32_t)req->id, &fd, &m.addr, &m.length) ==
            KVT_OK)
        m.status = KVT_OK;
    rc = send_msg(c->fd, &m, fd) == KVT_OK ? 0 : -1;
    if (fd >= 0)
        close(fd);
    return rc;
}

/*
 * Answer an IPC request: the driver's handle of the device allocation
 * holding the region the request names (by start and serial, so that a
 * later registration at the same address is not taken for it). The
 * registry's read lock is held across the export, so the region cannot
 * go (and its memory be freed) in between. A refusal says why, in the
 * answer and once in this process's log.
 */
static int serve_ipc(kvt__shm_t *shm, shm_tchan_t *c, const kvt__shm_msg_t *req)
{
    const kvt__region_t *r;
    const char *why = "no such device region is registered for peers";
    kvt__shm_msg_t m;

    kvt__shm_msg_init(&m, KVT_SHM_IPC_ACK);
    m.id = req->id;
    m.seq = req->seq;
    m.status = KVT_ERR_NOT_FOUND;
    kvt__memreg_rdlock(shm->reg);
    r = kvt__memreg_find_locked(shm->reg, req->addr, 1);
    if (r != NULL && r->start == req->addr && r->serial == req->id &&
        r->kind != KVT_MEM_HOST && r->access != 0) {
        uint64_t base = 0, size = 0;
        if (kvt__dev_ipc_export((const void *)(uintptr_t)r->start,
                                r->end - r->start, r->device, &base, &size,
                                m.handle, &why) == 0) {
            m.status = KVT_OK;
            m.addr = base;
            m.length = size;
            m.pid = (uint32_t)r->device;
            /* The device by UUID too: the initiator may number it
             * otherwise. */
            if (kvt__dev_uuid(r->device, (uint8_t *)m.name) != 0)
                memset(m.name, 0, KVT_SHM_UUID_BYTES);
        } else {
            m.status = KVT_ERR_NOT_SUPPORTED;
            if (!atomic_exchange(&shm->ipc_said, 1))
                KVT_LOG_W("shm: device memory at %#llx cannot be shared with "
                          "same-host peers (%s); their transfers with it are "
                          "staged through this process",
                          (unsigned long long)r->start, why);
        }
    }
    kvt__memreg_unlock(shm->reg);
    if (m.status != KVT_OK)
        snprintf(m.name, sizeof(m.name), "%s", why);
    return send_msg(c->fd, &m, -1) == KVT_OK ? 0 : -1;
}

static void chan_free(shm_tchan_t *c)
{
    if (c->ptraced)
        kvt__shm_ptracer_release();
    if (c->fd >= 0)
        close(c->fd);
    if (c->ch != NULL)
        munmap(c->ch, c->len);
    free(c);
}

/* The peer left (or broke the protocol): unlist and free the channel.
 * Service thread only. */
static void chan_close(kvt__shm_t *shm, shm_tchan_t *c)
{
    shm_tchan_t **pp;

    pthread_mutex_lock(&shm->chan_lock);
    for (pp = &shm->chans; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    kvt__shm_sever(c, KVT_ERR_CONN_LOST);
    for (unsigned k = 0; k < 4 && c->ch != NULL; k++)
        shm->served_gone[k] +=
            atomic_load_explicit(&c->ch->served[k], memory_order_relaxed);
    pthread_mutex_unlock(&shm->chan_lock);
    epoll_ctl(shm->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    KVT_LOG_D("shm: channel of %s (pid %d) closed", c->peer, (int)c->peer_pid);
    chan_free(c);
}

static void chan_event(kvt__shm_t *shm, shm_tchan_t *c, uint32_t events)
{
    int bad = (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) != 0;

    while (!bad && (events & EPOLLIN)) {
        kvt__shm_msg_t m;
        ssize_t n = recv(c->fd, &m, sizeof(m), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        if (n != (ssize_t)sizeof(m) || m.magic != KVT_SHM_MAGIC ||
            m.version != KVT_SHM_VERSION) {
            if (n > 0)
                KVT_LOG_W("shm: malformed message from %s; closing", c->peer);
            bad = 1;
        } else if (m.type == KVT_SHM_MAP) {
            bad = serve_map(shm, c, &m) != 0;
        } else if (m.type == KVT_SHM_IPC) {
            bad = serve_ipc(shm, c, &m) != 0;
        } else if (m.type != KVT_SHM_BELL) {
            KVT_LOG_W("shm: unexpected message %u from %s; closing", m.type,
                      c->peer);
            bad = 1;
        }
    }
    if (!bad)
        kvt__shm_consume_stage(shm, c, 0);
    if (kvt__shm_consume_notes(shm, c) != 0) {
        KVT_LOG_W("shm: corrupt notification ring from %s; closing", c->peer);
        bad = 1;
    }
    if (bad)
        chan_close(shm, c);
}

/*
 * Set up a channel for a connected initiator: read its HELLO (bounded by a
 * 1 s socket timeout), check its credentials, create and seal the channel
 * memfd, kvt__shm_publish the first snapshot, and answer with the memfd.
 */
static void chan_open(kvt__shm_t *shm, int fd)
{
    struct timeval tv = {1, 0};
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    kvt__shm_region_t *regs;
    uint32_t n, trunc;
    kvt__shm_msg_t m, ack;
    shm_tchan_t *c;
    int memfd = -1, ptraced;
    long holder;
    ssize_t got;

    kvt__shm_msg_init(&ack, KVT_SHM_HELLO_ACK);
    ack.pid = (uint32_t)getpid();
    ack.host_id = shm->cfg->host_id;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    got = recv(fd, &m, sizeof(m), 0);
    if (got != (ssize_t)sizeof(m) || m.magic != KVT_SHM_MAGIC ||
        m.type != KVT_SHM_HELLO) {
        KVT_LOG_W("shm: malformed or missing HELLO; closing");
        goto err_close;
    }
    if (m.version != KVT_SHM_VERSION) {
        KVT_LOG_W("shm: peer speaks shm protocol %u, this engine %d", m.version,
                  KVT_SHM_VERSION);
        ack.status = KVT_ERR_VERSION;
        goto err_refuse;
    }
    m.name[KVT_WIRE_NAME_MAX] = '\0';
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        cred.pid != (pid_t)m.pid || (cred.uid != geteuid() && cred.uid != 0)) {
        KVT_LOG_W("shm: refusing %s: credentials do not match its claim",
                  m.name);
        ack.status = KVT_ERR_ACCESS;
        goto err_refuse;
    }
    if (shm->cfg->auth.on || m.id == 1) {
        int r = kvt__shm_auth_target(shm, fd, &m, &ack);
        if (r == -1)
            goto err_refuse;
        if (r != 0)
            goto err_close;
    }
    ptraced = kvt__shm_ptracer_admit(cred.pid, &holder);
    if (ptraced < 0) {
        KVT_LOG_W("shm: refusing %s (pid %d): Yama ptrace_scope 1 lets one "
                  "process attach, and pid %ld does; it goes over tcp",
                  m.name, (int)cred.pid, holder);
        snprintf(ack.name, sizeof(ack.name),
                 "Yama ptrace_scope 1: another process (pid %ld) attaches "
                 "to this target",
                 holder);
        ack.status = KVT_ERR_BUSY;
        goto err_refuse;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        if (ptraced)
            kvt__shm_ptracer_release();
        goto err_close;
    }
    c->ptraced = ptraced;
    c->fd = fd;
    c->peer_pid = cred.pid;
    snprintf(c->peer, sizeof(c->peer), "%s", m.name);
    c->len = KVT_SHM_CHAN_SIZE;
    memfd = memfd_create("kvt-chan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0 || ftruncate(memfd, (off_t)c->len) != 0 ||
        fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
            0) {
        KVT_LOG_E("shm: cannot create a channel: %s", strerror(errno));
        goto err_free;
    }
    c->ch = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (c->ch == MAP_FAILED) {
        c->ch = NULL;
        KVT_LOG_E("shm: cannot map a channel: %s", strerror(errno));
        goto err_free;
    }
    c->ch->magic = KVT_SHM_CHAN_MAGIC;
    c->ch->version = KVT_SHM_VERSION;
    c->ch->target_pid = (uint32_t)getpid();
    c->ch->size = c->len;
    c->ch->max_regions = KVT_SHM_MAX_REGIONS;
    c->ch->max_notes = KVT_SHM_NOTES;
    ack.addr = (uint64_t)(uintptr_t)c->ch;
    ack.length = c->len;

    pthread_mutex_lock(&shm->chan_lock);
    kvt__shm_snap_build(shm, &regs, &n, &trunc);
    kvt__shm_publish(shm, c, regs, n, trunc);
    free(regs);
    atomic_store(&c->ch->lease, 1);
    c->next = shm->chans;
    shm->chans = c;
    pthread_mutex_unlock(&shm->chan_lock);

    if (send_msg(fd, &ack, memfd) != KVT_OK) {
        close(memfd);
        chan_close(shm, c);
        return;
    }
    close(memfd);
    tv = (struct timeval){0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(shm->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            chan_close(shm, c);
            return;
        }
    }
    KVT_LOG_D("shm: channel for %s (pid %d) open", c->peer, (int)c->peer_pid);
    return;

err_free:
    if (memfd >= 0)
        close(memfd);
    chan_free(c); /* closes fd */
    return;
err_refuse:
    send_msg(fd, &ack, -1);
err_close:
    close(fd);
}

static void *service_main(void *arg)
{
    kvt__shm_t *shm = arg;
    struct epoll_event evs[32];
    uint64_t last_tick = 0;

    kvt__thread_name("kvt-shm-svc");
    for (;;) {
        int n =
            epoll_wait(shm->epfd, evs, 32, (int)(KVT_SHM_TICK_NS / 1000000));
        uint64_t now;

        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)&shm->evfd)
                return NULL;
            if (p == (void *)shm) {
                int fd;
                while ((fd = accept4(shm->listen_fd, NULL, NULL,
                                     SOCK_CLOEXEC)) >= 0)
                    chan_open(shm, fd);
                continue;
            }
            chan_event(shm, p, evs[i].events);
        }
        now = kvt__now_ns();
        if (now - last_tick >= KVT_SHM_TICK_NS) {
            shm_tchan_t *c, *next;
            last_tick = now;
            /* Tickets and notifications whose bell was lost are answered
             * here. The list is changed by this thread only. */
            for (c = shm->chans; c != NULL; c = next) {
                next = c->next;
                kvt__shm_consume_stage(shm, c, 0);
                if (kvt__shm_consume_notes(shm, c) != 0)
                    chan_close(shm, c);
            }
        }
    }
}

/* The CPUs this thread may run on (its affinity when the engine is
 * created); the CPUs online when that cannot be told (a set larger than
 * cpu_set_t), so that admission (shm_pool.c) never holds back a worker for
 * lack of a count. */
static unsigned cpus_usable(void)
{
    cpu_set_t set;
    long n;

    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) >= 1)
        return (unsigned)CPU_COUNT(&set);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (unsigned)n : 64;
}

kvt_status_t kvt__shm_create(kvt_engine_h e, kvt__tl_t **tl_p)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct epoll_event ev;
    kvt__shm_t *shm;
    size_t nl;

    shm = calloc(1, sizeof(*shm));
    if (shm == NULL)
        return KVT_ERR_NO_MEMORY;
    kvt__tl_init(&shm->base, &kvt__tl_shm, e);
    shm->e = e;
    shm->cfg = kvt__engine_cfg(e);
    shm->reg = kvt__engine_reg(e);
    shm->evfd = -1;
    shm->epfd = -1;
    shm->ncpu = cpus_usable();
    pthread_mutex_init(&shm->chan_lock, NULL);
    pthread_mutex_init(&shm->pool_lock, NULL);
    pthread_mutex_init(&shm->dev_lock, NULL);
    pthread_cond_init(&shm->pool_cond, NULL);
    /* Device memory, both ways, only where a driver with devices is
     * found: the initiator opens the target's memory through it, even
     * from host memory (without one, tcp carries such transfers). Asked
     * when such a pair is first needed (KVT__TL_DEV_DRIVER), not here. */
    nl = kvt__shm_sock_name(sa.sun_path, shm->cfg->host_id, (uint32_t)getpid(),
                            shm->cfg->port);
    memcpy(shm->sock_name, sa.sun_path, nl);
    shm->sock_len = nl;
    shm->listen_fd =
        socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (shm->listen_fd < 0 ||
        bind(shm->listen_fd, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl)) != 0 ||
        listen(shm->listen_fd, 64) != 0) {
        KVT_LOG_W("shm: cannot listen on @%s: %s; same-host peers will use "
                  "tcp",
                  sa.sun_path + 1, strerror(errno));
        goto err_free;
    }
    shm->epfd = epoll_create1(EPOLL_CLOEXEC);
    shm->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (shm->epfd < 0 || shm->evfd < 0)
        goto err_free;
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = shm};
    if (epoll_ctl(shm->epfd, EPOLL_CTL_ADD, shm->listen_fd, &ev) != 0)
        goto err_free;
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &shm->evfd};
    if (epoll_ctl(shm->epfd, EPOLL_CTL_ADD, shm->evfd, &ev) != 0)
        goto err_free;
    if (pthread_create(&shm->thread, NULL, service_main, shm) != 0)
        goto err_free;
    shm->running = 1;
    if (kvt__shm_yama_scope() >= 2)
        KVT_LOG_W("shm: Yama ptrace_scope is %d: same-host peers cannot "
                  "attach to this process and will use tcp",
                  kvt__shm_yama_scope());
    KVT_LOG_D("shm: serving same-host peers on @%s", sa.sun_path + 1);
    *tl_p = &shm->base;
    return KVT_OK;

err_free:
    if (shm->listen_fd >= 0)
        close(shm->listen_fd);
    if (shm->epfd >= 0)
        close(shm->epfd);
    if (shm->evfd >= 0)
        close(shm->evfd);
    pthread_cond_destroy(&shm->pool_cond);
    pthread_mutex_destroy(&shm->dev_lock);
    pthread_mutex_destroy(&shm->pool_lock);
    pthread_mutex_destroy(&shm->chan_lock);
    free(shm);
    return KVT_ERR_IO;
}

kvt_status_t kvt__shm_describe(kvt__tl_t *tl, kvt__segdesc_t *d)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    uint8_t body[2 + KVT_SHM_SOCK_MAX];
    size_t n = shm->sock_len - 1; /* without the leading NUL */

    body[0] = (uint8_t)n;
    body[1] = (uint8_t)(n >> 8);
    memcpy(body + 2, shm->sock_name + 1, n);
    return kvt__segdesc_add_tl(d, KVT_TRANSPORT_SHM, "shm", 1, body,
                               (uint32_t)(2 + n));
}

void kvt__shm_stop(kvt__tl_t *tl)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;
    shm_tchan_t *c;
    uint64_t one = 1;

    if (shm->running) {
        if (write(shm->evfd, &one, sizeof(one)) < 0)
            (void)0;
        pthread_join(shm->thread, NULL);
        shm->running = 0;
    }
    if (shm->helper_running) {
        atomic_store(&shm->helper_stop, 1);
        atomic_fetch_add(&shm->helper_seq, 1);
        kvt__shm_futex_wake(&shm->helper_seq);
        pthread_join(shm->helper, NULL);
        shm->helper_running = 0;
    }
    /* Peers see their channels closed and fail what they had in flight. */
    pthread_mutex_lock(&shm->chan_lock);
    while ((c = shm->chans) != NULL) {
        shm->chans = c->next;
        kvt__shm_sever(c, KVT_ERR_CONN_LOST);
        chan_free(c);
    }
    pthread_mutex_unlock(&shm->chan_lock);
    if (shm->listen_fd >= 0) {
        close(shm->listen_fd);
        shm->listen_fd = -1;
    }
    kvt__shm_sessions_stop(shm);
}

void kvt__shm_destroy(kvt__tl_t *tl)
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;

    close(shm->epfd);
    close(shm->evfd);
    free(shm->workers);
    kvt__shm_dev_fini(shm);
    pthread_cond_destroy(&shm->pool_cond);
    pthread_mutex_destroy(&shm->dev_lock);
    pthread_mutex_destroy(&shm->pool_lock);
    pthread_mutex_destroy(&shm->chan_lock);
    free(shm);
}

void kvt__shm_served(kvt__tl_t *tl, uint64_t out[4])
{
    kvt__shm_t *shm = (kvt__shm_t *)tl;

    uint64_t v[4];

    /* The channel lock is held across copy-outs and registry drains:
     * metrics never wait for it; while it is busy the last sums stand. */
    if (pthread_mutex_trylock(&shm->chan_lock) == 0) {
        for (unsigned k = 0; k < 4; k++)
            v[k] = shm->served_gone[k];
        for (shm_tchan_t *c = shm->chans; c != NULL; c = c->next)
            for (unsigned k = 0; k < 4 && c->ch != NULL; k++)
                v[k] += atomic_load_explicit(&c->ch->served[k],
                                             memory_order_relaxed);
        /* Peers write their counts: one that goes down (a peer that
         * lies, or left) does not make the sum go back. */
        for (unsigned k = 0; k < 4; k++) {
            uint64_t was = atomic_load_explicit(&shm->served_last[k],
                                                memory_order_relaxed);
            if (v[k] > was)
                atomic_store_explicit(&shm->served_last[k], v[k],
                                      memory_order_relaxed);
        }
        pthread_mutex_unlock(&shm->chan_lock);
    }
    for (unsigned k = 0; k < 4; k++)
        out[k] +=
            atomic_load_explicit(&shm->served_last[k], memory_order_relaxed);
}
