/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The soak: long-lived engines under random faults. Four peers, each in
 * its own network namespace behind its own veth pair (netns.h), serve a
 * buffer each; one long-lived initiator runs six rooms at once. A room
 * picks a peer, writes a random set of blocks of its own slot there with
 * fresh bytes, announces them with a notification, reads the whole slot
 * back and compares every page whose last write reported success with
 * what that write sent (pages of a write that failed are unknown until
 * written again with success). Meanwhile faults come one after another
 * on random peers: the link down, random loss (5-20% each way), or every
 * packet from the initiator dropped, for 1-5 s each, then repaired.
 *
 * Time runs in three parts: a first window without faults, faults, and,
 * after 5 s for the last repair to settle, a last window without faults
 * (each window 60 s, or a sixth of a shorter run). The soak fails when
 *  - a page read back differs from what the last write to it that
 *    reported success sent;
 *  - a peer took fewer notifications than were acknowledged to the
 *    initiator, or more than were sent;
 *  - any transfer failed in the last window (everything repaired: every
 *    peer must serve again, with nothing restarted);
 *  - the last window moved less than half as many bytes per second of
 *    CPU used by the engine processes as the first did, or went a
 *    whole second without moving a byte (bytes per CPU second rather
 *    than per second of wall time, so that other work on a shared
 *    machine does not decide it; both are printed);
 *  - an engine process (the initiator, each peer) grew from the end of
 *    the first window to the end of the last: resident memory by more
 *    than 16 MiB (not under sanitizers, whose allocators hold freed
 *    memory; LeakSanitizer checks leaks there), descriptors by more than
 *    2, threads at all;
 *  - a peer died.
 * KVT_SOAK_SECONDS sets the length (default 600, at least 30; CTest stops
 * it at 20 minutes, so run longer ones as build/tests/soak_faults); a
 * line of figures is printed for every window-length of time. Runs as
 * root with ip(8); without iptables or nft, every fault is a link down.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kvt_test.h"
#include "netns.h"

#define MIB (1ull << 20)
#define NPEERS 4
#define NROOMS 6
#define SLOT (4 * MIB) /* a room's part of each peer's buffer */
#define PEER_BUF (NROOMS * SLOT)
#define PAGE 4096
#define PAGES (SLOT / PAGE)
#define PARTS 8 /* a write batch: up to one block in each eighth */
#define READS 4 /* the read-back: the slot in quarters */
#define TIMEOUT_MS 2000
#define CONNECT_MS 1000
#define RSS_SLACK_KB (16 * 1024)
#define FD_SLACK 2
#define MIN_TPUT_RATIO 0.5

static netns_world_t g_world;

static struct {
    kvt_engine_h e;
    char name[NPEERS + 1][64];
    double t0, duration, window;
    atomic_int stop;
    atomic_ullong *bucket; /* bytes moved with success, per second */
    atomic_ullong peer_bytes[NPEERS + 1];
    int nbuckets;
    atomic_ullong rooms, rooms_failed, open_failed, verified, bad_words;
    atomic_ullong desc_failed[32]; /* by -status */
    atomic_ullong notes_ok[NPEERS + 1], notes_sent[NPEERS + 1];
    atomic_ullong failed_late; /* transfers failed in the last window */
} S;

typedef struct {
    int id;
    pthread_t th;
    uint64_t rng;
    uint8_t *src, *ver;
    uint8_t *shadow[NPEERS + 1], *known[NPEERS + 1];
} room_t;

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void account(int k, uint64_t bytes)
{
    int i = (int)(netns_now() - S.t0);

    atomic_fetch_add(&S.peer_bytes[k], bytes);
    if (i >= 0 && i < S.nbuckets)
        atomic_fetch_add(&S.bucket[i], bytes);
}

static int in_last_window(void)
{
    return netns_now() - S.t0 >= S.duration - S.window;
}

static void failed(kvt_status_t st)
{
    int i = -(int)st;

    atomic_fetch_add(&S.desc_failed[i > 0 && i < 32 ? i : 0], 1);
    if (in_last_window()) {
        if (atomic_fetch_add(&S.failed_late, 1) < 5)
            fprintf(stderr, "late failure at %.1f s: %s\n", netns_now() - S.t0,
                    kvt_status_name(st));
    }
}

/* One room: write, announce, read back, compare. */
static void room_once(room_t *r, kvt_batch_h b, uint64_t serial)
{
    int k = 1 + (int)(rnd(&r->rng) % NPEERS);
    kvt_xfer_desc_t d[PARTS];
    uint64_t off[PARTS], len[PARTS], raddr;
    kvt_remote_region_t reg;
    kvt_segment_t seg;
    kvt_status_t st;
    size_t n = 0, nreg = 0;
    int all_ok = 1;
    char msg[64];

    st = kvt_segment_open(S.e, S.name[k], &seg);
    if (st == KVT_OK)
        st = kvt_segment_regions(S.e, seg, 0, &reg, 1, &nreg);
    if (st != KVT_OK || nreg != 1) {
        atomic_fetch_add(&S.open_failed, 1);
        if (in_last_window())
            failed(st);
        usleep(20000);
        return;
    }
    raddr = reg.addr + (uint64_t)r->id * SLOT;

    memset(d, 0, sizeof(d));
    for (int j = 0; j < PARTS; j++) {
        uint64_t part = SLOT / PARTS, pages = part / PAGE, l, o;
        if (rnd(&r->rng) % 4 == 0)
            continue;
        l = 1 + rnd(&r->rng) % pages;
        o = j * part + (rnd(&r->rng) % (pages - l + 1)) * PAGE;
        off[n] = o;
        len[n] = l * PAGE;
        netns_fill(r->src + o, l * PAGE, serial, o);
        d[n].opcode = KVT_OP_WRITE;
        d[n].segment = seg;
        d[n].local_addr = r->src + o;
        d[n].remote_addr = raddr + o;
        d[n].length = l * PAGE;
        n++;
    }
    if (n > 0) {
        CHECK_OK(kvt_batch_submit(b, d, n));
        kvt_batch_wait(b, -1);
        for (size_t j = 0; j < n; j++) {
            uint64_t p0 = off[j] / PAGE, np = len[j] / PAGE;
            st = kvt_batch_entry(b, j, NULL);
            if (st == KVT_OK) {
                memcpy(r->shadow[k] + off[j], r->src + off[j], len[j]);
                memset(r->known[k] + p0, 1, np);
                account(k, len[j]);
            } else {
                memset(r->known[k] + p0, 0, np);
                failed(st);
                all_ok = 0;
            }
        }
        CHECK_OK(kvt_batch_reset(b));
    }
    if (all_ok) {
        int m = snprintf(msg, sizeof(msg), "room %d serial %llu", r->id,
                         (unsigned long long)serial);
        atomic_fetch_add(&S.notes_sent[k], 1);
        st = kvt_notify_send(S.e, seg, msg, (size_t)m);
        if (st == KVT_OK)
            atomic_fetch_add(&S.notes_ok[k], 1);
        else
            failed(st);
    }

    memset(d, 0, sizeof(d));
    for (int j = 0; j < READS; j++) {
        d[j].opcode = KVT_OP_READ;
        d[j].segment = seg;
        d[j].local_addr = r->ver + (uint64_t)j * (SLOT / READS);
        d[j].remote_addr = raddr + (uint64_t)j * (SLOT / READS);
        d[j].length = SLOT / READS;
    }
    CHECK_OK(kvt_batch_submit(b, d, READS));
    kvt_batch_wait(b, -1);
    for (int j = 0; j < READS; j++) {
        uint64_t p0 = (uint64_t)j * (PAGES / READS);
        st = kvt_batch_entry(b, (size_t)j, NULL);
        if (st != KVT_OK) {
            failed(st);
            all_ok = 0;
            continue;
        }
        account(k, SLOT / READS);
        for (uint64_t p = p0; p < p0 + PAGES / READS; p++) {
            if (!r->known[k][p])
                continue;
            if (memcmp(r->ver + p * PAGE, r->shadow[k] + p * PAGE, PAGE) != 0) {
                uint64_t bad = 0;
                for (int w = 0; w < PAGE / 8; w++)
                    bad += ((uint64_t *)(r->ver + p * PAGE))[w] !=
                           ((uint64_t *)(r->shadow[k] + p * PAGE))[w];
                if (atomic_fetch_add(&S.bad_words, bad) == 0)
                    fprintf(stderr,
                            "room %d peer %d page %llu: %llu words differ "
                            "(at %.1f s)\n",
                            r->id, k, (unsigned long long)p,
                            (unsigned long long)bad, netns_now() - S.t0);
            }
            atomic_fetch_add(&S.verified, PAGE);
        }
    }
    CHECK_OK(kvt_batch_reset(b));
    atomic_fetch_add(all_ok ? &S.rooms : &S.rooms_failed, 1);
}

static atomic_ullong g_serial = 1;

static void *room_main(void *arg)
{
    room_t *r = arg;
    kvt_batch_h b;

    CHECK_OK(kvt_batch_create(S.e, PARTS + READS, &b));
    while (!atomic_load(&S.stop))
        room_once(r, b, atomic_fetch_add(&g_serial, 1));
    CHECK_OK(kvt_batch_free(b));
    return NULL;
}

/* ---- Faults ----------------------------------------------------------- */

typedef struct {
    int link, loss, blackhole;
} fault_counts_t;

static void sleep_until(double t)
{
    double now;
    while ((now = netns_now()) < t)
        usleep((useconds_t)((t - now > 0.1 ? 0.1 : t - now) * 1e6));
}

/* One fault on a random peer, held for 1-5 s (never past @end), then
 * repaired. */
static void one_fault(uint64_t *rng, double end, fault_counts_t *fc)
{
    int k = 1 + (int)(rnd(rng) % NPEERS), kind = (int)(rnd(rng) % 3);
    double hold = 1 + (double)(rnd(rng) % 4000) / 1000.0;
    double p = 0.05 + (double)(rnd(rng) % 16) / 100.0;

    if (netns_now() + hold > end)
        hold = end - netns_now();
    if (hold <= 0)
        return;
    if (g_world.filter[0] == '\0')
        kind = 0;
    switch (kind) {
    case 0:
        CHECK(netns_link(&g_world, k, 0) == 0);
        fc->link++;
        break;
    case 1:
        CHECK(netns_loss(&g_world, k, p) == 0);
        fc->loss++;
        break;
    default:
        CHECK(netns_blackhole(&g_world, k) == 0);
        fc->blackhole++;
        break;
    }
    sleep_until(netns_now() + hold);
    CHECK(netns_repair(&g_world, k) == 0);
}

/* ---- Resources -------------------------------------------------------- */

static void usage_all(netns_usage_t *u)
{
    CHECK(netns_usage(getpid(), &u[0]) == 0);
    for (int k = 1; k <= NPEERS; k++) {
        CHECK(waitpid(g_world.peer_pid[k], NULL, WNOHANG) == 0);
        CHECK(netns_usage(g_world.peer_pid[k], &u[k]) == 0);
    }
}

static double cpu_sum(const netns_usage_t *u)
{
    double c = 0;
    for (int k = 0; k <= NPEERS; k++)
        c += u[k].cpu_s;
    return c;
}

static double window_mbps(double from, double to)
{
    unsigned long long sum = 0;
    for (int i = (int)from; i < (int)to && i < S.nbuckets; i++)
        sum += atomic_load(&S.bucket[i]);
    return (double)sum / (to - from) / 1e6;
}

static void report(double t, const netns_usage_t *u, const fault_counts_t *fc)
{
    long rss = 0, fds = 0, thr = 0;

    for (int k = 1; k <= NPEERS; k++) {
        rss = u[k].rss_kb > rss ? u[k].rss_kb : rss;
        fds = u[k].fds > fds ? u[k].fds : fds;
        thr = u[k].threads > thr ? u[k].threads : thr;
    }
    printf("soak %4.0f s: %6.0f MB/s over the last %.0f s; rooms %llu ok, "
           "%llu failed; faults %d link, %d loss, %d blackhole; initiator "
           "%ld MiB %ld fds %ld threads; peers (max) %ld MiB %ld fds %ld "
           "threads\n",
           t, window_mbps(t - S.window > 0 ? t - S.window : 0, t), S.window,
           (unsigned long long)atomic_load(&S.rooms),
           (unsigned long long)atomic_load(&S.rooms_failed), fc->link, fc->loss,
           fc->blackhole, u[0].rss_kb / 1024, u[0].fds, u[0].threads,
           rss / 1024, fds, thr);
    {
        static unsigned long long before[NPEERS + 1];
        static double t_before;
        printf("           per peer MB/s:");
        for (int k = 1; k <= NPEERS; k++) {
            unsigned long long b = atomic_load(&S.peer_bytes[k]);
            printf(" %.0f", (double)(b - before[k]) / (t - t_before) / 1e6);
            before[k] = b;
        }
        printf("\n");
        t_before = t;
    }
}

static int grew(const char *who, const netns_usage_t *a, const netns_usage_t *b)
{
    /* Under sanitizers memory is not freed when the program frees it
     * (ASan's quarantine holds up to 256 MiB): LeakSanitizer checks it
     * there instead. */
    int rss_bad =
        kvt_test_slowdown() == 1.0 && b->rss_kb > a->rss_kb + RSS_SLACK_KB;
    int bad = rss_bad || b->fds > a->fds + FD_SLACK || b->threads > a->threads;

    printf("  %-9s rss %ld -> %ld KiB, fds %ld -> %ld, threads %ld -> %ld%s\n",
           who, a->rss_kb, b->rss_kb, a->fds, b->fds, a->threads, b->threads,
           bad ? "  GREW" : "");
    return bad;
}

/* The length asked for, in seconds. */
static double soak_seconds(void)
{
    const char *env = getenv("KVT_SOAK_SECONDS");
    double d = env ? atof(env) : 600;

    return d < 30 ? 30 : d;
}

KVT_TEST(soak)
{
    kvt_engine_params_t p = {0};
    room_t rooms[NROOMS];
    netns_usage_t start[NPEERS + 1], first[NPEERS + 1], last_start[NPEERS + 1],
        last[NPEERS + 1];
    fault_counts_t fc = {0};
    uint64_t rng = 0x5eed ^ (uint64_t)getpid();
    double faults_from, faults_to, next_report, t1, t2, e1, e2, c1, c2;
    int stalls = 0;
    int bad = 0;
    unsigned long long failed_total = 0;

    S.duration = soak_seconds();
    S.window = S.duration / 6 < 60 ? S.duration / 6 : 60;
    S.nbuckets = (int)S.duration + 16;
    S.bucket = calloc((size_t)S.nbuckets, sizeof(*S.bucket));
    CHECK(S.bucket != NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != g_world.owner)
        exit(1);

    CHECK(netns_peers_start(&g_world, PEER_BUF) == 0);
    CHECK(netns_enter(&g_world, 0) == 0);
    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS |
                   KVT_ENGINE_PARAM_TRANSFER_TIMEOUT |
                   KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
    p.transports = KVT_TRANSPORT_TCP;
    p.transfer_timeout_ms = (uint64_t)(TIMEOUT_MS * kvt_test_slowdown());
    p.connect_timeout_ms = CONNECT_MS;
    CHECK_OK(kvt_engine_create(&p, &S.e));
    for (int k = 1; k <= NPEERS; k++)
        netns_peer_name(&g_world, k, S.name[k], sizeof(S.name[k]));
    for (int i = 0; i < NROOMS; i++) {
        room_t *r = &rooms[i];
        void *m;
        memset(r, 0, sizeof(*r));
        r->id = i;
        r->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ rng;
        CHECK_OK(kvt_mem_alloc(S.e, SLOT, KVT_ACCESS_REMOTE_RW, &m));
        r->src = memset(m, 0, SLOT);
        CHECK_OK(kvt_mem_alloc(S.e, SLOT, KVT_ACCESS_REMOTE_RW, &m));
        r->ver = memset(m, 0, SLOT);
        for (int k = 1; k <= NPEERS; k++) {
            r->shadow[k] = calloc(1, SLOT);
            r->known[k] = calloc(1, PAGES);
            CHECK(r->shadow[k] != NULL && r->known[k] != NULL);
            memset(r->shadow[k], 0, SLOT);
        }
    }

    usage_all(start);
    S.t0 = netns_now();
    for (int i = 0; i < NROOMS; i++)
        CHECK(pthread_create(&rooms[i].th, NULL, room_main, &rooms[i]) == 0);
    faults_from = S.window;
    faults_to = S.duration - S.window - 5;
    next_report = S.window;
    printf("soak: %.0f s, %d peers, %d rooms; first window [0, %.0f) s, "
           "faults [%.0f, %.0f) s, last window [%.0f, %.0f) s\n",
           S.duration, NPEERS, NROOMS, S.window, faults_from, faults_to,
           S.duration - S.window, S.duration);

    sleep_until(S.t0 + S.window);
    usage_all(first);
    report(S.window, first, &fc);
    next_report += S.window;
    while (netns_now() - S.t0 < faults_to) {
        one_fault(&rng, S.t0 + faults_to, &fc);
        sleep_until(netns_now() + 0.5 + (double)(rnd(&rng) % 2500) / 1000.0);
        if (netns_now() - S.t0 >= next_report) {
            netns_usage_t u[NPEERS + 1];
            usage_all(u);
            report(next_report, u, &fc);
            next_report += S.window;
        }
    }
    for (int k = 1; k <= NPEERS; k++)
        CHECK(netns_repair(&g_world, k) == 0);
    sleep_until(S.t0 + S.duration - S.window);
    usage_all(last_start);
    sleep_until(S.t0 + S.duration);
    usage_all(last);
    atomic_store(&S.stop, 1);
    report(S.duration, last, &fc);
    for (int i = 0; i < NROOMS; i++)
        pthread_join(rooms[i].th, NULL);

    /* Throughput in each window, and the bytes moved per second of CPU
     * the engine processes used then: on a shared machine the first
     * follows everybody else's load as much as kvt's, the second is
     * kvt's own. A second of the last window with nothing moved is a
     * stall. */
    t1 = window_mbps(0, S.window);
    t2 = window_mbps(S.duration - S.window, S.duration);
    c1 = cpu_sum(first) - cpu_sum(start);
    c2 = cpu_sum(last) - cpu_sum(last_start);
    e1 = t1 * S.window / c1;
    e2 = t2 * S.window / c2;
    for (int i = (int)(S.duration - S.window); i < (int)S.duration; i++)
        stalls += atomic_load(&S.bucket[i]) == 0;
    kvt_engine_destroy(S.e);
    netns_peers_stop(&g_world);
    for (int i = 0; i < NROOMS; i++)
        for (int k = 1; k <= NPEERS; k++) {
            free(rooms[i].shadow[k]);
            free(rooms[i].known[k]);
        }

    for (int i = 0; i < 32; i++) {
        unsigned long long c = atomic_load(&S.desc_failed[i]);
        if (c == 0)
            continue;
        failed_total += c;
        printf("  failed with %s: %llu\n",
               i == 0 ? "(other)" : kvt_status_name((kvt_status_t)-i), c);
    }
    printf("soak: rooms %llu ok, %llu failed, %llu opens failed; "
           "%llu descriptors failed; %.1f GB verified, %llu words differ\n",
           (unsigned long long)atomic_load(&S.rooms),
           (unsigned long long)atomic_load(&S.rooms_failed),
           (unsigned long long)atomic_load(&S.open_failed), failed_total,
           (double)atomic_load(&S.verified) / 1e9,
           (unsigned long long)atomic_load(&S.bad_words));
    printf("soak: throughput first window %.0f MB/s, last %.0f MB/s (ratio "
           "%.2f); per CPU second %.0f MB, %.0f MB (ratio %.2f, bound >= "
           "%.2f; CPU used %.1f s, %.1f s); %d seconds of the last window "
           "without a byte; %llu failures in the last window\n",
           t1, t2, t2 / t1, e1, e2, e2 / e1, MIN_TPUT_RATIO, c1, c2, stalls,
           (unsigned long long)atomic_load(&S.failed_late));
    for (int k = 1; k <= NPEERS; k++) {
        unsigned long long ok = atomic_load(&S.notes_ok[k]),
                           sent = atomic_load(&S.notes_sent[k]);
        printf("  peer %d: notifications %llu acknowledged, %llu sent, "
               "%llu taken; exit %s\n",
               k, ok, sent, (unsigned long long)g_world.peer_notes[k],
               WIFEXITED(g_world.peer_status[k]) &&
                       WEXITSTATUS(g_world.peer_status[k]) == 0
                   ? "ok"
                   : "FAILED");
        bad |= g_world.peer_notes[k] < ok || g_world.peer_notes[k] > sent;
        bad |= !WIFEXITED(g_world.peer_status[k]) ||
               WEXITSTATUS(g_world.peer_status[k]) != 0;
    }
    printf("soak: from the end of the first window to the end of the last "
           "(bounds: rss +%d KiB, fds +%d, threads +0):\n",
           RSS_SLACK_KB, FD_SLACK);
    bad |= grew("initiator", &first[0], &last[0]);
    for (int k = 1; k <= NPEERS; k++) {
        char who[16];
        snprintf(who, sizeof(who), "peer %d", k);
        bad |= grew(who, &first[k], &last[k]);
    }
    free(S.bucket);
    CHECK(atomic_load(&S.bad_words) == 0);
    CHECK(atomic_load(&S.verified) > 0);
    CHECK(atomic_load(&S.failed_late) == 0);
    CHECK(fc.link + fc.loss + fc.blackhole > 0);
    CHECK(e2 >= MIN_TPUT_RATIO * e1);
    CHECK(stalls == 0);
    CHECK(!bad);
}

int main(int argc, char **argv)
{
    kvt_test_case_t cases[] = {
        KVT_CASE(soak, (int)soak_seconds() + 300),
    };
    int rc;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--list") == 0)
            return kvt_test_main(cases, 1, argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    rc = netns_world_create(&g_world, NPEERS);
    if (rc != 0)
        return rc;
    rc = kvt_test_main(cases, 1, argc, argv);
    netns_world_destroy(&g_world);
    return rc;
}
