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
 * trace, off; default warn), read once. These calls let code built on
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

#ifdef __cplusplus
}
#endif
#endif
