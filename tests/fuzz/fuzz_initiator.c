/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the initiator's handling of a hostile target's answers:
 * a live engine, in this process, opens a segment served by a fake target
 * on loopback (also in this process), and reads, writes and notifies
 * through it; the fake target answers each request it receives with the
 * next chunk of the input. The engine must not crash, every transfer must
 * end (within the transfer timeout, or when the segment is closed), and
 * no byte of its own memory may change except the destinations of its
 * READs: a target's answer cannot write anywhere else.
 *
 * Input: chunks, each a u16 length (little endian), a flags byte and the
 * bytes. Flags: AUTO answers with what a sound target would send (the
 * HELLO_ACK and descriptor of a real engine recorded at start-up, acks
 * with empty failure lists, READ payloads with the trailer, PONG);
 * REQ_ID sets bytes 24..31 of the chunk to the request's req_id; CLOSE
 * closes the connection after the chunk. A request that finds no chunk
 * left closes its connection, as does one left unanswered for IDLE_MS.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "proto/wire.h"
#include "fuzz/fuzz_util.h"
#include "util/sock.h"
#include "util/time.h"
#include "wire_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { F_AUTO = 1, F_REQ_ID = 2, F_CLOSE = 4 };

#define MAX_CONNS 8
#define IDLE_MS 20
#define GUARD 0xa5
#define SRC_BYTE 0x3c
/* Local memory: guard | dst (READ destinations) | guard | src | guard. */
#define PAGE 4096u
#define DST_OFF PAGE
#define DST_LEN (16u * 1024u)
#define SRC_OFF (DST_OFF + DST_LEN + PAGE)
#define SRC_LEN (16u * 1024u)
#define ARENA (SRC_OFF + SRC_LEN + PAGE)
/* What the harness reads: [READ_AT, + len) of dst, and NSTRIDE pieces of
 * PIECE bytes every STRIDE bytes from STRIDED_AT. */
#define READ_AT 1024u
#define STRIDED_AT (8u * 1024u)
#define NSTRIDE 4u
#define PIECE 64u
#define STRIDE 128u

typedef struct {
    int fd;
    uint8_t hdr[KVT_WIRE_HDR_LEN];
    size_t have;       /* header bytes in hdr */
    uint64_t skip;     /* body and payload bytes still to drop */
    kvt__wire_hdr_t h; /* the request being received */
    uint64_t last_ns;
} fconn_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int listen_fd;
    int wake[2]; /* a pipe: the main thread wakes the fake target */
    uint16_t port;
    fconn_t conns[MAX_CONNS];
    unsigned nconns;
    const uint8_t *input;
    size_t size, pos; /* the next chunk */
    int drop;         /* the main thread asks for every connection closed */
} ft = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static kvt_engine_h engine;
static uint8_t *arena;
/* A real engine's answers to HELLO (control) and SEG_QUERY. */
static uint8_t *ack_frame, *desc_frame;
static size_t ack_len, desc_len;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_initiator: %s\n", what);
    abort();
}

static void send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len > 0) {
        struct pollfd pf = {fd, POLLOUT, 0};
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (poll(&pf, 1, IDLE_MS) <= 0)
                return; /* the engine stopped reading: its loss */
        } else {
            return;
        }
    }
}

/* What a sound target answers to @h. */
static void answer_auto(int fd, const kvt__wire_hdr_t *h)
{
    static uint8_t zeros[65536];
    uint8_t out[KVT_WIRE_HDR_LEN + 8];
    uint64_t left;

    switch (h->type) {
    case KVT_WIRE_HELLO:
        memcpy(ack_frame + 24, &h->req_id, 8);
        send_all(fd, ack_frame, ack_len);
        break;
    case KVT_WIRE_SEG_QUERY:
        memcpy(desc_frame + 24, &h->req_id, 8);
        send_all(fd, desc_frame, desc_len);
        break;
    case KVT_WIRE_WRITE:
        send_all(fd, out,
                 kvt_test_hdr(out, KVT_WIRE_WRITE_ACK, 0, 0, h->req_id));
        break;
    case KVT_WIRE_READ:
        send_all(fd, out,
                 kvt_test_hdr(out, KVT_WIRE_READ_RESP, 0, h->payload_len,
                              h->req_id));
        for (left = h->payload_len; left > 0;) {
            size_t n = left < sizeof(zeros) ? (size_t)left : sizeof(zeros);
            send_all(fd, zeros, n);
            left -= n;
        }
        send_all(fd, zeros, KVT_WIRE_TRAILER_LEN);
        break;
    case KVT_WIRE_NOTIFY:
        send_all(fd, out,
                 kvt_test_hdr(out, KVT_WIRE_NOTIFY_ACK, 0, 0, h->req_id));
        break;
    case KVT_WIRE_PING:
        send_all(fd, out, kvt_test_hdr(out, KVT_WIRE_PONG, 0, 0, h->req_id));
        break;
    default:
        break;
    }
}

static void conn_drop(unsigned i)
{
    close(ft.conns[i].fd);
    ft.conns[i] = ft.conns[--ft.nconns];
}

/* Answer the request just received on connection @i with the next chunk.
 * Returns 0 to keep the connection, -1 to close it. Lock held. */
static int answer(unsigned i)
{
    fconn_t *c = &ft.conns[i];
    uint8_t *chunk;
    size_t len;
    int flags;

    if (getenv("FUZZ_DEBUG"))
        fprintf(stderr, "request %u on fd %d, pos %zu/%zu\n", c->h.type, c->fd,
                ft.pos, ft.size);
    if (ft.input == NULL || ft.size - ft.pos < 3)
        return -1;
    len = (size_t)ft.input[ft.pos] | (size_t)ft.input[ft.pos + 1] << 8;
    flags = ft.input[ft.pos + 2];
    ft.pos += 3;
    if (len > ft.size - ft.pos)
        len = ft.size - ft.pos;
    if (flags & F_AUTO) {
        answer_auto(c->fd, &c->h);
    } else {
        chunk = malloc(len ? len : 1);
        if (chunk == NULL)
            die("out of memory");
        memcpy(chunk, ft.input + ft.pos, len);
        if ((flags & F_REQ_ID) && len >= KVT_WIRE_HDR_LEN)
            memcpy(chunk + 24, &c->h.req_id, 8);
        send_all(c->fd, chunk, len);
        free(chunk);
    }
    ft.pos += len;
    return flags & F_CLOSE ? -1 : 0;
}

/* Read what connection @i has; -1 when it is to be closed. Lock held. */
static int conn_read(unsigned i)
{
    fconn_t *c = &ft.conns[i];
    uint8_t buf[65536];

    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        size_t off = 0;
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (n <= 0)
            return -1;
        c->last_ns = kvt__now_ns();
        while (off < (size_t)n) {
            if (c->skip > 0) {
                size_t k = (size_t)n - off < c->skip ? (size_t)n - off
                                                     : (size_t)c->skip;
                off += k;
                c->skip -= k;
            } else {
                size_t k = KVT_WIRE_HDR_LEN - c->have;
                if (k > (size_t)n - off)
                    k = (size_t)n - off;
                memcpy(c->hdr + c->have, buf + off, k);
                c->have += k;
                off += k;
                if (c->have < KVT_WIRE_HDR_LEN)
                    break;
                if (kvt__wire_hdr_decode(c->hdr, KVT_WIRE_HDR_LEN, &c->h) !=
                    KVT_OK)
                    die("the engine sent a malformed header");
                c->skip = c->h.body_len;
                if (c->h.type == KVT_WIRE_WRITE)
                    c->skip += c->h.payload_len;
            }
            if (c->have == KVT_WIRE_HDR_LEN && c->skip == 0) {
                c->have = 0;
                if (answer(i) != 0)
                    return -1;
            }
        }
    }
}

static void *fake_target(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd p[MAX_CONNS + 2];
        unsigned n;
        uint64_t now;

        pthread_mutex_lock(&ft.lock);
        if (ft.drop) {
            while (ft.nconns > 0)
                conn_drop(0);
            ft.drop = 0;
            pthread_cond_broadcast(&ft.cond);
        }
        n = ft.nconns;
        p[0] = (struct pollfd){ft.listen_fd, POLLIN, 0};
        for (unsigned i = 0; i < n; i++)
            p[i + 1] = (struct pollfd){ft.conns[i].fd, POLLIN, 0};
        p[n + 1] = (struct pollfd){ft.wake[0], POLLIN, 0};
        pthread_mutex_unlock(&ft.lock);
        poll(p, n + 2, 10);
        if (p[n + 1].revents & POLLIN) {
            char b[64];
            (void)read(ft.wake[0], b, sizeof(b));
        }
        pthread_mutex_lock(&ft.lock);
        now = kvt__now_ns();
        if (ft.drop == 0) {
            for (unsigned i = n; i-- > 0;) {
                if ((p[i + 1].revents != 0 && conn_read(i) != 0) ||
                    (int64_t)(now - ft.conns[i].last_ns) >
                        (int64_t)IDLE_MS * 1000000)
                    conn_drop(i);
            }
        }
        if (p[0].revents & POLLIN) {
            int fd = accept4(ft.listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0 && ft.nconns < MAX_CONNS)
                ft.conns[ft.nconns++] = (fconn_t){.fd = fd, .last_ns = now};
            else if (fd >= 0)
                close(fd);
        }
        pthread_mutex_unlock(&ft.lock);
    }
    return NULL;
}

/* Receive one whole frame from @fd into a malloc'd buffer. */
static uint8_t *recv_frame(int fd, size_t *len_p)
{
    uint64_t deadline = kvt__now_ns() + 5000000000ull;
    uint8_t hb[KVT_WIRE_HDR_LEN], *f;
    kvt__wire_hdr_t h;
    size_t len;

    if (kvt__sock_recv_all(fd, hb, sizeof(hb), deadline) != KVT_OK ||
        kvt__wire_hdr_decode(hb, sizeof(hb), &h) != KVT_OK)
        die("no answer from the recording engine");
    len = KVT_WIRE_HDR_LEN + h.body_len + h.payload_len;
    f = malloc(len);
    if (f == NULL)
        die("out of memory");
    memcpy(f, hb, sizeof(hb));
    if (kvt__sock_recv_all(fd, f + sizeof(hb), len - sizeof(hb), deadline) !=
        KVT_OK)
        die("short answer from the recording engine");
    *len_p = len;
    return f;
}

/* A real engine's HELLO_ACK and SEG_DESC, for AUTO answers. */
static void record(void)
{
    static uint8_t region[64 * 1024];
    kvt_engine_params_t p = {0};
    kvt__wire_hello_t hello = {.nconns = 1, .name = "fuzz-recorder"};
    uint8_t out[KVT_WIRE_HDR_LEN + KVT_WIRE_HELLO_MAX];
    kvt_engine_h t;
    size_t n;
    int fd = -1;

    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP;
    if (kvt_engine_create(&p, &t) != KVT_OK ||
        kvt_mem_register(t, region, sizeof(region), KVT_ACCESS_REMOTE_RW) !=
            KVT_OK ||
        kvt__sock_connect("127.0.0.1", kvt_engine_rpc_port(t), 2000, &fd) !=
            KVT_OK)
        die("cannot start the recording engine");
    n = kvt__wire_hello_encode(&hello, out + KVT_WIRE_HDR_LEN,
                               KVT_WIRE_HELLO_MAX);
    kvt_test_hdr(out, KVT_WIRE_HELLO, (uint32_t)n, 0, 1);
    send_all(fd, out, KVT_WIRE_HDR_LEN + n);
    ack_frame = recv_frame(fd, &ack_len);
    send_all(fd, out, kvt_test_hdr(out, KVT_WIRE_SEG_QUERY, 0, 0, 2));
    desc_frame = recv_frame(fd, &desc_len);
    close(fd);
    kvt_engine_destroy(t);
}

static void setup(void)
{
    kvt_engine_params_t p = {0};
    pthread_t th;

    fuzz_quiet();
    record();
    if (kvt__sock_listen("127.0.0.1", 0, &ft.listen_fd, &ft.port) != KVT_OK ||
        pipe2(ft.wake, O_CLOEXEC | O_NONBLOCK) != 0)
        die("cannot listen");
    if (pthread_create(&th, NULL, fake_target, NULL) != 0)
        die("cannot start the fake target");
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS |
                   KVT_ENGINE_PARAM_CONNS_PER_PEER |
                   KVT_ENGINE_PARAM_TRANSFER_TIMEOUT |
                   KVT_ENGINE_PARAM_CONNECT_TIMEOUT;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP;
    p.conns_per_peer = 1;
    p.transfer_timeout_ms = 1000;
    p.connect_timeout_ms = 1000;
    if (kvt_engine_create(&p, &engine) != KVT_OK)
        die("cannot create the engine");
    arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED)
        die("cannot map the arena");
    if (kvt_mem_register(engine, arena + DST_OFF, DST_LEN, 0) != KVT_OK ||
        kvt_mem_register(engine, arena + SRC_OFF, SRC_LEN, 0) != KVT_OK)
        die("cannot register local memory");
}

/* May byte @i of the arena have been written by a READ of @len bytes? */
static int readable(size_t i, uint64_t len)
{
    if (i < DST_OFF || i >= DST_OFF + DST_LEN)
        return 0;
    i -= DST_OFF;
    if (i >= READ_AT && i < READ_AT + len)
        return 1;
    return i >= STRIDED_AT && i < STRIDED_AT + NSTRIDE * STRIDE &&
           (i - STRIDED_AT) % STRIDE < PIECE;
}

static void check_arena(uint64_t len)
{
    for (size_t i = 0; i < ARENA; i++) {
        uint8_t want = i >= SRC_OFF && i < SRC_OFF + SRC_LEN ? SRC_BYTE : GUARD;
        if (!readable(i, len) && arena[i] != want) {
            fprintf(stderr, "fuzz_initiator: local byte %zu changed\n", i);
            abort();
        }
    }
}

/* Submit @d and wait for it to end: every transfer is bounded by the
 * transfer timeout (1 s here); the wait allows for a loaded machine. */
static void run(kvt_batch_h b, const kvt_xfer_desc_t *d)
{
    if (kvt_batch_submit(b, d, 1) != KVT_OK)
        die("cannot submit");
    if (kvt_batch_wait(b, 20000) == KVT_INPROGRESS)
        die("a transfer outlived the transfer timeout");
}

static void transfers(kvt_segment_t seg)
{
    kvt_remote_region_t r[4];
    kvt_xfer_desc_t d;
    kvt_batch_h b;
    size_t n = 0;
    uint64_t len;

    if (kvt_segment_regions(engine, seg, 0, r, 4, &n) != KVT_OK || n == 0 ||
        r[0].length < NSTRIDE * STRIDE)
        return;
    len = r[0].length < 4096 ? r[0].length : 4096;
    if (kvt_batch_create(engine, 8, &b) != KVT_OK)
        die("cannot create a batch");
    memset(&d, 0, sizeof(d));
    d.segment = seg;
    d.opcode = KVT_OP_READ;
    d.local_addr = arena + DST_OFF + READ_AT;
    d.remote_addr = r[0].addr;
    d.length = len;
    run(b, &d);
    d.opcode = KVT_OP_WRITE;
    d.local_addr = arena + SRC_OFF;
    run(b, &d);
    d.opcode = KVT_OP_NOTIFY;
    d.local_addr = "fuzz";
    d.length = 4;
    run(b, &d);
    d.opcode = KVT_OP_READ;
    d.count = NSTRIDE;
    d.local_addr = arena + DST_OFF + STRIDED_AT;
    d.length = PIECE;
    d.local_stride = STRIDE;
    d.remote_stride = PIECE;
    run(b, &d);
    kvt_batch_free(b);
    check_arena(len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char name[32];
    kvt_segment_t seg;

    if (engine == NULL)
        setup();
    memset(arena, GUARD, ARENA);
    memset(arena + SRC_OFF, SRC_BYTE, SRC_LEN);
    pthread_mutex_lock(&ft.lock);
    ft.input = data;
    ft.size = size;
    ft.pos = 0;
    pthread_mutex_unlock(&ft.lock);

    snprintf(name, sizeof(name), "127.0.0.1:%u", ft.port);
    if (kvt_segment_open(engine, name, &seg) == KVT_OK) {
        transfers(seg);
        kvt_segment_close(engine, seg);
    }
    check_arena(4096);

    /* Every connection of this input closed before the next one. */
    pthread_mutex_lock(&ft.lock);
    ft.input = NULL;
    ft.drop = 1;
    (void)write(ft.wake[1], "", 1);
    while (ft.drop)
        pthread_cond_wait(&ft.cond, &ft.lock);
    pthread_mutex_unlock(&ft.lock);
    return 0;
}
