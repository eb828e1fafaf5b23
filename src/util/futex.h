/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_FUTEX_H
#define KVT_UTIL_FUTEX_H

/*
 * Futex wait (with a timeout) and wake on a 32-bit word, private to the
 * process.
 */

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Sleep while *word == expected, at most @timeout_ns (negative: forever).
 * Spurious wake-ups are possible; callers loop on their own condition.
 */
static inline void kvt__futex_wait(_Atomic uint32_t *word, uint32_t expected,
                                   int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tsp = &ts;
    }
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, tsp,
            NULL, 0);
}

static inline void kvt__futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL,
            NULL, 0);
}

#endif
