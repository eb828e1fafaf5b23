/* SPDX-License-Identifier: Apache-2.0 */
/* KV layouts: building and validating them, the compatibility check
 * between a prefill and a decode rank, and the transfer plan it yields
 * (layout.h has the contracts). Pure code. */
#include "layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kvtc__kind_str(uint32_t kind)
{
    static const char *const names[] = {
        "K", "V", "LATENT", "K_SCALE", "V_SCALE", "LATENT_SCALE", "KV"};
    return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

static kvt_status_t fault(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kvt_status_t fault(char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;

    if (why != NULL && why_len > 0) {
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return KVT_ERR_INVALID_PARAM;
}

static int mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

static int cache_cmp(const void *a, const void *b)
{
    const kvtc__cache_t *x = a, *y = b;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return 0;
}

/* Content bytes of one block of @c, or 0 on overflow. */
static uint64_t content_bytes(const kvtc__cache_t *c)
{
    uint64_t a, b;
    if (!mul_ok(c->tokens, c->heads, &a) || !mul_ok(a, c->head_bytes, &b))
        return 0;
    return b;
}

static kvt_status_t check_cache(const kvtc__cache_t *c, size_t i,
                                uint32_t nlayers, char *why, size_t wl)
{
    uint64_t content, span, end;

    if (c->layer >= nlayers)
        return fault(why, wl,
                     "cache %zu: layer %u is out of range (the "
                     "layout has %u layers, draft included)",
                     i, c->layer, nlayers);
    if (c->kind > KVT_CACHE_KV)
        return fault(why, wl, "cache %zu (layer %u): unknown kind %u", i,
                     c->layer, c->kind);
    if (c->block_layout > KVT_BLOCK_HEAD_MAJOR)
        return fault(why, wl,
                     "cache %zu (layer %u %s): unknown block "
                     "layout %u",
                     i, c->layer, kvtc__kind_str(c->kind), c->block_layout);
    if (c->base == 0)
        return fault(why, wl, "cache %zu (layer %u %s): base is NULL", i,
                     c->layer, kvtc__kind_str(c->kind));
    if (c->tokens == 0 || c->heads == 0 || c->head_bytes == 0)
        return fault(why, wl,
                     "cache %zu (layer %u %s): tokens_per_block, "
                     "heads and head_bytes must be at least 1 (got %u, %u, "
                     "%u)",
                     i, c->layer, kvtc__kind_str(c->kind), c->tokens, c->heads,
                     c->head_bytes);
    if (c->num_blocks == 0)
        return fault(why, wl, "cache %zu (layer %u %s): num_blocks is 0", i,
                     c->layer, kvtc__kind_str(c->kind));
    content = content_bytes(c);
    if (content == 0 || c->block_bytes < content)
        return fault(why, wl,
                     "cache %zu (layer %u %s): block_bytes %llu is "
                     "less than tokens_per_block * heads * head_bytes = "
                     "%u * %u * %u",
                     i, c->layer, kvtc__kind_str(c->kind),
                     (unsigned long long)c->block_bytes, c->tokens, c->heads,
                     c->head_bytes);
    if (!mul_ok(c->block_bytes, c->num_blocks, &span) ||
        __builtin_add_overflow(c->base, span, &end))
        return fault(why, wl,
                     "cache %zu (layer %u %s): base + block_bytes "
                     "* num_blocks overflows",
                     i, c->layer, kvtc__kind_str(c->kind));
    return KVT_OK;
}

/* Per layer: K and V together, or KV, or LATENT; scales only beside what
 * they scale; every kind at most once. @c are the caches of one layer, sorted
 * by kind. */
static kvt_status_t check_layer(const kvtc__cache_t *c, size_t n,
                                uint32_t layer, char *why, size_t wl)
{
    unsigned seen = 0;

    for (size_t i = 0; i < n; i++) {
        if (seen & (1u << c[i].kind))
            return fault(why, wl, "layer %u has two %s caches", layer,
                         kvtc__kind_str(c[i].kind));
        seen |= 1u << c[i].kind;
    }
#define HAS(k) ((seen & (1u << (k))) != 0)
    if (seen == 0)
        return fault(why, wl, "layer %u has no cache", layer);
    if (HAS(KVT_CACHE_KV) &&
        (HAS(KVT_CACHE_K) || HAS(KVT_CACHE_V) || HAS(KVT_CACHE_LATENT)))
        return fault(why, wl, "layer %u mixes a KV cache with %s", layer,
                     HAS(KVT_CACHE_K) || HAS(KVT_CACHE_V)
                         ? "K or V"
                         : "a LATENT (MLA) cache");
    if (HAS(KVT_CACHE_K) != HAS(KVT_CACHE_V))
        return fault(why, wl, "layer %u has %s without %s", layer,
                     HAS(KVT_CACHE_K) ? "K" : "V",
                     HAS(KVT_CACHE_K) ? "V" : "K");
    if (HAS(KVT_CACHE_LATENT) && HAS(KVT_CACHE_K))
        return fault(why, wl,
                     "layer %u mixes a LATENT (MLA) cache with K "
                     "and V",
                     layer);
    if (HAS(KVT_CACHE_KV) && (HAS(KVT_CACHE_K_SCALE) || HAS(KVT_CACHE_V_SCALE)))
        return fault(why, wl, "layer %u has K or V scales beside a KV cache",
                     layer);
    if (!HAS(KVT_CACHE_LATENT) && !HAS(KVT_CACHE_K) && !HAS(KVT_CACHE_KV))
        return fault(why, wl,
                     "layer %u has scales but neither K/V, KV nor "
                     "LATENT",
                     layer);
    if (HAS(KVT_CACHE_K_SCALE) && !HAS(KVT_CACHE_K))
        return fault(why, wl, "layer %u has K_SCALE without K", layer);
    if (HAS(KVT_CACHE_V_SCALE) && !HAS(KVT_CACHE_V))
        return fault(why, wl, "layer %u has V_SCALE without V", layer);
    if (HAS(KVT_CACHE_LATENT_SCALE) && !HAS(KVT_CACHE_LATENT))
        return fault(why, wl, "layer %u has LATENT_SCALE without LATENT",
                     layer);
#undef HAS
    return KVT_OK;
}

void kvtc__layout_clear(kvtc__layout_t *l)
{
    free(l->caches);
    free(l->aux);
    free(l->first);
    memset(l, 0, sizeof(*l));
}

/*
 * Validation order: counts, each cache alone, the shared block table,
 * each layer's set of kinds, each aux buffer. The first fault wins, so
 * the sentence names one concrete thing to fix.
 */
kvt_status_t kvtc__layout_build(kvtc__layout_t *out, uint32_t num_layers,
                                uint32_t num_draft, const kvtc__cache_t *caches,
                                size_t ncaches, const kvtc__aux_t *aux,
                                size_t naux, char *why, size_t wl)
{
    kvtc__layout_t l;
    uint64_t nl = (uint64_t)num_layers + num_draft;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    memset(&l, 0, sizeof(l));
    if (nl == 0 || nl > KVTC__LAY_MAX_LAYERS) {
        fault(why, wl,
              "the layout needs 1..%u layers (target + draft), "
              "got %llu",
              KVTC__LAY_MAX_LAYERS, (unsigned long long)nl);
        goto err;
    }
    if (ncaches < nl || ncaches > 6 * nl) {
        fault(why, wl,
              "%zu caches for %llu layers: every layer needs "
              "1..6 caches",
              ncaches, (unsigned long long)nl);
        goto err;
    }
    if (caches == NULL || (naux > 0 && aux == NULL)) {
        fault(why, wl, "caches or aux array is NULL");
        goto err;
    }
    if (naux > KVTC__LAY_MAX_AUX) {
        fault(why, wl, "%zu aux buffers; at most %u", naux, KVTC__LAY_MAX_AUX);
        goto err;
    }
    for (size_t i = 0; i < ncaches; i++) {
        if ((st = check_cache(&caches[i], i, (uint32_t)nl, why, wl)) != 0)
            goto err;
        if (caches[i].num_blocks != caches[0].num_blocks ||
            caches[i].tokens != caches[0].tokens) {
            st = fault(
                why, wl,
                "cache %zu (layer %u %s) has %llu blocks of "
                "%u tokens, cache 0 has %llu of %u: all caches share "
                "one block table",
                i, caches[i].layer, kvtc__kind_str(caches[i].kind),
                (unsigned long long)caches[i].num_blocks, caches[i].tokens,
                (unsigned long long)caches[0].num_blocks, caches[0].tokens);
            goto err;
        }
    }
    for (size_t i = 0; i < naux; i++) {
        uint64_t span, end;
        if (aux[i].base == 0 || aux[i].item_bytes == 0 || aux[i].count == 0 ||
            !mul_ok(aux[i].item_bytes, aux[i].count, &span) ||
            __builtin_add_overflow(aux[i].base, span, &end)) {
            st = fault(why, wl,
                       "aux buffer %zu: base must be non-NULL, "
                       "item_bytes and count at least 1, and base + "
                       "item_bytes * count must not overflow",
                       i);
            goto err;
        }
    }

    st = KVT_ERR_NO_MEMORY;
    l.caches = malloc(ncaches * sizeof(*l.caches));
    l.first = calloc(nl + 1, sizeof(*l.first));
    l.aux = malloc((naux ? naux : 1) * sizeof(*l.aux));
    if (l.caches == NULL || l.first == NULL || l.aux == NULL) {
        fault(why, wl, "out of memory");
        goto err_free;
    }
    memcpy(l.caches, caches, ncaches * sizeof(*l.caches));
    if (naux)
        memcpy(l.aux, aux, naux * sizeof(*l.aux));
    qsort(l.caches, ncaches, sizeof(*l.caches), cache_cmp);
    l.num_layers = num_layers;
    l.num_draft = num_draft;
    l.nlayers = (uint32_t)nl;
    l.ncaches = (uint32_t)ncaches;
    l.naux = (uint32_t)naux;
    l.tokens = caches[0].tokens;
    l.num_blocks = caches[0].num_blocks;
    for (size_t i = 0, layer = 0; layer <= nl; layer++) {
        l.first[layer] = (uint32_t)i;
        while (i < ncaches && l.caches[i].layer == layer)
            i++;
    }
    for (uint32_t layer = 0; layer < nl; layer++) {
        st = check_layer(&l.caches[l.first[layer]],
                         l.first[layer + 1] - l.first[layer], layer, why, wl);
        if (st != KVT_OK)
            goto err_free;
    }
    *out = l;
    return KVT_OK;

err_free:
    kvtc__layout_clear(&l);
err:
    return st;
}

kvt_status_t kvtc__layout_from_public(kvtc__layout_t *out,
                                      const kvt_kv_layout_t *pub, char *why,
                                      size_t wl)
{
    kvtc__cache_t *c = NULL;
    kvtc__aux_t *a = NULL;
    kvt_status_t st;

    if (pub == NULL)
        return fault(why, wl, "no layout");
    if (pub->num_caches > 6u * KVTC__LAY_MAX_LAYERS ||
        pub->num_aux > KVTC__LAY_MAX_AUX || pub->num_caches == 0)
        return kvtc__layout_build(out, pub->num_layers, pub->num_draft_layers,
                                  NULL, pub->num_caches, NULL, pub->num_aux,
                                  why, wl);
    if (pub->caches == NULL || (pub->num_aux > 0 && pub->aux == NULL))
        return fault(why, wl, "caches or aux array is NULL");
    c = malloc(pub->num_caches * sizeof(*c));
    a = malloc((pub->num_aux ? pub->num_aux : 1) * sizeof(*a));
    if (c == NULL || a == NULL) {
        st = KVT_ERR_NO_MEMORY;
        fault(why, wl, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < pub->num_caches; i++) {
        const kvt_kv_cache_t *p = &pub->caches[i];
        c[i] = (kvtc__cache_t){p->layer,
                               p->kind,
                               p->block_layout,
                               p->tokens_per_block,
                               p->heads,
                               p->head_bytes,
                               (uint64_t)(uintptr_t)p->base,
                               p->block_bytes,
                               p->num_blocks};
    }
    for (size_t i = 0; i < pub->num_aux; i++)
        a[i] = (kvtc__aux_t){(uint64_t)(uintptr_t)pub->aux[i].base,
                             pub->aux[i].item_bytes, pub->aux[i].count};
    st = kvtc__layout_build(out, pub->num_layers, pub->num_draft_layers, c,
                            pub->num_caches, a, pub->num_aux, why, wl);
out:
    free(c);
    free(a);
    return st;
}

kvt_status_t kvt_kv_layout_check(const kvt_kv_layout_t *layout, char *why,
                                 size_t why_len)
{
    kvtc__layout_t l;
    kvt_status_t st;

    if (why != NULL && why_len > 0)
        why[0] = '\0';
    st = kvtc__layout_from_public(&l, layout, why, why_len);
    if (st == KVT_OK)
        kvtc__layout_clear(&l);
    return st;
}

/*
 * The plan of one cache. Sharded caches with different head counts take
 * a slice: the side with fewer heads moves all of its heads, into (or
 * from) the place of its slice in the other side's blocks. Head-major
 * blocks keep a slice contiguous inside a block, so one piece per block;
 * token-major blocks interleave heads inside each token row, so one piece
 * per row, and rows are evenly spaced across the blocks of a run when
 * neither side pads its blocks (then one descriptor covers the run).
 */
static void plan_cache(const kvtc__cache_t *pc, const kvtc__cache_t *dc,
                       uint32_t P, uint32_t p, uint32_t D, uint32_t d,
                       kvtc__xplan_t *x)
{
    uint64_t T = pc->tokens, hb = pc->head_bytes;
    uint64_t content = T * pc->heads * hb;
    int head_major = pc->block_layout == KVT_BLOCK_HEAD_MAJOR;

    memset(x, 0, sizeof(*x));
    x->tokens = pc->tokens;
    x->lbase = pc->base;
    x->rbase = dc->base;
    x->lblock = pc->block_bytes;
    x->rblock = dc->block_bytes;
    x->skip_if_dummy = (uint8_t)kvtc__kind_replicated(pc->kind);
    if (pc->heads == dc->heads) {
        if (pc->block_bytes == dc->block_bytes && pc->block_bytes == content) {
            x->mode = KVTC__XP_RUN;
            x->len = content;
        } else {
            x->mode = KVTC__XP_BLOCK;
            x->len = content;
        }
        return;
    }
    /* hp < hd: this rank's heads go to slice (p % (P/D)) of decode's.
     * hp > hd: slice (d % (D/P)) of this rank's heads goes to decode. */
    {
        uint64_t hp = pc->heads, hd = dc->heads;
        uint64_t unit = head_major ? T * hb : hb;
        uint64_t hmin = hp < hd ? hp : hd;
        if (hp < hd)
            x->roff = (uint64_t)(p % (P / D)) * hp * unit;
        else
            x->loff = (uint64_t)(d % (D / P)) * hd * unit;
        if (head_major) {
            x->mode = KVTC__XP_BLOCK;
            x->len = hmin * T * hb;
        } else {
            x->mode = KVTC__XP_TOKEN;
            x->len = hmin * hb;
            x->lunit = hp * hb;
            x->runit = hd * hb;
            x->merge = pc->block_bytes == T * hp * hb &&
                       dc->block_bytes == T * hd * hb;
        }
    }
}

kvt_status_t kvtc__layout_plan(const kvtc__layout_t *pl, uint32_t P, uint32_t p,
                               const kvtc__layout_t *dl, uint32_t D, uint32_t d,
                               kvtc__xplan_t *plan, char *why, size_t wl)
{
    if (P == 0 || D == 0 || p >= P || d >= D)
        return fault(why, wl,
                     "bad tensor-parallel ranks: prefill %u of %u, "
                     "decode %u of %u",
                     p, P, d, D);
    if (P % D != 0 && D % P != 0)
        return fault(why, wl,
                     "prefill tp %u and decode tp %u: one must "
                     "divide the other",
                     P, D);
    if (pl->num_layers != dl->num_layers || pl->num_draft != dl->num_draft)
        return fault(why, wl,
                     "prefill has %u + %u draft layers, decode "
                     "%u + %u",
                     pl->num_layers, pl->num_draft, dl->num_layers,
                     dl->num_draft);
    if (pl->ncaches != dl->ncaches)
        return fault(why, wl, "prefill has %u caches, decode %u", pl->ncaches,
                     dl->ncaches);
    if (pl->tokens != dl->tokens)
        return fault(why, wl,
                     "prefill blocks hold %u tokens, decode blocks "
                     "%u",
                     pl->tokens, dl->tokens);
    if (pl->naux != dl->naux)
        return fault(why, wl, "prefill has %u aux buffers, decode %u", pl->naux,
                     dl->naux);
    for (uint32_t i = 0; i < pl->naux; i++)
        if (pl->aux[i].item_bytes != dl->aux[i].item_bytes)
            return fault(why, wl,
                         "aux buffer %u: prefill items are %llu "
                         "bytes, decode items %llu",
                         i, (unsigned long long)pl->aux[i].item_bytes,
                         (unsigned long long)dl->aux[i].item_bytes);
    for (uint32_t i = 0; i < pl->ncaches; i++) {
        const kvtc__cache_t *pc = &pl->caches[i], *dc = &dl->caches[i];
        if (pc->layer != dc->layer || pc->kind != dc->kind)
            return fault(why, wl,
                         "layer %u: prefill has a %s cache where "
                         "decode has layer %u %s",
                         pc->layer, kvtc__kind_str(pc->kind), dc->layer,
                         kvtc__kind_str(dc->kind));
        if (pc->block_layout != dc->block_layout)
            return fault(why, wl,
                         "layer %u %s: prefill blocks are %s, "
                         "decode blocks %s",
                         pc->layer, kvtc__kind_str(pc->kind),
                         pc->block_layout ? "head-major" : "token-major",
                         dc->block_layout ? "head-major" : "token-major");
        if (pc->head_bytes != dc->head_bytes)
            return fault(why, wl,
                         "layer %u %s: %u bytes per head on "
                         "prefill, %u on decode",
                         pc->layer, kvtc__kind_str(pc->kind), pc->head_bytes,
                         dc->head_bytes);
        if (kvtc__kind_replicated(pc->kind)) {
            if (pc->heads != dc->heads)
                return fault(why, wl,
                             "layer %u %s: replicated cache with "
                             "%u heads on prefill, %u on decode",
                             pc->layer, kvtc__kind_str(pc->kind), pc->heads,
                             dc->heads);
        } else if ((uint64_t)pc->heads * P != (uint64_t)dc->heads * D) {
            return fault(why, wl,
                         "layer %u %s: prefill has %u heads x tp "
                         "%u, decode %u heads x tp %u: the totals differ "
                         "(replicated KV heads are not supported)",
                         pc->layer, kvtc__kind_str(pc->kind), pc->heads, P,
                         dc->heads, D);
        }
        plan_cache(pc, dc, P, p, D, d, &plan[i]);
    }
    return KVT_OK;
}

size_t kvtc__runs_build(const uint32_t *src, const uint32_t *dst, size_t n,
                        uint32_t max_run, kvtc__run_t *runs)
{
    size_t nr = 0;

    for (size_t i = 0; i < n; i++) {
        if (nr > 0) {
            kvtc__run_t *r = &runs[nr - 1];
            if ((uint64_t)r->src + r->n == src[i] &&
                (uint64_t)r->dst + r->n == dst[i] && r->n < max_run) {
                r->n++;
                continue;
            }
        }
        runs[nr++] = (kvtc__run_t){src[i], dst[i], 1};
    }
    return nr;
}

size_t kvtc__xplan_descs(const kvtc__xplan_t *x, const kvtc__run_t *r,
                         kvt_segment_t seg, uint64_t user_data,
                         kvt_xfer_desc_t *out)
{
    uint64_t l0 = x->lbase + (uint64_t)r->src * x->lblock + x->loff;
    uint64_t r0 = x->rbase + (uint64_t)r->dst * x->rblock + x->roff;
    kvt_xfer_desc_t d = {0};

    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.user_data = user_data;
    d.local_addr = (void *)(uintptr_t)l0;
    d.remote_addr = r0;
    switch (x->mode) {
    case KVTC__XP_RUN:
        d.count = 1;
        d.length = x->len * r->n;
        out[0] = d;
        return 1;
    case KVTC__XP_BLOCK:
        d.count = r->n;
        d.length = x->len;
        d.local_stride = x->lblock;
        d.remote_stride = x->rblock;
        out[0] = d;
        return 1;
    default:
        d.length = x->len;
        d.local_stride = x->lunit;
        d.remote_stride = x->runit;
        if (x->merge) {
            d.count = r->n * x->tokens;
            out[0] = d;
            return 1;
        }
        d.count = x->tokens;
        for (uint32_t j = 0; j < r->n; j++) {
            out[j] = d;
            out[j].local_addr = (void *)(uintptr_t)(l0 + j * x->lblock);
            out[j].remote_addr = r0 + j * x->rblock;
        }
        return r->n;
    }
}
