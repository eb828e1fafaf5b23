/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connector's metrics (kvt/metrics.h): its rooms by state, the time
 * they spend in each, and the tail of prefill rooms; as a struct and as
 * /metrics text (the process's listener asks through
 * kvt_metrics_source_add()).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <kvt/metrics.h>

#include "conn_int.h"

#define LOAD(a) atomic_load_explicit(&(a), memory_order_relaxed)

kvt_status_t kvt_conn_stats(kvt_conn_h c, kvt_conn_stats_t *out)
{
    const kvtc__conn_stats_t *st;

    if (c == NULL || out == NULL)
        return KVT_ERR_INVALID_PARAM;
    uint32_t version = out->version;

    /* Version 2 changed kvt_engine_stats_t only: both read the same. */
    if (version != 1 && version != KVT_STATS_VERSION)
        return KVT_ERR_VERSION;
    st = &c->stats;
    memset(out, 0, sizeof(*out));
    out->version = version;
    for (unsigned i = 0; i < 5; i++) {
        out->rooms[i] = LOAD(st->rooms[i]);
        out->entered[i] = LOAD(st->entered[i]);
        out->left[i] = LOAD(st->left[i]);
        out->state_ns[i] = LOAD(st->state_ns[i]);
    }
    for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++)
        out->tail[b] = LOAD(st->tail[b]);
    out->tail_sum_ns = LOAD(st->tail_ns);
    out->tails = LOAD(st->tails);
    return KVT_OK;
}

typedef struct {
    char *buf;
    size_t cap, len;
} out_t;

__attribute__((format(printf, 2, 3))) static void put(out_t *o, const char *fmt,
                                                      ...)
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

/* A label value with \\, " and newlines escaped. */
static void label_escape(char *dst, size_t cap, const char *src)
{
    size_t k = 0;

    for (; *src != '\0' && k + 3 < cap; src++) {
        if (*src == '\\' || *src == '"' || *src == '\n') {
            dst[k++] = '\\';
            dst[k++] = *src == '\n' ? 'n' : *src;
        } else {
            dst[k++] = *src;
        }
    }
    dst[k] = '\0';
}

static const char *const state_name[5] = {
    "failed", "bootstrapping", "waiting_for_input", "transferring", "success"};

size_t kvtc__conn_metrics_text(void *owner, char *buf, size_t cap, int meta)
{
    kvt_conn_h c = owner;
    kvt_conn_stats_t s = {.version = KVT_STATS_VERSION};
    char en[2 * KVTC__NAME_MAX + 2];
    out_t o = {buf, cap, 0};
    uint64_t cum = 0;

    kvt_conn_stats(c, &s);
    label_escape(en, sizeof(en), kvt_engine_segment_name(c->engine));
    if (meta)
        put(&o, "# HELP kvt_conn_rooms Connector rooms by state now.\n"
                "# TYPE kvt_conn_rooms gauge\n");
    for (unsigned i = 0; i < 5; i++)
        put(&o, "kvt_conn_rooms{engine=\"%s\",state=\"%s\"} %llu\n", en,
            state_name[i], (unsigned long long)s.rooms[i]);
    if (meta)
        put(&o, "# HELP kvt_conn_rooms_entered_total Rooms that entered each "
                "state.\n# TYPE kvt_conn_rooms_entered_total counter\n");
    for (unsigned i = 0; i < 5; i++)
        put(&o,
            "kvt_conn_rooms_entered_total{engine=\"%s\",state=\"%s\"} "
            "%llu\n",
            en, state_name[i], (unsigned long long)s.entered[i]);
    if (meta)
        put(&o, "# HELP kvt_conn_room_state_seconds_total Time rooms spent "
                "in each state they left.\n"
                "# TYPE kvt_conn_room_state_seconds_total counter\n");
    for (unsigned i = 0; i < 5; i++)
        put(&o,
            "kvt_conn_room_state_seconds_total{engine=\"%s\",state=\"%s\"}"
            " %.9f\n",
            en, state_name[i], (double)s.state_ns[i] / 1e9);
    if (meta)
        put(&o, "# HELP kvt_conn_rooms_left_total Rooms that left each "
                "state.\n# TYPE kvt_conn_rooms_left_total counter\n");
    for (unsigned i = 0; i < 5; i++)
        put(&o, "kvt_conn_rooms_left_total{engine=\"%s\",state=\"%s\"} %llu\n",
            en, state_name[i], (unsigned long long)s.left[i]);
    if (meta)
        put(&o, "# HELP kvt_conn_tail_seconds Prefill rooms: from the last "
                "blocks handed over to success.\n"
                "# TYPE kvt_conn_tail_seconds histogram\n");
    for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++) {
        uint64_t us = kvt_stats_latency_bound_us(b);
        cum += s.tail[b];
        if (us != 0)
            put(&o,
                "kvt_conn_tail_seconds_bucket{engine=\"%s\",le=\"%g\"} "
                "%llu\n",
                en, (double)us / 1e6, (unsigned long long)cum);
        else
            put(&o,
                "kvt_conn_tail_seconds_bucket{engine=\"%s\",le=\"+Inf\"} "
                "%llu\n",
                en, (unsigned long long)cum);
    }
    put(&o,
        "kvt_conn_tail_seconds_sum{engine=\"%s\"} %.9f\n"
        "kvt_conn_tail_seconds_count{engine=\"%s\"} %llu\n",
        en, (double)s.tail_sum_ns / 1e9, en, (unsigned long long)s.tails);
    return o.len;
}
