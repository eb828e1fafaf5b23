/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_BENCH_MATCHED_H
#define KVT_BENCH_MATCHED_H

#include <stddef.h>

/* kvt_baseline's matched ceilings (matched.c); each returns the exit
 * status, or -1 for arguments it does not take. */
int matched_tcp(int argc, char **argv);
int matched_copy(int argc, char **argv);

/* From baseline.c: a size with K/M/G suffixes; touched memory; a connected
 * loopback TCP pair with large buffers and TCP_NODELAY (0, or -1). */
size_t matched_size(const char *s);
/* @n bytes of private memory, every page touched; exits on failure. */
char *matched_touched(size_t n);
int matched_tcp_pair(int *a, int *b);

#endif
