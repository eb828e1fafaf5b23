/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_TIME_H
#define KVT_UTIL_TIME_H

/*
 * Clocks: the monotonic clock in nanoseconds, exact and coarse.
 */

#include <stdint.h>
#include <time.h>

/* Monotonic clock in nanoseconds. */
static inline uint64_t kvt__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same clock as of the kernel's last tick (behind by one tick at
 * most, a few ms), read without the counter: for deadlines checked at a
 * coarser grain still (the tcp workers' 50 ms tick). */
static inline uint64_t kvt__now_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
