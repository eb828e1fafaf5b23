/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Two engines in separate processes find each other through a metadata
 * backend and transfer; a killed engine's entry disappears within its TTL.
 *   test_engines_meta --backend=p2p|http|redis|etcd [case ...]
 * The servers are started by the test on loopback (kvt metad from
 * $KVT_BIN, redis-server, etcd); a missing server binary skips.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvt_test.h"
#include "meta/meta.h"
#include "meta_test.h"

#define BUF_LEN (4u << 20)
#define TTL_S 3

static const char *g_backend = "p2p";
static char g_uri[160] = "p2p";
static pid_t g_server, g_owner;
static char g_datadir[64];

static void server_stop(void);

static void server_start(void)
{
    uint16_t port = mt_free_port();
    char portstr[16];

    /* Whatever ends the case, the server and its files go with it (but
     * not when a forked target exits). */
    g_owner = getpid();
    atexit(server_stop);

    snprintf(portstr, sizeof(portstr), "%u", port);
    if (strcmp(g_backend, "p2p") == 0)
        return;
    if (strcmp(g_backend, "http") == 0) {
        const char *bin = getenv("KVT_BIN");
        char *argv[] = {(char *)bin, "metad", "--host", "127.0.0.1",
                        "--port",    portstr, NULL};
        if (bin == NULL)
            SKIP("KVT_BIN is not set");
        g_server = mt_spawn(argv, NULL);
        snprintf(g_uri, sizeof(g_uri), "http://127.0.0.1:%u", port);
    } else if (strcmp(g_backend, "redis") == 0) {
        char *argv[] = {"redis-server", "--port", portstr, "--bind",
                        "127.0.0.1",    "--save", "",      "--appendonly",
                        "no",           NULL};
        if (!mt_have("redis-server"))
            SKIP("redis-server is not installed");
        g_server = mt_spawn(argv, NULL);
        snprintf(g_uri, sizeof(g_uri), "redis://127.0.0.1:%u", port);
    } else if (strcmp(g_backend, "etcd") == 0) {
        char client[64], peer[64], cluster[80];
        char *argv[] = {"etcd",    "--name",
                        "default", "--data-dir",
                        g_datadir, "--listen-client-urls",
                        client,    "--advertise-client-urls",
                        client,    "--listen-peer-urls",
                        peer,      "--initial-advertise-peer-urls",
                        peer,      "--initial-cluster",
                        cluster,   "--log-level",
                        "error",   NULL};
        if (!mt_have("etcd"))
            SKIP("etcd is not installed");
        strcpy(g_datadir, "/tmp/kvt-etcd-XXXXXX");
        CHECK(mkdtemp(g_datadir) != NULL);
        snprintf(client, sizeof(client), "http://127.0.0.1:%u", port);
        snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", mt_free_port());
        snprintf(cluster, sizeof(cluster), "default=%s", peer);
        g_server = mt_spawn(argv, NULL);
        snprintf(g_uri, sizeof(g_uri), "etcd://127.0.0.1:%u", port);
    } else {
        fprintf(stderr, "unknown backend %s\n", g_backend);
        exit(2);
    }
    CHECK(mt_wait_port(port, g_server, 20000) == 0);
    if (strcmp(g_backend, "etcd") == 0) {
        /* Serving once a leader is elected. */
        for (int i = 0; i < 200; i++) {
            mt_resp_t r;
            int code = mt_http(port, "GET", "/health", NULL, NULL, 0, &r);
            int ok = code == 200 && strstr(r.body, "true") != NULL;
            mt_resp_free(&r);
            if (ok)
                break;
            usleep(50000);
        }
    }
}

static void server_stop(void)
{
    if (getpid() != g_owner)
        return;
    if (g_server > 0)
        mt_stop(g_server, 3000);
    g_server = 0;
    if (g_datadir[0])
        mt_rmdir(g_datadir);
    g_datadir[0] = '\0';
}

static kvt_engine_h engine(const char *name)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;
    p.field_mask = KVT_ENGINE_PARAM_METADATA_URI;
    p.metadata_uri = g_uri;
    if (name != NULL) {
        p.field_mask |= KVT_ENGINE_PARAM_SEGMENT_NAME;
        p.segment_name = name;
    }
    if (kvt_engine_create(&p, &e) == KVT_ERR_NOT_SUPPORTED)
        SKIP("this metadata backend is not built in");
    CHECK(e != NULL);
    return e;
}

/* The target: an engine under its own name, 4 MiB registered; it checks
 * the buffer against a byte value on request. */
static void target_main(int in, int out)
{
    char name[64], line[64];
    kvt_engine_h e;
    uint8_t *buf = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FILE *fin = fdopen(in, "r"), *fout = fdopen(out, "w");

    if (strcmp(g_backend, "p2p") == 0)
        snprintf(name, sizeof(name), "-");
    else
        snprintf(name, sizeof(name), "target-%d", (int)getpid());
    e = engine(name[0] == '-' ? NULL : name);
    CHECK_OK(kvt_mem_register(e, buf, BUF_LEN, KVT_ACCESS_REMOTE_RW));
    fprintf(fout, "%s %llu\n", kvt_engine_segment_name(e),
            (unsigned long long)(uintptr_t)buf);
    fflush(fout);
    while (fgets(line, sizeof(line), fin) != NULL) {
        unsigned v;
        size_t none, bad = 0;
        if (sscanf(line, "check %u", &v) != 1)
            break;
        kvt_notify_recv(e, NULL, 0, &none, 0); /* see landed writes */
        for (size_t i = 0; i < BUF_LEN; i++)
            bad += buf[i] != (uint8_t)v;
        fprintf(fout, "%zu\n", bad);
        fflush(fout);
    }
    kvt_engine_destroy(e);
    _exit(0);
}

typedef struct {
    pid_t pid;
    FILE *in, *out;
    char name[128];
    uint64_t addr;
} target_t;

static void target_start(target_t *t)
{
    int a[2], b[2];
    CHECK(pipe(a) == 0 && pipe(b) == 0);
    t->pid = fork();
    if (t->pid == 0) {
        close(a[1]);
        close(b[0]);
        target_main(a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    t->in = fdopen(a[1], "w");
    t->out = fdopen(b[0], "r");
    {
        unsigned long long addr;
        CHECK(fscanf(t->out, "%127s %llu", t->name, &addr) == 2);
        t->addr = addr;
    }
}

static size_t target_check(target_t *t, unsigned v)
{
    size_t bad;
    fprintf(t->in, "check %u\n", v);
    fflush(t->in);
    CHECK(fscanf(t->out, "%zu", &bad) == 1);
    return bad;
}

KVT_TEST(transfer)
{
    target_t t;
    kvt_engine_h e;
    kvt_segment_t seg;
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;
    uint8_t *buf = malloc(BUF_LEN);

    server_start();
    target_start(&t);
    e = engine(NULL);
    if (strcmp(g_backend, "p2p") != 0)
        CHECK(strncmp(t.name, "target-", 7) == 0); /* not host:port */
    CHECK_OK(kvt_segment_open(e, t.name, &seg));
    CHECK_OK(kvt_mem_register(e, buf, BUF_LEN, KVT_ACCESS_REMOTE_RW));
    memset(buf, 0x5d, BUF_LEN);
    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = buf;
    d.remote_addr = t.addr;
    d.length = BUF_LEN;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    CHECK_OK(kvt_batch_wait(b, 20000));
    CHECK(target_check(&t, 0x5d) == 0);
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(e);
    fclose(t.in);
    waitpid(t.pid, NULL, 0);
    free(buf);
    server_stop();
}

/* A killed engine is not served as live for longer than its TTL. */
KVT_TEST(liveness)
{
    target_t t;
    kvt__meta_t *m;
    kvt__segdesc_t d;
    kvt_engine_h e;
    kvt_segment_t seg;
    double t0;

    if (strcmp(g_backend, "p2p") == 0)
        SKIP("no metadata server in p2p mode");
    setenv("KVT_METADATA_TTL", "3", 1);
    server_start();
    target_start(&t);
    if (kvt__meta_create(g_uri, NULL, &m) == KVT_ERR_NOT_SUPPORTED)
        SKIP("this metadata backend is not built in");
    CHECK_OK(kvt__meta_lookup_segdesc(m, t.name, &d));
    kvt__segdesc_clear(&d);
    /* Kept alive past its TTL by the heartbeat. */
    usleep((TTL_S + 1) * 1000000);
    CHECK_OK(kvt__meta_lookup_segdesc(m, t.name, &d));
    kvt__segdesc_clear(&d);
    kill(t.pid, SIGKILL);
    waitpid(t.pid, NULL, 0);
    t0 = kvt_test_now();
    for (;;) {
        kvt_status_t st = kvt__meta_lookup_segdesc(m, t.name, &d);
        if (st == KVT_ERR_NOT_FOUND)
            break;
        CHECK_OK(st);
        kvt__segdesc_clear(&d);
        CHECK(kvt_test_now() - t0 < TTL_S + 3);
        usleep(100000);
    }
    fprintf(stderr, "entry gone %.1f s after the kill (ttl %d s)\n",
            kvt_test_now() - t0, TTL_S);
    e = engine(NULL);
    CHECK_ST(kvt_segment_open(e, t.name, &seg), KVT_ERR_UNREACHABLE);
    kvt_engine_destroy(e);
    kvt__meta_destroy(m);
    server_stop();
}

/* A clean shutdown withdraws the entry at once. */
KVT_TEST(withdraw)
{
    target_t t;
    kvt__meta_t *m;
    kvt__segdesc_t d;

    if (strcmp(g_backend, "p2p") == 0)
        SKIP("no metadata server in p2p mode");
    server_start();
    target_start(&t);
    if (kvt__meta_create(g_uri, NULL, &m) == KVT_ERR_NOT_SUPPORTED)
        SKIP("this metadata backend is not built in");
    CHECK_OK(kvt__meta_lookup_segdesc(m, t.name, &d));
    kvt__segdesc_clear(&d);
    fclose(t.in);
    waitpid(t.pid, NULL, 0);
    CHECK_ST(kvt__meta_lookup_segdesc(m, t.name, &d), KVT_ERR_NOT_FOUND);
    kvt__meta_destroy(m);
    server_stop();
}

static const kvt_test_case_t cases[] = {
    KVT_CASE(transfer, 60),
    KVT_CASE(liveness, 60),
    KVT_CASE(withdraw, 60),
};

int main(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--backend=", 10) == 0) {
            g_backend = argv[i] + 10;
            continue;
        }
        argv[++n] = argv[i];
    }
    signal(SIGPIPE, SIG_IGN);
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), n + 1, argv);
}
