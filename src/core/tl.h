/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_TL_H
#define KVT_CORE_TL_H

/*
 * The interface between the core and its transports: what a transport
 * sees of the engine, and the table of operations it registers. A
 * transport includes this header (with core/memreg.h, which it brings,
 * and what it needs of proto/, mem/ and util/) and nothing else of the
 * core; the core names no transport (the build lists them).
 * docs/architecture.md walks through it with tcp as the example.
 *
 * A transport is one static table (kvt__tl_ops_t) registered with
 * KVT_TRANSPORT_REGISTER() and listed by the build (src/CMakeLists.txt,
 * kvt_add_transport()). Each engine creates an instance of every
 * transport it may use (kvt__tl_t), asks each to describe itself in the
 * segment descriptor, tells each about memory registrations, and for each
 * peer picks the transport that serves it best (core/tl_select.c),
 * which opens a session (kvt__session_t) that transfers go to.
 *
 * Descriptors reach a transport validated and normalised (kvt__xfer_t):
 * opcode known, piece count at least 1, strides resolved, every range
 * checked not to wrap, the local range inside one registered region. A
 * transport completes them through their opaque completion objects
 * (kvt__comp_t) and never sees a batch.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <kvt/kvt.h>

#include "core/memreg.h"
#include "proto/segdesc.h"
#include "proto/wire.h"
#include "util/auth.h"

#define KVT__TL_MAX KVT_MEMREG_KEYS /* transports one engine runs */
/* The longest a transport's admit() may hold a data connection's HELLO. */
#define KVT__TL_ADMIT_NS (1000ull * 1000000ull)

typedef struct kvt__tl kvt__tl_t;
typedef struct kvt__tl_ops kvt__tl_ops_t;
typedef struct kvt__session kvt__session_t;
typedef struct kvt__seg kvt__seg_t; /* the core's segment; opaque here */

/* ---- The engine, as a transport sees it ---------------------------------- */

/* Settings of an engine, fixed before any transport is created. */
typedef struct {
    char host[KVT_WIRE_NAME_MAX + 1];     /* listen host, as advertised */
    char seg_name[KVT_WIRE_NAME_MAX + 1]; /* this engine's segment name */
    uint16_t port;                        /* the control plane's listener */
    unsigned num_workers;
    unsigned conns_per_peer;
    uint64_t timeout_ns; /* per transfer */
    uint64_t connect_timeout_ms;
    size_t slice_size;
    uint64_t host_id;      /* boot id and pid namespace, hashed */
    char net_devices[128]; /* empty: none named */
    int metrics_on;        /* 0: KVT_METRICS=off, transports count nothing */
    /* The key derived from the shared secret (off: no secret): every
     * session set-up proves it (docs/security.md). */
    kvt__auth_t auth;
} kvt__engine_cfg_t;

const kvt__engine_cfg_t *kvt__engine_cfg(kvt_engine_h e);

/* The registry of local memory (core/memreg.h): a target checks every
 * remote access against it. */
kvt__memreg_t *kvt__engine_reg(kvt_engine_h e);

/* Queue a received notification (target side), from @from. */
void kvt__notify_push(kvt_engine_h e, const char *from, const void *data,
                      size_t len);

/* An inbound write has landed in this engine's memory: orders it before
 * what kvt_notify_recv() returns from now on. */
void kvt__engine_landed(kvt_engine_h e);

/* A transport refused a peer at its own handshake, or dropped one that
 * did not finish it: counted in kvt_engine_stats()'s handshakes_refused. */
void kvt__engine_refused(kvt_engine_h e);

/* kvt_mem_alloc() allocations, for transports that map them into peers:
 * [addr, addr + length) of allocation @id (never 0). */
typedef struct {
    uint64_t addr;
    uint64_t length;
    uint32_t id;
} kvt__alloc_ref_t;

/* Every allocation, in a malloc'd array (*n_p entries, *refs_p NULL when
 * none); called with the registry read lock held or not. */
kvt_status_t kvt__alloc_list(kvt_engine_h e, kvt__alloc_ref_t **refs_p,
                             size_t *n_p);

/* A duplicate of allocation @id's memfd, and where it lies, when it
 * exists and some registered region lies in it. KVT_ERR_NOT_FOUND
 * otherwise. The caller closes *fd_p. */
kvt_status_t kvt__alloc_export(kvt_engine_h e, uint32_t id, int *fd_p,
                               uint64_t *addr_p, uint64_t *length_p);

/* ---- The control plane's client (core/ctrl_client.c) -------------------- */

/*
 * Connect to @addr ("host:port") and handshake with @hello (its name is
 * set to this engine's), until @deadline (kvt__now_ns() clock): how a
 * transport opens its data connections. On success *fd_p is a blocking
 * socket right after HELLO_ACK. @name is the peer's segment name, for
 * messages. KVT_ERR_INVALID_PARAM (not host:port), KVT_ERR_UNREACHABLE,
 * KVT_ERR_TIMEDOUT, KVT_ERR_VERSION, KVT_ERR_PROTOCOL, KVT_ERR_CONN_LOST,
 * or the status of the peer's ERROR (logged).
 */
kvt_status_t kvt__ctrl_dial(kvt_engine_h e, const char *name, const char *addr,
                            kvt__wire_hello_t *hello, uint64_t deadline,
                            int *fd_p);

/* Fetch the peer's descriptor over a control connection of its own, bounded
 * by the connect timeout: how the segment is opened, and how a transport
 * refetches what it lost. On success @desc owns what it holds. */
kvt_status_t kvt__ctrl_fetch(kvt_engine_h e, const char *name, const char *addr,
                             kvt__segdesc_t *desc);

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
/* Around a run of kvt__comp_done() calls that report one moment (the
 * pieces of a job or a frame, completed together): the metrics read the
 * clock once for the run. Not nested; same thread. */
void kvt__comp_run_begin(void);
void kvt__comp_run_end(void);

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
    uint8_t lkind; /* kvt_mem_kind_t of the local span (READ, WRITE) */
    int16_t ldev;  /* the local span's device; -1 for host memory */
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

/* ---- A submission -------------------------------------------------------- */

/*
 * What submit() is told and tells back. @plugged: the submitting thread
 * holds the submission plug (kvt_submit_plug()): the transport may leave
 * its workers asleep, and wakes them in flush(). @where, @many: where the
 * work went, so that a thread waiting on the batch can make progress
 * itself (progress()) instead of sleeping until a worker completes it;
 * submit() notes each place it hands work to with kvt__sub_note(). One
 * place for the whole submission lets the waiter drive it; NULL, or two
 * different places, mean it cannot.
 *
 * @will_wait: the submitting thread waits for this submission as soon as
 * submit() returns (kvt_batch_submit_wait()) and runs progress() on the
 * place noted: a transport need not wake a worker for work that thread
 * will do, as long as progress() hands on what it leaves undone. A
 * transport whose progress() reads responses, and that has detach(), may
 * also attach the thread as the reader of the place it sends to before
 * it sends, so that a response that comes before the thread waits wakes
 * no worker; it reports that place in @attached (NULL: nothing
 * attached). The core then calls progress() for it with @attached set,
 * or detach(), exactly once, before the wait returns.
 */
typedef struct {
    int plugged;
    void *where;
    int many;
    int will_wait;
    void *attached;
} kvt__sub_t;

static inline void kvt__sub_note(kvt__sub_t *sub, void *where)
{
    if (where == NULL || (sub->where != NULL && sub->where != where))
        sub->many = 1;
    sub->where = where;
}

/* ---- Sessions --------------------------------------------------------------
 */

/*
 * A transport's view of one opened remote segment. Every transport embeds
 * this first in its own session structure and sets it up with
 * kvt__session_init().
 *
 * Lifetime. A session returned by open() holds one reference on its
 * segment; the transport drops it with kvt__session_release() exactly
 * once, when the session is dead and nothing of it is in flight or in the
 * transport's hands any more (queued, running, parked, a connection still
 * watched by a worker). The core calls the table's destroy_session() when
 * the segment's last reference goes: from any thread, with nothing else
 * using the session. kvt__session_hold() takes a further reference (a
 * thread that works on a session it found in a list, say) that
 * kvt__session_release() drops.
 */
struct kvt__session {
    kvt_engine_h engine;
    kvt__tl_t *tl;
    const kvt__tl_ops_t *ops;
    kvt__seg_t *seg;
    char name[KVT_WIRE_NAME_MAX + 1]; /* the peer's segment, for messages */
    /* 0 while usable; the status that ended it otherwise. */
    _Atomic int32_t dead;
};

/* The peer a session is opened to. */
typedef struct {
    kvt__seg_t *seg;            /* for kvt__session_init() */
    const char *name;           /* its segment name */
    const char *addr;           /* host:port of its listener */
    const kvt__segdesc_t *desc; /* its descriptor; valid during open() */
} kvt__tl_peer_t;

/* Bind @s to @peer's segment (taking the transport's reference). */
void kvt__session_init(kvt__session_t *s, kvt__tl_t *tl,
                       const kvt__tl_peer_t *peer);
void kvt__session_hold(kvt__session_t *s);
void kvt__session_release(kvt__session_t *s);

/* The session failed: its segment leaves the name cache, so that the next
 * kvt_segment_open() of the name handshakes afresh. */
void kvt__session_evict(kvt__session_t *s);

/* ---- The transport table ------------------------------------------------ */

/* Memory kinds as a bit set (kvt_mem_kind_t). */
#define KVT__MEM_BIT(kind) (1u << (kind))

/* Capability flags. */
enum {
    /* Reaches only peers on this host (same boot and pid namespace). */
    KVT__TL_SAME_HOST = 1u << 0,
    /* Takes strided descriptors as they are; without it the core hands
     * it one contiguous descriptor per piece. */
    KVT__TL_STRIDED = 1u << 1,
    /* Runs only when the engine's transports name it (not by default,
     * nor with KVT_TRANSPORT_ALL). */
    KVT__TL_EXPLICIT = 1u << 2,
    /* Moves device memory, on either side, through this process's device
     * driver (same-host sharing opens the peer's memory here): a pair with
     * device memory is served only where the driver loads, asked when such
     * a pair is first needed (mem/dev.h), never at engine creation. */
    KVT__TL_DEV_DRIVER = 1u << 3,
};

typedef struct {
    uint32_t local_mem;  /* kinds it moves from and into here */
    uint32_t remote_mem; /* kinds it reaches in the peer */
    uint32_t flags;      /* KVT__TL_* */
    int priority;        /* of those that can serve a pair, the highest wins */
} kvt__tl_caps_t;

/* An engine's instance of a transport; a transport embeds it first in its
 * own per-engine structure. */
struct kvt__tl {
    const kvt__tl_ops_t *ops;
    kvt_engine_h engine;
    unsigned index; /* in the engine's list */
    /* The memory kinds this instance moves here and reaches in peers:
     * its caps', unless create() found more or fewer (ucx moves device
     * memory only when the UCX it runs on was built for it). Selection
     * and registration go by these. */
    uint32_t local_mem, remote_mem;
};

/*
 * The table. Required: name, id, create, destroy, open, submit, kill,
 * destroy_session. Everything else may be left out.
 *
 * Engine lifetime. create() allocates the instance (and sets its base:
 * kvt__tl_init()); no thread runs until start(). A create() that fails
 * leaves the engine without that transport (logged once). stop() fails
 * everything in flight with KVT_ERR_CANCELED and stops its threads; then
 * the core frees every session; then destroy().
 *
 * Control plane. describe() adds the transport's section to this
 * engine's descriptor (kvt__segdesc_add_tl()); without it the section is
 * empty, of version 1. admit() (optional) decides, before HELLO_ACK,
 * whether a data connection that came to the engine's listener with a
 * HELLO naming this transport may be taken: it may wait, at most
 * KVT__TL_ADMIT_NS, for what must happen first (tcp: the connections of
 * the sessions the HELLO's fence names are closed), in the control
 * plane's thread; a refusal (with *@why_p) is answered with ERROR and
 * that status. accept() then takes the connection (core/ctrl.h), after
 * HELLO_ACK; it owns the socket, and closes it on failure.
 *
 * Memory. mem_reg() is called for every region registered whose kind the
 * transport moves (caps.local_mem), before the region is in the registry:
 * it fills @key with its handle of the registration and, when peers need
 * one to address the region through this transport, the packed remote key
 * (malloc'd; the descriptor's KEYS section carries it). Its failure fails
 * the registration (logged by the transport). mem_dereg() undoes it, after
 * the region has left the registry and mem_changed() has run: no
 * transfer of this engine starts on it any more, and the transport keeps
 * the handle alive for those still in flight. mem_changed() is called
 * after every registration and unregistration, without locks held; when it
 * returns, no peer of this transport may touch memory by an older registry
 * (it may wait for peers that copy themselves).
 *
 * Peers. reachable() says whether a peer, by its descriptor (its section
 * of this transport is there), can be served, and why not in *why_p (NULL
 * for "another host", which is not worth telling). open() opens a session
 * to it, blocking at most the connect timeout; on failure *why_p says why,
 * and *s_p may hold a failed session (which keeps its reference until it
 * is quiescent).
 *
 * Submission. submit(), progress(), kill(): see struct kvt__session.
 * submit() takes @n descriptors for @s, in submission order; it calls
 * kvt__comp_expect() on each before any of its pieces can complete, and
 * completes every piece exactly once, whatever happens: answered,
 * refused, timed out, cancelled by kill(). It never blocks on the
 * network. KVT_ERR_NO_MEMORY before anything was taken: the core fails
 * the descriptors. progress() makes progress from a thread waiting for
 * the work noted at @where, until *@until reads 0 or @deadline_ns passes
 * (0: no deadline); KVT_ERR_AGAIN when it cannot now. With @attached,
 * submit() attached this thread to @where (kvt__sub_t.attached), and
 * progress() ends that attachment before it returns, whatever it returns;
 * detach() ends one for a thread that does not call progress() for it
 * (the work went to more than one place, or is already done). flush() wakes
 * what plugged submissions left asleep. kill() fails everything in flight with
 * @why and refuses new work; it may be called more than once.
 */
struct kvt__tl_ops {
    const char *name;
    uint32_t id; /* its KVT_TRANSPORT_* bit */
    kvt__tl_caps_t caps;

    kvt_status_t (*create)(kvt_engine_h e, kvt__tl_t **tl_p);
    kvt_status_t (*start)(kvt__tl_t *tl);
    void (*stop)(kvt__tl_t *tl);
    void (*destroy)(kvt__tl_t *tl);

    kvt_status_t (*describe)(kvt__tl_t *tl, kvt__segdesc_t *d);
    kvt_status_t (*admit)(kvt__tl_t *tl, const kvt__wire_hello_t *hello,
                          const char **why_p);
    kvt_status_t (*accept)(kvt__tl_t *tl, int fd,
                           const kvt__wire_hello_t *hello);

    kvt_status_t (*mem_reg)(kvt__tl_t *tl, const kvt__region_t *r,
                            kvt__tl_key_t *key);
    void (*mem_dereg)(kvt__tl_t *tl, const kvt__region_t *r,
                      kvt__tl_key_t *key);
    void (*mem_changed)(kvt__tl_t *tl);

    int (*reachable)(kvt__tl_t *tl, const kvt__segdesc_t *peer,
                     const char **why_p);
    kvt_status_t (*open)(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                         kvt__session_t **s_p, const char **why_p);

    kvt_status_t (*submit)(kvt__session_t *s, const kvt__xfer_t *x, size_t n,
                           kvt__sub_t *sub);
    kvt_status_t (*progress)(kvt__session_t *s, void *where,
                             const _Atomic uint32_t *until,
                             uint64_t deadline_ns, int attached);
    void (*detach)(kvt__session_t *s, void *where);
    void (*flush)(kvt__tl_t *tl);
    void (*kill)(kvt__session_t *s, kvt_status_t why);
    /* Optional: what peers moved into and out of this engine's memory
     * through this transport, counted at the target: writes, reads,
     * write bytes, read bytes (kvt_served_stats_t). Any thread. */
    void (*served)(kvt__tl_t *tl, uint64_t out[4]);
    /* Optional: what the transport found on this host, for people (its
     * library's version, devices), into @buf (NUL-terminated, cut to
     * fit). Any thread. */
    void (*host_info)(kvt__tl_t *tl, char *buf, size_t cap);
    void (*destroy_session)(kvt__session_t *s);
};

/* Set the base of a new instance. */
static inline void kvt__tl_init(kvt__tl_t *tl, const kvt__tl_ops_t *ops,
                                kvt_engine_h e)
{
    tl->ops = ops;
    tl->engine = e;
    tl->index = 0;
    tl->local_mem = ops->caps.local_mem;
    tl->remote_mem = ops->caps.remote_mem;
}

/*
 * KVT_TRANSPORT_REGISTER(tcp, { .name = "tcp", ... }) defines the table
 * kvt__tl_tcp; the build lists it (kvt_add_transport() in
 * src/CMakeLists.txt) in the registry (core/tl_registry.c), so the core
 * finds it without naming it.
 */
#define KVT_TRANSPORT_REGISTER(short_name, ...)                                \
    __attribute__((visibility("hidden")))                                      \
    const kvt__tl_ops_t kvt__tl_##short_name = __VA_ARGS__

/* ---- The registry (tl_registry.c)
 * ---------------------------------------------
 */

/* The transports built in, in build order; NULL past the last. */
const kvt__tl_ops_t *kvt__tl_registered(size_t i);
/* By name or id; NULL when not built in. */
const kvt__tl_ops_t *kvt__tl_by_name(const char *name);
const kvt__tl_ops_t *kvt__tl_by_id(uint32_t id);
/* Whether a table has what the core requires of it (logged when not). */
int kvt__tl_ops_sound(const kvt__tl_ops_t *ops);

/* ---- Inline parts ---------------------------------------------------------
 */

struct kvt__comp {
    _Atomic int32_t status;     /* KVT_INPROGRESS until final */
    _Atomic int32_t err;        /* the first failure of a piece */
    _Atomic uint32_t remaining; /* pieces not yet completed */
    /* For the metrics (core/stats.h): the operation, the transport's
     * index (0xff: refused before any took it), bytes, submission time. */
    uint8_t st_op, st_tl;
    uint16_t reserved;
    struct kvt_batch *batch;
    uint64_t user_data;
    uint64_t st_bytes, st_t0;
};

static inline void kvt__comp_expect(kvt__comp_t *c, uint32_t pieces)
{
    atomic_store_explicit(&c->remaining, pieces, memory_order_relaxed);
}

#endif
