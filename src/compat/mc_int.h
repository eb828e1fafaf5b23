/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_COMPAT_MC_INT_H
#define KVT_COMPAT_MC_INT_H

/*
 * Mooncake's C API on kvt (libtransfer_engine.so): the engine object the
 * opaque transfer_engine_t points to, its tables, and what the files of
 * this folder share. Built on kvt's public API alone.
 *
 * Lock order: seg_lock and batch_lock are never held together; a batch's
 * own lock is taken with batch_lock held (read or write) and kept after
 * batch_lock is dropped. No lock is held across a call that waits on the
 * network (kvt_segment_open(), kvt_notify_send(), a refresh).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <kvt/engine.h>
#include <kvt/log.h>
#include <kvt/status.h>
#include <kvt/transfer.h>
#include <kvt/mooncake/transfer_engine_c.h>

/* Every exported call: the library's symbols are hidden otherwise. */
#define KVTMC_API __attribute__((visibility("default")))

#define KVTMC__LOG(level, ...)                                                 \
    do {                                                                       \
        if (kvt_log_enabled(level))                                            \
            kvt_log_printf(level, __FILE__, __LINE__, __VA_ARGS__);            \
    } while (0)
#define KVTMC__LOG_E(...) KVTMC__LOG(KVT_LOG_LEVEL_ERROR, __VA_ARGS__)
#define KVTMC__LOG_W(...) KVTMC__LOG(KVT_LOG_LEVEL_WARN, __VA_ARGS__)
#define KVTMC__LOG_I(...) KVTMC__LOG(KVT_LOG_LEVEL_INFO, __VA_ARGS__)

/* An opened segment: its id is its index + 1. A closed one keeps its slot
 * (ids are never reused) with open = 0. */
typedef struct {
    char *name;
    kvt_segment_t seg;
    int open;
} kvtmc_seg_t;

/* A batch (kvtmc__batch_*): at most @capacity tasks; task i is slot i of
 * the kvt batch, its user_data the task's length. The notification of
 * submitTransferWithNotify() waits in @notify until a status call finds
 * the whole batch completed. */
typedef struct {
    pthread_mutex_t lock;
    kvt_batch_h kb;
    size_t capacity;
    size_t submitted;
    int has_notify;
    kvt_segment_t notify_seg;
    size_t notify_len;
    char notify[KVT_NOTIFY_MAX];
} kvtmc_batch_t;

/* A batch id: generation << 32 | slot. A slot's generation changes when
 * its batch is freed, so a stale id is told from the new batch. */
typedef struct {
    kvtmc_batch_t *batch;
    uint32_t gen;
} kvtmc_batch_slot_t;

#define KVTMC_MAGIC 0x6b76746d6f6f6e63ull /* "kvtmoonc" */

typedef struct kvtmc_engine {
    uint64_t magic; /* KVTMC_MAGIC while alive */
    kvt_engine_h kvt;
    char host[256]; /* listened on and advertised */
    char *name;     /* this engine's segment name */

    pthread_rwlock_t seg_lock; /* segs, nsegs, self */
    kvtmc_seg_t *segs;
    size_t nsegs, segcap;
    kvt_segment_t self; /* LOCAL_SEGMENT, opened on first use; 0: not yet */

    pthread_rwlock_t batch_lock; /* slots, nslots, free list */
    kvtmc_batch_slot_t *slots;
    size_t nslots;
    uint32_t *free_slots;
    size_t nfree;

    int transport_token[4]; /* what installTransport() hands out */
} kvtmc_engine_t;

/* The engine behind a handle, or NULL (logged) for NULL or a handle that
 * is not a live engine of this library. */
kvtmc_engine_t *kvtmc__engine(transfer_engine_t engine, const char *call);

/* kvt status -> Mooncake's negative error.h value, and -> its Status code
 * (the same numbers, positive; 999 for "not implemented"). */
int kvtmc__err(kvt_status_t st);
int kvtmc__status_code(kvt_status_t st);

/* The kvt segment of @id (LOCAL_SEGMENT opens this engine's own, once)
 * into *seg_p: an id whose kvt segment was dropped after its session
 * failed is opened again by name (may block for a handshake). Returns
 * KVT_OK, KVT_ERR_NOT_FOUND (unknown or closed id), or what opening
 * returned. */
kvt_status_t kvtmc__segment(kvtmc_engine_t *e, int64_t id,
                            kvt_segment_t *seg_p);

/* Free the segment table (engine destruction, after kvt's engine). */
void kvtmc__segments_free(kvtmc_engine_t *e);

/* Free the batch table's wrappers (after kvt's engine freed the kvt
 * batches themselves). */
void kvtmc__batches_free(kvtmc_engine_t *e);

/* Pack (name, msg) into one kvt payload, in the layout the Python binding
 * uses too: "\0MCN" | name length (u16, little endian) | name | msg. NULL
 * strings count as "". Returns the length, or 0 when it does not fit in
 * KVT_NOTIFY_MAX (@buf holds KVT_NOTIFY_MAX bytes). */
size_t kvtmc__notify_pack(const notify_msg_t *m, char *buf);

#endif
