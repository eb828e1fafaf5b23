/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_MOONCAKE_TRANSFER_ENGINE_C_H
#define KVT_MOONCAKE_TRANSFER_ENGINE_C_H

/*
 * Mooncake Transfer Engine's C API (as of Mooncake v0.3.12.post1), served
 * by kvt: link with -ltransfer_engine (libtransfer_engine.so, installed
 * beside libkvt). The types, constants and calls below are binary
 * compatible with Mooncake's transfer_engine_c.h, so a program written
 * against that header (its Go and Rust bindings, NIXL's Mooncake backend)
 * runs on kvt. This header stands alone: it includes no other kvt header,
 * and <kvt/kvt.h> does not include it. With -I<includedir>/kvt/mooncake a
 * program includes it as "transfer_engine_c.h".
 *
 * Return conventions, as Mooncake's: calls returning int answer 0 on
 * success or a negative MC_ERR_* value, except submitTransfer(),
 * submitTransferWithNotify(), getTransferStatus() and freeBatchID(),
 * which answer a Mooncake Status code: 0 (MC_STATUS_OK) or a positive
 * MC_STATUS_* value. openSegment() answers a segment id (>= 0) or a
 * negative value; allocateBatchID() a batch id or INVALID_BATCH.
 *
 * Strings passed in are read during the call only.
 *
 * Threads: every call may be made from any thread concurrently, on the
 * same engine and on the same batch id, except destroyTransferEngine(),
 * which must not race with any other call on that engine. A batch id is
 * checked before use: an unknown or freed one is an error, not a crash
 * (ids carry a generation). An engine handle is looked up in the table of
 * live engines before use, so one this library did not create, or has
 * destroyed, is refused without being dereferenced, unless a later engine
 * was given the same address (handles are pointers, as in Mooncake).
 *
 * docs/integration.md ("C API") lists how each call maps onto kvt and
 * where kvt differs from Mooncake.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t segment_handle_t;
typedef int32_t segment_id_t;
typedef uint64_t batch_id_t;

/* The engine's own segment, as a target_id. */
#define LOCAL_SEGMENT (0)
/* What allocateBatchID() returns when it fails. */
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)  /* target -> source */
#define OPCODE_WRITE (1) /* source -> target */

/*
 * One transfer: @length bytes between local memory at @source (inside a
 * registered region) and the memory of segment @target_id at address
 * @target_offset (the peer's virtual address, inside a region it
 * registered).
 */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

/* A notification: two NUL-terminated strings chosen by the sender. */
struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

/* transfer_status.status */
#define STATUS_WAITING (0) /* in flight */
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)  /* its segment was closed, or the engine ended */
#define STATUS_COMPLETED (4) /* done: every byte moved */
#define STATUS_TIMEOUT (5)   /* not done within the transfer timeout */
#define STATUS_FAILED (6)    /* failed: the log says why */

struct transfer_status {
    int status;                 /* STATUS_* */
    uint64_t transferred_bytes; /* the task's length once COMPLETED, else 0 */
};
typedef struct transfer_status transfer_status_t;

/* Mooncake's segment descriptor type; no call of this API takes it. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct segment_desc segment_desc_t;

/* One region for registerLocalMemoryBatch(). */
struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

/* Negative answers of the int calls (Mooncake's error.h values). */
#define MC_ERR_INVALID_ARGUMENT (-1)
#define MC_ERR_TOO_MANY_REQUESTS (-2)
#define MC_ERR_ADDRESS_NOT_REGISTERED (-3)
#define MC_ERR_BATCH_BUSY (-4)
#define MC_ERR_DEVICE_NOT_FOUND (-6)
#define MC_ERR_ADDRESS_OVERLAPPED (-7)
#define MC_ERR_DNS (-101)
#define MC_ERR_SOCKET (-102)
#define MC_ERR_MALFORMED_JSON (-103)
#define MC_ERR_REJECT_HANDSHAKE (-104)
#define MC_ERR_METADATA (-200)
#define MC_ERR_ENDPOINT (-201)
#define MC_ERR_CONTEXT (-202)
#define MC_ERR_NUMA (-300)
#define MC_ERR_CLOCK (-301)
#define MC_ERR_MEMORY (-302)
#define MC_ERR_NOT_IMPLEMENTED (-303)

/* Answers of the Status calls (Mooncake's Status::Code values). */
#define MC_STATUS_OK (0)
#define MC_STATUS_INVALID_ARGUMENT (1)
#define MC_STATUS_TOO_MANY_REQUESTS (2)
#define MC_STATUS_ADDRESS_NOT_REGISTERED (3)
#define MC_STATUS_BATCH_BUSY (4)
#define MC_STATUS_DEVICE_NOT_FOUND (6)
#define MC_STATUS_ADDRESS_OVERLAPPED (7)
#define MC_STATUS_NOT_SUPPORTED_TRANSPORT (8)
#define MC_STATUS_DNS (101)
#define MC_STATUS_SOCKET (102)
#define MC_STATUS_MALFORMED_JSON (103)
#define MC_STATUS_REJECT_HANDSHAKE (104)
#define MC_STATUS_METADATA (200)
#define MC_STATUS_ENDPOINT (201)
#define MC_STATUS_CONTEXT (202)
#define MC_STATUS_NUMA (300)
#define MC_STATUS_CLOCK (301)
#define MC_STATUS_MEMORY (302)
#define MC_STATUS_NOT_IMPLEMENTED (999)

/*
 * createTransferEngine() - create an engine: a kvt engine with its
 * listener, workers and memory registry.
 *
 * @metadata_conn_string: "P2PHANDSHAKE" (no metadata server: each engine
 * serves its own descriptor on its RPC port, and segments are named
 * "host:rpc_port"), or a metadata server: a URI kvt's metadata backends
 * take ("etcd://host:port", "redis://...", "http://..."), a bare
 * "host:port" meaning etcd. @local_server_name: "host[:port]" (a trailing
 * ":npu_N" is dropped); its host is the address listened on and
 * advertised; with a metadata server it is also the segment name peers
 * open. @ip_or_host_name: the host when @local_server_name has none.
 * @rpc_port: ignored, as by Mooncake (a free port is picked; with
 * MC_LEGACY_RPC_PORT_BINDING set, the port of @local_server_name, else
 * @rpc_port, is bound). @auto_discover: non-zero lets the engine use
 * kvt's RDMA path (ucx) when this build has it, beside tcp and shm.
 *
 * Blocks while binding and starting threads. Returns the engine, or NULL
 * (logged).
 */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);

/* discoverTopology() - kvt keeps no NIC topology: MC_ERR_NOT_IMPLEMENTED
 * (logged), or MC_ERR_INVALID_ARGUMENT for a bad engine. */
int discoverTopology(transfer_engine_t engine);

/*
 * getLocalIpAndPort() - "host:rpc_port" of the engine's listener (IPv6
 * hosts in brackets) into @buf_out, cut to @buf_len - 1 bytes. Returns
 * 0, or MC_ERR_INVALID_ARGUMENT (bad engine, NULL @buf_out with a length).
 */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/*
 * installTransport() - say that @proto is to be used. kvt starts its
 * transports when the engine is created and picks one per peer (shm for a
 * peer on this host, tcp otherwise; ucx where the engine runs it), so
 * this selects nothing: "tcp" and "shm" are accepted; "rdma" is
 * accepted, carried by ucx when the engine runs it and by tcp (shm on the
 * same host) otherwise, as the log says. @args is ignored. Returns an opaque
 * non-NULL handle, or NULL for a transport kvt does not have (nvmeof, nvlink,
 * ascend, efa, cxl, ...; logged).
 */
transport_t installTransport(transfer_engine_t engine, const char *proto,
                             void **args);

/* uninstallTransport() - 0, as Mooncake's (kvt keeps its transports
 * running); MC_ERR_INVALID_ARGUMENT for a bad engine or NULL @proto. */
int uninstallTransport(transfer_engine_t engine, const char *proto);

/*
 * openSegment() - open the segment @segment_name (leading '/' ignored;
 * "host:rpc_port" in P2PHANDSHAKE mode) and return its id: LOCAL_SEGMENT
 * for the engine's own name, else an id >= 1 that stays the same for the
 * name until closeSegment(). Opening a name already open checks the kvt
 * session and reconnects one that failed. Blocks while connecting
 * (bounded by the connect timeout). Returns the id, MC_ERR_INVALID_ARGUMENT
 * for a bad engine or empty name, or -1 when the segment cannot be opened
 * (logged with kvt's reason).
 */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

/* openSegmentNoCache() - openSegment(), fetching the descriptor afresh
 * when the name is open already. Returns as openSegment(), or a negative
 * MC_ERR_* when the refresh fails. */
segment_id_t openSegmentNoCache(transfer_engine_t engine,
                                const char *segment_name);

/*
 * closeSegment() - close the segment: transfers in flight to it end
 * STATUS_CANCELED and its id becomes unknown (opening the name again gives
 * a new id). LOCAL_SEGMENT: 0, nothing is closed. Returns 0, or
 * MC_ERR_INVALID_ARGUMENT (bad engine, unknown id).
 */
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* warmupEfaSegment() - 0: kvt has no EFA transport, and Mooncake answers
 * 0 where it has none. MC_ERR_INVALID_ARGUMENT for a bad engine. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

/* removeLocalSegment() - MC_ERR_NOT_IMPLEMENTED (logged): kvt withdraws
 * its descriptor when the engine is destroyed. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

/*
 * destroyTransferEngine() - stop the engine: transfers in flight end,
 * batches not freed are freed, every segment is closed. NULL does
 * nothing. Must not race with any other call on the engine.
 */
void destroyTransferEngine(transfer_engine_t engine);

/*
 * registerLocalMemory() - register [addr, addr+length) for transfers, and
 * for peers to read and write when @remote_accessible. @location: "cpu"
 * or "cpu:N" (host memory), "cuda:N" (device N's memory), "*" or NULL
 * (told from the memory). The memory stays the caller's and must stay
 * valid until unregistered. Returns 0, MC_ERR_INVALID_ARGUMENT (zero
 * length, NULL address, bad engine), MC_ERR_ADDRESS_OVERLAPPED,
 * MC_ERR_DEVICE_NOT_FOUND (memory of a kind this build or machine cannot
 * register), MC_ERR_MEMORY, or MC_ERR_CONTEXT (a transport could not
 * register it; logged).
 */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);

/* unregisterLocalMemory() - withdraw the region starting at @addr. Returns
 * 0, MC_ERR_ADDRESS_NOT_REGISTERED, MC_ERR_INVALID_ARGUMENT. */
int unregisterLocalMemory(transfer_engine_t engine, void *addr);

/* registerLocalMemoryBatch() - register @buffer_len regions at @location,
 * remotely accessible; all or none. Returns as registerLocalMemory(). */
int registerLocalMemoryBatch(transfer_engine_t engine,
                             buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);

/* unregisterLocalMemoryBatch() - unregister each address (every one is
 * tried); returns 0 or the first failure, as unregisterLocalMemory(). */
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list,
                               size_t addr_len);

/*
 * allocateBatchID() - a batch of @batch_size tasks (0 to 1,048,576). The
 * id is opaque and checked on every use. Returns it, or INVALID_BATCH
 * (bad engine, too large, out of memory; logged).
 */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

/*
 * submitTransfer() - submit @count requests as the batch's next tasks
 * (task ids continue from earlier submissions). Never blocks on the
 * network; the source memory of a WRITE must not change, nor that of a
 * READ be read, until its task is final. Returns MC_STATUS_OK,
 * MC_STATUS_INVALID_ARGUMENT (bad engine or batch id, NULL @entries, an
 * opcode not READ or WRITE, an unknown target_id; nothing submitted),
 * MC_STATUS_TOO_MANY_REQUESTS (more than the batch has room for; nothing
 * submitted), MC_STATUS_MEMORY, or MC_STATUS_ADDRESS_NOT_REGISTERED when a
 * source range is not registered (all are submitted; those tasks are
 * STATUS_FAILED).
 */
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);

/*
 * submitTransferWithNotify() - submitTransfer(), and once a call of
 * getTransferStatus() finds every task of the batch COMPLETED, that call
 * sends @notify_msg to the segment of entries[0] (as Mooncake: a batch
 * that fails sends nothing; a later call replaces the batch's message).
 * name and msg together: at most 4090 bytes. Returns as submitTransfer();
 * MC_STATUS_INVALID_ARGUMENT also for @count 0 or a message too long.
 */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);

/*
 * getNotifsFromEngine() - take every notification received so far, oldest
 * first. Returns an array of *size entries, each string NUL-terminated,
 * all allocated with malloc(): free it with freeNotifsMsgBuf(). Returns
 * NULL with *size 0 when none is queued, and NULL with *size 0 on a bad
 * engine, NULL @size or no memory (logged). A notification sent by a kvt
 * peer outside this API has name = the sender's segment name.
 */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);

/* freeNotifsMsgBuf() - free what getNotifsFromEngine() returned (@size
 * entries). NULL does nothing. Returns 0. */
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/*
 * genNotifyInEngine() - send @notify_msg to the segment @target_id (an
 * id from openSegment()) and wait until it is accepted, after every write
 * submitted to it before. Returns 0, MC_ERR_METADATA (unknown segment
 * id), MC_ERR_INVALID_ARGUMENT (bad engine, message too long), or a
 * negative MC_ERR_* saying why it could not be delivered (logged).
 */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id,
                      notify_msg_t notify_msg);

/*
 * getTransferStatus() - the state of task @task_id into *@status. Does
 * not block (but for sending the batch's notification, see
 * submitTransferWithNotify()). Returns MC_STATUS_OK, or
 * MC_STATUS_INVALID_ARGUMENT (bad engine or batch id, a task never
 * submitted, NULL @status).
 */
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                      size_t task_id, struct transfer_status *status);

/* freeBatchID() - free the batch. Returns MC_STATUS_OK,
 * MC_STATUS_BATCH_BUSY while a task is in flight (nothing changes), or
 * MC_STATUS_INVALID_ARGUMENT (bad engine, unknown or freed batch id). */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* syncSegmentCache() - fetch the descriptor of every open segment afresh.
 * Returns 0, or the first failure as a negative MC_ERR_* (logged). */
int syncSegmentCache(transfer_engine_t engine);

struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

/* getNicLoadStats() - kvt tracks no NICs of its own: *count = 0, returns
 * 0 (as Mooncake's engine without them); -1 for a NULL argument. */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats,
                    size_t *count);

/* enableGracefulShutdown() - nothing to enable: destroyTransferEngine()
 * always ends transfers in flight and closes every session (logged). */
void enableGracefulShutdown(transfer_engine_t engine);

/*
 * showLinks() - the open segments and the transport that carries host
 * memory to each, as text (one "id name transport" line each) or, with
 * @json non-zero, {"links":[{"segment_id":..,"segment":..,"transport":..}]},
 * into @buf_out (cut to @buf_len - 1 bytes). Returns 0, or -1 for a bad
 * engine, NULL @buf_out or a zero @buf_len.
 */
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len,
              int json);

#ifdef __cplusplus
}
#endif
#endif
