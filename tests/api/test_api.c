/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every status the engine and transfer headers say a call returns,
 * produced: COVER(call, status, expression) checks that the expression
 * returns that status; UNCOVERED(call, status, why) names one this program
 * cannot produce, and why. tests/api/api_doc.py reads these lines and
 * checks them against the headers' comments both ways (the ctest entry
 * api_doc), so a status added to a call, or a comment that promises one
 * the code never returns, fails the build's tests.
 *
 * Black box: the public headers, a target engine in another process
 * (tests/transport/peer.c) and fake peers on raw sockets speaking the
 * protocol from docs/protocol.md.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvt_test.h"
#include "peer.h"

#define COVER(call, status, expr) CHECK_ST((expr), (status))
#define UNCOVERED(call, status, why) /* documented, not produced: why */
/* A final batch @b of one descriptor, asked through each call. */
#define FINAL(b, status)                                                       \
    do {                                                                       \
        COVER(kvt_batch_wait, status, kvt_batch_wait(b, 30000));               \
        COVER(kvt_batch_query, status, kvt_batch_query(b, NULL));              \
        COVER(kvt_batch_entry, status, kvt_batch_entry(b, 0, NULL));           \
    } while (0)
/* The same descriptor @d submitted alone and waited for in one call,
 * with a timeout of @ms (-1: none; a tcp waiter then sleeps in its read,
 * which only the connection's end wakes). */
#define SYNC_MS(e, d, status, ms)                                              \
    do {                                                                       \
        kvt_batch_h sb_;                                                       \
        kvt_xfer_desc_t sd_ = (d);                                             \
        CHECK_OK(kvt_batch_create((e), 1, &sb_));                              \
        COVER(kvt_batch_submit_wait, status,                                   \
              kvt_batch_submit_wait(sb_, &sd_, 1, (ms)));                      \
        CHECK_ST(kvt_batch_entry(sb_, 0, NULL), (status));                     \
        CHECK_OK(kvt_batch_free(sb_));                                         \
    } while (0)
#define SYNC(e, d, status) SYNC_MS(e, d, status, 30000)
/* Not produced for any of the three, nor for kvt_batch_submit_wait(). */
#define NOT_HERE(status, why)                                                  \
    UNCOVERED(kvt_batch_entry, status, why);                                   \
    UNCOVERED(kvt_batch_query, status, why);                                   \
    UNCOVERED(kvt_batch_wait, status, why);                                    \
    UNCOVERED(kvt_batch_submit_wait, status, why)

static kvt_engine_h engine(uint32_t transports, uint64_t timeout_ms,
                           uint64_t connect_ms)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;

    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    p.transports = transports;
    if (timeout_ms) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSFER_TIMEOUT;
        p.transfer_timeout_ms = timeout_ms;
    }
    if (connect_ms) {
        p.field_mask |= KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
        p.connect_timeout_ms = connect_ms;
    }
    CHECK_OK(kvt_engine_create(&p, &e));
    return e;
}

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

/* ---- Fake peers --------------------------------------------------------- */

/*
 * A listener on 127.0.0.1 whose one connection gets @reply after the
 * peer's first bytes (NULL: nothing, the connection stays silent; "close":
 * closed at once). Runs in a thread until the peer closes (at most 3 s);
 * fake_stop() joins it.
 */
typedef struct {
    int ls;
    uint16_t port;
    uint8_t reply[64];
    size_t reply_len;
    int close_it;
    pthread_t th;
} fake_t;

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    uint8_t buf[512];
    int fd = accept(f->ls, NULL, NULL);

    if (fd < 0)
        return NULL;
    if (recv(fd, buf, sizeof(buf), 0) > 0) {
        if (f->close_it) {
            close(fd);
            return NULL;
        }
        if (f->reply_len > 0 &&
            send(fd, f->reply, f->reply_len, MSG_NOSIGNAL) < 0)
            (void)0;
    }
    /* Until the peer gives up: longer than any connect timeout here. */
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 3000) <= 0 || recv(fd, buf, sizeof(buf), 0) <= 0)
            break;
    }
    close(fd);
    return NULL;
}

/* A frame header (docs/protocol.md, "Frame"). */
static size_t header(uint8_t *b, uint8_t major, uint8_t type, int32_t status,
                     uint32_t body_len)
{
    memset(b, 0, 32);
    b[0] = 0x4b; /* "KT", little-endian 0x544b */
    b[1] = 0x54;
    b[2] = major;
    b[4] = type;
    memcpy(b + 8, &body_len, 4);
    memcpy(b + 12, &status, 4);
    return 32;
}

static void fake_start(fake_t *f, const uint8_t *reply, size_t len,
                       int close_it)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof(a);

    memset(f, 0, sizeof(*f));
    f->ls = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(f->ls, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(listen(f->ls, 4) == 0);
    CHECK(getsockname(f->ls, (struct sockaddr *)&a, &al) == 0);
    f->port = ntohs(a.sin_port);
    if (reply != NULL)
        memcpy(f->reply, reply, len);
    f->reply_len = len;
    f->close_it = close_it;
    CHECK(pthread_create(&f->th, NULL, fake_main, f) == 0);
}

static void fake_stop(fake_t *f)
{
    shutdown(f->ls, SHUT_RDWR); /* a fake never dialed leaves accept() */
    pthread_join(f->th, NULL);
    close(f->ls);
}

/* Open the fake's segment with @e and return what kvt_segment_open says. */
static kvt_status_t open_fake(kvt_engine_h e, const fake_t *f)
{
    char name[64];
    kvt_segment_t seg;

    snprintf(name, sizeof(name), "127.0.0.1:%u", f->port);
    return kvt_segment_open(e, name, &seg);
}

/* ---- Engine ------------------------------------------------------------- */

KVT_TEST(transports_and_engines)
{
    kvt_transport_info_t t[16];
    kvt_engine_params_t p = {0};
    kvt_engine_h e, e2;
    size_t n;

    COVER(kvt_transports, KVT_OK, kvt_transports(t, 16, &n));
    CHECK(n >= 1);
    COVER(kvt_transports, KVT_ERR_INVALID_PARAM, kvt_transports(t, 1, NULL));
    {
        uint32_t bits = 0;
        COVER(kvt_transport_bits, KVT_OK,
              kvt_transport_bits("tcp, ucx", &bits));
        CHECK(bits == (KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX));
        CHECK_OK(kvt_transport_bits("all", &bits));
        CHECK(bits == KVT_TRANSPORT_ALL);
        COVER(kvt_transport_bits, KVT_ERR_INVALID_PARAM,
              kvt_transport_bits("tcp,rdma", &bits));
        CHECK_ST(kvt_transport_bits(",", &bits), KVT_ERR_INVALID_PARAM);
        CHECK_ST(kvt_transport_bits("tc", &bits), KVT_ERR_INVALID_PARAM);
        COVER(kvt_mem_kind_bits, KVT_OK, kvt_mem_kind_bits("host,cuda", &bits));
        CHECK(bits == 3);
        COVER(kvt_mem_kind_bits, KVT_ERR_INVALID_PARAM,
              kvt_mem_kind_bits("all", &bits));
        CHECK_ST(kvt_mem_kind_bits(NULL, &bits), KVT_ERR_INVALID_PARAM);
    }
    COVER(kvt_transports, KVT_ERR_INVALID_PARAM, kvt_transports(NULL, 1, &n));
    {
        kvt_mem_domain_info_t d[8];
        size_t nd = 0;
        int host = 0;
        COVER(kvt_mem_domains, KVT_OK, kvt_mem_domains(d, 8, &nd));
        CHECK(nd >= 1 && nd <= 8);
        for (size_t i = 0; i < nd; i++) {
            CHECK(d[i].name != NULL && d[i].detail != NULL);
            if (d[i].kind == KVT_MEM_HOST)
                host = d[i].available == 1 && strcmp(d[i].name, "host") == 0;
        }
        CHECK(host);
        COVER(kvt_mem_domains, KVT_ERR_INVALID_PARAM,
              kvt_mem_domains(d, 1, NULL));
        COVER(kvt_mem_domains, KVT_ERR_INVALID_PARAM,
              kvt_mem_domains(NULL, 1, &nd));
    }

    COVER(kvt_engine_create, KVT_OK, kvt_engine_create(NULL, &e));
    p.field_mask = KVT_ENGINE_PARAM_NUM_WORKERS;
    p.num_workers = 0;
    COVER(kvt_engine_create, KVT_ERR_INVALID_PARAM, kvt_engine_create(&p, &e2));
    COVER(kvt_engine_create, KVT_ERR_INVALID_PARAM,
          kvt_engine_create(NULL, NULL));
    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    p.transports = 1u << 30; /* no such transport is built in */
    COVER(kvt_engine_create, KVT_ERR_NOT_SUPPORTED, kvt_engine_create(&p, &e2));
    p.field_mask = KVT_ENGINE_PARAM_PORT;
    p.port = kvt_engine_rpc_port(e); /* taken */
    COVER(kvt_engine_create, KVT_ERR_IO, kvt_engine_create(&p, &e2));
    UNCOVERED(kvt_engine_create, KVT_ERR_NO_MEMORY, "allocation failure");
    kvt_engine_destroy(e);
}

/* ---- Memory -------------------------------------------------------------- */

/* Whether every page of [@p, @p + @len) is mapped (msync() fails with
 * ENOMEM on an unmapped one). */
static int mapped(const void *p, size_t len)
{
    return msync((void *)p, len, MS_ASYNC) == 0;
}

/*
 * Register [@p, @p + @len), which is not all mapped: KVT_ERR_NOT_SUPPORTED
 * is checked, and 0 returned. Another thread may map memory there
 * meanwhile (an engine's thread, the sanitizers' allocator: seen under
 * ASan, the call then registered what had become mapped): 1 when the
 * range was whole before or after the call, nothing checked (and what
 * was registered withdrawn); the caller tries another range.
 */
static int register_unmapped(kvt_engine_h e, uint8_t *p, size_t len)
{
    kvt_status_t st;

    if (mapped(p, len))
        return 1;
    st = kvt_mem_register(e, p, len, 3);
    if (mapped(p, len)) {
        if (st == KVT_OK)
            CHECK_OK(kvt_mem_unregister(e, p));
        return 1;
    }
    CHECK_ST(st, KVT_ERR_NOT_SUPPORTED);
    return 0;
}

KVT_TEST(memory)
{
    kvt_engine_h e = engine(KVT_TRANSPORT_TCP, 0, 0);
    uint8_t *buf = map(1 << 20);
    kvt_mem_params_t mp = {0};
    kvt_mem_region_t r[2] = {{buf, 4096, 3, KVT_MEM_HOST, -1, 0},
                             {buf + 2048, 4096, 3, KVT_MEM_HOST, -1, 0}};
    void *addrs[2] = {buf, buf + 8192}, *m;

    COVER(kvt_mem_register, KVT_OK, kvt_mem_register(e, buf, 4096, 3));
    COVER(kvt_mem_register, KVT_ERR_EXISTS,
          kvt_mem_register(e, buf + 100, 10, 3));
    COVER(kvt_mem_register, KVT_ERR_INVALID_PARAM,
          kvt_mem_register(e, buf + 8192, 0, 3));
    COVER(kvt_mem_register, KVT_ERR_INVALID_PARAM,
          kvt_mem_register(e, buf + 8192, 10, 0x80));
    {
        /* Not host memory: reserved without access (as a GPU driver
         * reserves device memory), and unmapped. */
        uint8_t *none =
            mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(none != MAP_FAILED);
        COVER(kvt_mem_register, KVT_ERR_NOT_SUPPORTED,
              kvt_mem_register(e, none, 8192, 3));
        CHECK(munmap(none, 8192) == 0);
        for (int tries = 1; register_unmapped(e, none, 4096); tries++) {
            CHECK(tries < 10);
            none =
                mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(none != MAP_FAILED && munmap(none, 8192) == 0);
        }
        /* Mapped, then not: the range runs past a mapping's end. */
        for (int tries = 1;; tries++) {
            CHECK(tries < 10);
            none = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(none != MAP_FAILED);
            CHECK(munmap(none + 2 * 4096, 4096) == 0);
            if (!register_unmapped(e, none + 4096, 8192))
                break;
            CHECK(munmap(none, 3 * 4096) == 0);
        }
        CHECK_OK(kvt_mem_register(e, none + 4096, 4096, 3));
        CHECK_OK(kvt_mem_unregister(e, none + 4096));
        CHECK(munmap(none, 2 * 4096) == 0);
    }
    COVER(kvt_mem_unregister, KVT_OK, kvt_mem_unregister(e, buf));
    COVER(kvt_mem_unregister, KVT_ERR_NOT_FOUND, kvt_mem_unregister(e, buf));
    COVER(kvt_mem_unregister, KVT_ERR_INVALID_PARAM,
          kvt_mem_unregister(e, NULL));

    COVER(kvt_mem_register_ex, KVT_OK, kvt_mem_register_ex(e, buf, 4096, NULL));
    COVER(kvt_mem_register_ex, KVT_ERR_EXISTS,
          kvt_mem_register_ex(e, buf, 10, NULL));
    mp.field_mask = 1u << 12;
    COVER(kvt_mem_register_ex, KVT_ERR_INVALID_PARAM,
          kvt_mem_register_ex(e, buf + 8192, 4096, &mp));
    mp.field_mask = KVT_MEM_PARAM_KIND;
    mp.kind = KVT_MEM_CUDA; /* no memory domain for it in this build */
    COVER(kvt_mem_register_ex, KVT_ERR_NOT_SUPPORTED,
          kvt_mem_register_ex(e, buf + 8192, 4096, &mp));
    CHECK_OK(kvt_mem_unregister(e, buf));

    COVER(kvt_mem_register_batch, KVT_ERR_EXISTS,
          kvt_mem_register_batch(e, r, 2)); /* they overlap each other */
    r[1].addr = buf + 8192;
    r[1].kind = KVT_MEM_CUDA;
    COVER(kvt_mem_register_batch, KVT_ERR_NOT_SUPPORTED,
          kvt_mem_register_batch(e, r, 2));
    r[1].kind = KVT_MEM_AUTO;
    r[1].length = 0;
    COVER(kvt_mem_register_batch, KVT_ERR_INVALID_PARAM,
          kvt_mem_register_batch(e, r, 2));
    r[1].length = 4096;
    COVER(kvt_mem_register_batch, KVT_OK, kvt_mem_register_batch(e, r, 2));
    COVER(kvt_mem_unregister_batch, KVT_OK,
          kvt_mem_unregister_batch(e, addrs, 2));
    COVER(kvt_mem_unregister_batch, KVT_ERR_NOT_FOUND,
          kvt_mem_unregister_batch(e, addrs, 2));
    COVER(kvt_mem_unregister_batch, KVT_ERR_INVALID_PARAM,
          kvt_mem_unregister_batch(e, NULL, 1));

    COVER(kvt_mem_alloc, KVT_OK, kvt_mem_alloc(e, 1 << 20, 3, &m));
    COVER(kvt_mem_alloc, KVT_ERR_INVALID_PARAM, kvt_mem_alloc(e, 0, 3, &m));
    COVER(kvt_mem_alloc, KVT_ERR_NO_MEMORY,
          kvt_mem_alloc(e, (size_t)1 << 60, 3, &addrs[0]));
    COVER(kvt_mem_free, KVT_OK, kvt_mem_free(e, m));
    COVER(kvt_mem_free, KVT_ERR_NOT_FOUND, kvt_mem_free(e, m));
    COVER(kvt_mem_free, KVT_ERR_INVALID_PARAM, kvt_mem_free(NULL, m));
    {
        kvt_mem_params_t ap = {0};
        ap.field_mask = KVT_MEM_PARAM_ACCESS;
        ap.access = KVT_ACCESS_REMOTE_READ;
        COVER(kvt_mem_alloc_ex, KVT_OK, kvt_mem_alloc_ex(e, 8192, &ap, &m));
        CHECK_OK(kvt_mem_free(e, m));
        COVER(kvt_mem_alloc_ex, KVT_OK, kvt_mem_alloc_ex(e, 8192, NULL, &m));
        CHECK_OK(kvt_mem_free(e, m));
        COVER(kvt_mem_alloc_ex, KVT_ERR_INVALID_PARAM,
              kvt_mem_alloc_ex(e, 0, NULL, &m));
        COVER(kvt_mem_alloc_ex, KVT_ERR_INVALID_PARAM,
              kvt_mem_alloc_ex(e, 4096, NULL, NULL));
        ap.field_mask = 1u << 9;
        COVER(kvt_mem_alloc_ex, KVT_ERR_INVALID_PARAM,
              kvt_mem_alloc_ex(e, 4096, &ap, &m));
        ap.field_mask = KVT_MEM_PARAM_KIND;
        ap.kind = KVT_MEM_AUTO;
        COVER(kvt_mem_alloc_ex, KVT_ERR_INVALID_PARAM,
              kvt_mem_alloc_ex(e, 4096, &ap, &m));
        COVER(kvt_mem_alloc_ex, KVT_ERR_NO_MEMORY,
              kvt_mem_alloc_ex(e, (size_t)1 << 60, NULL, &m));
        {
            char a[64] = "kvt", b[64] = {0};
            COVER(kvt_mem_copy, KVT_OK, kvt_mem_copy(b, a, sizeof(a)));
            CHECK(strcmp(b, "kvt") == 0);
            COVER(kvt_mem_copy, KVT_OK, kvt_mem_copy(NULL, NULL, 0));
            COVER(kvt_mem_copy, KVT_ERR_INVALID_PARAM,
                  kvt_mem_copy(NULL, a, 1));
            UNCOVERED(kvt_mem_copy, KVT_ERR_IO,
                      "a device copy failing: tests/cuda device_copy_fails");
        }
        /* No CUDA driver here (tests/cuda covers the double's). */
        ap.kind = KVT_MEM_CUDA;
        COVER(kvt_mem_alloc_ex, KVT_ERR_NOT_SUPPORTED,
              kvt_mem_alloc_ex(e, 4096, &ap, &m));
        {
            kvt_xfer_desc_t d = {0};
            d.opcode = KVT_OP_WRITE;
            d.local_addr = &d;
            d.length = 8;
            COVER(kvt_transfer_on_stream, KVT_ERR_NOT_SUPPORTED,
                  kvt_transfer_on_stream(e, &d, 1, NULL, NULL, NULL));
            COVER(kvt_transfer_on_stream, KVT_ERR_INVALID_PARAM,
                  kvt_transfer_on_stream(NULL, &d, 1, NULL, NULL, NULL));
            COVER(kvt_transfer_on_stream, KVT_ERR_INVALID_PARAM,
                  kvt_transfer_on_stream(e, NULL, 1, NULL, NULL, NULL));
            COVER(kvt_transfer_on_stream, KVT_ERR_INVALID_PARAM,
                  kvt_transfer_on_stream(e, &d, 0, NULL, NULL, NULL));
            UNCOVERED(kvt_transfer_on_stream, KVT_OK,
                      "needs a driver: tests/cuda/test_cuda_stream.c");
            UNCOVERED(kvt_transfer_on_stream, KVT_ERR_IO,
                      "a driver refusing: test_cuda_stream refusals");
            UNCOVERED(kvt_transfer_on_stream, KVT_ERR_NO_MEMORY,
                      "allocation failure");
            UNCOVERED(kvt_transfer_on_stream, KVT_ERR_CLOSED,
                      "a call racing the engine's destruction");
        }
    }

    UNCOVERED(kvt_mem_register, KVT_ERR_NO_MEMORY, "allocation failure");
    UNCOVERED(kvt_mem_register, KVT_ERR_IO,
              "no transport built in registers memory itself; test_engine "
              "transport_keys refuses one with a test transport");
    UNCOVERED(kvt_mem_register_ex, KVT_ERR_NO_MEMORY, "allocation failure");
    UNCOVERED(kvt_mem_register_ex, KVT_ERR_IO, "as kvt_mem_register");
    UNCOVERED(kvt_mem_register_batch, KVT_ERR_NO_MEMORY, "allocation failure");
    UNCOVERED(kvt_mem_register_batch, KVT_ERR_IO, "as kvt_mem_register");
    UNCOVERED(kvt_mem_alloc, KVT_ERR_IO, "as kvt_mem_register");
    UNCOVERED(kvt_mem_alloc_ex, KVT_ERR_IO,
              "a device driver failing an allocation otherwise than for "
              "want of memory");
    kvt_engine_destroy(e);
}

/* The registry's limit: 1,048,576 regions, then KVT_ERR_NO_SPACE. */
KVT_TEST(memory_full)
{
    enum { N = 1 << 20, LEN = 64 };
    kvt_engine_h e = engine(KVT_TRANSPORT_TCP, 0, 0);
    kvt_mem_region_t *r = calloc(N + 1, sizeof(*r));
    uint8_t *buf = map((size_t)N * LEN + 3 * 4096);
    kvt_mem_params_t mp = {0};
    void *m;

    for (size_t i = 0; i <= N; i++)
        r[i] = (kvt_mem_region_t){buf + i * LEN, LEN, 3, KVT_MEM_HOST, -1, 0};
    CHECK_OK(kvt_mem_register_batch(e, r, N)); /* exactly the limit */
    COVER(kvt_mem_register_batch, KVT_ERR_NO_SPACE,
          kvt_mem_register_batch(e, r + N, 1));
    COVER(kvt_mem_register, KVT_ERR_NO_SPACE,
          kvt_mem_register(e, buf + (size_t)N * LEN, 4096, 3));
    COVER(kvt_mem_register_ex, KVT_ERR_NO_SPACE,
          kvt_mem_register_ex(e, buf + (size_t)N * LEN, 4096, &mp));
    COVER(kvt_mem_alloc, KVT_ERR_NO_SPACE, kvt_mem_alloc(e, 4096, 3, &m));
    COVER(kvt_mem_alloc_ex, KVT_ERR_NO_SPACE,
          kvt_mem_alloc_ex(e, 4096, NULL, &m));
    free(r);
    kvt_engine_destroy(e);
}

/* ---- Segments -------------------------------------------------------------
 */

KVT_TEST(segments)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP, 0, 0, 0, 0};
    kvt_engine_h e;
    kvt_segment_t seg, other;
    kvt_segment_info_t info;
    kvt_remote_region_t rr[4];
    const char *name;
    size_t n;
    peer_t p;

    CHECK(peer_start(&p, &o) == 0);
    e = engine(KVT_TRANSPORT_TCP, 0, 1000);
    COVER(kvt_segment_open, KVT_OK, kvt_segment_open(e, p.segment, &seg));
    COVER(kvt_segment_open, KVT_ERR_INVALID_PARAM,
          kvt_segment_open(e, "no-port", &other));
    COVER(kvt_segment_regions, KVT_OK,
          kvt_segment_regions(e, seg, 1, rr, 4, &n));
    CHECK(n == 3);
    COVER(kvt_segment_regions, KVT_ERR_INVALID_PARAM,
          kvt_segment_regions(e, seg, 0, NULL, 4, &n));
    COVER(kvt_segment_info, KVT_OK, kvt_segment_info(e, seg, &info));
    CHECK(info.nregions == 3 && (info.offered & KVT_TRANSPORT_TCP));
    COVER(kvt_segment_info, KVT_ERR_INVALID_PARAM,
          kvt_segment_info(e, seg, NULL));
    COVER(kvt_segment_transport, KVT_OK,
          kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_HOST, &name));
    CHECK(strcmp(name, "tcp") == 0);
    /* Device memory: tcp moves it when this build has a device memory
     * domain (staging); see segment_transport_unsupported. */
    {
        kvt_transport_info_t t[16];
        size_t nt = 0;
        kvt_status_t want = KVT_ERR_NOT_SUPPORTED;
        CHECK_OK(kvt_transports(t, 16, &nt));
        for (size_t i = 0; i < nt && i < 16; i++)
            if (strcmp(t[i].name, "tcp") == 0 &&
                (t[i].local_mem & (1u << KVT_MEM_CUDA)))
                want = KVT_OK;
        CHECK_ST(
            kvt_segment_transport(e, seg, KVT_MEM_CUDA, KVT_MEM_HOST, &name),
            want);
    }
    COVER(kvt_segment_transport, KVT_ERR_INVALID_PARAM,
          kvt_segment_transport(e, seg, KVT_MEM_AUTO, KVT_MEM_HOST, &name));
    {
        char why[384];
        COVER(kvt_segment_transport_reason, KVT_OK,
              kvt_segment_transport_reason(e, seg, KVT_MEM_HOST, KVT_MEM_HOST,
                                           why, sizeof(why)));
        CHECK(strncmp(why, "tcp (", 5) == 0);
        COVER(kvt_segment_transport_reason, KVT_ERR_INVALID_PARAM,
              kvt_segment_transport_reason(e, seg, KVT_MEM_HOST, KVT_MEM_HOST,
                                           why, 0));
        COVER(kvt_segment_transport_reason, KVT_ERR_NOT_FOUND,
              kvt_segment_transport_reason(e, seg + 1, KVT_MEM_HOST,
                                           KVT_MEM_HOST, why, sizeof(why)));
    }
    /* The target goes: a refresh cannot reach it. */
    peer_kill(&p, SIGKILL);
    COVER(kvt_segment_regions, KVT_ERR_UNREACHABLE,
          kvt_segment_regions(e, seg, 1, rr, 4, &n));
    COVER(kvt_segment_close, KVT_OK, kvt_segment_close(e, seg));
    COVER(kvt_segment_close, KVT_ERR_NOT_FOUND, kvt_segment_close(e, seg));
    COVER(kvt_segment_close, KVT_ERR_INVALID_PARAM,
          kvt_segment_close(NULL, seg));
    COVER(kvt_segment_regions, KVT_ERR_NOT_FOUND,
          kvt_segment_regions(e, seg, 0, rr, 4, &n));
    COVER(kvt_segment_info, KVT_ERR_NOT_FOUND, kvt_segment_info(e, seg, &info));
    COVER(kvt_segment_transport, KVT_ERR_NOT_FOUND,
          kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_HOST, &name));
    COVER(kvt_segment_open, KVT_ERR_UNREACHABLE,
          kvt_segment_open(e, p.segment, &other));
    UNCOVERED(kvt_segment_regions, KVT_ERR_TIMEDOUT,
              "the fetch of kvt_segment_open, whose failures are produced "
              "below");
    UNCOVERED(kvt_segment_regions, KVT_ERR_CONN_LOST, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_VERSION, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_PROTOCOL, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_AUTH, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_ACCESS, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_BUSY, "as TIMEDOUT");
    UNCOVERED(kvt_segment_regions, KVT_ERR_NO_MEMORY, "allocation failure");
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/* Peers that answer wrongly, or not at all (docs/protocol.md). */
KVT_TEST(segment_open_refused)
{
    kvt_engine_h e = engine(KVT_TRANSPORT_TCP, 2000, 300);
    uint8_t b[64];
    fake_t f;
    size_t n;

    fake_start(&f, NULL, 0, 0); /* silent */
    COVER(kvt_segment_open, KVT_ERR_TIMEDOUT, open_fake(e, &f));
    fake_stop(&f);
    fake_start(&f, NULL, 0, 1); /* closes after the HELLO */
    COVER(kvt_segment_open, KVT_ERR_CONN_LOST, open_fake(e, &f));
    fake_stop(&f);
    n = header(b, 3, 2, 0, 0); /* a HELLO_ACK of protocol 3 */
    fake_start(&f, b, n, 0);
    COVER(kvt_segment_open, KVT_ERR_VERSION, open_fake(e, &f));
    fake_stop(&f);
    n = header(b, 2, 13, 0, 0); /* a PONG where HELLO_ACK belongs */
    fake_start(&f, b, n, 0);
    COVER(kvt_segment_open, KVT_ERR_PROTOCOL, open_fake(e, &f));
    fake_stop(&f);
    memcpy(b, "HTTP/1.1 400 Bad Request\r\n\r\n....", 32);
    fake_start(&f, b, 32, 0);
    COVER(kvt_segment_open, KVT_ERR_PROTOCOL, open_fake(e, &f));
    fake_stop(&f);
    n = header(b, 2, 3, KVT_ERR_ACCESS, 0); /* ERROR: access, in a handshake */
    fake_start(&f, b, n, 0);
    COVER(kvt_segment_open, KVT_ERR_AUTH, open_fake(e, &f));
    fake_stop(&f);
    UNCOVERED(kvt_segment_open, KVT_ERR_ACCESS,
              "shm: this process may not attach to the peer's (ptrace "
              "restrictions), which this program does not arrange");
    n = header(b, 2, 3, KVT_ERR_BUSY, 0);
    fake_start(&f, b, n, 0);
    COVER(kvt_segment_open, KVT_ERR_BUSY, open_fake(e, &f));
    fake_stop(&f);
    n = header(b, 2, 3, KVT_ERR_NO_SPACE, 0); /* not a refusal's reason */
    fake_start(&f, b, n, 0);
    COVER(kvt_segment_open, KVT_ERR_PROTOCOL, open_fake(e, &f));
    fake_stop(&f);
    kvt_engine_destroy(e);
}

/* A pair of memory kinds no transport of the session serves: device
 * memory over shm alone. */
KVT_TEST(segment_transport_unsupported)
{
    peer_opts_t o = {KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_engine_h e;
    kvt_segment_t seg;
    const char *name;
    peer_t p;

    CHECK(peer_start(&p, &o) == 0);
    e = engine(KVT_TRANSPORT_SHM, 0, 0);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    COVER(kvt_segment_transport, KVT_ERR_NOT_SUPPORTED,
          kvt_segment_transport(e, seg, KVT_MEM_CUDA, KVT_MEM_HOST, &name));
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/* No transport both engines run: the target serves shm only. */
KVT_TEST(segment_open_no_common_transport)
{
    peer_opts_t o = {KVT_TRANSPORT_SHM, 0, 0, 0, 0};
    kvt_engine_h e;
    kvt_segment_t seg;
    peer_t p;

    CHECK(peer_start(&p, &o) == 0);
    e = engine(KVT_TRANSPORT_TCP, 0, 0);
    COVER(kvt_segment_open, KVT_ERR_NOT_SUPPORTED,
          kvt_segment_open(e, p.segment, &seg));
    UNCOVERED(kvt_segment_open, KVT_ERR_IO,
              "a transport failing to set up a session it could reach "
              "(epoll registration), or a metadata backend's I/O error");
    UNCOVERED(kvt_segment_open, KVT_ERR_NO_SPACE, "2^30 segments open at once");
    UNCOVERED(kvt_segment_open, KVT_ERR_CLOSED,
              "an open racing with kvt_engine_destroy(), which the API "
              "forbids");
    UNCOVERED(kvt_segment_open, KVT_ERR_NO_MEMORY, "allocation failure");
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/* ---- Batches ------------------------------------------------------------- */

typedef struct {
    peer_t p;
    kvt_engine_h e;
    kvt_segment_t seg;
    uint8_t *local;
} pair_t;

static void pair_up(pair_t *x, uint64_t timeout_ms)
{
    peer_opts_t o = {KVT_TRANSPORT_TCP, 0, 0, 0, 0};

    CHECK(peer_start(&x->p, &o) == 0);
    x->e = engine(KVT_TRANSPORT_TCP, timeout_ms, 0);
    x->local = map(1 << 20);
    CHECK_OK(kvt_mem_register(x->e, x->local, 1 << 20, 3));
    CHECK_OK(kvt_segment_open(x->e, x->p.segment, &x->seg));
}

static kvt_xfer_desc_t wr(const pair_t *x, uint64_t raddr, uint64_t len)
{
    kvt_xfer_desc_t d = {0};
    d.opcode = KVT_OP_WRITE;
    d.segment = x->seg;
    d.local_addr = x->local;
    d.remote_addr = raddr;
    d.length = len;
    return d;
}

/* Close @x's segment after @ms milliseconds, from another thread. */
typedef struct {
    pair_t *x;
    unsigned ms;
} closer_t;

static void *close_main(void *arg)
{
    closer_t *c = arg;
    usleep(c->ms * 1000u);
    CHECK_OK(kvt_segment_close(c->x->e, c->x->seg));
    return NULL;
}

/* Kill @x's stopped peer after @ms milliseconds, from another thread. */
static void *killer_main(void *arg)
{
    closer_t *c = arg;
    usleep(c->ms * 1000u);
    peer_kill(&c->x->p, SIGKILL);
    return NULL;
}

/* A synchronous 4 KiB write to @x's peer with no timeout, ending with
 * @want, while another thread runs @act 300 ms in. */
static void sync_meanwhile(pair_t *x, void *(*act)(void *), kvt_status_t want)
{
    closer_t c = {x, 300};
    pthread_t th;

    CHECK(pthread_create(&th, NULL, act, &c) == 0);
    SYNC_MS(x->e, wr(x, x->p.main_addr, 4096), want, -1);
    pthread_join(th, NULL);
}

/* A batch with @d submitted alone. */
static kvt_batch_h one(kvt_engine_h e, kvt_xfer_desc_t d)
{
    kvt_batch_h b;

    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    return b;
}

KVT_TEST(batches)
{
    pair_t x;
    kvt_batch_h b;
    kvt_xfer_desc_t d[2];
    kvt_batch_state_t bs;

    pair_up(&x, 0);
    COVER(kvt_batch_create, KVT_OK, kvt_batch_create(x.e, 2, &b));
    COVER(kvt_batch_create, KVT_ERR_INVALID_PARAM,
          kvt_batch_create(x.e, 0, &b));
    COVER(kvt_batch_create, KVT_ERR_INVALID_PARAM,
          kvt_batch_create(x.e, (1u << 20) + 1, &b));
    UNCOVERED(kvt_batch_create, KVT_ERR_NO_MEMORY, "allocation failure");
    CHECK_OK(kvt_batch_create(x.e, 2, &b));
    d[0] = wr(&x, x.p.main_addr, 4096);
    d[1] = d[0];
    COVER(kvt_batch_set_idle_cb, KVT_OK, kvt_batch_set_idle_cb(b, NULL, NULL));
    COVER(kvt_batch_set_idle_cb, KVT_ERR_INVALID_PARAM,
          kvt_batch_set_idle_cb(NULL, NULL, NULL));
    COVER(kvt_batch_submit, KVT_OK, kvt_batch_submit(b, d, 2));
    COVER(kvt_batch_submit, KVT_ERR_NO_SPACE, kvt_batch_submit(b, d, 1));
    COVER(kvt_batch_submit, KVT_ERR_INVALID_PARAM,
          kvt_batch_submit(NULL, d, 1));
    UNCOVERED(kvt_batch_submit, KVT_ERR_NO_MEMORY, "allocation failure");
    COVER(kvt_batch_wait, KVT_OK, kvt_batch_wait(b, 30000));
    COVER(kvt_batch_query, KVT_OK, kvt_batch_query(b, &bs));
    CHECK(bs.completed == 2 && bs.pending == 0);
    COVER(kvt_batch_entry, KVT_OK, kvt_batch_entry(b, 1, NULL));
    COVER(kvt_batch_entry, KVT_ERR_INVALID_PARAM, kvt_batch_entry(b, 2, NULL));
    COVER(kvt_batch_query, KVT_ERR_INVALID_PARAM, kvt_batch_query(NULL, &bs));
    COVER(kvt_batch_wait, KVT_ERR_INVALID_PARAM, kvt_batch_wait(NULL, 0));
    COVER(kvt_batch_reset, KVT_OK, kvt_batch_reset(b));
    COVER(kvt_batch_reset, KVT_ERR_INVALID_PARAM, kvt_batch_reset(NULL));
    /* A stopped target holds the batch in flight. */
    peer_kill(&x.p, SIGSTOP);
    CHECK_OK(kvt_batch_submit(b, d, 1));
    COVER(kvt_batch_wait, KVT_INPROGRESS, kvt_batch_wait(b, 50));
    COVER(kvt_batch_query, KVT_INPROGRESS, kvt_batch_query(b, NULL));
    COVER(kvt_batch_entry, KVT_INPROGRESS, kvt_batch_entry(b, 0, NULL));
    COVER(kvt_batch_reset, KVT_ERR_BUSY, kvt_batch_reset(b));
    COVER(kvt_batch_free, KVT_ERR_BUSY, kvt_batch_free(b));
    peer_kill(&x.p, SIGCONT);
    CHECK_OK(kvt_batch_wait(b, 30000));
    COVER(kvt_batch_free, KVT_OK, kvt_batch_free(b));
    COVER(kvt_batch_free, KVT_OK, kvt_batch_free(NULL));

    /* Submitted and waited for in one call. */
    CHECK_OK(kvt_batch_create(x.e, 2, &b));
    COVER(kvt_batch_submit_wait, KVT_OK, kvt_batch_submit_wait(b, d, 2, 30000));
    CHECK_ST(kvt_batch_query(b, &bs), KVT_OK);
    CHECK(bs.completed == 2 && bs.pending == 0);
    COVER(kvt_batch_submit_wait, KVT_ERR_NO_SPACE,
          kvt_batch_submit_wait(b, d, 1, 30000));
    COVER(kvt_batch_submit_wait, KVT_ERR_INVALID_PARAM,
          kvt_batch_submit_wait(NULL, d, 1, 30000));
    CHECK_OK(kvt_batch_reset(b));
    COVER(kvt_batch_submit_wait, KVT_ERR_INVALID_PARAM,
          kvt_batch_submit_wait(b, NULL, 1, 30000));
    CHECK_ST(kvt_batch_query(b, &bs), KVT_OK);
    CHECK(bs.submitted == 0); /* refused: nothing submitted */
    UNCOVERED(kvt_batch_submit_wait, KVT_ERR_NO_MEMORY, "allocation failure");
    peer_kill(&x.p, SIGSTOP);
    COVER(kvt_batch_submit_wait, KVT_INPROGRESS,
          kvt_batch_submit_wait(b, d, 1, 50));
    peer_kill(&x.p, SIGCONT);
    CHECK_OK(kvt_batch_wait(b, 30000));
    CHECK_OK(kvt_batch_free(b));

    /* Failures found at submission. */
    d[0] = wr(&x, x.p.main_addr, 0);
    b = one(x.e, d[0]);
    FINAL(b, KVT_ERR_INVALID_PARAM);
    CHECK_OK(kvt_batch_free(b));
    SYNC(x.e, d[0], KVT_ERR_INVALID_PARAM);
    d[0] = wr(&x, x.p.main_addr, 4096);
    d[0].local_addr = &d; /* not registered */
    b = one(x.e, d[0]);
    FINAL(b, KVT_ERR_NOT_REGISTERED);
    CHECK_OK(kvt_batch_free(b));
    SYNC(x.e, d[0], KVT_ERR_NOT_REGISTERED);
    d[0] = wr(&x, x.p.main_addr, KVT_NOTIFY_MAX + 1);
    d[0].opcode = KVT_OP_NOTIFY;
    b = one(x.e, d[0]);
    FINAL(b, KVT_ERR_OVERFLOW);
    CHECK_OK(kvt_batch_free(b));
    SYNC(x.e, d[0], KVT_ERR_OVERFLOW);
    d[0] = wr(&x, x.p.main_addr, 4096);
    d[0].segment = 12345;
    b = one(x.e, d[0]);
    FINAL(b, KVT_ERR_NOT_FOUND);
    CHECK_OK(kvt_batch_free(b));
    SYNC(x.e, d[0], KVT_ERR_NOT_FOUND);
    /* Refused by the target: a range it never registered. */
    b = one(x.e, wr(&x, x.p.guard_addr, 64));
    FINAL(b, KVT_ERR_ACCESS);
    CHECK_OK(kvt_batch_free(b));
    SYNC(x.e, wr(&x, x.p.guard_addr, 64), KVT_ERR_ACCESS);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
}

/* The statuses with which sessions end, seen through each call. */
KVT_TEST(batches_on_the_way)
{
    pair_t x;
    kvt_batch_h b;

    /* The transfer timeout, against a stopped target. */
    pair_up(&x, 300);
    peer_kill(&x.p, SIGSTOP);
    b = one(x.e, wr(&x, x.p.main_addr, 4096));
    FINAL(b, KVT_ERR_TIMEDOUT);
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(x.e);
    peer_kill(&x.p, SIGCONT);
    peer_stop(&x.p);
    pair_up(&x, 300);
    peer_kill(&x.p, SIGSTOP);
    SYNC(x.e, wr(&x, x.p.main_addr, 4096), KVT_ERR_TIMEDOUT);
    peer_kill(&x.p, SIGCONT);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    pair_up(&x, 300);
    peer_kill(&x.p, SIGSTOP);
    SYNC_MS(x.e, wr(&x, x.p.main_addr, 4096), KVT_ERR_TIMEDOUT, -1);
    peer_kill(&x.p, SIGCONT);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    /* Closed with the transfer in flight. */
    pair_up(&x, 0);
    peer_kill(&x.p, SIGSTOP);
    b = one(x.e, wr(&x, x.p.main_addr, 4096));
    CHECK_OK(kvt_segment_close(x.e, x.seg));
    FINAL(b, KVT_ERR_CANCELED);
    CHECK_OK(kvt_batch_free(b));
    /* ... and while a thread waits in kvt_batch_submit_wait(). */
    peer_kill(&x.p, SIGCONT);
    CHECK_OK(kvt_segment_open(x.e, x.p.segment, &x.seg));
    peer_kill(&x.p, SIGSTOP);
    {
        closer_t c = {&x, 1000}; /* the transfer timeout is 30 s */
        pthread_t th;
        CHECK(pthread_create(&th, NULL, close_main, &c) == 0);
        SYNC(x.e, wr(&x, x.p.main_addr, 4096), KVT_ERR_CANCELED);
        pthread_join(th, NULL);
    }
    peer_kill(&x.p, SIGCONT);
    CHECK_OK(kvt_segment_open(x.e, x.p.segment, &x.seg));
    peer_kill(&x.p, SIGSTOP);
    sync_meanwhile(&x, close_main, KVT_ERR_CANCELED);
    peer_kill(&x.p, SIGCONT);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    /* The target dies. */
    pair_up(&x, 0);
    peer_kill(&x.p, SIGKILL);
    b = one(x.e, wr(&x, x.p.main_addr, 4096));
    FINAL(b, KVT_ERR_CONN_LOST);
    CHECK_OK(kvt_batch_free(b));
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    pair_up(&x, 0);
    peer_kill(&x.p, SIGKILL);
    SYNC(x.e, wr(&x, x.p.main_addr, 4096), KVT_ERR_CONN_LOST);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    pair_up(&x, 0);
    peer_kill(&x.p, SIGKILL);
    SYNC_MS(x.e, wr(&x, x.p.main_addr, 4096), KVT_ERR_CONN_LOST, -1);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    /* ... while a thread waits with no timeout: the request unread, the
     * end comes as a reset, to the read the thread sleeps in. */
    pair_up(&x, 0);
    peer_kill(&x.p, SIGSTOP);
    sync_meanwhile(&x, killer_main, KVT_ERR_CONN_LOST);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);

    NOT_HERE(KVT_ERR_NOT_SUPPORTED,
             "needs device memory, or a transport without strided pieces; "
             "no such thing is built in");
    NOT_HERE(KVT_ERR_NO_MEMORY, "allocation failure");
    NOT_HERE(KVT_ERR_PROTOCOL,
             "a peer breaking the protocol mid-session; test_engine's raw "
             "frames do it from the other side");
    NOT_HERE(KVT_ERR_VERSION, "as PROTOCOL");
    NOT_HERE(KVT_ERR_IO,
             "a same-host peer that stops letting this process attach");
}

/* ---- Notifications ------------------------------------------------------ */

typedef struct {
    pair_t *x;
    kvt_status_t st;
} notifier_t;

static void *notify_main(void *arg)
{
    notifier_t *n = arg;
    n->st = kvt_notify_send(n->x->e, n->x->seg, "late", 4);
    return NULL;
}

KVT_TEST(notifications)
{
    kvt_notify_t got[2];
    notifier_t nt;
    pthread_t th;
    size_t n;
    pair_t x;

    pair_up(&x, 0);
    COVER(kvt_notify_send, KVT_OK, kvt_notify_send(x.e, x.seg, "hi", 2));
    COVER(kvt_notify_send, KVT_ERR_OVERFLOW,
          kvt_notify_send(x.e, x.seg, x.local, KVT_NOTIFY_MAX + 1));
    COVER(kvt_notify_send, KVT_ERR_INVALID_PARAM,
          kvt_notify_send(x.e, x.seg, NULL, 2));
    COVER(kvt_notify_send, KVT_ERR_NOT_FOUND,
          kvt_notify_send(x.e, 12345, "hi", 2));
    COVER(kvt_notify_recv, KVT_OK, kvt_notify_recv(x.e, got, 2, &n, 0));
    CHECK(n == 0); /* the peer has them, not this engine */
    COVER(kvt_notify_recv, KVT_ERR_INVALID_PARAM,
          kvt_notify_recv(x.e, NULL, 2, &n, 0));
    /* Closed while the notification waits for a stopped target. */
    peer_kill(&x.p, SIGSTOP);
    nt = (notifier_t){&x, KVT_OK};
    CHECK(pthread_create(&th, NULL, notify_main, &nt) == 0);
    usleep(200 * 1000);
    CHECK_OK(kvt_segment_close(x.e, x.seg));
    pthread_join(th, NULL);
    COVER(kvt_notify_send, KVT_ERR_CANCELED, nt.st);
    peer_kill(&x.p, SIGCONT);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    pair_up(&x, 300);
    peer_kill(&x.p, SIGSTOP);
    COVER(kvt_notify_send, KVT_ERR_TIMEDOUT,
          kvt_notify_send(x.e, x.seg, "hi", 2));
    peer_kill(&x.p, SIGCONT);
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    pair_up(&x, 0);
    peer_kill(&x.p, SIGKILL);
    COVER(kvt_notify_send, KVT_ERR_CONN_LOST,
          kvt_notify_send(x.e, x.seg, "hi", 2));
    kvt_engine_destroy(x.e);
    peer_stop(&x.p);
    UNCOVERED(kvt_notify_send, KVT_ERR_NO_MEMORY, "allocation failure");
    UNCOVERED(kvt_notify_send, KVT_ERR_NOT_SUPPORTED,
              "a segment without a transport for host memory; none such "
              "opens in this build");
    UNCOVERED(kvt_notify_send, KVT_ERR_PROTOCOL, "as for kvt_batch_entry");
    UNCOVERED(kvt_notify_send, KVT_ERR_VERSION, "as for kvt_batch_entry");
    UNCOVERED(kvt_notify_send, KVT_ERR_IO, "as for kvt_batch_entry");
}

KVT_TEST_MAIN(KVT_CASE(transports_and_engines, 20), KVT_CASE(memory, 20),
              KVT_CASE(memory_full, 120), KVT_CASE(segments, 30),
              KVT_CASE(segment_open_refused, 60),
              KVT_CASE(segment_transport_unsupported, 30),
              KVT_CASE(segment_open_no_common_transport, 30),
              KVT_CASE(batches, 60), KVT_CASE(batches_on_the_way, 60),
              KVT_CASE(notifications, 60))
