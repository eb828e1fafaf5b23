/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_log_set_handler(): lines reach the handler with their level, file
 * and line; and once the call that replaces a handler returns, that
 * handler is never entered again, while other threads keep logging.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <kvt/log.h>

#include "kvt_test.h"

typedef struct {
    _Atomic int inside;
    _Atomic long calls;
    _Atomic int gone; /* set once replaced: no call may start after it */
    _Atomic int late;
    int record; /* one thread logs: keep what it logged */
    kvt_log_level_t level;
    char file[64], msg[64];
    int line;
} sink_t;

static void sink(void *arg, kvt_log_level_t level, const char *file, int line,
                 const char *msg)
{
    sink_t *s = arg;

    atomic_fetch_add(&s->inside, 1);
    if (atomic_load(&s->gone))
        atomic_store(&s->late, 1);
    if (s->record) {
        s->level = level;
        snprintf(s->file, sizeof(s->file), "%s", file);
        snprintf(s->msg, sizeof(s->msg), "%s", msg);
        s->line = line;
    }
    atomic_fetch_add(&s->calls, 1);
    usleep(50); /* widen the window a racing replacement would hit */
    atomic_fetch_sub(&s->inside, 1);
}

KVT_TEST(lines_reach_the_handler)
{
    sink_t s = {.record = 1};

    kvt_log_set_handler(sink, &s);
    kvt_log_printf(KVT_LOG_LEVEL_ERROR, "dir/some.c", 42, "n=%d", 7);
    kvt_log_set_handler(NULL, NULL);
    CHECK(atomic_load(&s.calls) == 1);
    CHECK(s.level == KVT_LOG_LEVEL_ERROR);
    CHECK(strcmp(s.file, "some.c") == 0 && s.line == 42);
    CHECK(strcmp(s.msg, "n=7") == 0);
    /* Below the level KVT_LOG sets (warn by default): not produced. */
    kvt_log_set_handler(sink, &s);
    kvt_log_printf(KVT_LOG_LEVEL_TRACE, "x.c", 1, "hidden");
    kvt_log_set_handler(NULL, NULL);
    CHECK(atomic_load(&s.calls) == 1);
}

static _Atomic int stop;

static void *logger(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        kvt_log_printf(KVT_LOG_LEVEL_ERROR, __FILE__, __LINE__, "busy");
    return NULL;
}

KVT_TEST(replaced_handler_is_left)
{
    pthread_t th[4];
    int null = open("/dev/null", O_WRONLY);

    CHECK(null >= 0 && dup2(null, STDERR_FILENO) >= 0); /* stderr lines */
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, logger, NULL) == 0);
    sink_t other = {0};

    for (int round = 0; round < 200; round++) {
        sink_t *s = calloc(1, sizeof(*s));
        kvt_log_set_handler(sink, s);
        usleep(200);
        kvt_log_set_handler(round % 2 ? NULL : sink, &other);
        /* Returned: nobody is inside the old handler, nobody enters it. */
        CHECK(atomic_load(&s->inside) == 0);
        atomic_store(&s->gone, 1);
        usleep(200);
        CHECK(atomic_load(&s->late) == 0);
        kvt_log_set_handler(NULL, NULL);
        free(s); /* what a binding does with its handler's state */
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
}

KVT_TEST_MAIN(KVT_CASE(lines_reach_the_handler, 10),
              KVT_CASE(replaced_handler_is_left, 60))
