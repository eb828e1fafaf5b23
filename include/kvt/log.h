/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_LOG_H
#define KVT_LOG_H

#include <kvt/defs.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * kvt's log: lines on stderr with a time stamp, the level, the pid and
 * the place, at most the level KVT_LOG sets (error, warn, info, debug,
 * trace, off; default warn), read once; or to a handler the application
 * sets (kvt_log_set_handler()). These calls let code built on
 * the library (bindings, the connector) log the same way.
 */
typedef enum {
    KVT_LOG_LEVEL_ERROR = 0,
    KVT_LOG_LEVEL_WARN = 1,
    KVT_LOG_LEVEL_INFO = 2,
    KVT_LOG_LEVEL_DEBUG = 3,
    KVT_LOG_LEVEL_TRACE = 4,
} kvt_log_level_t;

/* kvt_log_enabled() - whether a line of @level would be written.
 * Thread-safe, does not block. */
KVT_API int kvt_log_enabled(kvt_log_level_t level);

/* kvt_log_printf() - write one line (at most 1 KiB; longer is cut) of
 * @level, attributed to @file:@line, if that level is enabled. One write
 * per line, so lines of different threads do not mix. Thread-safe. */
KVT_API void kvt_log_printf(kvt_log_level_t level, const char *file, int line,
                            const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * kvt_log_handler_cb_t - receives one log line: its @level, the source
 * @file (base name) and @line, and the message @msg (NUL-terminated, at
 * most 1 KiB, no newline). @msg and @file are valid during the call only.
 */
typedef void (*kvt_log_handler_cb_t)(void *arg, kvt_log_level_t level,
                                     const char *file, int line,
                                     const char *msg);

/*
 * kvt_log_set_handler() - send every line kvt logs (its own and those of
 * kvt_log_printf()) to @cb instead of stderr; NULL restores stderr. The
 * level KVT_LOG sets still decides which lines are produced.
 *
 * @cb is called on whichever thread logs, several at once, and possibly
 * while kvt holds internal locks: it must not call into kvt nor block for
 * long. A binding queues the line and hands it on from a thread of its own
 * (the Python binding does this for Python's logging). The call returns
 * once no thread is inside the previous handler any more, so its @arg may
 * be freed then; it must not be called from within a handler.
 * Thread-safe; process-wide (one handler for every engine).
 */
KVT_API void kvt_log_set_handler(kvt_log_handler_cb_t cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
