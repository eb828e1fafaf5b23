/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_LOG_H
#define KVT_UTIL_LOG_H

/*
 * Logging to stderr. The level comes from KVT_LOG (error, warn, info,
 * debug, trace; default warn) and is read once. The function that decides
 * an error logs it; callers only pass the status on.
 */
#include <stddef.h>
#include <stdint.h>

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

/*
 * Capture, for checks that report what they found (kvt_doctor_run()):
 * while a thread has one set, its errors and warnings are kept in it
 * (the most severe first line), whatever the level, and not written. Set
 * and cleared by the thread itself; the buffer must outlive the capture.
 */
typedef struct {
    char *buf; /* the line kept; "" when none */
    size_t cap;
    int level; /* of the line kept; -1 when none */
} kvt__log_capture_t;

extern __thread kvt__log_capture_t *kvt__log_cap;

/* Start capturing this thread's lines into @c (emptied); NULL stops. */
void kvt__log_capture(kvt__log_capture_t *c);

#define kvt__log(level, ...)                                                   \
    do {                                                                       \
        if ((int)(level) <= kvt__log_level_cur ||                              \
            ((int)(level) <= KVT_LOG_WARN && kvt__log_cap != NULL))            \
            kvt__log_emit(level, __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)

#define KVT_LOG_E(...) kvt__log(KVT_LOG_ERROR, __VA_ARGS__)
#define KVT_LOG_W(...) kvt__log(KVT_LOG_WARN, __VA_ARGS__)
#define KVT_LOG_I(...) kvt__log(KVT_LOG_INFO, __VA_ARGS__)
#define KVT_LOG_D(...) kvt__log(KVT_LOG_DEBUG, __VA_ARGS__)
#define KVT_LOG_T(...) kvt__log(KVT_LOG_TRACE, __VA_ARGS__)

/*
 * Rate limiting, for lines a peer can make this process write: at most
 * one line a second per call site; the next line that goes out says how
 * many were suppressed since. Any thread.
 */
typedef struct {
    _Atomic uint64_t next_ns;
    _Atomic uint64_t suppressed;
} kvt__log_rl_t;

/* Emit a line through @rl (kvt__log_rl_t): dropped when its site wrote
 * one less than a second ago. */
void kvt__log_emit_rl(kvt__log_rl_t *rl, kvt__log_level_t level,
                      const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define kvt__log_rl(level, ...)                                                \
    do {                                                                       \
        static kvt__log_rl_t rl_;                                              \
        if ((int)(level) <= kvt__log_level_cur)                                \
            kvt__log_emit_rl(&rl_, level, __FILE__, __LINE__, __VA_ARGS__);    \
    } while (0)

/* Rate-limited errors and warnings: for what peers cause. */
#define KVT_LOG_E_RL(...) kvt__log_rl(KVT_LOG_ERROR, __VA_ARGS__)
#define KVT_LOG_W_RL(...) kvt__log_rl(KVT_LOG_WARN, __VA_ARGS__)

/*
 * A peer-supplied string made safe for a log line: bytes outside printable
 * ASCII, backslash and double quote become \xNN, and the result is cut to
 * fit @cap (NUL-terminated, at least 1). Returns @dst.
 */
#define KVT_LOG_ESC_MAX (4 * 128 + 1) /* a segment name, all escaped */
char *kvt__log_escape(char *dst, size_t cap, const char *src);

#endif
