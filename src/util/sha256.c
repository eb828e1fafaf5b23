/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SHA-256 and HMAC-SHA256 (sha256.h). Straight from FIPS 180-4 section
 * 6.2: one 64-byte block at a time, big-endian words, the length in bits
 * in the last 8 bytes of the padding.
 */
#include "util/sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, k;

    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0], b = h[1], c = h[2], d = h[3];
    e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) +
                      ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) +
                      ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d;
    h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void kvt__sha256_init(kvt__sha256_t *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                   0xa54ff53a, 0x510e527f, 0x9b05688c,
                                   0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof(iv));
    c->bytes = 0;
    c->nbuf = 0;
}

void kvt__sha256_update(kvt__sha256_t *c, const void *data, size_t len)
{
    const uint8_t *p = data;

    if (len == 0)
        return; /* @data may be NULL */
    c->bytes += len;
    if (c->nbuf > 0) {
        size_t n = KVT_SHA256_BLOCK - c->nbuf;
        if (n > len)
            n = len;
        memcpy(c->buf + c->nbuf, p, n);
        c->nbuf += n;
        p += n;
        len -= n;
        if (c->nbuf < KVT_SHA256_BLOCK)
            return;
        block(c->h, c->buf);
        c->nbuf = 0;
    }
    for (; len >= KVT_SHA256_BLOCK;
         p += KVT_SHA256_BLOCK, len -= KVT_SHA256_BLOCK)
        block(c->h, p);
    memcpy(c->buf, p, len);
    c->nbuf = len;
}

void kvt__sha256_final(kvt__sha256_t *c, uint8_t out[KVT_SHA256_LEN])
{
    uint64_t bits = c->bytes * 8;

    c->buf[c->nbuf++] = 0x80;
    if (c->nbuf > KVT_SHA256_BLOCK - 8) {
        memset(c->buf + c->nbuf, 0, KVT_SHA256_BLOCK - c->nbuf);
        block(c->h, c->buf);
        c->nbuf = 0;
    }
    memset(c->buf + c->nbuf, 0, KVT_SHA256_BLOCK - 8 - c->nbuf);
    for (int i = 0; i < 8; i++)
        c->buf[KVT_SHA256_BLOCK - 1 - i] = (uint8_t)(bits >> (8 * i));
    block(c->h, c->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    kvt__wipe(c, sizeof(*c));
}

void kvt__sha256(const void *data, size_t len, uint8_t out[KVT_SHA256_LEN])
{
    kvt__sha256_t c;

    kvt__sha256_init(&c);
    kvt__sha256_update(&c, data, len);
    kvt__sha256_final(&c, out);
}

void kvt__hmac_init(kvt__hmac_t *c, const void *key, size_t klen)
{
    uint8_t k[KVT_SHA256_BLOCK] = {0}, pad[KVT_SHA256_BLOCK];

    if (klen > KVT_SHA256_BLOCK)
        kvt__sha256(key, klen, k);
    else if (klen > 0)
        memcpy(k, key, klen);
    for (int i = 0; i < KVT_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    kvt__sha256_init(&c->inner);
    kvt__sha256_update(&c->inner, pad, sizeof(pad));
    for (int i = 0; i < KVT_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    kvt__sha256_init(&c->outer);
    kvt__sha256_update(&c->outer, pad, sizeof(pad));
    kvt__wipe(k, sizeof(k));
    kvt__wipe(pad, sizeof(pad));
}

void kvt__hmac_update(kvt__hmac_t *c, const void *data, size_t len)
{
    kvt__sha256_update(&c->inner, data, len);
}

void kvt__hmac_final(kvt__hmac_t *c, uint8_t out[KVT_SHA256_LEN])
{
    uint8_t ih[KVT_SHA256_LEN];

    kvt__sha256_final(&c->inner, ih);
    kvt__sha256_update(&c->outer, ih, sizeof(ih));
    kvt__sha256_final(&c->outer, out);
    kvt__wipe(ih, sizeof(ih));
}

void kvt__hmac(const void *key, size_t klen, const void *data, size_t len,
               uint8_t out[KVT_SHA256_LEN])
{
    kvt__hmac_t c;

    kvt__hmac_init(&c, key, klen);
    kvt__hmac_update(&c, data, len);
    kvt__hmac_final(&c, out);
}

int kvt__ct_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;

    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

void kvt__wipe(void *p, size_t n)
{
    volatile uint8_t *v = p;

    while (n--)
        *v++ = 0;
}
