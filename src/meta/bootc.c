/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap client (kvt/metad.h): prefill ranks register with PUT
 * /route and withdraw with DELETE /route; decode ranks read the prefill
 * sizes and the rank addresses with GET /route (docs/metadata.md).
 */
#include <kvt/metad.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KVT_WITH_CURL) && defined(KVT_WITH_JSON)
#include "meta/bootstrap.h"
#include "meta/meta_curl.h"
#include "util/log.h"

#define MAX_ANSWER 65536

struct kvt_bootc {
    kvt__curl_t curl;
};

kvt_status_t kvt_bootc_create(kvt_bootc_h *c_p)
{
    struct kvt_bootc *c = calloc(1, sizeof(*c));
    kvt_status_t st;

    if (c == NULL)
        return KVT_ERR_NO_MEMORY;
    st = kvt__curl_init(&c->curl);
    if (st != KVT_OK) {
        free(c);
        return st;
    }
    if (kvt__auth_init_env(&c->curl.auth) != KVT_OK)
        KVT_LOG_W("bootstrap: %s is too long; requests go unsigned",
                  KVT_AUTH_ENV);
    *c_p = c;
    return KVT_OK;
}

void kvt_bootc_destroy(struct kvt_bootc *c)
{
    if (c == NULL)
        return;
    kvt__curl_fini(&c->curl);
    free(c);
}

/* "http://" + server (which may carry the scheme already) + path. */
static void make_url(char *url, size_t cap, const char *server,
                     const char *path)
{
    if (strncmp(server, "http://", 7) == 0)
        server += 7;
    snprintf(url, cap, "http://%s%s", server, path);
}

static kvt_status_t request(struct kvt_bootc *c, const char *method,
                            const char *server, const char *path,
                            const char *body, uint64_t timeout_ms,
                            kvt__curl_resp_t *r, char *why, size_t wl)
{
    char url[1024];
    kvt_status_t st;

    make_url(url, sizeof(url), server, path);
    st = kvt__curl_request(&c->curl, "bootstrap", method, url,
                           "application/json", body, body ? strlen(body) : 0,
                           timeout_ms, MAX_ANSWER, r);
    if (st != KVT_OK && why != NULL)
        snprintf(
            why, wl, "bootstrap server %s: %s %s: %s", server, method, path,
            st == KVT_ERR_UNREACHABLE ? "unreachable" : kvt_status_str(st));
    return st;
}

kvt_status_t kvt_bootc_register(struct kvt_bootc *c, const char *server,
                                const char *ip, uint16_t port,
                                uint32_t tp_total, uint32_t dp_size,
                                uint32_t engine_rank, uint32_t ttl_s,
                                uint64_t timeout_ms, char *why_in, size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);
    kvt__curl_resp_t r;
    char body[512], path[64];
    kvt_status_t st;

    snprintf(body, sizeof(body),
             "{\"role\": \"Prefill\", \"tp_size\": %u, \"dp_size\": %u, "
             "\"engine_rank\": %u, \"rank_ip\": \"%s\", \"rank_port\": %u}",
             tp_total, dp_size, engine_rank, ip, port);
    if (ttl_s > 0)
        snprintf(path, sizeof(path), "/route?ttl=%u", ttl_s);
    else
        snprintf(path, sizeof(path), "/route");
    st = request(c, "PUT", server, path, body, timeout_ms, &r, why, wl);
    if (st != KVT_OK)
        return st;
    if (r.code != 200) {
        snprintf(why, wl,
                 "bootstrap server %s refused the registration "
                 "of rank %u: HTTP %ld %.120s%s",
                 server, engine_rank, r.code,
                 r.body ? (const char *)r.body : "",
                 r.code == 401 ? " (KVT_AUTH_TOKEN missing or not the "
                                 "server's)"
                               : "");
        st = r.code == 401 ? KVT_ERR_AUTH : KVT_ERR_IO;
    }
    kvt__curl_resp_free(&r);
    return st;
}

kvt_status_t kvt_bootc_unregister(struct kvt_bootc *c, const char *server,
                                  uint32_t rank, uint32_t group,
                                  uint64_t timeout_ms)
{
    kvt__curl_resp_t r;
    char path[96];
    kvt_status_t st;

    snprintf(path, sizeof(path), "/route?engine_rank=%u&target_dp_group=%u",
             rank, group);
    st = request(c, "DELETE", server, path, NULL, timeout_ms, &r, NULL, 0);
    if (st == KVT_OK)
        kvt__curl_resp_free(&r);
    return st;
}

/* GET @path: the answer's body on 200 (*r_p to free). */
static kvt_status_t get_answer(struct kvt_bootc *c, const char *server,
                               const char *path, uint64_t timeout_ms,
                               kvt__curl_resp_t *r, char *why, size_t wl)
{
    kvt_status_t st;

    st = request(c, "GET", server, path, NULL, timeout_ms, r, why, wl);
    if (st != KVT_OK)
        return st;
    if (r->code == 404) {
        snprintf(why, wl,
                 "bootstrap server %s: nothing registered for "
                 "%s",
                 server, path);
        st = KVT_ERR_NOT_FOUND;
    } else if (r->code != 200) {
        snprintf(why, wl, "bootstrap server %s: GET %s: HTTP %ld", server, path,
                 r->code);
        st = KVT_ERR_IO;
    }
    if (st != KVT_OK)
        kvt__curl_resp_free(r);
    return st;
}

kvt_status_t kvt_bootc_sizes(struct kvt_bootc *c, const char *server,
                             uint32_t *tp_total_p, uint32_t *dp_p,
                             uint64_t timeout_ms, char *why_in, size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);
    const char *path = "/route?engine_rank=-1&target_dp_group=-1", *bad;
    kvt__curl_resp_t r;
    kvt_status_t st;

    st = get_answer(c, server, path, timeout_ms, &r, why, wl);
    if (st != KVT_OK)
        return st;
    st = kvt__boot_sizes_parse((const char *)r.body, r.len, tp_total_p, dp_p,
                               &bad);
    if (st != KVT_OK)
        snprintf(why, wl, "bootstrap server %s: GET %s: %s", server, path, bad);
    kvt__curl_resp_free(&r);
    return st;
}

kvt_status_t kvt_bootc_route(struct kvt_bootc *c, const char *server,
                             uint32_t rank, uint32_t group, char *name,
                             size_t cap, uint64_t timeout_ms, char *why_in,
                             size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);
    const char *bad;
    kvt__curl_resp_t r;
    char path[96];
    kvt_status_t st;

    snprintf(path, sizeof(path), "/route?engine_rank=%u&target_dp_group=%u",
             rank, group);
    st = get_answer(c, server, path, timeout_ms, &r, why, wl);
    if (st != KVT_OK)
        return st;
    st = kvt__boot_route_parse((const char *)r.body, r.len, name, cap, &bad);
    if (st != KVT_OK)
        snprintf(why, wl, "bootstrap server %s: rank %u of group %u: %s",
                 server, rank, group, bad);
    kvt__curl_resp_free(&r);
    return st;
}

#else /* without libcurl or json-c */

kvt_status_t kvt_bootc_create(kvt_bootc_h *c_p)
{
    (void)c_p;
    return KVT_ERR_NOT_SUPPORTED;
}

void kvt_bootc_destroy(struct kvt_bootc *c)
{
    (void)c;
}

kvt_status_t kvt_bootc_register(struct kvt_bootc *c, const char *server,
                                const char *ip, uint16_t port,
                                uint32_t tp_total, uint32_t dp_size,
                                uint32_t engine_rank, uint32_t ttl_s,
                                uint64_t timeout_ms, char *why_in, size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);

    (void)c, (void)server, (void)ip, (void)port, (void)tp_total;
    (void)dp_size, (void)engine_rank, (void)ttl_s, (void)timeout_ms;
    snprintf(why, wl, "built without libcurl and json-c");
    return KVT_ERR_NOT_SUPPORTED;
}

kvt_status_t kvt_bootc_unregister(struct kvt_bootc *c, const char *server,
                                  uint32_t rank, uint32_t group,
                                  uint64_t timeout_ms)
{
    (void)c, (void)server, (void)rank, (void)group, (void)timeout_ms;
    return KVT_ERR_NOT_SUPPORTED;
}

kvt_status_t kvt_bootc_sizes(struct kvt_bootc *c, const char *server,
                             uint32_t *tp_total_p, uint32_t *dp_p,
                             uint64_t timeout_ms, char *why_in, size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);

    (void)c, (void)server, (void)tp_total_p, (void)dp_p, (void)timeout_ms;
    snprintf(why, wl, "built without libcurl and json-c");
    return KVT_ERR_NOT_SUPPORTED;
}

kvt_status_t kvt_bootc_route(struct kvt_bootc *c, const char *server,
                             uint32_t rank, uint32_t group, char *name,
                             size_t cap, uint64_t timeout_ms, char *why_in,
                             size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);

    (void)c, (void)server, (void)rank, (void)group, (void)name, (void)cap;
    (void)timeout_ms;
    snprintf(why, wl, "built without libcurl and json-c");
    return KVT_ERR_NOT_SUPPORTED;
}

#endif
