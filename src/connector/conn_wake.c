/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waking the connector's threads: batches that wake the worker when they
 * run idle, and timed waits on the connector's condition variables (all
 * on CLOCK_MONOTONIC).
 */
#include <time.h>

#include "conn_int.h"

/*
 * A batch of the connector has nothing pending. Called by an engine
 * completer, perhaps with engine locks held, perhaps by a thread that
 * holds c->lock and is submitting: never wait for c->lock. With the lock,
 * the worker is waiting or has yet to check: no wake-up is lost. Without
 * it, the worker (if it holds the lock) sees @kicks move before it waits;
 * the narrow miss left (raised between that check and the wait) costs one
 * busy poll interval (conn_threads.c).
 */
static void batch_idle(kvt_batch_h batch, void *arg)
{
    kvt_conn_h c = arg;

    (void)batch;
    atomic_fetch_add(&c->kicks, 1);
    if (pthread_mutex_trylock(&c->lock) == 0) {
        kvtc__conn_wake(c);
        pthread_mutex_unlock(&c->lock);
    } else {
        pthread_cond_signal(&c->wake);
    }
}

void kvtc__conn_batch_watch(kvt_conn_h c, kvt_batch_h batch)
{
    kvt_batch_set_idle_cb(batch, batch_idle, c);
}

void kvtc__conn_batch_forget(kvt_batch_h batch)
{
    kvt_batch_set_idle_cb(batch, NULL, NULL);
}

void kvtc__timed_wait(pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ns += (uint64_t)ts.tv_nsec;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(cv, m, &ts);
}
