/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_TIME_H
#define KVT_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

/* Monotonic clock in nanoseconds. */
static inline uint64_t kvt__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
