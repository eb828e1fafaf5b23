/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Matched ceilings: plain programs that do the work kvt bench does with the
 * same resources, so that kvt's figure divided by theirs says how close
 * kvt is to the machine. Each moves blocks of BLOCK bytes along the same
 * walks kvt bench uses (tools/bench_check.c: contiguous, or scattered so
 * that no two consecutive blocks are neighbours on either side), through
 * working sets of WSET bytes in all (split between the streams or
 * threads), cold by default as kvt bench's are.
 *
 *   tcp-matched SECONDS STREAMS BLOCK WSET contig|scatter MSG
 *       STREAMS loopback TCP connections, each with a sending thread here
 *       and a receiving thread in another process. A message is a 16-byte
 *       header and MSG bytes of blocks, gathered with sendmsg() from the
 *       source walk; the receiver reads the header, then the whole
 *       message straight into the destination walk with readv(). GB/s of
 *       blocks, timed until the receiver has every byte.
 *   copy-matched SECONDS THREADS BLOCK WSET contig|scatter nt|plain
 *                memcpy|cma BATCH [PID ADDR]
 *       THREADS threads each copying its share, BATCH blocks at a time:
 *       memcpy into memory of this process (a mapping kvt writes into
 *       directly costs the same), with streaming stores (nt: pieces of
 *       256 bytes and more, as kvt's shm copies) or plain ones; or
 *       process_vm_writev() into another process, one call per BATCH
 *       blocks (at most 1024 iovecs). GB/s. With PID ADDR, the WSET
 *       bytes written are those at ADDR in process PID (a kvt bench
 *       target's buffer), the very pages kvt writes into: cma writes
 *       there; memcpy maps the shared memory object that backs them (a
 *       kvt_mem_alloc() allocation, opened through /proc/PID/fd). Which
 *       pages a process got moves the figure by up to a sixth here, the
 *       same way every time for the same process (docs/benchmarks.md,
 *       "One target for both"), so the ceiling writes where kvt does.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../tools/bench.h"
#include "matched.h"

#define MAX_IOV 1024

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int walk(bench_walk_t *w, size_t wset, size_t block, int scatter,
                double frac)
{
    if (bench_walk_init(w, wset / block, scatter, frac) != 0) {
        fprintf(stderr, "matched: a scattered walk needs 5, 7 or more "
                        "blocks per stream or thread\n");
        return -1;
    }
    return 0;
}

/* ---- tcp-matched ----------------------------------------------------------
 */

typedef struct {
    int fd;
    char *mem; /* wset bytes, touched before the clock starts */
    size_t block, wset, msg;
    int scatter;
    double t_end;
    uint64_t bytes;
} stream_t;

/* Send or receive all of @iov (advanced in place); 0, or -1 at EOF or an
 * error. */
static int xfer_all(int fd, struct iovec *iov, int n, int sending)
{
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov,
                            .msg_iovlen = (size_t)(n < MAX_IOV ? n : MAX_IOV)};
        ssize_t r = sending ? sendmsg(fd, &mh, MSG_NOSIGNAL)
                            : readv(fd, iov, (int)mh.msg_iovlen);
        if (r <= 0)
            return -1;
        while (r > 0 && n > 0) {
            if ((size_t)r >= iov->iov_len) {
                r -= (ssize_t)iov->iov_len;
                iov++;
                n--;
            } else {
                iov->iov_base = (char *)iov->iov_base + r;
                iov->iov_len -= (size_t)r;
                r = 0;
            }
        }
    }
    return 0;
}

static void *stream_run(void *arg, int sending)
{
    stream_t *s = arg;
    size_t per = s->msg / s->block;
    char *mem = s->mem;
    struct iovec *iov = calloc(per + 1, sizeof(*iov));
    uint64_t hdr[2] = {s->msg, 0}, k = 0;
    bench_walk_t w;

    if (iov == NULL ||
        walk(&w, s->wset, s->block, s->scatter, sending ? 0.382 : 0.618))
        exit(2);
    for (;;) {
        if (sending && now() >= s->t_end)
            break;
        iov[0] = (struct iovec){hdr, sizeof(hdr)};
        if (!sending) {
            /* The header alone, then the message it announces. */
            if (xfer_all(s->fd, iov, 1, 0) != 0)
                break;
        }
        for (size_t i = 0; i < per; i++, k++)
            iov[i + 1] = (struct iovec){mem + bench_walk_slot(&w, k) * s->block,
                                        s->block};
        if (sending ? xfer_all(s->fd, iov, (int)per + 1, 1)
                    : xfer_all(s->fd, iov + 1, (int)per, 0))
            break;
        s->bytes += per * s->block;
    }
    free(iov);
    return NULL;
}

static void *stream_send(void *arg)
{
    return stream_run(arg, 1);
}

static void *stream_recv(void *arg)
{
    return stream_run(arg, 0);
}

int matched_tcp(int argc, char **argv)
{
    double secs, t0;
    int n, scatter;
    size_t block, wset, msg;
    stream_t *s;
    pthread_t *th;
    int(*fds)[2];
    uint64_t bytes = 0;
    pid_t pid;
    int ready[2];
    char c;

    if (argc != 8)
        return -1;
    secs = atof(argv[2]);
    n = atoi(argv[3]);
    block = matched_size(argv[4]);
    wset = matched_size(argv[5]);
    scatter = strcmp(argv[6], "scatter") == 0;
    msg = matched_size(argv[7]) / block * block;
    if (n < 1 || n > 64 || block == 0 || msg == 0 || wset / n < block)
        return -1;
    s = calloc((size_t)n, sizeof(*s));
    th = calloc((size_t)n, sizeof(*th));
    fds = calloc((size_t)n, sizeof(*fds));
    for (int i = 0; i < n; i++)
        if (matched_tcp_pair(&fds[i][0], &fds[i][1]) != 0)
            return 2;
    for (int i = 0; i < n; i++)
        s[i] = (stream_t){.block = block,
                          .wset = wset / (size_t)n / block * block,
                          .msg = msg,
                          .scatter = scatter};
    if (pipe(ready))
        return 2;
    pid = fork();
    if (pid == 0) {
        for (int i = 0; i < n; i++)
            s[i].mem = matched_touched(s[i].wset);
        if (write(ready[1], "r", 1) != 1)
            _exit(1);
        for (int i = 0; i < n; i++) {
            close(fds[i][0]);
            s[i].fd = fds[i][1];
            pthread_create(&th[i], NULL, stream_recv, &s[i]);
        }
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        _exit(0);
    }
    for (int i = 0; i < n; i++) {
        close(fds[i][1]);
        s[i].fd = fds[i][0];
        s[i].mem = matched_touched(s[i].wset);
    }
    /* The clock starts once both sides' memory is in place. */
    if (read(ready[0], &c, 1) != 1)
        return 2;
    t0 = now();
    for (int i = 0; i < n; i++) {
        s[i].t_end = t0 + secs;
        pthread_create(&th[i], NULL, stream_send, &s[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        shutdown(s[i].fd, SHUT_WR);
        bytes += s[i].bytes;
    }
    waitpid(pid, NULL, 0); /* every byte read */
    printf("%.3f\n", (double)bytes / (now() - t0) / 1e9);
    return 0;
}

/* ---- copy-matched ---------------------------------------------------------
 */

static pthread_barrier_t copy_ready, copy_go;
static double copy_t_end;

typedef struct {
    size_t block, wset, batch;
    int scatter, nt, cma;
    pid_t pid;
    char *remote; /* cma: this thread's area in the other process */
    char *dst;    /* memcpy into another's memory: this thread's area */
    double t_done;
    uint64_t bytes;
} copier_t;

#if defined(__x86_64__)
/* @n bytes (any size) from @s to @d with streaming stores for the whole
 * 16-byte units after @d's first 16-byte boundary; no fence. */
static void copy_nt(char *d, const char *s, size_t n)
{
    size_t head = (size_t)(-(uintptr_t)d & 15);

    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
}
#endif

static void *copier_run(void *arg)
{
    copier_t *c = arg;
    char *src = matched_touched(c->wset), *dst = c->cma ? NULL
                                                 : c->dst
                                                     ? c->dst
                                                     : matched_touched(c->wset);
    struct iovec *l = calloc(c->batch, sizeof(*l));
    struct iovec *r = calloc(c->batch, sizeof(*r));
    bench_walk_t ws, wd;
    uint64_t k = 0;

    if (l == NULL || r == NULL ||
        walk(&ws, c->wset, c->block, c->scatter, 0.382) ||
        walk(&wd, c->wset, c->block, c->scatter, 0.618))
        exit(2);
    /* Every thread's memory is touched before the clock starts. */
    pthread_barrier_wait(&copy_ready);
    pthread_barrier_wait(&copy_go);
    while (now() < copy_t_end) {
        for (size_t i = 0; i < c->batch; i++, k++) {
            char *from = src + bench_walk_slot(&ws, k) * c->block;
            size_t to = bench_walk_slot(&wd, k) * c->block;
            if (c->cma) {
                l[i] = (struct iovec){from, c->block};
                r[i] = (struct iovec){c->remote + to, c->block};
                continue;
            }
#if defined(__x86_64__)
            if (c->nt && c->block >= 256) {
                copy_nt(dst + to, from, c->block);
                continue;
            }
#endif
            memcpy(dst + to, from, c->block);
        }
        if (c->cma) {
            for (size_t i = 0; i < c->batch; i += MAX_IOV) {
                size_t m = c->batch - i < MAX_IOV ? c->batch - i : MAX_IOV;
                if (process_vm_writev(c->pid, l + i, m, r + i, m, 0) < 0) {
                    perror("process_vm_writev");
                    exit(2);
                }
            }
        }
#if defined(__x86_64__)
        else if (c->nt)
            _mm_sfence();
#endif
        c->bytes += c->batch * c->block;
    }
    c->t_done = now();
    free(l);
    free(r);
    return NULL;
}

/*
 * The shared memory object that backs @len bytes at @addr in process
 * @pid, mapped here: NULL (said why) unless one mapping there holds them
 * and one of its descriptors is that object.
 */
static char *other_shared(pid_t pid, uint64_t addr, size_t len)
{
    char path[64], line[512];
    uint64_t lo = 0, hi = 0, off = 0, ino = 0;
    int found = 0, fd = -1;
    FILE *f;
    DIR *d;
    struct dirent *de;
    char *p;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        perror(path);
        return NULL;
    }
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        char perm[8];
        unsigned dmaj, dmin;
        if (sscanf(line,
                   "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64,
                   &lo, &hi, perm, &off, &dmaj, &dmin, &ino) == 7 &&
            lo <= addr && addr + len <= hi && ino != 0 && perm[3] == 's')
            found = 1;
    }
    fclose(f);
    if (!found) {
        fprintf(stderr,
                "matched: no shared mapping holds %zu bytes at 0x%" PRIx64
                " in process %d\n",
                len, addr, (int)pid);
        return NULL;
    }
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    d = opendir(path);
    while (d != NULL && fd < 0 && (de = readdir(d)) != NULL) {
        char fp[300];
        struct stat st;
        snprintf(fp, sizeof(fp), "%s/%s", path, de->d_name);
        if (de->d_name[0] != '.' && stat(fp, &st) == 0 && st.st_ino == ino &&
            S_ISREG(st.st_mode))
            fd = open(fp, O_RDWR);
    }
    if (d != NULL)
        closedir(d);
    if (fd < 0) {
        fprintf(stderr,
                "matched: process %d holds no descriptor of the "
                "object behind 0x%" PRIx64 "\n",
                (int)pid, addr);
        return NULL;
    }
    p = mmap(NULL, len + (addr - lo), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             (off_t)off);
    close(fd);
    if (p == MAP_FAILED) {
        perror("mmap");
        return NULL;
    }
    /* Page tables filled before the clock starts, as kvt's mapping is
     * (MADV_POPULATE_WRITE, Linux 5.14; else touched). */
    if (madvise(p, len + (addr - lo), MADV_POPULATE_WRITE) != 0)
        for (size_t i = 0; i < len + (addr - lo); i += 4096)
            ((volatile char *)p)[i] = ((volatile char *)p)[i];
    return p + (addr - lo);
}

int matched_copy(int argc, char **argv)
{
    double secs, t0, t1 = 0;
    int n;
    size_t block, wset, per;
    copier_t *c;
    pthread_t *th;
    uint64_t bytes = 0;
    int pipefd[2];
    pid_t pid = 0;
    char *remote = NULL, *shared = NULL;
    pid_t other = 0;
    uint64_t at = 0;

    if (argc != 10 && argc != 12)
        return -1;
    if (argc == 12) {
        other = (pid_t)atoi(argv[10]);
        at = strtoull(argv[11], NULL, 0);
        if (other <= 0 || at == 0)
            return -1;
    }
    secs = atof(argv[2]);
    n = atoi(argv[3]);
    block = matched_size(argv[4]);
    wset = matched_size(argv[5]);
    if (n < 1 || n > 64 || block == 0 || wset / (size_t)n < block)
        return -1;
    per = wset / (size_t)n / block * block;
    c = calloc((size_t)n, sizeof(*c));
    th = calloc((size_t)n, sizeof(*th));
    if (other != 0 && strcmp(argv[8], "cma") == 0) {
        pid = other;
        remote = (char *)(uintptr_t)at;
    } else if (other != 0) {
        shared = other_shared(other, at, per * (size_t)n);
        if (shared == NULL)
            return 2;
    } else if (strcmp(argv[8], "cma") == 0) {
        /* The other process: one area for every thread, kept until
         * killed. */
        if (pipe(pipefd))
            return 2;
        pid = fork();
        if (pid == 0) {
            char *p = matched_touched(per * (size_t)n);
            if (write(pipefd[1], &p, sizeof(p)) != sizeof(p))
                _exit(1);
            pause();
            _exit(0);
        }
        if (read(pipefd[0], &remote, sizeof(remote)) != sizeof(remote))
            return 2;
    }
    pthread_barrier_init(&copy_ready, NULL, (unsigned)n + 1);
    pthread_barrier_init(&copy_go, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        c[i] = (copier_t){.block = block,
                          .wset = per,
                          .batch = (size_t)atoi(argv[9]),
                          .scatter = strcmp(argv[6], "scatter") == 0,
                          .nt = strcmp(argv[7], "nt") == 0,
                          .cma = pid != 0,
                          .pid = pid,
                          .remote = remote ? remote + (size_t)i * per : NULL,
                          .dst = shared ? shared + (size_t)i * per : NULL};
        if (c[i].batch == 0)
            return -1;
        pthread_create(&th[i], NULL, copier_run, &c[i]);
    }
    pthread_barrier_wait(&copy_ready);
    t0 = now();
    copy_t_end = t0 + secs;
    pthread_barrier_wait(&copy_go);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        bytes += c[i].bytes;
        if (c[i].t_done > t1)
            t1 = c[i].t_done;
    }
    if (pid != 0 && other == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    printf("%.3f\n", (double)bytes / (t1 - t0) / 1e9);
    return 0;
}
