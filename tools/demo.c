/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt demo: a disaggregated prefill/decode run on this machine.
 *
 * The demo process starts a bootstrap server (`kvt metad`, as a child) and
 * one process per prefill rank and per decode rank, all on 127.0.0.1. Every
 * rank derives the same request list from the seed (room ids, prompt
 * lengths), so they need no side channel. For each batch of requests,
 * decode ranks open receivers and announce randomly chosen, non-contiguous
 * blocks; prefill ranks wait for the announcements, then run a simulated
 * forward pass: layer by layer they write the layer's KV (a deterministic
 * function of request, layer, cache, token, head and byte), wait out the
 * layer's compute time, and mark it ready, so that the connector streams
 * it while the next layer "computes". Decode checks every byte of every
 * block it received. Ranks report timestamps and counts to the demo
 * process over a pipe, which prints progress and the summary.
 *
 * Timestamps are CLOCK_MONOTONIC, which is the same clock in every process
 * of the machine, so the transfer tail (from "last layer ready" on prefill
 * to SUCCESS on decode) is measured across processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvt/connector.h>
#include <kvt/kvt.h>

#include "cli.h"
#include "demo.h"

/* ---- Models ---------------------------------------------------------------
 */

static const model_t models[] = {
    {"llama3-8b", "Llama-3-8B-like: 32 layers, 8 KV heads x 128, bf16", 32, 0,
     8, 256, 0, 16, 218e6, 4096},
    {"llama3-8b-eagle",
     "Llama-3-8B-like with a 1-layer draft model (speculative decoding)", 32, 1,
     8, 256, 0, 16, 218e6, 4096},
    {"deepseek-v3",
     "DeepSeek-V3-like MLA: 61 layers, latent 512 + 64 rope, "
     "bf16",
     61, 0, 0, 0, (512 + 64) * 2, 16, 37e9 / 61, 7168},
};

/* The speed the FLOPs model assumes for one prefill instance. */
#define DEFAULT_TFLOPS 100.0

double demo_layer_compute_ms(const opts_t *o, uint32_t tokens)
{
    double flops;
    if (o->compute_ms >= 0)
        return o->compute_ms;
    flops = 2.0 * o->m->params_per_layer * tokens +
            2.0 * (double)tokens * tokens * o->m->attn_width;
    return flops / (o->tflops * 1e12) * 1e3;
}

/* ---- The request list, the same in every process ------------------------ */

req_t demo_request(const opts_t *o, uint32_t i)
{
    req_t r;
    uint64_t x = mix64(o->seed * 1000003 + i);
    r.room = mix64(x ^ 0xabcdef) | 1;
    r.tokens = o->min_len + (uint32_t)(x % (o->max_len - o->min_len + 1));
    r.blocks = (r.tokens + o->m->tokens_per_block - 1) / o->m->tokens_per_block;
    return r;
}

/* ---- The demo process ------------------------------------------------------
 */

typedef struct {
    pid_t pid;
    int side;
    uint32_t rank;
    int to_fd; /* its stdin: closed to let it exit */
    int done, exited;
} child_t;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int port_open(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static pid_t spawn_metad(uint16_t port)
{
    char ps[16];
    pid_t pid;
    snprintf(ps, sizeof(ps), "%u", port);
    pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execl("/proc/self/exe", "kvt", "metad", "--host", "127.0.0.1", "--port",
              ps, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double pct_ms(uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    return (double)v[(size_t)((double)(n - 1) * p + 0.5)] / 1e6;
}

typedef struct {
    uint64_t room;
    uint64_t t_last_ready, t_first_ready; /* max/min over prefill ranks */
    uint64_t t_success;                   /* max over decode ranks */
    uint32_t prefill_seen, decode_seen, failed;
    uint64_t bytes, verified;
    int calib;
    char why[160];
} room_stat_t;

static room_stat_t *find_room(room_stat_t *rs, uint32_t n, uint64_t room)
{
    for (uint32_t i = 0; i < n; i++)
        if (rs[i].room == room)
            return &rs[i];
    return NULL;
}

static void usage(void)
{
    printf("usage: kvt demo [options]\n"
           "  --model NAME            ");
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
        printf("%s%s", i ? " | " : "", models[i].name);
    printf(" (default llama3-8b)\n"
           "  --requests N            requests to run (default 16)\n"
           "  --prompt-len MIN:MAX    prompt tokens (default 256:1024)\n"
           "  --prefill-tp N          prefill tensor-parallel ranks (1)\n"
           "  --decode-tp N           decode tensor-parallel ranks (1)\n"
           "  --protocol P            tcp | shm | auto (default auto)\n"
           "  --memory M              host | cuda: KV caches and aux buffers "
           "in GPU memory\n"
           "                          (needs a GPU; default host)\n"
           "  --metadata URI          bootstrap server http://HOST:PORT "
           "(default: start kvt metad)\n"
           "  --compute-ms-per-layer X  simulated prefill compute per layer "
           "(default: FLOPs model at --tflops)\n"
           "  --tflops T              speed of the FLOPs model (default %.0f)\n"
           "  --layerwise | --no-layerwise  stream layers as computed "
           "(default on)\n"
           "  --submit-interval N     layers per submission (default 1)\n"
           "  --concurrency N         requests per prefill step (default 1)\n"
           "  --seed N                request list and block tables (1)\n"
           "  --json                  last line: one JSON object\n",
           DEFAULT_TFLOPS);
}

/* The options that take a positive count, and the field each sets. */
static const char *count_opt(int argc, char **argv, int *i, opts_t *o,
                             uint32_t **field_p)
{
    const struct {
        const char *name;
        uint32_t *field;
    } t[] = {{"requests", &o->requests},
             {"prefill-tp", &o->prefill_tp},
             {"decode-tp", &o->decode_tp},
             {"concurrency", &o->concurrency},
             {"submit-interval", &o->submit_interval}};
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        const char *v = cli_opt(argc, argv, i, t[k].name);
        if (v != NULL) {
            *field_p = t[k].field;
            return v;
        }
    }
    return NULL;
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->m = &models[0];
    o->requests = 16;
    o->min_len = 256;
    o->max_len = 1024;
    o->prefill_tp = o->decode_tp = o->concurrency = 1;
    o->submit_interval = 1;
    o->seed = 1;
    o->layerwise = 1;
    o->compute_ms = -1;
    o->tflops = DEFAULT_TFLOPS;
    o->protocol = "auto";
    o->calib = 3;
    for (int i = 1; i < argc; i++) {
        const char *v;
        uint32_t *field;
        uint64_t n;
        if (cli_flag(argv[i], "help")) {
            usage();
            exit(0);
        } else if (cli_flag(argv[i], "json")) {
            o->json = 1;
        } else if (cli_flag(argv[i], "layerwise")) {
            o->layerwise = 1;
        } else if (cli_flag(argv[i], "no-layerwise")) {
            o->layerwise = 0;
        } else if ((v = cli_opt(argc, argv, &i, "model"))) {
            size_t k;
            for (k = 0; k < sizeof(models) / sizeof(models[0]); k++)
                if (strcmp(v, models[k].name) == 0)
                    break;
            if (k == sizeof(models) / sizeof(models[0])) {
                fprintf(stderr, "kvt demo: unknown model '%s'; the models:", v);
                for (k = 0; k < sizeof(models) / sizeof(models[0]); k++)
                    fprintf(stderr, " %s", models[k].name);
                fprintf(stderr, "\n");
                return -1;
            }
            o->m = &models[k];
        } else if ((v = cli_opt(argc, argv, &i, "prompt-len"))) {
            unsigned a, b;
            if (sscanf(v, "%u:%u", &a, &b) != 2 || a == 0 || b < a ||
                b > 131072) {
                fprintf(stderr, "kvt demo: --prompt-len MIN:MAX\n");
                return -1;
            }
            o->min_len = a;
            o->max_len = b;
        } else if ((v = cli_opt(argc, argv, &i, "protocol"))) {
            if (strcmp(v, "tcp") && strcmp(v, "shm") && strcmp(v, "auto")) {
                fprintf(stderr, "kvt demo: --protocol tcp|shm|auto\n");
                return -1;
            }
            o->protocol = v;
        } else if ((v = cli_opt(argc, argv, &i, "memory"))) {
            if (strcmp(v, "host") && strcmp(v, "cuda")) {
                fprintf(stderr, "kvt demo: --memory host|cuda\n");
                return -1;
            }
            o->cuda = strcmp(v, "cuda") == 0;
        } else if ((v = cli_opt(argc, argv, &i, "metadata"))) {
            if (strncmp(v, "http://", 7) != 0) {
                fprintf(stderr, "kvt demo: --metadata http://HOST:PORT\n");
                return -1;
            }
            o->metadata = v + 7;
        } else if ((v = cli_opt(argc, argv, &i, "compute-ms-per-layer"))) {
            o->compute_ms = atof(v);
            if (o->compute_ms < 0)
                return -1;
        } else if ((v = cli_opt(argc, argv, &i, "tflops"))) {
            o->tflops = atof(v);
            if (o->tflops <= 0)
                return -1;
        } else if ((v = cli_opt(argc, argv, &i, "seed"))) {
            o->seed = strtoull(v, NULL, 10);
        } else if ((v = count_opt(argc, argv, &i, o, &field)) != NULL) {
            if (cli_parse_size(v, &n) != 0 || n == 0 || n > 100000) {
                fprintf(stderr, "kvt demo: bad count in '%s'\n", argv[i]);
                return -1;
            }
            *field = (uint32_t)n;
        } else {
            fprintf(stderr, "kvt demo: bad option '%s' (see --help)\n",
                    argv[i]);
            return -1;
        }
    }
    if (o->m->kv_heads &&
        (o->m->kv_heads % o->prefill_tp || o->m->kv_heads % o->decode_tp)) {
        fprintf(stderr, "kvt demo: %u KV heads do not split over tp %u/%u\n",
                o->m->kv_heads, o->prefill_tp, o->decode_tp);
        return -1;
    }
    if (o->prefill_tp + o->decode_tp > 16) {
        fprintf(stderr, "kvt demo: at most 16 ranks in all\n");
        return -1;
    }
    return 0;
}

/* @s with JSON's special characters replaced, into @out. */
static const char *json_safe(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++)
        out[n++] =
            (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) ? ' ' : *s;
    out[n] = '\0';
    return out;
}

/*
 * --memory=cuda needs a GPU: asked in a child process, so that this one
 * (which forks the ranks) never initialises the driver, after which a
 * forked child could not use it. 0 when one is there; else -1 with the
 * reason in @why.
 */
static int gpu_present(char *why, size_t cap)
{
    int fd[2], st = 0;
    ssize_t n;
    pid_t pid;

    if (pipe(fd) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        kvt_mem_domain_info_t d[8];
        size_t nd = 0;
        const char *w = "this kvt is built without CUDA (cuda.h not found)";
        int ok = 0;
        close(fd[0]);
        if (kvt_mem_domains(d, 8, &nd) == KVT_OK)
            for (size_t i = 0; i < nd && i < 8; i++)
                if (d[i].kind == KVT_MEM_CUDA) {
                    ok = d[i].available && d[i].devices > 0;
                    w = d[i].detail;
                }
        if (write(fd[1], w, strlen(w)) < 0)
            ok = 0;
        _exit(ok ? 0 : 1);
    }
    close(fd[1]);
    n = pid > 0 ? read(fd[0], why, cap - 1) : -1;
    why[n > 0 ? n : 0] = '\0';
    close(fd[0]);
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int kvt_cmd_demo(int argc, char **argv)
{
    opts_t o;
    int pfd[2], tty = isatty(1), failed_ranks = 0, rc = 0;
    uint32_t nranks, ready = 0, ndone = 0, total;
    child_t ch[17];
    pid_t metad = 0;
    char bootaddr[64];
    room_stat_t *rs;
    uint64_t t_start = 0, t_end = 0, bytes = 0, verified = 0, last_print = 0;
    uint32_t decoded = 0, failed = 0;
    char first_error[256] = "";
    char used[64] = ""; /* transports that carried prefill's writes */
    struct sigaction sa = {0};

    if (parse(argc, argv, &o) != 0)
        return 2;
    if (o.cuda) {
        char why[256];
        if (gpu_present(why, sizeof(why)) != 0) {
            fprintf(stderr,
                    "kvt demo: --memory=cuda needs a GPU and its CUDA driver; "
                    "kvt finds none here: %s\n",
                    why);
            return 1;
        }
    }
    total = o.calib + o.requests;
    nranks = o.prefill_tp + o.decode_tp;
    rs = calloc(total, sizeof(*rs));
    for (uint32_t i = 0; i < total; i++) {
        rs[i].room = demo_request(&o, i).room;
        rs[i].calib = i < o.calib;
    }
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (o.metadata == NULL) {
        uint16_t port = free_port();
        metad = spawn_metad(port);
        for (int i = 0; i < 250 && !port_open(port); i++)
            usleep(20000);
        if (!port_open(port)) {
            fprintf(stderr, "kvt demo: kvt metad did not start\n");
            kill(metad, SIGKILL);
            waitpid(metad, NULL, 0);
            return 1;
        }
        snprintf(bootaddr, sizeof(bootaddr), "127.0.0.1:%u", port);
        o.metadata = bootaddr;
    }
    if (!o.json || tty)
        fprintf(stderr,
                "kvt demo: %s, %u requests of %u..%u tokens, prefill tp %u, "
                "decode tp %u, %s, %s memory, %s, compute %.2f ms/layer at %u "
                "tokens\n",
                o.m->desc, o.requests, o.min_len, o.max_len, o.prefill_tp,
                o.decode_tp, o.protocol, o.cuda ? "GPU" : "host",
                o.layerwise ? "layer-wise" : "whole requests",
                demo_layer_compute_ms(&o, o.max_len), o.max_len);

    if (pipe(pfd) != 0)
        return 1;
    for (uint32_t i = 0; i < nranks; i++) {
        int side = i < o.prefill_tp ? SIDE_PREFILL : SIDE_DECODE;
        uint32_t rank = side == SIDE_PREFILL ? i : i - o.prefill_tp;
        int in[2];
        if (pipe(in) != 0)
            return 1;
        ch[i] = (child_t){.side = side, .rank = rank};
        ch[i].pid = fork();
        if (ch[i].pid == 0) {
            close(pfd[0]);
            close(in[1]);
            dup2(in[0], 0);
            demo_rank_main(&o, side, rank, pfd[1]);
        }
        close(in[0]);
        ch[i].to_fd = in[1];
    }
    close(pfd[1]);

    /* Collect reports until every rank is done, a rank dies, or Ctrl-C. */
    while (ndone < nranks) {
        struct pollfd p = {pfd[0], POLLIN, 0};
        rep_t r;
        int st;
        if (interrupted) {
            snprintf(first_error, sizeof(first_error), "interrupted");
            rc = 130;
            break;
        }
        for (uint32_t i = 0; i < nranks; i++) {
            if (!ch[i].exited &&
                waitpid(ch[i].pid, &st, WNOHANG) == ch[i].pid) {
                ch[i].exited = 1;
                if (!ch[i].done) {
                    snprintf(first_error + strlen(first_error),
                             sizeof(first_error) - strlen(first_error),
                             "%s rank %u died (%s %d); ",
                             ch[i].side ? "decode" : "prefill", ch[i].rank,
                             WIFSIGNALED(st) ? "signal" : "exit",
                             WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                    failed_ranks++;
                }
            }
        }
        if (failed_ranks) {
            rc = 1;
            break;
        }
        if (poll(&p, 1, 200) <= 0)
            goto progress;
        if (read(pfd[0], &r, sizeof(r)) != sizeof(r))
            continue;
        switch (r.type) {
        case REP_READY:
            if (++ready == nranks)
                t_start = now_ns();
            break;
        case REP_ERROR:
            fprintf(stderr, "kvt demo: %s rank %u: %s\n",
                    r.side ? "decode" : "prefill", r.rank, r.text);
            break;
        case REP_DONE:
            /* A prefill rank says which transports carried its writes. */
            for (char *t = r.text, *sv = NULL, *n;
                 r.side == SIDE_PREFILL && (n = strtok_r(t, "+", &sv));
                 t = NULL) {
                char pat[20];
                snprintf(pat, sizeof(pat), "+%s+", n);
                char have[sizeof(used) + 2];
                snprintf(have, sizeof(have), "+%s+", used);
                if (strstr(have, pat) == NULL &&
                    strlen(used) + strlen(n) + 2 < sizeof(used))
                    snprintf(used + strlen(used), sizeof(used) - strlen(used),
                             "%s%s", used[0] ? "+" : "", n);
            }
            for (uint32_t i = 0; i < nranks; i++)
                if (ch[i].side == (int)r.side && ch[i].rank == r.rank)
                    ch[i].done = 1;
            ndone++;
            break;
        case REP_PREFILL:
        case REP_CALIB:
        case REP_DECODE: {
            room_stat_t *s = find_room(rs, total, r.room);
            if (s == NULL)
                break;
            if (r.side == SIDE_PREFILL) {
                s->prefill_seen++;
                if (r.t_last > s->t_last_ready)
                    s->t_last_ready = r.t_last;
                if (s->t_first_ready == 0 || r.t_first < s->t_first_ready)
                    s->t_first_ready = r.t_first;
                if (!r.ok && !s->why[0])
                    snprintf(s->why, sizeof(s->why), "prefill rank %u: %s",
                             r.rank, r.text);
                s->failed |= !r.ok;
            } else {
                s->decode_seen++;
                if (r.t_last > s->t_success)
                    s->t_success = r.t_last;
                s->bytes += r.bytes;
                s->verified += r.verified;
                if ((!r.ok || r.verified != r.bytes) && !s->why[0])
                    snprintf(s->why, sizeof(s->why), "decode rank %u: %s",
                             r.rank, r.text);
                s->failed |= !r.ok || r.verified != r.bytes;
                if (!s->calib && s->decode_seen == o.decode_tp) {
                    decoded++;
                    bytes += s->bytes;
                    verified += s->verified;
                    failed += s->failed != 0;
                    t_end = now_ns();
                }
            }
            break;
        }
        }
    progress:
        if (now_ns() - last_print > (tty ? 100000000ull : 1000000000ull) &&
            t_start && !(o.json && !tty)) {
            double secs = (double)(now_ns() - t_start) / 1e9;
            last_print = now_ns();
            if (tty) {
                int w = 30, fill = (int)(w * decoded / o.requests);
                fprintf(stderr,
                        "\r[%.*s%*s] %u/%u requests, %.2f GB, "
                        "%.2f GB/s  ",
                        fill, "##############################", w - fill, "",
                        decoded, o.requests, (double)bytes / 1e9,
                        secs > 0 ? (double)bytes / 1e9 / secs : 0);
            } else {
                fprintf(stderr,
                        "progress: %u/%u requests, %.2f GB, "
                        "%.2f GB/s\n",
                        decoded, o.requests, (double)bytes / 1e9,
                        secs > 0 ? (double)bytes / 1e9 / secs : 0);
            }
        }
    }
    if (tty && !(o.json && !tty))
        fprintf(stderr, "\n");

    /* Let every rank go, then reap them (and the server). */
    for (uint32_t i = 0; i < nranks; i++)
        close(ch[i].to_fd);
    for (uint32_t i = 0; i < nranks; i++) {
        if (rc != 0 && !ch[i].exited)
            kill(ch[i].pid, SIGKILL);
        if (!ch[i].exited) {
            int st;
            waitpid(ch[i].pid, &st, 0);
            if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
                rc = 1;
                snprintf(first_error, sizeof(first_error),
                         "%s rank %u exited badly at teardown",
                         ch[i].side ? "decode" : "prefill", ch[i].rank);
            }
        }
    }
    if (metad) {
        kill(metad, SIGTERM);
        waitpid(metad, NULL, 0);
    }

    /* Summary. */
    {
        uint64_t *tail = calloc(total, 8), *whole = calloc(total, 8),
                 *layer = calloc(total, 8);
        size_t nt = 0, nw = 0, nl = 0;
        uint32_t nlayers = o.m->layers + o.m->draft_layers;
        double secs = t_end > t_start ? (double)(t_end - t_start) / 1e9 : 0;
        double gbps = secs > 0 ? (double)bytes / 1e9 / secs : 0;
        uint64_t tokens = 0;
        double tail50, tail99, whole50, whole99, layer50;
        char esc[256];

        for (uint32_t i = 0; i < total; i++) {
            room_stat_t *s = &rs[i];
            if (s->decode_seen < o.decode_tp || s->prefill_seen == 0 ||
                s->failed) {
                if (!s->calib && !first_error[0] && s->why[0])
                    snprintf(first_error, sizeof(first_error), "room %llu: %s",
                             (unsigned long long)s->room, s->why);
                continue;
            }
            if (s->calib) {
                layer[nl++] = (s->t_success - s->t_last_ready) / nlayers;
                continue;
            }
            tokens += demo_request(&o, i).tokens;
            tail[nt++] = s->t_success > s->t_last_ready
                             ? s->t_success - s->t_last_ready
                             : 0;
            whole[nw++] = s->t_success - s->t_first_ready;
        }
        if (decoded < o.requests && rc == 0)
            rc = 1;
        if (failed || verified != bytes)
            rc = rc ? rc : 1;
        tail50 = pct_ms(tail, nt, 0.5);
        tail99 = pct_ms(tail, nt, 0.99);
        whole50 = pct_ms(whole, nw, 0.5);
        whole99 = pct_ms(whole, nw, 0.99);
        layer50 = pct_ms(layer, nl, 0.5);
        if (!o.json || tty) {
            fprintf(stderr,
                    "\n  requests       %u done, %u failed (of %u)\n"
                    "  tokens         %llu\n"
                    "  bytes          %llu (%.1f MiB), verified %llu: %s\n"
                    "  throughput     %.3f GB/s over %.2f s\n"
                    "  tail           p50 %.2f ms, p99 %.2f ms (last layer "
                    "ready -> decode SUCCESS)\n"
                    "  whole request  p50 %.2f ms, p99 %.2f ms (%s -> "
                    "SUCCESS)\n"
                    "  one layer      p50 %.3f ms (one layer of one request, "
                    "measured alone)\n"
                    "  protocol       %s (asked: %s)\n",
                    decoded - failed, failed, o.requests,
                    (unsigned long long)tokens, (unsigned long long)bytes,
                    (double)bytes / 1048576.0, (unsigned long long)verified,
                    verified == bytes && bytes > 0 ? "every byte matches"
                                                   : "MISMATCH",
                    gbps, secs, tail50, tail99, whole50, whole99,
                    o.layerwise ? "first layer ready" : "send", layer50,
                    used[0] ? used : "none", o.protocol);
            if (rc != 0)
                fprintf(stderr, "kvt demo: FAILED: %s\n",
                        first_error[0] ? first_error : "see above");
        }
        if (o.json)
            printf("{\"model\":\"%s\",\"requests\":%u,\"failed\":%u,"
                   "\"tokens\":%llu,\"bytes\":%llu,\"verified_bytes\":%llu,"
                   "\"gbps\":%.4f,\"seconds\":%.3f,\"tail_ms_p50\":%.3f,"
                   "\"tail_ms_p99\":%.3f,\"whole_ms_p50\":%.3f,"
                   "\"whole_ms_p99\":%.3f,\"layer_ms_p50\":%.3f,"
                   "\"prefill_tp\":%u,\"decode_tp\":%u,\"layerwise\":%s,"
                   "\"protocol\":\"%s\",\"protocol_requested\":\"%s\","
                   "\"error\":\"%s\"}\n",
                   o.m->name, o.requests, o.requests - (decoded - failed),
                   (unsigned long long)tokens, (unsigned long long)bytes,
                   (unsigned long long)verified, gbps, secs, tail50, tail99,
                   whole50, whole99, layer50, o.prefill_tp, o.decode_tp,
                   o.layerwise ? "true" : "false", used[0] ? used : "none",
                   o.protocol,
                   rc ? json_safe(first_error[0] ? first_error : "failed", esc,
                                  sizeof(esc))
                      : "");
        free(tail);
        free(whole);
        free(layer);
    }
    free(rs);
    return rc;
}
