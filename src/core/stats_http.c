/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process's /metrics listener (include/kvt/metrics.h): an HTTP/1.1
 * server on a thread of its own that answers GET /metrics with the text
 * of every live engine and of the sources added to it, and GET /health.
 * One poll loop serves every connection without blocking: a request is
 * read, then its answer sent, as each socket allows.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "core/stats.h"
#include "core/stats_prom.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/thread.h"
#include "util/time.h"

/* What it serves (the engines, the sources) and itself, under one lock. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static kvt_engine_h *engines;
static size_t nengines, cengines;
static struct provider {
    void *owner;
    kvt_metrics_text_fn fn;
} * providers;
static size_t nproviders, cproviders;
static int lst_fd = -1;
static uint16_t lst_port;
static pthread_t lst_thread;
static int env_tried;

#define MAX_CLIENTS 64
#define REQ_MAX 4096
#define REQ_NS (2000ull * 1000000ull)
/* A client has this long from the end of its request to take the whole
 * answer; one that reads slower, or not at all, is dropped then. The
 * answer is sent as the socket takes it, between the other clients'
 * turns, so that a slow client never stalls the thread. */
#define SEND_NS (10000ull * 1000000ull)

/* The text of every live engine, malloc'd into *buf_p. */
static size_t all_text(char **buf_p)
{
    kvt__prom_out_t o = {NULL, 0, 0};

    for (int pass = 0; pass < 2; pass++) {
        pthread_mutex_lock(&reg_lock);
        for (size_t i = 0; i < nengines; i++)
            kvt__prom_engine(engines[i], &o, i == 0);
        for (size_t i = 0; i < nproviders; i++)
            o.len += providers[i].fn(providers[i].owner,
                                     o.len < o.cap ? o.buf + o.len : NULL,
                                     o.len < o.cap ? o.cap - o.len : 0, i == 0);
        pthread_mutex_unlock(&reg_lock);
        if (pass == 0) {
            /* Room for what may have grown in between. */
            o.cap = o.len + 65536;
            o.buf = malloc(o.cap);
            if (o.buf == NULL)
                return 0;
            o.len = 0;
        }
    }
    if (o.len >= o.cap)
        o.len = o.cap - 1;
    o.buf[o.len] = '\0';
    *buf_p = o.buf;
    return o.len;
}

typedef struct {
    int fd;
    uint64_t deadline; /* of its request, then of its answer */
    size_t got;
    char req[REQ_MAX];
    /* The answer, once the request is read: the header, then the body
     * (malloc'd), @off bytes of both sent so far. */
    int answering;
    char hdr[256];
    size_t hlen, off;
    char *body;
    size_t blen;
} client_t;

/* Send what the socket takes of @c's answer now. Returns 1 when the
 * answer is sent or the client is gone, 0 when the socket is full. */
static int answer_more(client_t *c)
{
    while (c->off < c->hlen + c->blen) {
        struct iovec iov[2];
        struct msghdr mh = {.msg_iov = iov};
        ssize_t w;

        if (c->off < c->hlen) {
            iov[0] = (struct iovec){c->hdr + c->off, c->hlen - c->off};
            iov[1] = (struct iovec){c->body, c->blen};
            mh.msg_iovlen = c->blen > 0 ? 2 : 1;
        } else {
            iov[0] = (struct iovec){c->body + (c->off - c->hlen),
                                    c->blen - (c->off - c->hlen)};
            mh.msg_iovlen = 1;
        }
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (w <= 0)
            return 1;
        c->off += (size_t)w;
    }
    return 1;
}

/* Prepare the answer to @c's request, and send what fits now. Returns as
 * answer_more(). */
static int answer(client_t *c, uint64_t now)
{
    const char *type = "text/plain; charset=utf-8", *status = "200 OK";
    int is_get = strncmp(c->req, "GET ", 4) == 0;

    c->body = NULL;
    c->blen = 0;
    if (is_get && (strncmp(c->req + 4, "/metrics ", 9) == 0 ||
                   strncmp(c->req + 4, "/metrics?", 9) == 0)) {
        c->blen = all_text(&c->body);
        type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (is_get && strncmp(c->req + 4, "/health ", 8) == 0) {
        c->body = strdup("ok\n");
        c->blen = c->body != NULL ? 3 : 0;
    } else {
        status = is_get ? "404 Not Found" : "405 Method Not Allowed";
    }
    if (is_get && c->body == NULL && strcmp(status, "200 OK") == 0)
        status = "503 Service Unavailable"; /* out of memory */
    c->hlen = (size_t)snprintf(
        c->hdr, sizeof(c->hdr),
        "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
        "Connection: close\r\n\r\n",
        status, type, c->blen);
    c->off = 0;
    c->answering = 1;
    c->deadline = now + SEND_NS;
    return answer_more(c);
}

static void *lst_main(void *arg)
{
    static client_t cl[MAX_CLIENTS];
    struct pollfd pf[MAX_CLIENTS + 1];
    unsigned n = 0;

    kvt__thread_name("kvt-stats");
    (void)arg;
    for (;;) {
        uint64_t now = kvt__now_ns();
        int r;
        pf[0] = (struct pollfd){.fd = lst_fd,
                                .events = n < MAX_CLIENTS ? POLLIN : 0};
        for (unsigned i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){
                .fd = cl[i].fd, .events = cl[i].answering ? POLLOUT : POLLIN};
        r = poll(pf, n + 1, 200);
        if (r < 0 && errno != EINTR)
            break;
        now = kvt__now_ns();
        for (unsigned i = 0; i < n;) {
            client_t *c = &cl[i];
            int done = 0;
            if (c->answering) {
                if (pf[i + 1].revents != 0)
                    done = answer_more(c);
            } else if (pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t got = recv(c->fd, c->req + c->got, REQ_MAX - 1 - c->got,
                                   MSG_DONTWAIT);
                if (got <= 0) {
                    done = got == 0 || (errno != EAGAIN && errno != EINTR);
                } else {
                    c->got += (size_t)got;
                    c->req[c->got] = '\0';
                    if (strstr(c->req, "\r\n\r\n") != NULL ||
                        strstr(c->req, "\n\n") != NULL) {
                        done = answer(c, now);
                    } else if (c->got >= REQ_MAX - 1) {
                        done = 1; /* too long: dropped */
                    }
                }
            }
            if (!done && now >= c->deadline)
                done = 1; /* too slow: dropped */
            if (done) {
                close(c->fd);
                free(c->body);
                cl[i] = cl[--n];
                pf[i + 1] = pf[n + 1];
                continue;
            }
            i++;
        }
        if ((pf[0].revents & POLLIN) && n < MAX_CLIENTS) {
            int fd = accept4(lst_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                cl[n].fd = fd;
                cl[n].got = 0;
                cl[n].answering = 0;
                cl[n].body = NULL;
                cl[n].deadline = now + REQ_NS;
                n++;
            } else if (errno == EMFILE || errno == ENFILE) {
                usleep(100000); /* at the descriptor limit: back off */
            }
        }
    }
    return NULL;
}

kvt_status_t kvt_metrics_listen(const char *host, uint16_t port,
                                uint16_t *port_p)
{
    kvt_status_t st = KVT_OK;
    int fd = -1;

    pthread_mutex_lock(&reg_lock);
    if (lst_fd >= 0) {
        if (port_p != NULL)
            *port_p = lst_port;
        pthread_mutex_unlock(&reg_lock);
        return KVT_ERR_EXISTS;
    }
    st = kvt__sock_listen(host != NULL && host[0] != '\0' ? host : "127.0.0.1",
                          port, &fd, &port);
    if (st != KVT_OK)
        st = KVT_ERR_IO;
    if (st == KVT_OK) {
        lst_fd = fd;
        lst_port = port;
        if (pthread_create(&lst_thread, NULL, lst_main, NULL) != 0) {
            close(fd);
            lst_fd = -1;
            lst_port = 0;
            st = KVT_ERR_NO_MEMORY;
        } else {
            pthread_detach(lst_thread);
            KVT_LOG_I("metrics at http://%s:%u/metrics",
                      host != NULL && host[0] != '\0' ? host : "127.0.0.1",
                      port);
        }
    } else {
        KVT_LOG_E("metrics: cannot listen on %s:%u",
                  host != NULL && host[0] != '\0' ? host : "127.0.0.1", port);
    }
    if (st == KVT_OK && port_p != NULL)
        *port_p = port;
    pthread_mutex_unlock(&reg_lock);
    return st;
}

uint16_t kvt_metrics_port(void)
{
    uint16_t p;

    pthread_mutex_lock(&reg_lock);
    p = lst_fd >= 0 ? lst_port : 0;
    pthread_mutex_unlock(&reg_lock);
    return p;
}

/* A child forked while another thread held the lock (a scrape) would
 * find it held for ever: fork waits for it, and the child gets it free
 * (kvt_doctor_run() forks, and creates engines in the child). */
static void fork_prepare(void)
{
    pthread_mutex_lock(&reg_lock);
}

static void fork_after(void)
{
    pthread_mutex_unlock(&reg_lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_after, fork_after);
}

kvt_status_t kvt__stats_list(kvt_engine_h e)
{
    kvt_engine_h *n;
    const char *port;
    int try_env = 0;

    pthread_once(&fork_once, fork_handlers);
    pthread_mutex_lock(&reg_lock);
    if (nengines == cengines) {
        size_t cap = cengines ? 2 * cengines : 8;
        n = realloc(engines, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&reg_lock);
            return KVT_ERR_NO_MEMORY;
        }
        engines = n;
        cengines = cap;
    }
    engines[nengines++] = e;
    if (!env_tried) {
        env_tried = 1;
        try_env = 1;
    }
    pthread_mutex_unlock(&reg_lock);
    port = getenv("KVT_METRICS_PORT");
    if (try_env && port != NULL && port[0] != '\0') {
        char *end;
        unsigned long p = strtoul(port, &end, 10);
        if (*end != '\0' || p > 65535)
            KVT_LOG_E("KVT_METRICS_PORT=%s is not a port", port);
        else
            kvt_metrics_listen(getenv("KVT_METRICS_HOST"), (uint16_t)p, NULL);
    }
    return KVT_OK;
}

kvt_status_t kvt_metrics_source_add(void *owner, kvt_metrics_text_fn fn)
{
    if (owner == NULL || fn == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&reg_lock);
    if (nproviders == cproviders) {
        size_t cap = cproviders ? 2 * cproviders : 4;
        struct provider *n = realloc(providers, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&reg_lock);
            return KVT_ERR_NO_MEMORY;
        }
        providers = n;
        cproviders = cap;
    }
    providers[nproviders++] = (struct provider){owner, fn};
    pthread_mutex_unlock(&reg_lock);
    return KVT_OK;
}

void kvt_metrics_source_del(void *owner)
{
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < nproviders; i++) {
        if (providers[i].owner == owner) {
            providers[i] = providers[--nproviders];
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}

void kvt__stats_unlist(kvt_engine_h e)
{
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < nengines; i++) {
        if (engines[i] == e) {
            engines[i] = engines[--nengines];
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}
