/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TOOLS_BENCH_H
#define KVT_TOOLS_BENCH_H

/*
 * kvt bench's pieces shared between the command (bench.c) and its checks
 * (bench_check.c): the options, where each descriptor goes, the byte
 * pattern --verify writes and checks, and the small exchange of
 * notifications through which the initiator asks the target for its CPU
 * time, to fill its buffer, or to check what was written.
 */
#include <signal.h>
#include <stdint.h>

#include <kvt/kvt.h>

typedef struct {
    const char *mode, *local, *segment, *protocol, *op, *buffer, *memory;
    const char *pattern; /* "contig", "scatter"; NULL: by block size */
    uint64_t device;
    uint64_t port, buffer_size, block, batch, threads, workers, conns;
    uint64_t depth;       /* batches in flight per thread */
    uint64_t working_set; /* per thread; 0: the default (cold) */
    double duration;
    int json, verify;
} bench_opts_t;

/*
 * The slots a thread's descriptors visit, in [0, n): descriptor k goes to
 * slot (k mod n) * mul mod n. mul is 1 for a contiguous walk. For a
 * scattered one mul is coprime to n and neither 1 nor n-1, so every slot
 * is visited once per pass and no two consecutive descriptors are
 * neighbours; inv is mul's inverse mod n, for the target's check.
 */
typedef struct {
    uint64_t n, mul, inv;
} bench_walk_t;

/* Set up a walk over @n slots; @frac (0..1) picks the scattered stride.
 * Returns -1 when @scatter cannot be had (n < 4, and n = 4 or 6). */
int bench_walk_init(bench_walk_t *w, uint64_t n, int scatter, double frac);

static inline uint64_t bench_walk_slot(const bench_walk_t *w, uint64_t k)
{
    return (k % w->n) * w->mul % w->n;
}

/* The --verify pattern: the bytes at @off (from the start of the target's
 * region) in pass @pass, a function of both and of @seed. */
void bench_fill(void *dst, uint64_t off, uint64_t len, uint64_t pass,
                uint64_t seed);
/* 1 when the @len bytes at @src differ from what bench_fill() wrote. */
int bench_differs(const void *src, uint64_t off, uint64_t len, uint64_t pass,
                  uint64_t seed);

/* CPU seconds (user and system) this process has used, every thread. */
double bench_cpu_s(void);

/*
 * The target's loop: serve the initiators' requests until SIGINT or
 * SIGTERM (blocked in @set) arrives. @buf/@len is the registered buffer,
 * in host memory, or NULL when it is not (requests that need it are
 * answered with an error).
 */
void bench_target_serve(kvt_engine_h e, void *buf, uint64_t len,
                        const sigset_t *set);

/*
 * Ask the target of @seg: send @req ("cpu", "fill SEED", "verify ...")
 * and wait up to @timeout_ms for its answer, copied into @reply. Returns
 * 0, or -1 (logged to stderr) when it could not be sent, or no answer
 * came (a target that does not serve requests, such as another tool).
 */
int bench_ask(kvt_engine_h e, kvt_segment_t seg, const char *req, char *reply,
              size_t replysz, int timeout_ms);

#endif
