/* SPDX-License-Identifier: Apache-2.0 */
/* Peer authentication by a shared secret (auth.h). */
#include "util/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "util/hex.h"

#define KDF_LABEL "kvt-auth-v1"
#define HTTP_LABEL "kvt-http-v1"
#define HTTP_SCHEME "KVT-HMAC "

kvt_status_t kvt__auth_init(kvt__auth_t *a, const char *token)
{
    size_t n = token != NULL ? strlen(token) : 0;

    memset(a, 0, sizeof(*a));
    if (n == 0)
        return KVT_OK;
    if (n > KVT_AUTH_TOKEN_MAX)
        return KVT_ERR_INVALID_PARAM;
    kvt__hmac(token, n, KDF_LABEL, sizeof(KDF_LABEL) - 1, a->key);
    a->on = 1;
    return KVT_OK;
}

kvt_status_t kvt__auth_init_env(kvt__auth_t *a)
{
    return kvt__auth_init(a, getenv(KVT_AUTH_ENV));
}

kvt_status_t kvt__auth_random(void *out, size_t n)
{
    uint8_t *p = out;

    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return KVT_ERR_IO;
        }
        p += got;
        n -= (size_t)got;
    }
    return KVT_OK;
}

void kvt__auth_mac(const kvt__auth_t *a, const char *label,
                   const struct iovec *parts, int n,
                   uint8_t out[KVT_AUTH_MAC_LEN])
{
    kvt__hmac_t c;

    kvt__hmac_init(&c, a->key, sizeof(a->key));
    kvt__hmac_update(&c, label, strlen(label) + 1);
    for (int i = 0; i < n; i++) {
        uint8_t len[4];
        for (int b = 0; b < 4; b++)
            len[b] = (uint8_t)(parts[i].iov_len >> (8 * b));
        kvt__hmac_update(&c, len, sizeof(len));
        kvt__hmac_update(&c, parts[i].iov_base, parts[i].iov_len);
    }
    kvt__hmac_final(&c, out);
}

int kvt__auth_check(const kvt__auth_t *a, const char *label,
                    const struct iovec *parts, int n,
                    const uint8_t mac[KVT_AUTH_MAC_LEN])
{
    uint8_t want[KVT_AUTH_MAC_LEN];
    int ok;

    kvt__auth_mac(a, label, parts, n, want);
    ok = kvt__ct_equal(want, mac, sizeof(want));
    kvt__wipe(want, sizeof(want));
    return ok;
}

static void http_mac(const kvt__auth_t *a, const char *method,
                     const char *target, size_t tlen, const void *body,
                     size_t blen, const char *t, uint8_t out[KVT_AUTH_MAC_LEN])
{
    uint8_t bh[KVT_SHA256_LEN];
    struct iovec parts[4] = {{(void *)method, strlen(method)},
                             {(void *)target, tlen},
                             {(void *)t, strlen(t)},
                             {bh, sizeof(bh)}};

    kvt__sha256(body, blen, bh);
    kvt__auth_mac(a, HTTP_LABEL, parts, 4, out);
}

void kvt__auth_http_sign(const kvt__auth_t *a, const char *method,
                         const char *target, size_t tlen, const void *body,
                         size_t blen, time_t t, char *out)
{
    uint8_t mac[KVT_AUTH_MAC_LEN];
    char ts[24];
    int n;

    snprintf(ts, sizeof(ts), "%lld", (long long)t);
    http_mac(a, method, target, tlen, body, blen, ts, mac);
    n = snprintf(out, KVT_AUTH_HTTP_HDR_MAX, HTTP_SCHEME "t=%s,mac=", ts);
    for (int i = 0; i < KVT_AUTH_MAC_LEN; i++)
        n += snprintf(out + n, KVT_AUTH_HTTP_HDR_MAX - (size_t)n, "%02x",
                      mac[i]);
}

int kvt__auth_http_verify(const kvt__auth_t *a, const char *hdr,
                          const char *method, const char *target, size_t tlen,
                          const void *body, size_t blen, time_t now,
                          const char **why)
{
    uint8_t mac[KVT_AUTH_MAC_LEN], want[KVT_AUTH_MAC_LEN];
    char ts[24];
    const char *p, *m;
    size_t tl;
    long long t = 0;
    int ok;

    if (hdr == NULL) {
        *why = "no Authorization header";
        return 0;
    }
    if (strncmp(hdr, HTTP_SCHEME, sizeof(HTTP_SCHEME) - 1) != 0) {
        *why = "Authorization is not KVT-HMAC";
        return 0;
    }
    p = hdr + sizeof(HTTP_SCHEME) - 1;
    if (strncmp(p, "t=", 2) != 0) {
        *why = "malformed KVT-HMAC header";
        return 0;
    }
    p += 2;
    tl = strspn(p, "0123456789");
    if (tl == 0 || tl > 19 || strncmp(p + tl, ",mac=", 5) != 0) {
        *why = "malformed KVT-HMAC header";
        return 0;
    }
    memcpy(ts, p, tl);
    ts[tl] = '\0';
    t = strtoll(ts, NULL, 10);
    m = p + tl + 5;
    if (strlen(m) != 2 * KVT_AUTH_MAC_LEN) {
        *why = "malformed KVT-HMAC header";
        return 0;
    }
    for (int i = 0; i < KVT_AUTH_MAC_LEN; i++) {
        int hi = kvt__hex_val(m[2 * i]), lo = kvt__hex_val(m[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            *why = "malformed KVT-HMAC header";
            return 0;
        }
        mac[i] = (uint8_t)(hi << 4 | lo);
    }
    if (t < (long long)now - KVT_AUTH_HTTP_WINDOW_S ||
        t > (long long)now + KVT_AUTH_HTTP_WINDOW_S) {
        *why = "request time outside the window (clocks apart?)";
        return 0;
    }
    http_mac(a, method, target, tlen, body, blen, ts, want);
    ok = kvt__ct_equal(want, mac, sizeof(want));
    kvt__wipe(want, sizeof(want));
    if (!ok)
        *why = "wrong MAC (another token?)";
    return ok;
}
