/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control plane's server (ctrl.h): the engine's listener and the
 * connections that have not been handed to a data transport.
 *
 * One thread serves them all with level-triggered epoll. A connection is
 * read a frame at a time, exactly as many bytes as the frame has, so that
 * nothing that follows a HELLO is consumed before the socket is handed
 * over (the peer sends nothing more before HELLO_ACK). A connection
 * with a response to send is not read until the response has gone.
 *
 * Bounds: a connection must complete HELLO within HELLO_NS and send its
 * next request within IDLE_NS; a response must drain within the
 * engine's transfer timeout; at most max_conns wait at once (MAX_CONNS,
 * or a quarter of the descriptor limit if less): at the cap a new
 * connection takes the place of the oldest one still without HELLO, or
 * is closed when every one has said HELLO. Requests carry at most
 * REQ_BODY_MAX bytes of body and no payload.
 *
 * Out of descriptors, accept() fails and the connection stays in the
 * backlog, reported again at once: the listener would spin. So the
 * server keeps a reserve descriptor: it closes it, accepts and closes
 * what waits (the peer sees its connection closed rather than a
 * timeout), opens it again, and pauses the listener for PAUSE_NS.
 *
 * Every line a peer can cause is rate-limited (at most one a second per
 * kind) and names the peer's address, and its self-declared name escaped.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "core/ctrl.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/thread.h"
#include "util/time.h"

#define MAX_CONNS 1024
#define MIN_CONNS 16
#define DRAIN_MAX 64 /* connections closed for want of descriptors at once */
#define MAX_TAKERS 16
#define HELLO_NS (10ull * 1000000000ull)
#define IDLE_NS (60ull * 1000000000ull)
#define PAUSE_NS (100ull * 1000000ull)
#define TICK_MS 100
#define REQ_BODY_MAX 4096

typedef struct cconn {
    struct cconn *prev, *next;
    int fd;
    int hello_done;
    int closing; /* close once the response has gone */
    uint64_t deadline;
    /* Who, for log lines: "a peer at ADDR", after HELLO "\"NAME\" at
     * ADDR" (the name escaped). */
    char peer[KVT_LOG_ESC_MAX + KVT_SOCK_ADDR_MAX + 8];
    char addr[KVT_SOCK_ADDR_MAX];
    /* Authentication (auth.c): the HELLO that awaits AUTH, as sent and
     * decoded, and the nonce this side chose. */
    int auth_wait;
    kvt__wire_hello_t hello;
    uint8_t hello_raw[KVT_WIRE_HELLO_MAX];
    size_t hello_len;
    uint8_t nonce_t[KVT_WIRE_NONCE_LEN];
    /* Receiving: the header, then body_len bytes of body. */
    uint8_t hbuf[KVT_WIRE_HDR_LEN];
    kvt__wire_hdr_t hdr;
    size_t have;
    int in_body;
    uint8_t body[REQ_BODY_MAX];
    /* Sending: one buffer, header and body and payload. */
    uint8_t *out;
    size_t out_len, out_off;
} cconn_t;

struct kvt__ctrl {
    kvt_engine_h e;
    int listen_fd;
    int epfd, evfd;
    pthread_t thread;
    int running;
    cconn_t *conns; /* newest first */
    unsigned nconns, max_conns;
    uint64_t paused_until; /* listener paused (EMFILE) until then */
    int reserve_fd;        /* given up to accept when out of descriptors */
    unsigned ntakers;
    kvt__tl_t *takers[MAX_TAKERS];
};

/* A warning about a peer: at most one a second for each call site. */
#define WARN_PEER(ctrl, ...) KVT_LOG_W_RL(__VA_ARGS__)

/* Name the connection in log lines after its HELLO: @name escaped. */
static void conn_name(cconn_t *c, const char *name)
{
    char esc[KVT_LOG_ESC_MAX];
    snprintf(c->peer, sizeof(c->peer), "\"%s\" at %s",
             kvt__log_escape(esc, sizeof(esc), name), c->addr);
}

static void conn_close(kvt__ctrl_t *ctrl, cconn_t *c)
{
    epoll_ctl(ctrl->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->prev)
        c->prev->next = c->next;
    else
        ctrl->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    ctrl->nconns--;
    if (c->fd >= 0)
        close(c->fd);
    free(c->out);
    free(c);
}

static void conn_watch(kvt__ctrl_t *ctrl, cconn_t *c, uint32_t events)
{
    struct epoll_event ev = {.events = events | EPOLLRDHUP, .data.ptr = c};
    epoll_ctl(ctrl->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Send what the socket takes; 1 when the response has gone, 0 when it
 * waits for room, -1 on a failure. */
static int conn_flush(kvt__ctrl_t *ctrl, cconn_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                conn_watch(ctrl, c, EPOLLOUT);
                return 0;
            }
            return -1;
        }
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    conn_watch(ctrl, c, EPOLLIN);
    return 1;
}

/* Queue a response (header, body, and @payload, which it takes over) and
 * send what the socket takes. */
static int conn_respond(kvt__ctrl_t *ctrl, cconn_t *c, uint8_t type,
                        kvt_status_t status, const void *body, size_t blen,
                        uint8_t *payload, size_t plen)
{
    kvt__wire_hdr_t h = {0};
    uint8_t *out = malloc(KVT_WIRE_HDR_LEN + blen + plen);

    if (out == NULL) {
        free(payload);
        return -1;
    }
    h.ver_major = KVT_WIRE_VERSION_MAJOR;
    h.ver_minor = KVT_WIRE_VERSION_MINOR;
    h.type = type;
    h.status = status;
    h.body_len = (uint32_t)blen;
    h.payload_len = plen;
    h.req_id = c->hdr.req_id;
    kvt__wire_hdr_encode(&h, out);
    if (blen)
        memcpy(out + KVT_WIRE_HDR_LEN, body, blen);
    if (plen)
        memcpy(out + KVT_WIRE_HDR_LEN + blen, payload, plen);
    free(payload);
    c->out = out;
    c->out_len = KVT_WIRE_HDR_LEN + blen + plen;
    c->out_off = 0;
    c->deadline = kvt__now_ns() + ctrl->e->cfg.timeout_ns;
    return conn_flush(ctrl, c) < 0 ? -1 : 0;
}

/* Answer ERROR with @why and close once it has gone. */
static int conn_refuse(kvt__ctrl_t *ctrl, cconn_t *c, kvt_status_t st,
                       const char *why)
{
    c->closing = 1;
    atomic_fetch_add_explicit(&ctrl->e->stats.hs_refused, 1,
                              memory_order_relaxed);
    return conn_respond(ctrl, c, KVT_WIRE_ERROR, st, why, strlen(why), NULL, 0);
}

static kvt__tl_t *taker_of(kvt__ctrl_t *ctrl, uint32_t id)
{
    for (unsigned i = 0; i < ctrl->ntakers; i++)
        if (ctrl->takers[i]->ops->id == id)
            return ctrl->takers[i];
    return NULL;
}

static int send_hello_ack(kvt__ctrl_t *ctrl, cconn_t *c)
{
    const char *name = ctrl->e->cfg.seg_name;
    uint8_t body[2 + KVT_WIRE_NAME_MAX];
    size_t n = kvt__wire_put_str(body, name);

    return conn_respond(ctrl, c, KVT_WIRE_HELLO_ACK, KVT_OK, body, n, NULL, 0);
}

static int hello_accept(kvt__ctrl_t *ctrl, cconn_t *c,
                        const kvt__wire_hello_t *hello);

/*
 * Authentication, before anything else is served (docs/security.md):
 * answer a HELLO with AUTH_CHALLENGE, or refuse a peer whose HELLO does
 * not match this engine's setting. The AUTH that must follow comes
 * within the HELLO deadline. Same returns as on_hello().
 */
static int auth_begin(kvt__ctrl_t *ctrl, cconn_t *c,
                      const kvt__wire_hello_t *hello)
{
    uint8_t out[KVT_WIRE_CHALLENGE_MIN + KVT_WIRE_NAME_MAX];
    size_t n;

    if (!hello->auth || !ctrl->e->cfg.auth.on) {
        WARN_PEER(ctrl, "control: authentication failed: %s %s", c->peer,
                  hello->auth ? "offers an auth token, this engine has none"
                              : "offers no auth token");
        return conn_refuse(ctrl, c, KVT_ERR_ACCESS,
                           hello->auth ? "authentication failed: this engine "
                                         "has no auth token set"
                                       : "authentication failed: this engine "
                                         "requires an auth token");
    }
    if (kvt__ctrl_auth_challenge(&ctrl->e->cfg.auth, c->body, c->hdr.body_len,
                                 ctrl->e->cfg.seg_name, c->nonce_t, out,
                                 &n) != KVT_OK)
        return -1;
    c->auth_wait = 1;
    c->hello = *hello;
    memcpy(c->hello_raw, c->body, c->hdr.body_len);
    c->hello_len = c->hdr.body_len;
    return conn_respond(ctrl, c, KVT_WIRE_AUTH_CHALLENGE, KVT_OK, out, n, NULL,
                        0);
}

/* AUTH: the peer's proof, then the HELLO it completes. */
static int on_auth(kvt__ctrl_t *ctrl, cconn_t *c)
{
    if (!c->auth_wait)
        return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL, "AUTH unasked for");
    c->auth_wait = 0;
    if (!kvt__ctrl_auth_verify(&ctrl->e->cfg.auth, c->hello_raw, c->hello_len,
                               ctrl->e->cfg.seg_name, c->nonce_t, c->body,
                               c->hdr.body_len)) {
        WARN_PEER(ctrl,
                  "control: authentication failed: %s did not prove the "
                  "auth token (another token?)",
                  c->peer);
        return conn_refuse(ctrl, c, KVT_ERR_ACCESS,
                           "authentication failed: wrong auth token");
    }
    return hello_accept(ctrl, c, &c->hello);
}

/* A HELLO: a control connection stays, a data connection goes to its
 * transport (after AUTH, when either side has a token). Returns -1 when
 * the connection is to be closed now, 1 when it was handed over, 0 to go
 * on. */
static int on_hello(kvt__ctrl_t *ctrl, cconn_t *c)
{
    kvt__wire_hello_t hello;

    if (c->hello_done)
        return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL, "HELLO repeated");
    if (kvt__wire_hello_decode(c->body, c->hdr.body_len, &hello) != KVT_OK) {
        WARN_PEER(ctrl, "control: malformed HELLO from %s; closing", c->peer);
        return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL, "malformed HELLO");
    }
    conn_name(c, hello.name);
    c->hello_done = 1;
    if (hello.auth || ctrl->e->cfg.auth.on)
        return auth_begin(ctrl, c, &hello);
    return hello_accept(ctrl, c, &hello);
}

/* The rest of HELLO, once the peer is admitted. */
static int hello_accept(kvt__ctrl_t *ctrl, cconn_t *c,
                        const kvt__wire_hello_t *hello)
{
    kvt__wire_hello_t h = *hello; /* @hello may be @c's, freed below */
    kvt__tl_t *t;
    int fd;

    hello = &h;
    c->deadline = kvt__now_ns() + IDLE_NS;
    if (hello->transport == 0)
        return send_hello_ack(ctrl, c);
    t = taker_of(ctrl, hello->transport);
    if (t == NULL) {
        char why[96];
        snprintf(why, sizeof(why), "transport %#x is not served by this engine",
                 hello->transport);
        WARN_PEER(ctrl, "control: %s asked for %s", c->peer, why);
        return conn_refuse(ctrl, c, KVT_ERR_NOT_SUPPORTED, why);
    }
    if (t->ops->admit != NULL) {
        const char *why = NULL;
        kvt_status_t st = t->ops->admit(t, hello, &why);
        if (st != KVT_OK) {
            WARN_PEER(ctrl, "control: %s refused by %s: %s", c->peer,
                      t->ops->name, why != NULL ? why : kvt_status_str(st));
            return conn_refuse(ctrl, c, st,
                               why != NULL ? why : kvt_status_str(st));
        }
    }
    /* The acknowledgement is a few bytes on a fresh socket: it goes at
     * once, or the connection is not worth keeping. */
    if (send_hello_ack(ctrl, c) != 0 || c->out != NULL)
        return -1;
    fd = c->fd;
    epoll_ctl(ctrl->epfd, EPOLL_CTL_DEL, fd, NULL);
    c->fd = -1;
    conn_close(ctrl, c);
    if (t->ops->accept(t, fd, hello) != KVT_OK)
        KVT_LOG_W("control: transport %s could not take a connection",
                  t->ops->name);
    return 1;
}

static int on_seg_query(kvt__ctrl_t *ctrl, cconn_t *c)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    kvt_status_t st = kvt__engine_segdesc(ctrl->e, &buf, &len);

    if (st != KVT_OK) {
        KVT_LOG_E("control: cannot describe this engine: %s",
                  kvt_status_str(st));
        return conn_respond(ctrl, c, KVT_WIRE_SEG_DESC, st, NULL, 0, NULL, 0);
    }
    return conn_respond(ctrl, c, KVT_WIRE_SEG_DESC, KVT_OK, NULL, 0, buf, len);
}

/* A whole request is in. Same returns as on_hello(). */
static int dispatch(kvt__ctrl_t *ctrl, cconn_t *c)
{
    const kvt__wire_hdr_t *h = &c->hdr;

    if (!c->hello_done && h->type != KVT_WIRE_HELLO) {
        WARN_PEER(ctrl, "control: %s sent %s before HELLO; closing", c->peer,
                  kvt__wire_type_name(h->type));
        return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL, "HELLO expected");
    }
    if (c->auth_wait && h->type != KVT_WIRE_AUTH) {
        WARN_PEER(ctrl, "control: authentication failed: %s sent %s, not AUTH",
                  c->peer, kvt__wire_type_name(h->type));
        return conn_refuse(ctrl, c, KVT_ERR_ACCESS,
                           "authentication failed: AUTH expected");
    }
    if (!c->auth_wait)
        c->deadline = kvt__now_ns() + IDLE_NS;
    switch (h->type) {
    case KVT_WIRE_HELLO:
        return on_hello(ctrl, c);
    case KVT_WIRE_AUTH:
        return on_auth(ctrl, c);
    case KVT_WIRE_SEG_QUERY:
        return on_seg_query(ctrl, c);
    case KVT_WIRE_PING:
        return conn_respond(ctrl, c, KVT_WIRE_PONG, KVT_OK, NULL, 0, NULL, 0);
    default:
        WARN_PEER(ctrl, "control: unexpected %s from %s; closing",
                  kvt__wire_type_name(h->type), c->peer);
        return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL,
                           "not a control-plane request");
    }
}

/* Read what has come; -1 to close, 1 when handed over, 0 to go on. */
static int conn_rx(kvt__ctrl_t *ctrl, cconn_t *c)
{
    for (;;) {
        size_t want = c->in_body ? c->hdr.body_len : KVT_WIRE_HDR_LEN;
        uint8_t *dst = c->in_body ? c->body : c->hbuf;
        ssize_t n;

        if (c->out != NULL || c->closing)
            return 0; /* one request at a time */
        while (c->have < want) {
            n = recv(c->fd, dst + c->have, want - c->have, MSG_DONTWAIT);
            if (n == 0)
                return -1;
            if (n < 0)
                return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
            c->have += (size_t)n;
        }
        c->have = 0;
        if (!c->in_body) {
            kvt_status_t st =
                kvt__wire_hdr_decode(c->hbuf, KVT_WIRE_HDR_LEN, &c->hdr);
            if (st == KVT_ERR_VERSION) {
                char msg[96];
                snprintf(msg, sizeof(msg),
                         "kvt protocol %d.%d required, peer sent %u.%u",
                         KVT_WIRE_VERSION_MAJOR, KVT_WIRE_VERSION_MINOR,
                         c->hdr.ver_major, c->hdr.ver_minor);
                WARN_PEER(ctrl, "control: refusing %s: %s", c->peer, msg);
                return conn_refuse(ctrl, c, KVT_ERR_VERSION, msg);
            }
            if (st != KVT_OK || c->hdr.body_len > REQ_BODY_MAX ||
                c->hdr.payload_len != 0) {
                WARN_PEER(ctrl, "control: malformed frame from %s; closing",
                          c->peer);
                return conn_refuse(ctrl, c, KVT_ERR_PROTOCOL,
                                   "malformed frame");
            }
            if (c->hdr.body_len > 0) {
                c->in_body = 1;
                continue;
            }
        }
        c->in_body = 0;
        {
            int r = dispatch(ctrl, c);
            if (r != 0)
                return r;
        }
    }
}

static void conn_event(kvt__ctrl_t *ctrl, cconn_t *c, uint32_t events)
{
    int r = 0;

    if (events & EPOLLOUT) {
        r = conn_flush(ctrl, c);
        if (r == 1 && c->closing)
            r = -1;
        else if (r == 1)
            r = 0;
    }
    if (r == 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)))
        r = conn_rx(ctrl, c);
    if (r == 1)
        return; /* handed over and freed */
    if (r == 0 && c->closing && c->out == NULL)
        r = -1;
    if (r < 0)
        conn_close(ctrl, c);
}

/*
 * Out of descriptors: close what waits in the backlog with the reserve
 * descriptor (at most DRAIN_MAX), so that those peers learn it now and
 * the listener does not report them again and again, and pause the
 * listener for PAUSE_NS.
 */
static void accept_starved(kvt__ctrl_t *ctrl, int err)
{
    unsigned dropped = 0;
    char addr[KVT_SOCK_ADDR_MAX] = "?";

    while (ctrl->reserve_fd >= 0 && dropped < DRAIN_MAX) {
        int fd;
        close(ctrl->reserve_fd);
        fd = accept4(ctrl->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            kvt__sock_peer_str(fd, addr, sizeof(addr));
            close(fd);
            dropped++;
        }
        ctrl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
    }
    if (dropped > 0)
        atomic_fetch_add_explicit(&ctrl->e->stats.hs_refused, dropped,
                                  memory_order_relaxed);
    WARN_PEER(ctrl,
              "control: accept: %s; closed %u connection(s) (the last from "
              "%s), pausing the listener",
              strerror(err), dropped, addr);
    ctrl->paused_until = kvt__now_ns() + PAUSE_NS;
    epoll_ctl(ctrl->epfd, EPOLL_CTL_DEL, ctrl->listen_fd, NULL);
}

/* At the cap: make room by closing the oldest connection still without
 * HELLO. 0 when there was one, -1 when every connection has said HELLO. */
static int evict_oldest_unnamed(kvt__ctrl_t *ctrl)
{
    cconn_t *c, *victim = NULL;

    for (c = ctrl->conns; c != NULL; c = c->next)
        if (!c->hello_done)
            victim = c; /* the list is newest first */
    if (victim == NULL)
        return -1;
    WARN_PEER(ctrl,
              "control: %u connections wait; closing %s, which has not "
              "said HELLO",
              ctrl->nconns, victim->peer);
    atomic_fetch_add_explicit(&ctrl->e->stats.hs_refused, 1,
                              memory_order_relaxed);
    conn_close(ctrl, victim);
    return 0;
}

static void accept_all(kvt__ctrl_t *ctrl)
{
    for (;;) {
        struct epoll_event ev;
        cconn_t *c;
        int fd =
            accept4(ctrl->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM)
                accept_starved(ctrl, errno);
            return;
        }
        if (ctrl->nconns >= ctrl->max_conns &&
            evict_oldest_unnamed(ctrl) != 0) {
            char addr[KVT_SOCK_ADDR_MAX];
            WARN_PEER(ctrl,
                      "control: %u connections wait for an answer; "
                      "refusing one from %s",
                      ctrl->nconns, kvt__sock_peer_str(fd, addr, sizeof(addr)));
            atomic_fetch_add_explicit(&ctrl->e->stats.hs_refused, 1,
                                      memory_order_relaxed);
            close(fd);
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        kvt__sock_tune(fd, ctrl->e->cfg.timeout_ns / 1000000);
        c->fd = fd;
        c->deadline = kvt__now_ns() + HELLO_NS;
        kvt__sock_peer_str(fd, c->addr, sizeof(c->addr));
        snprintf(c->peer, sizeof(c->peer), "a peer at %s", c->addr);
        ev =
            (struct epoll_event){.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(ctrl->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = ctrl->conns;
        if (ctrl->conns)
            ctrl->conns->prev = c;
        ctrl->conns = c;
        ctrl->nconns++;
    }
}

static void listener_watch(kvt__ctrl_t *ctrl)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = ctrl};
    epoll_ctl(ctrl->epfd, EPOLL_CTL_ADD, ctrl->listen_fd, &ev);
}

static void tick(kvt__ctrl_t *ctrl, uint64_t now)
{
    cconn_t *c, *next;

    if (ctrl->paused_until != 0 && now >= ctrl->paused_until) {
        ctrl->paused_until = 0;
        if (ctrl->reserve_fd < 0)
            ctrl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        listener_watch(ctrl);
    }
    for (c = ctrl->conns; c != NULL; c = next) {
        next = c->next;
        if (now >= c->deadline) {
            KVT_LOG_D("control: closing a connection of %s: %s", c->peer,
                      !c->hello_done ? "no HELLO in time"
                      : c->out       ? "its answer was not read in time"
                                     : "idle");
            conn_close(ctrl, c);
        }
    }
}

static void *server_main(void *arg)
{
    kvt__ctrl_t *ctrl = arg;
    struct epoll_event evs[64];
    uint64_t last = kvt__now_ns();

    kvt__thread_name("kvt-ctrl");
    for (;;) {
        int n = epoll_wait(ctrl->epfd, evs, 64, TICK_MS), listener = 0;
        uint64_t now;

        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)&ctrl->evfd)
                return NULL;
            if (p == (void *)ctrl)
                listener = 1;
            else
                conn_event(ctrl, p, evs[i].events);
        }
        /* Accepting may close a connection (at the cap): after the round,
         * so that no event of it still names the connection. */
        if (listener)
            accept_all(ctrl);
        now = kvt__now_ns();
        if (now - last >= TICK_MS * 1000000ull) {
            last = now;
            tick(ctrl, now);
        }
    }
}

kvt_status_t kvt__ctrl_create(kvt_engine_h e, const char *host, uint16_t port,
                              uint16_t *port_p, kvt__ctrl_t **ctrl_p)
{
    struct epoll_event ev;
    struct rlimit rl;
    kvt__ctrl_t *ctrl = calloc(1, sizeof(*ctrl));
    kvt_status_t st;

    if (ctrl == NULL)
        return KVT_ERR_NO_MEMORY;
    ctrl->e = e;
    ctrl->epfd = ctrl->evfd = -1;
    ctrl->max_conns = MAX_CONNS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 4 < MAX_CONNS)
        ctrl->max_conns = rl.rlim_cur / 4 > MIN_CONNS
                              ? (unsigned)(rl.rlim_cur / 4)
                              : MIN_CONNS;
    st = kvt__sock_listen(host, port, &ctrl->listen_fd, port_p);
    if (st != KVT_OK)
        goto err_free;
    st = KVT_ERR_IO;
    ctrl->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctrl->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctrl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (ctrl->epfd < 0 || ctrl->evfd < 0 || ctrl->reserve_fd < 0)
        goto err_close;
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &ctrl->evfd};
    if (epoll_ctl(ctrl->epfd, EPOLL_CTL_ADD, ctrl->evfd, &ev) != 0)
        goto err_close;
    listener_watch(ctrl);
    *ctrl_p = ctrl;
    return KVT_OK;

err_close:
    if (ctrl->reserve_fd >= 0)
        close(ctrl->reserve_fd);
    if (ctrl->epfd >= 0)
        close(ctrl->epfd);
    if (ctrl->evfd >= 0)
        close(ctrl->evfd);
    close(ctrl->listen_fd);
err_free:
    free(ctrl);
    return st;
}

kvt_status_t kvt__ctrl_add_taker(kvt__ctrl_t *ctrl, kvt__tl_t *tl)
{
    if (ctrl->ntakers == MAX_TAKERS || taker_of(ctrl, tl->ops->id) != NULL)
        return KVT_ERR_EXISTS;
    ctrl->takers[ctrl->ntakers++] = tl;
    return KVT_OK;
}

kvt_status_t kvt__ctrl_start(kvt__ctrl_t *ctrl)
{
    if (pthread_create(&ctrl->thread, NULL, server_main, ctrl) != 0) {
        KVT_LOG_E("control: cannot start the server thread");
        return KVT_ERR_IO;
    }
    ctrl->running = 1;
    return KVT_OK;
}

void kvt__ctrl_stop(kvt__ctrl_t *ctrl)
{
    uint64_t one = 1;

    if (ctrl == NULL || !ctrl->running)
        return;
    if (write(ctrl->evfd, &one, sizeof(one)) < 0)
        (void)0;
    pthread_join(ctrl->thread, NULL);
    ctrl->running = 0;
    while (ctrl->conns != NULL)
        conn_close(ctrl, ctrl->conns);
    close(ctrl->listen_fd);
    ctrl->listen_fd = -1;
}

void kvt__ctrl_destroy(kvt__ctrl_t *ctrl)
{
    if (ctrl == NULL)
        return;
    kvt__ctrl_stop(ctrl);
    while (ctrl->conns != NULL)
        conn_close(ctrl, ctrl->conns);
    if (ctrl->listen_fd >= 0)
        close(ctrl->listen_fd);
    close(ctrl->epfd);
    close(ctrl->evfd);
    if (ctrl->reserve_fd >= 0)
        close(ctrl->reserve_fd);
    free(ctrl);
}
