/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TOOLS_DEMO_H
#define KVT_TOOLS_DEMO_H

/*
 * kvt demo's two halves: the demo process (demo.c: options, the children,
 * progress and the summary) and a rank (demo_rank.c: its engine and
 * connector, prefill's simulated forward pass, decode's checks). What they
 * share: the options, the request list every process derives from the
 * seed, and the reports ranks write to the demo process.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
    const char *name;
    const char *desc;
    uint32_t layers, draft_layers;
    uint32_t kv_heads;     /* K/V heads in all (0 for MLA) */
    uint32_t head_bytes;   /* per head per token: head_dim * 2 (bf16) */
    uint32_t latent_bytes; /* MLA: (kv_lora_rank + rope dims) * 2 */
    uint32_t tokens_per_block;
    /* FLOPs model: active parameters per layer, and the width that
     * attention's quadratic term scales with. */
    double params_per_layer;
    double attn_width;
} model_t;

typedef struct {
    const model_t *m;
    uint32_t requests, min_len, max_len, prefill_tp, decode_tp, concurrency;
    uint32_t submit_interval;
    uint64_t seed;
    int layerwise, json;
    uint32_t calib;    /* calibration requests run first */
    double compute_ms; /* < 0: from the FLOPs model */
    double tflops;
    const char *protocol;
    const char *metadata;
    int cuda; /* --memory=cuda: caches and aux buffers in device memory */
} opts_t;

enum { SIDE_PREFILL = 0, SIDE_DECODE = 1 };

typedef struct {
    uint64_t room;
    uint32_t tokens;
    uint32_t blocks;
} req_t;

enum {
    REP_READY = 1, /* a rank is up */
    REP_PREFILL,   /* prefill rank finished a request */
    REP_DECODE,    /* decode rank finished a request */
    REP_CALIB,     /* calibration: one request moved without compute */
    REP_DONE,      /* a rank finished the whole list */
    REP_ERROR,     /* a rank failed; text follows */
};

/* One record, written atomically to the pipe (< PIPE_BUF). */
typedef struct {
    uint32_t type, side, rank, ok;
    uint64_t room;
    uint64_t t_first, t_last; /* prefill: first/last layer ready; decode:
                                 announced / SUCCESS */
    uint64_t bytes, verified;
    char text[160];
} rep_t;

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Simulated compute of one layer for a prompt of @tokens (demo.c). */
double demo_layer_compute_ms(const opts_t *o, uint32_t tokens);

/* Request @i of the list (demo.c). */
req_t demo_request(const opts_t *o, uint32_t i);

/* A rank's process: serve @side's rank @rank of the run, reporting on
 * @rep_fd; exits (demo_rank.c). */
void demo_rank_main(const opts_t *o, int side, uint32_t rank, int rep_fd)
    __attribute__((noreturn));

#endif
