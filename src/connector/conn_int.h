/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CONNECTOR_CONN_INT_H
#define KVT_CONNECTOR_CONN_INT_H

/*
 * Internals of the connector. Everything below hangs off one kvt_conn and
 * is protected by its mutex (conn->lock), with these owners:
 *
 *   rx thread      takes notifications from the engine, decodes them and
 *                  applies them to the state (never sends anything);
 *   worker thread  sends: control messages and transfers; polls batches;
 *                  runs the timers; frees rooms, sessions and jobs;
 *   slow thread    blocking calls with the lock released: bootstrap HTTP
 *                  and kvt_segment_open(); results applied under the lock;
 *   callers        the public calls, which change state and wake the
 *                  worker.
 *
 * Objects are freed by the worker only, so a pointer taken under the lock
 * stays valid across an unlock of the worker or the slow thread (their
 * fields may change meanwhile). Batches are touched by the worker only.
 *
 * A room is final (SUCCESS or FAILED) only when it is quiescent: on
 * prefill every write it submitted is final and every decode rank it
 * announced has acknowledged an abort (or finished, or died); on decode
 * every prefill rank it announced to has finished, aborted or
 * acknowledged an abort (or died).
 *
 * The connector's objects go into libkvt beside the core's, so its
 * internal names have a prefix of their own: kvtc__ for types and
 * functions, KVTC__ for macros and constants. No kvtc__ name can meet a
 * kvt__ name of the core, the control plane or a transport.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include <kvt/connector.h>
#include <kvt/log.h>
#include <kvt/metad.h>
#include <kvt/metrics.h>
#include <kvt/transfer.h>

#include "layout.h"
#include "msg.h"

/* The library's log (kvt/log.h): the connector uses the public calls. */
#define KVTC__LOG(level, ...)                                                  \
    do {                                                                       \
        if (kvt_log_enabled(level))                                            \
            kvt_log_printf(level, __FILE__, __LINE__, __VA_ARGS__);            \
    } while (0)
#define KVTC__LOG_E(...) KVTC__LOG(KVT_LOG_LEVEL_ERROR, __VA_ARGS__)
#define KVTC__LOG_W(...) KVTC__LOG(KVT_LOG_LEVEL_WARN, __VA_ARGS__)
#define KVTC__LOG_I(...) KVTC__LOG(KVT_LOG_LEVEL_INFO, __VA_ARGS__)
#define KVTC__LOG_D(...) KVTC__LOG(KVT_LOG_LEVEL_DEBUG, __VA_ARGS__)

#define KVTC__NAME_MAX 128
#define KVTC__WHY_MAX 256

typedef struct kvtc__sess kvtc__sess_t;

/* ---- Sessions: one per peer rank, a handshake each ------------------- */

enum {
    KVTC__SESS_NEW = 0, /* waiting for the slow thread to open it */
    KVTC__SESS_OPENING, /* the slow thread is opening the segment */
    KVTC__SESS_OPENED,  /* segment open; the worker sends HELLO/HELLO_ACK */
    KVTC__SESS_HELLO,   /* decode: HELLO sent, waiting for HELLO_ACK */
    KVTC__SESS_ALIVE,   /* rooms may use it */
    KVTC__SESS_DEAD,    /* refuses rooms; freed when unreferenced */
};

struct kvtc__sess {
    kvtc__sess_t *next;
    char name[KVTC__NAME_MAX]; /* the peer's segment name */
    int state;
    uint64_t id; /* chosen by decode, one per handshake */
    kvt_segment_t seg;
    unsigned refs; /* peers, orphans, control messages in flight */
    uint64_t t_state;
    kvt_status_t err;
    char why[KVTC__WHY_MAX];
    kvtc__hello_t peer; /* the peer's ranks and sizes */
    /* Prefill: decode's layout, the verdict on it, the plan per cache. */
    kvtc__layout_t peer_lay;
    kvt_status_t verdict;
    kvtc__xplan_t *plan;
    /* Liveness: a PING every heartbeat; the peer answers PONG while it
     * knows the session. */
    uint64_t t_ping, t_pong;
    int ping_inflight;
};

/* ---- Rooms ------------------------------------------------------------- */

enum {
    KVTC__PEER_WAIT = 0,     /* decode: not announced yet */
    KVTC__PEER_ANNOUNCING,   /* decode: ROOM in flight */
    KVTC__PEER_ACTIVE,       /* announced: data may move */
    KVTC__PEER_DONE_SENDING, /* prefill: DONE in flight */
    KVTC__PEER_DONE,         /* finished successfully */
    KVTC__PEER_ABORTING,     /* ABORT sent, waiting for ABORT_ACK */
    KVTC__PEER_QUIET,        /* will not move data any more */
};

/* The other side of a room, per peer rank: on decode the prefill ranks
 * that write it (sources), on prefill the decode ranks it writes
 * (targets). */
typedef struct {
    kvtc__sess_t *sess;
    uint32_t rank;  /* the peer's tp rank */
    uint32_t flags; /* KVTC__ROOM_DUMMY */
    int st;
    int need_ack; /* the peer aborted: acknowledge once quiescent */
    int started;  /* prefill: STARTED sent; decode: STARTED seen */
    uint64_t t_abort;
    kvtc__room_msg_t req; /* prefill: what the decode rank asked for */
} kvtc__peer_t;

/* Prefill: a chunk of blocks given by send() or send_step(). */
typedef struct kvtc__chunk {
    struct kvtc__chunk *next;
    uint64_t step; /* 0: every layer ready */
    uint64_t offset;
    uint32_t n;
    int is_last;
    uint32_t covered; /* targets [0, covered) have a job for it */
    uint32_t *ids;
} kvtc__chunk_t;

/* Prefill: the writes of one chunk to one target. */
typedef struct kvtc__job {
    struct kvtc__job *next;
    kvtc__chunk_t *chunk;
    uint32_t peer; /* index into room->peers */
    kvtc__run_t *runs;
    size_t nruns;
    uint32_t next_layer; /* layers [0, next_layer) are submitted */
    int want_aux, aux_done, all_submitted;
    kvt_batch_h batch;
    size_t cap;
    int final;
    kvt_status_t st;
} kvtc__job_t;

struct kvt_room {
    kvt_conn_h conn;
    struct kvt_room *next;  /* conn->rooms */
    struct kvt_room *hnext; /* hash chain */
    uint64_t id, serial;
    int role;
    kvt_poll_t state;
    kvt_status_t error;
    char reason[KVTC__WHY_MAX];
    uint64_t t_created, t_state;
    uint64_t t_state_ns; /* kvt_room_info_t.changed_ns */
    int detached;
    int dirty; /* something changed: the worker should look */
    /* Failure decided, not final yet (waiting for quiescence). */
    int failing;
    kvt_status_t ferr;
    char freason[KVTC__WHY_MAX];
    char wait_why[KVTC__WHY_MAX]; /* what BOOTSTRAPPING waits for */
    /* init() */
    int inited;
    uint64_t num_blocks;  /* prefill */
    uint64_t first_block; /* decode */
    uint32_t *ids;        /* decode */
    uint64_t nids;
    uint64_t *aux; /* layout naux slots (UINT64_MAX: none), or NULL */
    kvtc__peer_t *peers;
    uint32_t npeers, cap_peers;
    uint32_t nexpect; /* peers expected; 0 while unknown */
    /* Prefill. */
    kvtc__chunk_t *chunks, **chunk_tail;
    uint64_t next_block;
    int got_last;
    uint64_t t_last_ns; /* when the last blocks were handed over (prefill) */
    kvtc__job_t *jobs;
    /* Decode. */
    char server[KVTC__NAME_MAX];
    int64_t group;
    int resolved;
};

/* ---- Prefill topology as decode learns it -------------------------- */

enum {
    KVTC__TOPO_NONE = 0, /* sizes to fetch */
    KVTC__TOPO_FETCHING,
    KVTC__TOPO_OK,  /* sizes known; ranks fetched as rooms need them */
    KVTC__TOPO_ERR, /* sizes unknown; retry at t_retry */
};

/* What decode knows of one prefill instance (one bootstrap server): its
 * sizes, and the addresses of the ranks rooms needed so far, each looked
 * up when first needed (ranks that finished may have withdrawn). */
typedef struct kvtc__topo {
    struct kvtc__topo *next;
    char server[KVTC__NAME_MAX];
    int state;
    uint32_t tp_total, dp;
    char (*names)[KVTC__NAME_MAX]; /* [group * tp + rank]; "" unknown */
    uint8_t *need;                 /* a room waits for this rank */
    int fetching;                  /* the slow thread looks ranks up */
    kvt_status_t err;
    char why[KVTC__WHY_MAX];
    uint64_t t_retry, backoff_ms;
} kvtc__topo_t;

/* ---- Control messages in flight ------------------------------------ */

typedef struct kvtc__ctrl {
    struct kvtc__ctrl *next;
    kvtc__sess_t *sess;
    kvt_batch_h batch;
    uint8_t type;
    uint64_t room, serial; /* for ROOM and DONE completions */
    uint32_t peer;
    uint64_t t_sent;
} kvtc__ctrl_t;

/* Prefill: a ROOM for a room no sender was created for yet. */
typedef struct kvtc__orphan {
    struct kvtc__orphan *next;
    kvtc__sess_t *sess;
    uint64_t room, t;
    kvtc__room_msg_t req;
} kvtc__orphan_t;

/* Prefill: a room decode aborted before the sender existed (aborted: a
 * sender created later fails at once), or a failed room already freed
 * (late announcements are refused). */
typedef struct kvtc__tomb {
    struct kvtc__tomb *next;
    uint64_t room, t;
    int aborted;
    char why[KVTC__WHY_MAX];
} kvtc__tomb_t;

/* An ABORT_ACK or NAK owed for a room this side does not know. */
typedef struct kvtc__reply {
    struct kvtc__reply *next;
    kvtc__sess_t *sess;
    uint8_t type;
    uint64_t room;
    int32_t status;
    char why[KVTC__WHY_MAX];
} kvtc__reply_t;

/* A message being reassembled from FRAG pieces. */
typedef struct kvtc__reasm {
    struct kvtc__reasm *next;
    char from[KVTC__NAME_MAX];
    uint64_t msg_id, t;
    uint32_t total, got;
    uint8_t *buf;
} kvtc__reasm_t;

/* A forward step (layer-wise streaming). */
typedef struct {
    uint64_t id;
    uint32_t ready; /* layers [0, ready) are ready */
} kvtc__step_t;

/* A memory range the connector registered. */
typedef struct {
    uint64_t base, len;
} kvtc__range_t;

#define KVTC__ROOM_HASH 1024

/* The connector's metrics (kvt_conn_stats()): rooms by state now, rooms
 * that entered each state, the time rooms spent in each state they left,
 * and the tail of prefill rooms: from the last blocks handed over to
 * success. */
typedef struct {
    _Atomic uint64_t rooms[5], entered[5], left[5], state_ns[5];
    _Atomic uint64_t tail[KVT_STATS_LATENCY_BUCKETS], tail_ns, tails;
} kvtc__conn_stats_t;

struct kvt_conn {
    kvtc__conn_stats_t stats;
    kvt_engine_h engine;
    int role;
    uint32_t tp_rank, tp_size, dp_rank, dp_size;
    kvtc__layout_t lay;
    uint64_t bootstrap_ms, waiting_ms, transfer_ms, heartbeat_ms, peer_ms;
    /* When the worker's last round began (kvtc__sess_forgive()). */
    uint64_t t_round;
    uint32_t submit_interval, flags, ttl_s;
    char server[KVTC__NAME_MAX];
    char seg_name[KVTC__NAME_MAX];
    char host[KVTC__NAME_MAX];
    uint16_t port;

    pthread_mutex_t lock;
    pthread_cond_t wake;    /* the worker */
    pthread_cond_t slow_cv; /* the slow thread */
    pthread_cond_t changed; /* room states, for waiters */
    pthread_t rx_tid, worker_tid, slow_tid;
    int threads; /* how many were started: 1 rx, 2 worker, 3 slow */
    int stop;
    int work; /* the worker should run a round at once */
    /* Raised by engine completers when one of the connector's batches
     * has nothing pending (batch_idle() in conn_wake.c), without the lock. */
    _Atomic uint32_t kicks;

    struct kvt_room *rooms;
    struct kvt_room *hash[KVTC__ROOM_HASH];
    uint64_t next_serial;
    kvtc__sess_t *sessions;
    kvtc__ctrl_t *ctrls;
    kvtc__topo_t *topos;
    kvtc__orphan_t *orphans;
    kvtc__tomb_t *tombs;
    kvtc__reply_t *replies;
    kvtc__reasm_t *reasm;
    size_t reasm_bytes;
    kvtc__step_t *steps;
    size_t nsteps, cap_steps;
    uint64_t next_step;
    uint64_t next_msg_id;
    uint64_t rng;

    kvtc__range_t *ranges;
    size_t nranges;
    uint64_t t_register; /* next registration refresh; 0: none */

    /* Worker scratch for descriptors. */
    kvt_xfer_desc_t *descs;
    size_t cap_descs;
};

/*
 * The files of the connector, each calling only the files below it:
 *
 *   conn.c          create, destroy, parameters, memory registration
 *   conn_threads.c  the rx, worker and slow threads
 *   rx.c            what arrives: decoding and applying control messages
 *   prefill.c       the prefill side of a room, and the sender calls
 *   decode.c        the decode side of a room, and the receiver calls
 *   peer.c          a room's peers, and the abort exchange with each
 *   sess.c          sessions with peer ranks; sending control messages
 *   room.c          room states, lookup, timeouts, freeing; room calls
 *   topo.c          the prefill topology decode looks up
 *   step.c          forward steps (layer-wise streaming)
 *   conn_wake.c     waking the worker, timed waits
 *   conn_stats.c    the connector's metrics
 *   msg.c layout.c  pure codecs and plans
 *
 * and this header's inline helpers, which every file may use.
 */

/* Bootstrap HTTP calls made while the connector runs. */
#define KVTC__HTTP_TIMEOUT_MS 3000ull

/* ---- Inline helpers ---------------------------------------------------- */

/* CLOCK_MONOTONIC. */
static inline uint64_t kvtc__conn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvtc__conn_now_ms(void)
{
    return kvtc__conn_now_ns() / 1000000ull;
}

/* Milliseconds from @t to @now, 0 when @t is later (a round's @now is
 * taken before the events of the round). */
static inline uint64_t kvtc__since(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

/* xorshift64*, seeded at create; called under the lock. */
static inline uint64_t kvtc__conn_random(kvt_conn_h c)
{
    uint64_t x = c->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->rng = x;
    return x * 2685821657736338717ull;
}

/* Make the worker run a round at once; called under the lock. */
static inline void kvtc__conn_wake(kvt_conn_h c)
{
    c->work = 1;
    pthread_cond_signal(&c->wake);
}

static inline void kvtc__sess_ref(kvtc__sess_t *s)
{
    s->refs++;
}

static inline void kvtc__sess_unref(kvtc__sess_t *s)
{
    s->refs--;
}

static inline int kvtc__room_is_final(const struct kvt_room *r)
{
    return r->state == KVT_POLL_SUCCESS || r->state == KVT_POLL_FAILED;
}

static inline const char *kvtc__role_str(int role)
{
    return role == KVT_ROLE_PREFILL ? "prefill" : "decode";
}

/* ---- conn_wake.c ------------------------------------------------------- */

/* Makes @batch (not yet submitted) wake the worker when it has nothing
 * pending, so that the worker need not poll it; kvtc__conn_batch_forget()
 * undoes it before a batch is left in flight. */
void kvtc__conn_batch_watch(kvt_conn_h c, kvt_batch_h batch);
void kvtc__conn_batch_forget(kvt_batch_h batch);
/* Wait on @cv (a CLOCK_MONOTONIC condition) for at most @ns. */
void kvtc__timed_wait(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ns);

/* ---- conn_stats.c ------------------------------------------------------ */

/* The connector's /metrics text (kvt_metrics_source_add()). */
size_t kvtc__conn_metrics_text(void *owner, char *buf, size_t cap, int meta);

/* ---- step.c ------------------------------------------------------------ */

/* Layers ready of @step and whether its aux items are (0: always). */
void kvtc__step_state(kvt_conn_h c, uint64_t step, uint32_t *ready_p,
                      int *aux_p);

/* ---- topo.c ------------------------------------------------------------ */

/* Decode's entry for the prefill instance at @server, created (and the
 * slow thread woken to fill it) when there is none; NULL: no memory. */
kvtc__topo_t *kvtc__topo_get(kvt_conn_h c, const char *server);
void kvtc__topo_forget(kvt_conn_h c, const char *name);
/* The slow thread's share: fetch what one entry lacks (sizes, or the
 * ranks rooms need) with the lock released meanwhile. Returns whether
 * there was anything to fetch. @bc may be NULL (no bootstrap client). */
int kvtc__topo_fetch(kvt_conn_h c, kvt_bootc_h bc, uint64_t now);
void kvtc__topo_free_all(kvt_conn_h c);

/* ---- room.c ------------------------------------------------------------ */

struct kvt_room *kvtc__room_find(kvt_conn_h c, uint64_t id);
/* A new room in BOOTSTRAPPING, hashed and listed; KVT_ERR_EXISTS when
 * @id is taken, or KVT_ERR_NO_MEMORY. */
kvt_status_t kvtc__room_new(kvt_conn_h c, uint64_t id, int role,
                            struct kvt_room **r_p);
/* Enter a non-final state, with a reason; broadcasts. */
void kvtc__room_set(struct kvt_room *r, kvt_poll_t state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Decide that the room fails (first decision wins); it turns FAILED when
 * quiescent. */
void kvtc__room_fail(struct kvt_room *r, kvt_status_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Make the room FAILED or SUCCESS now (it must be quiescent). */
void kvtc__room_final(struct kvt_room *r, kvt_poll_t state);
/* The caller's aux slots of init(), one per aux buffer in *aux_p
 * (malloc'd, or NULL when @n is 0): KVT_ERR_INVALID_PARAM or
 * KVT_ERR_NO_MEMORY. */
kvt_status_t kvtc__room_aux(kvt_conn_h c, const uint64_t *slots, size_t n,
                            uint64_t **aux_p);
/* The worker's timers and garbage collection for rooms. */
void kvtc__rooms_tick(kvt_conn_h c, uint64_t now);
void kvtc__room_free(kvt_conn_h c, struct kvt_room *r);

/* ---- sess.c ------------------------------------------------------------ */

kvtc__sess_t *kvtc__sess_find(kvt_conn_h c, const char *name);
kvtc__sess_t *kvtc__sess_new(kvt_conn_h c, const char *name);
/* Mark dead: every room with a peer on it fails, its segment is closed. */
void kvtc__sess_kill(kvt_conn_h c, kvtc__sess_t *s, kvt_status_t err,
                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/*
 * Send a finished message (kvtc__cmb_finish done; the buffer is consumed)
 * to @s, fragmenting it when needed. A failure to submit kills the
 * session. @room/@serial/@peer identify what a ROOM or DONE completes.
 */
void kvtc__ctrl_send(kvt_conn_h c, kvtc__sess_t *s, kvtc__cmb_t *b,
                     uint64_t room, uint64_t serial, uint32_t peer);
/* Send a status message (NAK, ABORT, ABORT_ACK, HELLO_ACK). */
void kvtc__ctrl_status(kvt_conn_h c, kvtc__sess_t *s, uint8_t type,
                       uint64_t room, uint64_t serial, uint32_t peer,
                       kvt_status_t st, const char *why);
/* Owe @s a status message (NAK, ABORT_ACK) for @room: sent by the
 * worker's next round. */
void kvtc__queue_reply(kvt_conn_h c, kvtc__sess_t *s, uint8_t type,
                       uint64_t room, kvt_status_t st, const char *why);
/* Poll control messages and sessions (handshakes, pings, timeouts);
 * returns non-zero while something is in flight. */
int kvtc__sess_tick(kvt_conn_h c, uint64_t now);
/* The worker ran no round for gap_ms, far longer than it ever waits:
 * this process was not running (stopped, or the whole machine stalled).
 * Time in which it could hear nothing is not held against its peers:
 * their liveness and message clocks move on by gap_ms. */
void kvtc__sess_forgive(kvt_conn_h c, uint64_t gap_ms);
void kvtc__sess_free_all(kvt_conn_h c);

/* ---- peer.c ------------------------------------------------------------ */

kvtc__peer_t *kvtc__room_add_peer(struct kvt_room *r, kvtc__sess_t *s);
/* The peer of @r on session @s, or NULL. */
kvtc__peer_t *kvtc__room_peer_of(struct kvt_room *r, const kvtc__sess_t *s);
/*
 * A failing room's abort, peer by peer (both roles): kvtc__peer_abort_ack()
 * answers an abort the peer sent; kvtc__peer_abort_start() tells a peer
 * that may still write (or expect writes) to stop; kvtc__peer_abort_wait()
 * kills the session of a peer that has not acknowledged within the peer
 * timeout, and returns whether the peer is still aborting.
 */
void kvtc__peer_abort_ack(kvt_conn_h c, struct kvt_room *r, uint32_t i);
void kvtc__peer_abort_start(kvt_conn_h c, struct kvt_room *r, uint32_t i,
                            uint64_t now);
int kvtc__peer_abort_wait(kvt_conn_h c, struct kvt_room *r, uint32_t i,
                          uint64_t now);

/* ---- decode.c ---------------------------------------------------------- */

int kvtc__decode_tick(kvt_conn_h c, struct kvt_room *r, uint64_t now);

/* ---- prefill.c --------------------------------------------------------- */

/* A ROOM from @s: attach to the room, or keep as an orphan. */
void kvtc__prefill_on_room(kvt_conn_h c, kvtc__sess_t *s, uint64_t room,
                           kvtc__room_msg_t *req);
/* Submit, poll and complete; returns non-zero while writes are in
 * flight. */
int kvtc__prefill_tick(kvt_conn_h c, struct kvt_room *r, uint64_t now);

/* ---- rx.c -------------------------------------------------------------- */

/* The rx thread's handling of one notification. */
void kvtc__rx_dispatch(kvt_conn_h c, const char *from, const uint8_t *buf,
                       size_t len);

/* ---- conn_threads.c ---------------------------------------------------- */

/* Start the rx, worker and slow threads; on failure the caller stops
 * those that started (kvtc__threads_stop). */
kvt_status_t kvtc__threads_start(kvt_conn_h c);
void kvtc__threads_stop(kvt_conn_h c);

#endif
