/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's life in an engine (workers, the zero pages refused
 * reads are answered from) and its table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"
#include "util/log.h"

static kvt_status_t tcp_create(kvt_engine_h e, kvt__tl_t **tl_p)
{
    struct epoll_event ev;
    /* The worker's tick (transfer timeouts, idle connections): a timer of
     * its own, so that epoll_wait() sleeps without one. */
    const struct itimerspec tick = {
        {(time_t)(TICK_NS / 1000000000ull), (long)(TICK_NS % 1000000000ull)},
        {(time_t)(TICK_NS / 1000000000ull), (long)(TICK_NS % 1000000000ull)}};
    kvt__tcp_t *tcp;
    kvt_status_t st;
    unsigned i;

    tcp = calloc(1, sizeof(*tcp));
    if (tcp == NULL)
        return KVT_ERR_NO_MEMORY;
    kvt__tl_init(&tcp->base, &kvt__tl_tcp, e);
    tcp->e = e;
    tcp->cfg = kvt__engine_cfg(e);
    tcp->reg = kvt__engine_reg(e);
    tcp->nworkers = tcp->cfg->num_workers;
    atomic_store(&tcp->next_req, 1);
    pthread_mutex_init(&tcp->dev_lock, NULL);
    st = kvt__tcp_fence_init(tcp);
    if (st != KVT_OK)
        goto err_free;
    tcp->zeros = mmap(NULL, KVT_WIRE_MAX_PAYLOAD, PROT_READ,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (tcp->zeros == MAP_FAILED) {
        st = KVT_ERR_NO_MEMORY;
        goto err_fence;
    }
    tcp->workers = calloc(tcp->nworkers, sizeof(*tcp->workers));
    if (tcp->workers == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err_unmap;
    }
    for (i = 0; i < tcp->nworkers; i++) {
        tcp_worker_t *w = &tcp->workers[i];
        w->tcp = tcp;
        w->id = i;
        pthread_mutex_init(&w->lock, NULL);
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        w->scratch = malloc(SCRATCH_LEN);
        if (w->epfd < 0 || w->evfd < 0 || w->tfd < 0 || w->scratch == NULL ||
            timerfd_settime(w->tfd, 0, &tick, NULL) != 0) {
            st = KVT_ERR_IO;
            goto err_workers;
        }
        ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = w};
        epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev);
        ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &w->tfd};
        epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->tfd, &ev);
    }
    *tl_p = &tcp->base;
    return KVT_OK;

err_workers:
    for (unsigned j = 0; j < tcp->nworkers; j++) {
        tcp_worker_t *w = &tcp->workers[j];
        if (w->tcp == NULL)
            continue;
        if (w->epfd >= 0)
            close(w->epfd);
        if (w->evfd >= 0)
            close(w->evfd);
        if (w->tfd >= 0)
            close(w->tfd);
        free(w->scratch);
        pthread_mutex_destroy(&w->lock);
    }
    free(tcp->workers);
err_unmap:
    munmap(tcp->zeros, KVT_WIRE_MAX_PAYLOAD);
err_fence:
    kvt__tcp_fence_fini(tcp);
err_free:
    free(tcp);
    return st;
}

static kvt_status_t tcp_start(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    for (unsigned i = 0; i < tcp->nworkers; i++) {
        if (pthread_create(&tcp->workers[i].thread, NULL, kvt__tcp_worker_main,
                           &tcp->workers[i]) != 0) {
            KVT_LOG_E("cannot start worker threads");
            atomic_store(&tcp->stopping, 1);
            for (unsigned j = 0; j < i; j++) {
                uint64_t one = 1;
                if (write(tcp->workers[j].evfd, &one, sizeof(one)) < 0)
                    (void)0;
                pthread_join(tcp->workers[j].thread, NULL);
            }
            return KVT_ERR_IO;
        }
    }
    tcp->started = 1;
    return KVT_OK;
}

static void tcp_stop(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    if (!tcp->started || atomic_exchange(&tcp->stopping, 1))
        return;
    for (unsigned i = 0; i < tcp->nworkers; i++) {
        uint64_t one = 1;
        if (write(tcp->workers[i].evfd, &one, sizeof(one)) < 0)
            (void)0;
    }
    for (unsigned i = 0; i < tcp->nworkers; i++)
        pthread_join(tcp->workers[i].thread, NULL);
}

static void tcp_destroy(kvt__tl_t *tl)
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    for (unsigned i = 0; i < tcp->nworkers; i++) {
        tcp_worker_t *w = &tcp->workers[i];
        close(w->epfd);
        close(w->evfd);
        close(w->tfd);
        free(w->scratch);
        pthread_mutex_destroy(&w->lock);
    }
    free(tcp->workers);
    munmap(tcp->zeros, KVT_WIRE_MAX_PAYLOAD);
    kvt__tcp_fence_fini(tcp);
    kvt__tcp_dev_fini(tcp);
    pthread_mutex_destroy(&tcp->dev_lock);
    free(tcp);
}

/* Device memory moves through pinned host memory (tcp_dev.c) when a
 * device memory domain is built. */
#ifdef KVT_HAVE_CUDA
#define TCP_MEM (KVT__MEM_BIT(KVT_MEM_HOST) | KVT__MEM_BIT(KVT_MEM_CUDA))
#else
#define TCP_MEM KVT__MEM_BIT(KVT_MEM_HOST)
#endif

/* What peers moved into and out of this engine's memory: the workers'
 * counts (kvt_served_stats_t). */
static void tcp_served(kvt__tl_t *tl, uint64_t out[4])
{
    kvt__tcp_t *tcp = (kvt__tcp_t *)tl;

    for (unsigned i = 0; i < tcp->nworkers; i++)
        for (unsigned k = 0; k < 4; k++)
            out[k] += atomic_load_explicit(&tcp->workers[i].served[k],
                                           memory_order_relaxed);
}

/* clang-format off */
KVT_TRANSPORT_REGISTER(tcp, {
    .name = "tcp",
    .id = KVT_TRANSPORT_TCP,
    .caps = {.local_mem = TCP_MEM,
             .remote_mem = TCP_MEM,
             .flags = KVT__TL_STRIDED,
             .priority = 10},
    .create = tcp_create,
    .start = tcp_start,
    .stop = tcp_stop,
    .destroy = tcp_destroy,
    .admit = kvt__tcp_admit,
    .accept = kvt__tcp_accept,
    .mem_changed = kvt__tcp_mem_changed,
    .open = kvt__tcp_open,
    .submit = kvt__tcp_submit,
    .progress = kvt__tcp_progress,
    .detach = kvt__tcp_detach,
    .kill = kvt__tcp_session_kill,
    .served = tcp_served,
    .destroy_session = kvt__tcp_session_destroy,
});
/* clang-format on */
