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
#include <time.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "bench.h"
#include "cli.h"

/* Below this block size the default pattern is scattered, as paged KV
 * blocks are; from it on, contiguous. */
#define SCATTER_BELOW (64u << 10)

/* The engine's defaults for what --conns and --workers set (engine.h). */
#define KVT_BENCH_CONNS 2
#define KVT_BENCH_WORKERS 2

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
           "            [--pattern=contig|scatter] [--working-set=BYTES] "
           "[--verify] [--depth=N]\n"
           "options for both: [--workers=N] [--conns=N] "
           "[--memory=host|cuda] [--device=N]\n"
           "defaults: --local=127.0.0.1 --buffer-size=1G --buffer=managed "
           "--protocol=auto\n"
           "          --op=write --block-size=64K --batch-size=128 "
           "--threads=1 --duration=5\n"
           "          --depth=1 --memory=host; --pattern=scatter below "
           "64K blocks, else contig\n"
           "--buffer=managed registers kvt_mem_alloc() memory (mapped by "
           "same-host peers);\n"
           "malloc registers plain memory (reached by cross-memory "
           "attach).\n"
           "Sizes take K/M/G suffixes (powers of 1024).\n");
}

static int is_cuda(const bench_opts_t *o)
{
    return strcmp(o->memory, "cuda") == 0;
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
    o->depth = 1;
    o->duration = 5;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv[i], "help")) {
            usage();
            exit(0);
        } else if (cli_flag(argv[i], "json")) {
            o->json = 1;
        } else if (cli_flag(argv[i], "verify")) {
            o->verify = 1;
        } else if ((v = cli_opt(argc, argv, &i, "pattern"))) {
            o->pattern = v;
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
        } else if ((v = cli_opt(argc, argv, &i, "depth"))) {
            if (cli_parse_size(v, &o->depth) || o->depth == 0 || o->depth > 64)
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
    if (o->pattern == NULL)
        o->pattern = o->block < SCATTER_BELOW ? "scatter" : "contig";
    if (strcmp(o->pattern, "contig") != 0 &&
        strcmp(o->pattern, "scatter") != 0) {
        fprintf(stderr, "kvt bench: --pattern=contig or --pattern=scatter\n");
        return -1;
    }
    if (o->verify && is_cuda(o)) {
        fprintf(stderr, "kvt bench: --verify checks host memory only\n");
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

static int run_target(const bench_opts_t *o)
{
    int managed = strcmp(o->buffer, "managed") == 0;
    kvt_engine_h e;
    kvt_status_t st;
    sigset_t set;
    void *buf = NULL;

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
    /* Serves the initiators' requests (CPU time, --verify) until a
     * signal. */
    bench_target_serve(e, is_cuda(o) ? NULL : buf, o->buffer_size, &set);
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
    char *local;         /* this thread's source (or sink): ws bytes */
    uint64_t remote;     /* this thread's part of the target's buffer */
    bench_walk_t lw, rw; /* local and remote slots; the same count */
    uint64_t base;       /* offset of remote in the target's region */
    uint64_t seed;
    double t_end;
    /* results */
    uint64_t bytes, ops, errors, nlat, count, bad;
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

/*
 * One initiator thread: batches of o->batch descriptors, each one block
 * from local slot lw(k) to remote slot rw(k) (or back, reading), k
 * counting every descriptor of the thread. o->depth batches are in
 * flight at once: the thread waits for the oldest, then refills and
 * submits it again, so with a depth of 2 or more the transport is never
 * left without work while the thread is busy; with a depth of 1 each
 * batch is submitted and waited for in one call (kvt_batch_submit_wait(),
 * a synchronous transfer). With --verify a write's
 * source is filled with the pattern of its destination and pass before
 * it is submitted (so the figure then includes that work), and a read's
 * block is checked once it has landed. A batch's latency runs from its
 * submission to the return of the wait that saw it complete.
 */
typedef struct {
    kvt_batch_h b;
    kvt_xfer_desc_t *d;
    uint64_t k; /* its first descriptor's number */
    double t0;
    int busy;
} bench_slot_t;

static int note_latency(worker_t *w, double us)
{
    if (w->nlat == w->lat_cap) {
        size_t cap = w->lat_cap ? w->lat_cap * 2 : 4096;
        double *n = realloc(w->lat, cap * sizeof(double));
        if (n == NULL)
            return -1;
        w->lat = n;
        w->lat_cap = cap;
    }
    w->lat[w->nlat++] = us;
    return 0;
}

/* Waits for @sl and accounts for it; returns -1 when the run must stop. */
static int finish_slot(worker_t *w, bench_slot_t *sl, int reading)
{
    const bench_opts_t *o = w->o;
    kvt_status_t st = kvt_batch_wait(sl->b, -1);
    int stop = 0;

    sl->busy = 0;
    if (note_latency(w, (now_s() - sl->t0) * 1e6) != 0)
        stop = 1;
    if (st == KVT_OK) {
        w->bytes += o->block * o->batch;
        w->ops += o->batch;
        for (uint64_t i = 0; o->verify && reading && i < o->batch; i++)
            w->bad += (uint64_t)bench_differs(
                sl->d[i].local_addr,
                w->base + bench_walk_slot(&w->rw, sl->k + i) * o->block,
                o->block, 0, w->seed);
    } else {
        kvt_batch_state_t s;
        kvt_batch_query(sl->b, &s);
        w->errors += s.failed;
        w->ops += s.completed;
        w->bytes += s.completed * o->block;
        if (w->errors == s.failed)
            fprintf(stderr, "kvt bench: transfer failed: %s\n",
                    kvt_status_str(st));
        if (st == KVT_ERR_CONN_LOST || st == KVT_ERR_TIMEDOUT ||
            st == KVT_ERR_NOT_FOUND) {
            w->fatal = 1;
            stop = 1;
        }
    }
    kvt_batch_reset(sl->b);
    return stop ? -1 : 0;
}

/*
 * One untimed pass over each thread's working set at the target, with
 * the run's own operation, in pieces of up to 1 MiB: a same-host
 * transport maps the target's memory at open and its pages fault in on
 * first use, which is no part of a steady-state figure (the pass's time
 * is printed apart). Returns the seconds it took, or -1 when a transfer
 * of it failed.
 */
static double first_pass(kvt_engine_h e, const worker_t *ws, unsigned n,
                         uint64_t wset, int reading)
{
    enum { PIECE = 1 << 20, MAXD = 64 };
    kvt_xfer_desc_t d[MAXD];
    kvt_status_t st = KVT_OK;
    kvt_batch_h b;
    double t0 = now_s();
    int bad = 0;

    if (kvt_batch_create(e, MAXD, &b) != KVT_OK)
        return -1;
    for (unsigned t = 0; t < n && !bad; t++) {
        for (uint64_t off = 0; off < wset && !bad;) {
            unsigned k = 0;
            for (; k < MAXD && off < wset; k++, off += PIECE) {
                uint64_t len = wset - off < PIECE ? wset - off : PIECE;
                d[k] = (kvt_xfer_desc_t){.opcode = reading ? KVT_OP_READ
                                                           : KVT_OP_WRITE,
                                         .segment = ws[t].seg,
                                         .local_addr = ws[t].local + off,
                                         .remote_addr = ws[t].remote + off,
                                         .length = len};
            }
            st = kvt_batch_submit_wait(b, d, k, 60000);
            bad = st != KVT_OK || kvt_batch_reset(b) != KVT_OK;
        }
    }
    kvt_batch_free(b);
    if (bad)
        fprintf(stderr, "kvt bench: the first pass: %s\n", kvt_status_str(st));
    return bad ? -1 : now_s() - t0;
}

static void *initiator_thread(void *arg)
{
    worker_t *w = arg;
    const bench_opts_t *o = w->o;
    int reading = strcmp(o->op, "read") == 0;
    bench_slot_t *slots = calloc(o->depth, sizeof(*slots));
    uint64_t k = 0, n = 0;

    if (slots == NULL) {
        w->fatal = 1;
        return NULL;
    }

    for (uint64_t j = 0; j < o->depth; j++) {
        slots[j].d = calloc(o->batch, sizeof(kvt_xfer_desc_t));
        if (slots[j].d == NULL ||
            kvt_batch_create(w->e, o->batch, &slots[j].b) != KVT_OK) {
            free(slots[j].d);
            slots[j].d = NULL;
            w->fatal = 1;
            break;
        }
    }
    for (; !w->fatal && now_s() < w->t_end; n++) {
        bench_slot_t *sl = &slots[n % o->depth];
        kvt_status_t st;

        if (sl->busy && finish_slot(w, sl, reading) != 0)
            break;
        for (uint64_t i = 0; i < o->batch; i++) {
            uint64_t rs = bench_walk_slot(&w->rw, k + i);
            char *l = w->local + bench_walk_slot(&w->lw, k + i) * o->block;

            sl->d[i].opcode = reading ? KVT_OP_READ : KVT_OP_WRITE;
            sl->d[i].segment = w->seg;
            sl->d[i].local_addr = l;
            sl->d[i].remote_addr = w->remote + rs * o->block;
            sl->d[i].length = o->block;
            if (o->verify && !reading)
                bench_fill(l, w->base + rs * o->block, o->block,
                           (k + i) / w->rw.n, w->seed);
        }
        sl->k = k;
        sl->t0 = now_s();
        if (o->depth == 1) {
            /* One batch at a time is a synchronous transfer: submitted
             * and waited for in one call. A refusal submits nothing. */
            kvt_batch_state_t q;
            st = kvt_batch_submit_wait(sl->b, sl->d, o->batch, -1);
            kvt_batch_query(sl->b, &q);
            if (q.submitted > 0)
                st = KVT_OK;
        } else {
            st = kvt_batch_submit(sl->b, sl->d, o->batch);
        }
        if (st != KVT_OK) { /* nothing of it went out */
            fprintf(stderr, "kvt bench: cannot submit: %s\n",
                    kvt_status_str(st));
            w->errors += o->batch;
            w->fatal = 1;
            break;
        }
        sl->busy = 1;
        k += o->batch;
        if (o->depth == 1 && finish_slot(w, sl, reading) != 0)
            break;
    }
    /* The batches still in flight complete (or fail) before the thread
     * reports: their bytes are counted, as the clock stops after them. */
    for (uint64_t j = 0; j < o->depth; j++) {
        bench_slot_t *sl = &slots[(n + j) % o->depth];
        if (sl->busy)
            finish_slot(w, sl, reading);
    }
    w->count = k;
    for (uint64_t j = 0; j < o->depth; j++) {
        if (slots[j].d != NULL) {
            kvt_batch_free(slots[j].b);
            free(slots[j].d);
        }
    }
    free(slots);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The default working set of a thread: cold, twice the last-level cache
 * and at least 64 MiB, so that neither side's blocks stay in a cache
 * between passes. */
static uint64_t default_working_set(void)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t ws = llc > 0 ? 2 * (uint64_t)llc : 0;

    return ws > (64ull << 20) ? ws : 64ull << 20;
}

/* Ask the target for its CPU seconds so far; -1 when it does not say. */
static double target_cpu(kvt_engine_h e, kvt_segment_t seg)
{
    char reply[128];
    double v;

    if (bench_ask(e, seg, "cpu", reply, sizeof(reply), 5000) != 0 ||
        sscanf(reply, "cpu %lf", &v) != 1)
        return -1;
    return v;
}

/* Have the target check each thread's walk (writes), or fill its buffer
 * with the pattern (reads, before the run). Returns blocks that differ,
 * or -1 when the target could not do it. */
static int64_t target_verify(kvt_engine_h e, kvt_segment_t seg,
                             const worker_t *ws, unsigned n, uint64_t block,
                             uint64_t *checked)
{
    int64_t bad = 0;

    for (unsigned i = 0; i < n; i++) {
        char req[256], reply[128] = "";
        uint64_t c, b;

        snprintf(req, sizeof(req), "verify %llu %llu %llu %llu %llu %llu",
                 (unsigned long long)ws[i].seed, (unsigned long long)ws[i].base,
                 (unsigned long long)ws[i].rw.n, (unsigned long long)block,
                 (unsigned long long)ws[i].rw.mul,
                 (unsigned long long)ws[i].count);
        if (bench_ask(e, seg, req, reply, sizeof(reply), 120000) != 0 ||
            sscanf(reply, "verified %llu %llu", (unsigned long long *)&c,
                   (unsigned long long *)&b) != 2) {
            fprintf(stderr, "kvt bench: the target could not verify: %s\n",
                    reply);
            return -1;
        }
        *checked += c;
        bad += (int64_t)b;
    }
    return bad;
}

static int run_initiator(const bench_opts_t *o)
{
    kvt_remote_region_t region;
    uint64_t bytes = 0, ops = 0, errors = 0, bad = 0, checked = 0;
    uint64_t ws_req = o->working_set ? o->working_set : default_working_set();
    uint64_t wset, part, seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    size_t nregions = 0, nlat = 0, k = 0;
    worker_t *ws = calloc(o->threads, sizeof(*ws));
    pthread_t *th = calloc(o->threads, sizeof(*th));
    double *lat, t0, cpu0, cpu, tcpu0, tcpu = -1, secs, first, p50 = 0, p99 = 0;
    double gbps;
    int scatter = strcmp(o->pattern, "scatter") == 0;
    kvt_segment_t seg;
    kvt_engine_h e;
    kvt_status_t st;
    const char *proto;
    char *local = NULL;
    int fatal = 0, rc = 1;

    if (o->segment == NULL) {
        fprintf(stderr, "kvt bench: --segment=HOST:PORT is required\n");
        return 2;
    }
    if (ws == NULL || th == NULL)
        goto out_free;
    ws_req = ws_req / o->block * o->block;
    if (ws_req == 0)
        ws_req = o->block;
    st = make_engine(o, &e);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt bench: engine: %s\n", kvt_status_str(st));
        goto out_free;
    }
    /* Device memory is registered before the segment opens, so that the
     * transport chosen for it knows (the choice depends on the kinds in
     * use). */
    if (is_cuda(o)) {
        void *m = NULL;
        st = alloc_device(o, e, ws_req * o->threads, &m);
        if (st != KVT_OK) {
            fprintf(stderr, "kvt bench: cannot allocate device memory: %s\n",
                    kvt_status_str(st));
            goto out_engine;
        }
        local = m;
    }
    st = kvt_segment_open(e, o->segment, &seg);
    if (st == KVT_OK)
        st = kvt_segment_regions(e, seg, 0, &region, 1, &nregions);
    if (st != KVT_OK || nregions == 0) {
        fprintf(stderr, "kvt bench: segment %s: %s\n", o->segment,
                st != KVT_OK ? kvt_status_str(st) : "no registered memory");
        goto out_engine;
    }
    if (kvt_segment_transport(e, seg, is_cuda(o) ? KVT_MEM_CUDA : KVT_MEM_HOST,
                              (kvt_mem_kind_t)region.kind, &proto) != KVT_OK)
        proto = "?";
    if (strcmp(o->protocol, "auto") != 0 && strcmp(o->protocol, proto) != 0)
        fprintf(stderr,
                "kvt bench: %s was asked for, but the segment is "
                "served by %s (the log says why)\n",
                o->protocol, proto);
    /* Each thread walks its own part of the target's buffer; the working
     * set is what it cycles through there, and at home. */
    part = region.length / o->threads / o->block * o->block;
    wset = ws_req < part ? ws_req : part;
    if (part == 0 || (o->working_set != 0 && o->working_set > part)) {
        fprintf(
            stderr,
            "kvt bench: the target's buffer (%llu bytes) holds no "
            "working set of %llu bytes for each of %llu threads\n",
            (unsigned long long)region.length,
            (unsigned long long)(o->working_set ? o->working_set : o->block),
            (unsigned long long)o->threads);
        goto out_engine;
    }
    if (o->verify && wset / o->block < o->batch * o->depth) {
        fprintf(stderr, "kvt bench: --verify needs a working set of at least "
                        "--depth batches, so that no block is written twice "
                        "while in flight\n");
        goto out_engine;
    }
    if (o->verify && region.kind != KVT_MEM_HOST) {
        fprintf(stderr, "kvt bench: --verify checks host memory only\n");
        goto out_engine;
    }
    if (!is_cuda(o))
        local = alloc_buffer(wset * o->threads);
    if (local == NULL ||
        (!is_cuda(o) && kvt_mem_register(e, local, wset * o->threads,
                                         KVT_ACCESS_REMOTE_RW) != KVT_OK)) {
        fprintf(stderr, "kvt bench: cannot set up the local buffer\n");
        goto out_engine;
    }
    for (unsigned i = 0; i < o->threads; i++) {
        ws[i] = (worker_t){.o = o,
                           .e = e,
                           .seg = seg,
                           .id = i,
                           .local = local + i * wset,
                           .base = i * part,
                           .remote = region.addr + i * part,
                           .seed = seed};
        if (bench_walk_init(&ws[i].rw, wset / o->block, scatter, 0.618) != 0 ||
            bench_walk_init(&ws[i].lw, wset / o->block, scatter, 0.382) != 0) {
            fprintf(stderr, "kvt bench: --pattern=scatter needs a working "
                            "set of 5, 7 or more blocks\n");
            goto out_local;
        }
    }
    /* A target that does not answer the first request (a peer that is
     * not kvt bench) cannot check anything either: say so now rather
     * than after the run. */
    tcpu0 = target_cpu(e, seg);
    if (o->verify && tcpu0 < 0) {
        fprintf(stderr, "kvt bench: --verify needs a kvt bench target, and "
                        "this one does not answer\n");
        goto out_local;
    }
    if (o->verify && strcmp(o->op, "read") == 0) {
        char reply[128];
        snprintf(reply, sizeof(reply), "fill %llu", (unsigned long long)seed);
        if (bench_ask(e, seg, reply, reply, sizeof(reply), 120000) != 0 ||
            strcmp(reply, "filled") != 0) {
            fprintf(stderr, "kvt bench: the target could not fill its "
                            "buffer for --verify\n");
            goto out_local;
        }
        tcpu0 = target_cpu(e, seg); /* the fill is not the run's */
    }
    first = first_pass(e, ws, (unsigned)o->threads, wset,
                       strcmp(o->op, "read") == 0);
    if (first < 0) {
        fprintf(stderr, "kvt bench: the first pass over the working set "
                        "failed\n");
        goto out_local;
    }
    if (tcpu0 >= 0)
        tcpu0 = target_cpu(e, seg); /* the first pass is not the run's */
    cpu0 = bench_cpu_s();
    t0 = now_s();
    for (unsigned i = 0; i < o->threads; i++) {
        ws[i].t_end = t0 + o->duration;
        pthread_create(&th[i], NULL, initiator_thread, &ws[i]);
    }
    progress(e, o, t0);
    for (unsigned i = 0; i < o->threads; i++) {
        pthread_join(th[i], NULL);
        bytes += ws[i].bytes;
        ops += ws[i].ops;
        errors += ws[i].errors;
        nlat += ws[i].nlat;
        bad += ws[i].bad;
        fatal |= ws[i].fatal;
    }
    secs = now_s() - t0;
    cpu = bench_cpu_s() - cpu0;
    if (tcpu0 >= 0) {
        double t1 = target_cpu(e, seg);
        tcpu = t1 >= 0 ? t1 - tcpu0 : -1;
    }
    if (o->verify && strcmp(o->op, "read") == 0) {
        for (unsigned i = 0; i < o->threads; i++)
            checked += ws[i].count < ws[i].rw.n ? ws[i].count : ws[i].rw.n;
    } else if (o->verify && !fatal) {
        int64_t b =
            target_verify(e, seg, ws, (unsigned)o->threads, o->block, &checked);
        if (b < 0)
            fatal = 1;
        else
            bad += (uint64_t)b;
    }
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
    printf("kvt bench: %s %s, block %llu B %s, batch %llu, depth %llu, "
           "threads %llu, working set %llu B, protocol %s\n",
           o->op, o->segment, (unsigned long long)o->block, o->pattern,
           (unsigned long long)o->batch, (unsigned long long)o->depth,
           (unsigned long long)o->threads, (unsigned long long)wset, proto);
    printf("  %.3f GB/s (%.1f MiB/s), %llu ops in %.2f s, batch latency "
           "p50 %.1f us p99 %.1f us, errors %llu\n",
           gbps, (double)bytes / secs / 1048576.0, (unsigned long long)ops,
           secs, p50, p99, (unsigned long long)errors);
    printf("  first pass over the working set (untimed): %.3f s\n", first);
    printf("  CPU %.2f s/GB here", bytes ? cpu / ((double)bytes / 1e9) : 0.0);
    if (tcpu >= 0)
        printf(", %.2f s/GB at the target",
               bytes ? tcpu / ((double)bytes / 1e9) : 0.0);
    printf("\n");
    if (o->verify)
        printf("  verify: %llu blocks checked, %llu differ\n",
               (unsigned long long)checked, (unsigned long long)bad);
    if (o->json) {
        char tj[64] = "null", tg[64] = "null";
        if (tcpu >= 0) {
            snprintf(tj, sizeof(tj), "%.3f", tcpu);
            snprintf(tg, sizeof(tg), "%.4f",
                     bytes ? tcpu / ((double)bytes / 1e9) : 0.0);
        }
        printf(
            "{\"op\":\"%s\",\"protocol\":\"%s\",\"memory\":\"%s\","
            "\"remote_memory\":\"%s\",\"block_size\":%llu,"
            "\"batch_size\":%llu,\"depth\":%llu,\"threads\":%llu,"
            "\"conns\":%llu,\"workers\":%llu,\"pattern\":\"%s\","
            "\"working_set\":%llu,"
            "\"first_pass_s\":%.3f,\"seconds\":%.3f,\"bytes\":%llu,\"ops\":%"
            "llu,\"gbps\":%.4f,"
            "\"lat_p50_us\":%.2f,\"lat_p99_us\":%.2f,\"errors\":%llu,"
            "\"cpu_s\":%.3f,\"cpu_s_per_gb\":%.4f,"
            "\"target_cpu_s\":%s,\"target_cpu_s_per_gb\":%s,"
            "\"verify\":%s,\"verified_blocks\":%llu,\"mismatches\":%llu}\n",
            o->op, proto, o->memory,
            region.kind == KVT_MEM_CUDA ? "cuda" : "host",
            (unsigned long long)o->block, (unsigned long long)o->batch,
            (unsigned long long)o->depth, (unsigned long long)o->threads,
            (unsigned long long)(o->conns ? o->conns : KVT_BENCH_CONNS),
            (unsigned long long)(o->workers ? o->workers : KVT_BENCH_WORKERS),
            o->pattern, (unsigned long long)wset, first, secs,
            (unsigned long long)bytes, (unsigned long long)ops, gbps, p50, p99,
            (unsigned long long)errors, cpu,
            bytes ? cpu / ((double)bytes / 1e9) : 0.0, tj, tg,
            o->verify ? "true" : "false", (unsigned long long)checked,
            (unsigned long long)bad);
    }
    free(lat);
    rc = (errors || fatal || bad) ? 1 : 0;
out_local:
    if (!is_cuda(o) && local != NULL) {
        kvt_mem_unregister(e, local);
        munmap(local, wset * o->threads);
        local = NULL;
    }
out_engine:
    kvt_engine_destroy(e); /* frees device memory from kvt_mem_alloc_ex() */
out_free:
    free(ws);
    free(th);
    return rc;
}

int kvt_cmd_bench(int argc, char **argv)
{
    bench_opts_t o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    return strcmp(o.mode, "target") == 0 ? run_target(&o) : run_initiator(&o);
}
