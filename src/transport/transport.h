/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_TRANSPORT_H
#define KVT_TRANSPORT_TRANSPORT_H

/*
 * What a transport sees of the core, and what the core asks of a
 * transport. docs/architecture.md walks through it.
 *
 * Descriptors reach a transport validated and normalised (kvt__xfer_t):
 * opcode known, piece count at least 1, strides resolved, every range
 * checked not to wrap, the local range inside one registered region. A
 * transport completes them through their opaque completion objects
 * (kvt__comp_t) and never sees a batch.
 */
#include <stdatomic.h>
#include <stdint.h>

#include <kvt/kvt.h>

#include "core/engine_int.h"

/* ---- Completion objects ------------------------------------------------- */

/*
 * One descriptor's completion, in the manner of uct_completion_t. The
 * transport that takes a descriptor calls kvt__comp_expect() once, with
 * the number of pieces it will complete, before any of them can complete;
 * then kvt__comp_done() once per piece, from any thread. The descriptor
 * is final after the last piece, with the first failure among them (or
 * KVT_OK). The object must not be touched after its last kvt__comp_done():
 * the batch that owns it may be freed at once.
 */
typedef struct kvt__comp kvt__comp_t;

static inline void kvt__comp_expect(kvt__comp_t *c, uint32_t pieces);
void kvt__comp_done(kvt__comp_t *c, kvt_status_t status);

/* ---- Normalised descriptors ---------------------------------------------- */

/*
 * A READ or WRITE moves @count >= 1 pieces of @len bytes, the i-th between
 * laddr + i * lstride here and raddr + i * rstride in the peer; a count of
 * 1 has both strides equal to @len, and a packed side of a strided
 * descriptor has its stride equal to @len. Neither span wraps. A NOTIFY
 * carries the message [laddr, +len) (len <= KVT_NOTIFY_MAX, count 1),
 * valid during submit() only: a transport copies it.
 */
typedef struct {
    uint32_t op; /* KVT_OP_READ, KVT_OP_WRITE or KVT_OP_NOTIFY */
    uint32_t count;
    uint64_t len;
    uint64_t laddr;
    uint64_t lstride;
    uint64_t raddr;
    uint64_t rstride;
    kvt__comp_t *comp;
} kvt__xfer_t;

/* Bytes a descriptor moves. */
static inline uint64_t kvt__xfer_bytes(const kvt__xfer_t *x)
{
    return x->len * x->count;
}

/* Whether the pieces lie back to back on the local (resp. remote) side. */
static inline int kvt__xfer_lpacked(const kvt__xfer_t *x)
{
    return x->count == 1 || x->lstride == x->len;
}
static inline int kvt__xfer_rpacked(const kvt__xfer_t *x)
{
    return x->count == 1 || x->rstride == x->len;
}

/* ---- Waiter progress ----------------------------------------------------- */

/*
 * Where a submission went, so that a thread waiting on the batch can make
 * progress itself (the transport's progress()) instead of sleeping until
 * a worker completes it. submit() notes each place it hands work to with
 * kvt__hint_note(): one place for the whole submission lets the waiter
 * drive it; NULL, or two different places, mean it cannot.
 */
typedef struct {
    void *where;
    int many;
} kvt__hint_t;

static inline void kvt__hint_note(kvt__hint_t *h, void *where)
{
    if (where == NULL || (h->where != NULL && h->where != where))
        h->many = 1;
    h->where = where;
}

/* ---- Sessions -------------------------------------------------------------- */

/*
 * A transport's view of one opened remote segment. Every transport embeds
 * this first in its own session structure and sets it up with
 * kvt__session_init().
 *
 * Lifetime. A session returned by open holds one reference on its
 * segment; the transport drops it with kvt__session_release() exactly
 * once, when the session is dead and nothing of it is in flight or in the
 * transport's hands any more (queued, running, parked, a connection still
 * watched by a worker). The core calls destroy() when the segment's last
 * reference goes: from any thread, with nothing else using the session.
 * kvt__session_hold() takes a further reference (a thread that works on a
 * session it found in a list, say) that kvt__session_release() drops.
 */
struct kvt__session {
    kvt_engine_h engine;
    const kvt__transport_ops_t *ops;
    kvt__seg_t *seg;
    char name[KVT_WIRE_NAME_MAX + 1]; /* the peer's segment, for messages */
    /* 0 while usable; the status that ended it otherwise. */
    _Atomic int32_t dead;
};

/* Bind @s to @seg (taking the transport's reference). */
void kvt__session_init(kvt__session_t *s, kvt__seg_t *seg,
                       const kvt__transport_ops_t *ops);
void kvt__session_hold(kvt__session_t *s);
void kvt__session_release(kvt__session_t *s);

/* The session failed: its segment leaves the name cache, so that the next
 * kvt_segment_open() of the name handshakes afresh. */
void kvt__session_evict(kvt__session_t *s);

/* The peer's descriptor: copied out under its lock by @fn. */
kvt__segdesc_t *kvt__session_desc_lock(kvt__session_t *s);
void kvt__session_desc_unlock(kvt__session_t *s);

/*
 * The operations on a session.
 *
 * submit() takes @n descriptors for @s, in submission order. It calls
 * kvt__comp_expect() on each before any of its pieces can complete, and
 * completes every piece exactly once (kvt__comp_done()), whatever
 * happens: sent and answered, refused, timed out, cancelled by kill().
 * It never blocks on the network. It notes where the work went in
 * @hint. KVT_ERR_NO_MEMORY before anything was taken: the core fails
 * the descriptors.
 *
 * progress() (optional) makes progress from a thread waiting for the
 * descriptors noted at @where, until *@until reads 0 or @deadline_ns
 * passes (0: no deadline); KVT_ERR_AGAIN when it cannot now (the caller
 * sleeps instead).
 *
 * kill() fails everything in flight with @why and refuses new work; it
 * may be called more than once. destroy() frees the session once nothing
 * can reach it.
 */
struct kvt__transport_ops {
    const char *name;
    kvt_status_t (*submit)(kvt__session_t *s, const kvt__xfer_t *x, size_t n,
                           kvt__hint_t *hint);
    kvt_status_t (*progress)(kvt__session_t *s, void *where,
                             const _Atomic uint32_t *until,
                             uint64_t deadline_ns);
    void (*kill)(kvt__session_t *s, kvt_status_t why);
    void (*destroy)(kvt__session_t *s);
};

/* ---- Inline parts --------------------------------------------------------- */

struct kvt__comp {
    _Atomic int32_t status;     /* KVT_INPROGRESS until final */
    _Atomic int32_t err;        /* the first failure of a piece */
    _Atomic uint32_t remaining; /* pieces not yet completed */
    uint32_t reserved;
    struct kvt_batch *batch;
    uint64_t user_data;
};

static inline void kvt__comp_expect(kvt__comp_t *c, uint32_t pieces)
{
    atomic_store_explicit(&c->remaining, pieces, memory_order_relaxed);
}

#endif
