/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The redis backend (hiredis). One synchronous connection per handle,
 * opened on first use and again after any connection error; every connect
 * and every command is bounded by the handle's timeout (connect timeout
 * and socket send/receive timeouts).
 *
 * Liveness: published keys are SET with EX ttl; a refresh sends EXPIRE,
 * and SET EX again when EXPIRE finds the key gone. Redis itself deletes a
 * key whose owner stopped refreshing, exactly ttl seconds after the last
 * refresh.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "meta/meta_answer.h"
#include "meta/meta_int.h"
#include "util/log.h"
#include "util/time.h"

typedef struct {
    redisContext *ctx;
    kvt__redis_bound_t bound; /* the bounds on ctx's reader */
} redis_be_t;

static struct timeval to_tv(uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000u),
                         (suseconds_t)(ms % 1000u) * 1000};
    return tv;
}

/* A failed context's status; logs it. @err is errno right after the
 * failure. A reply the reader refused (kvt__redis_reader_bound()) is
 * KVT_ERR_PROTOCOL, whichever command it answered. */
static kvt_status_t ctx_status(kvt__meta_t *m, redisContext *c, int err,
                               const char *doing)
{
    const kvt__redis_bound_t *bound =
        c != NULL && c->reader != NULL ? c->reader->privdata : NULL;
    kvt_status_t st = KVT_ERR_IO;

    if (bound != NULL && bound->refused != 0)
        st = KVT_ERR_PROTOCOL; /* an answer beyond the reader's bounds */
    else if (err == ETIMEDOUT || err == EAGAIN || err == EWOULDBLOCK ||
             err == EINPROGRESS)
        st = KVT_ERR_TIMEDOUT;
    else if (err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH ||
             c == NULL || c->err == REDIS_ERR_OTHER || c->err == REDIS_ERR_EOF)
        st = KVT_ERR_UNREACHABLE;
    KVT_LOG_W("redis metadata %s:%u: %s: %s", m->uri.ep[0].host,
              m->uri.ep[0].port, doing,
              c != NULL && c->errstr[0] ? c->errstr : "no connection");
    return st;
}

static void drop(redis_be_t *b)
{
    if (b->ctx != NULL)
        redisFree(b->ctx);
    b->ctx = NULL;
}

/* Run one command that must answer "+OK"; used for AUTH and SELECT. */
static kvt_status_t expect_ok(kvt__meta_t *m, redisContext *c, const char *what,
                              redisReply *rep, int err)
{
    kvt_status_t st = KVT_OK;

    if (rep == NULL) {
        st = ctx_status(m, c, err, what);
    } else if (rep->type == REDIS_REPLY_ERROR) {
        KVT_LOG_E("redis metadata %s:%u: %s refused: %s", m->uri.ep[0].host,
                  m->uri.ep[0].port, what, rep->str);
        st = KVT_ERR_ACCESS;
    }
    if (rep != NULL)
        freeReplyObject(rep);
    return st;
}

/* Connect, authenticate and select the database, within the timeout. */
static kvt_status_t ensure(kvt__meta_t *m, redis_be_t *b)
{
    redisContext *c;
    redisReply *rep;
    kvt_status_t st;
    int err;

    if (b->ctx != NULL)
        return KVT_OK;
    c = redisConnectWithTimeout(m->uri.ep[0].host, m->uri.ep[0].port,
                                to_tv(m->timeout_ms));
    err = errno;
    if (c == NULL || c->err) {
        st = ctx_status(m, c, err, "connect");
        goto err_ctx;
    }
    st = KVT_ERR_IO;
    if (redisSetTimeout(c, to_tv(m->timeout_ms)) != REDIS_OK) {
        KVT_LOG_W("redis metadata: cannot set socket timeouts");
        goto err_ctx;
    }
    redisEnableKeepAlive(c);
    kvt__redis_reader_bound(c->reader, &b->bound);
    if (m->uri.password[0] != '\0') {
        if (m->uri.user[0] != '\0')
            rep = redisCommand(c, "AUTH %s %s", m->uri.user, m->uri.password);
        else
            rep = redisCommand(c, "AUTH %s", m->uri.password);
        st = expect_ok(m, c, "AUTH", rep, errno);
        if (st == KVT_ERR_ACCESS)
            st = KVT_ERR_AUTH; /* the password refused */
        if (st != KVT_OK)
            goto err_ctx;
    }
    if (m->uri.db != 0) {
        rep = redisCommand(c, "SELECT %u", m->uri.db);
        st = expect_ok(m, c, "SELECT", rep, errno);
        if (st != KVT_OK)
            goto err_ctx;
    }
    b->ctx = c;
    return KVT_OK;

err_ctx:
    if (c != NULL)
        redisFree(c);
    return st;
}

/*
 * Run a command (printf-style, hiredis's %b for binary), reconnecting and
 * retrying once when a kept connection turns out to be dead (server
 * restart, idle timeout). On KVT_OK *rep_p is a reply that is not an
 * error; a redis error reply is logged and gives KVT_ERR_IO.
 */
static kvt_status_t command(kvt__meta_t *m, const char *what,
                            redisReply **rep_p, const char *fmt, ...)
{
    redis_be_t *b = m->be;
    redisReply *rep = NULL;
    kvt_status_t st = KVT_OK;
    va_list ap;
    int err;

    for (int attempt = 0; attempt < 2; attempt++) {
        int reused = b->ctx != NULL;
        st = ensure(m, b);
        if (st != KVT_OK)
            break;
        b->bound.refused = 0;
        va_start(ap, fmt);
        rep = redisvCommand(b->ctx, fmt, ap);
        va_end(ap);
        err = errno;
        if (rep != NULL)
            break;
        if (reused &&
            (b->ctx->err == REDIS_ERR_EOF || b->ctx->err == REDIS_ERR_IO) &&
            err != EAGAIN && err != EWOULDBLOCK) {
            drop(b);
            continue;
        }
        st = ctx_status(m, b->ctx, err, what);
        drop(b);
        break;
    }
    if (st == KVT_OK && rep == NULL) {
        st = ctx_status(m, NULL, 0, what);
    } else if (st == KVT_OK && rep->type == REDIS_REPLY_ERROR) {
        KVT_LOG_W("redis metadata: %s: %s", what, rep->str);
        st = KVT_ERR_IO;
    }
    if (st != KVT_OK)
        goto err_rep;
    *rep_p = rep;
    return KVT_OK;

err_rep:
    if (rep != NULL)
        freeReplyObject(rep);
    return st;
}

static kvt_status_t redis_open(kvt__meta_t *m)
{
    m->be = calloc(1, sizeof(redis_be_t));
    return m->be != NULL ? KVT_OK : KVT_ERR_NO_MEMORY;
}

static void redis_close(kvt__meta_t *m)
{
    drop(m->be);
    free(m->be);
    m->be = NULL;
}

/* SET, with EX ttl when @expiring. */
static kvt_status_t redis_put(kvt__meta_t *m, const char *key, const void *val,
                              size_t len, int expiring)
{
    redisReply *rep;
    kvt_status_t st;

    if (expiring)
        st = command(m, "SET EX", &rep, "SET %b %b EX %u", key, strlen(key),
                     val, len, m->ttl_s);
    else
        st = command(m, "SET", &rep, "SET %b %b", key, strlen(key), val, len);
    if (st == KVT_OK)
        freeReplyObject(rep);
    return st;
}

/* GET: a string is the value, nil is KVT_ERR_NOT_FOUND. */
static kvt_status_t redis_get(kvt__meta_t *m, const char *key, uint8_t **val_p,
                              size_t *len_p)
{
    redisReply *rep;
    kvt_status_t st = command(m, "GET", &rep, "GET %b", key, strlen(key));

    if (st != KVT_OK)
        goto err;
    st = kvt__redis_get_reply(rep, key, val_p, len_p);
    freeReplyObject(rep);
err:
    return st;
}

static kvt_status_t redis_del(kvt__meta_t *m, const char *key)
{
    redisReply *rep;
    kvt_status_t st = command(m, "DEL", &rep, "DEL %b", key, strlen(key));

    if (st != KVT_OK)
        return st;
    if (rep->type != REDIS_REPLY_INTEGER || rep->integer == 0)
        st = KVT_ERR_NOT_FOUND;
    freeReplyObject(rep);
    return st;
}

/* SCAN with MATCH "<escaped prefix>*", until the cursor comes back to 0
 * or the handle's timeout passes as a whole. */
static kvt_status_t redis_list(kvt__meta_t *m, const char *prefix,
                               kvt__meta_keys_t *out)
{
    size_t plen = strlen(prefix), n = 0;
    char *pattern = malloc(2 * plen + 2);
    char cursor[32] = "0";
    uint64_t deadline = kvt__now_ns() + m->timeout_ms * 1000000u;
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (pattern == NULL)
        goto err;
    for (size_t i = 0; i < plen; i++) {
        if (strchr("*?[]\\", prefix[i]) != NULL)
            pattern[n++] = '\\';
        pattern[n++] = prefix[i];
    }
    pattern[n++] = '*';
    st = KVT_OK;
    do {
        redisReply *rep;
        if (kvt__now_ns() > deadline) {
            KVT_LOG_W("redis metadata: listing '%s' took longer than %llu ms",
                      prefix, (unsigned long long)m->timeout_ms);
            st = KVT_ERR_TIMEDOUT;
            break;
        }
        st = command(m, "SCAN", &rep, "SCAN %s MATCH %b COUNT 1000", cursor,
                     pattern, n);
        if (st != KVT_OK)
            break;
        st = kvt__redis_scan_reply(rep, cursor, sizeof(cursor), out);
        freeReplyObject(rep);
    } while (st == KVT_OK && strcmp(cursor, "0") != 0);
    free(pattern);
err:
    return st;
}

/* EXPIRE each owned key; SET EX again the ones that are gone. */
static kvt_status_t redis_refresh(kvt__meta_t *m)
{
    kvt_status_t first = KVT_OK;

    for (size_t i = 0; i < m->nowned; i++) {
        kvt__meta_owned_t *o = &m->owned[i];
        redisReply *rep;
        kvt_status_t st = command(m, "EXPIRE", &rep, "EXPIRE %b %u", o->key,
                                  strlen(o->key), m->ttl_s);
        if (st == KVT_OK) {
            int gone = rep->type != REDIS_REPLY_INTEGER || rep->integer == 0;
            freeReplyObject(rep);
            if (gone)
                st = redis_put(m, o->key, o->val, o->len, 1);
        }
        if (st != KVT_OK && first == KVT_OK)
            first = st;
        if (kvt__meta_is_down(st))
            break;
    }
    return first;
}

const kvt__meta_ops_t kvt__meta_redis_ops = {
    .name = "redis",
    .open = redis_open,
    .close = redis_close,
    .put = redis_put,
    .get = redis_get,
    .del = redis_del,
    .list = redis_list,
    .refresh = redis_refresh,
};
