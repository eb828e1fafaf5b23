/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_ENGINE_INT_H
#define KVT_CORE_ENGINE_INT_H

/*
 * The engine as the core sees it: its settings, registry, control plane,
 * transport instances, segment table, notification queue, batches and
 * allocations, and the calls between the core's files.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <kvt/kvt.h>

#include "core/memreg.h"
#include "core/stats.h"
#include "proto/wire.h"
#include "core/tl.h"

typedef struct kvt__seg_slot kvt__seg_slot_t;

struct kvt_batch {
    kvt_engine_h engine;
    kvt__comp_t *slots;
    size_t capacity;
    size_t used;              /* touched by the submitting thread only */
    _Atomic uint32_t pending; /* futex word: slots not final */
    _Atomic uint32_t failed;
    _Atomic int32_t first_error;
    /* Completions running right now; free waits for it to drain so that a
     * completer never touches a freed batch after the last decrement. */
    _Atomic uint32_t busy;
    /* Threads asleep on @pending: completers call futex_wake only then. */
    _Atomic uint32_t sleepers;
    /* Where this batch's work went, if all to one place (kvt__hint_t):
     * that session's progress() can then be driven from the waiting
     * thread. Touched by the submitting thread only. */
    kvt__session_t *hint_sess;
    void *hint;
    int hint_multi;
    /* kvt_batch_set_idle_cb(): called by the completer about to take
     * @pending to 0, inside the run of completions (see @busy). */
    _Atomic kvt_batch_idle_cb_t on_idle;
    void *on_idle_arg;
    struct kvt_batch *prev, *next; /* engine's list, under batch_lock */
};

/*
 * The notification queue (engine.c): one FIFO in arrival order, and per
 * sender (by the segment name its connection declared) a FIFO of its own
 * entries, so that the queue can drop a sender's oldest entry without
 * touching anyone else's. A node holds only the bytes of its message.
 */
typedef struct kvt__notify_peer kvt__notify_peer_t;

typedef struct kvt__notify_node {
    struct kvt__notify_node *next, *prev; /* arrival order */
    struct kvt__notify_node *pnext;       /* its sender's, oldest first */
    kvt__notify_peer_t *peer;
    uint32_t length;
    char data[];
} kvt__notify_node_t;

struct kvt__notify_peer {
    kvt__notify_peer_t *hnext; /* hash chain */
    kvt__notify_node_t *head, *tail;
    uint32_t count;
    uint64_t dropped;
    char name[KVT_WIRE_NAME_MAX + 1];
};

#define KVT__NOTIFY_BUCKETS 256

typedef struct kvt__ctrl kvt__ctrl_t; /* src/core/ctrl.h */
typedef struct kvt__meta kvt__meta_t; /* src/meta/meta.h */

/* A kvt_mem_alloc() allocation. */
typedef struct kvt__alloc {
    struct kvt__alloc *next;
    void *addr;
    size_t length;  /* mapped length, rounded up to the page size used */
    int fd;         /* memfd, shared with same-host peers; -1 for device
                       memory */
    uint32_t id;    /* names it to same-host peers; never 0, not reused */
    uint8_t kind;   /* kvt_mem_kind_t: device memory comes from its domain */
    int16_t device; /* of device memory */
} kvt__alloc_t;

struct kvt_engine {
    kvt__engine_cfg_t cfg;
    uint32_t transports; /* KVT_TRANSPORT_* the user allows */

    kvt__memreg_t reg;
    kvt__ctrl_t *ctrl; /* the listener and the handshake */
    /* The transports this engine runs (created, started), in the
     * registry's order; tl[i]->index == i. */
    kvt__tl_t *tl[KVT__TL_MAX];
    unsigned ntl;
    /* Transports allowed that could not be started, and why (for the
     * selection's explanation, kvt__tl_explain()). */
    const kvt__tl_ops_t *tl_off[KVT__TL_MAX];
    kvt_status_t tl_off_st[KVT__TL_MAX];
    unsigned ntl_off;

    /* Metadata backend; NULL in p2p mode. A publisher thread stores this
     * engine's descriptor again whenever its regions change (pub_dirty);
     * the backend's heartbeat keeps it alive. */
    kvt__meta_t *meta;
    pthread_t pub_thread;
    int pub_started;
    pthread_mutex_t pub_lock;
    pthread_cond_t pub_cond;
    int pub_dirty, pub_stop;

    /* The segment table (segment.c), under sess_lock: handle slots, the
     * name index of the live segments, and every segment not yet freed. */
    pthread_mutex_t sess_lock;
    kvt__seg_slot_t *slots;
    uint32_t nslots, slots_cap;
    uint32_t free_slot; /* 1 + index of the first free slot; 0: none */
    kvt__seg_t **names; /* chained hash buckets */
    uint32_t names_cap, nnames;
    kvt__seg_t *segs;

    pthread_mutex_t nq_lock;
    pthread_cond_t nq_cond;
    kvt__notify_node_t *nq_head, *nq_tail;
    size_t nq_len;
    kvt__notify_peer_t *nq_peers[KVT__NOTIFY_BUCKETS];

    pthread_mutex_t batch_lock;
    struct kvt_batch *batches;

    pthread_mutex_t alloc_lock;
    kvt__alloc_t *allocs;
    uint32_t alloc_last_id; /* under alloc_lock */

    /* Bumped (release) after every inbound write has landed; read
     * (acquire) by kvt_notify_recv(), so a thread that learns of a
     * transfer through a notification sees its bytes. */
    _Atomic uint64_t landed;

    _Atomic int stopping;

    kvt__stats_t stats; /* stats.c */

    /* Transfers ordered on CUDA streams (stream.c); NULL until the first. */
    struct kvt__streams *_Atomic streams;
};

/*
 * Stream-ordered transfers (stream.c), in kvt_engine_destroy(): close
 * first (no more submissions; those the streams reach from then on end
 * with KVT_ERR_CANCELED), release last (the engine's reference; what the
 * streams have still queued keeps its own).
 */
void kvt__streams_close(kvt_engine_h e);
void kvt__streams_release(kvt_engine_h e);

/* ---- Segments (segment.c) ----------------------------------------------- */

/*
 * An opened remote segment: what a kvt_segment_t names. It holds the
 * peer's descriptor and the transport session that carries transfers to
 * it, and is reference counted: one reference for the handle (until
 * kvt_segment_close() or the engine's end), one held by its transport
 * session until that session is dead and has nothing in flight
 * (kvt__session_release()), one by each batch whose waiter may drive the
 * session, and short ones by calls using it. The last one frees the
 * session and the segment. A closed segment's handle is refused from then
 * on, and its slot is reused only with another generation.
 */
#define KVT__WHY_MAX 512 /* the reason of one pair's route */

struct kvt__seg {
    kvt_engine_h engine;
    _Atomic uint32_t refs;
    kvt_segment_t handle; /* 0 once closed; under sess_lock */
    int named;            /* in the name index; under sess_lock */
    char name[KVT_WIRE_NAME_MAX + 1];
    char addr[KVT_WIRE_NAME_MAX + 8]; /* host:port of its listener */
    pthread_mutex_t desc_lock;
    kvt__segdesc_t desc; /* under desc_lock */
    /* The sessions of the transports that carry its transfers (set when
     * it opens), and which one carries each pair of memory kinds (here,
     * there); NULL where none can. */
    unsigned nsess;
    kvt__session_t *sess[KVT__TL_MAX];
    kvt__session_t *route[KVT_MEM_KINDS][KVT_MEM_KINDS];
    /* Why each pair went where it went (kvt_segment_transport_reason()),
     * written when the segment opens, before its handle is published. */
    char why[KVT_MEM_KINDS][KVT_MEM_KINDS][KVT__WHY_MAX];
    /* Kinds of the peer's regions, a bit set (written under desc_lock). */
    _Atomic uint32_t rkinds;
    kvt__seg_t *name_next;   /* name index chain */
    kvt__seg_t *prev, *next; /* the engine's list of segments */
};

/* A handle slot: the segment in it, and the generation that the handle
 * of that segment carries (handle = generation << 32 | (index + 1)). */
struct kvt__seg_slot {
    kvt__seg_t *seg;
    uint32_t gen;
    uint32_t next_free;
};

/* The segment behind @handle with a reference taken, or NULL for a closed
 * or unknown handle. O(1). */
kvt__seg_t *kvt__seg_get(kvt_engine_h e, kvt_segment_t handle);
void kvt__seg_ref(kvt__seg_t *seg);
void kvt__seg_unref(kvt__seg_t *seg);

/* Engine teardown, after the transports have stopped: free every segment
 * and its session, whatever still refers to them. */
void kvt__segs_free_all(kvt_engine_h e);

/* The registry changed: publish the descriptor again (metadata backends),
 * off this thread. */
void kvt__engine_publish_soon(kvt_engine_h e);

/* mem.c: this engine's regions and keys into a descriptor whose transport
 * sections are there; and, at teardown, every transport's registrations
 * dropped. */
kvt_status_t kvt__mem_describe(kvt_engine_h e, kvt__segdesc_t *d);
void kvt__mem_release_all(kvt_engine_h e);

/* Free every kvt_mem_alloc() allocation (engine teardown). */
void kvt__alloc_free_all(kvt_engine_h e);
/* notify_queue.c: free what the notification queue still holds (destroy). */
void kvt__notify_free_all(kvt_engine_h e);

/* Fill @d with this engine's segment descriptor (it then owns a malloc'd
 * region array: kvt__segdesc_clear()). */
kvt_status_t kvt__engine_segdesc_fill(kvt_engine_h e, kvt__segdesc_t *d);
/* Build this engine's segment descriptor (malloc'd encoding). */
kvt_status_t kvt__engine_segdesc(kvt_engine_h e, uint8_t **buf_p,
                                 size_t *len_p);

/* ---- Settings of the environment (src/core/env.c) --------------------- */

/* Every KVT_* setting valid where set: KVT_OK, or KVT_ERR_INVALID_PARAM
 * with each bad one logged (its name, value and what it takes). */
kvt_status_t kvt__env_check(void);
/* @name as seconds in [@lo_s, @hi_s] into *ms_p (0 when unset or empty):
 * KVT_OK, or KVT_ERR_INVALID_PARAM (logged). */
kvt_status_t kvt__env_seconds_ms(const char *name, double lo_s, double hi_s,
                                 uint64_t *ms_p);

/* ---- Transport selection (src/core/tl_select.c) ----------------------- */

/*
 * Open the sessions of @seg (its descriptor fetched): for every pair of
 * memory kinds (here, there) the transport that serves it best
 * (kvt__tl_select()), one session per transport, into seg->sess and
 * seg->route; one that cannot be set up falls back to the next, said once
 * in the log. Fails when no pair has a transport, or a transport's open
 * fails with a session (which stays with the segment until freed).
 */
kvt_status_t kvt__transport_open(kvt_engine_h e, kvt__seg_t *seg);

/* The session that carries a transfer between @lkind memory here and the
 * peer's memory at [raddr, raddr + span), or NULL. */
kvt__session_t *kvt__seg_route(kvt__seg_t *seg, unsigned lkind, uint64_t raddr,
                               uint64_t span);

/*
 * The transports of @e that can move @local memory here to and from
 * @remote memory of the peer described by @d, best first: allowed here,
 * offered by the peer, capable of both kinds, and reachable. Their
 * indices go to @order (room for KVT__TL_MAX); returns how many. Those
 * left out for a reason worth telling get it in @why[index] (else NULL).
 * @ask_driver: a transport that moves device memory through this
 * process's driver (KVT__TL_DEV_DRIVER) serves a pair with device memory
 * only where the driver loads, asked now (loading it); 0 takes it as
 * able (for pairs not in use yet: where the driver turns out unusable,
 * such a transport falls back to the peer's staging).
 */
unsigned kvt__tl_select(kvt_engine_h e, const kvt__segdesc_t *d,
                        kvt_mem_kind_t local, kvt_mem_kind_t remote,
                        int ask_driver, unsigned *order, const char **why);

/*
 * Why the pair (@local, @remote) goes to transport @chosen of @e (an index
 * into e->tl; -1: none serves it) for the peer described by @d, and why
 * every other transport built in does not carry it, into @buf: "shm (same
 * host; the highest priority of 2 that serve it); tcp: serves it too, at a
 * lower priority; ucx: not run by this engine (not named in its
 * transports)". @note: a reason of the route's own to add to the chosen
 * one, or NULL. @failed: by e->tl index, why a session could not be
 * opened (NULL entries: none tried or none failed); may be NULL. Every
 * reason it can give is listed in docs/transports.md.
 */
void kvt__tl_explain(kvt_engine_h e, const kvt__segdesc_t *d,
                     kvt_mem_kind_t local, kvt_mem_kind_t remote, int chosen,
                     const char *note, const char *const *failed, char *buf,
                     size_t cap);

/* This host's identity as engines compute it (kvt__engine_cfg_t.host_id):
 * the boot id and the pid namespace, hashed. */
uint64_t kvt__host_identity(void);

/* Add this engine's transport sections to its descriptor @d. */
kvt_status_t kvt__transport_sections(kvt_engine_h e, kvt__segdesc_t *d);

#endif
