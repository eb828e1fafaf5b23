/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Engine metrics (include/kvt/metrics.h): the sharded counters, the
 * struct and Prometheus renderings, and the process's /metrics listener.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "core/stats.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/thread.h"
#include "util/time.h"

/* ---- Counting ------------------------------------------------------------ */

static _Atomic uint64_t next_id = 1, next_thread = 1;
/* The calling thread's state, in one thread-local object (its address is
 * computed once per call: in a shared library each thread-local access
 * may cost a call). */
#define TCACHE 4
typedef struct {
    uint64_t thread; /* this thread's number, 0 until it counts */
    /* Its blocks of the last engines it counted for. */
    struct {
        uint64_t id;
        kvt__stats_shard_t *b;
    } cache[TCACHE];
    unsigned next;
    /* Inside kvt__comp_run_begin()/end(): the moment of the run, read on
     * its first use (0: not yet). */
    int in_run;
    uint64_t run_now;
} tls_t;
static _Thread_local tls_t tls;

void kvt__comp_run_begin(void)
{
    tls_t *t = &tls;

    t->in_run = 1;
    t->run_now = 0;
}

void kvt__comp_run_end(void)
{
    tls.in_run = 0;
}

static kvt__stats_shard_t *shard_of(kvt__stats_t *st, tls_t *t)
{
    kvt__stats_shard_t *b;

    if (!st->on)
        return NULL;
    for (unsigned i = 0; i < TCACHE; i++)
        if (t->cache[i].id == st->id)
            return t->cache[i].b;
    if (t->thread == 0)
        t->thread = atomic_fetch_add(&next_thread, 1);
    /* Counted for this engine before (the cache forgot it), or a new
     * block, pushed onto the engine's list. */
    for (b = atomic_load_explicit(&st->shards, memory_order_acquire);
         b != NULL && b->owner != t->thread; b = b->next)
        ;
    if (b == NULL) {
        if (posix_memalign((void **)&b, 64, sizeof(*b)) != 0)
            return NULL;
        memset(b, 0, sizeof(*b));
        b->owner = t->thread;
        b->next = atomic_load_explicit(&st->shards, memory_order_relaxed);
        while (!atomic_compare_exchange_weak_explicit(&st->shards, &b->next, b,
                                                      memory_order_release,
                                                      memory_order_relaxed))
            ;
    }
    t->cache[t->next].id = st->id;
    t->cache[t->next].b = b;
    t->next = (t->next + 1) % TCACHE;
    return b;
}

kvt__stats_shard_t *kvt__stats_shard(kvt__stats_t *st)
{
    return shard_of(st, &tls);
}

/* The TSC, where it runs at a constant rate through every power state
 * (constant_tsc and nonstop_tsc in /proc/cpuinfo), calibrated against
 * CLOCK_MONOTONIC once; else CLOCK_MONOTONIC itself. */
static pthread_once_t tsc_once = PTHREAD_ONCE_INIT;
static int tsc_on;
static double ns_per_tick = 1.0;

#if defined(__x86_64__)
#include <x86intrin.h>
static void tsc_init(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    int c = 0, n = 0;
    uint64_t t0, t1, r0, r1;

    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL && !(c && n))
        if (strncmp(line, "flags", 5) == 0) {
            c = strstr(line, " constant_tsc") != NULL;
            n = strstr(line, " nonstop_tsc") != NULL;
            break;
        }
    fclose(f);
    if (!c || !n)
        return;
    t0 = kvt__now_ns();
    r0 = __rdtsc();
    do
        t1 = kvt__now_ns();
    while (t1 - t0 < 2000000);
    r1 = __rdtsc();
    if (r1 <= r0)
        return;
    ns_per_tick = (double)(t1 - t0) / (double)(r1 - r0);
    tsc_on = 1;
}

uint64_t kvt__stats_ticks(void)
{
    return tsc_on ? __rdtsc() : kvt__now_ns();
}
#else
static void tsc_init(void)
{
}

uint64_t kvt__stats_ticks(void)
{
    return kvt__now_ns();
}
#endif

/* Latency bucket bounds, microseconds: 10 us to 10 s in a 1-2-5 series. */
static const uint64_t bounds_us[KVT_STATS_LATENCY_BUCKETS - 1] = {
    10,     20,      50,      100,     200,     500,    1000,
    2000,   5000,    10000,   20000,   50000,   100000, 200000,
    500000, 1000000, 2000000, 5000000, 10000000};

uint64_t kvt_stats_latency_bound_us(unsigned i)
{
    return i < KVT_STATS_LATENCY_BUCKETS - 1 ? bounds_us[i] : 0;
}

static unsigned size_class(uint64_t bytes)
{
    return bytes <= 4096 ? 0 : bytes <= 65536 ? 1 : bytes <= (1u << 20) ? 2 : 3;
}

static unsigned bucket_of(uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned i = 0;

    while (i < KVT_STATS_LATENCY_BUCKETS - 1 && us > bounds_us[i])
        i++;
    return i;
}

void kvt__stats_done(kvt__stats_t *st, unsigned tl, unsigned op, uint64_t bytes,
                     uint64_t t0, int32_t status)
{
    tls_t *t = &tls;
    kvt__stats_shard_t *sh = shard_of(st, t);
    kvt__tl_ctr_t *c;
    uint64_t ns, now;
    unsigned sc;

    if (sh == NULL)
        return;
    if (tl >= KVT__STATS_TL) {
        KVT__BUMP(sh->refused[kvt__stats_status_index(status)], 1);
        return;
    }
    c = &sh->tl[tl];
    if (status == KVT_OK) {
        unsigned k = op == KVT_OP_WRITE ? 0 : op == KVT_OP_READ ? 1 : 2;
        KVT__BUMP(c->ops[k], 1);
        if (k < 2)
            KVT__BUMP(c->bytes[k], bytes);
    } else {
        KVT__BUMP(c->fail[kvt__stats_status_index(status)], 1);
    }
    if (t->in_run) {
        if (t->run_now == 0)
            t->run_now = kvt__stats_ticks();
        now = t->run_now;
    } else {
        now = kvt__stats_ticks();
    }
    ns = now > t0 ? (uint64_t)((double)(now - t0) * ns_per_tick) : 0;
    sc = size_class(bytes);
    KVT__BUMP(c->lat[sc][bucket_of(ns)], 1);
    KVT__BUMP(c->lat_sum[sc], ns);
}

#define LOAD(a) atomic_load_explicit(&(a), memory_order_relaxed)

kvt_status_t kvt_engine_stats(kvt_engine_h e, kvt_engine_stats_t *out)
{
    kvt__stats_t *st;
    uint64_t done = 0;

    if (e == NULL || out == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (out->version != KVT_STATS_VERSION)
        return KVT_ERR_VERSION;
    st = &e->stats;
    memset(out, 0, sizeof(*out));
    out->version = KVT_STATS_VERSION;
    out->ntransports =
        e->ntl < KVT_STATS_TRANSPORTS ? e->ntl : KVT_STATS_TRANSPORTS;
    for (unsigned t = 0; t < out->ntransports; t++) {
        kvt_transport_stats_t *o = &out->transports[t];
        snprintf(o->name, sizeof(o->name), "%s", e->tl[t]->ops->name);
        o->sessions_opened = LOAD(st->sess_opened[t]);
        o->sessions_open = o->sessions_opened - LOAD(st->sess_closed[t]);
    }
    for (kvt__stats_shard_t *sh =
             atomic_load_explicit(&st->shards, memory_order_acquire);
         sh != NULL; sh = sh->next) {
        out->batches += LOAD(sh->batches);
        out->descriptors += LOAD(sh->descs);
        for (unsigned i = 0; i < KVT_STATS_STATUSES; i++) {
            uint64_t v = LOAD(sh->refused[i]);
            out->refused[i] += v;
            done += v;
        }
        for (unsigned t = 0; t < out->ntransports; t++) {
            kvt__tl_ctr_t *c = &sh->tl[t];
            kvt_transport_stats_t *o = &out->transports[t];
            uint64_t w = LOAD(c->ops[0]), r = LOAD(c->ops[1]),
                     n = LOAD(c->ops[2]);
            o->writes += w;
            o->reads += r;
            o->notifies += n;
            done += w + r + n;
            o->write_bytes += LOAD(c->bytes[0]);
            o->read_bytes += LOAD(c->bytes[1]);
            for (unsigned i = 0; i < KVT_STATS_STATUSES; i++) {
                uint64_t v = LOAD(c->fail[i]);
                o->failures[i] += v;
                done += v;
            }
            for (unsigned s = 0; s < KVT_STATS_SIZE_CLASSES; s++) {
                for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++)
                    o->latency[s][b] += LOAD(c->lat[s][b]);
                o->latency_sum_ns[s] += LOAD(c->lat_sum[s]);
            }
        }
    }
    /* Read in this order, completions may be counted that their
     * submission was not yet: never below 0. */
    out->inflight = out->descriptors > done ? out->descriptors - done : 0;
    out->notifies_received = LOAD(st->notifies_received);
    out->notifies_dropped = LOAD(st->notifies_dropped);
    out->handshakes_refused = LOAD(st->hs_refused);
    out->handshakes_failed = LOAD(st->hs_failed);
    pthread_mutex_lock(&e->sess_lock);
    out->segments_open = e->nnames;
    pthread_mutex_unlock(&e->sess_lock);
    kvt__memreg_rdlock(&e->reg);
    out->regions = kvt__memreg_count_locked(&e->reg);
    for (size_t i = 0; i < out->regions; i++) {
        const kvt__region_t *r = kvt__memreg_at_locked(&e->reg, i);
        out->region_bytes += r->end - r->start;
    }
    kvt__memreg_unlock(&e->reg);
    return KVT_OK;
}

/* ---- Prometheus text ----------------------------------------------------- */

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

static void head(out_t *o, const char *name, const char *type, const char *help,
                 int with_meta)
{
    if (with_meta)
        put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *const size_label[KVT_STATS_SIZE_CLASSES] = {
    "le_4KiB", "le_64KiB", "le_1MiB", "gt_1MiB"};

/* The text of one engine; @meta: with HELP and TYPE lines (once per
 * metric family in a scrape: the first engine's). */
static void render(kvt_engine_h e, const kvt_engine_stats_t *s, out_t *o,
                   int meta)
{
    char en[2 * KVT_WIRE_NAME_MAX + 2];
    static const char *const opname[3] = {"write", "read", "notify"};

    label_escape(en, sizeof(en), e->cfg.seg_name);

    head(o, "kvt_transfer_descriptors_total", "counter",
         "Descriptors completed successfully, by transport and operation.",
         meta);
    for (unsigned t = 0; t < s->ntransports; t++) {
        const kvt_transport_stats_t *x = &s->transports[t];
        const uint64_t v[3] = {x->writes, x->reads, x->notifies};
        for (unsigned k = 0; k < 3; k++)
            put(o,
                "kvt_transfer_descriptors_total{engine=\"%s\",transport=\"%s\","
                "op=\"%s\"} %llu\n",
                en, x->name, opname[k], (unsigned long long)v[k]);
    }
    head(o, "kvt_transfer_bytes_total", "counter",
         "Bytes moved by descriptors completed successfully.", meta);
    for (unsigned t = 0; t < s->ntransports; t++) {
        const kvt_transport_stats_t *x = &s->transports[t];
        put(o,
            "kvt_transfer_bytes_total{engine=\"%s\",transport=\"%s\","
            "op=\"write\"} %llu\n"
            "kvt_transfer_bytes_total{engine=\"%s\",transport=\"%s\","
            "op=\"read\"} %llu\n",
            en, x->name, (unsigned long long)x->write_bytes, en, x->name,
            (unsigned long long)x->read_bytes);
    }
    head(o, "kvt_transfer_failures_total", "counter",
         "Descriptors that failed, by transport and status.", meta);
    for (unsigned t = 0; t < s->ntransports; t++) {
        const kvt_transport_stats_t *x = &s->transports[t];
        for (unsigned i = 1; i < KVT_STATS_STATUSES; i++)
            if (x->failures[i] != 0)
                put(o,
                    "kvt_transfer_failures_total{engine=\"%s\",transport=\"%"
                    "s\","
                    "status=\"%s\"} %llu\n",
                    en, x->name, kvt_status_name(-(int)i),
                    (unsigned long long)x->failures[i]);
    }
    head(o, "kvt_transfer_refused_total", "counter",
         "Descriptors refused before any transport took them, by status.",
         meta);
    for (unsigned i = 1; i < KVT_STATS_STATUSES; i++)
        if (s->refused[i] != 0)
            put(o,
                "kvt_transfer_refused_total{engine=\"%s\",status=\"%s\"} "
                "%llu\n",
                en, kvt_status_name(-(int)i),
                (unsigned long long)s->refused[i]);
    head(o, "kvt_transfer_latency_seconds", "histogram",
         "Time from submission to the final state of each descriptor, by "
         "transport and size class.",
         meta);
    for (unsigned t = 0; t < s->ntransports; t++) {
        const kvt_transport_stats_t *x = &s->transports[t];
        for (unsigned c = 0; c < KVT_STATS_SIZE_CLASSES; c++) {
            uint64_t cum = 0;
            for (unsigned b = 0; b < KVT_STATS_LATENCY_BUCKETS; b++) {
                cum += x->latency[c][b];
                if (b + 1 < KVT_STATS_LATENCY_BUCKETS)
                    put(o,
                        "kvt_transfer_latency_seconds_bucket{engine=\"%s\","
                        "transport=\"%s\",size=\"%s\",le=\"%g\"} %llu\n",
                        en, x->name, size_label[c], (double)bounds_us[b] / 1e6,
                        (unsigned long long)cum);
                else
                    put(o,
                        "kvt_transfer_latency_seconds_bucket{engine=\"%s\","
                        "transport=\"%s\",size=\"%s\",le=\"+Inf\"} %llu\n",
                        en, x->name, size_label[c], (unsigned long long)cum);
            }
            put(o,
                "kvt_transfer_latency_seconds_sum{engine=\"%s\","
                "transport=\"%s\",size=\"%s\"} %.9f\n"
                "kvt_transfer_latency_seconds_count{engine=\"%s\","
                "transport=\"%s\",size=\"%s\"} %llu\n",
                en, x->name, size_label[c], (double)x->latency_sum_ns[c] / 1e9,
                en, x->name, size_label[c], (unsigned long long)cum);
        }
    }
    head(o, "kvt_batches_total", "counter",
         "Submissions of descriptors (kvt_batch_submit calls).", meta);
    put(o, "kvt_batches_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->batches);
    head(o, "kvt_descriptors_submitted_total", "counter",
         "Descriptors submitted.", meta);
    put(o, "kvt_descriptors_submitted_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->descriptors);
    head(o, "kvt_descriptors_inflight", "gauge",
         "Descriptors submitted and not yet final.", meta);
    put(o, "kvt_descriptors_inflight{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->inflight);
    head(o, "kvt_sessions_opened_total", "counter",
         "Sessions opened to peers, by transport.", meta);
    for (unsigned t = 0; t < s->ntransports; t++)
        put(o,
            "kvt_sessions_opened_total{engine=\"%s\",transport=\"%s\"} "
            "%llu\n",
            en, s->transports[t].name,
            (unsigned long long)s->transports[t].sessions_opened);
    head(o, "kvt_sessions_open", "gauge", "Sessions to peers open now.", meta);
    for (unsigned t = 0; t < s->ntransports; t++)
        put(o, "kvt_sessions_open{engine=\"%s\",transport=\"%s\"} %llu\n", en,
            s->transports[t].name,
            (unsigned long long)s->transports[t].sessions_open);
    head(o, "kvt_segments_open", "gauge", "Remote segments open now.", meta);
    put(o, "kvt_segments_open{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->segments_open);
    head(o, "kvt_notifications_received_total", "counter",
         "Notifications received from peers.", meta);
    put(o, "kvt_notifications_received_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->notifies_received);
    head(o, "kvt_notifications_dropped_total", "counter",
         "Notifications dropped because the queue was full.", meta);
    put(o, "kvt_notifications_dropped_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->notifies_dropped);
    head(o, "kvt_handshakes_refused_total", "counter",
         "Handshakes of peers this engine refused.", meta);
    put(o, "kvt_handshakes_refused_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->handshakes_refused);
    head(o, "kvt_handshake_failures_total", "counter",
         "Handshakes with peers that failed (refused, unreachable).", meta);
    put(o, "kvt_handshake_failures_total{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->handshakes_failed);
    head(o, "kvt_registered_regions", "gauge",
         "Local memory regions registered now.", meta);
    put(o, "kvt_registered_regions{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->regions);
    head(o, "kvt_registered_bytes", "gauge",
         "Bytes of local memory registered now.", meta);
    put(o, "kvt_registered_bytes{engine=\"%s\"} %llu\n", en,
        (unsigned long long)s->region_bytes);
}

/* One engine's text into @o; @meta as for render(). */
static kvt_status_t engine_text(kvt_engine_h e, out_t *o, int meta)
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
    out_t o = {buf, cap, 0};
    kvt_status_t st;

    if (e == NULL || len_p == NULL || (buf == NULL && cap > 0))
        return KVT_ERR_INVALID_PARAM;
    st = engine_text(e, &o, 1);
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

/* ---- The process's engines and its /metrics listener --------------------- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static kvt_engine_h *engines;
static size_t nengines, cengines;
static struct provider {
    void *owner;
    kvt_metrics_text_fn fn;
} * providers;
static size_t nproviders, cproviders;
static int lst_fd = -1;
static uint16_t lst_port;
static pthread_t lst_thread;
static int env_tried;

#define MAX_CLIENTS 64
#define REQ_MAX 4096
#define REQ_NS (2000ull * 1000000ull)
/* A client has this long from the end of its request to take the whole
 * answer; one that reads slower, or not at all, is dropped then. The
 * answer is sent as the socket takes it, between the other clients'
 * turns, so that a slow client never stalls the thread. */
#define SEND_NS (10000ull * 1000000ull)

/* The text of every live engine, malloc'd into *buf_p. */
static size_t all_text(char **buf_p)
{
    out_t o = {NULL, 0, 0};

    for (int pass = 0; pass < 2; pass++) {
        pthread_mutex_lock(&reg_lock);
        for (size_t i = 0; i < nengines; i++)
            engine_text(engines[i], &o, i == 0);
        for (size_t i = 0; i < nproviders; i++)
            o.len += providers[i].fn(providers[i].owner,
                                     o.len < o.cap ? o.buf + o.len : NULL,
                                     o.len < o.cap ? o.cap - o.len : 0, i == 0);
        pthread_mutex_unlock(&reg_lock);
        if (pass == 0) {
            /* Room for what may have grown in between. */
            o.cap = o.len + 65536;
            o.buf = malloc(o.cap);
            if (o.buf == NULL)
                return 0;
            o.len = 0;
        }
    }
    if (o.len >= o.cap)
        o.len = o.cap - 1;
    o.buf[o.len] = '\0';
    *buf_p = o.buf;
    return o.len;
}

typedef struct {
    int fd;
    uint64_t deadline; /* of its request, then of its answer */
    size_t got;
    char req[REQ_MAX];
    /* The answer, once the request is read: the header, then the body
     * (malloc'd), @off bytes of both sent so far. */
    int answering;
    char hdr[256];
    size_t hlen, off;
    char *body;
    size_t blen;
} client_t;

/* Send what the socket takes of @c's answer now. Returns 1 when the
 * answer is sent or the client is gone, 0 when the socket is full. */
static int answer_more(client_t *c)
{
    while (c->off < c->hlen + c->blen) {
        struct iovec iov[2];
        struct msghdr mh = {.msg_iov = iov};
        ssize_t w;

        if (c->off < c->hlen) {
            iov[0] = (struct iovec){c->hdr + c->off, c->hlen - c->off};
            iov[1] = (struct iovec){c->body, c->blen};
            mh.msg_iovlen = c->blen > 0 ? 2 : 1;
        } else {
            iov[0] = (struct iovec){c->body + (c->off - c->hlen),
                                    c->blen - (c->off - c->hlen)};
            mh.msg_iovlen = 1;
        }
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (w <= 0)
            return 1;
        c->off += (size_t)w;
    }
    return 1;
}

/* Prepare the answer to @c's request, and send what fits now. Returns as
 * answer_more(). */
static int answer(client_t *c, uint64_t now)
{
    const char *type = "text/plain; charset=utf-8", *status = "200 OK";
    int is_get = strncmp(c->req, "GET ", 4) == 0;

    c->body = NULL;
    c->blen = 0;
    if (is_get && (strncmp(c->req + 4, "/metrics ", 9) == 0 ||
                   strncmp(c->req + 4, "/metrics?", 9) == 0)) {
        c->blen = all_text(&c->body);
        type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (is_get && strncmp(c->req + 4, "/health ", 8) == 0) {
        c->body = strdup("ok\n");
        c->blen = c->body != NULL ? 3 : 0;
    } else {
        status = is_get ? "404 Not Found" : "405 Method Not Allowed";
    }
    if (is_get && c->body == NULL && strcmp(status, "200 OK") == 0)
        status = "503 Service Unavailable"; /* out of memory */
    c->hlen = (size_t)snprintf(
        c->hdr, sizeof(c->hdr),
        "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
        "Connection: close\r\n\r\n",
        status, type, c->blen);
    c->off = 0;
    c->answering = 1;
    c->deadline = now + SEND_NS;
    return answer_more(c);
}

static void *lst_main(void *arg)
{
    static client_t cl[MAX_CLIENTS];
    struct pollfd pf[MAX_CLIENTS + 1];
    unsigned n = 0;

    kvt__thread_name("kvt-stats");
    (void)arg;
    for (;;) {
        uint64_t now = kvt__now_ns();
        int r;
        pf[0] = (struct pollfd){.fd = lst_fd,
                                .events = n < MAX_CLIENTS ? POLLIN : 0};
        for (unsigned i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){
                .fd = cl[i].fd, .events = cl[i].answering ? POLLOUT : POLLIN};
        r = poll(pf, n + 1, 200);
        if (r < 0 && errno != EINTR)
            break;
        now = kvt__now_ns();
        for (unsigned i = 0; i < n;) {
            client_t *c = &cl[i];
            int done = 0;
            if (c->answering) {
                if (pf[i + 1].revents != 0)
                    done = answer_more(c);
            } else if (pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t got = recv(c->fd, c->req + c->got, REQ_MAX - 1 - c->got,
                                   MSG_DONTWAIT);
                if (got <= 0) {
                    done = got == 0 || (errno != EAGAIN && errno != EINTR);
                } else {
                    c->got += (size_t)got;
                    c->req[c->got] = '\0';
                    if (strstr(c->req, "\r\n\r\n") != NULL ||
                        strstr(c->req, "\n\n") != NULL) {
                        done = answer(c, now);
                    } else if (c->got >= REQ_MAX - 1) {
                        done = 1; /* too long: dropped */
                    }
                }
            }
            if (!done && now >= c->deadline)
                done = 1; /* too slow: dropped */
            if (done) {
                close(c->fd);
                free(c->body);
                cl[i] = cl[--n];
                pf[i + 1] = pf[n + 1];
                continue;
            }
            i++;
        }
        if ((pf[0].revents & POLLIN) && n < MAX_CLIENTS) {
            int fd = accept4(lst_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                cl[n].fd = fd;
                cl[n].got = 0;
                cl[n].answering = 0;
                cl[n].body = NULL;
                cl[n].deadline = now + REQ_NS;
                n++;
            } else if (errno == EMFILE || errno == ENFILE) {
                usleep(100000); /* at the descriptor limit: back off */
            }
        }
    }
    return NULL;
}

kvt_status_t kvt_metrics_listen(const char *host, uint16_t port,
                                uint16_t *port_p)
{
    kvt_status_t st = KVT_OK;
    int fd = -1;

    pthread_mutex_lock(&reg_lock);
    if (lst_fd >= 0) {
        if (port_p != NULL)
            *port_p = lst_port;
        pthread_mutex_unlock(&reg_lock);
        return KVT_ERR_EXISTS;
    }
    st = kvt__sock_listen(host != NULL && host[0] != '\0' ? host : "127.0.0.1",
                          port, &fd, &port);
    if (st != KVT_OK)
        st = KVT_ERR_IO;
    if (st == KVT_OK) {
        lst_fd = fd;
        lst_port = port;
        if (pthread_create(&lst_thread, NULL, lst_main, NULL) != 0) {
            close(fd);
            lst_fd = -1;
            lst_port = 0;
            st = KVT_ERR_NO_MEMORY;
        } else {
            pthread_detach(lst_thread);
            KVT_LOG_I("metrics at http://%s:%u/metrics",
                      host != NULL && host[0] != '\0' ? host : "127.0.0.1",
                      port);
        }
    } else {
        KVT_LOG_E("metrics: cannot listen on %s:%u",
                  host != NULL && host[0] != '\0' ? host : "127.0.0.1", port);
    }
    if (st == KVT_OK && port_p != NULL)
        *port_p = port;
    pthread_mutex_unlock(&reg_lock);
    return st;
}

uint16_t kvt_metrics_port(void)
{
    uint16_t p;

    pthread_mutex_lock(&reg_lock);
    p = lst_fd >= 0 ? lst_port : 0;
    pthread_mutex_unlock(&reg_lock);
    return p;
}

kvt_status_t kvt__stats_init(kvt_engine_h e)
{
    kvt_engine_h *n;
    const char *port;
    int try_env = 0;

    const char *off = getenv("KVT_METRICS");

    /* KVT_METRICS=off: no counting on the data path (to measure what it
     * costs); the engine's metrics then read 0. */
    e->stats.on =
        !(off != NULL && (strcmp(off, "off") == 0 || strcmp(off, "0") == 0));
    e->stats.id = atomic_fetch_add(&next_id, 1);
    atomic_store(&e->stats.shards, NULL);
    pthread_once(&tsc_once, tsc_init);
    pthread_mutex_lock(&reg_lock);
    if (nengines == cengines) {
        size_t cap = cengines ? 2 * cengines : 8;
        n = realloc(engines, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&reg_lock);
            return KVT_ERR_NO_MEMORY;
        }
        engines = n;
        cengines = cap;
    }
    engines[nengines++] = e;
    if (!env_tried) {
        env_tried = 1;
        try_env = 1;
    }
    pthread_mutex_unlock(&reg_lock);
    port = getenv("KVT_METRICS_PORT");
    if (try_env && port != NULL && port[0] != '\0') {
        char *end;
        unsigned long p = strtoul(port, &end, 10);
        if (*end != '\0' || p > 65535)
            KVT_LOG_E("KVT_METRICS_PORT=%s is not a port", port);
        else
            kvt_metrics_listen(getenv("KVT_METRICS_HOST"), (uint16_t)p, NULL);
    }
    return KVT_OK;
}

kvt_status_t kvt_metrics_source_add(void *owner, kvt_metrics_text_fn fn)
{
    if (owner == NULL || fn == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&reg_lock);
    if (nproviders == cproviders) {
        size_t cap = cproviders ? 2 * cproviders : 4;
        struct provider *n = realloc(providers, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&reg_lock);
            return KVT_ERR_NO_MEMORY;
        }
        providers = n;
        cproviders = cap;
    }
    providers[nproviders++] = (struct provider){owner, fn};
    pthread_mutex_unlock(&reg_lock);
    return KVT_OK;
}

void kvt_metrics_source_del(void *owner)
{
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < nproviders; i++) {
        if (providers[i].owner == owner) {
            providers[i] = providers[--nproviders];
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}

void kvt__stats_unlist(kvt_engine_h e)
{
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < nengines; i++) {
        if (engines[i] == e) {
            engines[i] = engines[--nengines];
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}

void kvt__stats_fini(kvt_engine_h e)
{
    kvt__stats_shard_t *b = atomic_exchange(&e->stats.shards, NULL);

    kvt__stats_unlist(e);
    while (b != NULL) {
        kvt__stats_shard_t *n = b->next;
        free(b);
        b = n;
    }
}
