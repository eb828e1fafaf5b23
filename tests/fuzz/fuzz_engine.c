/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stateful fuzz target: a live engine, listening on loopback in this
 * process, is sent the frames of each input over a fresh connection, as a
 * hostile initiator would. Between inputs it must still be alive (a PING
 * is answered), it must have closed each connection once the peer did,
 * and no byte outside the regions it registered for remote writes may
 * have changed.
 *
 * Input: one flags byte (bit 0: the harness opens with a valid tcp data
 * HELLO; bit 1: with a control-connection HELLO; neither: the input says
 * its own), then frames as on the wire. Piece addresses of WRITE and READ
 * frames are offsets into the harness's arena, which the harness rebases
 * (so corpora stay valid under ASLR); a stream that stops parsing as
 * frames is sent as it is.
 *
 * Arena (ARENA bytes): guards that are never registered, a region
 * registered for remote read and write, one for remote read only and one
 * for remote write only.
 */
#include <errno.h>
#include <poll.h>
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

#define ARENA (64u * 1024u)
#define RW_OFF (8u * 1024u)
#define RW_LEN (16u * 1024u)
#define RO_OFF (28u * 1024u)
#define RO_LEN (8u * 1024u)
#define WO_OFF (40u * 1024u)
#define WO_LEN (8u * 1024u)
#define GUARD 0xa5
#define RO_BYTE 0x3c
/* How long the engine may take to close a connection its peer closed:
 * generous, for machines loaded many times over (a hang is a hang). */
#define CLOSE_NS (20ull * 1000000000ull)

static kvt_engine_h engine;
static uint8_t *arena;
static uint64_t sessions;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_engine: %s\n", what);
    abort();
}

static void setup(void)
{
    kvt_engine_params_t p = {0};

    fuzz_quiet();
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS |
                   KVT_ENGINE_PARAM_TRANSFER_TIMEOUT;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP;
    p.transfer_timeout_ms = 2000;
    if (kvt_engine_create(&p, &engine) != KVT_OK)
        die("cannot create the engine");
    arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED)
        die("cannot map the arena");
    memset(arena, GUARD, ARENA);
    memset(arena + RO_OFF, RO_BYTE, RO_LEN);
    if (kvt_mem_register(engine, arena + RW_OFF, RW_LEN,
                         KVT_ACCESS_REMOTE_RW) != KVT_OK ||
        kvt_mem_register(engine, arena + RO_OFF, RO_LEN,
                         KVT_ACCESS_REMOTE_READ) != KVT_OK ||
        kvt_mem_register(engine, arena + WO_OFF, WO_LEN,
                         KVT_ACCESS_REMOTE_WRITE) != KVT_OK)
        die("cannot register the regions");
}

/* Only the regions registered for remote writes may have changed. */
static void check_arena(void)
{
    for (size_t i = 0; i < ARENA; i++) {
        int writable = (i >= RW_OFF && i < RW_OFF + RW_LEN) ||
                       (i >= WO_OFF && i < WO_OFF + WO_LEN);
        uint8_t want = i >= RO_OFF && i < RO_OFF + RO_LEN ? RO_BYTE : GUARD;
        if (!writable && arena[i] != want) {
            fprintf(stderr, "fuzz_engine: arena byte %zu changed\n", i);
            abort();
        }
    }
}

/* The harness's HELLO (@transport 0: control connection) into @out. */
static size_t hello(uint8_t *out, uint32_t transport)
{
    kvt__wire_hello_t h = {
        .nconns = 1, .transport = transport, .name = "fuzzpeer:1"};
    size_t n;

    if (transport != 0)
        h.session_id = (0xf00dull << 32) | (uint32_t)++sessions;
    n = kvt__wire_hello_encode(&h, out + KVT_WIRE_HDR_LEN, KVT_WIRE_HELLO_MAX);
    kvt_test_hdr(out, KVT_WIRE_HELLO, (uint32_t)n, 0, 1);
    return KVT_WIRE_HDR_LEN + n;
}

/* The bytes to send for @data: frames with their piece addresses
 * rebased onto the arena, the rest as it is. Returns a malloc'd copy. */
static uint8_t *rebase(const uint8_t *data, size_t size)
{
    uint8_t *out = malloc(size ? size : 1);
    size_t off = 0;

    if (out == NULL)
        die("out of memory");
    memcpy(out, data, size);
    while (size - off >= KVT_WIRE_HDR_LEN) {
        kvt__wire_hdr_t h;
        size_t body, pay;
        if (kvt__wire_hdr_decode(out + off, KVT_WIRE_HDR_LEN, &h) != KVT_OK)
            break;
        off += KVT_WIRE_HDR_LEN;
        body = h.body_len < size - off ? h.body_len : size - off;
        if (h.type == KVT_WIRE_WRITE || h.type == KVT_WIRE_READ) {
            for (size_t p = 0; p + KVT_WIRE_PIECE_LEN <= body;
                 p += KVT_WIRE_PIECE_LEN) {
                uint64_t a;
                memcpy(&a, out + off + p, 8);
                a += (uint64_t)(uintptr_t)arena;
                memcpy(out + off + p, &a, 8);
            }
        }
        off += body;
        pay = h.type == KVT_WIRE_WRITE ? h.payload_len : 0;
        off += pay < size - off ? pay : size - off;
    }
    return out;
}

/*
 * Send @len bytes on @fd while reading (and dropping) what comes back,
 * then close the sending side and read until the engine closes too.
 * Returns the first @keep bytes received into @in.
 */
static size_t exchange(int fd, const uint8_t *buf, size_t len, uint8_t *in,
                       size_t keep)
{
    uint64_t deadline = 0;
    size_t sent = 0, got = 0;
    uint8_t sink[16384];

    for (;;) {
        struct pollfd p = {fd, POLLIN | (sent < len ? POLLOUT : 0), 0};
        if (sent == len && deadline == 0) {
            shutdown(fd, SHUT_WR);
            deadline = kvt__now_ns() + CLOSE_NS;
        }
        if (deadline != 0 && kvt__now_ns() > deadline)
            die("the engine kept a connection its peer closed");
        if (poll(&p, 1, 100) < 0)
            continue;
        if (p.revents & POLLOUT) {
            ssize_t n = send(fd, buf + sent, len - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0)
                sent = len; /* closed by the engine: nothing more goes */
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(fd, sink, sizeof(sink), 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (n <= 0)
                break; /* closed (or reset) by the engine */
            if (got < keep) {
                size_t k = (size_t)n < keep - got ? (size_t)n : keep - got;
                memcpy(in + got, sink, k);
            }
            got += (size_t)n;
        }
    }
    return got;
}

static int dial(void)
{
    int fd;

    if (kvt__sock_connect("127.0.0.1", kvt_engine_rpc_port(engine), 2000,
                          &fd) != KVT_OK)
        die("the engine no longer accepts connections");
    kvt__sock_set_nonblock(fd, 1);
    return fd;
}

/* The engine still serves: a data connection's HELLO and a PING are
 * answered with HELLO_ACK and PONG. */
static void check_alive(void)
{
    uint8_t out[256], in[1024];
    size_t n = hello(out, KVT_TRANSPORT_TCP), got, off;
    kvt__wire_hdr_t h;
    int fd = dial();

    n += kvt_test_hdr(out + n, KVT_WIRE_PING, 0, 0, 2);
    got = exchange(fd, out, n, in, sizeof(in));
    close(fd);
    if (got < KVT_WIRE_HDR_LEN ||
        kvt__wire_hdr_decode(in, KVT_WIRE_HDR_LEN, &h) != KVT_OK ||
        h.type != KVT_WIRE_HELLO_ACK)
        die("no HELLO_ACK from the engine");
    off = KVT_WIRE_HDR_LEN + h.body_len;
    if (got < off + KVT_WIRE_HDR_LEN ||
        kvt__wire_hdr_decode(in + off, KVT_WIRE_HDR_LEN, &h) != KVT_OK ||
        h.type != KVT_WIRE_PONG || h.req_id != 2)
        die("no PONG from the engine");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned runs;
    kvt_notify_t notes[16];
    uint8_t head[256], *body, *buf;
    size_t hl = 0, count;
    int fd;

    if (engine == NULL)
        setup();
    if (size < 1)
        return 0;
    if (data[0] & 1)
        hl = hello(head, KVT_TRANSPORT_TCP);
    else if (data[0] & 2)
        hl = hello(head, 0);
    body = rebase(data + 1, size - 1);
    buf = malloc(hl + size);
    if (buf == NULL)
        die("out of memory");
    memcpy(buf, head, hl);
    memcpy(buf + hl, body, size - 1);
    fd = dial();
    exchange(fd, buf, hl + size - 1, NULL, 0);
    close(fd);
    free(buf);
    free(body);
    /* Notifications sent by the input are taken, so that none pile up. */
    while (kvt_notify_recv(engine, notes, 16, &count, 0) == KVT_OK && count > 0)
        ;
    check_arena();
    if (++runs % 16 == 0)
        check_alive();
    return 0;
}
