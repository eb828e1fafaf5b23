/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_METAD_CONN_H
#define KVT_META_METAD_CONN_H

/*
 * The connection policy of `kvt metad`, apart from libmicrohttpd: which
 * connections to drop so that careless or hostile clients cannot hold the
 * server's slots. Each connection is in one stage:
 *
 *   HEADER  waiting for a complete request header (just accepted, or kept
 *           alive after an answer): dropped header_ms after it began
 *           waiting, however often it sends a byte;
 *   BODY    the header is in, the body is being read: dropped body_ms
 *           after the header came in;
 *   ANSWER  being answered: the server's own write timeout applies.
 *
 * At most max_conns connections are kept: one more evicts the connection
 * that has waited longest for a header (the oldest idle one), or the new
 * one itself when every other is busy.
 *
 * The table drops a connection by calling the drop callback with its
 * descriptor, under the table's lock; the owner of the descriptor must
 * call kvt__conns_remove() (which takes the same lock) before it closes
 * it, so that a dropped descriptor is always still open. All calls are
 * thread-safe; kvt__conns_stage(), called for every request, takes no
 * lock. The sweep and an eviction scan every connection (O(n), every
 * 100 ms in metad, and on accepts at the cap). Time is passed in
 * (monotonic ms, below 2^56).
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

typedef struct kvt__conns kvt__conns_t;
typedef struct kvt__conn kvt__conn_t;

typedef enum {
    KVT__CONN_HEADER = 0,
    KVT__CONN_BODY,
    KVT__CONN_ANSWER,
    KVT__CONN_DROPPED, /* dropped, not yet removed by its owner */
    KVT__CONN_NSTAGES,
} kvt__conn_stage_t;

/* Why connections were dropped, for the counters. */
typedef enum {
    KVT__DROP_HEADER = 0, /* header deadline */
    KVT__DROP_BODY,       /* body deadline */
    KVT__DROP_EVICTED,    /* the cap was reached */
    KVT__DROP_NREASONS,
} kvt__drop_reason_t;

/* Called under the table's lock: must not call back into the table. */
typedef void (*kvt__conns_drop_cb_t)(void *arg, int fd);

/* KVT_OK or KVT_ERR_NO_MEMORY; @max_conns >= 1, deadlines >= 1 ms. */
kvt_status_t kvt__conns_create(unsigned max_conns, uint32_t header_ms,
                               uint32_t body_ms, kvt__conns_drop_cb_t drop,
                               void *arg, kvt__conns_t **t_p);
/* Frees the table and any connection still in it. NULL does nothing. */
void kvt__conns_destroy(kvt__conns_t *t);

/* A connection accepted on @fd, in stage HEADER; evicts one when the cap
 * is passed. NULL when out of memory (the caller then drops it). */
kvt__conn_t *kvt__conns_add(kvt__conns_t *t, int fd, uint64_t now_ms);

/* Move @c (NULL does nothing) to @stage from @now_ms on. A dropped
 * connection stays dropped. */
void kvt__conns_stage(kvt__conns_t *t, kvt__conn_t *c, kvt__conn_stage_t stage,
                      uint64_t now_ms);

/* Forget @c (NULL does nothing) and free it: its owner closes it next. */
void kvt__conns_remove(kvt__conns_t *t, kvt__conn_t *c);

/* Drop the connections past their deadline; returns how many. */
size_t kvt__conns_sweep(kvt__conns_t *t, uint64_t now_ms);

/* Connections kept (not dropped), and drops so far for @why. */
size_t kvt__conns_count(kvt__conns_t *t);
uint64_t kvt__conns_dropped(kvt__conns_t *t, kvt__drop_reason_t why);

#endif
