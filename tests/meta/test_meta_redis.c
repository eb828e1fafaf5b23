/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The redis backend against a redis-server that each case starts on a
 * free loopback port (no persistence) and stops. Skips when redis-server
 * is not installed or hiredis was not built in.
 */
#include "meta_suite.h"

static pid_t server;
static uint16_t port;
static char uri[64];

static void start(void)
{
    char portarg[16];
    char *argv[] = {"redis-server", "--port",     portarg,   "--bind",
                    "127.0.0.1",    "--save",     "",        "--appendonly",
                    "no",           "--loglevel", "warning", NULL};

#ifndef KVT_WITH_REDIS
    SKIP("built without hiredis");
#endif
    if (!mt_have("redis-server"))
        SKIP("redis-server is not installed");
    for (int attempt = 0; attempt < 3; attempt++) {
        port = mt_free_port();
        snprintf(portarg, sizeof(portarg), "%u", port);
        server = mt_spawn(argv, NULL);
        if (mt_wait_port(port, server, 10000) == 0)
            break;
        mt_stop(server, 100);
        server = 0;
    }
    CHECK(server > 0);
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%u", port);
}

static void stop(void)
{
    mt_stop(server, 2000);
}

static void redis_vanish(kvt__meta_t *other, const char *key)
{
    CHECK_OK(kvt__meta_del(other, key));
}

KVT_TEST(roundtrip)
{
    start();
    ms_roundtrip(uri);
    stop();
}

KVT_TEST(database)
{
    char u[80];
    kvt__meta_t *a, *b;

    start();
    snprintf(u, sizeof(u), "redis://127.0.0.1:%u/3", port);
    a = ms_open(u, 10);
    b = ms_open(uri, 10);
    CHECK_OK(kvt__meta_put(a, "kvt/test/db", "3", 1));
    ms_expect(a, "kvt/test/db", "3", 1);
    ms_expect_missing(b, "kvt/test/db");
    kvt__meta_destroy(a);
    kvt__meta_destroy(b);
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
    ms_refresh(uri, redis_vanish);
    stop();
}

KVT_TEST(liveness)
{
    start();
    ms_liveness(uri, 2, 500);
    stop();
}

KVT_TEST(threads)
{
    start();
    ms_threads(uri);
    stop();
}

/* The server restarts under a kept connection: the next call reconnects. */
KVT_TEST(reconnect)
{
    kvt__meta_t *m;
    char portarg[16];
    char *argv[] = {"redis-server", "--port", portarg, "--bind",
                    "127.0.0.1",    "--save", "",      "--appendonly",
                    "no",           NULL};

    start();
    m = ms_open(uri, 10);
    CHECK_OK(kvt__meta_put(m, "kvt/test/r", "1", 1));
    stop();
    CHECK(kvt__meta_put(m, "kvt/test/r", "2", 1) != KVT_OK);
    snprintf(portarg, sizeof(portarg), "%u", port);
    server = mt_spawn(argv, NULL);
    CHECK(mt_wait_port(port, server, 10000) == 0);
    CHECK_OK(kvt__meta_put(m, "kvt/test/r", "3", 1));
    ms_expect(m, "kvt/test/r", "3", 1);
    kvt__meta_destroy(m);
    stop();
}

/* Published before the server is up: the refresh stores it later. */
KVT_TEST(late_server)
{
    kvt__meta_t *m, *other;
    char portarg[16];
    char *argv[] = {"redis-server", "--port", portarg, "--bind",
                    "127.0.0.1",    "--save", "",      "--appendonly",
                    "no",           NULL};

#ifndef KVT_WITH_REDIS
    SKIP("built without hiredis");
#endif
    if (!mt_have("redis-server"))
        SKIP("redis-server is not installed");
    port = mt_free_port();
    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%u", port);
    m = ms_open(uri, 10);
    CHECK_ST(kvt__meta_publish(m, "kvt/test/late", "v", 1),
             KVT_ERR_UNREACHABLE);
    snprintf(portarg, sizeof(portarg), "%u", port);
    server = mt_spawn(argv, NULL);
    CHECK(mt_wait_port(port, server, 10000) == 0);
    CHECK_OK(kvt__meta_refresh(m));
    other = ms_open(uri, 10);
    ms_expect(other, "kvt/test/late", "v", 1);
    kvt__meta_destroy(m);
    ms_expect_missing(other, "kvt/test/late");
    kvt__meta_destroy(other);
    stop();
}

KVT_TEST(unreachable)
{
    char u[64];
#ifndef KVT_WITH_REDIS
    SKIP("built without hiredis");
#endif
    snprintf(u, sizeof(u), "redis://127.0.0.1:%u", mt_free_port());
    ms_unreachable(u);
}

/*
 * A server that answers any command with the header of an array of
 * 1.5 billion elements and one element: the client must refuse it before
 * hiredis allocates the element table (12 GB), and say it is a protocol
 * error rather than wait for the rest, whether it answers a GET or the
 * AUTH of a new connection.
 */
static void *huge_array_server(void *arg)
{
    static const char answer[] = "*1500000000\r\n$1\r\na\r\n";
    int lfd = *(int *)arg, fd;
    char buf[256];
    struct pollfd p;

    fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    p.fd = fd;
    p.events = POLLIN;
    if (poll(&p, 1, 5000) == 1 && recv(fd, buf, sizeof(buf), 0) > 0 &&
        mt_send_all(fd, answer, sizeof(answer) - 1) == 0) {
        /* Hold the connection until the client drops it. */
        while (poll(&p, 1, 5000) == 1 && recv(fd, buf, sizeof(buf), 0) > 0)
            ;
    }
    close(fd);
    return NULL;
}

static void huge_array_as(const char *userinfo)
{
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof(sa);
    kvt__meta_t *m;
    pthread_t t;
    uint8_t *v = NULL;
    size_t n = 0;
    double t0;
    int lfd;
    char u[96];

    lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(lfd >= 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHECK(listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    CHECK(pthread_create(&t, NULL, huge_array_server, &lfd) == 0);
    snprintf(u, sizeof(u), "redis://%s127.0.0.1:%u", userinfo,
             ntohs(sa.sin_port));
    m = ms_open(u, 10);
    t0 = kvt_test_now();
    CHECK_ST(kvt__meta_get(m, "kvt/test/huge", &v, &n), KVT_ERR_PROTOCOL);
    CHECK(v == NULL);
    /* Refused at once, not after the 2 s timeout. */
    CHECK(kvt_test_now() - t0 < 1.0 * kvt_test_slowdown());
    kvt__meta_destroy(m);
    pthread_join(t, NULL);
    close(lfd);
}

KVT_TEST(huge_array)
{
#ifndef KVT_WITH_REDIS
    SKIP("built without hiredis");
#endif
    huge_array_as("");         /* answering GET */
    huge_array_as(":secret@"); /* answering AUTH */
}

KVT_TEST_MAIN(KVT_CASE(roundtrip, 60), KVT_CASE(database, 60),
              KVT_CASE(segdesc, 60), KVT_CASE(engine_ucx, 60),
              KVT_CASE(refresh, 60), KVT_CASE(liveness, 60),
              KVT_CASE(threads, 60),
              KVT_CASE(reconnect, 60), KVT_CASE(late_server, 60),
              KVT_CASE(unreachable, 30), KVT_CASE(huge_array, 30))
