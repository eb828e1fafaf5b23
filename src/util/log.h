/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_LOG_H
#define KVT_UTIL_LOG_H

/*
 * Logging to stderr. The level comes from KVT_LOG (error, warn, info,
 * debug, trace; default warn) and is read once. The function that decides
 * an error logs it; callers only pass the status on.
 */
typedef enum {
    KVT_LOG_ERROR = 0,
    KVT_LOG_WARN,
    KVT_LOG_INFO,
    KVT_LOG_DEBUG,
    KVT_LOG_TRACE,
} kvt__log_level_t;

extern int kvt__log_level_cur;
void kvt__log_init(void);
void kvt__log_emit(kvt__log_level_t level, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define kvt__log(level, ...)                                                   \
    do {                                                                       \
        if ((int)(level) <= kvt__log_level_cur)                                \
            kvt__log_emit(level, __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)

#define KVT_LOG_E(...) kvt__log(KVT_LOG_ERROR, __VA_ARGS__)
#define KVT_LOG_W(...) kvt__log(KVT_LOG_WARN, __VA_ARGS__)
#define KVT_LOG_I(...) kvt__log(KVT_LOG_INFO, __VA_ARGS__)
#define KVT_LOG_D(...) kvt__log(KVT_LOG_DEBUG, __VA_ARGS__)
#define KVT_LOG_T(...) kvt__log(KVT_LOG_TRACE, __VA_ARGS__)

#endif
