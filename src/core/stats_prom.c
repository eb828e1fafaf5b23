/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Prometheus text of an engine's metrics (exposition format 0.0.4),
 * rendered from a table of metric families: each names its family, type
 * and help, and says where its values are in kvt_engine_stats_t and how
 * they are labelled. The order of the table is the order of the text.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/engine_int.h"
#include "core/stats_prom.h"

/* How a family's samples are labelled, and where its values are. */
typedef enum {
    /* One sample: a uint64_t of kvt_engine_stats_t. */
    ONE,
    /* One per transport: a uint64_t of kvt_transport_stats_t. */
    PER_TL,
    /* Per transport and operation: op[] of kvt_transport_stats_t. */
    PER_TL_OP,
    /* Per transport and status, those not 0: an array of
     * kvt_transport_stats_t indexed by -status. */
    PER_TL_FAIL,
    /* Per status, those not 0: an array of kvt_engine_stats_t. */
    PER_REFUSAL,
    /* The latency histogram, per transport and size class. */
    PER_TL_SIZE,
    /* Per transport and operation: op[] of kvt_served_stats_t. */
    PER_SERVED_OP,
} shape_t;

typedef struct {
    const char *name, *type, *help;
    shape_t shape;
    size_t off;    /* ONE, PER_TL, PER_TL_FAIL, PER_REFUSAL */
    unsigned nops; /* PER_TL_OP: op[0..nops), labelled op_name[] */
    size_t op[3];
} family_t;

/* The offset of field @f, which must be a uint64_t or an array of them
 * (at() reads every value as one): any other type does not compile. */
#define U64_OFF(type, f)                                                       \
    _Generic(((type *)0)->f + 0, uint64_t                                      \
             : offsetof(type, f), uint64_t *                                   \
             : offsetof(type, f))
#define ENG(f) U64_OFF(kvt_engine_stats_t, f)
#define TL(f) U64_OFF(kvt_transport_stats_t, f)
#define SRV(f) U64_OFF(kvt_served_stats_t, f)

static const char *const op_name[3] = {"write", "read", "notify"};

static const family_t families[] = {
    {.name = "kvt_transfer_descriptors_total",
     .type = "counter",
     .help = "Descriptors completed successfully, by transport and "
             "operation.",
     .shape = PER_TL_OP,
     .nops = 3,
     .op = {TL(writes), TL(reads), TL(notifies)}},
    {.name = "kvt_transfer_bytes_total",
     .type = "counter",
     .help = "Bytes moved by descriptors completed successfully.",
     .shape = PER_TL_OP,
     .nops = 2,
     .op = {TL(write_bytes), TL(read_bytes)}},
    {.name = "kvt_served_pieces_total",
     .type = "counter",
     .help = "Pieces of one-sided writes that peers landed in this "
             "engine's memory and of reads it served, by transport "
             "(counted at the target; ucx's RDMA is not seen here).",
     .shape = PER_SERVED_OP,
     .nops = 2,
     .op = {SRV(writes), SRV(reads)}},
    {.name = "kvt_served_bytes_total",
     .type = "counter",
     .help = "Bytes that peers wrote into this engine's memory and read "
             "from it, by transport (counted at the target).",
     .shape = PER_SERVED_OP,
     .nops = 2,
     .op = {SRV(write_bytes), SRV(read_bytes)}},
    {.name = "kvt_transfer_failures_total",
     .type = "counter",
     .help = "Descriptors that failed, by transport and status.",
     .shape = PER_TL_FAIL,
     .off = TL(failures)},
    {.name = "kvt_transfer_refused_total",
     .type = "counter",
     .help = "Descriptors refused before any transport took them, by "
             "status.",
     .shape = PER_REFUSAL,
     .off = ENG(refused)},
    {.name = "kvt_transfer_latency_seconds",
     .type = "histogram",
     .help = "Time from submission to the final state of each descriptor, "
             "by transport and size class.",
     .shape = PER_TL_SIZE},
    {.name = "kvt_batches_total",
     .type = "counter",
     .help = "Submissions of descriptors (kvt_batch_submit calls).",
     .shape = ONE,
     .off = ENG(batches)},
    {.name = "kvt_descriptors_submitted_total",
     .type = "counter",
     .help = "Descriptors submitted.",
     .shape = ONE,
     .off = ENG(descriptors)},
    {.name = "kvt_descriptors_inflight",
     .type = "gauge",
     .help = "Descriptors submitted and not yet final.",
     .shape = ONE,
     .off = ENG(inflight)},
    {.name = "kvt_sessions_opened_total",
     .type = "counter",
     .help = "Sessions opened to peers, by transport.",
     .shape = PER_TL,
     .off = TL(sessions_opened)},
    {.name = "kvt_sessions_open",
     .type = "gauge",
     .help = "Sessions to peers open now.",
     .shape = PER_TL,
     .off = TL(sessions_open)},
    {.name = "kvt_segments_open",
     .type = "gauge",
     .help = "Remote segments open now.",
     .shape = ONE,
     .off = ENG(segments_open)},
    {.name = "kvt_notifications_received_total",
     .type = "counter",
     .help = "Notifications received from peers.",
     .shape = ONE,
     .off = ENG(notifies_received)},
    {.name = "kvt_notifications_dropped_total",
     .type = "counter",
     .help = "Notifications dropped because the queue was full.",
     .shape = ONE,
     .off = ENG(notifies_dropped)},
    {.name = "kvt_handshakes_refused_total",
     .type = "counter",
     .help = "Handshakes of peers this engine refused.",
     .shape = ONE,
     .off = ENG(handshakes_refused)},
    {.name = "kvt_handshake_failures_total",
     .type = "counter",
     .help = "Handshakes with peers that failed (refused, unreachable).",
     .shape = ONE,
     .off = ENG(handshakes_failed)},
    {.name = "kvt_registered_regions",
     .type = "gauge",
     .help = "Local memory regions registered now.",
     .shape = ONE,
     .off = ENG(regions)},
    {.name = "kvt_registered_bytes",
     .type = "gauge",
     .help = "Bytes of local memory registered now.",
     .shape = ONE,
     .off = ENG(region_bytes)},
};

static const char *const size_label[KVT_STATS_SIZE_CLASSES] = {
    "le_4KiB", "le_64KiB", "le_1MiB", "gt_1MiB"};

__attribute__((format(printf, 2, 3))) static void put(kvt__prom_out_t *o,
                                                      const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(o->len < o->cap ? o->buf + o->len : NULL,
                  o->len < o->cap ? o->cap - o->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* A label value with \, " and newlines escaped (the exposition format's
 * rules), into @dst (room for 2 * KVT_WIRE_NAME_MAX + 1). */
static void label_escape(char *dst, size_t cap, const char *src)
{
    size_t k = 0;

    for (; *src != '\0' && k + 3 < cap; src++) {
        if (*src == '\\' || *src == '"') {
            dst[k++] = '\\';
            dst[k++] = *src;
        } else if (*src == '\n') {
            dst[k++] = '\\';
            dst[k++] = 'n';
        } else {
            dst[k++] = *src;
        }
    }
    dst[k] = '\0';
}

static uint64_t at(const void *base, size_t off)
{
    return *(const uint64_t *)((const char *)base + off);
}

/* One sample: @name{engine="@en"[,transport="@tl"][,@key="@val"]} @v. */
static void sample(kvt__prom_out_t *o, const char *name, const char *en,
                   const char *tl, const char *key, const char *val, uint64_t v)
{
    put(o, "%s{engine=\"%s\"", name, en);
    if (tl != NULL)
        put(o, ",transport=\"%s\"", tl);
    if (key != NULL)
        put(o, ",%s=\"%s\"", key, val);
    put(o, "} %llu\n", (unsigned long long)v);
}

/* The histogram of one transport and size class: cumulative buckets,
 * their sum in seconds and their count. */
static void histogram(kvt__prom_out_t *o, const char *name, const char *en,
                      const kvt_transport_stats_t *x, unsigned c)
{
    uint64_t cum = 0;

    for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++) {
        cum += x->latency[c][b];
        put(o, "%s_bucket{engine=\"%s\",transport=\"%s\",size=\"%s\"", name, en,
            x->name, size_label[c]);
        if (b + 1 < KVT_STATS_LATENCY_BUCKETS)
            put(o, ",le=\"%g\"} %llu\n",
                (double)kvt_stats_latency_bound_us(b) / 1e6,
                (unsigned long long)cum);
        else
            put(o, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    put(o, "%s_sum{engine=\"%s\",transport=\"%s\",size=\"%s\"} %.9f\n", name,
        en, x->name, size_label[c], (double)x->latency_sum_ns[c] / 1e9);
    put(o, "%s_count{engine=\"%s\",transport=\"%s\",size=\"%s\"} %llu\n", name,
        en, x->name, size_label[c], (unsigned long long)cum);
}

/* The samples of @f's status array in @base that are not 0, labelled
 * with transport @tl (NULL: none). */
static void statuses(kvt__prom_out_t *o, const family_t *f, const char *en,
                     const char *tl, const void *base)
{
    for (unsigned i = 1; i < KVT_STATS_STATUSES; i++) {
        uint64_t v = at(base, f->off + i * sizeof(uint64_t));
        if (v != 0)
            sample(o, f->name, en, tl, "status", kvt_status_name(-(int)i), v);
    }
}

static void transport_family(kvt__prom_out_t *o, const family_t *f,
                             const char *en, const kvt_transport_stats_t *x)
{
    switch (f->shape) {
    case PER_TL:
        sample(o, f->name, en, x->name, NULL, NULL, at(x, f->off));
        break;
    case PER_TL_OP:
        for (unsigned k = 0; k < f->nops; k++)
            sample(o, f->name, en, x->name, "op", op_name[k], at(x, f->op[k]));
        break;
    case PER_TL_FAIL:
        statuses(o, f, en, x->name, x);
        break;
    case PER_TL_SIZE:
        for (unsigned c = 0; c < KVT_STATS_SIZE_CLASSES; c++)
            histogram(o, f->name, en, x, c);
        break;
    default:
        break;
    }
}

static void family(kvt_engine_h e, kvt__prom_out_t *o, const family_t *f,
                   const char *en, const kvt_engine_stats_t *s)
{
    if (f->shape == ONE)
        sample(o, f->name, en, NULL, NULL, NULL, at(s, f->off));
    else if (f->shape == PER_REFUSAL)
        statuses(o, f, en, NULL, s);
    else if (f->shape == PER_SERVED_OP)
        for (unsigned t = 0; t < s->ntransports; t++)
            for (unsigned k = 0; k < f->nops && e->tl[t]->ops->served != NULL;
                 k++)
                sample(o, f->name, en, s->transports[t].name, "op", op_name[k],
                       at(&s->served[t], f->op[k]));
    else
        for (unsigned t = 0; t < s->ntransports; t++)
            transport_family(o, f, en, &s->transports[t]);
}

/* The text of @s, the metrics of @e, appended to @o; @meta: with HELP and
 * TYPE lines (once per family in a scrape: the first engine's). */
static void render(kvt_engine_h e, const kvt_engine_stats_t *s,
                   kvt__prom_out_t *o, int meta)
{
    char en[2 * KVT_WIRE_NAME_MAX + 2];

    label_escape(en, sizeof(en), e->cfg.seg_name);
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        const family_t *f = &families[i];
        if (meta)
            put(o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
                f->type);
        family(e, o, f, en, s);
    }
}

kvt_status_t kvt__prom_engine(kvt_engine_h e, kvt__prom_out_t *o, int meta)
{
    kvt_engine_stats_t *s = malloc(sizeof(*s));
    kvt_status_t st;

    if (s == NULL)
        return KVT_ERR_NO_MEMORY;
    s->version = KVT_STATS_VERSION;
    st = kvt_engine_stats(e, s);
    if (st == KVT_OK)
        render(e, s, o, meta);
    free(s);
    return st;
}

kvt_status_t kvt_engine_metrics_text(kvt_engine_h e, char *buf, size_t cap,
                                     size_t *len_p)
{
    kvt__prom_out_t o = {buf, cap, 0};
    kvt_status_t st;

    if (e == NULL || len_p == NULL || (buf == NULL && cap > 0))
        return KVT_ERR_INVALID_PARAM;
    st = kvt__prom_engine(e, &o, 1);
    if (st != KVT_OK)
        return st;
    *len_p = o.len;
    if (o.len >= cap) {
        if (cap > 0)
            buf[cap - 1] = '\0';
        return KVT_ERR_NO_SPACE;
    }
    return KVT_OK;
}
