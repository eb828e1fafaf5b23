/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_THREAD_H
#define KVT_UTIL_THREAD_H

/*
 * Names the calling thread for ps, top -H, perf and gdb ("kvt-tcp-w0").
 * The kernel keeps at most 15 characters; longer names are cut. Called
 * first thing in each of kvt's thread functions; failures are ignored
 * (a name is a convenience, never needed for correctness).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

__attribute__((format(printf, 1, 2))) static inline void
kvt__thread_name(const char *fmt, ...)
{
    char name[16];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    pthread_setname_np(pthread_self(), name);
}

#endif
