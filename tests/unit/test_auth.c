/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SHA-256 against the FIPS 180-4 examples, HMAC-SHA256 against RFC 4231,
 * and the shared-secret helpers built on them (util/auth.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "core/ctrl.h"
#include "kvt_test.h"
#include "util/auth.h"
#include "util/hex.h"
#include "util/sha256.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static int digest_is(const void *m, size_t len, const char *want)
{
    uint8_t d[KVT_SHA256_LEN];
    char h[2 * KVT_SHA256_LEN + 1];

    kvt__sha256(m, len, d);
    hex(d, sizeof(d), h);
    if (strcmp(h, want) != 0) {
        fprintf(stderr, "sha256 of %zu bytes: %s, expected %s\n", len, h, want);
        return 0;
    }
    return 1;
}

/* FIPS 180-4's examples (and the NIST CSRC example pages): one block,
 * the empty message, two blocks, a 896-bit message, a million 'a'. */
KVT_TEST(sha256_fips180)
{
    const char *m3 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    const char *m4 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                     "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    char *mil = malloc(1000000);

    CHECK(mil != NULL);
    memset(mil, 'a', 1000000);
    CHECK(digest_is("abc", 3,
                    "ba7816bf8f01cfea414140de5dae2223"
                    "b00361a396177a9cb410ff61f20015ad"));
    CHECK(digest_is("", 0,
                    "e3b0c44298fc1c149afbf4c8996fb924"
                    "27ae41e4649b934ca495991b7852b855"));
    CHECK(digest_is(m3, strlen(m3),
                    "248d6a61d20638b8e5c026930c3e6039"
                    "a33ce45964ff2167f6ecedd419db06c1"));
    CHECK(digest_is(m4, strlen(m4),
                    "cf5b16a778af8380036ce59e7b049237"
                    "0b249b11e8f07a51afac45037afee9d1"));
    CHECK(digest_is(mil, 1000000,
                    "cdc76e5c9914fb9281a1c7e284d73e67"
                    "f1809a48a497200e046d39ccc7112cd0"));
    free(mil);
}

/* Fed in pieces of every size from 1 to 130 bytes, the digest is the
 * same as in one call (the buffering across block boundaries). */
KVT_TEST(sha256_pieces)
{
    uint8_t msg[1000], one[KVT_SHA256_LEN], many[KVT_SHA256_LEN];

    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    kvt__sha256(msg, sizeof(msg), one);
    for (size_t step = 1; step <= 130; step++) {
        kvt__sha256_t c;
        kvt__sha256_init(&c);
        for (size_t off = 0; off < sizeof(msg); off += step)
            kvt__sha256_update(&c, msg + off,
                               off + step > sizeof(msg) ? sizeof(msg) - off
                                                        : step);
        kvt__sha256_final(&c, many);
        CHECK(memcmp(one, many, sizeof(one)) == 0);
    }
}

static int hmac_is(const uint8_t *key, size_t klen, const void *data,
                   size_t dlen, const char *want)
{
    uint8_t d[KVT_SHA256_LEN];
    char h[2 * KVT_SHA256_LEN + 1];

    kvt__hmac(key, klen, data, dlen, d);
    hex(d, sizeof(d), h);
    /* Test case 5 compares the first 128 bits only. */
    if (strncmp(h, want, strlen(want)) != 0) {
        fprintf(stderr, "hmac: %s, expected %s\n", h, want);
        return 0;
    }
    return 1;
}

/* RFC 4231 section 4, test cases 1 to 7 (HMAC-SHA-256). */
KVT_TEST(hmac_rfc4231)
{
    uint8_t k[131], d[50];
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const char *t7 = "This is a test using a larger than block-size key and a "
                     "larger than block-size data. The key needs to be hashed "
                     "before being used by the HMAC algorithm.";

    memset(k, 0x0b, 20);
    CHECK(hmac_is(k, 20, "Hi There", 8,
                  "b0344c61d8db38535ca8afceaf0bf12b"
                  "881dc200c9833da726e9376c2e32cff7"));
    CHECK(hmac_is((const uint8_t *)"Jefe", 4, "what do ya want for nothing?",
                  28,
                  "5bdcc146bf60754e6a042426089575c7"
                  "5a003f089d2739839dec58b964ec3843"));
    memset(k, 0xaa, 20);
    memset(d, 0xdd, 50);
    CHECK(hmac_is(k, 20, d, 50,
                  "773ea91e36800e46854db8ebd09181a7"
                  "2959098b3ef8c122d9635514ced565fe"));
    for (int i = 0; i < 25; i++)
        k[i] = (uint8_t)(i + 1);
    memset(d, 0xcd, 50);
    CHECK(hmac_is(k, 25, d, 50,
                  "82558a389a443c0ea4cc819899f2083a"
                  "85f0faa3e578f8077a2e3ff46729665b"));
    memset(k, 0x0c, 20);
    CHECK(hmac_is(k, 20, "Test With Truncation", 20,
                  "a3b6167473100ee06e0c796c2955552b"));
    memset(k, 0xaa, 131);
    CHECK(hmac_is(k, 131, t6, strlen(t6),
                  "60e431591ee0b67f0d8a26aacbf5b77f"
                  "8e0bc6213728c5140546040f0ee37f54"));
    CHECK(hmac_is(k, 131, t7, strlen(t7),
                  "9b09ffa71b942fcb27635fbcd5b0e944"
                  "bfdc63644f0713938a7f51535c3a35e2"));
}

KVT_TEST(ct_equal)
{
    uint8_t a[32] = {0}, b[32] = {0};

    CHECK(kvt__ct_equal(a, b, sizeof(a)));
    for (size_t i = 0; i < sizeof(b); i++) {
        b[i] = 0x80;
        CHECK(!kvt__ct_equal(a, b, sizeof(a)));
        b[i] = 0;
    }
}

/* The key is HMAC(secret, "kvt-auth-v1"); no token means off; a MAC
 * depends on the label, every part and the key; parts do not run into
 * each other. */
KVT_TEST(auth_key_and_mac)
{
    kvt__auth_t a, b, off;
    uint8_t want[KVT_SHA256_LEN], m1[KVT_AUTH_MAC_LEN], m2[KVT_AUTH_MAC_LEN];
    struct iovec p1[2] = {{"ab", 2}, {"c", 1}}, p2[2] = {{"a", 1}, {"bc", 2}};
    char *big = malloc(KVT_AUTH_TOKEN_MAX + 2);

    CHECK(big != NULL);
    CHECK_OK(kvt__auth_init(&a, "s3cret"));
    CHECK(a.on);
    kvt__hmac("s3cret", 6, "kvt-auth-v1", 11, want);
    CHECK(memcmp(a.key, want, sizeof(want)) == 0);
    CHECK_OK(kvt__auth_init(&b, "s3cres"));
    CHECK_OK(kvt__auth_init(&off, ""));
    CHECK(!off.on);
    CHECK_OK(kvt__auth_init(&off, NULL));
    CHECK(!off.on);
    memset(big, 'x', KVT_AUTH_TOKEN_MAX + 1);
    big[KVT_AUTH_TOKEN_MAX + 1] = '\0';
    CHECK_ST(kvt__auth_init(&off, big), KVT_ERR_INVALID_PARAM);
    free(big);

    kvt__auth_mac(&a, "x", p1, 2, m1);
    CHECK(kvt__auth_check(&a, "x", p1, 2, m1));
    CHECK(!kvt__auth_check(&a, "y", p1, 2, m1));
    CHECK(!kvt__auth_check(&a, "x", p2, 2, m1));
    CHECK(!kvt__auth_check(&b, "x", p1, 2, m1));
    kvt__auth_mac(&a, "x", p2, 2, m2);
    CHECK(memcmp(m1, m2, sizeof(m1)) != 0);
    CHECK_OK(kvt__auth_random(m1, sizeof(m1)));
    CHECK_OK(kvt__auth_random(m2, sizeof(m2)));
    CHECK(memcmp(m1, m2, sizeof(m1)) != 0);
}

/* A signed HTTP request verifies; another method, target, body, token or
 * a time outside the window does not; a missing or malformed header
 * neither. */
KVT_TEST(auth_http)
{
    kvt__auth_t a, b;
    char h[KVT_AUTH_HTTP_HDR_MAX], bad[KVT_AUTH_HTTP_HDR_MAX];
    const char *why = NULL, *tg = "/metadata?key=k";
    time_t now = 1700000000;

    CHECK_OK(kvt__auth_init(&a, "tok"));
    CHECK_OK(kvt__auth_init(&b, "tok2"));
    kvt__auth_http_sign(&a, "PUT", tg, strlen(tg), "body", 4, now, h);
    CHECK(strncmp(h, "KVT-HMAC t=1700000000,mac=", 26) == 0);
    CHECK(strlen(h) == 26 + 64);
    CHECK(kvt__auth_http_verify(&a, h, "PUT", tg, strlen(tg), "body", 4, now,
                                &why));
    CHECK(kvt__auth_http_verify(&a, h, "PUT", tg, strlen(tg), "body", 4,
                                now + KVT_AUTH_HTTP_WINDOW_S, &why));
    CHECK(!kvt__auth_http_verify(&a, h, "PUT", tg, strlen(tg), "body", 4,
                                 now + KVT_AUTH_HTTP_WINDOW_S + 1, &why));
    CHECK(strstr(why, "window") != NULL);
    CHECK(!kvt__auth_http_verify(&a, h, "DELETE", tg, strlen(tg), "body", 4,
                                 now, &why));
    CHECK(strstr(why, "MAC") != NULL);
    CHECK(!kvt__auth_http_verify(&a, h, "PUT", "/metadata?key=j", 15, "body", 4,
                                 now, &why));
    CHECK(!kvt__auth_http_verify(&a, h, "PUT", tg, strlen(tg), "bodY", 4, now,
                                 &why));
    CHECK(!kvt__auth_http_verify(&b, h, "PUT", tg, strlen(tg), "body", 4, now,
                                 &why));
    CHECK(!kvt__auth_http_verify(&a, NULL, "PUT", tg, strlen(tg), "body", 4,
                                 now, &why));
    CHECK(strstr(why, "no Authorization") != NULL);
    snprintf(bad, sizeof(bad), "Basic dG9rOg==");
    CHECK(!kvt__auth_http_verify(&a, bad, "PUT", tg, strlen(tg), "body", 4, now,
                                 &why));
    snprintf(bad, sizeof(bad), "%.*s", (int)strlen(h) - 1, h);
    CHECK(!kvt__auth_http_verify(&a, bad, "PUT", tg, strlen(tg), "body", 4, now,
                                 &why));
    snprintf(bad, sizeof(bad), "%s", h);
    bad[30] = 'g';
    CHECK(!kvt__auth_http_verify(&a, bad, "PUT", tg, strlen(tg), "body", 4, now,
                                 &why));
}

/* ---- The test vector of docs/protocol.md (Authentication MAC) ---------- */

typedef struct {
    char token[64], name_t[KVT_WIRE_NAME_MAX + 1];
    uint8_t key[KVT_SHA256_LEN], hello[KVT_WIRE_HELLO_MAX];
    uint8_t nonce_t[KVT_WIRE_NONCE_LEN], mt[KVT_AUTH_MAC_LEN];
    uint8_t mi[KVT_AUTH_MAC_LEN];
    size_t hello_len;
    unsigned have; /* a bit per field found */
} vector_t;

/* @hex into @out (room for @cap bytes); the bytes, or 0 when it is not
 * whole hex digits or does not fit. */
static size_t unhex(const char *hex, uint8_t *out, size_t cap)
{
    size_t n = strlen(hex);

    if (n % 2 != 0 || n / 2 > cap)
        return 0;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = kvt__hex_val(hex[2 * i]), lo = kvt__hex_val(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return n / 2;
}

/* The lines "field value" of the block fenced as kvt-auth-vector; every
 * field must be there once, well formed. */
static void vector_read(const char *path, vector_t *v)
{
    FILE *f = fopen(path, "r");
    char line[512];
    int in = 0, blocks = 0;

    CHECK(f != NULL);
    memset(v, 0, sizeof(*v));
    while (fgets(line, sizeof(line), f) != NULL) {
        char field[16], value[400];
        line[strcspn(line, "\n")] = '\0';
        if (strcmp(line, "```kvt-auth-vector") == 0) {
            in = 1;
            blocks++;
            continue;
        }
        if (!in)
            continue;
        if (strcmp(line, "```") == 0) {
            in = 0;
            continue;
        }
        /* Values hold no spaces but the token's: it is the rest. */
        CHECK(sscanf(line, "%15s %399[^\n]", field, value) == 2);
        if (strcmp(field, "token") == 0) {
            CHECK(strlen(value) < sizeof(v->token));
            strcpy(v->token, value);
            v->have |= 1;
        } else if (strcmp(field, "K") == 0) {
            CHECK(unhex(value, v->key, sizeof(v->key)) == sizeof(v->key));
            v->have |= 2;
        } else if (strcmp(field, "hello") == 0) {
            v->hello_len = unhex(value, v->hello, sizeof(v->hello));
            CHECK(v->hello_len > 0);
            v->have |= 4;
        } else if (strcmp(field, "name_t") == 0) {
            CHECK(strlen(value) <= KVT_WIRE_NAME_MAX);
            strcpy(v->name_t, value);
            v->have |= 8;
        } else if (strcmp(field, "Nt") == 0) {
            CHECK(unhex(value, v->nonce_t, sizeof(v->nonce_t)) ==
                  sizeof(v->nonce_t));
            v->have |= 16;
        } else if (strcmp(field, "Mt") == 0) {
            CHECK(unhex(value, v->mt, sizeof(v->mt)) == sizeof(v->mt));
            v->have |= 32;
        } else if (strcmp(field, "Mi") == 0) {
            CHECK(unhex(value, v->mi, sizeof(v->mi)) == sizeof(v->mi));
            v->have |= 64;
        } else {
            fprintf(stderr, "%s: unknown field %s\n", path, field);
            CHECK(0);
        }
    }
    fclose(f);
    CHECK(blocks == 1 && !in);
    CHECK(v->have == 127);
}

/*
 * The vector that docs/protocol.md gives, read from the doc itself so
 * that the doc cannot drift from the code: the key derived from its
 * token, both MACs through kvt__auth_mac() under the labels the doc
 * names, and the control plane's own handshake code (src/core/ctrl_auth.c),
 * which checks Mt in a challenge, answers it with Mi, and accepts Mi.
 * The doc's HELLO is a well-formed one, with the initiator's nonce.
 */
KVT_TEST(auth_doc_vector)
{
    uint8_t mac[KVT_AUTH_MAC_LEN], chal[256], bad[KVT_AUTH_MAC_LEN];
    kvt__wire_hello_t h;
    struct iovec p[3];
    size_t clen;
    kvt__auth_t a;
    vector_t v;

    vector_read(KVT_DOCS_DIR "/protocol.md", &v);
    CHECK_OK(kvt__wire_hello_decode(v.hello, v.hello_len, &h));
    CHECK(h.auth);
    CHECK_OK(kvt__auth_init(&a, v.token));
    CHECK(memcmp(a.key, v.key, sizeof(v.key)) == 0);

    p[0] = (struct iovec){v.hello, v.hello_len};
    p[1] = (struct iovec){v.name_t, strlen(v.name_t)};
    p[2] = (struct iovec){v.nonce_t, sizeof(v.nonce_t)};
    kvt__auth_mac(&a, "kvt-auth-v1 target", p, 3, mac);
    CHECK(memcmp(mac, v.mt, sizeof(mac)) == 0);
    kvt__auth_mac(&a, "kvt-auth-v1 initiator", p, 3, mac);
    CHECK(memcmp(mac, v.mi, sizeof(mac)) == 0);

    memcpy(chal, v.nonce_t, KVT_WIRE_NONCE_LEN);
    memcpy(chal + KVT_WIRE_NONCE_LEN, v.mt, KVT_WIRE_MAC_LEN);
    clen = KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN +
           kvt__wire_put_str(chal + KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN,
                             v.name_t);
    memset(mac, 0, sizeof(mac));
    CHECK_OK(
        kvt__ctrl_auth_answer(&a, v.hello, v.hello_len, chal, clen, mac));
    CHECK(memcmp(mac, v.mi, sizeof(mac)) == 0);
    CHECK(kvt__ctrl_auth_verify(&a, v.hello, v.hello_len, v.name_t,
                                v.nonce_t, v.mi, sizeof(v.mi)));
    memcpy(bad, v.mi, sizeof(bad));
    bad[31] ^= 1;
    CHECK(!kvt__ctrl_auth_verify(&a, v.hello, v.hello_len, v.name_t,
                                 v.nonce_t, bad, sizeof(bad)));
}

KVT_TEST_MAIN(KVT_CASE(sha256_fips180, 30), KVT_CASE(sha256_pieces, 30),
              KVT_CASE(hmac_rfc4231, 10), KVT_CASE(ct_equal, 10),
              KVT_CASE(auth_key_and_mac, 10), KVT_CASE(auth_http, 10),
              KVT_CASE(auth_doc_vector, 10))
