/* SPDX-License-Identifier: Apache-2.0 */
#include "peer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "devmem.h"
#include "kvt_test.h"

/* The pattern is built from 64-bit words (pattern_byte() is byte k of word
 * i / 8), so whole aligned words are filled and checked at once. */
static inline uint64_t pattern_word(uint64_t seed, uint64_t i)
{
    uint64_t x =
        (i >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 31);
}

void pattern_fill(void *buf, uint64_t len, uint64_t seed, uint64_t off)
{
    uint8_t *p = buf;
    uint64_t i = 0;
    for (; i < len && ((off + i) & 7) != 0; i++)
        p[i] = pattern_byte(seed, off + i);
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word(seed, off + i);
        memcpy(p + i, &w, 8);
    }
    for (; i < len; i++)
        p[i] = pattern_byte(seed, off + i);
}

uint64_t pattern_check(const void *buf, uint64_t len, uint64_t seed,
                       uint64_t off)
{
    const uint8_t *p = buf;
    uint64_t bad = 0, i = 0;
    for (; i < len && ((off + i) & 7) != 0; i++)
        bad += p[i] != pattern_byte(seed, off + i);
    for (; i + 8 <= len; i += 8) {
        uint64_t w, want = pattern_word(seed, off + i);
        memcpy(&w, p + i, 8);
        if (w != want)
            for (int k = 0; k < 8; k++)
                bad += ((w ^ want) >> (8 * k) & 0xff) != 0;
    }
    for (; i < len; i++)
        bad += p[i] != pattern_byte(seed, off + i);
    return bad;
}

const char *seg_transport(kvt_engine_h e, kvt_segment_t seg)
{
    const char *name = NULL;

    if (kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_HOST, &name) !=
        KVT_OK)
        return "(none)";
    return name;
}

int seg_offers(kvt_engine_h e, kvt_segment_t seg, uint32_t transport)
{
    kvt_segment_info_t info;

    if (kvt_segment_info(e, seg, &info) != KVT_OK)
        return 0;
    return (info.offered & transport) != 0;
}

kvt_engine_h engine_new(uint32_t transports, uint64_t timeout_ms)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;

    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    p.transports = transports;
    if (timeout_ms) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSFER_TIMEOUT;
        p.transfer_timeout_ms = timeout_ms;
    }
    if (kvt_engine_create(&p, &e) != KVT_OK)
        return NULL;
    return e;
}

int (*peer_cmd_hook)(kvt_engine_h e, const char *line, char *out, size_t cap);

static void reply(FILE *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    fflush(out);
}

/* Register @n regions of @len bytes back to back; *base_p: the first. */
static int regmany(kvt_engine_h e, int managed, uint64_t n, uint64_t len,
                   unsigned long long *base_p)
{
    kvt_mem_region_t *r = calloc(n, sizeof(*r));
    uint8_t *base;
    int st;

    *base_p = 0;
    if (r == NULL)
        return KVT_ERR_NO_MEMORY;
    if (managed) {
        void *m;
        st = kvt_mem_alloc(e, n * len, KVT_ACCESS_REMOTE_RW, &m);
        if (st == KVT_OK)
            st = kvt_mem_unregister(e, m); /* registered again in pieces */
        base = st == KVT_OK ? m : NULL;
    } else {
        base = mmap(NULL, n * len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        st = base == MAP_FAILED ? KVT_ERR_NO_MEMORY : KVT_OK;
    }
    if (st == KVT_OK) {
        for (uint64_t i = 0; i < n; i++)
            r[i] = (kvt_mem_region_t){base + i * len, len, KVT_ACCESS_REMOTE_RW,
                                      KVT_MEM_HOST,   -1,  0};
        st = kvt_mem_register_batch(e, r, n);
        *base_p = (unsigned long long)(uintptr_t)base;
    }
    free(r);
    return st;
}

/*
 * cuda: the main region is device memory, and commands reach it through a
 * host mirror: dev_in() brings [a, a+b) of it into the mirror and returns
 * where it lies there (dev_at() without bringing it, for a command that
 * overwrites all of it), dev_out() writes it back. Other addresses pass
 * through.
 */
static uint8_t *g_main, *g_mirror;

static void *dev_at(uint64_t a, uint64_t b, int bring)
{
    uint64_t m = (uint64_t)(uintptr_t)g_main;

    if (g_mirror == NULL || a < m || a - m >= PEER_MAIN_LEN)
        return (void *)(uintptr_t)a;
    if (b > PEER_MAIN_LEN - (a - m) ||
        (bring &&
         devmem_copy(g_mirror + (a - m), (void *)(uintptr_t)a, b) != 0))
        _exit(4);
    return g_mirror + (a - m);
}

static void *dev_in(uint64_t a, uint64_t b)
{
    return dev_at(a, b, 1);
}

static void dev_out(uint64_t a, uint64_t b)
{
    uint64_t m = (uint64_t)(uintptr_t)g_main;

    if (g_mirror == NULL || a < m || a - m >= PEER_MAIN_LEN)
        return;
    if (devmem_copy((void *)(uintptr_t)a, g_mirror + (a - m), b) != 0)
        _exit(4);
}

/* leader_exits: the first thread waits on this pipe, then exits. */
static int leave_fd[2] = {-1, -1};

/* The child: serve commands until "exit" or EOF. */
static void peer_main(int in_fd, int out_fd, const peer_opts_t *o)
{
    FILE *in = fdopen(in_fd, "r"), *out = fdopen(out_fd, "w");
    size_t total = PEER_MAIN_LEN + 3 * PEER_SMALL_LEN;
    kvt_engine_h e = engine_new(o->transports, o->timeout_ms);
    uint8_t *base, *main_, *guard, *ro, *wo;
    char line[256];

    if (e == NULL || in == NULL || out == NULL)
        _exit(3);
    if (o->cuda) {
        main_ = devmem_alloc(PEER_MAIN_LEN, 0);
        g_mirror = mmap(NULL, PEER_MAIN_LEN, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (main_ == NULL || g_mirror == MAP_FAILED)
            _exit(3);
        g_main = main_;
        base = mmap(NULL, total - PEER_MAIN_LEN, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        guard = base;
        if (kvt_mem_register(e, main_, PEER_MAIN_LEN, KVT_ACCESS_REMOTE_RW) !=
            KVT_OK)
            _exit(3);
    } else if (o->managed) {
        void *m;
        if (kvt_mem_alloc(e, PEER_MAIN_LEN, KVT_ACCESS_REMOTE_RW, &m) != KVT_OK)
            _exit(3);
        main_ = m;
        base = mmap(NULL, total - PEER_MAIN_LEN, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        guard = base;
    } else {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        main_ = base;
        guard = base + PEER_MAIN_LEN;
        if (kvt_mem_register(e, main_, PEER_MAIN_LEN, KVT_ACCESS_REMOTE_RW) !=
            KVT_OK)
            _exit(3);
    }
    if (base == MAP_FAILED)
        _exit(3);
    ro = guard + PEER_SMALL_LEN;
    wo = ro + PEER_SMALL_LEN;
    memset(guard, 0xAB, PEER_SMALL_LEN);
    if (kvt_mem_register(e, ro, PEER_SMALL_LEN, KVT_ACCESS_REMOTE_READ) ||
        kvt_mem_register(e, wo, PEER_SMALL_LEN, KVT_ACCESS_REMOTE_WRITE))
        _exit(3);
    reply(out, "%s %llu %llu %llu %llu", kvt_engine_segment_name(e),
          (unsigned long long)(uintptr_t)main_,
          (unsigned long long)(uintptr_t)ro, (unsigned long long)(uintptr_t)wo,
          (unsigned long long)(uintptr_t)guard);

    while (fgets(line, sizeof(line), in) != NULL) {
        unsigned long long a, b, c;
        long long ms;
        size_t none;
        /* The initiator saw its writes acknowledged before it sent this
         * command; receiving (nothing) from the notification queue orders
         * this thread after every landed write, as the API promises. */
        kvt_notify_recv(e, NULL, 0, &none, 0);
        if (sscanf(line, "check %llu %llu %llu", &a, &b, &c) == 3) {
            /* a: address, b: length, c: seed (pattern offset = a - main) */
            reply(out, "%llu",
                  (unsigned long long)pattern_check(
                      dev_in(a, b), b, c, a - (uint64_t)(uintptr_t)main_));
        } else if (sscanf(line, "fill %llu %llu %llu", &a, &b, &c) == 3) {
            pattern_fill(dev_in(a, b), b, c, a - (uint64_t)(uintptr_t)main_);
            dev_out(a, b);
            reply(out, "ok");
        } else if (sscanf(line, "unregfill %llu %llu %llu", &a, &b, &c) == 3) {
            /* Unregister the region at a, then overwrite [a, a+b) with
             * byte c: a remote write landing after this is visible. */
            int st = kvt_mem_unregister(e, (void *)(uintptr_t)a);
            memset(dev_at(a, b, 0), (int)c, b); /* all of it: not read */
            dev_out(a, b);
            reply(out, "%d", st);
        } else if (sscanf(line, "count %llu %llu %llu", &a, &b, &c) == 3) {
            /* Bytes of [a, a+b) that are not c. */
            const uint8_t *q = dev_in(a, b);
            unsigned long long n = 0;
            for (uint64_t i = 0; i < b; i++)
                n += q[i] != (uint8_t)c;
            reply(out, "%llu", n);
        } else if (sscanf(line, "byte %llu", &a) == 1) {
            reply(out, "%u", *(uint8_t *)dev_in(a, 1));
        } else if (sscanf(line, "unreg %llu", &a) == 1) {
            reply(out, "%d", kvt_mem_unregister(e, (void *)(uintptr_t)a));
        } else if (sscanf(line, "regmany %llu %llu", &a, &b) == 2) {
            /* a regions of b bytes each, back to back in one buffer
             * (kvt_mem_alloc() memory when managed): "status base". */
            /* Apart from the reply's arguments: their order of
             * evaluation is unspecified (gcc reads c first). */
            int rst = regmany(e, o->managed, a, b, &c);
            reply(out, "%d %llu", rst, c);
        } else if (sscanf(line, "reg %llu %llu", &a, &b) == 2) {
            reply(out, "%d",
                  kvt_mem_register(e, (void *)(uintptr_t)a, b,
                                   KVT_ACCESS_REMOTE_RW));
        } else if (sscanf(line, "notify %lld %llu %llu %llu", &ms, &a, &b,
                          &c) == 4) {
            /* Wait for one notification; then verify [a, a+b) against
             * seed c, proving the writes before it had landed. */
            kvt_notify_t *n = malloc(sizeof(*n));
            size_t got = 0;
            kvt_notify_recv(e, n, 1, &got, ms);
            if (got == 0)
                reply(out, "none");
            else
                reply(
                    out, "%.*s %llu", (int)n->length, n->data,
                    (unsigned long long)(b ? pattern_check(
                                                 dev_in(a, b), b, c,
                                                 a - (uint64_t)(uintptr_t)main_)
                                           : 0));
            free(n);
        } else if (strncmp(line, "refused", 7) == 0) {
            /* Peers this engine refused (handshakes_refused). */
            kvt_engine_stats_t st = {.version = KVT_STATS_VERSION};
            if (kvt_engine_stats(e, &st) != KVT_OK)
                reply(out, "?");
            else
                reply(out, "%llu", (unsigned long long)st.handshakes_refused);
        } else if (strncmp(line, "served ", 7) == 0) {
            /* What peers moved through transport NAME into and out of
             * this engine's memory: writes reads write_bytes read_bytes. */
            kvt_engine_stats_t *st = calloc(1, sizeof(*st));
            const kvt_served_stats_t *v = NULL;
            char name[16];
            st->version = KVT_STATS_VERSION;
            snprintf(name, sizeof(name), "%.15s", line + 7);
            name[strcspn(name, "\n")] = '\0';
            if (kvt_engine_stats(e, st) == KVT_OK)
                for (uint32_t i = 0; i < st->ntransports; i++)
                    if (strcmp(st->transports[i].name, name) == 0)
                        v = &st->served[i];
            if (v == NULL)
                reply(out, "?");
            else
                reply(out, "%llu %llu %llu %llu", (unsigned long long)v->writes,
                      (unsigned long long)v->reads,
                      (unsigned long long)v->write_bytes,
                      (unsigned long long)v->read_bytes);
            free(st);
        } else if (strncmp(line, "leave", 5) == 0) {
            /* leader_exits: the first thread exits (its reply in its
             * state, read by the initiator from /proc). */
            char one = 1;
            reply(out, "%d",
                  leave_fd[1] >= 0 && write(leave_fd[1], &one, 1) == 1 ? 0
                                                                       : -1);
        } else if (strncmp(line, "exit", 4) == 0) {
            break;
        } else {
            char own[256];
            if (peer_cmd_hook != NULL &&
                peer_cmd_hook(e, line, own, sizeof(own)))
                reply(out, "%s", own);
            else
                reply(out, "?");
        }
    }
    kvt_engine_destroy(e);
    _exit(0);
}

/* A peer in an exec'd image (cuda peers, peer_start()): serve, exit. */
__attribute__((constructor)) static void peer_exec_main(void)
{
    const char *v = getenv("KVT_TEST_PEER_EXEC");
    static peer_opts_t o;
    unsigned long long timeout;
    int in, out;

    if (v == NULL)
        return;
    if (sscanf(v, "%d %d %u %llu %d", &in, &out, &o.transports, &timeout,
               &o.managed) != 5)
        _exit(3);
    unsetenv("KVT_TEST_PEER_EXEC");
    o.timeout_ms = timeout;
    o.cuda = 1;
    peer_main(in, out, &o);
}

typedef struct {
    int in_fd, out_fd;
    const peer_opts_t *o;
} peer_args_t;

static void *peer_thread(void *arg)
{
    peer_args_t *a = arg;
    peer_main(a->in_fd, a->out_fd, a->o);
    return NULL;
}

int peer_start(peer_t *p, const peer_opts_t *o)
{
    int to[2], from[2];
    char line[512];
    ssize_t n;
    size_t have = 0;

    memset(p, 0, sizeof(*p));
    if (pipe(to) || pipe(from))
        return -1;
    p->pid = fork();
    if (p->pid == 0) {
        close(to[1]);
        close(from[0]);
        if (o->leader_exits) {
            static peer_args_t args;
            pthread_t t;
            char c;
            args = (peer_args_t){to[0], from[1], o};
            if (pipe(leave_fd) != 0 ||
                pthread_create(&t, NULL, peer_thread, &args) != 0)
                _exit(3);
            if (read(leave_fd[0], &c, 1) != 1)
                _exit(3);
            pthread_exit(NULL); /* peer_main() ends the process */
        }
        if (o->cuda) {
            /* A fresh process: a real CUDA driver cannot be used in a
             * child forked after the parent initialised it. The
             * constructor below takes over in the new image. */
            char env[128];
            snprintf(env, sizeof(env), "%d %d %u %llu %d", to[0], from[1],
                     o->transports, (unsigned long long)o->timeout_ms,
                     o->managed);
            setenv("KVT_TEST_PEER_EXEC", env, 1);
            execl("/proc/self/exe", "kvt-test-peer", (char *)NULL);
            _exit(3);
        }
        peer_main(to[0], from[1], o);
    }
    close(to[0]);
    close(from[1]);
    p->to_fd = to[1];
    p->from_fd = from[0];
    while (have < sizeof(line) - 1) {
        n = read(p->from_fd, line + have, 1);
        if (n <= 0)
            return -1;
        if (line[have] == '\n')
            break;
        have++;
    }
    line[have] = '\0';
    {
        unsigned long long a, b, c, d;
        if (sscanf(line, "%127s %llu %llu %llu %llu", p->segment, &a, &b, &c,
                   &d) != 5)
            return -1;
        p->main_addr = a;
        p->ro_addr = b;
        p->wo_addr = c;
        p->guard_addr = d;
    }
    return 0;
}

const char *peer_cmd(peer_t *p, const char *fmt, ...)
{
    static char line[512];
    char cmd[256];
    size_t have = 0;
    va_list ap;
    int len;

    va_start(ap, fmt);
    len = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    cmd[len++] = '\n';
    if (write(p->to_fd, cmd, (size_t)len) != len)
        return NULL;
    while (have < sizeof(line) - 1) {
        ssize_t n = read(p->from_fd, line + have, 1);
        if (n <= 0)
            return NULL;
        if (line[have] == '\n')
            break;
        have++;
    }
    line[have] = '\0';
    return line;
}

void peer_start_token(peer_t *p, uint32_t transports, const char *token)
{
    peer_opts_t o = {transports, 0, 0, 0, 0};

    /* The variable docs/security.md names (KVT_AUTH_ENV inside). */
    if (token != NULL)
        CHECK(setenv("KVT_AUTH_TOKEN", token, 1) == 0);
    else
        CHECK(unsetenv("KVT_AUTH_TOKEN") == 0);
    CHECK(peer_start(p, &o) == 0);
    CHECK(unsetenv("KVT_AUTH_TOKEN") == 0);
}

void peer_stop(peer_t *p)
{
    if (p->pid <= 0)
        return;
    if (write(p->to_fd, "exit\n", 5) != 5)
        kill(p->pid, SIGKILL);
    close(p->to_fd);
    close(p->from_fd);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void peer_kill(peer_t *p, int sig)
{
    kill(p->pid, sig);
    if (sig == SIGSTOP) {
        /* kill() returns before the stop takes effect; a transfer begun
         * meanwhile could still be answered. Return once it is stopped. */
        int st;
        waitpid(p->pid, &st, WUNTRACED);
    }
    if (sig == SIGKILL) {
        waitpid(p->pid, NULL, 0);
        close(p->to_fd);
        close(p->from_fd);
        p->pid = 0;
    }
}
