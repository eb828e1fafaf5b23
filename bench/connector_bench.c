/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_connector_bench: the KV connector between prefill and decode rank
 * processes on 127.0.0.1, a bootstrap server in a child process.
 *
 *   --mode=latency  one request per round, compute simulated per layer
 *                   (sleeping --compute-ms per layer). Layer-wise: the
 *                   time from marking the last layer ready on prefill to
 *                   SUCCESS on decode. Whole-request: the time from the
 *                   end of the simulated forward (send() of every block)
 *                   to SUCCESS. Medians of --rounds, each mode in turn.
 *   --mode=tp       one request per round sent whole by every prefill
 *                   rank at once: bytes of KV moved / (last SUCCESS on
 *                   decode - first send on prefill).
 *   --mode=rooms    many small requests at once, as a busy server has
 *                   them: each round one prefill step carries --rooms
 *                   rooms (256) of 1 to --tokens/--block-tokens blocks
 *                   (room i has 1 + i mod that many), streamed layer by
 *                   layer with --compute-ms of simulated compute per
 *                   layer (0.05), beginning once decode announced every
 *                   room; bytes of KV moved / (last SUCCESS on decode -
 *                   step begin on prefill), over every round.
 *
 * Geometry: --layers (32), --kv-heads (8, in all), --head-bytes (256:
 * head dim 128 in bf16), --block-tokens (16), --tokens (2048 per
 * request), --layout token|head, --prefill-tp, --decode-tp; engines:
 * --workers, --conns (per peer; default: the engine's), --protocol tcp
 * (tcp only) or auto (the default: same-host shm when built). Block tables
 * are runs of 4 blocks in shuffled order on both sides. Output: one line
 * of key=value pairs (medians in ms, throughput in GB/s).
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvt/kvt.h>

typedef struct {
    int latency, rooms_mode;
    uint32_t rooms;
    uint32_t layers, heads, head_bytes, block_tokens, tokens;
    uint32_t P, D, rounds, interval, workers, conns;
    int head_major, tcp_only, managed;
    double compute_ms;
} opt_t;

enum { MSG_READY = 1, MSG_ANNOUNCED, MSG_T_LAST, MSG_T_SUCCESS, MSG_FAIL };

typedef struct {
    int32_t kind, rank;
    double t;
} msg_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void die(const char *what, kvt_status_t st)
{
    fprintf(stderr, "connector_bench: %s: %s\n", what, kvt_status_str(st));
    exit(1);
}

static void send_msg(int fd, int kind, int rank, double t)
{
    msg_t m = {kind, rank, t};
    if (write(fd, &m, sizeof(m)) != sizeof(m))
        exit(1);
}

/* Commands from the parent: a byte: 'l' layer-wise round, 'w' whole
 * round, 't' throughput round, 'g' go, 'q' quit. */
static char read_cmd(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        return 'q';
    return c;
}

typedef struct {
    const opt_t *o;
    int prefill;
    uint32_t rank, tp;
    kvt_engine_h eng;
    kvt_conn_h conn;
    kvt_kv_cache_t *caches;
    size_t ncaches;
    uint32_t *table, nblocks;
    uint64_t aux_slot;
    kvt_aux_buffer_t aux;
    void *arena; /* --memory=managed */
} rank_t;

/* Blocks of room @i of a rooms round, of at most @nblocks: 1 to nblocks. */
static uint32_t room_blocks(uint32_t i, uint32_t nblocks)
{
    return 1 + i % nblocks;
}

static void rank_setup(rank_t *r, uint16_t boot)
{
    const opt_t *o = r->o;
    uint32_t heads = o->heads / r->tp, pool;
    uint64_t block = (uint64_t)o->block_tokens * heads * o->head_bytes;
    kvt_engine_params_t ep = {0};
    kvt_conn_params_t p = {0};
    kvt_kv_layout_t lay = {0};
    char addr[64];
    kvt_status_t st;

    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    ep.local_host = "127.0.0.1";
    if (o->workers) {
        ep.field_mask |= KVT_ENGINE_PARAM_NUM_WORKERS;
        ep.num_workers = o->workers;
    }
    if (o->conns) {
        ep.field_mask |= KVT_ENGINE_PARAM_CONNS_PER_PEER;
        ep.conns_per_peer = o->conns;
    }
    if (o->tcp_only) {
        ep.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        ep.transports = KVT_TRANSPORT_TCP;
    }
    if ((st = kvt_engine_create(&ep, &r->eng)) != KVT_OK)
        die("engine", st);
    r->nblocks = (o->tokens + o->block_tokens - 1) / o->block_tokens;
    pool = r->nblocks + 8;
    if (o->rooms_mode) { /* every room's blocks */
        pool = 8;
        for (uint32_t i = 0; i < o->rooms; i++)
            pool += room_blocks(i, r->nblocks);
    }
    r->ncaches = 2 * o->layers;
    r->caches = calloc(r->ncaches, sizeof(*r->caches));
    /* An aux slot per room (rooms mode), and a few to spare. */
    r->aux.item_bytes = 64;
    r->aux.count = o->rooms_mode ? o->rooms + 4 : 4;
    if (o->managed) {
        /* One kvt allocation (registered by it) holding every cache and
         * the aux buffer. */
        uint64_t each = (block * pool + 4095) & ~4095ull;
        uint64_t aux =
            ((uint64_t)r->aux.count * r->aux.item_bytes + 4095) & ~4095ull;
        st = kvt_mem_alloc(r->eng, each * r->ncaches + aux,
                           KVT_ACCESS_REMOTE_RW, &r->arena);
        if (st != KVT_OK)
            die("kvt_mem_alloc", st);
        for (size_t i = 0; i < r->ncaches; i++)
            r->caches[i].base = (uint8_t *)r->arena + i * each;
    }
    for (size_t i = 0; i < r->ncaches; i++) {
        kvt_kv_cache_t *c = &r->caches[i];
        c->layer = (uint32_t)(i / 2);
        c->kind = i % 2 ? KVT_CACHE_V : KVT_CACHE_K;
        c->block_layout =
            o->head_major ? KVT_BLOCK_HEAD_MAJOR : KVT_BLOCK_TOKEN_MAJOR;
        c->tokens_per_block = o->block_tokens;
        c->heads = heads;
        c->head_bytes = o->head_bytes;
        c->block_bytes = block;
        c->num_blocks = pool;
        if (!o->managed && posix_memalign(&c->base, 4096, block * pool) != 0)
            die("memory", KVT_ERR_NO_MEMORY);
        memset(c->base, r->prefill ? 0x11 : 0, block * pool);
    }
    /* Runs of 4 blocks, shuffled: a fragmented but realistic table. */
    r->table = malloc(pool * sizeof(*r->table));
    {
        uint32_t runs = pool / 4, *perm = malloc(runs * sizeof(*perm));
        uint64_t s = 88172645463325252ull + 17 * r->prefill;
        for (uint32_t i = 0; i < runs; i++)
            perm[i] = i;
        for (uint32_t i = runs - 1; i > 0; i--) {
            uint32_t j, t;
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            j = (uint32_t)(s % (i + 1));
            t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (uint32_t i = 0; i < runs * 4; i++)
            r->table[i] = perm[i / 4] * 4 + i % 4;
        free(perm);
    }
    r->aux.base = o->managed
                      ? (uint8_t *)r->arena +
                            (((block * pool + 4095) & ~4095ull) * r->ncaches)
                      : calloc(r->aux.count, r->aux.item_bytes);
    r->aux_slot = r->prefill ? 1 : 2;

    snprintf(addr, sizeof(addr), "127.0.0.1:%u", boot);
    lay.num_layers = o->layers;
    lay.caches = r->caches;
    lay.num_caches = r->ncaches;
    lay.aux = &r->aux;
    lay.num_aux = 1;
    p.field_mask = KVT_CONN_PARAM_ROLE | KVT_CONN_PARAM_ENGINE |
                   KVT_CONN_PARAM_LAYOUT | KVT_CONN_PARAM_BOOTSTRAP_ADDR |
                   KVT_CONN_PARAM_TP_RANK | KVT_CONN_PARAM_TP_SIZE |
                   KVT_CONN_PARAM_SUBMIT_INTERVAL | KVT_CONN_PARAM_FLAGS;
    p.role = r->prefill ? KVT_ROLE_PREFILL : KVT_ROLE_DECODE;
    p.engine = r->eng;
    p.layout = &lay;
    p.bootstrap_addr = addr;
    p.tp_rank = r->rank;
    p.tp_size = r->tp;
    p.submit_interval = o->interval;
    /* kvt_mem_alloc() registered the caches and the aux buffer. */
    p.flags = o->managed ? KVT_CONN_NO_REGISTER : 0;
    if ((st = kvt_conn_create(&p, &r->conn)) != KVT_OK)
        die("connector", st);
}

static void rank_fini(rank_t *r)
{
    kvt_conn_destroy(r->conn);
    kvt_engine_destroy(r->eng); /* frees the arena */
    for (size_t i = 0; !r->o->managed && i < r->ncaches; i++)
        free(r->caches[i].base);
    free(r->caches);
    free(r->table);
    if (!r->o->managed)
        free(r->aux.base);
}

/* A rooms round on one rank: --rooms rooms from @first, each its own
 * blocks of the table and its own aux slot. */
static int rooms_round(rank_t *r, uint64_t first, int cmd_fd, int res_fd)
{
    const opt_t *o = r->o;
    struct kvt_room **h = calloc(o->rooms, sizeof(*h));
    uint64_t *slots = calloc(o->rooms, sizeof(*slots));
    uint32_t off = 0;
    int failed = 0;
    double t = 0, deadline;
    kvt_status_t st;

    if (h == NULL || slots == NULL)
        die("rooms", KVT_ERR_NO_MEMORY);
    for (uint32_t i = 0; i < o->rooms; i++) {
        uint32_t n = room_blocks(i, r->nblocks);
        slots[i] = i;
        if (r->prefill)
            st = kvt_sender_create(r->conn, NULL, first + i, &h[i]);
        else
            st = kvt_receiver_create(r->conn, NULL, first + i, -1, &h[i]);
        if (st == KVT_OK)
            st = r->prefill ? kvt_sender_init(h[i], n, &slots[i], 1)
                            : kvt_receiver_init(h[i], r->table + off, n, 0,
                                                &slots[i], 1);
        if (st != KVT_OK)
            die(r->prefill ? "sender" : "receiver", st);
        off += n;
    }
    if (r->prefill) {
        uint64_t step;
        double t0;
        /* Decode announced every room: what follows is the transfer. */
        for (uint32_t i = 0; i < o->rooms; i++)
            while (kvt_room_poll(h[i]) == KVT_POLL_BOOTSTRAPPING)
                usleep(200);
        send_msg(res_fd, MSG_ANNOUNCED, (int)r->rank, 0);
        if (read_cmd(cmd_fd) != 'g') {
            failed = -1;
            goto out;
        }
        t0 = now_s();
        kvt_conn_step_begin(r->conn, &step);
        off = 0;
        for (uint32_t i = 0; i < o->rooms; i++) {
            uint32_t n = room_blocks(i, r->nblocks);
            kvt_sender_send_step(h[i], step, r->table + off, n, 1);
            off += n;
        }
        for (uint32_t l = 0; l < o->layers; l++) {
            sleep_until(t0 + (l + 1) * o->compute_ms * 1e-3);
            kvt_conn_layer_ready(r->conn, step, l);
        }
        kvt_conn_step_end(r->conn, step);
        t = t0;
    }
    deadline = now_s() + 60.0; /* for the whole step */
    for (uint32_t i = 0; i < o->rooms; i++) {
        double left = deadline - now_s();
        if (kvt_room_wait(h[i], left > 0 ? (int64_t)(left * 1e3) : 0) !=
            KVT_POLL_SUCCESS) {
            kvt_room_info_t info;
            kvt_room_info(h[i], &info);
            fprintf(stderr, "%s: room %llu: %s\n",
                    r->prefill ? "prefill" : "decode",
                    (unsigned long long)(first + i), info.reason);
            failed = 1;
        }
    }
    if (failed)
        send_msg(res_fd, MSG_FAIL, (int)r->rank, 0);
    else
        send_msg(res_fd, r->prefill ? MSG_T_LAST : MSG_T_SUCCESS, (int)r->rank,
                 r->prefill ? t : now_s());
out:
    for (uint32_t i = 0; i < o->rooms; i++)
        kvt_room_destroy(h[i]);
    free(h);
    free(slots);
    return failed < 0 ? -1 : 0;
}

/* One rank: rounds as the parent commands them. */
static int rank_main(const opt_t *o, int prefill, uint32_t rank, uint16_t boot,
                     int cmd_fd, int res_fd)
{
    rank_t r;
    uint64_t room = 1000;
    char c;

    memset(&r, 0, sizeof(r));
    r.o = o;
    r.prefill = prefill;
    r.rank = rank;
    r.tp = prefill ? o->P : o->D;
    rank_setup(&r, boot);
    send_msg(res_fd, MSG_READY, (int)rank, 0);
    while ((c = read_cmd(cmd_fd)) != 'q') {
        struct kvt_room *h;
        kvt_status_t st;
        double t = 0;

        if (c == 'r') {
            room += o->rooms;
            if (rooms_round(&r, room - o->rooms + 1, cmd_fd, res_fd) != 0)
                break;
            continue;
        }
        room++;
        if (!prefill) {
            st = kvt_receiver_create(r.conn, NULL, room, -1, &h);
            if (st != KVT_OK ||
                (st = kvt_receiver_init(h, r.table, r.nblocks, 0, &r.aux_slot,
                                        1)) != KVT_OK)
                die("receiver", st);
            if (kvt_room_wait(h, 60000) != KVT_POLL_SUCCESS) {
                kvt_room_info_t info;
                kvt_room_info(h, &info);
                fprintf(stderr, "decode: %s\n", info.reason);
                send_msg(res_fd, MSG_FAIL, (int)rank, 0);
            } else {
                send_msg(res_fd, MSG_T_SUCCESS, (int)rank, now_s());
            }
            kvt_room_destroy(h);
            continue;
        }
        if ((st = kvt_sender_create(r.conn, NULL, room, &h)) != KVT_OK ||
            (st = kvt_sender_init(h, r.nblocks, &r.aux_slot, 1)) != KVT_OK)
            die("sender", st);
        /* Decode announced: what follows is the transfer only. */
        while (kvt_room_poll(h) == KVT_POLL_BOOTSTRAPPING)
            usleep(200);
        send_msg(res_fd, MSG_ANNOUNCED, (int)rank, 0);
        if (read_cmd(cmd_fd) != 'g')
            break;
        if (c == 'l') {
            uint64_t step;
            double t0 = now_s();
            kvt_conn_step_begin(r.conn, &step);
            kvt_sender_send_step(h, step, r.table, r.nblocks, 1);
            for (uint32_t l = 0; l < o->layers; l++) {
                sleep_until(t0 + (l + 1) * o->compute_ms * 1e-3);
                kvt_conn_layer_ready(r.conn, step, l);
            }
            t = now_s();
            kvt_conn_step_end(r.conn, step);
        } else if (c == 'w') {
            sleep_until(now_s() + o->layers * o->compute_ms * 1e-3);
            t = now_s();
            kvt_sender_send(h, r.table, r.nblocks, 1);
        } else {
            t = now_s();
            kvt_sender_send(h, r.table, r.nblocks, 1);
        }
        send_msg(res_fd, MSG_T_LAST, (int)rank, t);
        if (kvt_room_wait(h, 60000) != KVT_POLL_SUCCESS)
            send_msg(res_fd, MSG_FAIL, (int)rank, 0);
        kvt_room_destroy(h);
    }
    rank_fini(&r);
    return 0;
}

/* ---- The parent ------------------------------------------------------- */

static pid_t boot_start(uint16_t *port_p, int *ctl_p)
{
    int pfd[2], cfd[2];
    pid_t pid;

    if (pipe(pfd) != 0 || pipe(cfd) != 0)
        exit(1);
    pid = fork();
    if (pid == 0) {
        kvt_bootstrap_h b;
        uint16_t port;
        char ch;
        close(pfd[0]);
        close(cfd[1]);
        if (kvt_bootstrap_start("127.0.0.1", 0, &b) != KVT_OK)
            _exit(1);
        port = kvt_bootstrap_port(b);
        if (write(pfd[1], &port, sizeof(port)) != sizeof(port))
            _exit(1);
        while (read(cfd[0], &ch, 1) > 0)
            ;
        kvt_bootstrap_stop(b);
        _exit(0);
    }
    close(pfd[1]);
    close(cfd[0]);
    if (read(pfd[0], port_p, sizeof(*port_p)) != sizeof(*port_p))
        exit(1);
    close(pfd[0]);
    *ctl_p = cfd[1];
    return pid;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static msg_t recv_msg(int fd)
{
    msg_t m;
    if (read(fd, &m, sizeof(m)) != sizeof(m)) {
        fprintf(stderr, "connector_bench: a rank died\n");
        exit(1);
    }
    return m;
}

/* One round of kind @c over every rank: returns the measured seconds
 * (layer-wise and whole: decode SUCCESS - last prefill mark; throughput:
 * last SUCCESS - first send). */
static double round_once(const opt_t *o, char c, int *cmd, int nranks, int res)
{
    double t_first = 1e30, t_last = 0, t_done = 0;
    char g = 'g';

    for (int i = 0; i < nranks; i++)
        if (write(cmd[i], &c, 1) != 1)
            exit(1);
    for (uint32_t i = 0; i < o->P; i++)
        if (recv_msg(res).kind != MSG_ANNOUNCED)
            exit(1);
    for (uint32_t i = 0; i < o->P; i++)
        if (write(cmd[i], &g, 1) != 1)
            exit(1);
    for (uint32_t i = 0; i < o->P + o->D; i++) {
        msg_t m = recv_msg(res);
        if (m.kind == MSG_FAIL) {
            fprintf(stderr, "connector_bench: a room failed\n");
            exit(1);
        }
        if (m.kind == MSG_T_LAST) {
            t_first = m.t < t_first ? m.t : t_first;
            t_last = m.t > t_last ? m.t : t_last;
        } else if (m.kind == MSG_T_SUCCESS) {
            t_done = m.t > t_done ? m.t : t_done;
        }
    }
    return t_done - (c == 't' || c == 'r' ? t_first : t_last);
}

static void usage(void)
{
    fprintf(stderr, "usage: kvt_connector_bench [--mode=latency|tp|rooms] "
                    "[--rooms=N] [--layers=N] "
                    "[--kv-heads=N]\n  [--head-bytes=N] [--block-tokens=N] "
                    "[--tokens=N] [--layout=token|head]\n  [--prefill-tp=N] "
                    "[--decode-tp=N] [--compute-ms=X] [--rounds=N] "
                    "[--submit-interval=N]\n  [--workers=N] [--conns=N] "
                    "[--protocol=tcp|auto] [--memory=malloc|managed]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"mode", 1, 0, 'm'},         {"layers", 1, 0, 'L'},
        {"kv-heads", 1, 0, 'H'},     {"head-bytes", 1, 0, 'B'},
        {"block-tokens", 1, 0, 'T'}, {"tokens", 1, 0, 'n'},
        {"layout", 1, 0, 'y'},       {"prefill-tp", 1, 0, 'P'},
        {"decode-tp", 1, 0, 'D'},    {"compute-ms", 1, 0, 'c'},
        {"rounds", 1, 0, 'r'},       {"submit-interval", 1, 0, 'i'},
        {"workers", 1, 0, 'w'},      {"conns", 1, 0, 'C'},
        {"protocol", 1, 0, 'p'},     {"memory", 1, 0, 'M'},
        {"rooms", 1, 0, 'R'},        {0, 0, 0, 0}};
    opt_t o = {.latency = 1,
               .layers = 32,
               .heads = 8,
               .head_bytes = 256,
               .block_tokens = 16,
               .tokens = 2048,
               .P = 1,
               .D = 1,
               .rounds = 7,
               .interval = 1,
               .compute_ms = 10.0};
    int opt, cmd[64], res[2], nranks, ctl;
    pid_t pids[64], boot;
    uint16_t port;
    double *a, *b;
    uint64_t bytes;
    int tokens_set = 0, compute_set = 0;

    while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (opt) {
        case 'm':
            o.latency = strcmp(optarg, "latency") == 0;
            o.rooms_mode = strcmp(optarg, "rooms") == 0;
            if (!o.latency && !o.rooms_mode && strcmp(optarg, "tp") != 0)
                usage();
            break;
        case 'R':
            o.rooms = (uint32_t)atoi(optarg);
            break;
        case 'L':
            o.layers = (uint32_t)atoi(optarg);
            break;
        case 'H':
            o.heads = (uint32_t)atoi(optarg);
            break;
        case 'B':
            o.head_bytes = (uint32_t)atoi(optarg);
            break;
        case 'T':
            o.block_tokens = (uint32_t)atoi(optarg);
            break;
        case 'n':
            o.tokens = (uint32_t)atoi(optarg);
            tokens_set = 1;
            break;
        case 'y':
            o.head_major = strcmp(optarg, "head") == 0;
            break;
        case 'P':
            o.P = (uint32_t)atoi(optarg);
            break;
        case 'D':
            o.D = (uint32_t)atoi(optarg);
            break;
        case 'c':
            o.compute_ms = atof(optarg);
            compute_set = 1;
            break;
        case 'r':
            o.rounds = (uint32_t)atoi(optarg);
            break;
        case 'i':
            o.interval = (uint32_t)atoi(optarg);
            break;
        case 'w':
            o.workers = (uint32_t)atoi(optarg);
            break;
        case 'C':
            o.conns = (uint32_t)atoi(optarg);
            break;
        case 'p':
            o.tcp_only = strcmp(optarg, "tcp") == 0;
            break;
        case 'M':
            o.managed = strcmp(optarg, "managed") == 0;
            break;
        default:
            usage();
        }
    }
    if (o.rooms_mode) {
        if (!tokens_set)
            o.tokens = 64;
        if (!compute_set)
            o.compute_ms = 0.05;
        if (o.rooms == 0)
            o.rooms = 256;
    }
    if (o.tokens == 0 || o.block_tokens == 0 || o.rooms > 65536 ||
        (o.rooms_mode && o.rooms == 0))
        usage();
    if (o.layers == 0 || o.P == 0 || o.D == 0 || o.P + o.D > 32 ||
        o.rounds == 0 || o.heads % o.P || o.heads % o.D)
        usage();
    boot = boot_start(&port, &ctl);
    if (pipe(res) != 0)
        return 1;
    nranks = (int)(o.P + o.D);
    for (int i = 0; i < nranks; i++) {
        int cp[2];
        if (pipe(cp) != 0)
            return 1;
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] == 0) {
            close(cp[1]);
            close(res[0]);
            exit(rank_main(&o, i < (int)o.P,
                           (uint32_t)(i < (int)o.P ? i : i - (int)o.P), port,
                           cp[0], res[1]));
        }
        close(cp[0]);
        cmd[i] = cp[1];
    }
    close(res[1]);
    for (int i = 0; i < nranks; i++)
        if (recv_msg(res[0]).kind != MSG_READY)
            return 1;

    a = calloc(o.rounds, sizeof(double));
    b = calloc(o.rounds, sizeof(double));
    bytes = 2ull * o.layers *
            ((o.tokens + o.block_tokens - 1) / o.block_tokens) *
            o.block_tokens * o.heads * o.head_bytes;
    /* A warm-up round opens every session and warms the caches. */
    if (o.rooms_mode) {
        uint32_t nb = (o.tokens + o.block_tokens - 1) / o.block_tokens;
        bytes = 0;
        for (uint32_t i = 0; i < o.rooms; i++)
            bytes += 2ull * o.layers * room_blocks(i, nb) * o.block_tokens *
                     o.heads * o.head_bytes;
    }
    round_once(&o,
               o.latency      ? 'w'
               : o.rooms_mode ? 'r'
                              : 't',
               cmd, nranks, res[0]);
    for (uint32_t i = 0; i < o.rounds; i++) {
        if (o.rooms_mode) {
            a[i] = round_once(&o, 'r', cmd, nranks, res[0]);
        } else if (o.latency) {
            a[i] = round_once(&o, 'l', cmd, nranks, res[0]);
            b[i] = round_once(&o, 'w', cmd, nranks, res[0]);
        } else {
            a[i] = round_once(&o, 't', cmd, nranks, res[0]);
        }
    }
    if (o.latency) {
        double lw = median(a, o.rounds) * 1e3, wh = median(b, o.rounds) * 1e3;
        printf("mode=latency protocol=%s prefill_tp=%u decode_tp=%u layers=%u "
               "bytes_per_layer=%llu compute_ms_per_layer=%.2f "
               "layerwise_ms=%.3f whole_ms=%.3f layer_transfer_ms=%.3f "
               "bound_ms=%.3f\n",
               o.tcp_only ? "tcp" : "auto", o.P, o.D, o.layers,
               (unsigned long long)(bytes / o.layers), o.compute_ms, lw, wh,
               wh / o.layers, wh / o.layers + 2.0);
    } else if (o.rooms_mode) {
        double t = 0;
        for (uint32_t i = 0; i < o.rounds; i++)
            t += a[i];
        printf("mode=rooms protocol=%s memory=%s prefill_tp=%u decode_tp=%u "
               "layout=%s rooms=%u max_tokens=%u block_bytes=%llu "
               "compute_ms_per_layer=%.3f rounds=%u bytes=%llu ms=%.3f "
               "gbps=%.3f\n",
               o.tcp_only ? "tcp" : "auto", o.managed ? "managed" : "malloc",
               o.P, o.D, o.head_major ? "head" : "token", o.rooms, o.tokens,
               (unsigned long long)((uint64_t)o.block_tokens * o.heads / o.P *
                                    o.head_bytes),
               o.compute_ms, o.rounds, (unsigned long long)(bytes * o.rounds),
               t * 1e3, (double)bytes * o.rounds / t / 1e9);
    } else {
        double t = median(a, o.rounds);
        printf("mode=tp protocol=%s memory=%s prefill_tp=%u decode_tp=%u "
               "layout=%s bytes=%llu ms=%.3f gbps=%.3f\n",
               o.tcp_only ? "tcp" : "auto", o.managed ? "managed" : "malloc",
               o.P, o.D, o.head_major ? "head" : "token",
               (unsigned long long)bytes, t * 1e3, (double)bytes / t / 1e9);
    }
    for (int i = 0; i < nranks; i++) {
        char q = 'q';
        if (write(cmd[i], &q, 1) != 1)
            break;
        close(cmd[i]);
    }
    for (int i = 0; i < nranks; i++)
        waitpid(pids[i], NULL, 0);
    close(ctl);
    waitpid(boot, NULL, 0);
    free(a);
    free(b);
    return 0;
}
