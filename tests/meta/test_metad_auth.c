/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvt metad` with an auth token (docs/security.md): writes of keys and
 * /route entries need an Authorization: KVT-HMAC proof and change nothing
 * without it; reads stay open unless auth_reads; kvt's own http backend
 * and bootstrap client sign their requests when they hold the token.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#include "meta/meta.h"
#include "meta/metad.h"
#include "meta_test.h"
#include "util/auth.h"

#define TOKEN "metad-secret"

static kvt__metad_t *server;
static uint16_t port;

static void start(const char *token, int auth_reads)
{
    kvt__metad_params_t p = {0};

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    p.field_mask = KVT__METAD_PARAM_AUTH;
    CHECK_OK(kvt__auth_init(&p.auth, token));
    p.auth_reads = auth_reads;
    CHECK_OK(kvt__metad_start("127.0.0.1", 0, &p, &server));
    port = kvt__metad_port(server);
}

/* A request signed with @token (NULL: unsigned) at @t (0: now). */
static int req(const char *token, time_t t, const char *method,
               const char *target, const char *body, mt_resp_t *r)
{
    char hdr[32 + KVT_AUTH_HTTP_HDR_MAX];
    kvt__auth_t a;
    int code;

    hdr[0] = '\0';
    if (token != NULL) {
        CHECK_OK(kvt__auth_init(&a, token));
        memcpy(hdr, "Authorization: ", 15);
        kvt__auth_http_sign(&a, method, target, strlen(target), body,
                            body ? strlen(body) : 0, t ? t : time(NULL),
                            hdr + 15);
        strcat(hdr, "\r\n");
    }
    code = mt_http(port, method, target, hdr, body, body ? strlen(body) : 0, r);
    return code;
}

static int code_of(const char *token, time_t t, const char *method,
                   const char *target, const char *body)
{
    mt_resp_t r;
    int code = req(token, t, method, target, body, &r);
    mt_resp_free(&r);
    return code;
}

static const char *route_body =
    "{\"role\":\"Prefill\",\"rank_ip\":\"10.0.0.1\",\"rank_port\":9000,"
    "\"engine_rank\":0,\"dp_size\":1,\"tp_size\":1}";

/* Unsigned, wrongly signed, stale, or signed for another body or target:
 * 401 and the store unchanged; signed: done. Reads stay open. */
KVT_TEST(writes_need_proof)
{
    const char *k = "/metadata?key=mooncake/ram/a";
    mt_resp_t r;

    start(TOKEN, 0);
    CHECK(code_of(NULL, 0, "PUT", k, "evil") == 401);
    CHECK(code_of("wrong", 0, "PUT", k, "evil") == 401);
    CHECK(code_of(TOKEN, time(NULL) - 3600, "PUT", k, "evil") == 401);
    CHECK(code_of(NULL, 0, "GET", k, NULL) == 404);
    CHECK(code_of(TOKEN, 0, "PUT", k, "good") == 200);
    CHECK(req(NULL, 0, "GET", k, NULL, &r) == 200);
    CHECK(strcmp(r.body, "good") == 0);
    mt_resp_free(&r);
    /* A proof is good for its own method, target and body only. */
    {
        char hdr[32 + KVT_AUTH_HTTP_HDR_MAX];
        kvt__auth_t a;
        CHECK_OK(kvt__auth_init(&a, TOKEN));
        memcpy(hdr, "Authorization: ", 15);
        kvt__auth_http_sign(&a, "PUT", k, strlen(k), "good", 4, time(NULL),
                            hdr + 15);
        strcat(hdr, "\r\n");
        CHECK(mt_http(port, "PUT", k, hdr, "evil", 4, &r) == 401);
        mt_resp_free(&r);
        CHECK(mt_http(port, "PUT", "/metadata?key=other", hdr, "good", 4, &r) ==
              401);
        mt_resp_free(&r);
        CHECK(mt_http(port, "DELETE", k, hdr, NULL, 0, &r) == 401);
        CHECK(strstr(r.body, "authentication failed") != NULL);
        mt_resp_free(&r);
    }
    CHECK(code_of(NULL, 0, "DELETE", k, NULL) == 401);
    CHECK(req(NULL, 0, "GET", k, NULL, &r) == 200);
    CHECK(strcmp(r.body, "good") == 0);
    mt_resp_free(&r);
    CHECK(code_of(NULL, 0, "GET", "/metadata?key=other", NULL) == 404);
    /* /route: refused unsigned (nothing registered), taken signed. */
    CHECK(code_of(NULL, 0, "PUT", "/route", route_body) == 401);
    CHECK(code_of(NULL, 0, "GET", "/route?engine_rank=0&target_dp_group=0",
                  NULL) == 404);
    CHECK(code_of(TOKEN, 0, "PUT", "/route", route_body) == 200);
    CHECK(code_of(NULL, 0, "DELETE", "/route?engine_rank=0&target_dp_group=0",
                  NULL) == 401);
    CHECK(req(NULL, 0, "GET", "/topology", NULL, &r) == 200);
    CHECK(strstr(r.body, "10.0.0.1") != NULL);
    mt_resp_free(&r);
    CHECK(code_of(TOKEN, 0, "DELETE", k, NULL) == 200);
    CHECK(code_of(NULL, 0, "GET", k, NULL) == 404);
    kvt__metad_stop(server);
}

KVT_TEST(auth_reads)
{
    const char *k = "/metadata?key=x";

    start(TOKEN, 1);
    CHECK(code_of(TOKEN, 0, "PUT", k, "v") == 200);
    CHECK(code_of(NULL, 0, "GET", k, NULL) == 401);
    CHECK(code_of("wrong", 0, "GET", "/metadata/keys", NULL) == 401);
    CHECK(code_of(TOKEN, 0, "GET", k, NULL) == 200);
    CHECK(code_of(TOKEN, 0, "GET", "/metadata/keys", NULL) == 200);
    kvt__metad_stop(server);
}

/* Without a token everything stays open, signed or not. */
KVT_TEST(no_token_open)
{
    start(NULL, 1);
    CHECK(code_of(NULL, 0, "PUT", "/metadata?key=x", "v") == 200);
    CHECK(code_of("any", 0, "PUT", "/metadata?key=x", "w") == 200);
    CHECK(code_of(NULL, 0, "GET", "/metadata?key=x", NULL) == 200);
    kvt__metad_stop(server);
}

/* kvt's http backend signs with its token: the right one stores, another
 * or none is refused with KVT_ERR_AUTH and stores nothing. The
 * bootstrap client signs with KVT_AUTH_TOKEN. */
KVT_TEST(clients_sign)
{
    kvt__meta_params_t mp = {0};
    char uri[64], why[256];
    kvt__meta_t *m;
    uint8_t *v;
    size_t n;
    kvt_bootc_h bc;
    kvt_status_t st;

#if !defined(KVT_WITH_CURL)
    SKIP("built without libcurl");
#endif
    start(TOKEN, 0);
    snprintf(uri, sizeof(uri), "http://127.0.0.1:%u/metadata", port);
    mp.field_mask = KVT__META_PARAM_AUTH;
    CHECK_OK(kvt__auth_init(&mp.auth, "wrong"));
    CHECK_OK(kvt__meta_create(uri, &mp, &m));
    CHECK_ST(kvt__meta_put(m, "k", "bad", 3), KVT_ERR_AUTH);
    kvt__meta_destroy(m);
    CHECK_OK(kvt__auth_init(&mp.auth, NULL));
    CHECK_OK(kvt__meta_create(uri, &mp, &m));
    CHECK_ST(kvt__meta_put(m, "k", "bad", 3), KVT_ERR_AUTH);
    CHECK_ST(kvt__meta_get(m, "k", &v, &n), KVT_ERR_NOT_FOUND);
    kvt__meta_destroy(m);
    CHECK_OK(kvt__auth_init(&mp.auth, TOKEN));
    CHECK_OK(kvt__meta_create(uri, &mp, &m));
    CHECK_OK(kvt__meta_put(m, "k/with space&odd=chars", "good", 4));
    CHECK_OK(kvt__meta_get(m, "k/with space&odd=chars", &v, &n));
    CHECK(n == 4 && memcmp(v, "good", 4) == 0);
    free(v);
    CHECK_OK(kvt__meta_del(m, "k/with space&odd=chars"));
    kvt__meta_destroy(m);

    snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
    CHECK(unsetenv(KVT_AUTH_ENV) == 0);
    CHECK_OK(kvt_bootc_create(&bc));
    st = kvt_bootc_register(bc, uri, "10.0.0.2", 9000, 1, 1, 0, 0, 3000, why,
                            sizeof(why));
    CHECK_ST(st, KVT_ERR_AUTH);
    CHECK(strstr(why, "KVT_AUTH_TOKEN") != NULL);
    kvt_bootc_destroy(bc);
    CHECK(setenv(KVT_AUTH_ENV, TOKEN, 1) == 0);
    CHECK_OK(kvt_bootc_create(&bc));
    CHECK(unsetenv(KVT_AUTH_ENV) == 0);
    CHECK_OK(kvt_bootc_register(bc, uri, "10.0.0.2", 9000, 1, 1, 0, 0, 3000,
                                why, sizeof(why)));
    kvt_bootc_destroy(bc);
    kvt__metad_stop(server);
}

/* kvt metad --auth-token, and KVT_AUTH_TOKEN, with --auth-reads. */
KVT_TEST(command)
{
    const char *bin = getenv("KVT_BIN");
    char portarg[16];
    char *with_flag[] = {(char *)bin,    "metad",  "--host",
                         "127.0.0.1",    "--port", portarg,
                         "--auth-token", TOKEN,    NULL};
    char *with_env[] = {(char *)bin, "metad", "--host",       "127.0.0.1",
                        "--port",    portarg, "--auth-reads", NULL};

#if !defined(KVT_WITH_HTTP_SERVER) || !defined(KVT_WITH_JSON)
    SKIP("built without libmicrohttpd or json-c");
#endif
    if (bin == NULL || !mt_have(bin))
        SKIP("KVT_BIN does not name the kvt binary");
    for (int i = 0; i < 2; i++) {
        int status;
        pid_t pid;

        port = mt_free_port();
        snprintf(portarg, sizeof(portarg), "%u", port);
        if (i == 1)
            CHECK(setenv(KVT_AUTH_ENV, TOKEN, 1) == 0);
        pid = mt_spawn(i == 0 ? with_flag : with_env, NULL);
        CHECK(unsetenv(KVT_AUTH_ENV) == 0);
        CHECK(mt_wait_port(port, pid, 10000) == 0);
        CHECK(code_of(NULL, 0, "PUT", "/metadata?key=c", "1") == 401);
        CHECK(code_of(TOKEN, 0, "PUT", "/metadata?key=c", "1") == 200);
        CHECK(code_of(NULL, 0, "GET", "/metadata?key=c", NULL) ==
              (i == 0 ? 200 : 401));
        CHECK(code_of(TOKEN, 0, "GET", "/metadata?key=c", NULL) == 200);
        kill(pid, SIGTERM);
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

KVT_TEST_MAIN(KVT_CASE(writes_need_proof, 30), KVT_CASE(auth_reads, 30),
              KVT_CASE(no_token_open, 30), KVT_CASE(clients_sign, 30),
              KVT_CASE(command, 60))
