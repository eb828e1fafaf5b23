/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd backend against an etcd that each case starts on free loopback
 * ports with a fresh data directory, and stops. Skips when etcd is not
 * installed or the backend was not built in.
 */
#include "meta_suite.h"

static pid_t server;
static uint16_t port;
static char uri[128];
static char datadir[64];

static void start(void)
{
    char client[64], peer[64], cluster[80];
    char *argv[] = {"etcd",    "--name",
                    "default", "--data-dir",
                    datadir,   "--listen-client-urls",
                    client,    "--advertise-client-urls",
                    client,    "--listen-peer-urls",
                    peer,      "--initial-advertise-peer-urls",
                    peer,      "--initial-cluster",
                    cluster,   "--log-level",
                    "error",   NULL};

#if !defined(KVT_WITH_CURL) || !defined(KVT_WITH_JSON)
    SKIP("built without libcurl or json-c");
#endif
    if (!mt_have("etcd"))
        SKIP("etcd is not installed");
    strcpy(datadir, "/tmp/kvt-etcd-XXXXXX");
    CHECK(mkdtemp(datadir) != NULL);
    for (int attempt = 0; attempt < 3; attempt++) {
        uint16_t pport = mt_free_port();
        port = mt_free_port();
        snprintf(client, sizeof(client), "http://127.0.0.1:%u", port);
        snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", pport);
        snprintf(cluster, sizeof(cluster), "default=%s", peer);
        server = mt_spawn(argv, NULL);
        if (mt_wait_port(port, server, 20000) == 0)
            break;
        mt_stop(server, 100);
        server = 0;
    }
    CHECK(server > 0);
    /* Serving once /health says so (a leader is elected). */
    for (int i = 0; i < 200; i++) {
        mt_resp_t r;
        int code = mt_http(port, "GET", "/health", NULL, NULL, 0, &r);
        int ok = code == 200 && strstr(r.body, "true") != NULL;
        mt_resp_free(&r);
        if (ok)
            break;
        usleep(50000);
    }
    snprintf(uri, sizeof(uri), "etcd://127.0.0.1:%u", port);
}

static void stop(void)
{
    mt_stop(server, 5000);
    mt_rmdir(datadir);
}

/* Lose every lease, as when an owner is cut off for longer than its TTL. */
static void etcd_vanish(kvt__meta_t *other, const char *key)
{
    mt_resp_t r;
    const char *p;

    (void)other;
    (void)key;
    CHECK(mt_http(port, "POST", "/v3/lease/leases", NULL, "{}", 2, &r) == 200);
    for (p = r.body; (p = strstr(p, "\"ID\":\"")) != NULL;) {
        char body[96];
        long long id = strtoll(p + 6, NULL, 10);
        int n = snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", id);
        CHECK(mt_code(port, "POST", "/v3/lease/revoke", body, (size_t)n) ==
              200);
        p += 6;
    }
    mt_resp_free(&r);
}

KVT_TEST(roundtrip)
{
    start();
    ms_roundtrip(uri);
    stop();
}

KVT_TEST(segdesc)
{
    start();
    ms_segdesc(uri);
    stop();
}

KVT_TEST(engine_ucx)
{
    ms_need_ucx();
    start();
    ms_engine_ucx(uri);
    stop();
}

KVT_TEST(refresh)
{
    start();
    ms_refresh(uri, etcd_vanish);
    stop();
}

KVT_TEST(liveness)
{
    start();
    /* etcd checks lease expiry every 500 ms, and may hand out a little
     * more than the requested TTL. */
    ms_liveness(uri, 2, 1500);
    stop();
}

KVT_TEST(threads)
{
    start();
    ms_threads(uri);
    stop();
}

/* Several endpoints: the dead ones are skipped. */
KVT_TEST(failover)
{
    char u[160];
    kvt__meta_t *m;

    start();
    snprintf(u, sizeof(u), "etcd://127.0.0.1:%u,127.0.0.1:%u", mt_free_port(),
             port);
    m = ms_open(u, 10);
    CHECK_OK(kvt__meta_put(m, "kvt/test/f", "1", 1));
    ms_expect(m, "kvt/test/f", "1", 1);
    kvt__meta_destroy(m);
    stop();
}

KVT_TEST(unreachable)
{
    char u[64];
#if !defined(KVT_WITH_CURL) || !defined(KVT_WITH_JSON)
    SKIP("built without libcurl or json-c");
#endif
    snprintf(u, sizeof(u), "etcd://127.0.0.1:%u", mt_free_port());
    ms_unreachable(u);
}

KVT_TEST_MAIN(KVT_CASE(roundtrip, 90), KVT_CASE(segdesc, 90),
              KVT_CASE(engine_ucx, 90), KVT_CASE(refresh, 90),
              KVT_CASE(liveness, 90),
              KVT_CASE(threads, 90), KVT_CASE(failover, 90),
              KVT_CASE(unreachable, 30))
