/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the metadata layer's pure parts: backend URIs, request
 * targets, base64, the metad store, bootstrap registrations and the JSON
 * segment descriptor codec.
 */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_test.h"
#include "meta/base64.h"
#include "proto/segdesc.h"
#include "meta/bootstrap.h"
#include "meta/http_parse.h"
#include "meta/meta.h"
#include "meta/metad_conn.h"
#include "meta/metad_store.h"

KVT_TEST(uri)
{
    kvt__meta_uri_t u;

    CHECK_OK(kvt__meta_uri_parse("p2p", &u));
    CHECK(u.kind == KVT__META_P2P && u.nendpoints == 0);
    CHECK_OK(kvt__meta_uri_parse("P2PHANDSHAKE", &u));
    CHECK(u.kind == KVT__META_P2P);
    CHECK_OK(kvt__meta_uri_parse("", &u));
    CHECK(u.kind == KVT__META_P2P);

    CHECK_OK(kvt__meta_uri_parse("http://10.0.0.1:8080", &u));
    CHECK(u.kind == KVT__META_HTTP && u.nendpoints == 1);
    CHECK(strcmp(u.ep[0].host, "10.0.0.1") == 0 && u.ep[0].port == 8080);
    CHECK(strcmp(u.path, "/metadata") == 0);
    CHECK_OK(kvt__meta_uri_parse("http://meta.svc/custom/md", &u));
    CHECK(u.ep[0].port == 80 && strcmp(u.path, "/custom/md") == 0);
    CHECK_OK(kvt__meta_uri_parse("http://[::1]:9/", &u));
    CHECK(strcmp(u.ep[0].host, "::1") == 0 && u.ep[0].port == 9);
    CHECK(strcmp(u.path, "/metadata") == 0);

    CHECK_OK(kvt__meta_uri_parse("redis://127.0.0.1:6380/2", &u));
    CHECK(u.kind == KVT__META_REDIS && u.ep[0].port == 6380 && u.db == 2);
    CHECK_OK(kvt__meta_uri_parse("redis://:s3cret@h", &u));
    CHECK(u.ep[0].port == 6379 && strcmp(u.password, "s3cret") == 0);
    CHECK(u.user[0] == '\0' && u.db == 0);
    CHECK_OK(kvt__meta_uri_parse("redis://alice:pw@h:1/", &u));
    CHECK(strcmp(u.user, "alice") == 0 && strcmp(u.password, "pw") == 0);

    CHECK_OK(kvt__meta_uri_parse("etcd://a:1,b,[fe80::1]:3", &u));
    CHECK(u.kind == KVT__META_ETCD && u.nendpoints == 3);
    CHECK(strcmp(u.ep[1].host, "b") == 0 && u.ep[1].port == 2379);
    CHECK(strcmp(u.ep[2].host, "fe80::1") == 0 && u.ep[2].port == 3);
    CHECK_OK(kvt__meta_uri_parse("ETCD://a:1/", &u));

    static const char *const bad[] = {
        "ftp://x",
        "http://",
        "http://:80",
        "http://h:0",
        "http://h:65536",
        "http://h:8x",
        "http://h h",
        "http://h/a b",
        "http://h/a?x",
        "http://[zz]:1",
        "http://[::1",
        "redis://h/x",
        "redis://h/70000",
        "redis://pw@h",
        "etcd://",
        "etcd://a,",
        "etcd://a,,b",
        "etcd://1,2,3,4,5,6,7,8,9",
        "p2p2",
        "http://h:-1",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (kvt__meta_uri_parse(bad[i], &u) != KVT_ERR_INVALID_PARAM) {
            fprintf(stderr, "accepted '%s'\n", bad[i]);
            CHECK(0);
        }
    }
}

static int target(const char *s, kvt__http_req_t *r)
{
    return kvt__http_parse_target(s, strlen(s), r);
}

KVT_TEST(http_target)
{
    kvt__http_req_t r;
    char *big;
    uint64_t v;

    CHECK(target("/metadata?key=mooncake/ram/127.0.0.1:1234", &r) == 0);
    CHECK(r.route == KVT__ROUTE_METADATA && r.has_key);
    CHECK(strcmp(r.key, "mooncake/ram/127.0.0.1:1234") == 0);
    CHECK(r.key_len == 27 && !r.has_ttl);
    CHECK(target("/metadata?key=a%2Fb+c%00", &r) == 400);
    CHECK(target("/metadata?key=a%2Fb+c&ttl=30", &r) == 0);
    CHECK(strcmp(r.key, "a/b c") == 0 && r.has_ttl && r.ttl_s == 30);
    CHECK(target("/metadata?x=1&key=first&key=second#frag", &r) == 0);
    CHECK(strcmp(r.key, "first") == 0);
    CHECK(target("/metadata?key=a#&key=b", &r) == 0);
    CHECK(strcmp(r.key, "a") == 0);
    CHECK(target("/metadata?key", &r) == 0);
    CHECK(r.has_key && r.key_len == 0);
    CHECK(target("/metadata", &r) == 0 && !r.has_key);
    /* Keys are stripped as Mooncake's servers strip them; blank keys come
     * out empty (the server refuses them). */
    CHECK(target("/metadata?key=+%20a+b%09%0D%0A", &r) == 0);
    CHECK(strcmp(r.key, "a b") == 0 && r.key_len == 3);
    CHECK(target("/metadata?key=+%09+", &r) == 0);
    CHECK(r.has_key && r.key_len == 0 && r.key[0] == '\0');
    CHECK(target("/metadata/keys?prefix=+a", &r) == 0 && r.prefix_len == 2);
    /* Keys and prefixes must be UTF-8: they travel in JSON answers. */
    CHECK(target("/metadata?key=caf%C3%A9%F0%9F%98%80", &r) == 0);
    CHECK(r.key_len == 9);
    CHECK(target("/metadata?key=%FF", &r) == 400);
    CHECK(target("/metadata?key=a%C3", &r) == 400);
    CHECK(target("/metadata?key=%C0%AF", &r) == 400);       /* overlong */
    CHECK(target("/metadata?key=%ED%A0%80", &r) == 400);    /* surrogate */
    CHECK(target("/metadata?key=%F4%90%80%80", &r) == 400); /* > U+10FFFF */
    CHECK(target("/metadata?key=%80", &r) == 400);
    CHECK(target("/metadata/keys?prefix=%FE", &r) == 400);
    CHECK(target("/metadata?key=%4", &r) == 400);
    CHECK(target("/metadata?key=%g0", &r) == 400);
    CHECK(target("/metadata?ttl=-1&key=a", &r) == 400);
    CHECK(target("/metadata?ttl=31536001&key=a", &r) == 400);
    CHECK(target("/metadata?ttl=abc&key=a", &r) == 400);
    CHECK(target("/metadata?%zz=1", &r) == 400);
    CHECK(target("/metadata?unknownverylongparametername=1&key=k", &r) == 0);
    CHECK(target("/metadata/keys?prefix=kvt%2F", &r) == 0);
    CHECK(r.route == KVT__ROUTE_KEYS && strcmp(r.prefix, "kvt/") == 0);
    CHECK(target("/route?engine_rank=-1&target_dp_group=-1", &r) == 0);
    CHECK(r.route == KVT__ROUTE_ROUTE && r.engine_rank == -1);
    CHECK(r.has_dp_group && r.dp_group == -1);
    CHECK(target("/route?engine_rank=2147483648", &r) == 400);
    CHECK(target("/route?engine_rank=", &r) == 400);
    CHECK(target("/route?engine_rank=--1", &r) == 400);
    CHECK(target("/topology", &r) == 0 && r.route == KVT__ROUTE_TOPOLOGY);
    CHECK(target("/health", &r) == 0 && r.route == KVT__ROUTE_HEALTH);
    CHECK(target("/metrics?x", &r) == 0 && r.route == KVT__ROUTE_METRICS);
    CHECK(target("/metadata/", &r) == 0 && r.route == KVT__ROUTE_NONE);
    CHECK(target("/Metadata", &r) == 0 && r.route == KVT__ROUTE_NONE);
    CHECK(target("metadata?key=a", &r) == 400);
    CHECK(target("", &r) == 400);
    CHECK(kvt__http_parse_target("/health", 0, &r) == 400);

    big = malloc(4 * KVT_META_KEY_MAX + 1024);
    CHECK(big != NULL);
    strcpy(big, "/metadata?key=");
    memset(big + 14, 'a', KVT_META_KEY_MAX);
    big[14 + KVT_META_KEY_MAX] = '\0';
    CHECK(target(big, &r) == 0 && r.key_len == KVT_META_KEY_MAX);
    strcat(big, "a");
    CHECK(target(big, &r) == 414);
    for (size_t i = 0; i < KVT_HTTP_TARGET_MAX; i++)
        big[14 + i] = 'b';
    big[14 + KVT_HTTP_TARGET_MAX] = '\0';
    CHECK(target(big, &r) == 414);
    free(big);

    CHECK(kvt__http_parse_length("0", &v) == 0 && v == 0);
    CHECK(kvt__http_parse_length("16777216", &v) == 0 && v == 16777216);
    CHECK(kvt__http_parse_length("", &v) == 400);
    CHECK(kvt__http_parse_length("-1", &v) == 400);
    CHECK(kvt__http_parse_length(" 1", &v) == 400);
    CHECK(kvt__http_parse_length("99999999999999999999", &v) == 400);
    CHECK(kvt__http_parse_length(NULL, &v) == 400);
    CHECK(kvt__http_method("GET") == KVT__METHOD_GET);
    CHECK(kvt__http_method("PATCH") == KVT__METHOD_OTHER);
    CHECK(strcmp(kvt__http_route_name(KVT__ROUTE_KEYS), "keys") == 0);
}

KVT_TEST(base64)
{
    static const char *const enc[] = {"",         "Zg==",     "Zm8=",    "Zm9v",
                                      "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    char out[64];
    uint8_t dec[64], all[256];

    for (int n = 0; n <= 6; n++) {
        CHECK(kvt__b64_encode("foobar", (size_t)n, out) == strlen(enc[n]));
        CHECK(strcmp(out, enc[n]) == 0);
        CHECK(kvt__b64_decode(enc[n], strlen(enc[n]), dec) == n);
        CHECK(memcmp(dec, "foobar", (size_t)n) == 0);
    }
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    {
        char e[400];
        uint8_t d[300];
        size_t n = kvt__b64_encode(all, 256, e);
        CHECK(n == kvt__b64_enc_len(256));
        CHECK(kvt__b64_decode(e, n, d) == 256);
        CHECK(memcmp(d, all, 256) == 0);
    }
    CHECK(kvt__b64_decode("Zm9", 3, dec) == -1);
    CHECK(kvt__b64_decode("Zm=v", 4, dec) == -1);
    CHECK(kvt__b64_decode("Z===", 4, dec) == -1);
    CHECK(kvt__b64_decode("Zg==Zg==", 8, dec) == -1);
    CHECK(kvt__b64_decode("Zm9*", 4, dec) == -1);
}

struct got {
    char buf[64];
    size_t len;
};

static void take(void *arg, const uint8_t *val, size_t len)
{
    struct got *g = arg;
    memcpy(g->buf, val, len);
    g->len = len;
}

KVT_TEST(store)
{
    kvt__kvstore_t *s;
    struct got g;
    char **keys;
    size_t n;
    char key[32];

    CHECK_OK(kvt__kvstore_create(1 << 20, &s));
    CHECK_ST(kvt__kvstore_get(s, "a", 1, 0, take, &g), KVT_ERR_NOT_FOUND);
    CHECK_OK(kvt__kvstore_put(s, "a", 1, "one", 3, 0, 0, 0, 0, NULL));
    CHECK_OK(kvt__kvstore_get(s, "a", 1, 0, take, &g));
    CHECK(g.len == 3 && memcmp(g.buf, "one", 3) == 0);
    CHECK_OK(kvt__kvstore_put(s, "a", 1, "", 0, 0, 0, 0, 0, NULL));
    CHECK_OK(kvt__kvstore_get(s, "a", 1, 0, take, &g));
    CHECK(g.len == 0);
    /* Keys are byte strings: "a" and "a\0" differ. */
    CHECK_OK(kvt__kvstore_put(s, "a\0", 2, "two", 3, 0, 0, 0, 0, NULL));
    CHECK(kvt__kvstore_count(s) == 2);
    /* Expiry: invisible from the deadline on, freed by purge. */
    CHECK_OK(kvt__kvstore_put(s, "t", 1, "x", 1, 1000, 0, 0, 0, NULL));
    CHECK_OK(kvt__kvstore_get(s, "t", 1, 999, take, &g));
    CHECK_ST(kvt__kvstore_get(s, "t", 1, 1000, take, &g), KVT_ERR_NOT_FOUND);
    CHECK_ST(kvt__kvstore_del(s, "t", 1, 1000), KVT_ERR_NOT_FOUND);
    CHECK_OK(kvt__kvstore_put(s, "t", 1, "x", 1, 2000, 0, 0, 1000, NULL));
    CHECK(kvt__kvstore_purge(s, 1500) == 0);
    CHECK(kvt__kvstore_purge(s, 2000) == 1);
    {
        /* Once: other bytes refused while the entry lives, the same bytes
         * renew it, an expired one is replaced. */
        int same = -1;
        CHECK_OK(kvt__kvstore_put(s, "o", 1, "x", 1, 3000, KVT__KVSTORE_ONCE, 0,
                                  2000, &same));
        CHECK(same == 0);
        CHECK_ST(kvt__kvstore_put(s, "o", 1, "y", 1, 0, KVT__KVSTORE_ONCE, 0,
                                  2500, &same),
                 KVT_ERR_EXISTS);
        CHECK_OK(kvt__kvstore_get(s, "o", 1, 2500, take, &g));
        CHECK(g.len == 1 && g.buf[0] == 'x');
        CHECK_OK(kvt__kvstore_put(s, "o", 1, "x", 1, 5000, KVT__KVSTORE_ONCE, 0,
                                  2500, &same));
        CHECK(same == 1);
        CHECK_OK(kvt__kvstore_get(s, "o", 1, 4000, take, &g));
        CHECK_OK(kvt__kvstore_put(s, "o", 1, "y", 1, 0, KVT__KVSTORE_ONCE, 0,
                                  5000, &same));
        CHECK(same == 0);
        CHECK_OK(kvt__kvstore_get(s, "o", 1, 5000, take, &g));
        CHECK(g.len == 1 && g.buf[0] == 'y');
        CHECK_OK(kvt__kvstore_del(s, "o", 1, 5000));
    }
    CHECK(kvt__kvstore_count(s) == 2);
    /* Many keys: the shards grow. */
    for (int i = 0; i < 5000; i++) {
        int kl = snprintf(key, sizeof(key), "p/%05d", i);
        CHECK_OK(kvt__kvstore_put(s, key, (size_t)kl, key, (size_t)kl, 0, 0, 0,
                                  0, NULL));
    }
    CHECK_OK(kvt__kvstore_keys(s, "p/", 2, 0, 10000, &keys, &n));
    CHECK(n == 5000 && strcmp(keys[0], "p/00000") == 0);
    CHECK(strcmp(keys[4999], "p/04999") == 0);
    kvt__meta_list_free(keys, n);
    CHECK_ST(kvt__kvstore_keys(s, "p/", 2, 0, 100, &keys, &n),
             KVT_ERR_OVERFLOW);
    for (int i = 0; i < 5000; i += 2) {
        int kl = snprintf(key, sizeof(key), "p/%05d", i);
        CHECK_OK(kvt__kvstore_del(s, key, (size_t)kl, 0));
    }
    CHECK(kvt__kvstore_count(s) == 2502);
    CHECK_OK(kvt__kvstore_get(s, "p/00001", 7, 0, take, &g));
    CHECK(g.len == 7 && memcmp(g.buf, "p/00001", 7) == 0);
    /* The byte limit: refused puts change nothing. */
    {
        size_t big = 1 << 20;
        char *v = calloc(1, big);
        CHECK(v != NULL);
        CHECK_ST(kvt__kvstore_put(s, "big", 3, v, big, 0, 0, 0, 0, NULL),
                 KVT_ERR_NO_SPACE);
        CHECK_ST(kvt__kvstore_put(s, "a", 1, v, big, 0, 0, 0, 0, NULL),
                 KVT_ERR_NO_SPACE);
        CHECK_OK(kvt__kvstore_get(s, "a", 1, 0, take, &g));
        CHECK(g.len == 0);
        free(v);
    }
    kvt__kvstore_destroy(s);
    {
        /* Reservations count against the limit; a put may use its own. */
        char v[2000] = {0};
        CHECK_OK(kvt__kvstore_create(4096, &s));
        CHECK_OK(kvt__kvstore_reserve(s, 3000));
        CHECK_ST(kvt__kvstore_reserve(s, 1200), KVT_ERR_NO_SPACE);
        CHECK_ST(kvt__kvstore_put(s, "r", 1, v, 2000, 0, 0, 0, 0, NULL),
                 KVT_ERR_NO_SPACE);
        CHECK(kvt__kvstore_bytes(s) == 3000);
        CHECK_OK(kvt__kvstore_put(s, "r", 1, v, 2000, 0, 0, 3000, 0, NULL));
        CHECK(kvt__kvstore_bytes(s) >= 2000 && kvt__kvstore_bytes(s) < 2100);
        CHECK_OK(kvt__kvstore_reserve(s, 1000));
        kvt__kvstore_release(s, 1000);
        CHECK_OK(kvt__kvstore_del(s, "r", 1, 0));
        CHECK(kvt__kvstore_bytes(s) == 0);
        kvt__kvstore_destroy(s);
    }
    kvt__kvstore_destroy(NULL);
}

#ifdef KVT_WITH_JSON
static kvt_status_t boot(const char *json, kvt__boot_rank_t *r)
{
    const char *why = NULL;
    kvt_status_t st = kvt__boot_parse(json, strlen(json), r, &why);
    CHECK(st == KVT_OK ? why == NULL : why != NULL);
    return st;
}
#endif

KVT_TEST(bootstrap)
{
#ifndef KVT_WITH_JSON
    SKIP("built without json-c");
#else
    kvt__boot_rank_t r;
    kvt__boot_table_t *t;
    char *json;
    size_t len;

    CHECK_OK(boot("{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":2,"
                  "\"rank_ip\":\"10.0.0.5\",\"rank_port\":17000,"
                  "\"engine_rank\":5,\"extra\":[1,2]}",
                  &r));
    CHECK(strcmp(r.role, "Prefill") == 0 && r.tp_size == 8 && r.dp_size == 2);
    CHECK(r.engine_rank == 5 && r.rank_port == 17000);
    CHECK(kvt__boot_dp_group(&r) == 1 && kvt__boot_tp_rank(&r) == 1);
    CHECK_OK(boot("{\"role\":\"Prefill\",\"world_size\":\"2\",\"dp_size\":1,"
                  "\"rank_ip\":\"h\",\"rank_port\":\"80\",\"engine_rank\":"
                  "\"1\"} \n",
                  &r));
    CHECK(r.tp_size == 2 && r.engine_rank == 1 && r.rank_port == 80);
    static const char *const bad[] = {
        "",
        "[]",
        "{",
        "{\"role\":\"Prefill\"}",
        "{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":3,\"rank_ip\":\"h\","
        "\"rank_port\":1,\"engine_rank\":0}",
        "{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":2,\"rank_ip\":\"h\","
        "\"rank_port\":1,\"engine_rank\":8}",
        "{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":2,\"rank_ip\":\"h\","
        "\"rank_port\":0,\"engine_rank\":0}",
        "{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":2,\"rank_ip\":\"a b\","
        "\"rank_port\":1,\"engine_rank\":0}",
        "{\"role\":\"Prefill\",\"tp_size\":8.5,\"dp_size\":2,\"rank_ip\":"
        "\"h\",\"rank_port\":1,\"engine_rank\":0}",
        "{\"role\":\"\",\"tp_size\":8,\"dp_size\":2,\"rank_ip\":\"h\","
        "\"rank_port\":1,\"engine_rank\":0}",
        "{\"role\":\"Prefill\",\"tp_size\":8,\"dp_size\":2,\"rank_ip\":\"h\","
        "\"rank_port\":1,\"engine_rank\":0} x",
        "{\"role\":\"Prefill\",\"tp_size\":99999,\"dp_size\":1,\"rank_ip\":"
        "\"h\",\"rank_port\":1,\"engine_rank\":0}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (boot(bad[i], &r) == KVT_OK) {
            fprintf(stderr, "accepted '%s'\n", bad[i]);
            CHECK(0);
        }
    }

    CHECK_OK(kvt__boot_table_create(&t));
    /* Nothing registered yet: an empty topology (UBSan once caught a
     * qsort of the empty table's NULL array here). */
    CHECK(kvt__boot_table_topology(t, 0, &json, &len) == 200);
    CHECK(strstr(json, "\"ranks\":[]") != NULL);
    free(json);
    CHECK(kvt__boot_table_get(t, -1, -1, 0, &json, &len) == 404);
    CHECK_OK(boot("{\"role\":\"Prefill\",\"tp_size\":4,\"dp_size\":2,"
                  "\"rank_ip\":\"h1\",\"rank_port\":1,\"engine_rank\":3}",
                  &r));
    CHECK(kvt__boot_table_put(t, &r, 0, 0) == 200);
    CHECK(kvt__boot_table_get(t, 1, 1, 0, &json, &len) == 200);
    CHECK(strcmp(json, "{\"rank_ip\":\"h1\",\"rank_port\":1}") == 0);
    free(json);
    CHECK(kvt__boot_table_get(t, -1, -1, 0, &json, &len) == 200);
    CHECK(strcmp(json, "{\"prefill_tp_size\":4,\"prefill_dp_size\":2}") == 0);
    free(json);
    CHECK(kvt__boot_table_get(t, 0, 1, 0, &json, &len) == 404);
    CHECK(kvt__boot_table_get(t, -1, 0, 0, &json, &len) == 400);
    CHECK(kvt__boot_table_get(t, -2, -2, 0, &json, &len) == 400);
    /* Other sizes while ranks are registered: refused, nothing changes. */
    r.tp_size = 8;
    CHECK(kvt__boot_table_put(t, &r, 0, 0) == 409);
    CHECK(kvt__boot_table_count(t) == 1);
    /* A rank with a TTL expires; the sizes reset when the table empties. */
    r.tp_size = 4;
    r.engine_rank = 0;
    strcpy(r.rank_ip, "h0");
    CHECK(kvt__boot_table_put(t, &r, 5000, 0) == 200);
    CHECK(kvt__boot_table_topology(t, 0, &json, &len) == 200);
    CHECK(strstr(json, "\"ranks\":[{\"dp_group\":0,\"tp_rank\":0,"
                       "\"engine_rank\":0,\"rank_ip\":\"h0\"") != NULL);
    free(json);
    CHECK(kvt__boot_table_purge(t, 5000) == 1);
    CHECK(kvt__boot_table_del(t, 1, 1, 0) == 200);
    CHECK(kvt__boot_table_del(t, 1, 1, 0) == 404);
    CHECK(kvt__boot_table_del(t, -1, 1, 0) == 400);
    r.tp_size = 8;
    r.dp_size = 1;
    CHECK(kvt__boot_table_put(t, &r, 0, 0) == 200);
    CHECK(kvt__boot_table_topology(t, 0, &json, &len) == 200);
    CHECK(strstr(json, "\"prefill_tp_size\":8,\"prefill_dp_size\":1") != NULL);
    free(json);
    kvt__boot_table_destroy(t);
#endif
}

#ifdef KVT_WITH_JSON
static void sample(kvt__segdesc_t *d, kvt_remote_region_t *regs)
{
    memset(d, 0, sizeof(*d));
    strcpy(d->name, "node-7:15000");
    strcpy(d->host, "10.0.0.7");
    d->port = 15000;
    d->transports = KVT_TRANSPORT_TCP;
    d->host_id = 0xfedcba9876543210ull;
    d->pid = 77;
    regs[0] = (kvt_remote_region_t){
        0x1000, 0x2000, KVT_ACCESS_REMOTE_READ, KVT_MEM_HOST, -1, 0};
    regs[1] = (kvt_remote_region_t){UINT64_MAX - 15, 15, KVT_ACCESS_REMOTE_RW,
                                    KVT_MEM_CUDA,    3,  0};
    d->regions = regs;
    d->nregions = 2;
}

/* Replace the first occurrence of @from in @json by @to; decode that. */
static kvt_status_t mutated(const char *json, const char *from, const char *to)
{
    char buf[4096];
    const char *p = strstr(json, from);
    kvt__segdesc_t d;
    kvt_status_t st;

    CHECK(p != NULL);
    snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(p - json), json, to,
             p + strlen(from));
    st = kvt__segdesc_from_json(buf, strlen(buf), &d);
    CHECK(st != KVT_OK || d.nregions == 2);
    kvt__segdesc_clear(&d);
    return st;
}

#endif

KVT_TEST(segdesc_json)
{
#ifndef KVT_WITH_JSON
    SKIP("built without json-c");
#else
    kvt_remote_region_t regs[2];
    kvt__segdesc_t d, got;
    char *json, compat[40];
    size_t len;

    sample(&d, regs);
    CHECK_OK(kvt__segdesc_to_json(&d, &json, &len));
    CHECK(strlen(json) == len);
    CHECK(strstr(json, "\"kvt_segment\":1") != NULL);
    CHECK(strstr(json, "\"transports\":[{\"name\":\"tcp\",\"port\":15000}]"));
    CHECK(strstr(json, "\"addr\":18446744073709551600"));
    CHECK_OK(kvt__segdesc_from_json(json, len, &got));
    CHECK(strcmp(got.name, d.name) == 0 && strcmp(got.host, d.host) == 0);
    CHECK(got.port == d.port && got.transports == d.transports);
    CHECK(got.host_id == d.host_id && got.pid == d.pid);
    CHECK(got.nregions == 2 && memcmp(got.regions, regs, sizeof(regs)) == 0);
    kvt__segdesc_clear(&got);

    /* Forward compatibility: unknown fields and transports are ignored. */
    CHECK_OK(mutated(json, "\"transports\":[",
                     "\"future\":{\"x\":1},\"transports\":[{\"name\":"
                     "\"warp\",\"worker\":\"AAAA\"},"));
    CHECK_OK(mutated(json, "\"keys\":{}", "\"keys\":{\"ucx\":\"cmtleQ==\"}"));
    /* Versions. */
    snprintf(compat, sizeof(compat), "\"compat\":\"%016llx\"",
             (unsigned long long)kvt__segdesc_compat_hash());
    CHECK(strstr(json, compat) != NULL);
    CHECK_ST(mutated(json, "\"kvt_segment\":1", "\"kvt_segment\":2"),
             KVT_ERR_VERSION);
    CHECK_ST(mutated(json, compat, "\"compat\":\"0000000000000000\""),
             KVT_ERR_VERSION);
    /* Malformed. */
    static const char *const bad[][2] = {
        {"\"kvt_segment\":1", "\"kvt_segment\":\"1\""},
        {"\"name\":\"node-7:15000\"", "\"name\":\"\""},
        {"\"name\":\"node-7:15000\"", "\"name\":\"a\\u0000b\""},
        {"\"name\":\"node-7:15000\"", "\"name\":7"},
        {"\"host\":\"10.0.0.7\",", ""},
        {"\"rpc\":15000", "\"rpc\":0"},
        {"\"rpc\":15000", "\"rpc\":65536"},
        {"\"rpc\":15000", "\"rpc\":-1"},
        {"\"pid\":77", "\"pid\":4294967296"},
        {"\"host_id\":\"fedcba9876543210\"", "\"host_id\":\"xyz\""},
        {"\"addr\":4096", "\"addr\":-4096"},
        {"\"addr\":4096", "\"addr\":4096.0"},
        {"\"length\":8192", "\"length\":0"},
        {"\"length\":15", "\"length\":16"},
        {"[\"read\"]", "[\"execute\"]"},
        {"[\"read\"]", "\"read\""},
        {"\"kind\":\"host\"", "\"kind\":\"tape\""},
        {"\"keys\":{}", "\"keys\":{\"x\":1}"},
        {"\"regions\":[", "\"regions\":[7,"},
        {"\"transports\":[", "\"transports\":[{\"port\":1},"},
        {"{", "["},
        {"\"kvt_segment\":1", "\"kvt_segment\":1}"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (mutated(json, bad[i][0], bad[i][1]) != KVT_ERR_PROTOCOL) {
            fprintf(stderr, "case %zu: accepted %s -> %s\n", i, bad[i][0],
                    bad[i][1]);
            CHECK(0);
        }
    }
    CHECK_ST(kvt__segdesc_from_json(json, len - 1, &got), KVT_ERR_PROTOCOL);
    CHECK_ST(kvt__segdesc_from_json("", 0, &got), KVT_ERR_PROTOCOL);
    CHECK(got.regions == NULL && got.nregions == 0);
    free(json);

    /* The encoder refuses what it cannot describe. */
    sample(&d, regs);
    d.name[0] = '\0';
    CHECK_ST(kvt__segdesc_to_json(&d, &json, &len), KVT_ERR_INVALID_PARAM);
    sample(&d, regs);
    regs[0].length = 0;
    CHECK_ST(kvt__segdesc_to_json(&d, &json, &len), KVT_ERR_INVALID_PARAM);
    sample(&d, regs);
    d.nregions = 0;
    d.regions = NULL;
    CHECK_OK(kvt__segdesc_to_json(&d, &json, &len));
    CHECK(strstr(json, "\"regions\":[]") != NULL);
    CHECK_OK(kvt__segdesc_from_json(json, len, &got));
    CHECK(got.nregions == 0 && got.regions == NULL);
    free(json);
#endif
}

/*
 * Binary descriptor -> JSON -> descriptor keeps every transport built in,
 * each named in the JSON as its section names it; a transport this build
 * does not know is listed by its section's name and ignored when read.
 */
KVT_TEST(segdesc_json_transports)
{
#ifndef KVT_WITH_JSON
    SKIP("built without json-c");
#else
    kvt_transport_info_t t[32];
    kvt_remote_region_t regs[2];
    kvt__segdesc_t d, bin, got;
    uint32_t all = 0;
    uint8_t *wire;
    char *json, item[64];
    size_t n = 0, wlen, len;

    sample(&d, regs);
    d.transports = 0;
    CHECK_OK(kvt_transports(t, 32, &n));
    CHECK(n >= 2 && n <= 32);
    for (size_t i = 0; i < n; i++) {
        CHECK_OK(kvt__segdesc_add_tl(&d, t[i].id, t[i].name, 1, "x", 1));
        all |= t[i].id;
    }
    CHECK_OK(kvt__segdesc_add_tl(&d, 1u << 30, "warp", 1, NULL, 0));
    CHECK_OK(kvt__segdesc_encode(&d, &wire, &wlen));
    CHECK_OK(kvt__segdesc_decode(wire, wlen, &bin));
    free(wire);
    CHECK(bin.transports == (all | 1u << 30));

    CHECK_OK(kvt__segdesc_to_json(&bin, &json, &len));
    for (size_t i = 0; i < n; i++) {
        snprintf(item, sizeof(item), "{\"name\":\"%s\"", t[i].name);
        CHECK(strstr(json, item) != NULL);
    }
    CHECK(strstr(json, "{\"name\":\"warp\"}") != NULL);
    CHECK_OK(kvt__segdesc_from_json(json, len, &got));
    CHECK(got.transports == all);
    kvt__segdesc_clear(&got);
    free(json);
    kvt__segdesc_clear(&bin);
    for (uint32_t i = 0; i < d.ntl; i++)
        free(d.tl[i].body);
#endif
}

KVT_TEST(segment_key)
{
    char buf[64];

    CHECK_OK(kvt__meta_segment_key("10.0.0.1:15000", buf, sizeof(buf)));
    CHECK(strcmp(buf, "kvt/v1/segment/10.0.0.1:15000") == 0);
    CHECK_ST(kvt__meta_segment_key("", buf, sizeof(buf)),
             KVT_ERR_INVALID_PARAM);
    CHECK_ST(kvt__meta_segment_key("0123456789012345678901234567890123456789"
                                   "0123456789",
                                   buf, sizeof(buf)),
             KVT_ERR_OVERFLOW);
}

KVT_TEST(built)
{
    const char *b = kvt__meta_backends_built();

    CHECK(strncmp(b, "p2p", 3) == 0);
#ifdef KVT_WITH_REDIS
    CHECK(strstr(b, "redis") != NULL);
#endif
#if defined(KVT_WITH_HTTP_SERVER) && defined(KVT_WITH_JSON)
    CHECK(kvt__meta_server_built());
#endif
}

struct drops {
    int fds[16];
    int n;
};

static void record_drop(void *arg, int fd)
{
    struct drops *d = arg;
    if (d->n < 16)
        d->fds[d->n] = fd;
    d->n++;
}

/* The connection policy: the cap evicts the oldest idle connection (or
 * the new one when none is idle), deadlines per stage. */
KVT_TEST(conns)
{
    struct drops d = {{0}, 0};
    kvt__conns_t *t;
    kvt__conn_t *c[8];

    CHECK_OK(kvt__conns_create(3, 100, 200, record_drop, &d, &t));
    c[1] = kvt__conns_add(t, 11, 0);
    c[2] = kvt__conns_add(t, 12, 1);
    c[3] = kvt__conns_add(t, 13, 2);
    CHECK(c[1] && c[2] && c[3] && d.n == 0 && kvt__conns_count(t) == 3);
    c[4] = kvt__conns_add(t, 14, 3);
    CHECK(d.n == 1 && d.fds[0] == 11 && kvt__conns_count(t) == 3);
    kvt__conns_stage(t, c[2], KVT__CONN_BODY, 5);
    c[5] = kvt__conns_add(t, 15, 6); /* 12 reads a body: 13 goes */
    CHECK(d.n == 2 && d.fds[1] == 13);
    CHECK(kvt__conns_dropped(t, KVT__DROP_EVICTED) == 2);
    /* A dropped connection stays dropped whatever its thread does. */
    kvt__conns_stage(t, c[1], KVT__CONN_HEADER, 7);
    CHECK(kvt__conns_count(t) == 3);
    CHECK(kvt__conns_sweep(t, 102) == 0);
    CHECK(kvt__conns_sweep(t, 104) == 1 && d.fds[2] == 14);
    CHECK(kvt__conns_dropped(t, KVT__DROP_HEADER) == 1);
    /* A kept-alive connection waits for its next header from its answer. */
    kvt__conns_stage(t, c[5], KVT__CONN_ANSWER, 50);
    kvt__conns_stage(t, c[5], KVT__CONN_HEADER, 150);
    CHECK(kvt__conns_sweep(t, 204) == 0);
    CHECK(kvt__conns_sweep(t, 205) == 1 && d.fds[3] == 12);
    CHECK(kvt__conns_dropped(t, KVT__DROP_BODY) == 1);
    CHECK(kvt__conns_sweep(t, 250) == 1 && d.fds[4] == 15);
    CHECK(kvt__conns_count(t) == 0);
    for (int i = 1; i <= 5; i++)
        kvt__conns_remove(t, c[i]);
    kvt__conns_destroy(t);

    /* Every other connection busy: the new one goes. */
    d.n = 0;
    CHECK_OK(kvt__conns_create(1, 100, 100, record_drop, &d, &t));
    c[0] = kvt__conns_add(t, 20, 0);
    kvt__conns_stage(t, c[0], KVT__CONN_ANSWER, 0);
    c[1] = kvt__conns_add(t, 21, 1);
    CHECK(d.n == 1 && d.fds[0] == 21 && kvt__conns_count(t) == 1);
    CHECK(kvt__conns_sweep(t, 1000) == 0); /* answers: not ours to time */
    kvt__conns_remove(t, c[1]);
    kvt__conns_destroy(t); /* frees c[0] too */
    kvt__conns_destroy(NULL);
}

/* Heap bytes in use, as glibc's allocator counts them (chunk sizes,
 * headers included; mmap'd chunks too). */
static size_t heap_used(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/*
 * The store's real memory stays within 1.2 x the bytes it charges against
 * --max-bytes, for values from 1 byte to 256 KiB under 40-byte keys
 * (Mooncake's key shape): the heap grown by storing N entries, divided by
 * what the store reports. Skipped under sanitizers, whose allocators
 * mallinfo2() does not see.
 */
KVT_TEST(store_memory)
{
    static const size_t vlens[] = {0, 1, 16, 110, 1000, 4096, 65536, 262144};
    char key[64];
    char *val = calloc(1, 262144);
    double worst = 0;

    CHECK(val != NULL);
    if (getenv("KVT_SANITIZED") != NULL)
        SKIP("the sanitizer's allocator is not glibc's");
    for (size_t i = 0; i < sizeof(vlens) / sizeof(vlens[0]); i++) {
        size_t n = vlens[i] >= 65536 ? 200 : 20000, before, used, charged;
        kvt__kvstore_t *s;

        CHECK_OK(kvt__kvstore_create((size_t)1 << 40, &s));
        malloc_trim(0);
        before = heap_used();
        for (size_t k = 0; k < n; k++) {
            int kl = snprintf(key, sizeof(key),
                              "mooncake/ram/10.0.0.1:%05zu/segment-xx", k);
            CHECK_OK(kvt__kvstore_put(s, key, (size_t)kl, val, vlens[i], 0, 0,
                                      0, 0, NULL));
        }
        used = heap_used() - before;
        charged = kvt__kvstore_bytes(s);
        printf("store_memory: %zu x %zu-byte values: heap %zu, charged %zu, "
               "ratio %.3f\n",
               n, vlens[i], used, charged, (double)used / (double)charged);
        if ((double)used > worst * (double)charged)
            worst = (double)used / (double)charged;
        kvt__kvstore_destroy(s);
    }
    free(val);
    CHECK(worst <= 1.2);
}

KVT_TEST_MAIN(KVT_CASE(built, 10), KVT_CASE(uri, 10), KVT_CASE(http_target, 10),
              KVT_CASE(base64, 10), KVT_CASE(store, 30),
              KVT_CASE(bootstrap, 10), KVT_CASE(segdesc_json, 10),
              KVT_CASE(segdesc_json_transports, 10),
              KVT_CASE(segment_key, 10), KVT_CASE(store_memory, 60),
              KVT_CASE(conns, 10))
