/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_META_CURL_H
#define KVT_META_META_CURL_H

/*
 * One HTTP request at a time over a reused libcurl easy handle (keeping
 * its connection alive), for the http and etcd backends. Not thread-safe:
 * the backend's caller (meta.c) serialises calls on a handle.
 */
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include <kvt/status.h>

#include "util/auth.h"

typedef struct {
    CURL *easy;
    char errbuf[CURL_ERROR_SIZE];
    /* When on, every request carries an Authorization: KVT-HMAC header
     * (util/auth.h); set by the backends that talk to kvt metad. */
    kvt__auth_t auth;
} kvt__curl_t;

typedef struct {
    long code;     /* HTTP status */
    uint8_t *body; /* malloc'd, NUL after len bytes; NULL when empty */
    size_t len;
    int ttl_ack; /* the answer carried an X-Kvt-Ttl header */
} kvt__curl_resp_t;

kvt_status_t kvt__curl_init(kvt__curl_t *c);
void kvt__curl_fini(kvt__curl_t *c);
void kvt__curl_resp_free(kvt__curl_resp_t *r);

/*
 * Send @method @url with @len bytes of @body (NULL: none) as @ctype, and
 * collect the answer, all within @timeout_ms. An answer over @max_resp
 * bytes is cut off with KVT_ERR_OVERFLOW. Returns KVT_OK whenever an HTTP
 * answer arrived, whatever its status (r->code); otherwise
 * KVT_ERR_UNREACHABLE (refused, name does not resolve), KVT_ERR_TIMEDOUT,
 * KVT_ERR_OVERFLOW, KVT_ERR_IO or KVT_ERR_NO_MEMORY, logged at warning
 * level with @what naming the backend.
 */
kvt_status_t kvt__curl_request(kvt__curl_t *c, const char *what,
                               const char *method, const char *url,
                               const char *ctype, const void *body, size_t len,
                               uint64_t timeout_ms, size_t max_resp,
                               kvt__curl_resp_t *r);

/* Percent-encode @s for a query string; free with curl_free(). NULL when
 * out of memory. */
char *kvt__curl_escape(kvt__curl_t *c, const char *s);

#endif
