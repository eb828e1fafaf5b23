/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_AUTH_H
#define KVT_UTIL_AUTH_H

/*
 * Peer authentication by a shared secret (docs/security.md). The secret
 * never leaves the process: an engine keeps only a key derived from it,
 * HMAC-SHA256(secret, "kvt-auth-v1"), and proves that it knows the key by
 * MACs over what both sides said (each side's fresh random nonce, the
 * names, the direction), compared in constant time. The same key signs
 * metadata writes over HTTP (kvt__auth_http_*).
 *
 * A kvt__auth_t is set once before use and read-only afterwards: any
 * number of threads may use it.
 */
#include <stdint.h>
#include <sys/uio.h> /* IWYU pragma: keep */
#include <time.h>

#include <kvt/status.h>

#include "util/sha256.h"

#define KVT_AUTH_NONCE_LEN 32
#define KVT_AUTH_MAC_LEN KVT_SHA256_LEN
#define KVT_AUTH_TOKEN_MAX 4096 /* bytes of a secret */
#define KVT_AUTH_ENV "KVT_AUTH_TOKEN"
/* How far a signed HTTP request's time may be from the server's. */
#define KVT_AUTH_HTTP_WINDOW_S 300
/* "KVT-HMAC t=<20 digits>,mac=<64 hex digits>" and its NUL. */
#define KVT_AUTH_HTTP_HDR_MAX 112

typedef struct {
    int on; /* a secret was given */
    uint8_t key[KVT_SHA256_LEN];
} kvt__auth_t;

/* Derive the key from @token (NULL or "": authentication off).
 * KVT_ERR_INVALID_PARAM for a token over KVT_AUTH_TOKEN_MAX bytes. */
kvt_status_t kvt__auth_init(kvt__auth_t *a, const char *token);
/* As kvt__auth_init() with $KVT_AUTH_TOKEN (unset: off). */
kvt_status_t kvt__auth_init_env(kvt__auth_t *a);

/* @n random bytes from the kernel (getrandom). KVT_ERR_IO when it has
 * none to give. */
kvt_status_t kvt__auth_random(void *out, size_t n);

/* HMAC with the derived key over @label (with its NUL) and then each of
 * the @n parts, each preceded by its length as a little-endian u32, so
 * that no two different lists of parts hash alike. */
void kvt__auth_mac(const kvt__auth_t *a, const char *label,
                   const struct iovec *parts, int n,
                   uint8_t out[KVT_AUTH_MAC_LEN]);
/* 1 when @mac is the MAC of the same, compared in constant time. */
int kvt__auth_check(const kvt__auth_t *a, const char *label,
                    const struct iovec *parts, int n,
                    const uint8_t mac[KVT_AUTH_MAC_LEN]);

/*
 * The Authorization header value of an HTTP request (docs/security.md):
 * "KVT-HMAC t=<unix seconds>,mac=<hex>", the MAC over the method, the
 * request target (path and query, as sent), @t and SHA-256 of the body.
 * @out has room for KVT_AUTH_HTTP_HDR_MAX bytes.
 */
void kvt__auth_http_sign(const kvt__auth_t *a, const char *method,
                         const char *target, size_t tlen, const void *body,
                         size_t blen, time_t t, char *out);
/*
 * Check such a header (@hdr may be NULL: none was sent) at time @now.
 * 1 when it holds; 0 otherwise, with *why saying why (a static string).
 */
int kvt__auth_http_verify(const kvt__auth_t *a, const char *hdr,
                          const char *method, const char *target, size_t tlen,
                          const void *body, size_t blen, time_t now,
                          const char **why);

#endif
