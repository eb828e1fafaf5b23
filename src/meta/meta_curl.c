/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The libcurl client the http and etcd metadata backends share: libcurl's
 * global initialisation, once, and bounded requests.
 */
#include "meta/meta_curl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "util/log.h"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kvt_status_t kvt__curl_init(kvt__curl_t *c)
{
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    memset(c, 0, sizeof(*c));
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) {
        KVT_LOG_E("libcurl failed to initialise: %s",
                  curl_easy_strerror(global_rc));
        goto err;
    }
    c->easy = curl_easy_init();
    if (c->easy == NULL) {
        KVT_LOG_E("libcurl could not create a handle");
        goto err;
    }
    return KVT_OK;

err:
    return st;
}

void kvt__curl_fini(kvt__curl_t *c)
{
    if (c->easy != NULL)
        curl_easy_cleanup(c->easy);
    c->easy = NULL;
}

void kvt__curl_resp_free(kvt__curl_resp_t *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

typedef struct {
    kvt__curl_resp_t *r;
    size_t cap, max;
    int overflow, oom;
} sink_t;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    sink_t *s = arg;
    size_t n = size * nmemb;
    kvt__curl_resp_t *r = s->r;

    if (r->len + n > s->max) {
        s->overflow = 1;
        return 0;
    }
    if (r->len + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 256;
        uint8_t *nb;
        while (nc < r->len + n + 1)
            nc *= 2;
        nb = realloc(r->body, nc);
        if (nb == NULL) {
            s->oom = 1;
            return 0;
        }
        r->body = nb;
        s->cap = nc;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
    sink_t *s = arg;
    size_t n = size * nmemb;

    if (n >= 10 && strncasecmp(data, "X-Kvt-Ttl:", 10) == 0)
        s->r->ttl_ack = 1;
    return n;
}

/* Append the request's Authorization header (util/auth.h) to @hdrs: the
 * MAC covers the target as it goes on the wire, path and query, which is
 * what follows the authority in @url. */
static struct curl_slist *sign(kvt__curl_t *c, const char *method,
                               const char *url, const void *body, size_t len,
                               struct curl_slist *hdrs)
{
    char line[32 + KVT_AUTH_HTTP_HDR_MAX];
    const char *t = strstr(url, "://");

    t = t != NULL ? strchr(t + 3, '/') : NULL;
    if (t == NULL)
        t = "/";
    memcpy(line, "Authorization: ", 15);
    kvt__auth_http_sign(&c->auth, method, t, strcspn(t, "#"), body, len,
                        time(NULL), line + 15);
    return curl_slist_append(hdrs, line);
}

kvt_status_t kvt__curl_request(kvt__curl_t *c, const char *what,
                               const char *method, const char *url,
                               const char *ctype, const void *body, size_t len,
                               uint64_t timeout_ms, size_t max_resp,
                               kvt__curl_resp_t *r)
{
    CURL *e = c->easy;
    struct curl_slist *hdrs = NULL, *h;
    sink_t sink = {r, 0, max_resp, 0, 0};
    char ct[128];
    CURLcode rc;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    memset(r, 0, sizeof(*r));
    curl_easy_reset(e);
    c->errbuf[0] = '\0';
    /* "Expect:" stops curl from waiting for 100-continue on large PUTs. */
    h = curl_slist_append(NULL, "Expect:");
    if (h == NULL)
        goto err;
    hdrs = h;
    if (body != NULL) {
        snprintf(ct, sizeof(ct), "Content-Type: %s", ctype);
        if ((h = curl_slist_append(hdrs, ct)) == NULL)
            goto err_hdrs;
        hdrs = h;
    }
    if (c->auth.on) {
        if ((h = sign(c, method, url, body, body ? len : 0, hdrs)) == NULL)
            goto err_hdrs;
        hdrs = h;
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    /* Metadata servers are internal: never through a proxy from the
     * environment. */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &sink);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    if (body != NULL) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    rc = curl_easy_perform(e);
    if (rc == CURLE_OK) {
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->code);
        st = KVT_OK;
        goto out_hdrs;
    }
    if (sink.oom)
        st = KVT_ERR_NO_MEMORY;
    else if (sink.overflow)
        st = KVT_ERR_OVERFLOW;
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        st = KVT_ERR_TIMEDOUT;
    else if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
        st = KVT_ERR_UNREACHABLE;
    else
        st = KVT_ERR_IO;
    KVT_LOG_W("%s: %s %s: %s%s%s", what, method, url,
              sink.overflow ? "answer too large" : curl_easy_strerror(rc),
              c->errbuf[0] ? ": " : "", c->errbuf);
    kvt__curl_resp_free(r);
out_hdrs:
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
err_hdrs:
    curl_slist_free_all(hdrs);
err:
    return st;
}

char *kvt__curl_escape(kvt__curl_t *c, const char *s)
{
    return curl_easy_escape(c->easy, s, (int)strlen(s));
}
