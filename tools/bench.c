/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt bench: the target serves a registered buffer; the initiator writes or
 * reads blocks of it in batches for a duration and reports throughput and
 * per-batch latency, and which transport carried the transfers.
 *
 * --protocol picks the engine's transports: tcp (TCP only), shm (shm for a
 * peer on this host, TCP for the control path and for peers elsewhere) or
 * auto (every transport built in). The target's buffer is allocated with
 * kvt_mem_alloc() (--buffer=managed, the default: same-host peers map it)
 * or is plain process memory registered with kvt_mem_register()
 * (--buffer=malloc: same-host peers reach it by cross-memory attach).
 * --memory=cuda puts this side's buffer in device memory instead (of
 * --device=N, allocated and registered with kvt_mem_alloc_ex()): the
 * target's or the initiator's, each side choosing its own.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "cli.h"

typedef struct {
    const char *mode, *local, *segment, *protocol, *op, *buffer, *memory;
    uint64_t device;
    uint64_t port, buffer_size, block, batch, threads, workers, conns;
    uint64_t working_set; /* 0: the whole buffer */
    double duration;
    int json;
} bench_opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds (user and system) this process has used, every thread. */
static double cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void usage(void)
{
    printf("usage:\n"
           "  kvt bench --mode=target [--local=HOST] [--port=N] "
           "[--buffer-size=BYTES] [--buffer=managed|malloc]\n"
           "            [--protocol=tcp|shm|ucx|auto]\n"
           "  kvt bench --mode=initiator --segment=HOST:PORT [--op=write|read]"
           " [--block-size=BYTES]\n"
           "            [--batch-size=N] [--threads=N] [--duration=SECONDS] "
           "[--protocol=...] [--json]\n"
           "            [--working-set=BYTES] (per thread: the same blocks "
           "again and again)\n"
           "options for both: [--workers=N] [--conns=N] "
           "[--memory=host|cuda] [--device=N]\n"
           "Sizes take K/M/G suffixes (powers of 1024).\n");
}

static int parse(int argc, char **argv, bench_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->local = "127.0.0.1";
    o->protocol = "auto";
    o->op = "write";
    o->buffer = "managed";
    o->memory = "host";
    o->buffer_size = 1ull << 30;
    o->block = 64 << 10;
    o->batch = 128;
    o->threads = 1;
    o->duration = 5;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv[i], "help")) {
            usage();
            exit(0);
        } else if (cli_flag(argv[i], "json")) {
            o->json = 1;
        } else if ((v = cli_opt(argc, argv, &i, "mode"))) {
            o->mode = v;
        } else if ((v = cli_opt(argc, argv, &i, "local"))) {
            o->local = v;
        } else if ((v = cli_opt(argc, argv, &i, "segment"))) {
            o->segment = v;
        } else if ((v = cli_opt(argc, argv, &i, "protocol"))) {
            o->protocol = v;
        } else if ((v = cli_opt(argc, argv, &i, "op"))) {
            o->op = v;
        } else if ((v = cli_opt(argc, argv, &i, "buffer"))) {
            o->buffer = v;
        } else if ((v = cli_opt(argc, argv, &i, "memory"))) {
            o->memory = v;
        } else if ((v = cli_opt(argc, argv, &i, "device"))) {
            if (cli_parse_size(v, &o->device) || o->device > 1024)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "duration"))) {
            o->duration = atof(v);
        } else if ((v = cli_opt(argc, argv, &i, "port"))) {
            if (cli_parse_size(v, &o->port) || o->port > 65535)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "buffer-size"))) {
            if (cli_parse_size(v, &o->buffer_size))
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "working-set"))) {
            if (cli_parse_size(v, &o->working_set) || o->working_set == 0)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "block-size"))) {
            if (cli_parse_size(v, &o->block) || o->block == 0)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "batch-size"))) {
            if (cli_parse_size(v, &o->batch) || o->batch == 0)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "threads"))) {
            if (cli_parse_size(v, &o->threads) || o->threads == 0 ||
                o->threads > 256)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "workers"))) {
            if (cli_parse_size(v, &o->workers) || o->workers == 0)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "conns"))) {
            if (cli_parse_size(v, &o->conns) || o->conns == 0)
                goto bad;
        } else {
            fprintf(stderr, "kvt bench: unknown option '%s'\n", argv[i]);
            return -1;
        }
        continue;
    bad:
        fprintf(stderr, "kvt bench: bad value in '%s'\n", argv[i]);
        return -1;
    }
    if (o->mode == NULL ||
        (strcmp(o->mode, "target") != 0 && strcmp(o->mode, "initiator") != 0)) {
        fprintf(stderr, "kvt bench: --mode=target or --mode=initiator\n");
        return -1;
    }
    if (strcmp(o->protocol, "tcp") != 0 && strcmp(o->protocol, "shm") != 0 &&
        strcmp(o->protocol, "ucx") != 0 && strcmp(o->protocol, "auto") != 0) {
        fprintf(stderr, "kvt bench: --protocol=tcp, shm, ucx or auto\n");
        return -1;
    }
    if (strcmp(o->buffer, "managed") != 0 && strcmp(o->buffer, "malloc") != 0) {
        fprintf(stderr, "kvt bench: --buffer=managed or --buffer=malloc\n");
        return -1;
    }
    if (strcmp(o->memory, "host") != 0 && strcmp(o->memory, "cuda") != 0) {
        fprintf(stderr, "kvt bench: --memory=host or --memory=cuda\n");
        return -1;
    }
    if (strcmp(o->op, "write") != 0 && strcmp(o->op, "read") != 0) {
        fprintf(stderr, "kvt bench: --op=write or --op=read\n");
        return -1;
    }
    return 0;
}

static kvt_status_t make_engine(const bench_opts_t *o, kvt_engine_h *e)
{
    kvt_engine_params_t p = {0};
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_PORT |
                   KVT_ENGINE_PARAM_TRANSPORTS;
    p.local_host = o->local;
    p.port = (uint16_t)o->port;
    if (strcmp(o->protocol, "tcp") == 0)
        p.transports = KVT_TRANSPORT_TCP;
    else if (strcmp(o->protocol, "shm") == 0)
        p.transports = KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM;
    else if (strcmp(o->protocol, "ucx") == 0)
        p.transports = KVT_TRANSPORT_UCX;
    else
        p.transports = KVT_TRANSPORT_ALL;
    if (o->workers) {
        p.field_mask |= KVT_ENGINE_PARAM_NUM_WORKERS;
        p.num_workers = (unsigned)o->workers;
    }
    if (o->conns) {
        p.field_mask |= KVT_ENGINE_PARAM_CONNS_PER_PEER;
        p.conns_per_peer = (unsigned)o->conns;
    }
    return kvt_engine_create(&p, e);
}

/* Touch every page now so that faults are not measured later. */
static void touch(void *p, size_t len)
{
    for (size_t i = 0; i < len; i += 4096)
        ((volatile char *)p)[i] = (char)(i >> 12);
}

static void *alloc_buffer(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    touch(p, len);
    return p;
}

/* Device memory for this side (--memory=cuda), registered. */
static kvt_status_t alloc_device(const bench_opts_t *o, kvt_engine_h e,
                                 size_t len, void **p)
{
    kvt_mem_params_t mp = {0};

    mp.field_mask = KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    mp.kind = KVT_MEM_CUDA;
    mp.device = (int32_t)o->device;
    return kvt_mem_alloc_ex(e, len, &mp, p);
}

static int is_cuda(const bench_opts_t *o)
{
    return strcmp(o->memory, "cuda") == 0;
}

static int run_target(const bench_opts_t *o)
{
    int managed = strcmp(o->buffer, "managed") == 0;
    kvt_engine_h e;
    kvt_status_t st;
    sigset_t set;
    void *buf = NULL;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* workers inherit the mask */
    st = make_engine(o, &e);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt bench: engine: %s\n", kvt_status_str(st));
        return 1;
    }
    if (is_cuda(o)) {
        managed = 1; /* freed with kvt_mem_free() */
        st = alloc_device(o, e, o->buffer_size, &buf);
    } else if (strcmp(o->buffer, "managed") == 0) {
        st = kvt_mem_alloc(e, o->buffer_size, KVT_ACCESS_REMOTE_RW, &buf);
        if (st == KVT_OK)
            touch(buf, o->buffer_size);
    } else {
        buf = alloc_buffer(o->buffer_size);
        st = buf != NULL ? kvt_mem_register(e, buf, o->buffer_size,
                                            KVT_ACCESS_REMOTE_RW)
                         : KVT_ERR_NO_MEMORY;
    }
    if (st != KVT_OK) {
        fprintf(stderr, "kvt bench: cannot set up a %llu-byte buffer: %s\n",
                (unsigned long long)o->buffer_size, kvt_status_str(st));
        kvt_engine_destroy(e);
        if (managed == 0 && buf != NULL)
            munmap(buf, o->buffer_size);
        return 1;
    }
    printf("segment: %s\n", kvt_engine_segment_name(e));
    printf("buffer: %p %llu bytes (%s), protocol %s\n", buf,
           (unsigned long long)o->buffer_size, is_cuda(o) ? "cuda" : o->buffer,
           o->protocol);
    fflush(stdout);
    sigwait(&set, &sig);
    if (managed) {
        kvt_mem_free(e, buf);
    } else {
        kvt_mem_unregister(e, buf);
        munmap(buf, o->buffer_size);
    }
    kvt_engine_destroy(e);
    return 0;
}

typedef struct {
    const bench_opts_t *o;
    kvt_engine_h e;
    kvt_segment_t seg;
    unsigned id;
    char *local;
    uint64_t remote, remote_len;
    double t_end;
    /* results */
    uint64_t bytes, ops, errors, nlat;
    double *lat;
    size_t lat_cap;
    int fatal;
} worker_t;

/* Bytes this engine moved so far (its metrics). */
static uint64_t moved(kvt_engine_h e)
{
    kvt_engine_stats_t s = {.version = KVT_STATS_VERSION};
    uint64_t b = 0;

    if (kvt_engine_stats(e, &s) != KVT_OK)
        return 0;
    for (unsigned i = 0; i < s.ntransports; i++)
        b += s.transports[i].write_bytes + s.transports[i].read_bytes;
    return b;
}

/* While the threads run: a line on the terminal, redrawn every second,
 * with the last second's throughput and the time left. Nothing when
 * stderr is not a terminal or in --json mode. */
static void progress(kvt_engine_h e, const bench_opts_t *o, double t0)
{
    double t_end = t0 + o->duration, last = t0;
    uint64_t before = moved(e);

    if (o->json || !isatty(STDERR_FILENO))
        return;
    while (now_s() + 1.0 < t_end) {
        double now;
        uint64_t b;
        usleep(1000000);
        now = now_s();
        b = moved(e);
        fprintf(stderr, "\r  %.3f GB/s, %.0f s left   ",
                (double)(b - before) / (now - last) / 1e9, t_end - now);
        before = b;
        last = now;
    }
    fprintf(stderr, "\r%60s\r", "");
}

static void *initiator_thread(void *arg)
{
    worker_t *w = arg;
    const bench_opts_t *o = w->o;
    uint64_t span = o->block * o->batch;
    uint64_t windows = w->remote_len / span, iter = 0;
    /* A working set: whole blocks, at least one, within this thread's
     * share of the buffer. */
    uint64_t ws = o->working_set ? o->working_set / o->block * o->block : 0;

    if (o->working_set != 0 && ws == 0)
        ws = o->block;
    kvt_xfer_desc_t *d = calloc(o->batch, sizeof(*d));
    kvt_batch_h b;

    if (d == NULL || kvt_batch_create(w->e, o->batch, &b) != KVT_OK) {
        free(d);
        w->fatal = 1;
        return NULL;
    }
    while (now_s() < w->t_end) {
        uint64_t win = (iter * o->threads + w->id) % windows;
        double t0;
        kvt_status_t st;

        for (uint64_t i = 0; i < o->batch; i++) {
            d[i].opcode =
                strcmp(o->op, "read") == 0 ? KVT_OP_READ : KVT_OP_WRITE;
            d[i].segment = w->seg;
            d[i].local_addr = w->local + i * o->block;
            d[i].remote_addr = w->remote + win * span + i * o->block;
            if (ws != 0) {
                /* The same few blocks over and over, on both sides. */
                d[i].local_addr = w->local + (i * o->block) % ws;
                d[i].remote_addr =
                    w->remote + w->id * ws + (win * span + i * o->block) % ws;
            }
            d[i].length = o->block;
        }
        t0 = now_s();
        st = kvt_batch_submit(b, d, o->batch);
        if (st == KVT_OK)
            st = kvt_batch_wait(b, -1);
        if (w->nlat == w->lat_cap) {
            size_t cap = w->lat_cap ? w->lat_cap * 2 : 4096;
            double *n = realloc(w->lat, cap * sizeof(double));
            if (n == NULL)
                break;
            w->lat = n;
            w->lat_cap = cap;
        }
        w->lat[w->nlat++] = (now_s() - t0) * 1e6;
        if (st == KVT_OK) {
            w->bytes += span;
            w->ops += o->batch;
        } else {
            kvt_batch_state_t s;
            kvt_batch_query(b, &s);
            w->errors += s.failed;
            w->ops += s.completed;
            w->bytes += s.completed * o->block;
            if (w->errors == s.failed)
                fprintf(stderr, "kvt bench: transfer failed: %s\n",
                        kvt_status_str(st));
            if (st == KVT_ERR_CONN_LOST || st == KVT_ERR_TIMEDOUT ||
                st == KVT_ERR_NOT_FOUND) {
                w->fatal = 1;
                break;
            }
        }
        kvt_batch_reset(b);
        iter++;
    }
    kvt_batch_free(b);
    free(d);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_initiator(const bench_opts_t *o)
{
    kvt_remote_region_t region;
    uint64_t span = o->block * o->batch, bytes = 0, ops = 0, errors = 0;
    size_t nregions = 0, nlat = 0, k = 0;
    worker_t *ws = calloc(o->threads, sizeof(*ws));
    pthread_t *th = calloc(o->threads, sizeof(*th));
    double *lat, t0, cpu0, cpu, secs, p50 = 0, p99 = 0, gbps;
    kvt_segment_t seg;
    kvt_engine_h e;
    kvt_status_t st;
    const char *proto;
    char *local = NULL;
    int fatal = 0;

    if (o->segment == NULL) {
        fprintf(stderr, "kvt bench: --segment=HOST:PORT is required\n");
        return 2;
    }
    st = make_engine(o, &e);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt bench: engine: %s\n", kvt_status_str(st));
        return 1;
    }
    /* Device memory is registered before the segment opens, so that the
     * transport chosen for it knows (the choice depends on the kinds in
     * use). */
    if (is_cuda(o)) {
        void *m = NULL;
        st = alloc_device(o, e, span * o->threads, &m);
        if (st != KVT_OK) {
            fprintf(stderr, "kvt bench: cannot allocate device memory: %s\n",
                    kvt_status_str(st));
            kvt_engine_destroy(e);
            return 1;
        }
        local = m;
    }
    st = kvt_segment_open(e, o->segment, &seg);
    if (st == KVT_OK)
        st = kvt_segment_regions(e, seg, 0, &region, 1, &nregions);
    if (st != KVT_OK || nregions == 0) {
        fprintf(stderr, "kvt bench: segment %s: %s\n", o->segment,
                st != KVT_OK ? kvt_status_str(st) : "no registered memory");
        kvt_engine_destroy(e);
        return 1;
    }
    if (kvt_segment_transport(e, seg, is_cuda(o) ? KVT_MEM_CUDA : KVT_MEM_HOST,
                              (kvt_mem_kind_t)region.kind, &proto) != KVT_OK)
        proto = "?";
    if (strcmp(o->protocol, "auto") != 0 && strcmp(o->protocol, proto) != 0)
        fprintf(stderr,
                "kvt bench: %s was asked for, but the segment is "
                "served by %s (the log says why)\n",
                o->protocol, proto);
    if (o->working_set != 0 &&
        region.length <
            (o->working_set > o->block ? o->working_set : o->block) *
                o->threads) {
        fprintf(stderr, "kvt bench: the target's buffer is smaller than the "
                        "working sets\n");
        kvt_engine_destroy(e);
        return 1;
    }
    if (region.length < span) {
        fprintf(stderr,
                "kvt bench: the target's buffer (%llu bytes) is "
                "smaller than one batch (%llu bytes)\n",
                (unsigned long long)region.length, (unsigned long long)span);
        kvt_engine_destroy(e);
        return 1;
    }
    if (!is_cuda(o))
        local = alloc_buffer(span * o->threads);
    if (local == NULL ||
        (!is_cuda(o) && kvt_mem_register(e, local, span * o->threads,
                                         KVT_ACCESS_REMOTE_RW) != KVT_OK)) {
        fprintf(stderr, "kvt bench: cannot set up the local buffer\n");
        kvt_engine_destroy(e);
        return 1;
    }
    cpu0 = cpu_s();
    t0 = now_s();
    for (unsigned i = 0; i < o->threads; i++) {
        ws[i] = (worker_t){.o = o,
                           .e = e,
                           .seg = seg,
                           .id = i,
                           .local = local + i * span,
                           .remote = region.addr,
                           .remote_len = region.length,
                           .t_end = t0 + o->duration};
        pthread_create(&th[i], NULL, initiator_thread, &ws[i]);
    }
    progress(e, o, t0);
    for (unsigned i = 0; i < o->threads; i++) {
        pthread_join(th[i], NULL);
        bytes += ws[i].bytes;
        ops += ws[i].ops;
        errors += ws[i].errors;
        nlat += ws[i].nlat;
        fatal |= ws[i].fatal;
    }
    secs = now_s() - t0;
    cpu = cpu_s() - cpu0;
    lat = malloc((nlat ? nlat : 1) * sizeof(double));
    for (unsigned i = 0; i < o->threads; i++) {
        if (lat && ws[i].nlat)
            memcpy(lat + k, ws[i].lat, ws[i].nlat * sizeof(double));
        k += ws[i].nlat;
        free(ws[i].lat);
    }
    if (lat && nlat) {
        qsort(lat, nlat, sizeof(double), cmp_double);
        p50 = lat[nlat / 2];
        p99 = lat[(size_t)((double)(nlat - 1) * 0.99)];
    }
    gbps = (double)bytes / secs / 1e9;
    printf("kvt bench: %s %s, block %llu B, batch %llu, threads %llu, "
           "protocol %s\n",
           o->op, o->segment, (unsigned long long)o->block,
           (unsigned long long)o->batch, (unsigned long long)o->threads, proto);
    printf("  %.3f GB/s (%.1f MiB/s), %llu ops in %.2f s, batch latency "
           "p50 %.1f us p99 %.1f us, errors %llu\n",
           gbps, (double)bytes / secs / 1048576.0, (unsigned long long)ops,
           secs, p50, p99, (unsigned long long)errors);
    if (o->json)
        printf("{\"op\":\"%s\",\"protocol\":\"%s\",\"memory\":\"%s\","
               "\"remote_memory\":\"%s\",\"block_size\":%llu,"
               "\"batch_size\":%llu,\"threads\":%llu,\"seconds\":%.3f,"
               "\"bytes\":%llu,\"ops\":%llu,\"gbps\":%.4f,"
               "\"lat_p50_us\":%.2f,\"lat_p99_us\":%.2f,\"errors\":%llu,"
               "\"cpu_s\":%.3f,\"cpu_s_per_gb\":%.4f}\n",
               o->op, proto, o->memory,
               region.kind == KVT_MEM_CUDA ? "cuda" : "host",
               (unsigned long long)o->block, (unsigned long long)o->batch,
               (unsigned long long)o->threads, secs, (unsigned long long)bytes,
               (unsigned long long)ops, gbps, p50, p99,
               (unsigned long long)errors, cpu,
               bytes ? cpu / ((double)bytes / 1e9) : 0.0);
    free(lat);
    free(ws);
    free(th);
    kvt_engine_destroy(e); /* frees device memory from kvt_mem_alloc_ex() */
    if (!is_cuda(o))
        munmap(local, span * o->threads);
    return (errors || fatal) ? 1 : 0;
}

int kvt_cmd_bench(int argc, char **argv)
{
    bench_opts_t o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    return strcmp(o.mode, "target") == 0 ? run_target(&o) : run_initiator(&o);
}
