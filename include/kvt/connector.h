/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CONNECTOR_H
#define KVT_CONNECTOR_H

#include <stddef.h>
#include <stdint.h>

#include <kvt/defs.h>
#include <kvt/engine.h>
#include <kvt/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The KV connector: the prefill/decode (PD) protocol on top of the engine.
 *
 * A *connector* (kvt_conn_h, SGLang's KVManager) runs on every rank of a
 * prefill or a decode instance. It is given the rank's engine, the
 * description of its paged KV cache (kvt_kv_layout_t) and the address of
 * a bootstrap server (`kvt metad`, or any server speaking SGLang's
 * bootstrap routes). Prefill ranks register there; decode ranks look up
 * the prefill ranks they need and handshake with them once per peer
 * (a *session*: layouts are exchanged and checked for compatibility).
 *
 * Every request is a *room*, named by a 64-bit bootstrap_room that both
 * sides know. On decode a receiver (kvt_receiver_h, SGLang's KVReceiver)
 * announces the destination blocks and aux slots; on prefill a sender
 * (kvt_sender_h, SGLang's KVSender) is given the source blocks, in chunks
 * or layer by layer as the forward pass computes them (steps, below), and
 * writes them with one-sided engine writes straight into decode's blocks:
 * runs of blocks contiguous on both sides become one descriptor, and with
 * different tensor-parallel sizes each prefill rank writes exactly its KV
 * heads into the decode rank's blocks with strided descriptors. Completion
 * reaches decode as an engine notification sent after every write of that
 * prefill rank has landed; decode counts them per sending rank.
 *
 * Rooms move through SGLang's KVPoll states (kvt_poll_t). Each change
 * records a reason. A final state (SUCCESS or FAILED) also means the room
 * is *quiescent*: no write of this room will touch its blocks any more, on
 * either side, so they may be reused. Every non-final state is bounded by
 * a timeout, so every room reaches a final state.
 *
 * Threads: a connector runs three threads of its own (notification input,
 * transfer progress, and a bootstrap thread for HTTP and connection
 * set-up, so that neither blocks transfers). Every call below may be made
 * from any thread, concurrently, unless it says otherwise; none blocks on
 * the network unless it says so.
 *
 * The connector consumes its engine's notification queue: while a
 * connector exists, do not call kvt_notify_recv() on its engine. One
 * connector per engine. docs/connector.md describes the protocol.
 */
typedef struct kvt_conn *kvt_conn_h;
typedef struct kvt_room *kvt_sender_h;
typedef struct kvt_room *kvt_receiver_h;

/* ---- KV layout -------------------------------------------------------- */

/* What a cache holds. K, V, KV and their scales are sharded over tensor
 * parallelism by KV heads; latent caches (MLA) and their scales are the
 * same on every rank. KV is a layer's keys and values in one cache, each
 * head's keys and values together in head_bytes per token (as vLLM's CPU
 * backend stores a block: per head, the block's keys then its values):
 * it moves as K does, by whole heads, whatever order it has inside a
 * head. */
typedef enum {
    KVT_CACHE_K = 0,
    KVT_CACHE_V = 1,
    KVT_CACHE_LATENT = 2,       /* MLA compressed KV (+ rope part) */
    KVT_CACHE_K_SCALE = 3,      /* per-token-head quantisation scales of K */
    KVT_CACHE_V_SCALE = 4,      /* ... of V */
    KVT_CACHE_LATENT_SCALE = 5, /* per-token scales of the latent cache */
    KVT_CACHE_KV = 6,           /* K and V of a layer together, by head */
} kvt_cache_kind_t;

/* Order of the bytes inside one block. */
typedef enum {
    KVT_BLOCK_TOKEN_MAJOR = 0, /* [token][head][head_bytes] */
    KVT_BLOCK_HEAD_MAJOR = 1,  /* [head][token][head_bytes] */
} kvt_block_layout_t;

/*
 * One paged cache of one layer: num_blocks blocks of block_bytes bytes
 * from base (block i at base + i * block_bytes). The first
 * tokens_per_block * heads * head_bytes bytes of a block are its content,
 * in block_layout order; anything after it (padding) is copied only where
 * both sides have the same block size and heads. All caches of a layout
 * share one block table: the same num_blocks and tokens_per_block.
 */
typedef struct {
    uint32_t layer;            /* 0 .. num_layers + num_draft_layers - 1 */
    uint32_t kind;             /* kvt_cache_kind_t */
    uint32_t block_layout;     /* kvt_block_layout_t */
    uint32_t tokens_per_block; /* >= 1 */
    uint32_t heads;            /* KV heads on this rank (latent: usually 1) */
    uint32_t head_bytes;       /* bytes per head per token */
    void *base;
    uint64_t block_bytes; /* >= tokens_per_block * heads * head_bytes */
    uint64_t num_blocks;
} kvt_kv_cache_t;

/* An aux buffer: count items of item_bytes from base (item i at base +
 * i * item_bytes), e.g. the first output token ids, logprobs. The same
 * slot index selects one item in every aux buffer unless per-buffer slots
 * are given. */
typedef struct {
    void *base;
    uint64_t item_bytes;
    uint64_t count;
} kvt_aux_buffer_t;

/*
 * The KV cache of one rank. Layers are numbered target model first
 * (0 .. num_layers-1), then the draft model of speculative decoding
 * (num_layers .. num_layers+num_draft_layers-1); steps mark layers ready
 * in that numbering. Every layer has either K and V (each at most once,
 * plus optional K_SCALE and V_SCALE) or LATENT (plus optional
 * LATENT_SCALE). Caches may be listed in any order and may lie in one
 * big buffer or in many. The arrays are read during the call that takes
 * the layout only.
 */
typedef struct {
    uint32_t num_layers;
    uint32_t num_draft_layers;
    size_t num_caches;
    const kvt_kv_cache_t *caches;
    size_t num_aux;
    const kvt_aux_buffer_t *aux;
} kvt_kv_layout_t;

/*
 * kvt_kv_layout_check() - validate a layout on its own.
 *
 * Returns KVT_OK, or KVT_ERR_INVALID_PARAM with a sentence naming the
 * first fault (which cache or aux buffer, which field, what was
 * expected) written to @why (at most @why_len bytes, NUL-terminated;
 * @why may be NULL). kvt_conn_create() makes the same checks and logs
 * the sentence. Pure: no allocation that outlives the call, thread-safe.
 */
KVT_API kvt_status_t kvt_kv_layout_check(const kvt_kv_layout_t *layout,
                                         char *why, size_t why_len);

/* ---- Connector -------------------------------------------------------- */

typedef enum {
    KVT_ROLE_PREFILL = 0,
    KVT_ROLE_DECODE = 1,
} kvt_role_t;

/* Room states: the values of SGLang's KVPoll. */
typedef enum {
    KVT_POLL_FAILED = 0,
    KVT_POLL_BOOTSTRAPPING = 1,
    KVT_POLL_WAITING_FOR_INPUT = 2,
    KVT_POLL_TRANSFERRING = 3,
    KVT_POLL_SUCCESS = 4,
} kvt_poll_t;

/* Bits of kvt_conn_params_t.field_mask: a field is read only when set. */
enum {
    KVT_CONN_PARAM_ROLE = 1u << 0,
    KVT_CONN_PARAM_ENGINE = 1u << 1,
    KVT_CONN_PARAM_LAYOUT = 1u << 2,
    KVT_CONN_PARAM_BOOTSTRAP_ADDR = 1u << 3,
    KVT_CONN_PARAM_TP_RANK = 1u << 4,
    KVT_CONN_PARAM_TP_SIZE = 1u << 5,
    KVT_CONN_PARAM_DP_RANK = 1u << 6,
    KVT_CONN_PARAM_DP_SIZE = 1u << 7,
    KVT_CONN_PARAM_BOOTSTRAP_TIMEOUT = 1u << 8,
    KVT_CONN_PARAM_WAITING_TIMEOUT = 1u << 9,
    KVT_CONN_PARAM_TRANSFER_TIMEOUT = 1u << 10,
    KVT_CONN_PARAM_HEARTBEAT = 1u << 11,
    KVT_CONN_PARAM_PEER_TIMEOUT = 1u << 12,
    KVT_CONN_PARAM_SUBMIT_INTERVAL = 1u << 13,
    KVT_CONN_PARAM_FLAGS = 1u << 14,
    KVT_CONN_PARAM_REGISTER_TTL = 1u << 15,
};

/* kvt_conn_params_t.flags */
enum {
    /* The caller has registered the caches and aux buffers with the
     * engine itself (e.g. one kvt_mem_alloc() arena holding them all);
     * the connector registers nothing. Decode memory must then allow
     * KVT_ACCESS_REMOTE_WRITE. */
    KVT_CONN_NO_REGISTER = 1u << 0,
};

/*
 * Connector parameters. Zero-initialise, set the fields and their bits
 * in field_mask; ROLE, ENGINE and LAYOUT are required, and BOOTSTRAP_ADDR
 * is required on prefill. Strings and the layout are copied during
 * kvt_conn_create(). Timeouts are in milliseconds; 0 is refused.
 */
typedef struct {
    uint64_t field_mask;
    kvt_role_t role;
    /* The rank's engine: created by the caller, destroyed after the
     * connector. Its segment name must be its default "host:port" on
     * prefill (decode ranks dial what prefill registers). */
    kvt_engine_h engine;
    const kvt_kv_layout_t *layout;
    /* "host:port" of the bootstrap server. Prefill registers with it;
     * on decode it is the default for receivers created with NULL. */
    const char *bootstrap_addr;
    /* Attention tensor parallelism inside one data-parallel group: this
     * rank and the group's size (defaults 0 and 1). */
    uint32_t tp_rank;
    uint32_t tp_size;
    /* Data-parallel group of this rank and the number of groups
     * (defaults 0 and 1). Prefill registers engine rank
     * dp_rank * tp_size + tp_rank of tp_size * dp_size. */
    uint32_t dp_rank;
    uint32_t dp_size;
    /* A room still BOOTSTRAPPING this long after its creation fails
     * with KVT_ERR_TIMEDOUT (prefill: no decode announced it; decode: the
     * prefill ranks could not be found or did not answer the
     * handshake). Default 30000. */
    uint64_t bootstrap_timeout_ms;
    /* A room WAITING_FOR_INPUT this long fails (prefill: no send()
     * after decode announced; decode: no init(), or no byte from prefill
     * after init()). Default 300000. */
    uint64_t waiting_timeout_ms;
    /* A room TRANSFERRING this long fails. Default 60000. */
    uint64_t transfer_timeout_ms;
    /* Each live session is pinged this often. Default 1000. */
    uint64_t heartbeat_ms;
    /* A peer that leaves a ping, a handshake or an abort unanswered this
     * long is dead: every room on the session fails. Default 10000. */
    uint64_t peer_timeout_ms;
    /* Layer-wise streaming: layers are submitted in groups of this many
     * (the last group may be shorter). Default 1. */
    uint32_t submit_interval;
    uint32_t flags; /* KVT_CONN_* */
    /* Prefill: the bootstrap registration expires after this many
     * seconds unless refreshed (every third of it); 0 registers
     * permanently. Honoured by `kvt metad`, ignored by other servers.
     * Default 30. */
    uint32_t register_ttl_s;
} kvt_conn_params_t;

/*
 * kvt_conn_create() - validate the layout, register the caches and aux
 * buffers with the engine (unless KVT_CONN_NO_REGISTER; decode with
 * remote write access), start the connector's threads and, on prefill,
 * register this rank with the bootstrap server.
 *
 * Blocks for the registration (at most 5 s). Returns KVT_OK with
 * *conn_p set; KVT_ERR_INVALID_PARAM (a missing or bad field or an
 * invalid layout, logged with the reason); KVT_ERR_EXISTS (a buffer
 * overlaps memory already registered with the engine: use
 * KVT_CONN_NO_REGISTER); KVT_ERR_UNREACHABLE, KVT_ERR_TIMEDOUT or
 * KVT_ERR_IO (prefill: the bootstrap server did not take the
 * registration); KVT_ERR_NOT_SUPPORTED (built without libcurl and
 * json-c, which the bootstrap client needs); KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_conn_create(const kvt_conn_params_t *params,
                                     kvt_conn_h *conn_p);

/*
 * kvt_conn_destroy() - abort every room that is not final, wait until
 * they are (bounded by the peer timeout), withdraw the bootstrap
 * registration, stop the threads, unregister the memory registered at
 * create, and free everything, room handles included (they become
 * invalid). Blocks. NULL does nothing. Must not race with any other call
 * on the connector or its rooms. The engine stays usable.
 */
KVT_API void kvt_conn_destroy(kvt_conn_h conn);

/* ---- Layer-wise streaming: forward steps ------------------------------ */

/*
 * A *step* is one forward pass of the prefill model over a batch of
 * chunks (in the manner of tokenspeed's step counter). The compute side
 * opens a step, attaches chunks to it with kvt_sender_send_step(), then
 * marks layers ready as the pass writes them; the connector submits each
 * ready layer's writes for every room of the step at once (in groups of
 * submit_interval layers), so that when the pass ends only the last
 * group's transfer remains. Steps may overlap (a pipeline may open the
 * next step before the previous one ends).
 */

/*
 * kvt_conn_step_begin() - open a new step and return its id (increasing,
 * never 0). Prefill only. Returns KVT_OK, KVT_ERR_INVALID_PARAM (on
 * decode, NULL arguments), KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_conn_step_begin(kvt_conn_h conn, uint64_t *step_p);

/*
 * kvt_conn_layer_ready() - the KV of layers 0..@layer of @step is in
 * memory (marking layer l marks every layer before it). Wakes the
 * connector, which submits at once; does not block. Returns KVT_OK (also
 * for a step already ended), KVT_ERR_INVALID_PARAM for a layer out of
 * range or a step never opened.
 */
KVT_API kvt_status_t kvt_conn_layer_ready(kvt_conn_h conn, uint64_t step,
                                          uint32_t layer);

/*
 * kvt_conn_step_end() - every layer of @step and the aux items of the
 * rooms whose last chunk is in it are ready; the step is closed (chunks
 * attached to it later are sent at once). Returns KVT_OK,
 * KVT_ERR_INVALID_PARAM for a step never opened.
 */
KVT_API kvt_status_t kvt_conn_step_end(kvt_conn_h conn, uint64_t step);

/* ---- Rooms -------------------------------------------------------------- */

/* The state of a room and the cause of its last change. */
typedef struct {
    uint64_t room;
    kvt_poll_t state;
    /* KVT_OK unless FAILED; then why: KVT_ERR_TIMEDOUT,
     * KVT_ERR_CONN_LOST (peer died), KVT_ERR_UNREACHABLE,
     * KVT_ERR_CANCELED (aborted by either side), KVT_ERR_INVALID_PARAM
     * (the sides disagree on the request or the layouts), ... */
    kvt_status_t error;
    char reason[256]; /* NUL-terminated sentence */
    /* When the state last changed: CLOCK_MONOTONIC, in ns (the same
     * clock in every process of the host, so a SUCCESS on decode can be
     * set against a time taken on prefill). */
    uint64_t changed_ns;
} kvt_room_info_t;

/*
 * kvt_sender_create() - on prefill, open the room @room (BOOTSTRAPPING
 * until every decode rank that needs this rank's KV has announced its
 * blocks; then WAITING_FOR_INPUT). @bootstrap_addr is accepted for
 * SGLang's signature and ignored (may be NULL). Returns KVT_OK,
 * KVT_ERR_EXISTS (the room is open on this connector),
 * KVT_ERR_INVALID_PARAM (not a prefill connector), KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_sender_create(kvt_conn_h conn,
                                       const char *bootstrap_addr,
                                       uint64_t room, kvt_sender_h *sender_p);

/*
 * kvt_sender_init() - the request has @num_blocks blocks (logical blocks
 * 0..num_blocks-1, sent by kvt_sender_send() in order) and its aux items
 * are at @aux_slots: none (@num_aux_slots 0: no aux is sent), one slot for
 * every aux buffer (1), or one per buffer (the layout's num_aux). Aux
 * items are sent when both sides gave slots. May be called in any
 * non-final state, once. Returns KVT_OK, KVT_ERR_INVALID_PARAM for a slot
 * out of range, a second call or a final room.
 */
KVT_API kvt_status_t kvt_sender_init(kvt_sender_h sender, uint64_t num_blocks,
                                     const uint64_t *aux_slots,
                                     size_t num_aux_slots);

/*
 * kvt_sender_send() - the next @n logical blocks of the request are in
 * local blocks @block_ids (copied), with every layer computed: send them
 * now (only those decode asked for: it may hold a prefix). @is_last marks
 * the final chunk, which must end at num_blocks; the aux items follow it.
 * Chunks sent before decode announced are held until it does. Does not
 * block. Returns KVT_OK (also for a room that has failed: the chunk is
 * dropped, poll says why), KVT_ERR_INVALID_PARAM before init(), for a
 * block id out of range, a chunk past num_blocks, or after the last chunk,
 * KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_sender_send(kvt_sender_h sender,
                                     const uint32_t *block_ids, size_t n,
                                     int is_last);

/*
 * kvt_sender_send_step() - as kvt_sender_send(), for a chunk that step
 * @step is computing: its layers are sent as kvt_conn_layer_ready()
 * marks them, and (for the last chunk) its aux items at
 * kvt_conn_step_end(). Returns what kvt_sender_send() returns, and
 * KVT_ERR_INVALID_PARAM also for a step never opened.
 */
KVT_API kvt_status_t kvt_sender_send_step(kvt_sender_h sender, uint64_t step,
                                          const uint32_t *block_ids, size_t n,
                                          int is_last);

/*
 * kvt_receiver_create() - on decode, open the room @room to receive from
 * the prefill instance registered at @bootstrap_addr (NULL: the
 * connector's), data-parallel group @prefill_dp_group (negative: room
 * modulo the prefill dp size, as SGLang does). BOOTSTRAPPING while the
 * connector looks up the prefill ranks it needs and handshakes with them
 * (in the background), then WAITING_FOR_INPUT. Returns KVT_OK,
 * KVT_ERR_EXISTS, KVT_ERR_INVALID_PARAM (not a decode connector, bad
 * address), KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_receiver_create(kvt_conn_h conn,
                                         const char *bootstrap_addr,
                                         uint64_t room,
                                         int64_t prefill_dp_group,
                                         kvt_receiver_h *receiver_p);

/*
 * kvt_receiver_init() - receive logical blocks @first_block ..
 * @first_block+@n-1 of the request into local blocks @block_ids (copied;
 * decode already holds blocks 0..first_block-1, a cached prefix, and they
 * are not sent), and the aux items into @aux_slots (as kvt_sender_init()).
 * The blocks are announced to the prefill ranks as soon as the room is
 * bootstrapped. Once, in a non-final state. Returns KVT_OK,
 * KVT_ERR_INVALID_PARAM for an id or slot out of range, a second call or a
 * final room, KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_receiver_init(kvt_receiver_h receiver,
                                       const uint32_t *block_ids, size_t n,
                                       uint64_t first_block,
                                       const uint64_t *aux_slots,
                                       size_t num_aux_slots);

/*
 * kvt_room_poll() - the room's state (a sender or a receiver handle).
 * Cheap: one lock. Final states are SUCCESS and FAILED, and they mean
 * the blocks may be reused.
 */
KVT_API kvt_poll_t kvt_room_poll(struct kvt_room *room);

/*
 * kvt_room_info() - the state, the error and the reason of its last
 * change. Returns KVT_OK.
 */
KVT_API kvt_status_t kvt_room_info(struct kvt_room *room,
                                   kvt_room_info_t *info_p);

/*
 * kvt_room_wait() - sleep until the room is final or @timeout_ms passes
 * (negative: no limit; every state is bounded by a timeout anyway) and
 * return its state then.
 */
KVT_API kvt_poll_t kvt_room_wait(struct kvt_room *room, int64_t timeout_ms);

/*
 * kvt_room_abort() - abort the room from this side with @reason (may be
 * NULL). The other side is told, stops writing or expecting, and
 * acknowledges; the room turns FAILED (error KVT_ERR_CANCELED) once
 * every peer has acknowledged or is dead (bounded by the peer timeout).
 * Does not block. Returns KVT_OK (also for a room already final: nothing
 * changes), KVT_ERR_INVALID_PARAM for a NULL room.
 */
KVT_API kvt_status_t kvt_room_abort(struct kvt_room *room, const char *reason);

/*
 * kvt_room_destroy() - release the handle. A room not final is aborted
 * first and waited for (bounded by the peer timeout), so that its blocks
 * may be reused when this returns. NULL does nothing.
 */
KVT_API void kvt_room_destroy(struct kvt_room *room);

/* Role-named forms of the room calls, as SGLang's KVSender/KVReceiver. */
static inline kvt_poll_t kvt_sender_poll(kvt_sender_h s)
{
    return kvt_room_poll(s);
}
static inline kvt_poll_t kvt_receiver_poll(kvt_receiver_h r)
{
    return kvt_room_poll(r);
}
static inline kvt_status_t kvt_sender_abort(kvt_sender_h s, const char *why)
{
    return kvt_room_abort(s, why);
}
static inline kvt_status_t kvt_receiver_abort(kvt_receiver_h r, const char *why)
{
    return kvt_room_abort(r, why);
}
static inline void kvt_sender_destroy(kvt_sender_h s)
{
    kvt_room_destroy(s);
}
static inline void kvt_receiver_destroy(kvt_receiver_h r)
{
    kvt_room_destroy(r);
}

/* kvt_poll_str() - "Failed", "Bootstrapping", "WaitingForInput",
 * "Transferring", "Success" (SGLang's names), or "unknown". */
KVT_API const char *kvt_poll_str(kvt_poll_t state);

/* ---- Bootstrap server ---------------------------------------------------- */

typedef struct kvt_bootstrap *kvt_bootstrap_h;

/*
 * kvt_bootstrap_start() - run a bootstrap server (`kvt metad`: SGLang's
 * /route registration and lookup, Mooncake's /metadata store, /health) in
 * this process, listening on @host (NULL: 127.0.0.1 only; "0.0.0.0" for
 * every IPv4 address, which lets anyone who reaches it rewrite the
 * routes) and @port (0: a free one, see kvt_bootstrap_port()). Returns
 * once it serves: KVT_OK,
 * KVT_ERR_IO (cannot bind), KVT_ERR_INVALID_PARAM,
 * KVT_ERR_NOT_SUPPORTED (built without libmicrohttpd or json-c),
 * KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_bootstrap_start(const char *host, uint16_t port,
                                         kvt_bootstrap_h *server_p);

/* kvt_bootstrap_port() - the port the server listens on. */
KVT_API uint16_t kvt_bootstrap_port(kvt_bootstrap_h server);

/* kvt_bootstrap_stop() - stop and free the server. NULL does nothing. */
KVT_API void kvt_bootstrap_stop(kvt_bootstrap_h server);

#ifdef __cplusplus
}
#endif
#endif
