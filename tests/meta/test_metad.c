/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvt metad` at the HTTP level: Mooncake's /metadata routes, SGLang's
 * bootstrap routes, TTLs, refusals that change nothing, /metrics, and the
 * kvt metad command (KVT_BIN names the kvt binary).
 */
#include <pthread.h>
#include <sys/resource.h>

#include "meta/meta.h"
#include "meta/metad.h"
#include "meta_test.h"

static kvt__metad_t *server;
static uint16_t port;

static void start_with(size_t max_body, size_t max_bytes)
{
    kvt__metad_params_t p = {0};

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    p.field_mask = KVT__METAD_PARAM_MAX_BODY | KVT__METAD_PARAM_MAX_BYTES;
    p.max_body = max_body;
    p.max_bytes = max_bytes;
    CHECK_OK(kvt__metad_start("127.0.0.1", 0, &p, &server));
    port = kvt__metad_port(server);
    CHECK(port != 0);
}

static void start(void)
{
    start_with(16u << 20, 1u << 30);
}

/* GET @target and compare the body with @want (NULL: expect 404). */
static void expect_body(const char *target, const void *want, size_t len)
{
    mt_resp_t r;
    int code = mt_http(port, "GET", target, NULL, NULL, 0, &r);

    if (want == NULL) {
        CHECK(code == 404);
    } else {
        CHECK(code == 200);
        CHECK(r.len == len && memcmp(r.body, want, len) == 0);
    }
    mt_resp_free(&r);
}

KVT_TEST(mooncake_routes)
{
    static const char body[] =
        "{\"name\":\"127.0.0.1:1234\",\"protocol\":\"tcp\",\"buffers\":"
        "[{\"name\":\"b\",\"addr\":140000000000,\"length\":4096}]}";
    static const uint8_t bin[] = {0, '\r', '\n', 0xff, 0, 'x'};
    const char *u = "/metadata?key=mooncake/ram/127.0.0.1:1234";
    mt_resp_t r;

    start();
    expect_body(u, NULL, 0);
    CHECK(mt_http(port, "PUT", u, NULL, body, strlen(body), &r) == 200);
    CHECK(strcmp(r.body, "metadata updated") == 0);
    CHECK(strcasestr(r.head, "X-Kvt-Ttl") == NULL);
    mt_resp_free(&r);
    CHECK(mt_http(port, "GET", u, NULL, NULL, 0, &r) == 200);
    CHECK(r.len == strlen(body) && memcmp(r.body, body, r.len) == 0);
    CHECK(strcasestr(r.head, "Content-Type: application/json") != NULL);
    mt_resp_free(&r);
    CHECK(mt_code(port, "HEAD", u, NULL, 0) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=bin", bin, sizeof(bin)) == 200);
    expect_body("/metadata?key=bin", bin, sizeof(bin));
    CHECK(mt_code(port, "PUT", "/metadata?key=empty", "", 0) == 200);
    expect_body("/metadata?key=empty", "", 0);
    /* Percent-encoded keys are the same keys. */
    expect_body("/metadata?key=mooncake%2Fram%2F127.0.0.1%3A1234", body,
                strlen(body));
    CHECK(mt_http(port, "DELETE", u, NULL, NULL, 0, &r) == 200);
    CHECK(strcmp(r.body, "metadata deleted") == 0);
    mt_resp_free(&r);
    expect_body(u, NULL, 0);
    CHECK(mt_code(port, "DELETE", u, NULL, 0) == 404);
    expect_body("/metadata?key=bin", bin, sizeof(bin));
    expect_body("/metadata/keys?prefix=", "[\"bin\",\"empty\"]", 15);
    expect_body("/metadata/keys", "[\"bin\",\"empty\"]", 15);
    expect_body("/metadata/keys?prefix=b", "[\"bin\"]", 7);
    kvt__metad_stop(server);
}

/* Several requests on one connection: keep-alive holds. */
KVT_TEST(keep_alive)
{
    static const char req[] = "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 3\r\n\r\nabc"
                              "GET /metadata?key=k HTTP/1.1\r\nHost: x\r\n\r\n"
                              "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
                              "GET /metadata?key=k HTTP/1.1\r\nHost: x\r\n\r\n";
    mt_resp_t r;
    int fd;

    start();
    fd = mt_connect(port);
    CHECK(fd >= 0);
    CHECK(mt_send_all(fd, req, sizeof(req) - 1) == 0);
    CHECK(mt_read_resp(fd, &r) == 200);
    mt_resp_free(&r);
    CHECK(mt_read_resp(fd, &r) == 200 && strcmp(r.body, "abc") == 0);
    CHECK(strcasestr(r.head, "Connection: close") == NULL);
    mt_resp_free(&r);
    CHECK(mt_read_resp(fd, &r) == 404);
    mt_resp_free(&r);
    CHECK(mt_read_resp(fd, &r) == 200 && strcmp(r.body, "abc") == 0);
    mt_resp_free(&r);
    close(fd);
    kvt__metad_stop(server);
}

KVT_TEST(ttl)
{
    mt_resp_t r;
    double t0;

    start();
    t0 = kvt_test_now();
    CHECK(mt_http(port, "PUT", "/metadata?key=t&ttl=1", NULL, "v", 1, &r) ==
          200);
    CHECK(strcasestr(r.head, "X-Kvt-Ttl: 1") != NULL);
    mt_resp_free(&r);
    CHECK(mt_code(port, "PUT", "/metadata?key=forever&ttl=0", "v", 1) == 200);
    expect_body("/metadata?key=t", "v", 1);
    while (mt_code(port, "GET", "/metadata?key=t", NULL, 0) == 200)
        CHECK(kvt_test_now() - t0 < 1.5);
    CHECK(kvt_test_now() - t0 >= 0.99);
    expect_body("/metadata?key=forever", "v", 1);
    usleep(1100000); /* a sweep frees it */
    CHECK(mt_http(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200);
    CHECK(strstr(r.body, "kvt_metad_expired_total{store=\"metadata\"} 1") !=
          NULL);
    CHECK(strstr(r.body, "kvt_metad_keys 1\n") != NULL);
    mt_resp_free(&r);
    /* A PUT without ttl makes the key permanent again. */
    CHECK(mt_code(port, "PUT", "/metadata?key=t&ttl=1", "v", 1) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=t", "w", 1) == 200);
    usleep(1300000);
    expect_body("/metadata?key=t", "w", 1);
    kvt__metad_stop(server);
}

/* The observable state: every key's value, the key list, the topology. */
static char *snapshot(void)
{
    mt_resp_t a, b, c;
    char *s;

    CHECK(mt_http(port, "GET", "/metadata?key=k", NULL, NULL, 0, &a) == 200);
    CHECK(mt_http(port, "GET", "/metadata/keys", NULL, NULL, 0, &b) == 200);
    CHECK(mt_http(port, "GET", "/topology", NULL, NULL, 0, &c) == 200);
    CHECK(asprintf(&s, "%s|%s|%s", a.body, b.body, c.body) > 0);
    mt_resp_free(&a);
    mt_resp_free(&b);
    mt_resp_free(&c);
    return s;
}

/* Send raw bytes on a fresh connection and return the status code. */
static int raw(const char *bytes, size_t len)
{
    mt_resp_t r;
    int fd = mt_connect(port), code = -1;

    CHECK(fd >= 0);
    /* The end of what the client sends: no request waits for more. */
    if (mt_send_all(fd, bytes, len) == 0 && shutdown(fd, SHUT_WR) == 0)
        code = mt_read_resp(fd, &r);
    mt_resp_free(&r);
    close(fd);
    return code;
}

KVT_TEST(refusals_change_nothing)
{
    static const char reg[] =
        "{\"role\":\"Prefill\",\"tp_size\":2,\"dp_size\":1,"
        "\"rank_ip\":\"10.0.0.1\",\"rank_port\":7000,\"engine_rank\":0}";
    char *before, *after, *big, *target;
    mt_resp_t r;
    size_t n;

    start_with(4096, 1u << 30);
    CHECK(mt_code(port, "PUT", "/metadata?key=k", "v0", 2) == 200);
    CHECK(mt_code(port, "PUT", "/route", reg, strlen(reg)) == 200);
    before = snapshot();
    big = malloc(64 * 1024 + 1);
    target = malloc(64 * 1024 + 64);
    CHECK(big != NULL && target != NULL);
    memset(big, 'x', 64 * 1024);
    big[64 * 1024] = '\0';

    CHECK(mt_code(port, "PUT", "/metadata", "v1", 2) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=", "v1", 2) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=%zz", "v1", 2) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=k%00", "v1", 2) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=k&ttl=x", "v1", 2) == 400);
    CHECK(mt_code(port, "GET", "/metadata?key=%zz", NULL, 0) == 400);
    /* Too long a key. */
    n = (size_t)sprintf(target, "/metadata?key=");
    memset(target + n, 'k', KVT_META_KEY_MAX + 1);
    target[n + KVT_META_KEY_MAX + 1] = '\0';
    CHECK(mt_code(port, "PUT", target, "v1", 2) == 414);
    CHECK(mt_code(port, "GET", target, NULL, 0) == 414);
    /* Too long a request target, and too large headers: MHD's answers. */
    memset(target + n, 'k', 60 * 1024);
    target[n + 60 * 1024] = '\0';
    CHECK(mt_code(port, "GET", target, NULL, 0) == 414);
    {
        char *hdr = malloc(64 * 1024);
        CHECK(hdr != NULL);
        snprintf(hdr, 64 * 1024, "X-Big: %.*s\r\n", 40 * 1024, big);
        CHECK(mt_http(port, "PUT", "/metadata?key=k", hdr, "v1", 2, &r) == 431);
        mt_resp_free(&r);
        free(hdr);
    }
    /* Bodies beyond max_body: announced, and chunked. */
    CHECK(mt_code(port, "PUT", "/metadata?key=k", big, 4097) == 413);
    CHECK(mt_code(port, "PUT", "/metadata?key=k2", big, 64 * 1024) == 413);
    {
        char *req = malloc(80 * 1024);
        int len = snprintf(req, 80 * 1024,
                           "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\n"
                           "Transfer-Encoding: chunked\r\n"
                           "Connection: close\r\n\r\n"
                           "1000\r\n%.4096s\r\n1000\r\n%.4096s\r\n0\r\n\r\n",
                           big, big);
        CHECK(raw(req, (size_t)len) == 413);
        free(req);
    }
    CHECK(mt_code(port, "PUT", "/metadata?key=k", big, 4096) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=k", "v0", 2) == 200);
    /* Methods and paths. */
    CHECK(mt_http(port, "POST", "/metadata?key=k", NULL, "v1", 2, &r) == 405);
    CHECK(strcasestr(r.head, "Allow: GET, HEAD, PUT, DELETE") != NULL);
    mt_resp_free(&r);
    CHECK(mt_code(port, "PATCH", "/metadata?key=k", "v1", 2) == 405);
    CHECK(mt_code(port, "DELETE", "/health", NULL, 0) == 405);
    CHECK(mt_code(port, "PUT", "/topology", "{}", 2) == 405);
    CHECK(mt_code(port, "DELETE", "/metadata/keys?prefix=", NULL, 0) == 405);
    CHECK(mt_code(port, "GET", "/metadata/", NULL, 0) == 404);
    CHECK(mt_code(port, "DELETE", "/nope?key=k", NULL, 0) == 404);
    /* Bootstrap registrations. */
    CHECK(mt_code(port, "PUT", "/route", "{\"role\":", 8) == 400);
    CHECK(mt_code(port, "PUT", "/route", "[1,2]", 5) == 400);
    CHECK(mt_code(port, "PUT", "/route", "", 0) == 400);
    {
        static const char port_range[] =
            "{\"role\":\"Prefill\",\"tp_size\":2,\"dp_size\":1,"
            "\"rank_ip\":\"h\",\"rank_port\":70000,\"engine_rank\":1}";
        static const char sizes[] =
            "{\"role\":\"Prefill\",\"tp_size\":4,\"dp_size\":1,"
            "\"rank_ip\":\"h\",\"rank_port\":7,\"engine_rank\":1}";
        CHECK(mt_code(port, "PUT", "/route", port_range, strlen(port_range)) ==
              400);
        CHECK(mt_code(port, "PUT", "/route", sizes, strlen(sizes)) == 409);
    }
    CHECK(mt_code(port, "GET", "/route?engine_rank=0", NULL, 0) == 400);
    CHECK(mt_code(port, "GET", "/route?engine_rank=x&target_dp_group=0", NULL,
                  0) == 400);
    CHECK(mt_code(port, "DELETE", "/route?engine_rank=5&target_dp_group=0",
                  NULL, 0) == 404);
    /* Garbage that is not HTTP at all. */
    raw("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);
    raw("GET\r\n\r\n", 7);

    after = snapshot();
    if (strcmp(before, after) != 0) {
        fprintf(stderr, "before: %s\nafter:  %s\n", before, after);
        CHECK(0);
    }
    CHECK(mt_http(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200);
    CHECK(strstr(r.body, "kvt_metad_requests_total{route=\"metadata\","
                         "method=\"PUT\",code=\"413\"} 3") != NULL);
    CHECK(strstr(r.body, "kvt_metad_requests_total{route=\"route\","
                         "method=\"PUT\",code=\"409\"} 1") != NULL);
    CHECK(strstr(r.body, "kvt_metad_keys 1\n") != NULL);
    mt_resp_free(&r);
    free(before);
    free(after);
    free(big);
    free(target);
    kvt__metad_stop(server);
}

/* Mooncake's servers: an rpc_meta key is kept against other bytes while
 * it lives, keys are stripped, blank ones refused. */
KVT_TEST(mooncake_semantics)
{
    static const char *rpc = "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1";
    static const char a[] = "{\"ip_or_host_name\":\"h\",\"rpc_port\":1}";
    static const char b[] = "{\"ip_or_host_name\":\"h\",\"rpc_port\":2}";
    mt_resp_t r;

    start();
    CHECK(mt_http(port, "PUT", rpc, NULL, a, strlen(a), &r) == 200);
    CHECK(strcmp(r.body, "metadata updated") == 0);
    mt_resp_free(&r);
    CHECK(mt_http(port, "PUT", rpc, NULL, a, strlen(a), &r) == 200);
    CHECK(strcmp(r.body, "metadata unchanged") == 0);
    mt_resp_free(&r);
    CHECK(mt_http(port, "PUT", rpc, NULL, b, strlen(b), &r) == 400);
    CHECK(strcmp(r.body, "Duplicate rpc_meta key not allowed") == 0);
    mt_resp_free(&r);
    expect_body(rpc, a, strlen(a));
    /* Gone (deleted or expired), the name is free again. */
    CHECK(mt_code(port, "DELETE", rpc, NULL, 0) == 200);
    CHECK(mt_code(port, "PUT",
                  "/metadata?key=mooncake%2Frpc_meta%2Fh%3A1&ttl=1", b,
                  strlen(b)) == 200);
    CHECK(mt_code(port, "PUT", rpc, a, strlen(a)) == 400);
    usleep(1100000);
    CHECK(mt_code(port, "PUT", rpc, a, strlen(a)) == 200);
    expect_body(rpc, a, strlen(a));
    /* Other keys are overwritten as before. */
    CHECK(mt_code(port, "PUT", "/metadata?key=mooncake%2Fram%2Fh", a,
                  strlen(a)) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=mooncake%2Fram%2Fh", b,
                  strlen(b)) == 200);
    expect_body("/metadata?key=mooncake%2Fram%2Fh", b, strlen(b));

    /* Stripped keys, blank keys. */
    CHECK(mt_code(port, "PUT", "/metadata?key=+%09k1%20%0A", "v", 1) == 200);
    expect_body("/metadata?key=k1", "v", 1);
    expect_body("/metadata?key=%20k1", "v", 1);
    expect_body("/metadata/keys?prefix=k", "[\"k1\"]", 6);
    CHECK(mt_code(port, "PUT", "/metadata?key=%20%20", "v", 1) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=+", "v", 1) == 400);
    CHECK(mt_code(port, "GET", "/metadata?key=%09", NULL, 0) == 400);
    CHECK(mt_code(port, "DELETE", "/metadata?key=%0D%0A", NULL, 0) == 400);
    CHECK(mt_code(port, "DELETE", "/metadata?key=%20k1", NULL, 0) == 200);
    kvt__metad_stop(server);
}

/* Keys that are not UTF-8 are refused, so that /metadata/keys stays valid
 * JSON for everyone; two Content-Length headers are refused. */
KVT_TEST(strict_http)
{
    static const char *reqs[] = {
        "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
        "Content-Length: 1\r\nConnection: close\r\n\r\nw",
        "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\nww",
        "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        "content-length: 1\r\nConnection: close\r\n\r\nww",
    };
    mt_resp_t r;

    start();
    CHECK(mt_code(port, "PUT", "/metadata?key=k", "v", 1) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=caf%C3%A9", "v", 1) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=%FF%FE", "v", 1) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=a%C3", "v", 1) == 400);
    CHECK(mt_code(port, "PUT", "/metadata?key=%C0%80", "v", 1) == 400);
    CHECK(mt_code(port, "GET", "/metadata/keys?prefix=%FF", NULL, 0) == 400);
    CHECK(mt_http(port, "GET", "/metadata/keys", NULL, NULL, 0, &r) == 200);
    CHECK(strcmp(r.body, "[\"caf\xc3\xa9\",\"k\"]") == 0);
    mt_resp_free(&r);
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++)
        CHECK(raw(reqs[i], strlen(reqs[i])) == 400);
    expect_body("/metadata?key=k", "v", 1);
    kvt__metad_stop(server);
}

KVT_TEST(store_full)
{
    char v[2048];

    start_with(4096, 4096);
    memset(v, 'v', sizeof(v));
    CHECK(mt_code(port, "PUT", "/metadata?key=a", v, 2000) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=b", v, 2000) == 507);
    /* A body in flight counts with the entry it would replace. */
    CHECK(mt_code(port, "PUT", "/metadata?key=a", v, 2048) == 507);
    expect_body("/metadata?key=a", v, 2000);
    CHECK(mt_code(port, "PUT", "/metadata?key=a", v, 100) == 200);
    expect_body("/metadata?key=b", NULL, 0);
    expect_body("/metadata?key=a", v, 100);
    CHECK(mt_code(port, "DELETE", "/metadata?key=a", NULL, 0) == 200);
    CHECK(mt_code(port, "PUT", "/metadata?key=b", v, 2000) == 200);
    kvt__metad_stop(server);
}

/* kvt_metad_store_bytes from /metrics. */
static long store_bytes(void)
{
    mt_resp_t r;
    const char *p;
    long v = -1;

    CHECK(mt_http(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200);
    p = strstr(r.body, "\nkvt_metad_store_bytes ");
    CHECK(p != NULL);
    v = strtol(p + strlen("\nkvt_metad_store_bytes "), NULL, 10);
    mt_resp_free(&r);
    return v;
}

/* Uploads in flight count against --max-bytes: two unfinished 30,000-byte
 * bodies leave no room in a 64 KiB store, and give it back when they go. */
KVT_TEST(inflight_bodies)
{
    static const char head[] = "PUT /metadata?key=u HTTP/1.1\r\nHost: x\r\n"
                               "Content-Length: 30000\r\n\r\npartial";
    char v[10000];
    int fd[2];
    double t0;

    start_with(32 * 1024, 64 * 1024);
    memset(v, 'v', sizeof(v));
    for (int i = 0; i < 2; i++) {
        fd[i] = mt_connect(port);
        CHECK(fd[i] >= 0);
        CHECK(mt_send_all(fd[i], head, sizeof(head) - 1) == 0);
    }
    t0 = kvt_test_now();
    while (store_bytes() < 60000)
        CHECK(kvt_test_now() - t0 < 5);
    CHECK(mt_code(port, "PUT", "/metadata?key=k", v, sizeof(v)) == 507);
    {
        /* A chunked upload cannot grow past the limit either. */
        char req[12000];
        int len = snprintf(req, sizeof(req),
                           "PUT /metadata?key=c HTTP/1.1\r\nHost: x\r\n"
                           "Transfer-Encoding: chunked\r\n"
                           "Connection: close\r\n\r\n"
                           "2710\r\n%.10000s\r\n0\r\n\r\n",
                           v);
        CHECK(raw(req, (size_t)len) == 507);
    }
    close(fd[0]);
    close(fd[1]);
    t0 = kvt_test_now();
    while (store_bytes() != 0)
        CHECK(kvt_test_now() - t0 < 5);
    CHECK(mt_code(port, "PUT", "/metadata?key=k", v, sizeof(v)) == 200);
    CHECK(store_bytes() < 10100);
    expect_body("/metadata?key=c", NULL, 0);
    expect_body("/metadata?key=u", NULL, 0);
    kvt__metad_stop(server);
}

/* A server with these limits and @threads threads. */
static void start_conns(unsigned threads, unsigned max_conns,
                        uint32_t header_ms, uint32_t body_ms)
{
    kvt__metad_params_t p = {0};

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    p.field_mask = KVT__METAD_PARAM_THREADS | KVT__METAD_PARAM_MAX_CONNS |
                   KVT__METAD_PARAM_HEADER_TIMEOUT |
                   KVT__METAD_PARAM_BODY_TIMEOUT;
    p.threads = threads;
    p.max_conns = max_conns;
    p.header_timeout_ms = header_ms;
    p.body_timeout_ms = body_ms;
    CHECK_OK(kvt__metad_start("127.0.0.1", 0, &p, &server));
    port = kvt__metad_port(server);
}

/*
 * Send @bytes one at a time, one every @every_ms, until the server closes
 * the connection: the seconds that took, or -1 when it was still open
 * after @max_s.
 */
static double trickle(int fd, const char *bytes, int every_ms, double max_s)
{
    double t0 = kvt_test_now();
    size_t i = 0, len = strlen(bytes);

    while (kvt_test_now() - t0 < max_s) {
        struct pollfd p = {fd, POLLIN, 0};
        char c;
        if (poll(&p, 1, every_ms) > 0) {
            ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                return kvt_test_now() - t0;
            continue;
        }
        if (send(fd, bytes + i % len, 1, MSG_NOSIGNAL) < 0)
            return kvt_test_now() - t0;
        i++;
    }
    return -1;
}

/* Whether the server closed @fd within @ms. */
static int closed_within(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    char c;

    if (poll(&p, 1, ms) <= 0)
        return 0;
    return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static uint64_t metric(const char *line)
{
    mt_resp_t r;
    const char *p;
    uint64_t v;

    CHECK(mt_http(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200);
    p = strstr(r.body, line);
    CHECK(p != NULL);
    v = strtoull(p + strlen(line), NULL, 10);
    mt_resp_free(&r);
    return v;
}

/*
 * A whole header must arrive within the header deadline, a whole body
 * within the body deadline, however often the client sends a byte; a
 * kept-alive connection gets the header deadline for each request anew.
 */
KVT_TEST(deadlines)
{
    static const char slow_head[] =
        "GET /health HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    static const char get[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char put[] = "PUT /metadata?key=slow HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 1000\r\n\r\n";
    mt_resp_t r;
    double t;
    int fd;

    start_conns(2, 1000, 1000, 2000);
    fd = mt_connect(port);
    CHECK(fd >= 0);
    t = trickle(fd, slow_head, 100, 4);
    CHECK(t >= 0.85 && t < 2.0);
    close(fd);

    /* Requests every 300 ms on one connection for 2 s: each has its own
     * deadline. Then idle: closed a deadline after the last answer. */
    fd = mt_connect(port);
    CHECK(fd >= 0);
    for (int i = 0; i < 7; i++) {
        CHECK(mt_send_all(fd, get, sizeof(get) - 1) == 0);
        CHECK(mt_read_resp(fd, &r) == 200);
        mt_resp_free(&r);
        usleep(300000);
    }
    t = kvt_test_now();
    CHECK(closed_within(fd, 3000));
    t = kvt_test_now() - t;
    CHECK(t >= 0.5 && t < 2.0);
    close(fd);

    /* A body sent a byte every 100 ms. */
    fd = mt_connect(port);
    CHECK(fd >= 0);
    CHECK(mt_send_all(fd, put, sizeof(put) - 1) == 0);
    t = trickle(fd, "b", 100, 5);
    CHECK(t >= 1.85 && t < 3.0);
    close(fd);
    expect_body("/metadata?key=slow", NULL, 0);
    t = kvt_test_now();
    while (store_bytes() != 0)
        CHECK(kvt_test_now() - t < 2);
    CHECK(metric("kvt_metad_dropped_total{reason=\"header_timeout\"} ") >= 2);
    CHECK(metric("kvt_metad_dropped_total{reason=\"body_timeout\"} ") == 1);
    kvt__metad_stop(server);
}

/* The default header deadline is at most 5 s. */
KVT_TEST(header_deadline_default)
{
    static const char slow_head[] =
        "GET /health HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    double t;
    int fd;

    start();
    fd = mt_connect(port);
    CHECK(fd >= 0);
    t = trickle(fd, slow_head, 250, 10);
    CHECK(t >= 4.5 && t <= 5.5);
    close(fd);
    kvt__metad_stop(server);
}

/* Open @n connections that each send half a request; -1 in @fds for the
 * ones that could not connect. */
static void half_sent(int *fds, int n)
{
    static const char half[] = "GET /health HTTP/1.1\r\nHo";

    for (int i = 0; i < n; i++) {
        fds[i] = mt_connect(port);
        CHECK(fds[i] >= 0);
        CHECK(mt_send_all(fds[i], half, sizeof(half) - 1) == 0);
    }
}

/* At the cap, the connection idle the longest goes: half-sent requests
 * cannot keep /health from answering. One server thread, so that the
 * server sees the connections in the order they were made (with two, a
 * thread that accepted one may register it after the other thread
 * registered later ones). */
KVT_TEST(connection_cap)
{
    int fds[64];

    start_conns(1, 16, 5000, 5000);
    half_sent(fds, 64);
    CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
    for (int i = 0; i < 32; i++)
        CHECK(closed_within(fds[i], 2000));
    CHECK(!closed_within(fds[63], 200));
    CHECK(metric("kvt_metad_dropped_total{reason=\"evicted\"} ") >= 48);
    CHECK(metric("kvt_metad_connections ") <= 16);
    for (int i = 0; i < 64; i++)
        close(fds[i]);
    kvt__metad_stop(server);
}

/* With the defaults, 1,100 half-sent requests (more than libmicrohttpd's
 * own limit of 1,020) still leave /health answering. */
KVT_TEST(connection_flood)
{
    enum { N = 1100 };
    struct rlimit rl;
    int *fds = malloc(N * sizeof(*fds));

    CHECK(fds != NULL);
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 2 * N + 256) {
        rl.rlim_cur = rl.rlim_max < 2 * N + 256 ? rl.rlim_max : 2 * N + 256;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 2 * N + 256)
        SKIP("fewer than 2456 descriptors allowed");
    start();
    half_sent(fds, N);
    CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
    CHECK(metric("kvt_metad_connections ") <= KVT__METAD_MAX_CONNS);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    free(fds);
    kvt__metad_stop(server);
}

static void put_rank(int rank, int tp, int dp, const char *query)
{
    char body[256], target[64];
    int n = snprintf(body, sizeof(body),
                     "{\"role\":\"Prefill\",\"tp_size\":%d,\"dp_size\":%d,"
                     "\"rank_ip\":\"10.0.0.%d\",\"rank_port\":%d,"
                     "\"engine_rank\":%d}",
                     tp, dp, rank, 7000 + rank, rank);
    snprintf(target, sizeof(target), "/route%s", query);
    CHECK(mt_code(port, "PUT", target, body, (size_t)n) == 200);
}

/* The SGLang flow: prefill ranks register, decode looks them up. */
KVT_TEST(bootstrap_routes)
{
    mt_resp_t r;
    char want[128], target[96];

    start();
    CHECK(mt_code(port, "GET", "/route?engine_rank=-1&target_dp_group=-1", NULL,
                  0) == 404);
    for (int rank = 0; rank < 4; rank++)
        put_rank(rank, 4, 2, "");
    /* Decode ranks may register too; they are acknowledged, not kept. */
    {
        static const char dec[] =
            "{\"role\":\"Decode\",\"tp_size\":1,\"dp_size\":1,"
            "\"rank_ip\":\"d\",\"rank_port\":1,\"engine_rank\":0}";
        CHECK(mt_code(port, "PUT", "/route", dec, strlen(dec)) == 200);
    }
    expect_body("/route?engine_rank=-1&target_dp_group=-1",
                "{\"prefill_tp_size\":4,\"prefill_dp_size\":2}", 41);
    for (int rank = 0; rank < 4; rank++) {
        int n = snprintf(want, sizeof(want),
                         "{\"rank_ip\":\"10.0.0.%d\",\"rank_port\":%d}", rank,
                         7000 + rank);
        snprintf(target, sizeof(target),
                 "/route?engine_rank=%d&target_dp_group=%d", rank % 2,
                 rank / 2);
        expect_body(target, want, (size_t)n);
    }
    CHECK(mt_code(port, "GET", "/route?engine_rank=2&target_dp_group=0", NULL,
                  0) == 404);
    CHECK(mt_http(port, "GET", "/topology", NULL, NULL, 0, &r) == 200);
    CHECK(strncmp(r.body,
                  "{\"prefill_tp_size\":4,\"prefill_dp_size\":2,\"ranks\":"
                  "[{\"dp_group\":0,\"tp_rank\":0,\"engine_rank\":0,",
                  92) == 0);
    CHECK(strstr(r.body, "{\"dp_group\":1,\"tp_rank\":1,\"engine_rank\":3,"
                         "\"rank_ip\":\"10.0.0.3\",\"rank_port\":7003}]}"));
    mt_resp_free(&r);
    /* Re-registration replaces; DELETE withdraws. */
    put_rank(3, 4, 2, "");
    CHECK(mt_code(port, "DELETE", "/route?engine_rank=1&target_dp_group=1",
                  NULL, 0) == 200);
    CHECK(mt_code(port, "GET", "/route?engine_rank=1&target_dp_group=1", NULL,
                  0) == 404);
    for (int rank = 0; rank < 3; rank++) {
        snprintf(target, sizeof(target),
                 "/route?engine_rank=%d&target_dp_group=%d", rank % 2,
                 rank / 2);
        CHECK(mt_code(port, "DELETE", target, NULL, 0) == 200);
    }
    /* Empty again: other sizes are welcome, and TTLs apply. */
    put_rank(0, 1, 1, "?ttl=1");
    expect_body("/route?engine_rank=-1&target_dp_group=-1",
                "{\"prefill_tp_size\":1,\"prefill_dp_size\":1}", 41);
    usleep(1100000);
    CHECK(mt_code(port, "GET", "/route?engine_rank=0&target_dp_group=0", NULL,
                  0) == 404);
    kvt__metad_stop(server);
}

KVT_TEST(health_metrics)
{
    mt_resp_t r;

    start();
    CHECK(mt_http(port, "GET", "/health", NULL, NULL, 0, &r) == 200);
    CHECK(strcmp(r.body, "OK") == 0);
    mt_resp_free(&r);
    CHECK(mt_code(port, "PUT", "/metadata?key=a", "1", 1) == 200);
    CHECK(mt_code(port, "GET", "/metadata?key=a", NULL, 0) == 200);
    CHECK(mt_code(port, "GET", "/metadata?key=b", NULL, 0) == 404);
    CHECK(mt_http(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200);
    CHECK(strcasestr(r.head, "Content-Type: text/plain; version=0.0.4"));
    CHECK(strstr(r.body, "# TYPE kvt_metad_requests_total counter\n"));
    CHECK(strstr(r.body, "kvt_metad_requests_total{route=\"metadata\","
                         "method=\"GET\",code=\"200\"} 1\n"));
    CHECK(strstr(r.body, "kvt_metad_requests_total{route=\"metadata\","
                         "method=\"GET\",code=\"404\"} 1\n"));
    CHECK(strstr(r.body, "kvt_metad_requests_total{route=\"health\","
                         "method=\"GET\",code=\"200\"} 1\n"));
    CHECK(strstr(r.body, "kvt_metad_keys 1\n"));
    CHECK(strstr(r.body, "kvt_metad_errors_total{kind=\"client\"} 1\n"));
    CHECK(strstr(r.body, "kvt_metad_bootstrap_ranks 0\n"));
    mt_resp_free(&r);
    kvt__metad_stop(server);
}

static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    char target[64], val[32];

    for (int i = 0; i < 150; i++) {
        int n = snprintf(val, sizeof(val), "%d:%d", id, i);
        mt_resp_t r;
        snprintf(target, sizeof(target), "/metadata?key=own%d", id);
        CHECK(mt_code(port, "PUT", target, val, (size_t)n) == 200);
        CHECK(mt_http(port, "GET", target, NULL, NULL, 0, &r) == 200);
        CHECK(strcmp(r.body, val) == 0);
        mt_resp_free(&r);
        CHECK(mt_code(port, "PUT", "/metadata?key=shared", val, (size_t)n) ==
              200);
        CHECK(mt_http(port, "GET", "/metadata?key=shared", NULL, NULL, 0, &r) ==
              200);
        CHECK(strchr(r.body, ':') != NULL);
        mt_resp_free(&r);
        if (i % 10 == 0)
            CHECK(mt_code(port, "DELETE", target, NULL, 0) == 200);
    }
    return NULL;
}

KVT_TEST(concurrent_clients)
{
    pthread_t t[8];

    start();
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    kvt__metad_stop(server);
}

KVT_TEST(start_errors)
{
    kvt__metad_t *other;
    kvt__metad_params_t p = {0};

    start();
    CHECK_ST(kvt__metad_start("127.0.0.1", port, NULL, &other), KVT_ERR_IO);
    CHECK(kvt__metad_start("no.such.host.invalid", 0, NULL, &other) != KVT_OK);
    p.field_mask = KVT__METAD_PARAM_THREADS;
    p.threads = 0;
    CHECK_ST(kvt__metad_start("127.0.0.1", 0, &p, &other),
             KVT_ERR_INVALID_PARAM);
    p.field_mask = KVT__METAD_PARAM_MAX_BODY;
    p.max_body = KVT_META_VALUE_MAX + 1;
    CHECK_ST(kvt__metad_start("127.0.0.1", 0, &p, &other),
             KVT_ERR_INVALID_PARAM);
    /* The server still serves. */
    CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
    kvt__metad_stop(server);
    kvt__metad_stop(NULL);
}

/* Whether something accepts TCP connections on @ip:@port. */
static int reachable(const char *ip, uint16_t p)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

    CHECK(fd >= 0);
    a.sin_family = AF_INET;
    a.sin_port = htons(p);
    CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
    ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Without a host the server listens on loopback only: 127.0.0.2 (another
 * address of this machine, routed to lo) finds nobody, 0.0.0.0 does. */
KVT_TEST(default_host)
{
    kvt__metad_t *any;

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    CHECK_OK(kvt__metad_start(NULL, 0, NULL, &server));
    port = kvt__metad_port(server);
    CHECK(reachable("127.0.0.1", port));
    CHECK(!reachable("127.0.0.2", port));
    kvt__metad_stop(server);
    CHECK_OK(kvt__metad_start("", 0, NULL, &server));
    CHECK(!reachable("127.0.0.2", kvt__metad_port(server)));
    kvt__metad_stop(server);
    /* Every address when asked for. */
    CHECK_OK(kvt__metad_start("0.0.0.0", 0, NULL, &any));
    CHECK(reachable("127.0.0.2", kvt__metad_port(any)));
    kvt__metad_stop(any);
}

/* The kvt metad command: serves, and exits 0 on SIGTERM and SIGINT. */
KVT_TEST(command)
{
    const char *bin = getenv("KVT_BIN");
    char portarg[16];
    char *argv[] = {(char *)bin, "metad", "--host", "127.0.0.1",
                    "--port",    portarg, NULL};
    int sigs[2] = {SIGTERM, SIGINT};

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    if (bin == NULL || !mt_have(bin))
        SKIP("KVT_BIN does not name the kvt binary");
    for (int i = 0; i < 2; i++) {
        pid_t pid;
        int status = 0;
        double t0;

        port = mt_free_port();
        snprintf(portarg, sizeof(portarg), "%u", port);
        pid = mt_spawn(argv, NULL);
        CHECK(mt_wait_port(port, pid, 10000) == 0);
        CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
        CHECK(mt_code(port, "PUT", "/metadata?key=c", "1", 1) == 200);
        expect_body("/metadata?key=c", "1", 1);
        kill(pid, sigs[i]);
        t0 = kvt_test_now();
        while (waitpid(pid, &status, WNOHANG) != pid) {
            CHECK(kvt_test_now() - t0 < 5);
            usleep(10000);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    {
        /* No --host: loopback only. */
        char *plain[] = {(char *)bin, "metad", "--port", portarg, NULL};
        pid_t pid;

        port = mt_free_port();
        snprintf(portarg, sizeof(portarg), "%u", port);
        pid = mt_spawn(plain, NULL);
        CHECK(mt_wait_port(port, pid, 10000) == 0);
        CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
        CHECK(!reachable("127.0.0.2", port));
        CHECK(WIFEXITED(mt_stop(pid, 5000)));
    }
    {
        /* The connection limits from the command line. */
        char *lim[] = {(char *)bin,
                       "metad",
                       "--port",
                       portarg,
                       "--max-connections",
                       "4",
                       "--header-timeout",
                       "0.5",
                       "--body-timeout",
                       "2",
                       NULL};
        int fds[8];
        pid_t pid;
        double t;

        port = mt_free_port();
        snprintf(portarg, sizeof(portarg), "%u", port);
        pid = mt_spawn(lim, NULL);
        CHECK(mt_wait_port(port, pid, 10000) == 0);
        fds[0] = mt_connect(port);
        CHECK(fds[0] >= 0);
        t = trickle(fds[0], "GET / HTTP/1.1\r\nX: aaaaaaaaaa", 50, 3);
        CHECK(t >= 0.4 && t < 1.5);
        close(fds[0]);
        half_sent(fds, 8);
        CHECK(mt_code(port, "GET", "/health", NULL, 0) == 200);
        CHECK(closed_within(fds[0], 2000));
        for (int i = 0; i < 8; i++)
            close(fds[i]);
        CHECK(WIFEXITED(mt_stop(pid, 5000)));
    }
    {
        char *bad[] = {(char *)bin, "metad", "--header-timeout", "0", NULL};
        int status;
        pid_t pid = mt_spawn(bad, NULL);
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    }
    {
        char *bad[] = {(char *)bin, "metad", "--port", "99999", NULL};
        int status;
        pid_t pid = mt_spawn(bad, NULL);
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    }
}

KVT_TEST_MAIN(KVT_CASE(mooncake_routes, 30), KVT_CASE(keep_alive, 30),
              KVT_CASE(ttl, 30), KVT_CASE(refusals_change_nothing, 60),
              KVT_CASE(store_full, 30), KVT_CASE(mooncake_semantics, 30),
              KVT_CASE(strict_http, 30), KVT_CASE(inflight_bodies, 30),
              KVT_CASE(deadlines, 30), KVT_CASE(header_deadline_default, 30),
              KVT_CASE(connection_cap, 30), KVT_CASE(connection_flood, 60),
              KVT_CASE(bootstrap_routes, 30), KVT_CASE(health_metrics, 30),
              KVT_CASE(concurrent_clients, 120), KVT_CASE(start_errors, 30),
              KVT_CASE(default_host, 30), KVT_CASE(command, 60))
