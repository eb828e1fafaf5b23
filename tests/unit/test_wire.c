/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "kvt_test.h"

static void hdr(uint8_t *buf, uint8_t type, uint32_t body, uint64_t payload)
{
    kvt__wire_hdr_t h = {KVT_WIRE_VERSION_MAJOR,
                         KVT_WIRE_VERSION_MINOR,
                         type,
                         0,
                         body,
                         -8,
                         payload,
                         0x1122334455667788ull};
    kvt__wire_hdr_encode(&h, buf);
}

KVT_TEST(header_roundtrip)
{
    uint8_t buf[KVT_WIRE_HDR_LEN];
    kvt__wire_hdr_t h;
    hdr(buf, KVT_WIRE_WRITE, 48, 4096);
    /* Little-endian on the wire, magic first. */
    CHECK(buf[0] == 0x4b && buf[1] == 0x54);
    CHECK(buf[24] == 0x88 && buf[31] == 0x11);
    CHECK_OK(kvt__wire_hdr_decode(buf, sizeof(buf), &h));
    CHECK(h.type == KVT_WIRE_WRITE && h.body_len == 48 &&
          h.payload_len == 4096 && h.status == -8 &&
          h.req_id == 0x1122334455667788ull);
}

KVT_TEST(header_rejects)
{
    uint8_t buf[KVT_WIRE_HDR_LEN];
    kvt__wire_hdr_t h;
    hdr(buf, KVT_WIRE_WRITE, 0, 0);
    CHECK_ST(kvt__wire_hdr_decode(buf, 31, &h), KVT_ERR_PROTOCOL);
    buf[0] ^= 1;
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_PROTOCOL);
    hdr(buf, KVT_WIRE_WRITE, 0, 0);
    buf[2] = KVT_WIRE_VERSION_MAJOR + 1;
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_VERSION);
    CHECK(h.ver_major == KVT_WIRE_VERSION_MAJOR + 1);
    hdr(buf, 0, 0, 0);
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_PROTOCOL);
    hdr(buf, KVT_WIRE_TYPE_MAX + 1, 0, 0);
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_PROTOCOL);
    hdr(buf, KVT_WIRE_WRITE, KVT_WIRE_MAX_BODY + 1, 0);
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_PROTOCOL);
    hdr(buf, KVT_WIRE_WRITE, 0, KVT_WIRE_MAX_PAYLOAD + 1);
    CHECK_ST(kvt__wire_hdr_decode(buf, 32, &h), KVT_ERR_PROTOCOL);
    /* Minor versions are compatible. */
    hdr(buf, KVT_WIRE_WRITE, 0, 0);
    buf[3] = 200;
    CHECK_OK(kvt__wire_hdr_decode(buf, 32, &h));
}

static size_t table(uint8_t *out, const kvt__wire_piece_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvt__wire_piece_encode(&p[i], out + i * KVT_WIRE_PIECE_LEN);
    return n * KVT_WIRE_PIECE_LEN;
}

KVT_TEST(pieces)
{
    kvt__wire_piece_t in[3] = {
        {0x1000, 100, 1, 0}, {0x2000, 10, 5, 16}, {0x9000, 4096, 1, 12345}};
    kvt__wire_piece_t out[8];
    uint8_t buf[8 * KVT_WIRE_PIECE_LEN];
    uint32_t n, segs;
    size_t len = table(buf, in, 3);

    CHECK_OK(
        kvt__wire_pieces_decode(buf, len, 100 + 50 + 4096, out, 8, &n, &segs));
    CHECK(n == 3 && segs == 7);
    CHECK(out[1].addr == 0x2000 && out[1].count == 5 && out[1].stride == 16);
    CHECK(out[2].stride == 4096); /* contiguous: stride normalised */
    /* Total must match the payload exactly. */
    CHECK_ST(
        kvt__wire_pieces_decode(buf, len, 100 + 50 + 4095, out, 8, &n, &segs),
        KVT_ERR_PROTOCOL);
    /* Not a whole number of pieces; empty; over capacity. */
    CHECK_ST(kvt__wire_pieces_decode(buf, len - 1, 4246, out, 8, &n, &segs),
             KVT_ERR_PROTOCOL);
    CHECK_ST(kvt__wire_pieces_decode(buf, 0, 0, out, 8, &n, &segs),
             KVT_ERR_PROTOCOL);
    CHECK_ST(kvt__wire_pieces_decode(buf, len, 4246, out, 2, &n, &segs),
             KVT_ERR_PROTOCOL);
}

KVT_TEST(pieces_reject_overflow)
{
    kvt__wire_piece_t bad[] = {
        {0x1000, 0, 1, 0},                     /* zero length */
        {0x1000, 8, 0, 0},                     /* zero count */
        {0x1000, 16, 2, 8},                    /* overlapping stride */
        {UINT64_MAX - 10, 16, 1, 0},           /* address wraps */
        {1, 8, 4, UINT64_MAX / 2},             /* stride wraps */
        {0x1000, 1, KVT_WIRE_MAX_SEGS + 1, 1}, /* too many segments */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t buf[KVT_WIRE_PIECE_LEN];
        kvt__wire_piece_t out;
        uint32_t n, segs;
        uint64_t total = (uint64_t)bad[i].len * bad[i].count;
        table(buf, &bad[i], 1);
        CHECK_ST(kvt__wire_pieces_decode(buf, sizeof(buf), total, &out, 1, &n,
                                         &segs),
                 KVT_ERR_PROTOCOL);
    }
}

static void fail_cb(void *arg, uint32_t index, kvt_status_t st)
{
    int32_t *got = arg;
    got[index] = st;
}

KVT_TEST(fail_list)
{
    uint8_t buf[16];
    int32_t got[4] = {0};
    uint32_t idx = 2;
    int32_t st = KVT_ERR_ACCESS;
    memcpy(buf, &idx, 4);
    memcpy(buf + 4, &st, 4);
    CHECK_OK(kvt__wire_fails_decode(buf, 8, 4, fail_cb, got));
    CHECK(got[2] == KVT_ERR_ACCESS && got[0] == 0);
    CHECK_ST(kvt__wire_fails_decode(buf, 8, 2, fail_cb, got),
             KVT_ERR_PROTOCOL); /* index out of range */
    st = 0;
    memcpy(buf + 4, &st, 4);
    CHECK_ST(kvt__wire_fails_decode(buf, 8, 4, fail_cb, got),
             KVT_ERR_PROTOCOL); /* a "failure" that is success */
    CHECK_ST(kvt__wire_fails_decode(buf, 7, 4, fail_cb, got), KVT_ERR_PROTOCOL);
}

KVT_TEST(hello)
{
    kvt__wire_hello_t h = {.session_id = 42,
                           .conn_index = 1,
                           .nconns = 3,
                           .transport = KVT_TRANSPORT_TCP,
                           .fence = 41,
                           .name = "127.0.0.1:5555"},
                      g;
    uint8_t buf[256];
    size_t n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK(n == 24 + 2 + 14);
    CHECK_OK(kvt__wire_hello_decode(buf, n, &g));
    CHECK(g.session_id == 42 && g.conn_index == 1 && g.nconns == 3 &&
          g.transport == KVT_TRANSPORT_TCP && g.fence == 41 &&
          strcmp(g.name, h.name) == 0);
    CHECK_ST(kvt__wire_hello_decode(buf, n - 1, &g), KVT_ERR_PROTOCOL);
    h.fence = 42; /* a fence names earlier sessions only */
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_ST(kvt__wire_hello_decode(buf, n, &g), KVT_ERR_PROTOCOL);
    h.session_id = 0; /* a control connection: no session, no fence */
    h.fence = 0;
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_OK(kvt__wire_hello_decode(buf, n, &g));
    h.session_id = 42;
    h.transport = 0; /* a control connection */
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_OK(kvt__wire_hello_decode(buf, n, &g));
    CHECK(g.transport == 0);
    h.transport = 3; /* two transports at once */
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_ST(kvt__wire_hello_decode(buf, n, &g), KVT_ERR_PROTOCOL);
    h.transport = 1;
    h.conn_index = 3; /* index >= count */
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_ST(kvt__wire_hello_decode(buf, n, &g), KVT_ERR_PROTOCOL);
    CHECK(kvt__wire_hello_encode(&h, buf, 10) == 0);
}

/* Since 2.1 a HELLO may end with the initiator's nonce (it holds a
 * token); a body a byte longer or shorter than either form is refused. */
KVT_TEST(hello_auth)
{
    kvt__wire_hello_t h = {.nconns = 1, .name = "a:1", .auth = 1}, g;
    uint8_t buf[KVT_WIRE_HELLO_MAX + 1];
    size_t n;

    for (int i = 0; i < KVT_WIRE_NONCE_LEN; i++)
        h.nonce[i] = (uint8_t)(i + 1);
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK(n == 24 + 2 + 3 + KVT_WIRE_NONCE_LEN);
    CHECK_OK(kvt__wire_hello_decode(buf, n, &g));
    CHECK(g.auth && memcmp(g.nonce, h.nonce, KVT_WIRE_NONCE_LEN) == 0 &&
          strcmp(g.name, "a:1") == 0);
    CHECK_ST(kvt__wire_hello_decode(buf, n - 1, &g), KVT_ERR_PROTOCOL);
    buf[n] = 0;
    CHECK_ST(kvt__wire_hello_decode(buf, n + 1, &g), KVT_ERR_PROTOCOL);
    CHECK_OK(kvt__wire_hello_decode(buf, n - KVT_WIRE_NONCE_LEN, &g));
    CHECK(!g.auth);
    CHECK(kvt__wire_hello_encode(&h, buf, n - 1) == 0);
    CHECK(strcmp(kvt__wire_type_name(KVT_WIRE_AUTH_CHALLENGE),
                 "AUTH_CHALLENGE") == 0 &&
          strcmp(kvt__wire_type_name(KVT_WIRE_AUTH), "AUTH") == 0);
}

KVT_TEST(segdesc)
{
    kvt_remote_region_t regs[3] = {
        {0x7f0000000000ull, 1 << 20, 3, KVT_MEM_HOST, -1, 0},
        {0x7f0000200000ull, 4096, 1, KVT_MEM_HOST, -1, 0},
        {0x7e0000000000ull, 1 << 30, 2, KVT_MEM_CUDA, 3, 0}};
    kvt__segdesc_key_t keys[2] = {{0, 3, (const uint8_t *)"abc"},
                                  {2, 5, (const uint8_t *)"vwxyz"}};
    kvt__segdesc_t d = {0}, g;
    const kvt__segdesc_tl_t *tl;
    const uint8_t *k;
    uint32_t klen;
    uint8_t *buf;
    size_t len;

    snprintf(d.name, sizeof(d.name), "node:1234");
    snprintf(d.host, sizeof(d.host), "10.0.0.1");
    d.port = 1234;
    d.host_id = 0xabcdef;
    d.pid = 77;
    d.nregions = 3;
    d.regions = regs;
    CHECK_OK(kvt__segdesc_add_tl(&d, KVT_TRANSPORT_TCP, "tcp", 1, NULL, 0));
    CHECK_OK(kvt__segdesc_add_tl(&d, 1u << 7, "other", 9, "opaque", 6));
    d.tl[1].nkeys = 2;
    d.tl[1].keys = keys;
    CHECK(d.transports == (KVT_TRANSPORT_TCP | (1u << 7)));
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_OK(kvt__segdesc_decode(buf, len, &g));
    CHECK(strcmp(g.name, "node:1234") == 0 && strcmp(g.host, "10.0.0.1") == 0);
    CHECK(g.port == 1234 && g.host_id == 0xabcdef && g.pid == 77);
    CHECK(g.nregions == 3 && memcmp(g.regions, regs, sizeof(regs)) == 0);
    CHECK(g.ntl == 2 && g.transports == d.transports);
    tl = kvt__segdesc_tl(&g, 1u << 7);
    CHECK(tl != NULL && tl->version == 9 && strcmp(tl->name, "other") == 0);
    CHECK(tl->len == 6 && memcmp(tl->body, "opaque", 6) == 0);
    k = kvt__segdesc_key(tl, 2, &klen);
    CHECK(k != NULL && klen == 5 && memcmp(k, "vwxyz", 5) == 0);
    CHECK(kvt__segdesc_key(tl, 1, &klen) == NULL);
    CHECK(kvt__segdesc_tl(&g, KVT_TRANSPORT_TCP)->len == 0);
    kvt__segdesc_clear(&g);
    for (size_t cut = 0; cut < len; cut++)
        CHECK(kvt__segdesc_decode(buf, cut, &g) != KVT_OK);
    buf[0] = 1; /* the format of kvt 0.1 */
    CHECK_ST(kvt__segdesc_decode(buf, len, &g), KVT_ERR_VERSION);
    free(buf);
    /* Keys out of order, or for a region that does not exist. */
    keys[0].region = 2;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_ST(kvt__segdesc_decode(buf, len, &g), KVT_ERR_PROTOCOL);
    free(buf);
    keys[0].region = 0;
    keys[1].region = 3;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_ST(kvt__segdesc_decode(buf, len, &g), KVT_ERR_PROTOCOL);
    free(buf);
    keys[1].region = 2;
    /* One transport twice. */
    d.tl[1].id = KVT_TRANSPORT_TCP;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_ST(kvt__segdesc_decode(buf, len, &g), KVT_ERR_PROTOCOL);
    free(buf);
    d.tl[1].nkeys = 0;
    d.tl[1].keys = NULL;
    d.tl[1].id = 1u << 7;
    d.regions = NULL; /* on the stack */
    kvt__segdesc_clear(&d);
}

/* A section of a type this build does not know is skipped. */
KVT_TEST(segdesc_unknown_section)
{
    kvt__segdesc_t d = {0}, g;
    uint8_t *buf, *big;
    size_t len;

    snprintf(d.name, sizeof(d.name), "n:1");
    snprintf(d.host, sizeof(d.host), "h");
    d.port = 1;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    big = malloc(len + 12);
    memcpy(big, buf, len);
    big[4] = 3; /* one more section */
    memcpy(big + len, "\x63\x00\x01\x00\x04\x00\x00\x00zzzz", 12);
    CHECK_OK(kvt__segdesc_decode(big, len + 12, &g));
    CHECK(strcmp(g.name, "n:1") == 0 && g.nregions == 0 && g.ntl == 0);
    kvt__segdesc_clear(&g);
    big[len + 5] = 9; /* its length runs past the end */
    CHECK_ST(kvt__segdesc_decode(big, len + 12, &g), KVT_ERR_PROTOCOL);
    free(big);
    free(buf);
}

/* 65,536 regions (a paged KV cache) and more fit; 2^20 + 1 do not. */
KVT_TEST(segdesc_many_regions)
{
    uint32_t n = KVT_SEGDESC_MAX_REGIONS;
    kvt_remote_region_t *regs = calloc(n + 1, sizeof(*regs));
    kvt__segdesc_t d = {0}, g;
    uint8_t *buf;
    size_t len;

    snprintf(d.name, sizeof(d.name), "n:1");
    snprintf(d.host, sizeof(d.host), "h");
    for (uint32_t i = 0; i <= n; i++)
        regs[i] = (kvt_remote_region_t){
            0x100000000ull + 64ull * i, 64, 3, KVT_MEM_HOST, -1, 0};
    d.regions = regs;
    d.nregions = n;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_OK(kvt__segdesc_decode(buf, len, &g));
    CHECK(g.nregions == n && g.regions[n - 1].addr == regs[n - 1].addr);
    kvt__segdesc_clear(&g);
    free(buf);
    d.nregions = n + 1;
    CHECK_ST(kvt__segdesc_encode(&d, &buf, &len), KVT_ERR_OVERFLOW);
    free(regs);
}

KVT_TEST(status_strings)
{
    CHECK(strcmp(kvt_status_str(KVT_OK), "success") == 0);
    CHECK(strcmp(kvt_status_name(KVT_ERR_ACCESS), "KVT_ERR_ACCESS") == 0);
    CHECK(kvt_status_str((kvt_status_t)-999) != NULL);
    CHECK(strcmp(kvt_status_name((kvt_status_t)12345), "KVT_UNKNOWN") == 0);
    for (int s = KVT_ERR_AUTH; s <= 1; s++)
        CHECK(strcmp(kvt_status_str((kvt_status_t)s), "unknown status") != 0);
}

/*
 * The protocol's names of the transport ids are the names the transports
 * built in give themselves (a JSON descriptor names them so), and an
 * unknown id or name has none.
 */
KVT_TEST(transport_names)
{
    kvt_transport_info_t t[16];
    size_t n = 0;

    CHECK_OK(kvt_transports(t, 16, &n));
    CHECK(n >= 1);
    for (size_t i = 0; i < n && i < 16; i++) {
        CHECK(kvt__wire_tl_name(t[i].id) != NULL);
        CHECK(strcmp(kvt__wire_tl_name(t[i].id), t[i].name) == 0);
        CHECK(kvt__wire_tl_id(t[i].name) == t[i].id);
    }
    CHECK(kvt__wire_tl_name(1u << 30) == NULL);
    CHECK(kvt__wire_tl_id("warp") == 0);
}

KVT_TEST_MAIN(KVT_CASE(header_roundtrip, 10), KVT_CASE(header_rejects, 10),
              KVT_CASE(pieces, 10), KVT_CASE(pieces_reject_overflow, 10),
              KVT_CASE(fail_list, 10), KVT_CASE(hello, 10),
              KVT_CASE(hello_auth, 10), KVT_CASE(segdesc, 10),
              KVT_CASE(segdesc_unknown_section, 10),
              KVT_CASE(segdesc_many_regions, 30), KVT_CASE(status_strings, 10),
              KVT_CASE(transport_names, 10))
