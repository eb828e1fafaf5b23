/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Whether the target runs: its channel and socket, a pidfd, and its
 * /proc state (stopped, dying, a zombie leader with live threads), so
 * that a copy into a target that is stopped or gone is not reported
 * delivered; and the hold of a session whose target is stopped.
 */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/shm/shm_sess.h"

/*
 * Hold a session whose target is stopped while a job of it waits for the
 * target (staging slots, the notification ring): executors take no more
 * of its jobs, which would only wait as well, each holding its thread,
 * until kvt__shm_stopped_poll() sees the target run again (or the session
 * dies).
 */
void kvt__shm_session_hold(shm_session_t *s)
{
    int zero = 0;

    if (atomic_compare_exchange_strong(&s->held, &zero, 1))
        atomic_fetch_add(&s->shm->nheld, 1);
}

/* Let executors take the session's jobs again; 1 if it was held. */
int kvt__shm_session_unhold(shm_session_t *s)
{
    int one = 1;

    if (!atomic_compare_exchange_strong(&s->held, &one, 0))
        return 0;
    atomic_fetch_sub(&s->shm->nheld, 1);
    return 1;
}

/* KVT_OK while the session is usable, as far as shared memory says.
 * Executors only (the channel is mapped while a job is in flight). */
kvt_status_t kvt__shm_session_status(shm_session_t *s)
{
    int32_t d = atomic_load(&s->base.dead);

    if (d != 0)
        return d;
    if (atomic_load(&s->ch->closed) != 0)
        return KVT_ERR_CONN_LOST;
    return KVT_OK;
}

/* kvt__shm_session_status(), and the target process alive (a system call). */
kvt_status_t kvt__shm_peer_status(shm_session_t *s)
{
    kvt_status_t st = kvt__shm_session_status(s);
    struct pollfd p[2];
    int n = 0;

    if (st != KVT_OK)
        return st;
    p[n++] = (struct pollfd){.fd = s->sock, .events = POLLRDHUP};
    if (s->pidfd >= 0)
        p[n++] = (struct pollfd){.fd = s->pidfd, .events = POLLIN};
    if (poll(p, (nfds_t)n, 0) > 0 &&
        ((p[0].revents & (POLLHUP | POLLRDHUP | POLLERR)) ||
         (n > 1 && p[1].revents)))
        return KVT_ERR_CONN_LOST;
    return KVT_OK;
}

/* In /proc/PID/stat: PF_EXITING in the flags (field 9), and SIGKILL among
 * the thread's pending signals (field 31, the first 31 of them). */
#define STAT_PF_EXITING 0x4ull
#define STAT_SIGKILL (1ull << (SIGKILL - 1))

int kvt__shm_thread_state(const char *buf)
{
    const char *q = strrchr(buf, ')'); /* the name may hold anything */
    unsigned long long v = 0;

    if (q == NULL || q[1] != ' ' || q[2] == '\0')
        return KVT_SHM_THR_UNKNOWN;
    switch (q[2]) {
    case 'T':
    case 't':
        return KVT_SHM_THR_STOPPED;
    case 'Z':
    case 'X':
    case 'x':
        return KVT_SHM_THR_ZOMBIE;
    default:
        break;
    }
    q += 3; /* fields 4 on, numbers (some signed: only 9 and 31 count) */
    for (int f = 4; f <= 31; f++) {
        char *e;
        v = strtoull(q, &e, 10);
        if (e == q)
            return KVT_SHM_THR_UNKNOWN;
        if (f == 9 && (v & STAT_PF_EXITING))
            return KVT_SHM_THR_DYING;
        q = e;
    }
    return (v & STAT_SIGKILL) ? KVT_SHM_THR_DYING : KVT_SHM_THR_RUNNING;
}

/* Read the stat line of @fd into @buf (@len bytes of room). */
static int stat_read(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);

    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

/*
 * A target whose thread-group leader is a zombie lives on while another
 * of its threads does (the leader called pthread_exit()): 0 when one
 * runs, 1 when none does (stopped, or all dying: a group being killed),
 * -1 when none is left to read. The leader, a zombie, keeps the pid from
 * being reused meanwhile.
 */
static int zombie_leader_state(shm_session_t *s)
{
    char path[64], buf[1024];
    struct dirent *de;
    DIR *dir;
    int running = 0, seen = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)s->pid);
    dir = opendir(path);
    if (dir == NULL)
        return -1;
    while (!running && (de = readdir(dir)) != NULL) {
        int fd, st;
        if (de->d_name[0] < '1' || de->d_name[0] > '9' ||
            atoi(de->d_name) == (int)s->pid)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)s->pid,
                 de->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* gone meanwhile */
        st = stat_read(fd, buf, sizeof(buf)) == 0 ? kvt__shm_thread_state(buf)
                                                  : KVT_SHM_THR_UNKNOWN;
        close(fd);
        seen++;
        /* One that cannot be parsed is taken for running. */
        running |= st == KVT_SHM_THR_RUNNING || st == KVT_SHM_THR_UNKNOWN;
    }
    closedir(dir);
    if (running)
        return 0;
    return seen > 0 ? 1 : -1;
}

/*
 * The target's state from its /proc/PID/stat (one read, cheaper than a
 * poll): 0 running; 1 not running, stopped or dying (a copy into it is not
 * delivered, at least not yet); -1 unknown (the read failed: the pidfd
 * decides). The descriptor is bound to the process, not its number, so a
 * reused pid reads as gone. Only a zombie leader costs more reads.
 */
int kvt__shm_target_state(shm_session_t *s)
{
    char buf[1024];

    atomic_fetch_add_explicit(&s->shm->state_reads, 1, memory_order_relaxed);
    if (stat_read(s->statfd, buf, sizeof(buf)) != 0)
        return -1;
    switch (kvt__shm_thread_state(buf)) {
    case KVT_SHM_THR_RUNNING:
        return 0;
    case KVT_SHM_THR_STOPPED:
    case KVT_SHM_THR_DYING:
        return 1;
    case KVT_SHM_THR_ZOMBIE:
        return zombie_leader_state(s);
    default:
        return -1;
    }
}

/*
 * After the copies of a job: whether the target is stopped or dying (1,
 * kvt__shm_target_state()), so that success is not reported yet, or not (0),
 * with *st_p KVT_OK when it is alive and running. A copy into a target that is
 * stopped is not a transfer until it runs again (as over TCP, where a
 * stopped peer answers nothing); into a dead one it fails, since nobody
 * will read what landed.
 */
int kvt__shm_target_check(shm_session_t *s, kvt_status_t *st_p)
{
    kvt_status_t st = kvt__shm_session_status(s);
    int state = st == KVT_OK ? kvt__shm_target_state(s) : 0;

    /* Not known to run: the pidfd and the socket tell whether it is gone
     * (a killed target may read as dying until it is reaped). */
    if (st == KVT_OK && state != 0)
        st = kvt__shm_peer_status(s);
    *st_p = st;
    return st == KVT_OK && state > 0;
}
