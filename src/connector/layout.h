/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CONNECTOR_LAYOUT_H
#define KVT_CONNECTOR_LAYOUT_H

/*
 * The connector's own form of a KV layout (local, or a peer's as its
 * handshake carried it), its validation, the compatibility check between
 * a prefill rank's layout and a decode rank's, and the transfer plan that
 * check produces: per cache, how a run of blocks becomes descriptors.
 * Pure code: no engine, no locks, no logging.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/connector.h>
#include <kvt/transfer.h>

#define KVTC__LAY_MAX_LAYERS 65536u
#define KVTC__LAY_MAX_AUX 256u
/* A run of blocks is cut at this length so that token-row counts stay
 * well inside a descriptor's 32-bit piece count. */
#define KVTC__LAY_MAX_RUN 65536u

typedef struct {
    uint32_t layer, kind, block_layout, tokens, heads, head_bytes;
    uint64_t base, block_bytes, num_blocks;
} kvtc__cache_t;

typedef struct {
    uint64_t base, item_bytes, count;
} kvtc__aux_t;

/* Caches sorted by (layer, kind); those of layer l are
 * caches[first[l] .. first[l+1]-1]. */
typedef struct {
    uint32_t num_layers, num_draft, nlayers; /* nlayers = the sum */
    uint32_t ncaches, naux;
    uint32_t tokens;     /* per block, shared by every cache */
    uint64_t num_blocks; /* shared by every cache */
    kvtc__cache_t *caches;
    kvtc__aux_t *aux;
    uint32_t *first;
} kvtc__layout_t;

/* Cache kinds that are identical on every tensor-parallel rank. */
static inline int kvtc__kind_replicated(uint32_t kind)
{
    return kind == KVT_CACHE_LATENT || kind == KVT_CACHE_LATENT_SCALE;
}

/*
 * Build @out from raw caches and aux buffers (copied, caches sorted) and
 * validate it. On failure KVT_ERR_INVALID_PARAM (or KVT_ERR_NO_MEMORY)
 * with a sentence in @why, and @out holds nothing to free.
 */
kvt_status_t kvtc__layout_build(kvtc__layout_t *out, uint32_t num_layers,
                                uint32_t num_draft, const kvtc__cache_t *caches,
                                size_t ncaches, const kvtc__aux_t *aux,
                                size_t naux, char *why, size_t why_len);

/* The same from the public description. */
kvt_status_t kvtc__layout_from_public(kvtc__layout_t *out,
                                      const kvt_kv_layout_t *pub, char *why,
                                      size_t why_len);

void kvtc__layout_clear(kvtc__layout_t *l);

/* How one cache's blocks move from a prefill rank to a decode rank. */
enum {
    KVTC__XP_RUN = 0,   /* whole blocks, a run is one contiguous piece */
    KVTC__XP_BLOCK = 1, /* one piece per block, strided by the block sizes */
    KVTC__XP_TOKEN = 2, /* one piece per token row (token-major, head slice) */
};

typedef struct {
    uint8_t mode;
    uint8_t skip_if_dummy; /* replicated: only the designated rank sends */
    uint8_t merge;         /* TOKEN: rows are evenly spaced across blocks */
    uint32_t tokens;
    uint64_t lbase, rbase; /* block 0 on each side */
    uint64_t lblock, rblock;
    uint64_t len;          /* bytes per piece */
    uint64_t loff, roff;   /* offset of the first piece inside a block */
    uint64_t lunit, runit; /* TOKEN: distance between rows */
} kvtc__xplan_t;

/*
 * Check that prefill rank @p of @P (layout @pl) can feed decode rank @d of
 * @D (layout @dl), and fill @plan (pl->ncaches entries) with the way each
 * cache moves. Tensor-parallel sizes must divide one another; sharded
 * caches must hold the same total of heads (heads * tp) on both sides;
 * kinds, block layouts, tokens per block, bytes per head and aux item
 * sizes must match. Returns KVT_OK or KVT_ERR_INVALID_PARAM with a
 * sentence in @why.
 */
kvt_status_t kvtc__layout_plan(const kvtc__layout_t *pl, uint32_t P, uint32_t p,
                               const kvtc__layout_t *dl, uint32_t D, uint32_t d,
                               kvtc__xplan_t *plan, char *why, size_t why_len);

/* A run of blocks contiguous on both sides. */
typedef struct {
    uint32_t src, dst, n;
} kvtc__run_t;

/*
 * Group the pairs (src[i], dst[i]) into runs contiguous on both sides,
 * each at most @max_run blocks (kvtc__max_run()), written to @runs (room
 * for @n). Returns the number of runs.
 */
size_t kvtc__runs_build(const uint32_t *src, const uint32_t *dst, size_t n,
                        uint32_t max_run, kvtc__run_t *runs);

/* The longest run for blocks of @tokens tokens: token rows of a run must
 * fit a descriptor's 32-bit piece count. */
static inline uint32_t kvtc__max_run(uint32_t tokens)
{
    uint32_t m = (1u << 31) / tokens;
    if (m > KVTC__LAY_MAX_RUN)
        m = KVTC__LAY_MAX_RUN;
    return m ? m : 1;
}

/* Descriptors one run needs under @x. */
static inline size_t kvtc__xplan_count(const kvtc__xplan_t *x,
                                       const kvtc__run_t *r)
{
    return (x->mode == KVTC__XP_TOKEN && !x->merge) ? r->n : 1;
}

/*
 * Write the WRITE descriptors of run @r under @x to @out (room for
 * kvtc__xplan_count()), all to @seg, with @user_data. Returns how many.
 */
size_t kvtc__xplan_descs(const kvtc__xplan_t *x, const kvtc__run_t *r,
                         kvt_segment_t seg, uint64_t user_data,
                         kvt_xfer_desc_t *out);

/* Human-readable names, for reasons and logs. */
const char *kvtc__kind_str(uint32_t kind);

#endif
