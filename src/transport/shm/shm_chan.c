/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator's side of a channel: connecting to the target's socket
 * and checking who answers, the lease (shm_target.c explains it), messages on
 * the socket, and the notification ring.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"
#include "util/time.h"

void kvt__shm_lease_release(shm_session_t *s)
{
    kvt__shm_chan_t *ch = s->ch;

    /* The last copy out under a closing lease wakes the target. */
    if (atomic_fetch_sub(&ch->active, 1) == 1 &&
        (atomic_load(&ch->lease) & 1) == 0)
        kvt__shm_futex_wake(&ch->active);
}

/*
 * Try the lease once: raise the active count, then check the lease is
 * open (sequentially consistent on both words, paired with the target's
 * close-then-drain). 1: taken. 0: closed (*seen_p: the lease word seen),
 * nothing held.
 */
int kvt__shm_lease_try(shm_session_t *s, uint32_t *seen_p)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t l;

    atomic_fetch_add(&ch->active, 1);
    l = atomic_load(&ch->lease);
    if (l & 1)
        return 1;
    kvt__shm_lease_release(s);
    *seen_p = l;
    return 0;
}

/*
 * Take the lease (kvt__shm_lease_try()) with the session usable, waiting for a
 * closed lease to reopen, in slices, until @deadline.
 */
kvt_status_t kvt__shm_lease_acquire(shm_session_t *s, uint64_t deadline)
{
    kvt__shm_chan_t *ch = s->ch;

    for (;;) {
        kvt_status_t st = kvt__shm_session_status(s);
        uint64_t now;
        uint32_t l;

        if (st != KVT_OK)
            return st;
        if (kvt__shm_lease_try(s, &l))
            return KVT_OK;
        now = kvt__now_ns();
        if (now >= deadline)
            return KVT_ERR_TIMEDOUT;
        atomic_fetch_add(&ch->lease_waiters, 1);
        kvt__shm_copier_waits(1);
        kvt__shm_futex_wait(
            &ch->lease, l,
            deadline - now < SLICE_NS ? (int64_t)(deadline - now) : SLICE_NS);
        kvt__shm_copier_waits(0);
        atomic_fetch_sub(&ch->lease_waiters, 1);
    }
}

/* Receive one message, and the descriptor riding along (or -1). */
ssize_t kvt__shm_recv_msg(int fd, kvt__shm_msg_t *m, int *fd_p)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {m, sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = u.buf,
                        .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm;
    ssize_t n;

    *fd_p = -1;
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    for (cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int)) && *fd_p < 0)
            memcpy(fd_p, CMSG_DATA(cm), sizeof(int));
    }
    if (n >= 0 && (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        n = -1;
    if (n != (ssize_t)sizeof(*m) && *fd_p >= 0) {
        close(*fd_p);
        *fd_p = -1;
    }
    return n;
}

/* The memfd is one the owner cannot shrink under us (which would make our
 * accesses fault) and holds @len bytes. */
int kvt__shm_memfd_sound(int fd, uint64_t len)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);

    return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
           (uint64_t)st.st_size >= len;
}

void kvt__shm_msg_init(kvt__shm_msg_t *m, uint16_t type)
{
    memset(m, 0, sizeof(*m));
    m->magic = KVT_SHM_MAGIC;
    m->version = KVT_SHM_VERSION;
    m->type = type;
}

/* Wait (in slices, bounded by @deadline) while *word == @v. */
kvt_status_t kvt__shm_ring_wait(shm_session_t *s, _Atomic uint32_t *word,
                                uint32_t v, uint64_t deadline)
{
    kvt_status_t st = kvt__shm_peer_status(s);
    uint64_t now = kvt__now_ns();

    if (st != KVT_OK)
        return st;
    if (now >= deadline)
        return KVT_ERR_TIMEDOUT;
    atomic_fetch_add(&s->ch->waiters, 1);
    kvt__shm_copier_waits(1);
    kvt__shm_futex_wait(word, v,
                        deadline - now < SLICE_NS ? (int64_t)(deadline - now)
                                                  : SLICE_NS);
    kvt__shm_copier_waits(0);
    atomic_fetch_sub(&s->ch->waiters, 1);
    /* Nothing moved: the target may be stopped. */
    if (atomic_load(word) == v && kvt__shm_target_state(s) == 1)
        kvt__shm_session_hold(s);
    return KVT_OK;
}

void kvt__shm_ring_bell(shm_session_t *s)
{
    kvt__shm_msg_t bell;

    kvt__shm_msg_init(&bell, KVT_SHM_BELL);
    /* A bell lost to a full socket is made up by the target's tick. */
    send(s->sock, &bell, sizeof(bell), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Queue a notification on the ring, ring the bell, and wait until the
 * target has taken it into its queue. */
kvt_status_t kvt__shm_notify_run(shm_session_t *s, job_t *j)
{
    kvt__shm_chan_t *ch = s->ch;
    uint32_t tail = atomic_load_explicit(&ch->nq_tail, memory_order_relaxed);
    kvt__shm_note_t *nt;
    kvt_status_t st = KVT_OK;

    for (;;) {
        uint32_t head =
            atomic_load_explicit(&ch->nq_head, memory_order_acquire);
        if (tail - head < KVT_SHM_NOTES)
            break;
        st = kvt__shm_ring_wait(s, &ch->nq_head, head, j->deadline);
        if (st != KVT_OK)
            return st;
    }
    nt = &ch->notes[tail % KVT_SHM_NOTES];
    nt->len = j->nlen;
    memcpy(nt->data, j->msg, j->nlen);
    atomic_store_explicit(&ch->nq_tail, tail + 1, memory_order_release);
    kvt__shm_ring_bell(s);
    for (;;) {
        uint32_t head =
            atomic_load_explicit(&ch->nq_head, memory_order_acquire);
        if ((int32_t)(head - (tail + 1)) >= 0)
            return KVT_OK;
        st = kvt__shm_ring_wait(s, &ch->nq_head, head, j->deadline);
        if (st != KVT_OK)
            return st;
    }
}

/*
 * Connect to the target's socket, check that the process behind it is the
 * one the descriptor names, and receive and check the channel; then probe
 * that this process may attach to it. On failure *why says what to log.
 */
kvt_status_t kvt__shm_chan_connect(shm_session_t *s, const kvt__segdesc_t *d,
                                   const char *path, size_t nl,
                                   const char **why)
{
    const kvt__engine_cfg_t *cfg = s->shm->cfg;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint64_t ms = cfg->connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000};
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    kvt__shm_msg_t m, hello;
    uint64_t probe = 0;
    struct iovec lv = {&probe, sizeof(probe)}, rv;
    int memfd = -1;

    memcpy(sa.sun_path, path, nl);
    s->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s->sock < 0) {
        *why = "cannot create a socket";
        return KVT_ERR_IO;
    }
    setsockopt(s->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(s->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(s->sock, (struct sockaddr *)&sa,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl))) {
        *why = "the peer serves no shm socket (another network namespace?)";
        return KVT_ERR_UNREACHABLE;
    }
    if (getsockopt(s->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        cred.pid != (pid_t)d->pid) {
        *why = "the socket's owner is not the peer's process";
        return KVT_ERR_ACCESS;
    }
    kvt__shm_msg_init(&m, KVT_SHM_HELLO);
    m.pid = (uint32_t)getpid();
    snprintf(m.name, sizeof(m.name), "%s", cfg->seg_name);
    kvt__shm_auth_hello(s->shm, &m);
    hello = m;
    if (send(s->sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m) ||
        kvt__shm_recv_msg(s->sock, &m, &memfd) != (ssize_t)sizeof(m) ||
        m.magic != KVT_SHM_MAGIC) {
        *why = "no answer to the shm handshake";
        goto err_fd;
    }
    if (cfg->auth.on && !(m.type == KVT_SHM_HELLO_ACK && m.status != KVT_OK)) {
        kvt_status_t st = kvt__shm_auth_initiator(s->shm, s->sock, &hello,
                                                  d->name, d->pid, &m, why);
        if (st != KVT_OK) {
            if (memfd >= 0)
                close(memfd);
            return st;
        }
        if (kvt__shm_recv_msg(s->sock, &m, &memfd) != (ssize_t)sizeof(m) ||
            m.magic != KVT_SHM_MAGIC) {
            *why = "no answer to the shm handshake";
            goto err_fd;
        }
    }
    if (m.type == KVT_SHM_HELLO_ACK && m.status == KVT_ERR_ACCESS &&
        strncmp(m.name, "authentication failed", 21) == 0) {
        /* The target logs which side lacks the token or has another. */
        *why = "authentication failed: the peer refused this engine "
               "(auth token missing or different)";
        if (memfd >= 0)
            close(memfd);
        return KVT_ERR_AUTH;
    }
    if (m.type != KVT_SHM_HELLO_ACK) {
        *why = "no answer to the shm handshake";
        goto err_fd;
    }
    if (m.status != KVT_OK || m.version != KVT_SHM_VERSION) {
        *why = m.version != KVT_SHM_VERSION ? "another shm protocol version"
               : m.status == KVT_ERR_BUSY
                   ? "the peer lets another process attach to it (Yama "
                     "ptrace_scope 1 allows one; see docs/shm.md)"
                   : "the peer refused the channel";
        goto err_fd;
    }
    if (m.pid != d->pid || m.host_id != cfg->host_id || memfd < 0 ||
        m.length < KVT_SHM_CHAN_SIZE ||
        !kvt__shm_memfd_sound(memfd, m.length)) {
        *why = "the peer's channel does not check out";
        goto err_fd;
    }
    s->ch_len = m.length;
    s->ch = mmap(NULL, s->ch_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    close(memfd);
    memfd = -1;
    if (s->ch == MAP_FAILED) {
        s->ch = NULL;
        *why = "cannot map the channel";
        return KVT_ERR_NO_MEMORY;
    }
    if (s->ch->magic != KVT_SHM_CHAN_MAGIC ||
        s->ch->version != KVT_SHM_VERSION || s->ch->size != s->ch_len ||
        s->ch->max_notes != KVT_SHM_NOTES ||
        s->ch->max_regions != KVT_SHM_MAX_REGIONS) {
        *why = "the peer's channel does not check out";
        return KVT_ERR_PROTOCOL;
    }
    /* The channel is at m.addr in the target: reading it back proves
     * that this process may attach to that one. */
    rv = (struct iovec){(void *)(uintptr_t)m.addr, sizeof(probe)};
    if (process_vm_readv(s->pid, &lv, 1, &rv, 1, 0) != sizeof(probe) ||
        probe != KVT_SHM_CHAN_MAGIC) {
        *why = errno == EPERM ? "not permitted to attach to the peer "
                                "(ptrace restrictions)"
                              : "cannot attach to the peer";
        return KVT_ERR_ACCESS;
    }
    s->pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
    {
        char statpath[64];
        snprintf(statpath, sizeof(statpath), "/proc/%d/stat", (int)s->pid);
        s->statfd = open(statpath, O_RDONLY | O_CLOEXEC);
    }
    if (s->statfd < 0) {
        *why = "cannot read the peer's state in /proc";
        return KVT_ERR_ACCESS;
    }
    return KVT_OK;

err_fd:
    if (memfd >= 0)
        close(memfd);
    return KVT_ERR_PROTOCOL;
}

/*
 * The peer's shm section: version 1, the name of its abstract socket (a
 * u16 length and the name, without the leading NUL). 0 when sound.
 */
int kvt__shm_section_sock(const kvt__segdesc_tl_t *tl, char *path,
                          size_t *len_p)
{
    uint16_t n;

    if (tl == NULL || tl->version != 1 || tl->len < 2)
        return -1;
    n = (uint16_t)(tl->body[0] | (tl->body[1] << 8));
    if (n == 0 || n > KVT_SHM_SOCK_MAX || (uint32_t)n + 2 != tl->len ||
        memchr(tl->body + 2, 0, n) != NULL)
        return -1;
    path[0] = '\0'; /* abstract namespace */
    memcpy(path + 1, tl->body + 2, n);
    *len_p = 1 + (size_t)n;
    return 0;
}
