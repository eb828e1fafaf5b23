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
#include "meta/json_parse.h"
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
        st = r.code == 401 ? KVT_ERR_ACCESS : KVT_ERR_IO;
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

/* An integer field given as a JSON integer or a decimal string. */
static int json_uint(json_object *o, const char *key, uint64_t max,
                     uint64_t *v_p)
{
    json_object *v;
    uint64_t x;

    if (!json_object_object_get_ex(o, key, &v))
        return -1;
    if (json_object_is_type(v, json_type_string)) {
        const char *s = json_object_get_string(v);
        char *end;
        if (s == NULL || *s < '0' || *s > '9')
            return -1;
        x = strtoull(s, &end, 10);
        if (*end != '\0')
            return -1;
    } else if (kvt__json_u64(v, &x) != 0) {
        return -1;
    }
    if (x > max)
        return -1;
    *v_p = x;
    return 0;
}

static kvt_status_t get_json(struct kvt_bootc *c, const char *server,
                             const char *path, uint64_t timeout_ms,
                             json_object **o_p, char *why, size_t wl)
{
    kvt__curl_resp_t r;
    kvt_status_t st;

    st = request(c, "GET", server, path, NULL, timeout_ms, &r, why, wl);
    if (st != KVT_OK)
        return st;
    if (r.code == 404) {
        snprintf(why, wl,
                 "bootstrap server %s: nothing registered for "
                 "%s",
                 server, path);
        st = KVT_ERR_NOT_FOUND;
    } else if (r.code != 200) {
        snprintf(why, wl, "bootstrap server %s: GET %s: HTTP %ld", server, path,
                 r.code);
        st = KVT_ERR_IO;
    } else {
        *o_p = kvt__json_parse((const char *)r.body, r.len);
        if (*o_p == NULL) {
            snprintf(why, wl,
                     "bootstrap server %s: GET %s: the answer is "
                     "not JSON",
                     server, path);
            st = KVT_ERR_PROTOCOL;
        }
    }
    kvt__curl_resp_free(&r);
    return st;
}

kvt_status_t kvt_bootc_sizes(struct kvt_bootc *c, const char *server,
                             uint32_t *tp_total_p, uint32_t *dp_p,
                             uint64_t timeout_ms, char *why_in, size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);
    json_object *o = NULL;
    uint64_t tp, dp;
    kvt_status_t st;

    st = get_json(c, server, "/route?engine_rank=-1&target_dp_group=-1",
                  timeout_ms, &o, why, wl);
    if (st != KVT_OK)
        return st;
    if (json_uint(o, "prefill_tp_size", 1u << 20, &tp) != 0 ||
        json_uint(o, "prefill_dp_size", 1u << 20, &dp) != 0 || tp == 0 ||
        dp == 0 || tp % dp != 0) {
        snprintf(why, wl, "bootstrap server %s: bad prefill sizes", server);
        st = KVT_ERR_PROTOCOL;
    } else {
        *tp_total_p = (uint32_t)tp;
        *dp_p = (uint32_t)dp;
    }
    json_object_put(o);
    return st;
}

kvt_status_t kvt_bootc_route(struct kvt_bootc *c, const char *server,
                             uint32_t rank, uint32_t group, char *name,
                             size_t cap, uint64_t timeout_ms, char *why_in,
                             size_t wl_in)
{
    char spare_[1], *why = why_in != NULL ? why_in : spare_;
    size_t wl = why_in != NULL ? wl_in : sizeof(spare_);
    json_object *o = NULL;
    const char *ip;
    uint64_t port;
    char path[96];
    kvt_status_t st;

    snprintf(path, sizeof(path), "/route?engine_rank=%u&target_dp_group=%u",
             rank, group);
    st = get_json(c, server, path, timeout_ms, &o, why, wl);
    if (st != KVT_OK)
        return st;
    ip = kvt__json_str(o, "rank_ip", 255);
    if (ip == NULL || json_uint(o, "rank_port", 65535, &port) != 0 ||
        port == 0) {
        snprintf(why, wl,
                 "bootstrap server %s: bad address for rank %u "
                 "of group %u",
                 server, rank, group);
        st = KVT_ERR_PROTOCOL;
    } else if ((size_t)snprintf(name, cap,
                                strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip,
                                (unsigned)port) >= cap) {
        snprintf(why, wl,
                 "bootstrap server %s: address of rank %u too "
                 "long",
                 server, rank);
        st = KVT_ERR_PROTOCOL;
    }
    json_object_put(o);
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
