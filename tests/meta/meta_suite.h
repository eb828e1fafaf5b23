/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_META_SUITE_H
#define KVT_TESTS_META_SUITE_H

/*
 * The backend suite: the same checks for every metadata backend, run by
 * test_meta_http.c, test_meta_redis.c and test_meta_etcd.c against a real
 * server that each starts on loopback.
 */
#include <pthread.h>

#include "meta/meta.h"
#include "meta_test.h"

static inline kvt__meta_t *ms_open(const char *uri, uint32_t ttl_s)
{
    kvt__meta_params_t p = {0};
    kvt__meta_t *m = NULL;

    p.field_mask = KVT__META_PARAM_TIMEOUT | KVT__META_PARAM_TTL;
    p.timeout_ms = 2000;
    p.ttl_s = ttl_s;
    CHECK_OK(kvt__meta_create(uri, &p, &m));
    CHECK(m != NULL);
    return m;
}

static inline void ms_expect(kvt__meta_t *m, const char *key, const void *val,
                             size_t len)
{
    uint8_t *v = NULL;
    size_t n = 0;

    CHECK_OK(kvt__meta_get(m, key, &v, &n));
    CHECK(n == len);
    CHECK(memcmp(v, val, len) == 0);
    CHECK(v[n] == '\0');
    free(v);
}

static inline void ms_expect_missing(kvt__meta_t *m, const char *key)
{
    uint8_t *v = NULL;
    size_t n = 0;

    CHECK_ST(kvt__meta_get(m, key, &v, &n), KVT_ERR_NOT_FOUND);
    CHECK(v == NULL);
}

/* Put, get byte for byte, overwrite, delete, list, limits. */
static inline void ms_roundtrip(const char *uri)
{
    kvt__meta_t *m = ms_open(uri, 10);
    static const uint8_t bin[] = {0, 1, 2, 0xff, 0, '{', '"', '\n', 0};
    char key[KVT_META_KEY_MAX + 2];
    size_t big_len = 1u << 20;
    uint8_t *big = malloc(big_len);
    char **keys;
    size_t n;

    CHECK(big != NULL);
    for (size_t i = 0; i < big_len; i++)
        big[i] = (uint8_t)(i * 7 + 3);
    ms_expect_missing(m, "kvt/test/none");
    CHECK_OK(kvt__meta_put(m, "kvt/test/a", "hello", 5));
    ms_expect(m, "kvt/test/a", "hello", 5);
    CHECK_OK(kvt__meta_put(m, "kvt/test/a", "bye", 3));
    ms_expect(m, "kvt/test/a", "bye", 3);
    CHECK_OK(kvt__meta_put(m, "kvt/test/bin", bin, sizeof(bin)));
    ms_expect(m, "kvt/test/bin", bin, sizeof(bin));
    CHECK_OK(kvt__meta_put(m, "kvt/test/empty", "", 0));
    ms_expect(m, "kvt/test/empty", "", 0);
    CHECK_OK(kvt__meta_put(m, "kvt/test/big", big, big_len));
    ms_expect(m, "kvt/test/big", big, big_len);
    /* Keys with characters that need escaping in URLs and globs. */
    CHECK_OK(kvt__meta_put(m, "kvt/test/odd key?&=%+*[]\\#", "x", 1));
    ms_expect(m, "kvt/test/odd key?&=%+*[]\\#", "x", 1);
    CHECK_OK(kvt__meta_put(m, "mooncake/ram/127.0.0.1:1234", "{}", 2));
    ms_expect(m, "mooncake/ram/127.0.0.1:1234", "{}", 2);

    memset(key, 'k', KVT_META_KEY_MAX);
    key[KVT_META_KEY_MAX] = '\0';
    CHECK_OK(kvt__meta_put(m, key, "long", 4));
    ms_expect(m, key, "long", 4);
    CHECK_OK(kvt__meta_del(m, key));
    key[KVT_META_KEY_MAX] = 'k';
    key[KVT_META_KEY_MAX + 1] = '\0';
    CHECK_ST(kvt__meta_put(m, key, "x", 1), KVT_ERR_INVALID_PARAM);
    CHECK_ST(kvt__meta_put(m, "", "x", 1), KVT_ERR_INVALID_PARAM);
    CHECK_ST(kvt__meta_put(m, "kvt/test/huge", big, KVT_META_VALUE_MAX + 1),
             KVT_ERR_OVERFLOW);

    CHECK_OK(kvt__meta_list(m, "kvt/test/", &keys, &n));
    CHECK(n == 5);
    CHECK(strcmp(keys[0], "kvt/test/a") == 0);
    CHECK(strcmp(keys[1], "kvt/test/big") == 0);
    CHECK(strcmp(keys[2], "kvt/test/bin") == 0);
    CHECK(strcmp(keys[3], "kvt/test/empty") == 0);
    CHECK(strcmp(keys[4], "kvt/test/odd key?&=%+*[]\\#") == 0);
    kvt__meta_list_free(keys, n);
    CHECK_OK(kvt__meta_list(m, "kvt/test/odd key?&=%+*[", &keys, &n));
    CHECK(n == 1);
    kvt__meta_list_free(keys, n);
    CHECK_OK(kvt__meta_list(m, "kvt/nothing/", &keys, &n));
    CHECK(n == 0);
    kvt__meta_list_free(keys, n);

    CHECK_OK(kvt__meta_del(m, "kvt/test/a"));
    ms_expect_missing(m, "kvt/test/a");
    CHECK_ST(kvt__meta_del(m, "kvt/test/a"), KVT_ERR_NOT_FOUND);
    ms_expect(m, "kvt/test/bin", bin, sizeof(bin));
    free(big);
    kvt__meta_destroy(m);
}

/* Descriptors through the backend, and what lookups refuse. */
static inline void ms_segdesc(const char *uri)
{
    kvt__meta_t *m = ms_open(uri, 10);
    kvt_remote_region_t regs[2] = {
        {0x7f0000001000ull, 4096, KVT_ACCESS_REMOTE_RW, KVT_MEM_HOST, -1, 0},
        {0x7f0000100000ull, 1 << 20, KVT_ACCESS_REMOTE_WRITE, KVT_MEM_HOST, -1,
         0},
    };
    kvt__segdesc_t d = {0}, got;
    char key[256];

    strcpy(d.name, "10.1.2.3:15000");
    strcpy(d.host, "10.1.2.3");
    d.port = 15000;
    d.transports = KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM;
    d.host_id = 0x0123456789abcdefull;
    d.pid = 4242;
    d.nregions = 2;
    d.regions = regs;
    CHECK_OK(kvt__meta_publish_segdesc(m, &d));
    CHECK_OK(kvt__meta_lookup_segdesc(m, "10.1.2.3:15000", &got));
    CHECK(strcmp(got.name, d.name) == 0 && strcmp(got.host, d.host) == 0);
    CHECK(got.port == 15000 && got.pid == 4242);
    CHECK(got.host_id == d.host_id && got.transports == d.transports);
    CHECK(got.nregions == 2);
    CHECK(memcmp(got.regions, regs, sizeof(regs)) == 0);
    kvt__segdesc_clear(&got);

    CHECK_ST(kvt__meta_lookup_segdesc(m, "10.9.9.9:1", &got),
             KVT_ERR_NOT_FOUND);
    CHECK_OK(kvt__meta_segment_key("bad:1", key, sizeof(key)));
    CHECK_OK(kvt__meta_put(m, key, "{not json", 9));
    CHECK_ST(kvt__meta_lookup_segdesc(m, "bad:1", &got), KVT_ERR_PROTOCOL);
    CHECK(got.regions == NULL && got.nregions == 0);
    /* A valid descriptor stored under another segment's name. */
    {
        char *json;
        size_t len;
        CHECK_OK(kvt__segdesc_to_json(&d, &json, &len));
        CHECK_OK(kvt__meta_segment_key("other:2", key, sizeof(key)));
        CHECK_OK(kvt__meta_put(m, key, json, len));
        CHECK_ST(kvt__meta_lookup_segdesc(m, "other:2", &got),
                 KVT_ERR_PROTOCOL);
        free(json);
    }
    kvt__meta_destroy(m);
    /* destroy() withdrew what the handle published. */
    m = ms_open(uri, 10);
    CHECK_ST(kvt__meta_lookup_segdesc(m, "10.1.2.3:15000", &got),
             KVT_ERR_NOT_FOUND);
    kvt__meta_destroy(m);
}

/* Skips the case when ucx is not built in. */
static inline void ms_need_ucx(void)
{
    kvt_transport_info_t t[32];
    size_t n = 0;

    CHECK_OK(kvt_transports(t, 32, &n));
    for (size_t i = 0; i < n && i < 32; i++)
        if (t[i].id == KVT_TRANSPORT_UCX)
            return;
    SKIP("ucx is not built in");
}

/* An engine serving ucx alone publishes a descriptor whose transport list
 * names ucx, and peers that look it up read it back. */
static inline void ms_engine_ucx(const char *uri)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;
    kvt__meta_t *m;
    kvt__segdesc_t got;
    char key[KVT_META_KEY_MAX + 1];
    uint8_t *json = NULL;
    size_t len = 0;
    kvt_status_t st;

    p.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_METADATA_URI;
    p.transports = KVT_TRANSPORT_UCX;
    p.metadata_uri = uri;
    st = kvt_engine_create(&p, &e);
    if (st == KVT_ERR_NOT_SUPPORTED)
        SKIP("ucx cannot start on this machine");
    CHECK_OK(st);
    m = ms_open(uri, 10);
    CHECK_OK(kvt__meta_segment_key(kvt_engine_segment_name(e), key,
                                   sizeof(key)));
    CHECK_OK(kvt__meta_get(m, key, &json, &len));
    CHECK(strstr((char *)json, "\"transports\":[{\"name\":\"ucx\"}]") != NULL);
    free(json);
    CHECK_OK(kvt__meta_lookup_segdesc(m, kvt_engine_segment_name(e), &got));
    CHECK(got.transports == KVT_TRANSPORT_UCX);
    kvt__segdesc_clear(&got);
    kvt__meta_destroy(m);
    kvt_engine_destroy(e);
}

/*
 * Refresh re-creates a published key that vanished; @vanish makes it
 * vanish the way this backend loses keys (delete, lost lease).
 */
static inline void
ms_refresh(const char *uri, void (*vanish)(kvt__meta_t *other, const char *key))
{
    kvt__meta_t *m = ms_open(uri, 10), *other = ms_open(uri, 10);

    CHECK_OK(kvt__meta_refresh(m)); /* nothing owned yet */
    CHECK_OK(kvt__meta_publish(m, "kvt/test/pub", "v1", 2));
    ms_expect(other, "kvt/test/pub", "v1", 2);
    CHECK_OK(kvt__meta_publish(m, "kvt/test/pub", "v2", 2));
    ms_expect(other, "kvt/test/pub", "v2", 2);
    CHECK_OK(kvt__meta_refresh(m));
    ms_expect(other, "kvt/test/pub", "v2", 2);
    vanish(other, "kvt/test/pub");
    ms_expect_missing(other, "kvt/test/pub");
    CHECK_OK(kvt__meta_refresh(m));
    ms_expect(other, "kvt/test/pub", "v2", 2);
    /* Deleting an owned key stops its refresh. */
    CHECK_OK(kvt__meta_del(m, "kvt/test/pub"));
    CHECK_OK(kvt__meta_refresh(m));
    ms_expect_missing(other, "kvt/test/pub");
    CHECK_ST(kvt__meta_heartbeat_start(NULL), KVT_ERR_INVALID_PARAM);
    kvt__meta_destroy(other);
    kvt__meta_destroy(m);
}

/*
 * The liveness rule: a published key lives while its owner heartbeats
 * (several TTLs), and disappears within ttl + @slack_ms of the owner's
 * death (SIGKILL: no goodbye).
 */
static inline void ms_liveness(const char *uri, uint32_t ttl_s, int slack_ms)
{
    int pfd[2];
    pid_t owner;
    char c;
    kvt__meta_t *m;
    double t_kill, t_gone = 0;

    CHECK(pipe(pfd) == 0);
    owner = fork();
    CHECK(owner >= 0);
    if (owner == 0) {
        kvt__meta_t *mine = ms_open(uri, ttl_s);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        CHECK_OK(kvt__meta_publish(mine, "kvt/test/live", "alive", 5));
        CHECK_OK(kvt__meta_heartbeat_start(mine));
        CHECK_ST(kvt__meta_heartbeat_start(mine), KVT_ERR_EXISTS);
        CHECK(write(pfd[1], "r", 1) == 1);
        for (;;)
            pause();
    }
    close(pfd[1]);
    CHECK(read(pfd[0], &c, 1) == 1);
    close(pfd[0]);
    m = ms_open(uri, ttl_s);
    /* Alive for 2.5 TTLs thanks to the heartbeat alone. */
    for (int i = 0; i < (int)(ttl_s * 25); i++) {
        ms_expect(m, "kvt/test/live", "alive", 5);
        usleep(100000);
    }
    t_kill = kvt_test_now();
    kill(owner, SIGKILL);
    waitpid(owner, NULL, 0);
    for (;;) {
        uint8_t *v;
        size_t n;
        kvt_status_t st = kvt__meta_get(m, "kvt/test/live", &v, &n);
        if (st == KVT_ERR_NOT_FOUND) {
            t_gone = kvt_test_now();
            break;
        }
        CHECK_OK(st);
        free(v);
        CHECK(kvt_test_now() - t_kill < ttl_s + slack_ms / 1000.0 + 5);
        usleep(50000);
    }
    fprintf(stderr, "liveness: gone %.2f s after the owner died (ttl %u s)\n",
            t_gone - t_kill, ttl_s);
    CHECK(t_gone - t_kill <= ttl_s + slack_ms / 1000.0);
    /* Not served again afterwards. */
    for (int i = 0; i < 10; i++) {
        ms_expect_missing(m, "kvt/test/live");
        usleep(50000);
    }
    kvt__meta_destroy(m);
}

struct ms_thread_arg {
    kvt__meta_t *m;
    int id;
};

static void *ms_thread_main(void *arg)
{
    struct ms_thread_arg *a = arg;
    char key[64], val[64];

    for (int i = 0; i < 50; i++) {
        int n = snprintf(val, sizeof(val), "%d-%d", a->id, i);
        snprintf(key, sizeof(key), "kvt/test/t%d", a->id);
        CHECK_OK(kvt__meta_put(a->m, key, val, (size_t)n));
        ms_expect(a->m, key, val, (size_t)n);
        if (i % 10 == 0)
            CHECK_OK(kvt__meta_refresh(a->m));
    }
    return NULL;
}

/* One handle shared by threads, with a heartbeat thread running. */
static inline void ms_threads(const char *uri)
{
    kvt__meta_t *m = ms_open(uri, 3);
    pthread_t t[4];
    struct ms_thread_arg a[4];

    CHECK_OK(kvt__meta_publish(m, "kvt/test/hb", "x", 1));
    CHECK_OK(kvt__meta_heartbeat_start(m));
    for (int i = 0; i < 4; i++) {
        a[i].m = m;
        a[i].id = i;
        CHECK(pthread_create(&t[i], NULL, ms_thread_main, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    kvt__meta_destroy(m);
}

/* Nothing listens: every call fails within the timeout, cleanly. */
static inline void ms_unreachable(const char *uri)
{
    kvt__meta_t *m = ms_open(uri, 10);
    double t0 = kvt_test_now();
    uint8_t *v;
    size_t n;
    kvt_status_t st;

    st = kvt__meta_put(m, "kvt/test/x", "x", 1);
    CHECK(st == KVT_ERR_UNREACHABLE || st == KVT_ERR_TIMEDOUT);
    st = kvt__meta_get(m, "kvt/test/x", &v, &n);
    CHECK(st == KVT_ERR_UNREACHABLE || st == KVT_ERR_TIMEDOUT);
    st = kvt__meta_publish(m, "kvt/test/x", "x", 1);
    CHECK(st == KVT_ERR_UNREACHABLE || st == KVT_ERR_TIMEDOUT);
    CHECK(kvt_test_now() - t0 < 3 * 2.5 * kvt_test_slowdown());
    kvt__meta_destroy(m);
}

#endif
