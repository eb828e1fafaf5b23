/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches of Mooncake's C API: batch ids (checked, never dereferenced),
 * each a kvt batch of the same capacity; submission of Mooncake's
 * requests as kvt descriptors, per-task states mapped to Mooncake's
 * STATUS_*, and the notification a completed batch sends.
 */
#include "mc_int.h"

#include <stdlib.h>
#include <string.h>

/* kvt's largest batch. */
#define BATCH_MAX ((size_t)1 << 20)

static uint64_t batch_id(uint32_t gen, size_t slot)
{
    return (uint64_t)gen << 32 | (uint64_t)slot;
}

/*
 * The batch of @id, locked; NULL (logged) when the id is not a live batch
 * of this engine. The table lock is held only while the batch's own lock
 * is taken, so that freeBatchID() (which holds it for writing) never
 * frees a batch another thread is inside.
 */
static kvtmc_batch_t *batch_get(kvtmc_engine_t *e, batch_id_t id,
                                const char *call)
{
    size_t slot = (size_t)(id & 0xffffffffu);
    uint32_t gen = (uint32_t)(id >> 32);
    kvtmc_batch_t *b = NULL;

    pthread_rwlock_rdlock(&e->batch_lock);
    if (slot < e->nslots && e->slots[slot].batch != NULL &&
        e->slots[slot].gen == gen) {
        b = e->slots[slot].batch;
        pthread_mutex_lock(&b->lock);
    }
    pthread_rwlock_unlock(&e->batch_lock);
    if (b == NULL)
        KVTMC__LOG_E("%s: unknown batch id %#llx", call,
                     (unsigned long long)id);
    return b;
}

KVTMC_API batch_id_t allocateBatchID(transfer_engine_t engine,
                                     size_t batch_size)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "allocateBatchID");
    kvtmc_batch_t *b;
    batch_id_t id = INVALID_BATCH;
    size_t slot;
    kvt_status_t st;

    if (e == NULL)
        goto err;
    if (batch_size > BATCH_MAX) {
        KVTMC__LOG_E("allocateBatchID(%zu): at most %zu tasks a batch",
                     batch_size, BATCH_MAX);
        goto err;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL)
        goto err;
    /* Mooncake allows 0 (every submission is then too many); kvt wants 1. */
    st = kvt_batch_create(e->kvt, batch_size ? batch_size : 1, &b->kb);
    if (st != KVT_OK) {
        KVTMC__LOG_E("allocateBatchID(%zu): %s", batch_size,
                     kvt_status_name(st));
        goto err_free;
    }
    b->capacity = batch_size;
    pthread_mutex_init(&b->lock, NULL);
    pthread_rwlock_wrlock(&e->batch_lock);
    if (e->nfree > 0) {
        slot = e->free_slots[--e->nfree];
    } else {
        kvtmc_batch_slot_t *s;
        uint32_t *f;

        if (e->nslots == 0xffffffffu)
            goto err_unlock;
        s = realloc(e->slots, (e->nslots + 1) * sizeof(*s));
        if (s == NULL)
            goto err_unlock;
        e->slots = s;
        f = realloc(e->free_slots, (e->nslots + 1) * sizeof(*f));
        if (f == NULL)
            goto err_unlock;
        e->free_slots = f;
        slot = e->nslots++;
        e->slots[slot].gen = 1;
    }
    e->slots[slot].batch = b;
    id = batch_id(e->slots[slot].gen, slot);
    pthread_rwlock_unlock(&e->batch_lock);
    return id;

err_unlock:
    pthread_rwlock_unlock(&e->batch_lock);
    pthread_mutex_destroy(&b->lock);
    kvt_batch_free(b->kb);
err_free:
    free(b);
err:
    return INVALID_BATCH;
}

KVTMC_API int freeBatchID(transfer_engine_t engine, batch_id_t batch_id)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "freeBatchID");
    size_t slot = (size_t)(batch_id & 0xffffffffu);
    kvtmc_batch_t *b = NULL;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (e == NULL)
        return MC_STATUS_INVALID_ARGUMENT;
    pthread_rwlock_wrlock(&e->batch_lock);
    if (slot < e->nslots && e->slots[slot].batch != NULL &&
        e->slots[slot].gen == (uint32_t)(batch_id >> 32)) {
        b = e->slots[slot].batch;
        pthread_mutex_lock(&b->lock);
        st = kvt_batch_free(b->kb);
        pthread_mutex_unlock(&b->lock);
        if (st == KVT_OK) {
            e->slots[slot].batch = NULL;
            /* A new generation (never 0, and never one that makes the id
             * INVALID_BATCH) tells a stale id from the slot's next batch. */
            if (++e->slots[slot].gen >= 0xffffffffu)
                e->slots[slot].gen = 1;
            e->free_slots[e->nfree++] = (uint32_t)slot;
        }
    }
    pthread_rwlock_unlock(&e->batch_lock);
    if (b == NULL) {
        KVTMC__LOG_E("freeBatchID: unknown batch id %#llx",
                     (unsigned long long)batch_id);
        return MC_STATUS_INVALID_ARGUMENT;
    }
    if (st == KVT_ERR_BUSY)
        return MC_STATUS_BATCH_BUSY;
    if (st == KVT_OK) {
        pthread_mutex_destroy(&b->lock);
        free(b);
    }
    return kvtmc__status_code(st);
}

void kvtmc__batches_free(kvtmc_engine_t *e)
{
    for (size_t i = 0; i < e->nslots; i++)
        if (e->slots[i].batch != NULL) {
            pthread_mutex_destroy(&e->slots[i].batch->lock);
            free(e->slots[i].batch);
        }
    free(e->slots);
    free(e->free_slots);
    e->slots = NULL;
    e->free_slots = NULL;
    e->nslots = e->nfree = 0;
}

/*
 * Both submissions: the requests become kvt descriptors (segments looked
 * up first, without the batch's lock, since LOCAL_SEGMENT may connect),
 * then go into the batch. @notify (may be NULL) is a packed notification
 * of @notify_len bytes, kept for the batch's completion.
 */
static int submit(const char *call, transfer_engine_t engine, batch_id_t id,
                  const struct transfer_request *entries, size_t count,
                  const char *notify, size_t notify_len)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, call);
    kvt_xfer_desc_t *d = NULL;
    kvtmc_batch_t *b;
    kvt_status_t st;
    int rc = MC_STATUS_INVALID_ARGUMENT;

    if (e == NULL || (entries == NULL && count > 0))
        goto out;
    if (count > BATCH_MAX) {
        rc = MC_STATUS_TOO_MANY_REQUESTS;
        goto out;
    }
    d = calloc(count ? count : 1, sizeof(*d));
    if (d == NULL) {
        rc = MC_STATUS_MEMORY;
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const struct transfer_request *r = &entries[i];

        if (r->opcode != OPCODE_READ && r->opcode != OPCODE_WRITE) {
            KVTMC__LOG_E("%s: task %zu: opcode %d is neither READ nor WRITE",
                         call, i, r->opcode);
            goto out;
        }
        if (i > 0 && r->target_id == entries[i - 1].target_id) {
            d[i].segment = d[i - 1].segment; /* looked up once per run */
        } else if (kvtmc__segment(e, r->target_id, &d[i].segment) != KVT_OK) {
            KVTMC__LOG_E("%s: task %zu: target segment id %d is unknown, "
                         "closed, or cannot be reached",
                         call, i, (int)r->target_id);
            goto out;
        }
        d[i].opcode = r->opcode == OPCODE_READ ? KVT_OP_READ : KVT_OP_WRITE;
        d[i].local_addr = r->source;
        d[i].remote_addr = r->target_offset;
        d[i].length = r->length;
        d[i].user_data = r->length;
    }
    b = batch_get(e, id, call);
    if (b == NULL)
        goto out;
    if (count > b->capacity - b->submitted) {
        KVTMC__LOG_E("%s: %zu tasks exceed the batch's room (%zu of %zu "
                     "used)",
                     call, count, b->submitted, b->capacity);
        rc = MC_STATUS_TOO_MANY_REQUESTS;
        goto out_unlock;
    }
    rc = MC_STATUS_OK;
    if (count > 0) {
        st = kvt_batch_submit(b->kb, d, count);
        if (st != KVT_OK) {
            rc = kvtmc__status_code(st);
            goto out_unlock;
        }
    }
    /* A source kvt does not know fails at submission (its task is final
     * at once); Mooncake's answer for it is the call's own. */
    for (size_t i = 0; i < count; i++)
        if (kvt_batch_entry(b->kb, b->submitted + i, NULL) ==
            KVT_ERR_NOT_REGISTERED) {
            KVTMC__LOG_E("%s: task %zu: source %p (+%llu) is not in "
                         "registered memory",
                         call, b->submitted + i, entries[i].source,
                         (unsigned long long)entries[i].length);
            rc = MC_STATUS_ADDRESS_NOT_REGISTERED;
        }
    b->submitted += count;
    if (notify != NULL && rc == MC_STATUS_OK) {
        memcpy(b->notify, notify, notify_len);
        b->notify_len = notify_len;
        b->notify_seg = d[0].segment;
        b->has_notify = 1;
    }
out_unlock:
    pthread_mutex_unlock(&b->lock);
out:
    free(d);
    return rc;
}

KVTMC_API int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count)
{
    return submit("submitTransfer", engine, batch_id, entries, count, NULL, 0);
}

KVTMC_API int submitTransferWithNotify(transfer_engine_t engine,
                                       batch_id_t batch_id,
                                       struct transfer_request *entries,
                                       size_t count, notify_msg_t notify_msg)
{
    char *buf;
    size_t len;
    int rc;

    if (count == 0) {
        KVTMC__LOG_E("submitTransferWithNotify: no entries");
        return MC_STATUS_INVALID_ARGUMENT;
    }
    buf = malloc(KVT_NOTIFY_MAX);
    if (buf == NULL)
        return MC_STATUS_MEMORY;
    len = kvtmc__notify_pack(&notify_msg, buf);
    if (len == 0) {
        KVTMC__LOG_E("submitTransferWithNotify: name and msg exceed %d bytes",
                     KVT_NOTIFY_MAX - 6);
        rc = MC_STATUS_INVALID_ARGUMENT;
    } else {
        rc = submit("submitTransferWithNotify", engine, batch_id, entries,
                    count, buf, len);
    }
    free(buf);
    return rc;
}

static int task_state(kvt_status_t st)
{
    switch (st) {
    case KVT_INPROGRESS:
        return STATUS_WAITING;
    case KVT_OK:
        return STATUS_COMPLETED;
    case KVT_ERR_TIMEDOUT:
        return STATUS_TIMEOUT;
    case KVT_ERR_CANCELED:
        return STATUS_CANCELED;
    default:
        return STATUS_FAILED;
    }
}

KVTMC_API int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                                size_t task_id, struct transfer_status *status)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "getTransferStatus");
    kvtmc_batch_t *b;
    kvt_segment_t seg = 0;
    char *notify = NULL;
    size_t notify_len = 0;
    uint64_t len = 0;
    kvt_status_t st;

    if (e == NULL || status == NULL)
        return MC_STATUS_INVALID_ARGUMENT;
    b = batch_get(e, batch_id, "getTransferStatus");
    if (b == NULL)
        return MC_STATUS_INVALID_ARGUMENT;
    if (task_id >= b->submitted) {
        pthread_mutex_unlock(&b->lock);
        KVTMC__LOG_E("getTransferStatus: task %zu out of range (%zu "
                     "submitted)",
                     task_id, b->submitted);
        return MC_STATUS_INVALID_ARGUMENT;
    }
    st = kvt_batch_entry(b->kb, task_id, &len);
    /* The batch's notification leaves once a caller sees it all done,
     * taken out under the lock so that it leaves once. */
    if (st == KVT_OK && b->has_notify &&
        kvt_batch_query(b->kb, NULL) == KVT_OK) {
        notify = malloc(b->notify_len);
        if (notify != NULL) {
            memcpy(notify, b->notify, b->notify_len);
            notify_len = b->notify_len;
            seg = b->notify_seg;
            b->has_notify = 0;
        }
    }
    pthread_mutex_unlock(&b->lock);
    status->status = task_state(st);
    status->transferred_bytes = st == KVT_OK ? len : 0;
    if (notify != NULL) {
        kvt_status_t ns = kvt_notify_send(e->kvt, seg, notify, notify_len);
        if (ns != KVT_OK)
            KVTMC__LOG_E("getTransferStatus: the batch's notification was "
                         "not delivered: %s (%s)",
                         kvt_status_name(ns), kvt_status_str(ns));
        free(notify);
    }
    return MC_STATUS_OK;
}
