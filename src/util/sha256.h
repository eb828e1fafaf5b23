/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_SHA256_H
#define KVT_UTIL_SHA256_H

/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating
 * peers (util/auth.h). Plain C, no state outside the contexts, no
 * allocation; contexts are not shared between threads. Tests check them
 * against the FIPS 180-4 examples and the RFC 4231 vectors.
 */
#include <stddef.h>
#include <stdint.h>

#define KVT_SHA256_LEN 32
#define KVT_SHA256_BLOCK 64

typedef struct {
    uint32_t h[8];
    uint64_t bytes; /* hashed so far */
    uint8_t buf[KVT_SHA256_BLOCK];
    size_t nbuf;
} kvt__sha256_t;

void kvt__sha256_init(kvt__sha256_t *c);
void kvt__sha256_update(kvt__sha256_t *c, const void *data, size_t len);
/* Writes the digest and wipes @c. */
void kvt__sha256_final(kvt__sha256_t *c, uint8_t out[KVT_SHA256_LEN]);
void kvt__sha256(const void *data, size_t len, uint8_t out[KVT_SHA256_LEN]);

typedef struct {
    kvt__sha256_t inner, outer;
} kvt__hmac_t;

/* A key longer than a block is hashed first, as RFC 2104 says. */
void kvt__hmac_init(kvt__hmac_t *c, const void *key, size_t klen);
void kvt__hmac_update(kvt__hmac_t *c, const void *data, size_t len);
/* Writes the MAC and wipes @c. */
void kvt__hmac_final(kvt__hmac_t *c, uint8_t out[KVT_SHA256_LEN]);
void kvt__hmac(const void *key, size_t klen, const void *data, size_t len,
               uint8_t out[KVT_SHA256_LEN]);

/* 1 when the @n bytes at @a and @b are equal, 0 otherwise, in a time that
 * depends on @n only. */
int kvt__ct_equal(const void *a, const void *b, size_t n);

/* Overwrite @n bytes in a way the compiler keeps. */
void kvt__wipe(void *p, size_t n);

#endif
