/* SPDX-License-Identifier: Apache-2.0 */
/*
 * First contact with many device regions of a same-host target (shm):
 * a target in another process registers 160 device regions (vLLM
 * registers K and V per layer), each its own allocation or all inside
 * one (and 300, more than one exchange asks for); one batch here writes
 * to and reads from every one of them. Every byte must land, nothing
 * may be staged through the target (its warning is counted in kvt's
 * log, caught with a log handler), the driver (the test double) must
 * import each allocation once, and the openings must be asked for in
 * one exchange on the socket (a debug line of kvt's per exchange,
 * counted). The openings are then kept across batches and closed as
 * their regions are unregistered. With a target whose driver refuses
 * every export, all of it is staged, the refusals taken in one exchange
 * too; with a stopped target, the batch times out.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "double.h"
#include "kvt_test.h"
#include "xfer_test.h"
#include "transport/peer.h"

/* The target's regions, at most (160, as vLLM registers for 80 layers;
 * 300, past what one exchange asks for), and their size. */
enum { NREG = 300, RLEN = 4096, HALF = RLEN / 2 };

/* ---- The target's side: commands of the peer (tests/transport/peer.c) */

static uint64_t g_reg[NREG];
static unsigned g_nreg;

static int fill_region(unsigned i, uint64_t seed)
{
    uint8_t buf[RLEN];

    pattern_fill(buf, RLEN, seed, 0);
    return devmem_copy((void *)(uintptr_t)g_reg[i], buf, RLEN);
}

/* Bytes of [off, +len) of region @i that differ from pattern @seed. */
static uint64_t check_region(unsigned i, uint64_t off, uint64_t len,
                             uint64_t seed)
{
    uint8_t buf[RLEN];

    if (off + len > RLEN ||
        devmem_copy(buf, (uint8_t *)(uintptr_t)g_reg[i] + off, len) != 0)
        return len + 1;
    return pattern_check(buf, len, seed, off);
}

/*
 * "dalloc N LEN": N device regions of LEN bytes, each its own allocation;
 * "dsplit N LEN": N regions back to back in one allocation; both reply
 * with a status. "daddr I": region I's address. "dfill SEED": region I
 * filled with pattern SEED + I; "dcheck OFF LEN SEED": the bytes of
 * [OFF, +LEN) of every region I that differ from pattern SEED + I.
 * "dunreg FROM TO": regions [FROM, TO) unregistered.
 */
static int dev_cmd(kvt_engine_h e, const char *line, char *out, size_t cap)
{
    unsigned long long a, b, c;
    int st = KVT_OK;

    if (sscanf(line, "dalloc %llu %llu", &a, &b) == 2 ||
        sscanf(line, "dsplit %llu %llu", &a, &b) == 2) {
        int split = line[1] == 's';
        uint8_t *one = split ? devmem_alloc(a * b, 0) : NULL;
        for (unsigned long long i = 0; i < a && st == KVT_OK; i++) {
            uint8_t *p = split ? one + i * b : devmem_alloc(b, 0);
            if (p == NULL || g_nreg == NREG) {
                st = KVT_ERR_NO_MEMORY;
                break;
            }
            st = kvt_mem_register(e, p, b, KVT_ACCESS_REMOTE_RW);
            g_reg[g_nreg++] = (uint64_t)(uintptr_t)p;
        }
        snprintf(out, cap, "%d", st);
    } else if (sscanf(line, "daddr %llu", &a) == 1) {
        snprintf(out, cap, "%llu",
                 a < g_nreg ? (unsigned long long)g_reg[a] : 0ull);
    } else if (sscanf(line, "dfill %llu", &a) == 1) {
        for (unsigned i = 0; i < g_nreg && st == 0; i++)
            st = fill_region(i, a + i);
        snprintf(out, cap, "%d", st);
    } else if (sscanf(line, "dcheck %llu %llu %llu", &a, &b, &c) == 3) {
        unsigned long long bad = 0;
        for (unsigned i = 0; i < g_nreg; i++)
            bad += check_region(i, a, b, c + i);
        snprintf(out, cap, "%llu", bad);
    } else if (sscanf(line, "dunreg %llu %llu", &a, &b) == 2) {
        for (unsigned long long i = a; i < b && i < g_nreg && st == KVT_OK; i++)
            st = kvt_mem_unregister(e, (void *)(uintptr_t)g_reg[i]);
        snprintf(out, cap, "%d", st);
    } else {
        return 0;
    }
    return 1;
}

/* Before peer.c's constructor, which serves an exec'd peer. */
__attribute__((constructor(101))) static void hook_set(void)
{
    peer_cmd_hook = dev_cmd;
}

/* ---- Kvt's log here ----------------------------------------------------- */

/* Lines of kvt's log in this process: the warning that device memory is
 * staged, exchanges of IPC requests (and the regions they asked for),
 * allocations opened through the driver. */
static _Atomic long n_staged, n_asks, n_asked, n_opened;

static void log_cb(void *arg, kvt_log_level_t level, const char *file, int line,
                   const char *msg)
{
    unsigned n;

    (void)arg;
    if (strstr(msg, "cannot be opened") != NULL)
        n_staged++;
    if (sscanf(msg, "shm: %u device regions of", &n) == 1 &&
        strstr(msg, "in one exchange") != NULL) {
        n_asks++;
        n_asked += n;
    }
    if (strstr(msg, "opened device allocation") != NULL)
        n_opened++;
    if (level <= KVT_LOG_LEVEL_WARN)
        fprintf(stderr, "log: %s:%d: %s\n", file, line, msg);
}

/* ---- The initiator's side ------------------------------------------------ */

static long (*ipc_opens)(void), (*ipc_live)(void);

/* A peer's reply "0" (a status, or no bytes wrong). */
static int zero(const char *r)
{
    return r != NULL && strcmp(r, "0") == 0;
}

/*
 * One batch: the first half of each of the @n regions written (pattern
 * 200 + i here), the second half read (pattern @seed + i there) into the
 * second half of this side's slice i; every byte checked on both sides.
 */
static void batch_all(peer_t *p, kvt_engine_h e, kvt_segment_t seg,
                      uint8_t *dev, const uint64_t *ra, unsigned n,
                      uint64_t seed, double *ms_p)
{
    static kvt_xfer_desc_t d[2 * NREG];
    static uint8_t host[NREG * RLEN];
    double t0;

    for (unsigned i = 0; i < n; i++) {
        pattern_fill(host + (size_t)i * RLEN, HALF, 200 + i, 0);
        memset(host + (size_t)i * RLEN + HALF, 0, HALF);
    }
    CHECK(devmem_copy(dev, host, (size_t)n * RLEN) == 0);
    for (unsigned i = 0; i < n; i++) {
        uint8_t *l = dev + (size_t)i * RLEN;
        d[i] = kvt_test_xd(KVT_OP_WRITE, seg, l, ra[i], HALF);
        d[n + i] = kvt_test_xd(KVT_OP_READ, seg, l + HALF, ra[i] + HALF, HALF);
    }
    t0 = kvt_test_now();
    CHECK_OK(kvt_test_xfer(e, d, 2 * n));
    *ms_p = (kvt_test_now() - t0) * 1e3;
    CHECK(zero(peer_cmd(p, "dcheck 0 %d 200", HALF)));
    CHECK(devmem_copy(host, dev, (size_t)n * RLEN) == 0);
    for (unsigned i = 0; i < n; i++)
        CHECK(pattern_check(host + (size_t)i * RLEN + HALF, HALF, seed + i,
                            HALF) == 0);
}

/* A target with @n device regions (fx.ra) and an engine here (timeout
 * @timeout_ms; 0: the default) with its segment open and @n slices of
 * device memory registered. */
typedef struct {
    peer_t p;
    kvt_engine_h e;
    kvt_segment_t seg;
    uint8_t *dev;
    uint64_t ra[NREG];
} fixture_t;

/* This process numbers the two devices the other way round from the
 * target (CUDA_VISIBLE_DEVICES=1,0 here, 0,1 there). */
static int g_swapped;

static void setup(fixture_t *f, unsigned n, int split, int refused,
                  uint64_t timeout_ms)
{
    peer_opts_t o = {KVT_TRANSPORT_SHM, 0, 0, 0, 1};
    const char *r;
    void *h;

    CHECK(n <= NREG);
    if (g_swapped)
        setenv("KVT_CUDA_DOUBLE_VISIBLE", "1,0", 1); /* read by cuInit */
    double_open();
    unsetenv("KVT_CUDA_DOUBLE_VISIBLE"); /* not the peer's */
    h = dlopen(getenv("KVT_TEST_CUDA_DOUBLE"), RTLD_NOW);
    CHECK(h != NULL);
    *(void **)&ipc_opens = dlsym(h, "kvt_cuda_double_ipc_opens");
    *(void **)&ipc_live = dlsym(h, "kvt_cuda_double_ipc_live");
    CHECK(ipc_opens != NULL && ipc_live != NULL);
    if (refused)
        setenv("KVT_CUDA_DOUBLE_NO_IPC", "1", 1); /* the peer's driver */
    CHECK(peer_start(&f->p, &o) == 0);
    unsetenv("KVT_CUDA_DOUBLE_NO_IPC");
    r = peer_cmd(&f->p, "%s %u %d", split ? "dsplit" : "dalloc", n, RLEN);
    CHECK(r != NULL && atoi(r) == KVT_OK);
    for (unsigned i = 0; i < n; i++) {
        r = peer_cmd(&f->p, "daddr %u", i);
        CHECK(r != NULL && (f->ra[i] = strtoull(r, NULL, 10)) != 0);
    }
    CHECK(zero(peer_cmd(&f->p, "dfill 300")));

    /* The debug lines of this process only (the peer started before). */
    setenv("KVT_LOG", "debug", 1);
    CHECK(kvt_log_enabled(KVT_LOG_LEVEL_DEBUG));
    kvt_log_set_handler(log_cb, NULL);
    f->e = engine_new(KVT_TRANSPORT_SHM, timeout_ms);
    CHECK(f->e != NULL);
    f->dev = devmem_alloc((size_t)n * RLEN, 0);
    CHECK(f->dev != NULL);
    CHECK_OK(
        kvt_mem_register(f->e, f->dev, (size_t)n * RLEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(f->e, f->p.segment, &f->seg));
    CHECK(ipc_live() == 0);
}

static void teardown(fixture_t *f)
{
    kvt_engine_destroy(f->e);
    kvt_log_set_handler(NULL, NULL);
    peer_stop(&f->p);
    devmem_free(f->dev);
}

/*
 * @n regions there (past 256, more than one exchange); @split: inside
 * one allocation; @refused: the target's driver refuses to export any
 * (everything is then staged).
 */
static void many_regions(unsigned n, int split, int refused)
{
    static fixture_t f;
    long opens, allocs = refused ? 0 : split ? 1 : (long)n;
    long xchgs = (long)(n + 255) / 256;
    double ms;

    setup(&f, n, split, refused, 0);
    opens = ipc_opens();

    /* First contact: every region asked for in one exchange (256 at most
     * in one), each allocation opened once. */
    batch_all(&f.p, f.e, f.seg, f.dev, f.ra, n, 300, &ms);
    printf("first contact with %u device regions (%s): %.2f ms\n", n,
           refused ? "refused"
           : split ? "one allocation"
                   : "each its own",
           ms);
    printf("staged warnings %ld, exchanges %ld (regions asked %ld), "
           "imports %ld, opened %ld, open now %ld\n",
           (long)n_staged, (long)n_asks, (long)n_asked, ipc_opens() - opens,
           (long)n_opened, ipc_live());
    CHECK(n_staged == (refused ? 1 : 0));
    CHECK(n_asks == xchgs && n_asked == (long)n);
    CHECK(ipc_opens() - opens == allocs);
    CHECK(n_opened == allocs);
    CHECK(ipc_live() == allocs);

    /* Again: the openings are kept (the refusals too: nothing asked). */
    CHECK(zero(peer_cmd(&f.p, "dfill 500")));
    batch_all(&f.p, f.e, f.seg, f.dev, f.ra, n, 500, &ms);
    printf("again: %.2f ms\n", ms);
    CHECK(n_staged == (refused ? 1 : 0));
    CHECK(n_asks == xchgs && n_opened == allocs);
    CHECK(ipc_opens() - opens == allocs);

    /* Half of the regions unregistered: their openings closed, unless
     * another region still holds the allocation. A new snapshot forgets
     * refusals: the last region is asked for once more. */
    CHECK(zero(peer_cmd(&f.p, "dunreg 0 %u", n / 2)));
    {
        kvt_xfer_desc_t d =
            kvt_test_xd(KVT_OP_WRITE, f.seg, f.dev, f.ra[n - 1], HALF);
        CHECK_OK(kvt_test_xfer(f.e, &d, 1));
    }
    CHECK(ipc_live() == (refused ? 0 : split ? 1 : (long)n / 2));
    CHECK(n_asks == xchgs + refused && n_asked == (long)n + refused);
    CHECK(ipc_opens() - opens == allocs && n_opened == allocs);
    /* All of them: none is left open (host memory there, written for a
     * look at the new snapshot). */
    CHECK(zero(peer_cmd(&f.p, "dunreg %u %u", n / 2, n)));
    {
        kvt_xfer_desc_t d =
            kvt_test_xd(KVT_OP_WRITE, f.seg, f.dev, f.p.wo_addr, HALF);
        CHECK_OK(kvt_test_xfer(f.e, &d, 1));
    }
    CHECK(ipc_live() == 0);

    teardown(&f);
}

/* Past IPC_WANT_MAX (256) regions: two exchanges, one opening. */
KVT_TEST(more_than_one_exchange)
{
    many_regions(300, 1, 0);
}

/*
 * A target stopped (SIGSTOP) before first contact: the exchange waits
 * for its answers until the job's deadline, and the batch times out.
 */
KVT_TEST(stopped_target_times_out)
{
    static fixture_t f;
    static kvt_xfer_desc_t d[160];
    double t0;

    setup(&f, 160, 0, 0, 500);
    for (unsigned i = 0; i < 160; i++)
        d[i] = kvt_test_xd(KVT_OP_WRITE, f.seg, f.dev + (size_t)i * RLEN,
                           f.ra[i], HALF);
    peer_kill(&f.p, SIGSTOP);
    t0 = kvt_test_now();
    CHECK_ST(kvt_test_xfer(f.e, d, 160), KVT_ERR_TIMEDOUT);
    printf("timed out after %.0f ms\n", (kvt_test_now() - t0) * 1e3);
    CHECK(n_asks == 0 && n_opened == 0 && ipc_live() == 0);
    peer_kill(&f.p, SIGCONT);
    teardown(&f);
}

KVT_TEST(many_allocations)
{
    many_regions(160, 0, 0);
}

KVT_TEST(many_regions_one_allocation)
{
    many_regions(160, 1, 0);
}

KVT_TEST(many_refused)
{
    many_regions(160, 0, 1);
}

/*
 * The target's device 0 is this process's device 1: its allocations are
 * opened under the device its answer names by UUID (under ordinal 0 the
 * double refuses them, as a driver without peer access does), none is
 * staged.
 */
KVT_TEST(devices_numbered_otherwise)
{
    g_swapped = 1;
    many_regions(16, 0, 0);
}

KVT_TEST_MAIN(KVT_CASE(many_allocations, 60),
              KVT_CASE(many_regions_one_allocation, 60),
              KVT_CASE(many_refused, 60), KVT_CASE(more_than_one_exchange, 60),
              KVT_CASE(stopped_target_times_out, 60),
              KVT_CASE(devices_numbered_otherwise, 60))
