/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mooncake's C API, end to end, against a libtransfer_engine.so given by
 * path: every call is resolved with dlsym() into a pointer typed from
 * include/kvt/mooncake/transfer_engine_c.h, and two processes (fork, on
 * 127.0.0.1) create P2PHANDSHAKE engines, register memory, open each
 * other's segment, write and read, notify, and meet each error the API
 * names. Checks of kvt's own answers where Mooncake's library would crash
 * or do nothing (a bad batch id, closeSegment, an unregistered source)
 * run only when the library is kvt's.
 *
 *     test_mooncake_c LIBRARY
 *
 * Exit 0 pass, 1 fail, 77 skip (no library at that path).
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_c.h"

#define MC_CALLS(X)                                                            \
    X(createTransferEngine)                                                    \
    X(discoverTopology)                                                        \
    X(getLocalIpAndPort)                                                       \
    X(installTransport)                                                        \
    X(uninstallTransport)                                                      \
    X(openSegment)                                                             \
    X(openSegmentNoCache)                                                      \
    X(closeSegment)                                                            \
    X(warmupEfaSegment)                                                        \
    X(removeLocalSegment)                                                      \
    X(destroyTransferEngine)                                                   \
    X(registerLocalMemory)                                                     \
    X(unregisterLocalMemory)                                                   \
    X(registerLocalMemoryBatch)                                                \
    X(unregisterLocalMemoryBatch)                                              \
    X(allocateBatchID)                                                         \
    X(submitTransfer)                                                          \
    X(submitTransferWithNotify)                                                \
    X(getNotifsFromEngine)                                                     \
    X(freeNotifsMsgBuf)                                                        \
    X(genNotifyInEngine)                                                       \
    X(getTransferStatus)                                                       \
    X(freeBatchID)                                                             \
    X(syncSegmentCache)                                                        \
    X(getNicLoadStats)                                                         \
    X(enableGracefulShutdown)                                                  \
    X(showLinks)

static struct {
#define FIELD(name) __typeof__(&name) name;
    MC_CALLS(FIELD)
#undef FIELD
} mc;

static int is_kvt; /* the library is kvt's (it links libkvt) */

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "[%d] %s:%d: CHECK failed: %s\n", (int)getpid(),   \
                    __FILE__, __LINE__, #cond);                                \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_EQ(expr, want)                                                   \
    do {                                                                       \
        long long got_ = (long long)(expr), want_ = (long long)(want);         \
        if (got_ != want_) {                                                   \
            fprintf(stderr, "[%d] %s:%d: %s is %lld, expected %lld\n",         \
                    (int)getpid(), __FILE__, __LINE__, #expr, got_, want_);    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define BIG ((size_t)64 << 20) /* each side's main buffer */
#define SMALL 4096
#define NSMALL 4

static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char)((i * 131u + seed * 7u + (i >> 12)) & 0xff);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(i, seed);
}

static int holds(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(i, seed))
            return 0;
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Poll task @t of @b until it is final; returns its state. */
static int wait_task(void *e, batch_id_t b, size_t t, uint64_t *bytes_p)
{
    struct transfer_status s = {-1, 0};
    double end = now() + 60;

    do {
        CHECK_EQ(mc.getTransferStatus(e, b, t, &s), MC_STATUS_OK);
        if (s.status != STATUS_WAITING && s.status != STATUS_PENDING)
            break;
        usleep(200);
    } while (now() < end);
    if (bytes_p != NULL)
        *bytes_p = s.transferred_bytes;
    return s.status;
}

static void xread(int fd, void *p, size_t n)
{
    CHECK(read(fd, p, n) == (ssize_t)n);
}

static void xwrite(int fd, const void *p, size_t n)
{
    CHECK(write(fd, p, n) == (ssize_t)n);
}

/* What the target tells the initiator once it is up. */
typedef struct {
    char name[256];
    uint64_t addr;
} hello_t;

/* The target's seeds: its own bytes, and what the initiator writes. */
enum { SEED_TARGET = 3, SEED_WRITE = 11, SEED_NOTIFY = 23 };
#define NOTIFY_OFF ((size_t)32 << 20)

/*
 * The target: serves its buffer, then waits for the two notifications
 * (one after a batch, one alone) and checks that the batch's bytes had
 * landed by then.
 */
static int target(int to_init, int from_init)
{
    unsigned char *buf = malloc(BIG);
    notify_msg_t *got;
    hello_t h = {{0}, 0};
    int n, seen_batch = 0, seen_gen = 0;
    char go;
    double end;
    void *e;

    CHECK(buf != NULL);
    fill(buf, BIG, SEED_TARGET);
    e = mc.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    CHECK(e != NULL);
    CHECK(mc.installTransport(e, "tcp", NULL) != NULL);
    CHECK_EQ(mc.getLocalIpAndPort(e, h.name, sizeof(h.name)), 0);
    CHECK_EQ(mc.registerLocalMemory(e, buf, BIG, "cpu:0", 1), 0);
    h.addr = (uint64_t)(uintptr_t)buf;
    xwrite(to_init, &h, sizeof(h));

    xread(from_init, &go, 1); /* the initiator sent both notifications */
    end = now() + 30;
    while ((!seen_batch || !seen_gen) && now() < end) {
        got = mc.getNotifsFromEngine(e, &n);
        CHECK((got == NULL) == (n == 0));
        for (int i = 0; i < n; i++) {
            if (strcmp(got[i].name, "xfer") == 0) {
                CHECK(strcmp(got[i].msg, "written") == 0);
                /* Sent once the batch completed: its bytes are here. */
                CHECK(holds(buf + NOTIFY_OFF, SMALL, SEED_NOTIFY));
                seen_batch++;
            } else if (strcmp(got[i].name, "gen") == 0) {
                CHECK(strcmp(got[i].msg, "hello") == 0);
                seen_gen++;
            } else {
                fprintf(stderr, "unexpected notification %s/%s\n", got[i].name,
                        got[i].msg);
                CHECK(0);
            }
        }
        CHECK_EQ(mc.freeNotifsMsgBuf(got, n), 0);
        usleep(1000);
    }
    CHECK_EQ(seen_batch, 1);
    CHECK_EQ(seen_gen, 1);
    go = 'k';
    xwrite(to_init, &go, 1);
    xread(from_init, &go, 1); /* the initiator is done with this buffer */
    CHECK_EQ(mc.unregisterLocalMemory(e, buf), 0);
    mc.destroyTransferEngine(e);
    free(buf);
    return 0;
}

/* A port free on 127.0.0.1 just now. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    CHECK(fd >= 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/*
 * A segment id outlives its peer's restart: a peer on a fixed port
 * (MC_LEGACY_RPC_PORT_BINDING) goes away and comes back; the id opened
 * before reaches the new one (a first write may fail while the old
 * session's end is found), as Mooncake's reconnecting ids do.
 */
static void peer_restarts(void *e, unsigned char *src)
{
    unsigned char *dst = calloc(1, SMALL);
    char name[64];
    segment_id_t id;
    int port = free_port(), done = 0;
    void *t;

    CHECK(dst != NULL);
    setenv("MC_LEGACY_RPC_PORT_BINDING", "1", 1);
    snprintf(name, sizeof(name), "127.0.0.1:%d", port);
    t = mc.createTransferEngine("P2PHANDSHAKE", name, "127.0.0.1",
                                (uint64_t)port, 0);
    CHECK(t != NULL);
    CHECK_EQ(mc.registerLocalMemory(t, dst, SMALL, "cpu:0", 1), 0);
    id = mc.openSegment(e, name);
    CHECK(id >= 1);
    mc.destroyTransferEngine(t);
    t = mc.createTransferEngine("P2PHANDSHAKE", name, "127.0.0.1",
                                (uint64_t)port, 0);
    CHECK(t != NULL);
    unsetenv("MC_LEGACY_RPC_PORT_BINDING");
    CHECK_EQ(mc.registerLocalMemory(t, dst, SMALL, "cpu:0", 1), 0);
    for (int tries = 0; tries < 3 && !done; tries++) {
        struct transfer_request r = {OPCODE_WRITE, src, id,
                                     (uint64_t)(uintptr_t)dst, SMALL};
        batch_id_t b = mc.allocateBatchID(e, 1);
        CHECK_EQ(mc.submitTransfer(e, b, &r, 1), MC_STATUS_OK);
        done = wait_task(e, b, 0, NULL) == STATUS_COMPLETED;
        CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);
    }
    CHECK(done);
    CHECK(memcmp(dst, src, SMALL) == 0);
    mc.destroyTransferEngine(t);
    free(dst);
}

static void initiator(int from_target, int to_target)
{
    unsigned char *big = malloc(BIG), *own = malloc(SMALL);
    unsigned char *small[NSMALL], *loose = malloc(SMALL);
    buffer_entry_t entries[NSMALL];
    void *addrs[NSMALL];
    struct transfer_request r[NSMALL + 1];
    struct transfer_status st;
    nic_load_stat_t nic[2];
    size_t nnic = 2;
    char me[256], links[1024], *colon, ok;
    notify_msg_t note;
    hello_t h;
    batch_id_t b;
    segment_id_t peer;
    uint64_t bytes;
    void *e;

    CHECK(big != NULL && own != NULL && loose != NULL);
    e = mc.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    CHECK(e != NULL);
    CHECK(mc.installTransport(e, "tcp", NULL) != NULL);
    CHECK_EQ(mc.getLocalIpAndPort(e, me, sizeof(me)), 0);
    colon = strrchr(me, ':');
    CHECK(colon != NULL && strncmp(me, "127.0.0.1:", 10) == 0 &&
          atoi(colon + 1) > 0);

    /* Memory: one region alone, four in a batch, one own target. */
    CHECK_EQ(mc.registerLocalMemory(e, big, BIG, "cpu:0", 1), 0);
    CHECK_EQ(mc.registerLocalMemory(e, own, SMALL, "*", 1), 0);
    for (int i = 0; i < NSMALL; i++) {
        small[i] = malloc(SMALL);
        CHECK(small[i] != NULL);
        fill(small[i], SMALL, SEED_WRITE + (unsigned)i);
        entries[i].addr = addrs[i] = small[i];
        entries[i].length = SMALL;
    }
    CHECK_EQ(mc.registerLocalMemoryBatch(e, entries, NSMALL, "cpu:0"), 0);
    CHECK_EQ(mc.registerLocalMemory(e, big + 100, 10, "cpu:0", 1),
             MC_ERR_ADDRESS_OVERLAPPED);
    CHECK_EQ(mc.registerLocalMemory(e, loose, 0, "cpu:0", 1),
             MC_ERR_INVALID_ARGUMENT);

    /* The peer's segment: one id per name. */
    xread(from_target, &h, sizeof(h));
    peer = mc.openSegment(e, h.name);
    CHECK(peer >= 1);
    CHECK_EQ(mc.openSegment(e, h.name), peer);
    CHECK_EQ(mc.openSegmentNoCache(e, h.name), peer);
    CHECK_EQ(mc.openSegment(e, me), LOCAL_SEGMENT);
    CHECK_EQ(mc.syncSegmentCache(e), 0);

    /* WRITE four tasks, READ them back with the target's own bytes. */
    b = mc.allocateBatchID(e, NSMALL);
    CHECK(b != INVALID_BATCH);
    for (int i = 0; i < NSMALL; i++)
        r[i] = (struct transfer_request){OPCODE_WRITE, small[i], peer,
                                         h.addr + (uint64_t)i * SMALL, SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, NSMALL), MC_STATUS_OK);
    CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_TOO_MANY_REQUESTS);
    for (size_t i = 0; i < NSMALL; i++) {
        CHECK_EQ(wait_task(e, b, i, &bytes), STATUS_COMPLETED);
        CHECK_EQ(bytes, SMALL);
    }
    CHECK_EQ(mc.getTransferStatus(e, b, NSMALL, &st),
             MC_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);

    memset(big, 0, BIG);
    b = mc.allocateBatchID(e, NSMALL + 1);
    CHECK(b != INVALID_BATCH);
    for (int i = 0; i < NSMALL; i++)
        r[i] = (struct transfer_request){OPCODE_READ, big + (size_t)i * SMALL,
                                         peer, h.addr + (uint64_t)i * SMALL,
                                         SMALL};
    r[NSMALL] = (struct transfer_request){OPCODE_READ, big + BIG / 2, peer,
                                          h.addr + BIG / 2, SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, NSMALL + 1), MC_STATUS_OK);
    for (size_t i = 0; i <= NSMALL; i++)
        CHECK_EQ(wait_task(e, b, i, NULL), STATUS_COMPLETED);
    for (int i = 0; i < NSMALL; i++)
        CHECK(memcmp(big + (size_t)i * SMALL, small[i], SMALL) == 0);
    for (size_t i = 0; i < SMALL; i++)
        CHECK_EQ(big[BIG / 2 + i], pattern(BIG / 2 + i, SEED_TARGET));
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);

    /* LOCAL_SEGMENT: a write into this engine's own memory. */
    b = mc.allocateBatchID(e, 1);
    r[0] = (struct transfer_request){OPCODE_WRITE, small[0], LOCAL_SEGMENT,
                                     (uint64_t)(uintptr_t)own, SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_OK);
    CHECK_EQ(wait_task(e, b, 0, NULL), STATUS_COMPLETED);
    CHECK(memcmp(own, small[0], SMALL) == 0);
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);

    /* freeBatchID() while tasks are in flight: 16 writes of 64 MiB. */
    b = mc.allocateBatchID(e, 16);
    for (int i = 0; i < 16; i++) {
        r[0] = (struct transfer_request){OPCODE_WRITE, big, peer, h.addr, BIG};
        CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_OK);
    }
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_BATCH_BUSY);
    for (size_t i = 0; i < 16; i++)
        CHECK_EQ(wait_task(e, b, i, NULL), STATUS_COMPLETED);
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);
    if (is_kvt) {
        /* The freed id, and ids never given, are refused. */
        CHECK_EQ(mc.getTransferStatus(e, b, 0, &st),
                 MC_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(mc.submitTransfer(e, 0xdeadbeefull, r, 1),
                 MC_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(mc.freeBatchID(e, INVALID_BATCH), MC_STATUS_INVALID_ARGUMENT);
    }

    /* Errors: an unknown segment id, a remote range outside the peer's
     * memory, an unregistered source. */
    b = mc.allocateBatchID(e, 4);
    r[0] =
        (struct transfer_request){OPCODE_WRITE, small[0], 12345, h.addr, SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_INVALID_ARGUMENT);
    r[0] = (struct transfer_request){OPCODE_WRITE, small[0], peer,
                                     h.addr + BIG - SMALL / 2, SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_OK);
    CHECK_EQ(wait_task(e, b, 0, &bytes), STATUS_FAILED);
    CHECK_EQ(bytes, 0);
    r[0] = (struct transfer_request){OPCODE_READ, small[0], peer, h.addr + BIG,
                                     SMALL};
    CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_OK);
    CHECK_EQ(wait_task(e, b, 1, NULL), STATUS_FAILED);
    if (is_kvt) {
        r[0] =
            (struct transfer_request){OPCODE_WRITE, loose, peer, h.addr, SMALL};
        CHECK_EQ(mc.submitTransfer(e, b, r, 1),
                 MC_STATUS_ADDRESS_NOT_REGISTERED);
        CHECK_EQ(wait_task(e, b, 2, NULL), STATUS_FAILED);
    }
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);

    /* Notifications: one after a batch, one alone. */
    fill(small[1], SMALL, SEED_NOTIFY);
    b = mc.allocateBatchID(e, 1);
    r[0] = (struct transfer_request){OPCODE_WRITE, small[1], peer,
                                     h.addr + NOTIFY_OFF, SMALL};
    note = (notify_msg_t){"xfer", "written"};
    CHECK_EQ(mc.submitTransferWithNotify(e, b, r, 1, note), MC_STATUS_OK);
    CHECK_EQ(wait_task(e, b, 0, NULL), STATUS_COMPLETED);
    CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);
    note = (notify_msg_t){"gen", "hello"};
    CHECK_EQ(mc.genNotifyInEngine(e, (uint64_t)peer, note), 0);
    CHECK_EQ(mc.genNotifyInEngine(e, 9999, note), MC_ERR_METADATA);
    ok = 'n';
    xwrite(to_target, &ok, 1);
    xread(from_target, &ok, 1);
    CHECK_EQ(ok, 'k');

    /* The calls kvt serves in its own way, or refuses. */
    CHECK_EQ(mc.getNicLoadStats(e, nic, &nnic), 0);
    CHECK_EQ(mc.warmupEfaSegment(e, h.name), 0);
    CHECK_EQ(mc.uninstallTransport(e, "tcp"), 0);
    mc.enableGracefulShutdown(e);
    if (is_kvt) {
        CHECK_EQ(nnic, 0);
        CHECK_EQ(mc.showLinks(e, links, sizeof(links), 1), 0);
        CHECK(strstr(links, h.name) != NULL);
        CHECK(strstr(links, "\"transport\":\"") != NULL);
        CHECK_EQ(mc.discoverTopology(e), MC_ERR_NOT_IMPLEMENTED);
        CHECK_EQ(mc.removeLocalSegment(e, me), MC_ERR_NOT_IMPLEMENTED);
        CHECK(mc.installTransport(e, "nvmeof", NULL) == NULL);
        CHECK_EQ(mc.getLocalIpAndPort((void *)links, me, sizeof(me)),
                 MC_ERR_INVALID_ARGUMENT);
    }

    /* closeSegment(): the id is gone (kvt) and the name opens anew. */
    CHECK_EQ(mc.closeSegment(e, peer), 0);
    if (is_kvt) {
        b = mc.allocateBatchID(e, 1);
        r[0] = (struct transfer_request){OPCODE_WRITE, small[0], peer, h.addr,
                                         SMALL};
        CHECK_EQ(mc.submitTransfer(e, b, r, 1), MC_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(mc.freeBatchID(e, b), MC_STATUS_OK);
        CHECK_EQ(mc.closeSegment(e, peer), MC_ERR_INVALID_ARGUMENT);
        CHECK(mc.openSegment(e, h.name) > peer);
    }

    peer_restarts(e, small[0]);

    CHECK_EQ(mc.unregisterLocalMemory(e, big), 0);
    CHECK_EQ(mc.unregisterLocalMemory(e, big), MC_ERR_ADDRESS_NOT_REGISTERED);
    CHECK_EQ(mc.unregisterLocalMemory(e, own), 0);
    CHECK_EQ(mc.unregisterLocalMemoryBatch(e, addrs, NSMALL), 0);
    mc.destroyTransferEngine(e);
    if (is_kvt)
        CHECK(mc.allocateBatchID(e, 1) == INVALID_BATCH);
    xwrite(to_target, &ok, 1);
    for (int i = 0; i < NSMALL; i++)
        free(small[i]);
    free(big);
    free(own);
    free(loose);
}

int main(int argc, char **argv)
{
    int up[2], down[2], status;
    void *lib;
    pid_t pid;

    if (argc < 2 || access(argv[1], F_OK) != 0) {
        fprintf(stderr, "skipped: no library at %s\n",
                argc < 2 ? "(none given)" : argv[1]);
        return 77;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
#define RESOLVE(name)                                                          \
    *(void **)&mc.name = dlsym(lib, #name);                                    \
    if (mc.name == NULL) {                                                     \
        fprintf(stderr, "%s does not export %s\n", argv[1], #name);            \
        return 1;                                                              \
    }
    MC_CALLS(RESOLVE)
#undef RESOLVE
    is_kvt = dlsym(lib, "kvt_engine_create") != NULL;
    alarm(150);
    CHECK(pipe(up) == 0 && pipe(down) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(150);
        close(up[0]);
        close(down[1]);
        _exit(target(up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    initiator(up[0], down[1]);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("Mooncake C API scenario passed against %s (%s)\n", argv[1],
           is_kvt ? "kvt" : "not kvt");
    return 0;
}
