/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSFER_H
#define KVT_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include <kvt/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Transfers are one-sided: the initiator names local memory and remote
 * memory of an opened segment, and the bytes move without any call on the
 * target's side. They are submitted in batches of plain descriptors (in
 * the manner of io_uring's submission entries) and completed
 * asynchronously; each descriptor ends in exactly one final state
 * (kvt_batch_entry() lists them): KVT_OK, or a negative status saying why
 * it failed.
 */

typedef enum {
    KVT_OP_READ = 0,   /* remote -> local */
    KVT_OP_WRITE = 1,  /* local -> remote */
    KVT_OP_NOTIFY = 2, /* deliver [local_addr, +length) as a notification */
} kvt_opcode_t;

/*
 * One transfer. For READ and WRITE, [local_addr, +length) must lie in one
 * region registered with this engine, and [remote_addr, +length) in one
 * region the target registered with the matching access right (checked by
 * the target; a violation fails the descriptor with KVT_ERR_ACCESS and
 * nothing is written).
 *
 * Strided form: with count > 1 the descriptor moves @count pieces of
 * @length bytes, piece i from local_addr + i*local_stride to remote_addr +
 * i*remote_stride (strides of 0 mean "packed": the stride is @length).
 * count 0 and 1 both mean one contiguous piece.
 *
 * NOTIFY: the message [local_addr, +length) (at most KVT_NOTIFY_MAX bytes;
 * it need not be registered and is copied at submission) is delivered to
 * the target's notification queue after every WRITE submitted before it to
 * the same segment, from any batch, has landed. remote_addr is ignored.
 *
 * @flags and @reserved are for later versions (memory hints, ordering):
 * they must be 0, or the descriptor fails with KVT_ERR_INVALID_PARAM.
 * Zero-initialise descriptors, and a program built now keeps working.
 */
typedef struct {
    uint32_t opcode; /* kvt_opcode_t */
    uint32_t count;  /* pieces in the strided form; 0 or 1: contiguous */
    kvt_segment_t segment;
    void *local_addr;
    uint64_t remote_addr;
    uint64_t length; /* bytes per piece */
    uint64_t local_stride;
    uint64_t remote_stride;
    uint64_t user_data; /* returned untouched by kvt_batch_entry() */
    uint32_t flags;     /* 0 */
    uint32_t reserved32;
    uint64_t reserved[2];
} kvt_xfer_desc_t;

#define KVT_NOTIFY_MAX 4096

/* A batch: a fixed-capacity array of descriptor slots and their states. */
typedef struct kvt_batch *kvt_batch_h;

/* Aggregate state of a batch. */
typedef struct {
    size_t submitted;         /* descriptors submitted so far */
    size_t completed;         /* final, KVT_OK */
    size_t failed;            /* final, with an error */
    size_t pending;           /* submitted - completed - failed */
    kvt_status_t first_error; /* status of the first failure, or KVT_OK */
} kvt_batch_state_t;

/*
 * kvt_batch_create() - allocate a batch of @capacity descriptor slots.
 *
 * The batch is owned by the caller and freed with kvt_batch_free() (or
 * with its engine). A batch may be used by one thread at a time; different
 * batches may be used concurrently. Returns KVT_OK, KVT_ERR_INVALID_PARAM
 * (NULL engine or @batch_p, capacity 0 or over 1<<20) or
 * KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_batch_create(kvt_engine_h engine, size_t capacity,
                                      kvt_batch_h *batch_p);

/*
 * kvt_batch_submit() - submit @count descriptors into the batch's next free
 * slots (slot numbers continue from earlier submissions).
 *
 * @descs is read during the call only. The local memory of WRITE
 * descriptors must not change, and that of READ descriptors must not be
 * read, until their slots are final. Never blocks on the network: the
 * bytes move from worker threads (a small transfer may be written to the
 * socket from the calling thread when the connection is idle).
 *
 * Descriptors that fail validation (bad opcode, local range not
 * registered, unknown or dead segment) are not sent: their slots go final
 * at once with the reason, and the call returns KVT_OK as long as slots
 * were assigned; check per-slot states (kvt_batch_entry()). Returns
 * KVT_OK, KVT_ERR_NO_SPACE (and submits nothing) when @count exceeds the
 * free slots, KVT_ERR_INVALID_PARAM for a NULL batch or descriptors,
 * KVT_ERR_NO_MEMORY (nothing submitted).
 */
KVT_API kvt_status_t kvt_batch_submit(kvt_batch_h batch,
                                      const kvt_xfer_desc_t *descs,
                                      size_t count);

/*
 * kvt_batch_query() - aggregate state, without blocking. @state_p may be
 * NULL. Returns KVT_OK when every submitted descriptor completed
 * successfully, KVT_INPROGRESS while any is pending, or the first
 * failure's status once all are final (a failure as kvt_batch_entry() has
 * them); KVT_ERR_INVALID_PARAM for a NULL batch.
 */
KVT_API kvt_status_t kvt_batch_query(kvt_batch_h batch,
                                     kvt_batch_state_t *state_p);

/*
 * kvt_batch_entry() - the state of slot @index. Returns KVT_INPROGRESS
 * while it is pending, then KVT_OK or why it failed:
 *
 *  at submission     KVT_ERR_INVALID_PARAM (bad opcode, zero length, NULL
 *                    local address, strides below the length, a range
 *                    that wraps, flags or reserved fields not 0),
 *                    KVT_ERR_NOT_REGISTERED (the local range is not in one
 *                    registered region), KVT_ERR_OVERFLOW (a notification
 *                    longer than KVT_NOTIFY_MAX), KVT_ERR_NOT_FOUND
 *                    (unknown or closed segment), KVT_ERR_NOT_SUPPORTED (no
 *                    transport of the segment moves those memory kinds, or
 *                    strided pieces), KVT_ERR_NO_MEMORY, or the status that
 *                    ended the segment's session;
 *  at the target     KVT_ERR_ACCESS (the remote range is not inside one
 *                    region registered with the right access);
 *  on the way        KVT_ERR_CONN_LOST (the peer died, the connection
 *                    broke), KVT_ERR_TIMEDOUT (not done within the
 *                    transfer timeout), KVT_ERR_CANCELED (the segment was
 *                    closed or the engine destroyed), KVT_ERR_PROTOCOL or
 *                    KVT_ERR_VERSION (the peer broke the protocol),
 *                    KVT_ERR_IO (the transport lost its means to reach the
 *                    peer, e.g. permission to attach to it).
 *
 * @user_data_p (may be NULL) receives the descriptor's user_data.
 * KVT_ERR_INVALID_PARAM as the call's own answer for a NULL batch or a
 * slot never submitted. Does not block.
 */
KVT_API kvt_status_t kvt_batch_entry(kvt_batch_h batch, size_t index,
                                     uint64_t *user_data_p);

/*
 * kvt_batch_wait() - sleep until every submitted descriptor is final, or
 * @timeout_ms passes (negative: no limit; every transfer is itself bounded
 * by the transfer timeout). Sleeps on a futex, or makes progress itself
 * on the session its work went to; it does not spin for long.
 *
 * Returns what kvt_batch_query() would return at that moment: KVT_OK,
 * the first failure, or KVT_INPROGRESS if the timeout passed first;
 * KVT_ERR_INVALID_PARAM for a NULL batch.
 */
KVT_API kvt_status_t kvt_batch_wait(kvt_batch_h batch, int64_t timeout_ms);

/*
 * kvt_batch_submit_wait() - kvt_batch_submit(), then kvt_batch_wait(), in
 * one call: for a thread that waits for what it submits as soon as it is
 * submitted (a synchronous transfer). Knowing that, a transport may make
 * the calling thread the reader of the responses before the request goes
 * out, rather than wake a worker thread for a response that comes before
 * the thread waits (tcp does, for a submission that goes out as one
 * request small enough to be written from the calling thread): on a busy
 * machine that is a thread wake-up and a context switch fewer per
 * transfer. Thread safety, the
 * descriptors' contract and the blocking are those of the two calls; it
 * must not be called while this thread holds the submission plug.
 *
 * Returns kvt_batch_submit()'s refusals (KVT_ERR_INVALID_PARAM,
 * KVT_ERR_NO_SPACE, KVT_ERR_NO_MEMORY: nothing submitted, nothing waited
 * for), else what kvt_batch_wait() returns: KVT_OK, the first failure
 * (per-slot states as kvt_batch_entry() has them), or KVT_INPROGRESS when
 * @timeout_ms (negative: no limit) passed first, the transfers going on
 * as after any submission. A refusal leaves kvt_batch_query()'s
 * submitted count as it was, which tells it from a descriptor that failed
 * with the same status. The wait covers every descriptor in the batch,
 * those submitted earlier too.
 */
KVT_API kvt_status_t kvt_batch_submit_wait(kvt_batch_h batch,
                                           const kvt_xfer_desc_t *descs,
                                           size_t count, int64_t timeout_ms);

/*
 * A call made when a batch goes idle (kvt_batch_set_idle_cb()): @arg as
 * given there.
 */
typedef void (*kvt_batch_idle_cb_t)(kvt_batch_h batch, void *arg);

/*
 * kvt_batch_set_idle_cb() - have @cb called each time the batch's last
 * pending descriptor becomes final (also one that failed at submission),
 * or clear it with NULL. Set it before submitting, from the thread that
 * uses the batch.
 *
 * The call runs in the thread that completes the descriptor (a worker, a
 * waiter, or the submitting thread itself inside kvt_batch_submit()), with
 * engine locks possibly held: it must not block, and must not call into
 * kvt except kvt_batch_query() and kvt_batch_entry() on this batch. It
 * runs once the batch is idle: kvt_batch_query() in it, or in a thread it
 * wakes, finds the batch idle (unless more was submitted meanwhile), and
 * kvt_batch_wait() returns only after it has ended. After clearing
 * returns, no call of it is running or will run.
 * Typical use: wake the thread that owns the batch (a condition variable,
 * an eventfd). Returns KVT_OK, KVT_ERR_INVALID_PARAM (NULL batch).
 */
KVT_API kvt_status_t kvt_batch_set_idle_cb(kvt_batch_h batch,
                                           kvt_batch_idle_cb_t cb, void *arg);

/*
 * kvt_submit_plug(), kvt_submit_unplug() - the submission plug, in the
 * manner of the block layer's: between a plug and its unplug, this
 * thread's submissions queue their work but may leave the transports'
 * workers asleep; the last unplug wakes them once for all of it. Use it
 * around a round of submissions to several peers (the writes of one
 * request to several decode ranks): the workers then see all of them
 * before any runs, and a same-host transport copies the parts of one
 * source row for two peers in one pass.
 *
 * Plugs nest and are per thread. While plugged, the thread must not wait
 * for its own submissions (kvt_batch_wait() would wait for the transport's
 * timer instead of its workers) and must not destroy an engine it
 * submitted to before it unplugs. Never blocks; an unplug without a plug
 * does nothing.
 */
KVT_API void kvt_submit_plug(void);
KVT_API void kvt_submit_unplug(void);

/*
 * kvt_batch_reset() - make all slots free again so the batch can be
 * reused. Returns KVT_OK, KVT_ERR_BUSY while any descriptor is pending
 * (nothing changes), KVT_ERR_INVALID_PARAM for a NULL batch.
 */
KVT_API kvt_status_t kvt_batch_reset(kvt_batch_h batch);

/*
 * kvt_batch_free() - free the batch. Returns KVT_OK (also for NULL), or
 * KVT_ERR_BUSY, and the batch is left intact, while any descriptor is
 * pending.
 */
KVT_API kvt_status_t kvt_batch_free(kvt_batch_h batch);

/* ---- Transfers ordered on a CUDA stream -------------------------------- */

/*
 * Called once when a stream-ordered transfer (kvt_transfer_on_stream()) is
 * over, with its @arg: @status is KVT_OK when every descriptor completed,
 * else the first failure (a status of kvt_batch_entry()), or
 * KVT_ERR_CANCELED when its engine was being destroyed.
 */
typedef void (*kvt_stream_done_cb_t)(kvt_status_t status, void *arg);

/*
 * kvt_transfer_on_stream() - transfers in the order of a CUDA stream.
 *
 * Queues on @stream (the application's CUstream; NULL: the legacy default
 * stream of the calling thread's current context) the submission of the
 * @count descriptors: they are submitted once all the work queued on the
 * stream before this call has finished, and the work queued on it after
 * this call starts only once every one of them is final. A kernel that
 * fills a KV block, this call, then a kernel that reuses the buffer thus
 * run in that order without the host waiting for any of them.
 *
 * @descs are copied during the call, and so are the messages of NOTIFY
 * descriptors; the memory rules of the others are those of
 * kvt_batch_submit(), from the moment the stream reaches the transfer
 * until it is final. A kvt thread submits and follows them (a host
 * function may make no CUDA call, and moving device memory makes some);
 * the driver's thread that runs the stream's host functions, and with it
 * the stream, waits meanwhile. The driver may run the host functions of
 * every stream on that one thread: transfers ordered on different
 * streams may then run one after the other. Each transfer is bounded by
 * the engine's transfer timeout, so the stream always resumes.
 *
 * @done (may be NULL) is called once with @arg when the transfer is over,
 * on the driver's thread, before the stream resumes: it must not block
 * and must make no CUDA call. A transfer the stream reaches while or
 * after its engine is destroyed is not submitted and ends with
 * KVT_ERR_CANCELED (the call is still made, so the engine may go while
 * work is queued). @done is never called when this call fails.
 *
 * Thread-safe, but like every call on an engine it must not race the
 * engine's kvt_engine_destroy(). Does not block. Returns KVT_OK (queued),
 * KVT_ERR_INVALID_PARAM (NULL engine or @descs, @count 0 or over 1<<20),
 * KVT_ERR_NO_MEMORY, KVT_ERR_CLOSED (the engine's destruction has begun:
 * a best-effort answer for a caller that lost that race, not a licence),
 * KVT_ERR_NOT_SUPPORTED (no CUDA driver, or one without host functions)
 * or KVT_ERR_IO (the driver refused, e.g. the NULL stream with no current
 * context); the last two are logged with the driver's reason.
 */
KVT_API kvt_status_t kvt_transfer_on_stream(kvt_engine_h engine,
                                            const kvt_xfer_desc_t *descs,
                                            size_t count, void *stream,
                                            kvt_stream_done_cb_t done,
                                            void *arg);

/* ---- Notifications ----------------------------------------------------- */

/* A received notification. */
typedef struct {
    char from[128]; /* sender's segment name, NUL-terminated */
    uint32_t length;
    char data[KVT_NOTIFY_MAX];
} kvt_notify_t;

/*
 * kvt_notify_send() - send @msg to @segment and wait for the target to
 * accept it, after every write submitted before it to that segment has
 * landed. Blocks at most the transfer timeout. Convenience over a one-slot
 * batch with a KVT_OP_NOTIFY descriptor. Returns KVT_OK,
 * KVT_ERR_OVERFLOW when @length > KVT_NOTIFY_MAX, KVT_ERR_INVALID_PARAM
 * (NULL engine, or NULL @msg with a length), KVT_ERR_NO_MEMORY, or why
 * the descriptor failed (see kvt_batch_entry(); for a notification:
 * KVT_ERR_NOT_FOUND, KVT_ERR_NOT_SUPPORTED, KVT_ERR_CONN_LOST,
 * KVT_ERR_TIMEDOUT, KVT_ERR_CANCELED, KVT_ERR_PROTOCOL, KVT_ERR_VERSION,
 * KVT_ERR_IO).
 */
KVT_API kvt_status_t kvt_notify_send(kvt_engine_h engine, kvt_segment_t segment,
                                     const void *msg, size_t length);

/*
 * kvt_notify_recv() - take up to @max received notifications, oldest first,
 * into @out; *count_p is set to how many were taken. With @timeout_ms > 0
 * and none queued, sleeps up to that long for one. Returns KVT_OK (also
 * with zero taken after the timeout), KVT_ERR_INVALID_PARAM (NULL engine
 * or @count_p, NULL @out with @max > 0). The queue holds at most 65536
 * notifications, and at most 8192 from one sender (by segment name): a
 * sender at its quota loses its own oldest, and a full queue drops the
 * oldest of the sender holding the most, so one sender's flood does not
 * evict another's. Drops are counted (kvt_engine_stats()
 * notifies_dropped) and logged.
 *
 * Memory ordering: the calling thread is ordered after every remote write
 * that had landed in this engine's memory before the call, so the bytes
 * of the writes a notification vouches for are visible to it. A call with
 * @max 0 is such a barrier alone.
 */
KVT_API kvt_status_t kvt_notify_recv(kvt_engine_h engine, kvt_notify_t *out,
                                     size_t max, size_t *count_p,
                                     int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
