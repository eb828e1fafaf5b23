/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Engine metrics (kvt/metrics.h): the counters after known traffic,
 * exact; the Prometheus text; the /metrics listener over HTTP.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "kvt_test.h"

#define LEN (1u << 20)

static kvt_engine_h engine(void)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;

    p.field_mask =
        KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
    p.transports = KVT_TRANSPORT_TCP;
    p.connect_timeout_ms = 2000;
    CHECK_OK(kvt_engine_create(&p, &e));
    return e;
}

static const kvt_transport_stats_t *tl_named(const kvt_engine_stats_t *s,
                                             const char *name)
{
    for (unsigned i = 0; i < s->ntransports; i++)
        if (strcmp(s->transports[i].name, name) == 0)
            return &s->transports[i];
    CHECK(!"transport listed");
    return NULL;
}

typedef struct {
    kvt_engine_h a, b; /* a writes into b */
    uint8_t *la, *lb;
    kvt_segment_t seg;
    uint64_t base; /* b's region */
} two_t;

static void two_up(two_t *x)
{
    x->a = engine();
    x->b = engine();
    x->la = calloc(1, LEN);
    x->lb = calloc(1, LEN);
    CHECK_OK(kvt_mem_register(x->a, x->la, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_mem_register(x->b, x->lb, LEN, KVT_ACCESS_REMOTE_RW));
    x->base = (uint64_t)(uintptr_t)x->lb;
    CHECK_OK(kvt_segment_open(x->a, kvt_engine_segment_name(x->b), &x->seg));
}

static void two_down(two_t *x)
{
    kvt_engine_destroy(x->a);
    kvt_engine_destroy(x->b);
    free(x->la);
    free(x->lb);
}

static kvt_xfer_desc_t xd(const two_t *x, uint32_t op, uint64_t off,
                          uint64_t len)
{
    kvt_xfer_desc_t d = {0};

    d.opcode = op;
    d.segment = x->seg;
    d.local_addr = x->la + off;
    d.remote_addr = x->base + off;
    d.length = len;
    return d;
}

/* 8 writes of 4 KiB, 3 reads of 64 KiB, 2 notifications, a write out of
 * the peer's region (KVT_ERR_ACCESS from the peer) and a descriptor of
 * length 0 (refused here): every counter exact. */
KVT_TEST(known_traffic)
{
    kvt_xfer_desc_t d[15];
    kvt_engine_stats_t s, sb;
    const kvt_transport_stats_t *t;
    kvt_notify_t nt[4];
    kvt_batch_h b;
    size_t n = 0, got = 0;
    uint64_t lat = 0, by_class[KVT_STATS_SIZE_CLASSES] = {0};

    two_t x;
    two_up(&x);
    for (int i = 0; i < 8; i++)
        d[n++] = xd(&x, KVT_OP_WRITE, (uint64_t)i * 8192, 4096);
    for (int i = 0; i < 3; i++)
        d[n++] = xd(&x, KVT_OP_READ, 512 * 1024 + (uint64_t)i * 65536, 65536);
    for (int i = 0; i < 2; i++) {
        d[n] = xd(&x, KVT_OP_NOTIFY, 0, 5);
        d[n++].local_addr = (void *)"hello";
    }
    d[n] = xd(&x, KVT_OP_WRITE, 0, 4096);
    d[n++].remote_addr = x.base + LEN; /* just past the region */
    d[n++] = xd(&x, KVT_OP_WRITE, 0, 0);
    CHECK_OK(kvt_batch_create(x.a, n, &b));
    CHECK_OK(kvt_batch_submit(b, d, n));
    CHECK(kvt_batch_wait(b, 10000) != KVT_INPROGRESS);
    CHECK_OK(kvt_batch_free(b));

    s.version = KVT_STATS_VERSION;
    CHECK_OK(kvt_engine_stats(x.a, &s));
    CHECK(s.version == KVT_STATS_VERSION);
    t = tl_named(&s, "tcp");
    CHECK(t->writes == 8 && t->write_bytes == 8 * 4096);
    CHECK(t->reads == 3 && t->read_bytes == 3 * 65536);
    CHECK(t->notifies == 2);
    CHECK(t->failures[-KVT_ERR_ACCESS] == 1);
    for (unsigned i = 0; i < KVT_STATS_STATUSES; i++)
        CHECK(i == (unsigned)-KVT_ERR_ACCESS || t->failures[i] == 0);
    CHECK(s.refused[-KVT_ERR_INVALID_PARAM] == 1);
    CHECK(s.batches == 1 && s.descriptors == 15 && s.inflight == 0);
    for (unsigned c = 0; c < KVT_STATS_SIZE_CLASSES; c++)
        for (unsigned k = 0; k < KVT_STATS_LATENCY_BUCKETS; k++) {
            by_class[c] += t->latency[c][k];
            lat += t->latency[c][k];
        }
    CHECK(lat == 14);
    /* 4 KiB writes and the failed one, the notifications (no bytes);
     * 64 KiB reads. */
    CHECK(by_class[0] == 11 && by_class[1] == 3);
    CHECK(t->sessions_opened == 1 && t->sessions_open == 1);
    CHECK(s.segments_open == 1 && s.regions == 1 && s.region_bytes == LEN);
    CHECK(kvt_stats_latency_bound_us(0) == 10 &&
          kvt_stats_latency_bound_us(KVT_STATS_LATENCY_BUCKETS - 2) ==
              10000000 &&
          kvt_stats_latency_bound_us(KVT_STATS_LATENCY_BUCKETS - 1) == 0);

    /* The target counted the notifications it was given. */
    while (got < 2) {
        size_t k = 0;
        CHECK_OK(kvt_notify_recv(x.b, nt, 4, &k, 5000));
        CHECK(k > 0);
        got += k;
    }
    sb.version = KVT_STATS_VERSION;
    CHECK_OK(kvt_engine_stats(x.b, &sb));
    CHECK(sb.notifies_received == 2 && sb.notifies_dropped == 0);
    CHECK(sb.descriptors == 0);
    /* And what it served: the writes that landed in its memory and the
     * reads it answered (the refused write is not among them). */
    {
        const kvt_served_stats_t *v = NULL;
        for (uint32_t i = 0; i < sb.ntransports; i++)
            if (strcmp(sb.transports[i].name, "tcp") == 0)
                v = &sb.served[i];
        CHECK(v != NULL);
        CHECK(v->writes == 8 && v->write_bytes == 8 * 4096);
        CHECK(v->reads == 3 && v->read_bytes == 3 * 65536);
    }
    /* A caller built with version 1 gets nothing past its struct. */
    {
        kvt_engine_stats_t *v1 = malloc(sizeof(*v1));
        CHECK(v1 != NULL);
        memset(v1, 0xa5, sizeof(*v1));
        v1->version = 1;
        CHECK_OK(kvt_engine_stats(x.b, v1));
        CHECK(v1->version == 1 && v1->notifies_received == 2);
        for (size_t i = offsetof(kvt_engine_stats_t, served); i < sizeof(*v1);
             i++)
            CHECK(((unsigned char *)v1)[i] == 0xa5);
        free(v1);
    }

    /* Versions this library does not know are refused. */
    sb.version = KVT_STATS_VERSION + 1;
    CHECK_ST(kvt_engine_stats(x.b, &sb), KVT_ERR_VERSION);
    CHECK_ST(kvt_engine_stats(NULL, &sb), KVT_ERR_INVALID_PARAM);
    two_down(&x);
}

/* Contains @line exactly, as one line of @text. */
static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);

    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

KVT_TEST(text)
{
    kvt_xfer_desc_t d[4];
    char line[256], *buf;
    size_t len = 0, len2 = 0;
    kvt_batch_h b;
    two_t x;
    const char *name;

    two_up(&x);
    name = kvt_engine_segment_name(x.a);
    for (int i = 0; i < 4; i++)
        d[i] = xd(&x, KVT_OP_WRITE, (uint64_t)i * 65536, 65536);
    CHECK_OK(kvt_batch_create(x.a, 4, &b));
    CHECK_OK(kvt_batch_submit(b, d, 4));
    CHECK_OK(kvt_batch_wait(b, 10000));
    CHECK_OK(kvt_batch_free(b));
    CHECK_ST(kvt_engine_metrics_text(x.a, NULL, 0, &len), KVT_ERR_NO_SPACE);
    CHECK(len > 1000);
    buf = malloc(len + 1);
    CHECK_ST(kvt_engine_metrics_text(x.a, buf, 10, &len2), KVT_ERR_NO_SPACE);
    CHECK(len2 == len && strlen(buf) == 9);
    CHECK_OK(kvt_engine_metrics_text(x.a, buf, len + 1, &len2));
    CHECK(len2 == len && strlen(buf) == len);
    snprintf(line, sizeof(line),
             "kvt_transfer_descriptors_total{engine=\"%s\",transport=\"tcp\","
             "op=\"write\"} 4",
             name);
    CHECK(has_line(buf, line));
    snprintf(line, sizeof(line),
             "kvt_transfer_bytes_total{engine=\"%s\",transport=\"tcp\","
             "op=\"write\"} 262144",
             name);
    CHECK(has_line(buf, line));
    snprintf(line, sizeof(line),
             "kvt_transfer_latency_seconds_count{engine=\"%s\","
             "transport=\"tcp\",size=\"le_64KiB\"} 4",
             name);
    CHECK(has_line(buf, line));
    CHECK(has_line(buf, "# TYPE kvt_transfer_latency_seconds histogram"));
    CHECK(has_line(buf, "# TYPE kvt_descriptors_inflight gauge"));
    CHECK_ST(kvt_engine_metrics_text(x.a, NULL, 1, &len2),
             KVT_ERR_INVALID_PARAM);
    free(buf);
    /* The target's side: what it served. */
    CHECK_ST(kvt_engine_metrics_text(x.b, NULL, 0, &len), KVT_ERR_NO_SPACE);
    buf = malloc(len + 1);
    CHECK_OK(kvt_engine_metrics_text(x.b, buf, len + 1, &len2));
    snprintf(line, sizeof(line),
             "kvt_served_bytes_total{engine=\"%s\",transport=\"tcp\","
             "op=\"write\"} 262144",
             kvt_engine_segment_name(x.b));
    CHECK(has_line(buf, line));
    snprintf(line, sizeof(line),
             "kvt_served_pieces_total{engine=\"%s\",transport=\"tcp\","
             "op=\"write\"} 4",
             kvt_engine_segment_name(x.b));
    CHECK(has_line(buf, line));
    free(buf);
    two_down(&x);
}

/* GET @path from 127.0.0.1:@port; the whole answer, malloc'd. */
static char *http_get(uint16_t port, const char *path)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    char req[256], *out = malloc(1 << 20);
    size_t n = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ssize_t r;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    CHECK(send(fd, req, strlen(req), 0) == (ssize_t)strlen(req));
    while ((r = recv(fd, out + n, (1 << 20) - 1 - n, 0)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd);
    return out;
}

KVT_TEST(listener)
{
    uint16_t port = 0, port2 = 0;
    char line[256], *r;
    two_t x;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int fd;
    double t0;

    two_up(&x);
    CHECK_OK(kvt_metrics_listen("127.0.0.1", 0, &port));
    CHECK(port != 0 && kvt_metrics_port() == port);
    CHECK_ST(kvt_metrics_listen(NULL, 0, &port2), KVT_ERR_EXISTS);
    CHECK(port2 == port);
    r = http_get(port, "/metrics");
    CHECK(strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0);
    CHECK(strstr(r, "text/plain; version=0.0.4") != NULL);
    /* Both engines of the process, each once. */
    snprintf(line, sizeof(line), "kvt_batches_total{engine=\"%s\"} 0",
             kvt_engine_segment_name(x.a));
    CHECK(has_line(r, line));
    snprintf(line, sizeof(line), "kvt_batches_total{engine=\"%s\"} 0",
             kvt_engine_segment_name(x.b));
    CHECK(has_line(r, line));
    free(r);
    r = http_get(port, "/health");
    CHECK(strstr(r, "200 OK") != NULL && strstr(r, "\r\n\r\nok\n") != NULL);
    free(r);
    r = http_get(port, "/nothing");
    CHECK(strncmp(r, "HTTP/1.1 404", 12) == 0);
    free(r);
    /* A client that never finishes its request is dropped within 2 s. */
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHECK(send(fd, "GET /met", 8, 0) == 8);
    t0 = kvt_test_now();
    {
        char c;
        CHECK(recv(fd, &c, 1, 0) == 0);
    }
    CHECK(kvt_test_now() - t0 < 4.0 * kvt_test_slowdown());
    close(fd);
    two_down(&x);
    /* The engines are gone from it. */
    r = http_get(port, "/metrics");
    CHECK(strstr(r, "kvt_batches_total{") == NULL);
    free(r);
}

/* A source of many series, the last one known: ~8 MiB of text, past
 * the largest send buffer Linux gives a TCP socket by default (4 MiB). */
#define BIG_SERIES 200000
static size_t big_source(void *owner, char *buf, size_t cap, int meta)
{
    size_t len = 0;

    (void)owner;
    (void)meta;
    for (unsigned i = 0; i < BIG_SERIES; i++) {
        int n =
            snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0,
                     "kvt_test_big_series{i=\"%u\"} %u\n", i, i);
        len += (size_t)n;
    }
    return len;
}

/* A connection to 127.0.0.1:@port with a receive buffer of 4 KiB (a
 * small window: the listener's sends soon find the socket full) that has
 * sent GET /metrics. */
static int slow_client(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0), rcvbuf = 4096;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0);
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) == 0);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHECK(send(fd, req, strlen(req), 0) == (ssize_t)strlen(req));
    return fd;
}

/* Everything @fd receives until the peer closes, into @out (@cap bytes);
 * its length. */
static size_t drain(int fd, char *out, size_t cap)
{
    size_t n = 0;
    ssize_t r;

    while ((r = recv(fd, out + n, cap - 1 - n, 0)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd);
    return n;
}

/* The body of an answer and the Content-Length it announced. */
static const char *body_of(const char *answer, size_t *clen_p)
{
    const char *cl = strstr(answer, "Content-Length: ");
    const char *body = strstr(answer, "\r\n\r\n");

    CHECK(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0);
    CHECK(cl != NULL && body != NULL && cl < body);
    *clen_p = strtoull(cl + 16, NULL, 10);
    return body + 4;
}

/*
 * A /metrics body far larger than the socket buffers, to clients with a
 * small receive window that wait before reading: the listener waits for
 * room instead of giving up on the first full socket, so that the body is
 * whole and as long as its Content-Length says. A client that takes
 * nothing is dropped once its 10 s are over, and the listener serves the
 * others meanwhile.
 */
KVT_TEST(listener_large_body)
{
    char last[64], *out;
    const char *body;
    size_t cap = 16u << 20, n, clen;
    uint16_t port = 0;
    int fd, stuck;
    double t0;
    two_t x;

    two_up(&x);
    out = malloc(cap);
    CHECK(out != NULL);
    CHECK_OK(kvt_metrics_source_add(&cap, big_source));
    CHECK_OK(kvt_metrics_listen("127.0.0.1", 0, &port));
    stuck = slow_client(port);
    t0 = kvt_test_now();
    fd = slow_client(port);
    usleep(500 * 1000); /* the listener fills both buffers meanwhile */
    n = drain(fd, out, cap);
    body = body_of(out, &clen);
    CHECK(clen > (4u << 20));
    CHECK(n - (size_t)(body - out) == clen);
    snprintf(last, sizeof(last), "kvt_test_big_series{i=\"%u\"} %u\n",
             BIG_SERIES - 1, BIG_SERIES - 1);
    CHECK(strcmp(body + clen - strlen(last), last) == 0);
    /* Both engines' text came before it. */
    snprintf(last, sizeof(last), "kvt_batches_total{engine=\"%s\"} 0",
             kvt_engine_segment_name(x.b));
    CHECK(has_line(body, last));
    CHECK(kvt_test_now() - t0 < 5.0 * kvt_test_slowdown());

    /* The client that read nothing got what the buffers held, then its
     * connection was closed. */
    while (kvt_test_now() - t0 < 11.0)
        usleep(100 * 1000);
    n = drain(stuck, out, cap);
    body = body_of(out, &clen);
    CHECK(n - (size_t)(body - out) < clen);
    kvt_metrics_source_del(&cap);
    free(out);
    two_down(&x);
}

/* A peer that cannot be reached counts as a failed handshake. */
KVT_TEST(handshake_failed)
{
    kvt_engine_h e = engine();
    kvt_engine_stats_t s;
    kvt_segment_t seg;

    CHECK(kvt_segment_open(e, "127.0.0.1:1", &seg) != KVT_OK);
    s.version = KVT_STATS_VERSION;
    CHECK_OK(kvt_engine_stats(e, &s));
    CHECK(s.handshakes_failed >= 1);
    kvt_engine_destroy(e);
}

int main(int argc, char **argv)
{
    static const kvt_test_case_t cases[] = {
        KVT_CASE(known_traffic, 30), KVT_CASE(text, 30), KVT_CASE(listener, 30),
        KVT_CASE(listener_large_body, 60), KVT_CASE(handshake_failed, 30)};

    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
