/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "kvt_test.h"

static void hdr(uint8_t *buf, uint8_t type, uint32_t body, uint64_t payload)
{
    kvt__wire_hdr_t h = {KVT_WIRE_VERSION_MAJOR, KVT_WIRE_VERSION_MINOR, type,
                         0, body, -8, payload, 0x1122334455667788ull};
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
    kvt__wire_piece_t in[3] = {{0x1000, 100, 1, 0},
                               {0x2000, 10, 5, 16},
                               {0x9000, 4096, 1, 12345}};
    kvt__wire_piece_t out[8];
    uint8_t buf[8 * KVT_WIRE_PIECE_LEN];
    uint32_t n, segs;
    size_t len = table(buf, in, 3);

    CHECK_OK(kvt__wire_pieces_decode(buf, len, 100 + 50 + 4096, out, 8, &n,
                                     &segs));
    CHECK(n == 3 && segs == 7);
    CHECK(out[1].addr == 0x2000 && out[1].count == 5 && out[1].stride == 16);
    CHECK(out[2].stride == 4096); /* contiguous: stride normalised */
    /* Total must match the payload exactly. */
    CHECK_ST(kvt__wire_pieces_decode(buf, len, 100 + 50 + 4095, out, 8, &n,
                                     &segs),
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
        {0x1000, 0, 1, 0},                 /* zero length */
        {0x1000, 8, 0, 0},                 /* zero count */
        {0x1000, 16, 2, 8},                /* overlapping stride */
        {UINT64_MAX - 10, 16, 1, 0},       /* address wraps */
        {1, 8, 4, UINT64_MAX / 2},         /* stride wraps */
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
    CHECK_ST(kvt__wire_fails_decode(buf, 7, 4, fail_cb, got),
             KVT_ERR_PROTOCOL);
}

KVT_TEST(hello)
{
    kvt__wire_hello_t h = {42, 1, 3, "127.0.0.1:5555"}, g;
    uint8_t buf[256];
    size_t n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK(n == 16 + 2 + 14);
    CHECK_OK(kvt__wire_hello_decode(buf, n, &g));
    CHECK(g.session_id == 42 && g.conn_index == 1 && g.nconns == 3 &&
          strcmp(g.name, h.name) == 0);
    CHECK_ST(kvt__wire_hello_decode(buf, n - 1, &g), KVT_ERR_PROTOCOL);
    h.conn_index = 3; /* index >= count */
    n = kvt__wire_hello_encode(&h, buf, sizeof(buf));
    CHECK_ST(kvt__wire_hello_decode(buf, n, &g), KVT_ERR_PROTOCOL);
    CHECK(kvt__wire_hello_encode(&h, buf, 10) == 0);
}

KVT_TEST(segdesc)
{
    kvt_remote_region_t regs[2] = {{0x7f0000000000ull, 1 << 20, 3, 0},
                                   {0x7f0000200000ull, 4096, 1, 0}};
    kvt__segdesc_t d = {"node:1234", "10.0.0.1", 1234, 1, 0xabcdef, 77, 2,
                        regs},
                   g;
    uint8_t *buf;
    size_t len;
    CHECK_OK(kvt__segdesc_encode(&d, &buf, &len));
    CHECK_OK(kvt__segdesc_decode(buf, len, &g));
    CHECK(strcmp(g.name, "node:1234") == 0 && strcmp(g.host, "10.0.0.1") == 0);
    CHECK(g.port == 1234 && g.host_id == 0xabcdef && g.pid == 77);
    CHECK(g.nregions == 2 && memcmp(g.regions, regs, sizeof(regs)) == 0);
    kvt__segdesc_clear(&g);
    for (size_t cut = 0; cut < len; cut++)
        CHECK(kvt__segdesc_decode(buf, cut, &g) != KVT_OK);
    buf[len - 20] ^= 0xff; /* region length byte: still valid or caught */
    if (kvt__segdesc_decode(buf, len, &g) == KVT_OK)
        kvt__segdesc_clear(&g);
    free(buf);
}

KVT_TEST(status_strings)
{
    CHECK(strcmp(kvt_status_str(KVT_OK), "success") == 0);
    CHECK(strcmp(kvt_status_name(KVT_ERR_ACCESS), "KVT_ERR_ACCESS") == 0);
    CHECK(kvt_status_str((kvt_status_t)-999) != NULL);
    CHECK(strcmp(kvt_status_name((kvt_status_t)12345), "KVT_UNKNOWN") == 0);
    for (int s = -19; s <= 1; s++)
        CHECK(strcmp(kvt_status_str((kvt_status_t)s), "unknown status") != 0);
}

KVT_TEST_MAIN(KVT_CASE(header_roundtrip, 10), KVT_CASE(header_rejects, 10),
              KVT_CASE(pieces, 10), KVT_CASE(pieces_reject_overflow, 10),
              KVT_CASE(fail_list, 10), KVT_CASE(hello, 10),
              KVT_CASE(segdesc, 10), KVT_CASE(status_strings, 10))
