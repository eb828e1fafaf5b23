/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The machine's own ceilings, measured beside kvt in the same run so that
 * ratios hold on a noisy machine.
 *   baseline tcp-stream SECONDS BLOCK  one sender, one receiver process,
 *                                      loopback, large socket buffers,
 *                                      BLOCK-sized send() calls: GB/s
 *   baseline tcp-pingpong COUNT [SIZE [same|split]]
 *                                      round trips of SIZE bytes (64),
 *                                      both ends pinned to one CPU or to
 *                                      two (unpinned without): median us
 *   baseline tcp-floor COUNT SIZE same|split|none
 *                                      the same round trips as kvt's
 *                                      synchronous write makes them:
 *                                      SIZE bytes answered with 32, the
 *                                      responder waiting in epoll_wait()
 *                                      and reading with a non-blocking
 *                                      recv(), each process with a
 *                                      second (idle) thread: median us,
 *                                      the system calls' floor under
 *                                      kvt's own code
 *   baseline tcp-matched ..., copy-matched ...
 *                                      matched ceilings (bench/matched.c)
 *   baseline memcpy MIB BLOCK          single-thread memcpy between two
 *                                      512 MiB buffers: GB/s
 *   baseline cma MIB BLOCK             process_vm_writev into another
 *                                      process: GB/s
 *   baseline cma-pieces MIB PIECE remote|local|none
 *                                      the same, 1024 pieces of PIECE
 *                                      bytes a call, strided (every other
 *                                      piece) in the target, here, or
 *                                      neither: GB/s
 *   baseline memcpy-pieces MIB PIECE STRIDE
 *                                      single-thread memcpy of pieces of
 *                                      PIECE bytes read every STRIDE
 *                                      bytes into a contiguous buffer
 *                                      (STRIDE = 2 * PIECE: one half of
 *                                      every row): GB/s of pieces, best
 *                                      of three passes
 *   baseline memcpy-rows MIB PIECE     rows of two pieces of PIECE bytes,
 *                                      each half to its own buffer
 *                                      (one prefill rank's heads for two
 *                                      decode ranks), single thread: GB/s
 *                                      copying the first halves of every
 *                                      row then the second ones, and GB/s
 *                                      copying both halves row by row,
 *                                      best of three passes each
 *   baseline handoff MIB PIECE SLOT    the first halves of rows of two
 *                                      pieces of PIECE bytes packed into
 *                                      slots of SLOT bytes (a ring of 8)
 *                                      and copied out of each slot into a
 *                                      contiguous buffer with streaming
 *                                      stores, as a staged write does:
 *                                      GB/s of pieces with one thread
 *                                      doing both copies slot by slot, and
 *                                      with a packing and a copying
 *                                      thread on two different CPUs
 *                                      handing slots over through a state
 *                                      word (spinning, no system call),
 *                                      best of three passes each
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "matched.h"

#define AREA (256ul << 20)

/* A second thread that does nothing: a process with more than one thread
 * pays for a reference to the file in each system call on a socket,
 * which kvt's processes do. */
static void *idle_thread(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t size_arg(const char *s)
{
    char *e;
    double v = strtod(s, &e);
    switch (*e) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1048576;
        break;
    case 'G':
    case 'g':
        v *= 1073741824.0;
        break;
    default:
        break;
    }
    return (size_t)v;
}

static char *touched(size_t n)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (char)i;
    return p;
}

/* Stop the child_area() child: the exit status, 0 after a run that
 * printed its figure (@ok), 2 otherwise. */
static int child_end(pid_t pid, int ok)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return ok ? 0 : 2;
}

/* A child process holding @len touched bytes, which it leaves in place
 * until killed: their address there, or NULL. */
static void *child_area(size_t len, pid_t *pid_p)
{
    int fd[2];
    void *dst;

    if (pipe(fd))
        return NULL;
    *pid_p = fork();
    if (*pid_p < 0)
        return NULL;
    if (*pid_p == 0) {
        void *p = touched(len);
        if (write(fd[1], &p, sizeof(p)) != sizeof(p))
            _exit(1);
        pause();
        _exit(0);
    }
    if (read(fd[0], &dst, sizeof(dst)) != sizeof(dst))
        return NULL;
    close(fd[0]);
    close(fd[1]);
    return dst;
}

static int pair(int *a, int *b, int big)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1, buf = 8 << 20;
    if (bind(ls, (void *)&sa, sizeof(sa)) || listen(ls, 1) ||
        getsockname(ls, (void *)&sa, &sl))
        return -1;
    *a = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*a, (void *)&sa, sizeof(sa)))
        return -1;
    *b = accept(ls, NULL, NULL);
    close(ls);
    for (int i = 0; i < 2; i++) {
        int fd = i ? *b : *a;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (big) {
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
        }
    }
    return 0;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ---- handoff ---- */

#define HO_SLOTS 8

typedef struct {
    const char *src;
    char *ring, *dst;
    size_t piece, slot, rows;
    _Atomic int state[HO_SLOTS]; /* 0 free, 1 full */
    int cpu[2];
} handoff_t;

/* Copy @n bytes (a multiple of 64, 16-byte aligned) with streaming
 * stores where the compiler offers them. */
static void copy_out(char *d, const char *s, size_t n)
{
#ifdef __SSE2__
    for (size_t i = 0; i < n; i += 64)
        for (size_t k = 0; k < 64; k += 16)
            _mm_stream_si128(
                (__m128i *)(void *)(d + i + k),
                _mm_load_si128((const __m128i *)(const void *)(s + i + k)));
    _mm_sfence();
#else
    memcpy(d, s, n);
#endif
}

/* Pack the first halves of the rows from @r on into slot @k; returns
 * how many rows it took. */
static size_t pack_slot(handoff_t *h, size_t r, int k)
{
    size_t per = h->slot / h->piece, n = 0;
    for (; n < per && r + n < h->rows; n++)
        memcpy(h->ring + (size_t)k * h->slot + n * h->piece,
               h->src + 2 * (r + n) * h->piece, h->piece);
    return n;
}

static void pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

static void *handoff_packer(void *arg)
{
    handoff_t *h = arg;
    size_t r = 0;
    pin_to(h->cpu[0]);
    for (size_t k = 0; r < h->rows; k++) {
        int i = (int)(k % HO_SLOTS);
        while (atomic_load_explicit(&h->state[i], memory_order_acquire) != 0)
            ;
        r += pack_slot(h, r, i);
        atomic_store_explicit(&h->state[i], 1, memory_order_release);
    }
    return NULL;
}

static void *handoff_copier(void *arg)
{
    handoff_t *h = arg;
    size_t per = h->slot / h->piece, r = 0;
    pin_to(h->cpu[1]);
    for (size_t k = 0; r < h->rows; k++) {
        int i = (int)(k % HO_SLOTS);
        size_t n = h->rows - r < per ? h->rows - r : per;
        while (atomic_load_explicit(&h->state[i], memory_order_acquire) != 1)
            ;
        copy_out(h->dst + r * h->piece, h->ring + (size_t)i * h->slot,
                 n * h->piece);
        atomic_store_explicit(&h->state[i], 0, memory_order_release);
        r += n;
    }
    return NULL;
}

/* The first two CPUs this process may run on; -1 without two. */
static int two_cpus(int cpu[2])
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return -1;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &set))
            cpu[n++] = c;
    return n == 2 ? 0 : -1;
}

size_t matched_size(const char *s)
{
    return size_arg(s);
}

char *matched_touched(size_t n)
{
    return touched(n);
}

int matched_tcp_pair(int *a, int *b)
{
    return pair(a, b, 1);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "tcp-matched") == 0) {
        int rc = matched_tcp(argc, argv);
        if (rc >= 0)
            return rc;
    }
    if (argc > 1 && strcmp(argv[1], "copy-matched") == 0) {
        int rc = matched_copy(argc, argv);
        if (rc >= 0)
            return rc;
    }
    if (argc == 4 && strcmp(argv[1], "tcp-stream") == 0) {
        double secs = atof(argv[2]), t0, t;
        size_t blk = size_arg(argv[3]), sent = 0, off = 0;
        int a, b;
        char *src;
        if (pair(&a, &b, 1))
            return 2;
        if (fork() == 0) {
            char *sink = touched(AREA);
            size_t pos = 0;
            ssize_t n;
            close(a);
            while ((n = recv(b, sink + pos, 1 << 20, 0)) > 0)
                pos = (pos + (size_t)n) % (AREA - (1 << 20));
            _exit(0);
        }
        close(b);
        src = touched(AREA);
        t0 = now();
        while ((t = now()) - t0 < secs) {
            for (size_t done = 0; done < blk;) {
                ssize_t n = send(a, src + off + done, blk - done, 0);
                if (n <= 0)
                    return 2;
                done += (size_t)n;
            }
            sent += blk;
            off = (off + blk) % (AREA - blk);
        }
        close(a);
        wait(NULL);
        printf("%.3f\n", (double)sent / (t - t0) / 1e9);
        return 0;
    }
    if ((argc >= 3 && argc <= 5 && strcmp(argv[1], "tcp-pingpong") == 0) ||
        (argc == 5 && strcmp(argv[1], "tcp-floor") == 0)) {
        int n = atoi(argv[2]), a, b, cpu[2] = {-1, -1}, status = 0;
        int acked = strcmp(argv[1], "tcp-floor") == 0;
        size_t sz = argc > 3 ? size_arg(argv[3]) : 64, ack = acked ? 32 : sz;
        const char *pin = argc > 4 ? argv[4] : "none";
        double *lat = malloc((size_t)n * sizeof(double));
        char *m = calloc(1, sz > ack ? sz : ack);
        pid_t child;
        if (n < 1 || sz == 0 || lat == NULL || m == NULL || pair(&a, &b, 0))
            return 2;
        /* Where the two ends run: one CPU for both, or one each. */
        if (strcmp(pin, "none") != 0) {
            if (two_cpus(cpu) != 0) {
                fprintf(stderr, "%s: fewer than two CPUs\n", argv[1]);
                return 2;
            }
            if (strcmp(pin, "same") == 0)
                cpu[1] = cpu[0];
            else if (strcmp(pin, "split") != 0)
                return 2;
        }
        child = fork();
        if (child < 0)
            return 2;
        if (child == 0) {
            close(a);
            if (cpu[1] >= 0)
                pin_to(cpu[1]);
            if (acked) {
                /* As kvt's target: woken by epoll_wait(), the message
                 * read without blocking, a 32-byte answer. */
                pthread_t t;
                int ep = epoll_create1(0);
                struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
                if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) != 0 ||
                    pthread_create(&t, NULL, idle_thread, NULL) != 0)
                    _exit(2);
                for (;;) {
                    size_t got = 0;
                    int k = epoll_wait(ep, &ev, 1, -1);
                    if (k < 0 && errno == EINTR)
                        continue;
                    if (k != 1)
                        _exit(2);
                    while (got < sz) {
                        ssize_t r = recv(b, m + got, sz - got, MSG_DONTWAIT);
                        if (r == 0)
                            _exit(0);
                        if (r < 0 && errno == EINTR)
                            continue;
                        if (r < 0 && errno == EAGAIN && got == 0)
                            break; /* nothing yet: wait again */
                        if (r < 0 && errno == EAGAIN) {
                            struct pollfd p = {b, POLLIN, 0};
                            poll(&p, 1, -1); /* the rest of a message */
                            continue;
                        }
                        if (r < 0)
                            _exit(2);
                        got += (size_t)r;
                    }
                    if (got == sz && send(b, m, ack, 0) != (ssize_t)ack)
                        _exit(2);
                }
            }
            while (recv(b, m, sz, MSG_WAITALL) == (ssize_t)sz)
                send(b, m, sz, 0);
            _exit(0);
        }
        close(b);
        if (cpu[0] >= 0)
            pin_to(cpu[0]);
        if (acked) {
            pthread_t t;
            if (pthread_create(&t, NULL, idle_thread, NULL) != 0)
                return 2;
        }
        for (int i = 0; i < n; i++) {
            double t = now();
            if (send(a, m, sz, MSG_NOSIGNAL) != (ssize_t)sz ||
                recv(a, m, ack, MSG_WAITALL) != (ssize_t)ack) {
                fprintf(stderr, "%s: round trip %d failed\n", argv[1], i);
                return 2;
            }
            lat[i] = (now() - t) * 1e6;
        }
        close(a);
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%s: the responder failed\n", argv[1]);
            return 2;
        }
        qsort(lat, (size_t)n, sizeof(double), cmp);
        printf("%.2f\n", lat[n / 2]);
        return 0;
    }
    if (argc == 4 &&
        (strcmp(argv[1], "memcpy") == 0 || strcmp(argv[1], "cma") == 0)) {
        size_t total = size_arg(argv[2]) << 20, blk = size_arg(argv[3]);
        size_t len = 512ul << 20, off = 0, done = 0;
        char *src = touched(len);
        double t0;
        if (strcmp(argv[1], "memcpy") == 0) {
            char *dst = touched(len);
            t0 = now();
            for (; done < total; done += blk, off = (off + blk) % (len - blk))
                memcpy(dst + off, src + off, blk);
            printf("%.3f\n", (double)total / (now() - t0) / 1e9);
            return 0;
        }
        pid_t pid;
        void *dst = child_area(len, &pid);
        if (dst == NULL)
            return 2;
        t0 = now();
        for (; done < total; done += blk, off = (off + blk) % (len - blk)) {
            struct iovec l = {src + off, blk}, r = {(char *)dst + off, blk};
            if (process_vm_writev(pid, &l, 1, &r, 1, 0) != (ssize_t)blk) {
                perror("process_vm_writev");
                return child_end(pid, 0);
            }
        }
        printf("%.3f\n", (double)total / (now() - t0) / 1e9);
        return child_end(pid, 1);
    }
    if (argc == 5 && strcmp(argv[1], "cma-pieces") == 0) {
        size_t total = size_arg(argv[2]) << 20, piece = size_arg(argv[3]);
        size_t len = 256ul << 20, span = 2048 * piece, done = 0;
        int rs = strcmp(argv[4], "remote") == 0;
        int ls = strcmp(argv[4], "local") == 0;
        char *src = touched(len);
        struct iovec l[1024], r[1024];
        int nl, nr;
        pid_t pid;
        char *dst;
        double t0;
        if (piece == 0 || span > len || (dst = child_area(len, &pid)) == NULL)
            return 2;
        t0 = now();
        for (size_t w = 0; done < total; w = (w + 1) % (len / span)) {
            size_t base = w * span;
            nl = nr = 0;
            for (size_t i = 0; i < 1024; i++) {
                char *a = src + base + i * (ls ? 2 : 1) * piece;
                char *b = dst + base + i * (rs ? 2 : 1) * piece;
                if (!ls && nl)
                    l[0].iov_len += piece;
                else
                    l[nl++] = (struct iovec){a, piece};
                if (!rs && nr)
                    r[0].iov_len += piece;
                else
                    r[nr++] = (struct iovec){b, piece};
            }
            if (process_vm_writev(pid, l, (unsigned long)nl, r,
                                  (unsigned long)nr,
                                  0) != (ssize_t)(1024 * piece)) {
                perror("process_vm_writev");
                return child_end(pid, 0);
            }
            done += 1024 * piece;
        }
        printf("%.3f\n", (double)total / (now() - t0) / 1e9);
        return child_end(pid, 1);
    }
    if (argc == 5 && strcmp(argv[1], "memcpy-pieces") == 0) {
        size_t total = size_arg(argv[2]) << 20, piece = size_arg(argv[3]);
        size_t stride = size_arg(argv[4]), len = 512ul << 20;
        char *src, *dst;
        double best = 0;
        if (piece == 0 || stride < piece || stride > len / 2)
            return 2;
        src = touched(len);
        dst = touched(len / 2);
        for (int pass = 0; pass < 3; pass++) {
            size_t so = 0, dof = 0;
            double t0 = now(), g;
            for (size_t done = 0; done < total; done += piece) {
                memcpy(dst + dof, src + so, piece);
                so += stride;
                if (so + stride > len)
                    so = 0;
                dof += piece;
                if (dof + piece > len / 2)
                    dof = 0;
            }
            g = (double)total / (now() - t0) / 1e9;
            if (g > best)
                best = g;
        }
        printf("%.3f\n", best);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "memcpy-rows") == 0) {
        size_t total = size_arg(argv[2]) << 20, piece = size_arg(argv[3]);
        size_t len = 512ul << 20, rows;
        char *src, *dst[2];
        double best[2] = {0, 0};
        if (piece == 0 || total > len || total < 2 * piece)
            return 2;
        rows = total / (2 * piece);
        src = touched(len);
        dst[0] = touched(len / 2);
        dst[1] = touched(len / 2);
        for (int pass = 0; pass < 6; pass++) {
            int whole = pass & 1;
            double t0 = now(), g;
            if (whole) {
                for (size_t r = 0; r < rows; r++)
                    for (int h = 0; h < 2; h++)
                        memcpy(dst[h] + r * piece, src + (2 * r + h) * piece,
                               piece);
            } else {
                for (int h = 0; h < 2; h++)
                    for (size_t r = 0; r < rows; r++)
                        memcpy(dst[h] + r * piece, src + (2 * r + h) * piece,
                               piece);
            }
            g = (double)(2 * rows * piece) / (now() - t0) / 1e9;
            if (g > best[whole])
                best[whole] = g;
        }
        printf("%.3f %.3f\n", best[0], best[1]);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "handoff") == 0) {
        size_t total = size_arg(argv[2]) << 20;
        handoff_t h = {.piece = size_arg(argv[3]), .slot = size_arg(argv[4])};
        double best[2] = {0, 0};
        if (h.piece == 0 || h.piece % 64 != 0 || h.slot < h.piece ||
            h.slot % h.piece != 0 || total > (512ul << 20) ||
            total < 2 * h.piece || two_cpus(h.cpu) != 0)
            return 2;
        h.rows = total / (2 * h.piece);
        h.src = touched(total);
        h.ring = touched(HO_SLOTS * h.slot);
        h.dst = touched(h.rows * h.piece);
        for (int pass = 0; pass < 6; pass++) {
            int two = pass & 1;
            double t0 = now(), g;
            if (two) {
                pthread_t a, b;
                for (int i = 0; i < HO_SLOTS; i++)
                    atomic_store(&h.state[i], 0);
                if (pthread_create(&a, NULL, handoff_packer, &h) != 0 ||
                    pthread_create(&b, NULL, handoff_copier, &h) != 0)
                    return 2;
                pthread_join(a, NULL);
                pthread_join(b, NULL);
            } else {
                pin_to(h.cpu[0]);
                for (size_t r = 0, k = 0; r < h.rows; k++) {
                    int i = (int)(k % HO_SLOTS);
                    size_t n = pack_slot(&h, r, i);
                    copy_out(h.dst + r * h.piece, h.ring + (size_t)i * h.slot,
                             n * h.piece);
                    r += n;
                }
            }
            g = (double)(h.rows * h.piece) / (now() - t0) / 1e9;
            if (g > best[two])
                best[two] = g;
            /* Every piece arrived, in order. */
            for (size_t r = 0; r < h.rows; r += 997)
                if (memcmp(h.dst + r * h.piece, h.src + 2 * r * h.piece,
                           h.piece) != 0)
                    return 3;
        }
        printf("%.3f %.3f\n", best[0], best[1]);
        return 0;
    }
    fprintf(stderr, "usage: see the comment at the top of bench/baseline.c\n");
    return 2;
}
