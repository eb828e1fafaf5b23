/* SPDX-License-Identifier: Apache-2.0 */
/* The http backend against `kvt metad` embedded in the test process. */
#include "meta/metad.h"
#include "meta_suite.h"

static kvt__metad_t *server;
static char uri[64];

static void start(void)
{
#if !defined(KVT_WITH_CURL) || !defined(KVT_WITH_HTTP_SERVER) ||               \
    !defined(KVT_WITH_JSON)
    SKIP("built without libcurl, libmicrohttpd or json-c");
#endif
    CHECK_OK(kvt__metad_start("127.0.0.1", 0, NULL, &server));
    snprintf(uri, sizeof(uri), "http://127.0.0.1:%u", kvt__metad_port(server));
}

static void http_vanish(kvt__meta_t *other, const char *key)
{
    CHECK_OK(kvt__meta_del(other, key));
}

KVT_TEST(roundtrip)
{
    start();
    ms_roundtrip(uri);
    kvt__metad_stop(server);
}

KVT_TEST(explicit_path)
{
    char u[96];
    start();
    /* Mooncake configurations name the route: http://host:port/metadata */
    snprintf(u, sizeof(u), "http://127.0.0.1:%u/metadata",
             kvt__metad_port(server));
    ms_roundtrip(u);
    kvt__metad_stop(server);
}

KVT_TEST(segdesc)
{
    start();
    ms_segdesc(uri);
    kvt__metad_stop(server);
}

KVT_TEST(engine_ucx)
{
    ms_need_ucx();
    start();
    ms_engine_ucx(uri);
    kvt__metad_stop(server);
}

KVT_TEST(refresh)
{
    start();
    ms_refresh(uri, http_vanish);
    kvt__metad_stop(server);
}

KVT_TEST(liveness)
{
    uint16_t port = mt_free_port();
    pid_t pid;

#if !defined(KVT_WITH_CURL) || !defined(KVT_WITH_HTTP_SERVER) ||               \
    !defined(KVT_WITH_JSON)
    SKIP("built without libcurl, libmicrohttpd or json-c");
#endif
    /* The server runs in a child so that this process has no threads when
     * ms_liveness() forks the owner (ThreadSanitizer refuses that). */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        CHECK_OK(kvt__metad_start("127.0.0.1", port, NULL, &server));
        for (;;)
            pause();
    }
    CHECK(mt_wait_port(port, pid, 10000) == 0);
    snprintf(uri, sizeof(uri), "http://127.0.0.1:%u", port);
    /* metad drops the key at its deadline exactly: the slack covers the
     * polling period only. */
    ms_liveness(uri, 2, 300);
    mt_stop(pid, 2000);
}

KVT_TEST(threads)
{
    start();
    ms_threads(uri);
    kvt__metad_stop(server);
}

KVT_TEST(unreachable)
{
    char u[64];
#ifndef KVT_WITH_CURL
    SKIP("built without libcurl");
#endif
    snprintf(u, sizeof(u), "http://127.0.0.1:%u", mt_free_port());
    ms_unreachable(u);
}

/* Published before the server is up: the refresh stores it later. */
KVT_TEST(late_server)
{
    uint16_t port = mt_free_port();
    kvt__meta_t *m, *other;

#if !defined(KVT_WITH_CURL) || !defined(KVT_WITH_HTTP_SERVER) ||               \
    !defined(KVT_WITH_JSON)
    SKIP("built without libcurl, libmicrohttpd or json-c");
#endif
    snprintf(uri, sizeof(uri), "http://127.0.0.1:%u", port);
    m = ms_open(uri, 10);
    CHECK_ST(kvt__meta_publish(m, "kvt/test/late", "v", 1),
             KVT_ERR_UNREACHABLE);
    CHECK_OK(kvt__metad_start("127.0.0.1", port, NULL, &server));
    CHECK_OK(kvt__meta_refresh(m));
    other = ms_open(uri, 10);
    ms_expect(other, "kvt/test/late", "v", 1);
    kvt__meta_destroy(m);
    ms_expect_missing(other, "kvt/test/late");
    kvt__meta_destroy(other);
    kvt__metad_stop(server);
}

/* A server that ignores ?ttl= (a plain Mooncake server) still works. */
KVT_TEST(server_without_ttl)
{
    uint16_t port = mt_free_port();
    int lfd, one = 1;
    struct sockaddr_in a = {0};
    pid_t pid;
    kvt__meta_t *m;

#ifndef KVT_WITH_CURL
    SKIP("built without libcurl");
#endif
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(listen(lfd, 4) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* Answers every request "200 metadata updated", no X-Kvt-Ttl. */
        for (int i = 0; i < 4; i++) {
            int fd = accept(lfd, NULL, NULL);
            char buf[8192];
            static const char ok[] =
                "HTTP/1.1 200 OK\r\nContent-Length: 16\r\n"
                "Connection: close\r\n\r\nmetadata updated";
            if (fd < 0)
                _exit(1);
            if (recv(fd, buf, sizeof(buf), 0) > 0)
                mt_send_all(fd, ok, sizeof(ok) - 1);
            close(fd);
        }
        _exit(0);
    }
    close(lfd);
    snprintf(uri, sizeof(uri), "http://127.0.0.1:%u", port);
    m = ms_open(uri, 5);
    CHECK_OK(kvt__meta_put(m, "k", "v", 1));
    CHECK_OK(kvt__meta_publish(m, "k", "v", 1)); /* warns once */
    CHECK_OK(kvt__meta_refresh(m));
    kvt__meta_destroy(m);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

KVT_TEST(p2p_not_applicable)
{
    kvt__meta_t *m;
    uint8_t *v;
    size_t n;
    char **keys;

    CHECK_OK(kvt__meta_create("p2p", NULL, &m));
    CHECK(kvt__meta_kind(m) == KVT__META_P2P);
    CHECK_ST(kvt__meta_put(m, "k", "v", 1), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_get(m, "k", &v, &n), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_del(m, "k"), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_list(m, "", &keys, &n), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_publish(m, "k", "v", 1), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_refresh(m), KVT_ERR_NOT_SUPPORTED);
    CHECK_ST(kvt__meta_heartbeat_start(m), KVT_ERR_NOT_SUPPORTED);
    kvt__meta_destroy(m);
    CHECK_OK(kvt__meta_create("P2PHANDSHAKE", NULL, &m));
    kvt__meta_destroy(m);
    CHECK_OK(kvt__meta_create(NULL, NULL, &m));
    CHECK(kvt__meta_kind(m) == KVT__META_P2P);
    kvt__meta_destroy(m);
    kvt__meta_destroy(NULL);
    CHECK_ST(kvt__meta_create("ftp://x", NULL, &m), KVT_ERR_INVALID_PARAM);
    CHECK_ST(kvt__meta_create("http://", NULL, &m), KVT_ERR_INVALID_PARAM);
}

KVT_TEST_MAIN(KVT_CASE(roundtrip, 60), KVT_CASE(explicit_path, 60),
              KVT_CASE(segdesc, 60), KVT_CASE(engine_ucx, 60),
              KVT_CASE(refresh, 60), KVT_CASE(liveness, 60),
              KVT_CASE(threads, 60),
              KVT_CASE(unreachable, 30), KVT_CASE(late_server, 30),
              KVT_CASE(server_without_ttl, 30),
              KVT_CASE(p2p_not_applicable, 10))
