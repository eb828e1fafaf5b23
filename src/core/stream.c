/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfers ordered on an application's CUDA stream
 * (kvt_transfer_on_stream()).
 *
 * Each call becomes a job, and a host function queued on the stream
 * (mem/dev.h) is the job's place in the stream's order. When the stream
 * reaches it, the host function hands the job to the engine's stream
 * thread and sleeps until the job is over; the stream's later work waits
 * for the host function to return. The host function itself calls nothing
 * of kvt's but this file's locks: the driver forbids CUDA calls there,
 * and submitting device memory makes them (staging copies, IPC).
 *
 * The stream thread creates a batch per job, sets its idle call (which
 * marks the job over and wakes its host function) and submits it; it
 * never waits for a transfer. (The driver may run the host functions of
 * all streams on one thread of its own: then a job holds the others'
 * host functions back until it is over, whatever kvt does.) A batch is
 * freed by the stream thread once the host function has returned.
 *
 * Lifetimes: the per-engine state (kvt__streams_t) is reference counted:
 * one reference for the engine, one per job not yet freed. A job stays
 * queued on its stream for as long as the application's earlier work
 * takes, possibly past the engine's end, so a job never reaches the
 * engine except through the state, under its lock: once the engine is
 * closing (kvt__streams_close()), jobs are no longer submitted, the ones
 * reached later end with KVT_ERR_CANCELED, and the engine frees the
 * batches of the ones that ran (its batches are its own).
 *
 * Job states, under the state's lock: QUEUED (on the stream) -> REACHED
 * (handed to the thread) -> RUNNING (submitted) -> OVER (status set;
 * also straight from QUEUED or REACHED when cancelled) -> the host
 * function returns, and the job goes to the thread to be freed (or is
 * freed at once when it has no batch or the engine is closing).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "mem/dev.h"
#include "util/log.h"
#include "util/thread.h"

enum { QUEUED, REACHED, RUNNING, OVER };

typedef struct job {
    struct job *next;
    struct kvt__streams *ss;
    kvt_batch_h batch; /* set by the stream thread */
    kvt_status_t status;
    int state;
    pthread_cond_t over; /* the host function waits on it */
    kvt_stream_done_cb_t done;
    void *arg;
    size_t count;
    kvt_xfer_desc_t descs[];
} job_t;

typedef struct kvt__streams {
    pthread_mutex_t lock;
    pthread_cond_t work; /* the stream thread waits on it */
    kvt_engine_h engine; /* NULL once released */
    int closing;
    unsigned refs;
    job_t *todo, *todo_tail; /* REACHED, in order */
    job_t *reap;             /* over, host function returned: to free */
    pthread_t thread;
} kvt__streams_t;

/* Drop a reference, with the lock held; the lock is released. */
static void ss_unref_unlock(kvt__streams_t *ss)
{
    int last = --ss->refs == 0;

    pthread_mutex_unlock(&ss->lock);
    if (last) {
        pthread_cond_destroy(&ss->work);
        pthread_mutex_destroy(&ss->lock);
        free(ss);
    }
}

static void job_free(job_t *j)
{
    pthread_cond_destroy(&j->over);
    free(j);
}

/* Mark @j over with @st, with the lock held. */
static void job_over(job_t *j, kvt_status_t st)
{
    j->status = st;
    j->state = OVER;
    pthread_cond_signal(&j->over);
}

/* The batch's idle call: every descriptor is final. */
static void job_idle(kvt_batch_h b, void *arg)
{
    job_t *j = arg;
    kvt_status_t st = kvt_batch_query(b, NULL);

    pthread_mutex_lock(&j->ss->lock);
    job_over(j, st);
    pthread_mutex_unlock(&j->ss->lock);
}

/* The host function: the stream has reached @arg's job. */
static void job_reached(void *arg)
{
    job_t *j = arg;
    kvt__streams_t *ss = j->ss;
    kvt_status_t st;

    pthread_mutex_lock(&ss->lock);
    if (ss->closing) {
        job_over(j, KVT_ERR_CANCELED);
    } else {
        j->state = REACHED;
        if (ss->todo_tail != NULL)
            ss->todo_tail->next = j;
        else
            ss->todo = j;
        ss->todo_tail = j;
        pthread_cond_signal(&ss->work);
        while (j->state != OVER)
            pthread_cond_wait(&j->over, &ss->lock);
    }
    st = j->status;
    pthread_mutex_unlock(&ss->lock);
    if (j->done != NULL)
        j->done(st, j->arg);
    pthread_mutex_lock(&ss->lock);
    if (j->batch != NULL && !ss->closing) {
        j->next = ss->reap;
        ss->reap = j;
        pthread_cond_signal(&ss->work);
        pthread_mutex_unlock(&ss->lock);
        return;
    }
    /* No batch, or the engine frees it. */
    job_free(j);
    ss_unref_unlock(ss);
}

/* Submit @j's descriptors in a batch of their own (the stream thread). */
static void job_submit(kvt__streams_t *ss, job_t *j)
{
    kvt_batch_h b = NULL;
    kvt_status_t st;

    st = kvt_batch_create(ss->engine, j->count, &b);
    if (st == KVT_OK)
        st = kvt_batch_set_idle_cb(b, job_idle, j);
    pthread_mutex_lock(&ss->lock);
    j->batch = b;
    if (st == KVT_OK)
        j->state = RUNNING;
    else
        job_over(j, st);
    pthread_mutex_unlock(&ss->lock);
    if (st != KVT_OK) {
        KVT_LOG_E("a transfer ordered on a CUDA stream could not start: %s",
                  kvt_status_str(st));
        return;
    }
    /* Descriptors that fail validation go final in the call, and the idle
     * call marks the job over; a refusal submits nothing. */
    st = kvt_batch_submit(b, j->descs, j->count);
    if (st != KVT_OK) {
        KVT_LOG_E("a transfer ordered on a CUDA stream was refused: %s",
                  kvt_status_str(st));
        pthread_mutex_lock(&ss->lock);
        job_over(j, st);
        pthread_mutex_unlock(&ss->lock);
    }
}

static void *stream_main(void *arg)
{
    kvt__streams_t *ss = arg;
    job_t *j;

    kvt__thread_name("kvt-stream");
    pthread_mutex_lock(&ss->lock);
    for (;;) {
        if ((j = ss->reap) != NULL) {
            ss->reap = j->next;
            pthread_mutex_unlock(&ss->lock);
            /* Returns once the idle call has ended. */
            kvt_batch_wait(j->batch, -1);
            kvt_batch_free(j->batch);
            job_free(j);
            pthread_mutex_lock(&ss->lock);
            ss->refs--; /* never the last: the engine holds one */
        } else if ((j = ss->todo) != NULL) {
            ss->todo = j->next;
            if (ss->todo == NULL)
                ss->todo_tail = NULL;
            pthread_mutex_unlock(&ss->lock);
            job_submit(ss, j);
            pthread_mutex_lock(&ss->lock);
        } else if (ss->closing) {
            break;
        } else {
            pthread_cond_wait(&ss->work, &ss->lock);
        }
    }
    pthread_mutex_unlock(&ss->lock);
    return NULL;
}

/* The engine's state, created with its thread on first use; NULL when out
 * of resources. */
static kvt__streams_t *streams_of(kvt_engine_h e)
{
    kvt__streams_t *ss = atomic_load(&e->streams), *none = NULL;

    if (ss != NULL)
        return ss;
    ss = calloc(1, sizeof(*ss));
    if (ss == NULL)
        return NULL;
    pthread_mutex_init(&ss->lock, NULL);
    pthread_cond_init(&ss->work, NULL);
    ss->engine = e;
    ss->refs = 1;
    if (pthread_create(&ss->thread, NULL, stream_main, ss) != 0) {
        KVT_LOG_E("cannot start the thread of stream-ordered transfers");
        pthread_mutex_lock(&ss->lock);
        ss_unref_unlock(ss);
        return NULL;
    }
    if (!atomic_compare_exchange_strong(&e->streams, &none, ss)) {
        /* Another thread's came first. */
        pthread_mutex_lock(&ss->lock);
        ss->closing = 1;
        pthread_cond_signal(&ss->work);
        pthread_mutex_unlock(&ss->lock);
        pthread_join(ss->thread, NULL);
        pthread_mutex_lock(&ss->lock);
        ss_unref_unlock(ss);
        ss = none;
    }
    return ss;
}

kvt_status_t kvt_transfer_on_stream(kvt_engine_h e,
                                    const kvt_xfer_desc_t *descs, size_t count,
                                    void *stream, kvt_stream_done_cb_t done,
                                    void *arg)
{
    kvt__streams_t *ss;
    const char *why = NULL;
    size_t msgs = 0;
    char *msg;
    job_t *j;

    if (e == NULL || descs == NULL || count == 0 || count > (1u << 20))
        return KVT_ERR_INVALID_PARAM;
    if (atomic_load(&e->stopping))
        return KVT_ERR_CLOSED;
    ss = streams_of(e);
    /* Notification messages are copied with the descriptors: they are
     * read at submission, once the stream gets there. */
    for (size_t i = 0; i < count; i++)
        if (descs[i].opcode == KVT_OP_NOTIFY &&
            descs[i].length <= KVT_NOTIFY_MAX && descs[i].local_addr != NULL)
            msgs += descs[i].length;
    j = calloc(1, sizeof(*j) + count * sizeof(descs[0]) + msgs);
    if (ss == NULL || j == NULL) {
        free(j);
        return KVT_ERR_NO_MEMORY;
    }
    memcpy(j->descs, descs, count * sizeof(descs[0]));
    msg = (char *)&j->descs[count];
    for (size_t i = 0; i < count; i++) {
        kvt_xfer_desc_t *d = &j->descs[i];
        if (d->opcode == KVT_OP_NOTIFY && d->length <= KVT_NOTIFY_MAX &&
            d->local_addr != NULL) {
            memcpy(msg, d->local_addr, d->length);
            d->local_addr = msg;
            msg += d->length;
        }
    }
    j->count = count;
    j->ss = ss;
    j->done = done;
    j->arg = arg;
    j->state = QUEUED;
    pthread_cond_init(&j->over, NULL);
    pthread_mutex_lock(&ss->lock);
    if (ss->closing) {
        pthread_mutex_unlock(&ss->lock);
        job_free(j);
        return KVT_ERR_CLOSED;
    }
    ss->refs++;
    pthread_mutex_unlock(&ss->lock);
    if (kvt__dev_host_fn(stream, job_reached, j, &why) != 0) {
        KVT_LOG_E("cannot order a transfer on CUDA stream %p: %s", stream, why);
        job_free(j);
        pthread_mutex_lock(&ss->lock);
        ss_unref_unlock(ss);
        return kvt__dev_usable() ? KVT_ERR_IO : KVT_ERR_NOT_SUPPORTED;
    }
    return KVT_OK;
}

void kvt__streams_close(kvt_engine_h e)
{
    kvt__streams_t *ss = atomic_load(&e->streams);
    job_t *j;

    if (ss == NULL)
        return;
    pthread_mutex_lock(&ss->lock);
    ss->closing = 1;
    /* Reached but not submitted: never will be. */
    while ((j = ss->todo) != NULL) {
        ss->todo = j->next;
        job_over(j, KVT_ERR_CANCELED);
    }
    ss->todo_tail = NULL;
    pthread_cond_signal(&ss->work);
    pthread_mutex_unlock(&ss->lock);
    pthread_join(ss->thread, NULL);
    /* The jobs still to free: their batches go with the engine's. The
     * running ones end when the transports cancel what is in flight. */
    pthread_mutex_lock(&ss->lock);
    while ((j = ss->reap) != NULL) {
        ss->reap = j->next;
        job_free(j);
        ss->refs--;
    }
    pthread_mutex_unlock(&ss->lock);
}

void kvt__streams_release(kvt_engine_h e)
{
    kvt__streams_t *ss = atomic_exchange(&e->streams, NULL);

    if (ss == NULL)
        return;
    pthread_mutex_lock(&ss->lock);
    ss->engine = NULL;
    ss_unref_unlock(ss);
}
