/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TEST_NETNS_H
#define KVT_TEST_NETNS_H

/*
 * Network namespaces for fault tests. A world is one initiator namespace
 * and up to NETNS_MAX_PEERS peer namespaces, each peer joined to the
 * initiator by its own veth pair (peer k: 10.77.k.1 on the initiator's
 * side, 10.77.k.2 on the peer's). Both ends of every pair are created
 * inside the world's namespaces, so nothing is ever added to the
 * namespace the test was started in, and nothing can reach an address
 * outside the world.
 *
 * Names carry the creating process's id ("kvtf<pid>-i", "kvtf<pid>-p1";
 * veths "kf<pid>i1", "kf<pid>p1"), so runs never collide. The world is
 * removed on every way out: netns_world_destroy() on a normal exit; a
 * watchdog process (detached, so a test runner that kills the test's
 * process tree does not kill it) that removes it as soon as every process
 * of the test has gone, however they went; and netns_sweep() at the start
 * of every run, which removes worlds whose creator is dead (a watchdog
 * that was killed too).
 *
 * Peers are processes, each in its own namespace, serving one buffer from
 * an engine limited to tcp (same-host transports would bypass the links).
 * Faults are applied with ip(8) and iptables(8) (or nft(8)) in the peer's
 * namespace only.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvt/kvt.h>

#define NETNS_MAX_PEERS 8
#define NETNS_DIR "/run/netns"

typedef struct {
    int npeers;
    pid_t owner;
    char ns[NETNS_MAX_PEERS + 1][32]; /* [0]: initiator, [k]: peer k */
    char filter[16];                  /* "iptables", "nft" or "" */
    pid_t peer_pid[NETNS_MAX_PEERS + 1];
    int peer_ctl[NETNS_MAX_PEERS + 1];        /* closing it ends the peer */
    int peer_res[NETNS_MAX_PEERS + 1];        /* its port, then its count */
    int peer_status[NETNS_MAX_PEERS + 1];     /* as waitpid() gave it */
    uint64_t peer_notes[NETNS_MAX_PEERS + 1]; /* notifications taken */
    uint16_t peer_port[NETNS_MAX_PEERS + 1];
    int created;
} netns_world_t;

static inline double netns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run a shell command line, its output to stderr when @show or
 * KVT_FAULTS_VERBOSE is set, else discarded; killed after 20 s. Returns
 * its exit status, or -1. */
static inline int netns_run(int show, const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    int status = 0, verbose = getenv("KVT_FAULTS_VERBOSE") != NULL;
    double t0 = netns_now();
    pid_t pid;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (verbose)
        fprintf(stderr, "+ %s\n", cmd);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (show)
            dup2(2, 1);
        else if (!verbose) {
            int fd = open("/dev/null", O_RDWR);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            return -1;
        if (netns_now() - t0 > 20) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(1000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* netns_run() with the output discarded (unless KVT_FAULTS_VERBOSE). */
#define netns_sh(...) netns_run(0, __VA_ARGS__)

/* Remove every namespace named "kvtf<pid>-..." (@pid > 0: that pid's
 * only; 0: those whose creator is no longer alive). */
static inline void netns_sweep(pid_t pid)
{
    DIR *d = opendir(NETNS_DIR);
    struct dirent *de;

    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        long p;
        char *end;

        if (strncmp(de->d_name, "kvtf", 4) != 0)
            continue;
        p = strtol(de->d_name + 4, &end, 10);
        if (end == de->d_name + 4 || *end != '-' || p <= 0)
            continue;
        if (pid > 0 ? p != pid : (kill((pid_t)p, 0) == 0 || errno != ESRCH))
            continue;
        netns_sh("ip netns del %s", de->d_name);
    }
    closedir(d);
}

/* The watchdog: a detached grandchild that waits until the write end of a
 * pipe is closed by every process holding it (this one and whatever it
 * forks), then removes the world. */
static inline void netns_watchdog(pid_t owner)
{
    int p[2];
    pid_t pid;

    if (pipe(p) != 0)
        return;
    pid = fork();
    if (pid == 0) {
        char c;
        setsid();
        if (fork() != 0)
            _exit(0);
        close(p[1]);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0])
                close(fd);
        /* Nor keep the test runner's output pipes open. */
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
            close(null);
        }
        while (read(p[0], &c, 1) != 0 && errno == EINTR)
            ;
        netns_sweep(owner);
        _exit(0);
    }
    close(p[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    /* p[1] stays open in this process (and its children) on purpose. */
}

/* Why this machine cannot run the fault tests, or NULL when it can. */
static inline const char *netns_unusable(void)
{
    if (geteuid() != 0)
        return "not root: network namespaces need CAP_NET_ADMIN";
    if (netns_sh("command -v ip") != 0)
        return "no ip(8) (iproute2)";
    return NULL;
}

/* End the world's peer processes (each destroys its engine), killing one
 * that takes over 5 s. */
static inline void netns_peers_stop(netns_world_t *w)
{
    for (int k = 1; k <= w->npeers; k++) {
        if (w->peer_ctl[k] >= 0)
            close(w->peer_ctl[k]);
        w->peer_ctl[k] = -1;
    }
    for (int k = 1; k <= w->npeers; k++) {
        w->peer_status[k] = -1;
        if (w->peer_pid[k] > 0) {
            double t0 = netns_now();
            while (waitpid(w->peer_pid[k], &w->peer_status[k], WNOHANG) == 0) {
                if (netns_now() - t0 > 5) {
                    kill(w->peer_pid[k], SIGKILL);
                    waitpid(w->peer_pid[k], &w->peer_status[k], 0);
                    break;
                }
                usleep(2000);
            }
        }
        if (w->peer_res[k] >= 0) {
            if (read(w->peer_res[k], &w->peer_notes[k], 8) != 8)
                w->peer_notes[k] = 0;
            close(w->peer_res[k]);
        }
        w->peer_res[k] = -1;
        w->peer_pid[k] = 0;
    }
}

/* Peers ended, namespaces (and so their links) removed. Only the process
 * that created the world removes it. */
static inline void netns_world_destroy(netns_world_t *w)
{
    netns_peers_stop(w);
    if (w->created && getpid() == w->owner)
        netns_sweep(w->owner);
    w->created = 0;
}

/*
 * netns_world_create() - the namespaces and links of a world with
 * @npeers peers (no processes yet). Returns 0, or 77 when the machine
 * does not allow it (said on stderr), or 1 on another failure.
 */
static inline int netns_world_create(netns_world_t *w, int npeers)
{
    const char *why = netns_unusable();
    pid_t me = getpid();

    memset(w, 0, sizeof(*w));
    for (int k = 0; k <= NETNS_MAX_PEERS; k++)
        w->peer_ctl[k] = w->peer_res[k] = -1;
    if (why != NULL) {
        fprintf(stderr, "skipped: %s\n", why);
        return 77;
    }
    if (npeers < 1 || npeers > NETNS_MAX_PEERS)
        return 1;
    w->npeers = npeers;
    w->owner = me;
    netns_sweep(0);
    netns_watchdog(me);
    w->created = 1;
    snprintf(w->ns[0], sizeof(w->ns[0]), "kvtf%d-i", (int)me);
    if (netns_sh("ip netns add %s", w->ns[0]) != 0) {
        fprintf(stderr, "skipped: cannot create a network namespace\n");
        netns_world_destroy(w);
        return 77;
    }
    netns_sh("ip -n %s link set lo up", w->ns[0]);
    for (int k = 1; k <= npeers; k++) {
        snprintf(w->ns[k], sizeof(w->ns[k]), "kvtf%d-p%d", (int)me, k);
        if (netns_sh("ip netns add %s", w->ns[k]) != 0)
            goto fail;
        netns_sh("ip -n %s link set lo up", w->ns[k]);
        if (netns_sh("ip -n %s link add kf%di%d type veth peer name kf%dp%d "
                     "netns %s",
                     w->ns[0], (int)me, k, (int)me, k, w->ns[k]) != 0) {
            fprintf(stderr, "skipped: cannot create a veth pair\n");
            netns_world_destroy(w);
            return 77;
        }
        if (netns_sh("ip -n %s addr add 10.77.%d.1/24 dev kf%di%d && "
                     "ip -n %s link set kf%di%d up && "
                     "ip -n %s addr add 10.77.%d.2/24 dev kf%dp%d && "
                     "ip -n %s link set kf%dp%d up",
                     w->ns[0], k, (int)me, k, w->ns[0], (int)me, k, w->ns[k], k,
                     (int)me, k, w->ns[k], (int)me, k) != 0)
            goto fail;
    }
    /* A packet filter: iptables (either backend), else nft. */
    if (netns_sh("ip netns exec %s iptables -w 5 -A INPUT -m statistic --mode "
                 "random --probability 0.5 -s 10.77.99.1 -j DROP && "
                 "ip netns exec %s iptables -w 5 -F",
                 w->ns[1], w->ns[1]) == 0)
        snprintf(w->filter, sizeof(w->filter), "iptables");
    else if (netns_sh("ip netns exec %s nft add table inet kvtf && "
                      "ip netns exec %s nft delete table inet kvtf",
                      w->ns[1], w->ns[1]) == 0)
        snprintf(w->filter, sizeof(w->filter), "nft");
    return 0;
fail:
    fprintf(stderr, "cannot set the namespaces up\n");
    netns_world_destroy(w);
    return 1;
}

/* Enter namespace @k of the world (this thread, and threads and processes
 * it creates afterwards). */
static inline int netns_enter(const netns_world_t *w, int k)
{
    char path[128];
    int fd, rc;

    snprintf(path, sizeof(path), NETNS_DIR "/%s", w->ns[k]);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* ---- Faults on peer k's link, all applied inside its namespace ------- */

static inline int netns_link(const netns_world_t *w, int k, int up)
{
    return netns_sh("ip -n %s link set kf%dp%d %s", w->ns[k], (int)w->owner, k,
                    up ? "up" : "down");
}

/* Whether the link to peer k sends one segment per packet (@one), or
 * aggregates of up to 64 KiB (the default); see netns_loss(). */
static inline int netns_segments(const netns_world_t *w, int k, int one)
{
    return netns_sh("ip -n %s link set dev kf%di%d gso_max_segs %d && "
                    "ip -n %s link set dev kf%dp%d gso_max_segs %d",
                    w->ns[0], (int)w->owner, k, one ? 1 : 65535, w->ns[k],
                    (int)w->owner, k, one ? 1 : 65535);
}

/*
 * Drop each packet between the initiator and peer k with probability @p,
 * each way, where it arrives (peer k's input, and the initiator's input
 * from peer k): as on a wire, the sender is told nothing. Dropped on the
 * way out instead, a packet fails its send, which TCP handles as local
 * congestion rather than as loss.
 *
 * Meanwhile the pair sends one segment per packet (gso_max_segs 1): a
 * veth hands a sender's aggregate of up to 64 KiB across whole, and a
 * filter that drops one drops its 45 segments at once. Such bursts, at
 * 10% of the aggregates, put TCP into retransmission backoff for seconds
 * (40 batches of 64 MiB under 10% loss, two busy loops on the two
 * CPUs: 0.2 to 39 s dropped as aggregates, 0.2 to 2 s dropped one
 * segment at a time; docs/faults.md).
 */
static inline int netns_loss(const netns_world_t *w, int k, double p)
{
    if (netns_segments(w, k, 1) != 0)
        return -1;
    if (strcmp(w->filter, "iptables") == 0)
        return netns_sh(
            "ip netns exec %s iptables -w 5 -A INPUT -m statistic --mode "
            "random --probability %.4f -j DROP && "
            "ip netns exec %s sh -c 'iptables -w 5 -N kvtf%d 2>/dev/null; "
            "iptables -w 5 -F kvtf%d && "
            "{ iptables -w 5 -C INPUT -s 10.77.%d.2 -j kvtf%d 2>/dev/null || "
            "iptables -w 5 -A INPUT -s 10.77.%d.2 -j kvtf%d; } && "
            "iptables -w 5 -A kvtf%d -m statistic --mode random "
            "--probability %.4f -j DROP'",
            w->ns[k], p, w->ns[0], k, k, k, k, k, k, k, p);
    if (strcmp(w->filter, "nft") == 0)
        return netns_sh("ip netns exec %s nft -f - <<'EOF'\n"
                        "table inet kvtf {\n"
                        " chain in { type filter hook input priority 0; "
                        "numgen random mod 10000 < %d drop; }\n"
                        "}\nEOF\n"
                        "ip netns exec %s nft -f - <<'EOF'\n"
                        "table inet kvtf%d {\n"
                        " chain in { type filter hook input priority 0; "
                        "ip saddr 10.77.%d.2 numgen random mod 10000 < %d "
                        "drop; }\n"
                        "}\nEOF",
                        w->ns[k], (int)(p * 10000), w->ns[0], k, k,
                        (int)(p * 10000));
    return -1;
}

/* Drop, silently, everything that reaches peer k from the initiator. */
static inline int netns_blackhole(const netns_world_t *w, int k)
{
    if (strcmp(w->filter, "iptables") == 0)
        return netns_sh(
            "ip netns exec %s iptables -w 5 -A INPUT -s 10.77.%d.1 -j "
            "DROP",
            w->ns[k], k);
    if (strcmp(w->filter, "nft") == 0)
        return netns_sh("ip netns exec %s nft -f - <<'EOF'\n"
                        "table inet kvtf {\n"
                        " chain in { type filter hook input priority 0; "
                        "ip saddr 10.77.%d.1 drop; }\n"
                        "}\nEOF",
                        w->ns[k], k);
    return -1;
}

/* Every fault on peer k undone: filter rules gone (the initiator's for
 * peer k too), one segment a packet no more, link up. */
static inline int netns_repair(const netns_world_t *w, int k)
{
    int rc = 0;

    if (strcmp(w->filter, "iptables") == 0) {
        rc |= netns_sh("ip netns exec %s iptables -w 5 -F", w->ns[k]);
        /* The initiator's side of a loss, if any (an empty chain stays). */
        netns_sh("ip netns exec %s iptables -w 5 -F kvtf%d", w->ns[0], k);
    } else if (strcmp(w->filter, "nft") == 0) {
        netns_sh("ip netns exec %s nft delete table inet kvtf", w->ns[k]);
        netns_sh("ip netns exec %s nft delete table inet kvtf%d", w->ns[0], k);
    }
    rc |= netns_segments(w, k, 0);
    rc |= netns_link(w, k, 1);
    return rc;
}

/* The TCP state (ss -tinm) of the connections between the initiator and
 * peer k, both ends, on stderr: what a transfer that takes long waits
 * for (retransmission backoff shows as "backoff:N" beside a full send
 * queue; a send queue that stays empty while a transfer waits is the
 * engine's). */
static inline void netns_show_tcp(const netns_world_t *w, int k)
{
    fprintf(stderr, "TCP state, initiator to peer %d, then peer %d:\n", k, k);
    netns_run(1,
              "ip netns exec %s ss -tinm dst 10.77.%d.2; "
              "ip netns exec %s ss -tinm src 10.77.%d.2",
              w->ns[0], k, w->ns[k], k);
}

/* ---- Peers ----------------------------------------------------------- */

static inline void netns_peer_main(const netns_world_t *w, int k,
                                   size_t buf_len, int ctl_fd, int res_fd)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;
    kvt_notify_t *msgs = calloc(16, sizeof(*msgs));
    uint64_t got = 0;
    size_t n;
    char host[32];
    uint16_t port;
    void *buf;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    if (getppid() == 1 || msgs == NULL || netns_enter(w, k) != 0)
        _exit(3);
    snprintf(host, sizeof(host), "10.77.%d.2", k);
    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_LOCAL_HOST;
    p.transports = KVT_TRANSPORT_TCP;
    p.local_host = host;
    if (kvt_engine_create(&p, &e) != KVT_OK ||
        kvt_mem_alloc(e, buf_len, KVT_ACCESS_REMOTE_RW, &buf) != KVT_OK)
        _exit(3);
    memset(buf, 0, buf_len); /* resident from the start */
    port = kvt_engine_rpc_port(e);
    if (write(res_fd, &port, sizeof(port)) != (ssize_t)sizeof(port))
        _exit(3);
    /* Take notifications as they come until the control pipe closes. */
    for (;;) {
        struct pollfd pf = {.fd = ctl_fd, .events = POLLIN};
        if (poll(&pf, 1, 0) != 0)
            break;
        n = 0;
        kvt_notify_recv(e, msgs, 16, &n, 100);
        got += n;
    }
    do {
        n = 0;
        kvt_notify_recv(e, msgs, 16, &n, 0);
        got += n;
    } while (n > 0);
    kvt_engine_destroy(e);
    free(msgs);
    if (write(res_fd, &got, sizeof(got)) != (ssize_t)sizeof(got))
        _exit(3);
    exit(0); /* not _exit: LeakSanitizer checks the peer at exit */
}

/*
 * netns_peers_start() - one peer process per peer namespace, each serving
 * a registered buffer of @buf_len bytes on 10.77.k.2 (the only region its
 * descriptor lists) and taking the notifications sent to it; how many it
 * took is in peer_notes[k] once netns_peers_stop() has returned. Call it
 * before creating any thread. Returns 0 or 1.
 */
static inline int netns_peers_start(netns_world_t *w, size_t buf_len)
{
    for (int k = 1; k <= w->npeers; k++) {
        int ctl[2], port[2];
        pid_t pid;

        if (pipe(ctl) != 0 || pipe(port) != 0)
            return 1;
        w->peer_notes[k] = 0;
        fflush(NULL);
        pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            /* Only the parent may hold a peer's control pipe open. */
            for (int j = 1; j < k; j++) {
                close(w->peer_ctl[j]);
                close(w->peer_res[j]);
            }
            close(ctl[1]);
            close(port[0]);
            netns_peer_main(w, k, buf_len, ctl[0], port[1]);
        }
        close(ctl[0]);
        close(port[1]);
        w->peer_pid[k] = pid;
        w->peer_ctl[k] = ctl[1];
        w->peer_res[k] = port[0];
        if (read(port[0], &w->peer_port[k], sizeof(uint16_t)) !=
            (ssize_t)sizeof(uint16_t)) {
            fprintf(stderr, "peer %d did not start\n", k);
            return 1;
        }
    }
    return 0;
}

static inline void netns_peer_name(const netns_world_t *w, int k, char *buf,
                                   size_t len)
{
    snprintf(buf, len, "10.77.%d.2:%u", k, (unsigned)w->peer_port[k]);
}

/* ---- What a process holds -------------------------------------------- */

typedef struct {
    long rss_kb, fds, threads;
    double cpu_s; /* user + system time so far */
} netns_usage_t;

static inline int netns_count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static inline int netns_usage(pid_t pid, netns_usage_t *u)
{
    char path[64], line[512];
    FILE *f;

    memset(u, 0, sizeof(*u));
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            u->rss_kb = strtol(line + 6, NULL, 10);
    fclose(f);
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    if (fgets(line, sizeof(line), f) != NULL) {
        /* Fields 14 and 15, after the command name in parentheses. */
        const char *q = strrchr(line, ')');
        unsigned long ut = 0, st = 0;
        if (q != NULL && sscanf(q + 2,
                                "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                                "%*u %lu %lu",
                                &ut, &st) == 2)
            u->cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    }
    fclose(f);
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    u->fds = netns_count_dir(path);
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    u->threads = netns_count_dir(path);
    return u->fds < 0 || u->threads < 0 ? -1 : 0;
}

/* ---- Bytes ------------------------------------------------------------ */

static inline uint64_t netns_word(uint64_t seed, uint64_t i)
{
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 32);
}

/* Fill or check @len bytes (a multiple of 8) that stand at byte @off of a
 * pattern named by @seed. Check returns the number of bad words. */
static inline void netns_fill(void *buf, uint64_t len, uint64_t seed,
                              uint64_t off)
{
    uint64_t *p = buf;
    for (uint64_t i = 0; i < len / 8; i++)
        p[i] = netns_word(seed, off / 8 + i);
}

static inline uint64_t netns_check(const void *buf, uint64_t len, uint64_t seed,
                                   uint64_t off)
{
    const uint64_t *p = buf;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < len / 8; i++)
        bad += p[i] != netns_word(seed, off / 8 + i);
    return bad;
}

#endif
