/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_METRICS_H
#define KVT_METRICS_H

/*
 * Metrics of an engine: what it moved, how fast its transfers completed,
 * what failed and why, and its sessions and notifications, as a struct
 * (kvt_engine_stats()) and as Prometheus text (kvt_engine_metrics_text(),
 * and the optional /metrics listener below). Counting costs the data path
 * a clock read per submission and per descriptor and a few relaxed
 * increments on per-thread counters; none of it takes a lock.
 *
 * Counters only grow from the engine's creation (a reader computes rates
 * from two readings); gauges are the state at the reading. Per transport,
 * in the order kvt_engine_stats() lists them; peers are not labelled (the
 * cardinality stays bounded whatever the number of peers).
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/connector.h>
#include <kvt/defs.h>
#include <kvt/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The struct's version; a caller sets stats.version to the version it was
 * built with, and kvt fills what that version has (version 1: everything
 * before `served`). */
#define KVT_STATS_VERSION 2

#define KVT_STATS_TRANSPORTS 8
/* Descriptors by size class: up to 4 KiB, up to 64 KiB, up to 1 MiB,
 * larger (the bytes a descriptor moves: length x count). */
#define KVT_STATS_SIZE_CLASSES 4
/* Completion latency buckets, from submission to the descriptor's final
 * state: upper bounds kvt_stats_latency_bound_us() (10 us to 10 s, a
 * 1-2-5 series); the last bucket has no bound. */
#define KVT_STATS_LATENCY_BUCKETS 20
/* Failures by status: index -status, for the statuses of kvt/status.h
 * (the last index counts any other). */
#define KVT_STATS_STATUSES 32

typedef struct {
    char name[16]; /* "tcp", "shm", "ucx" */
    /* Descriptors completed with KVT_OK, and their bytes. */
    uint64_t writes, reads, notifies;
    uint64_t write_bytes, read_bytes;
    /* Descriptors that failed, by status (index -status). */
    uint64_t failures[KVT_STATS_STATUSES];
    /* Completion latency of every descriptor (failed ones included) by
     * size class: counts per bucket (not cumulative), and the sum. */
    uint64_t latency[KVT_STATS_SIZE_CLASSES][KVT_STATS_LATENCY_BUCKETS];
    uint64_t latency_sum_ns[KVT_STATS_SIZE_CLASSES];
    /* Sessions to peers: opened in all, and those that exist now (gauge;
     * a failed one until its segment is freed). */
    uint64_t sessions_opened;
    uint64_t sessions_open;
} kvt_transport_stats_t;

/* One-sided transfers that peers made into this engine's memory (version
 * 2): writes that landed and reads that were served, and their bytes,
 * counted at this engine, the target. The target sees pieces, not the
 * initiators' descriptors: a descriptor cut into slices (tcp) or jobs
 * (shm) counts once per piece; bytes are exact. tcp counts what its workers
 * received and sent; shm what same-host peers copied (each counts in the
 * channel it shares with this engine, read from here); ucx moves bytes
 * by RDMA without this engine's CPU and counts nothing here. */
typedef struct {
    uint64_t writes, reads;
    uint64_t write_bytes, read_bytes;
} kvt_served_stats_t;

typedef struct {
    uint32_t version; /* in: KVT_STATS_VERSION; out: what kvt filled */
    uint32_t ntransports;
    /* Submissions (kvt_batch_submit() calls with descriptors) and the
     * descriptors in them. */
    uint64_t batches, descriptors;
    /* Descriptors submitted and not yet final (gauge). */
    uint64_t inflight;
    /* Descriptors refused before any transport took them (bad
     * parameters, unknown segment, no route), by status (index -status). */
    uint64_t refused[KVT_STATS_STATUSES];
    /* Notifications received from peers, and dropped (their sender over
     * its quota, or the queue full: docs/protocol.md). */
    uint64_t notifies_received, notifies_dropped;
    /* Handshakes that failed: peers this engine refused (counting the
     * connections it closed before their HELLO at its connection cap or
     * for want of descriptors), and peers that refused it or could not be
     * reached. */
    uint64_t handshakes_refused, handshakes_failed;
    /* Remote segments open now (gauge); local memory registered now
     * (gauges). */
    uint64_t segments_open;
    uint64_t regions, region_bytes;
    kvt_transport_stats_t transports[KVT_STATS_TRANSPORTS];
    /* Version 2: per transport, in the same order, what peers moved into
     * and out of this engine's memory. */
    kvt_served_stats_t served[KVT_STATS_TRANSPORTS];
} kvt_engine_stats_t;

/*
 * kvt_engine_stats() - the engine's metrics into @stats (stats->version
 * set by the caller). Any thread; takes the registry's read lock and the
 * segment table's lock for a moment, never waits for a transfer.
 * Counters are read without locks, so those of one call may be a few
 * completions apart. Fills what @stats->version has (1 or 2) and nothing
 * past it. Returns KVT_OK; KVT_ERR_VERSION for a version this library
 * does not know; KVT_ERR_INVALID_PARAM for NULL arguments.
 */
KVT_API kvt_status_t kvt_engine_stats(kvt_engine_h e,
                                      kvt_engine_stats_t *stats);

/* The upper bound of latency bucket @i in microseconds (0 for the last,
 * unbounded one). */
KVT_API uint64_t kvt_stats_latency_bound_us(unsigned i);

/*
 * kvt_engine_metrics_text() - the engine's metrics in the Prometheus text
 * exposition format (version 0.0.4), names kvt_*, each sample labelled
 * with engine="<its segment name>" and, where per transport,
 * transport="...": into @buf (nul-terminated) when @cap allows, and its
 * length (without the nul) into *len_p either way. Returns KVT_OK;
 * KVT_ERR_NO_SPACE when @cap is too small (then call again with *len_p +
 * 1; @buf may be NULL with @cap 0 to learn the length);
 * KVT_ERR_INVALID_PARAM for a NULL engine or @len_p, or a NULL @buf with
 * @cap > 0; KVT_ERR_NO_MEMORY. Any thread; as kvt_engine_stats().
 */
KVT_API kvt_status_t kvt_engine_metrics_text(kvt_engine_h e, char *buf,
                                             size_t cap, size_t *len_p);

/*
 * A connector's rooms: how many are in each state now (indexed by
 * kvt_poll_t), how many entered and left each state, the time rooms
 * spent in each state they left (the mean time in a state is
 * state_ns / left), and the tail of prefill rooms: from the moment their
 * last blocks were handed over (kvt_sender_send*() with the last ones)
 * to success, as a histogram with the latency buckets above.
 */
typedef struct {
    uint32_t version; /* in: KVT_STATS_VERSION */
    uint32_t reserved;
    uint64_t rooms[5], entered[5], left[5], state_ns[5];
    uint64_t tail[KVT_STATS_LATENCY_BUCKETS];
    uint64_t tail_sum_ns, tails;
} kvt_conn_stats_t;

/*
 * kvt_conn_stats() - @conn's room metrics into @stats (version set by the
 * caller). Any thread; does not block. Returns KVT_OK; KVT_ERR_VERSION
 * for a version this library does not know; KVT_ERR_INVALID_PARAM for
 * NULL arguments. The /metrics listener serves them too (kvt_conn_*
 * families, labelled with the connector's engine).
 */
KVT_API kvt_status_t kvt_conn_stats(kvt_conn_h conn, kvt_conn_stats_t *stats);

/*
 * The /metrics listener: one per process, serving the text of every live
 * engine of the process (each with its engine label) at GET /metrics,
 * and "ok" at GET /health. Started by the first engine created when
 * KVT_METRICS_PORT is set in the environment (0 picks a free port), bound
 * to 127.0.0.1 unless KVT_METRICS_HOST names another address; or by
 * kvt_metrics_listen(). It runs on a thread of its own until the process
 * ends; each request must arrive within 2 s and its answer be read
 * within 10 s more (else the connection is dropped), at most 64
 * connections at once, one answer per connection. It never blocks an
 * engine.
 *
 * kvt_metrics_listen() starts it on @host (NULL: 127.0.0.1) and @port,
 * and says the port it got in *port_p (may be NULL). Returns KVT_OK;
 * KVT_ERR_EXISTS when one runs already (its port in *port_p);
 * KVT_ERR_IO when the address cannot be bound (logged); KVT_ERR_NO_MEMORY
 * when its thread cannot start. kvt_metrics_port() is the port it
 * serves, 0 when none runs. Thread-safe.
 */
KVT_API kvt_status_t kvt_metrics_listen(const char *host, uint16_t port,
                                        uint16_t *port_p);
KVT_API uint16_t kvt_metrics_port(void);

typedef size_t (*kvt_metrics_text_fn)(void *owner, char *buf, size_t cap,
                                      int meta);

/*
 * More text for the /metrics listener (the connector's rooms; an
 * application's own): each scrape calls @fn(@owner, buf, cap, meta)
 * after the engines' text, from the listener's thread; @fn writes
 * samples into @buf as snprintf() does (@buf may be NULL with @cap 0) and
 * returns the length they need; @meta is 1 for the first source of a
 * scrape (write HELP and TYPE lines then), else 0. @fn must not block
 * nor call the kvt_metrics_* functions.
 *
 * kvt_metrics_source_add() returns KVT_OK; KVT_ERR_INVALID_PARAM for a
 * NULL @owner or @fn; KVT_ERR_NO_MEMORY. kvt_metrics_source_del()
 * removes @owner, and once it returns no scrape calls its @fn. Both
 * thread-safe.
 */
KVT_API kvt_status_t kvt_metrics_source_add(void *owner,
                                            kvt_metrics_text_fn fn);
KVT_API void kvt_metrics_source_del(void *owner);

#ifdef __cplusplus
}
#endif

#endif
