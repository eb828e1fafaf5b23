/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The log: levels from KVT_LOG, a handler the application may install,
 * rate limits, and escaping of strings from the network.
 */
#include "util/log.h"

#include <kvt/log.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int kvt__log_level_cur = KVT_LOG_WARN;
__thread kvt__log_capture_t *kvt__log_cap;

void kvt__log_capture(kvt__log_capture_t *c)
{
    if (c != NULL) {
        if (c->cap > 0)
            c->buf[0] = '\0';
        c->level = -1;
    }
    kvt__log_cap = c;
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/* The application's handler, if any. Readers hold the lock across the
 * call, so kvt_log_set_handler() returns only once no thread is inside
 * the handler it replaces. The lock prefers the writer: with readers
 * preferred (glibc's default), threads that log without pause would keep
 * kvt_log_set_handler() waiting for ever. Logging is never on a hot
 * path, and a handler never logs (its contract), so no thread takes the
 * lock twice. */
static pthread_rwlock_t handler_lock =
    PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static kvt_log_handler_cb_t handler_cb;
static void *handler_arg;
static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG",
                                          "TRACE"};

static void log_read_env(void)
{
    const char *env = getenv("KVT_LOG");
    if (env == NULL)
        return;
    for (int i = 0; i <= KVT_LOG_TRACE; i++) {
        if (strcasecmp(env, level_names[i]) == 0) {
            kvt__log_level_cur = i;
            return;
        }
    }
    if (strcasecmp(env, "off") == 0 || strcasecmp(env, "none") == 0)
        kvt__log_level_cur = -1;
}

void kvt__log_init(void)
{
    pthread_once(&log_once, log_read_env);
}

void kvt__log_emit(kvt__log_level_t level, const char *file, int line,
                   const char *fmt, ...)
{
    char msg[2048];
    struct timespec ts;
    const char *base = strrchr(file, '/');
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (kvt__log_cap != NULL && (int)level <= KVT_LOG_WARN) {
        kvt__log_capture_t *c = kvt__log_cap;
        if (c->cap > 0 && (c->level < 0 || (int)level < c->level)) {
            snprintf(c->buf, c->cap, "%s", msg);
            c->level = (int)level;
        }
        return;
    }
    pthread_rwlock_rdlock(&handler_lock);
    if (handler_cb != NULL) {
        handler_cb(handler_arg, (kvt_log_level_t)level, base ? base + 1 : file,
                   line, msg);
        pthread_rwlock_unlock(&handler_lock);
        return;
    }
    pthread_rwlock_unlock(&handler_lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "[%ld.%06ld] kvt %-5s %d %s:%d %s\n", (long)ts.tv_sec,
            ts.tv_nsec / 1000, level_names[level], (int)getpid(),
            base ? base + 1 : file, line, msg);
}

void kvt__log_emit_rl(kvt__log_rl_t *rl, kvt__log_level_t level,
                      const char *file, int line, const char *fmt, ...)
{
    struct timespec ts;
    uint64_t now, next, sup;
    char msg[2048];
    va_list ap;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    next = atomic_load_explicit(&rl->next_ns, memory_order_relaxed);
    if (now < next || !atomic_compare_exchange_strong_explicit(
                          &rl->next_ns, &next, now + 1000000000ull,
                          memory_order_relaxed, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
        return;
    }
    sup = atomic_exchange_explicit(&rl->suppressed, 0, memory_order_relaxed);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (sup != 0)
        kvt__log_emit(level, file, line, "%s (%llu more like it suppressed)",
                      msg, (unsigned long long)sup);
    else
        kvt__log_emit(level, file, line, "%s", msg);
}

char *kvt__log_escape(char *dst, size_t cap, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (; *src != '\0'; src++) {
        unsigned char ch = (unsigned char)*src;
        if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '"') {
            if (o + 1 >= cap)
                break;
            dst[o++] = (char)ch;
        } else {
            if (o + 4 >= cap)
                break;
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[ch >> 4];
            dst[o++] = hex[ch & 15];
        }
    }
    dst[o] = '\0';
    return dst;
}

/* ---- The public calls (kvt/log.h) ---------------------------------------- */

int kvt_log_enabled(kvt_log_level_t level)
{
    kvt__log_init();
    return (int)level >= 0 && (int)level <= KVT_LOG_TRACE &&
           (int)level <= kvt__log_level_cur;
}

void kvt_log_printf(kvt_log_level_t level, const char *file, int line,
                    const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (!kvt_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvt__log_emit((kvt__log_level_t)level, file ? file : "?", line, "%s", msg);
}

void kvt_log_set_handler(kvt_log_handler_cb_t cb, void *arg)
{
    pthread_rwlock_wrlock(&handler_lock);
    handler_cb = cb;
    handler_arg = cb != NULL ? arg : NULL;
    pthread_rwlock_unlock(&handler_lock);
}
