/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's messages (active messages): the handlers keep what
 * arrives as events, handled by the worker once it is out of ucp's
 * progress; the target's side of sessions (inbound peers: HELLO,
 * HELLO_ACK back, notifications, registry changes and their
 * acknowledgements); closing endpoints in the background.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx/ucx.h"
#include "util/auth.h"
#include "util/log.h"
#include "util/time.h"

static ucs_status_t am_recv(void *arg, const void *header, size_t hlen,
                            void *data, size_t len,
                            const ucp_am_recv_param_t *param)
{
    ucx_worker_t *wk = arg;
    ucx_am_hdr_t h;
    ucx_event_t *ev;

    /* Every message is sent eagerly and whole; anything else, or a
     * header of another size, is not ours. */
    if (hlen != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        len > KVT_NOTIFY_MAX + KVT_WIRE_NAME_MAX + UCX_ADDR_MAX) {
        KVT_LOG_W("ucx: a malformed message (header %zu, %zu bytes) dropped",
                  hlen, len);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    ev = malloc(sizeof(*ev) + len);
    if (ev == NULL) {
        KVT_LOG_E("ucx: out of memory: a message dropped");
        return UCS_OK;
    }
    ev->next = NULL;
    ev->token = h.token;
    ev->value = h.value;
    ev->len = len;
    memcpy(ev->data, data, len);
    /* The id is recovered from which handler ran (see the thunks). */
    ev->id = 0;
    if (wk->ev_tail)
        wk->ev_tail->next = ev;
    else
        wk->ev_head = ev;
    wk->ev_tail = ev;
    return UCS_OK;
}

#define AM_THUNK(ID)                                                           \
    static ucs_status_t am_##ID(void *arg, const void *h, size_t hl, void *d,  \
                                size_t l, const ucp_am_recv_param_t *p)        \
    {                                                                          \
        ucx_worker_t *wk = arg;                                                \
        ucx_event_t *last = wk->ev_tail;                                       \
        ucs_status_t st = am_recv(arg, h, hl, d, l, p);                        \
        if (wk->ev_tail != last)                                               \
            wk->ev_tail->id = ID;                                              \
        return st;                                                             \
    }
AM_THUNK(UCX_AM_HELLO)
AM_THUNK(UCX_AM_HELLO_ACK)
AM_THUNK(UCX_AM_BYE)
AM_THUNK(UCX_AM_NOTIFY)
AM_THUNK(UCX_AM_REG_CHANGED)
AM_THUNK(UCX_AM_REG_ACK)
AM_THUNK(UCX_AM_AUTH)

kvt_status_t kvt__ucx_am_setup(ucx_worker_t *wk)
{
    static const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } handlers[] = {
        {UCX_AM_HELLO, am_UCX_AM_HELLO},
        {UCX_AM_HELLO_ACK, am_UCX_AM_HELLO_ACK},
        {UCX_AM_BYE, am_UCX_AM_BYE},
        {UCX_AM_NOTIFY, am_UCX_AM_NOTIFY},
        {UCX_AM_REG_CHANGED, am_UCX_AM_REG_CHANGED},
        {UCX_AM_REG_ACK, am_UCX_AM_REG_ACK},
        {UCX_AM_AUTH, am_UCX_AM_AUTH},
    };

    for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++) {
        ucp_am_handler_param_t p = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                          UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                          UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = handlers[i].id,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
            .cb = handlers[i].cb,
            .arg = wk,
        };
        ucs_status_t st = ucp_worker_set_am_recv_handler(wk->w, &p);
        if (st != UCS_OK) {
            KVT_LOG_E("ucx: cannot set a message handler: %s",
                      ucs_status_string(st));
            return KVT_ERR_IO;
        }
    }
    return KVT_OK;
}

/* ---- Sending ---------------------------------------------------------------
 */

/* What a message in flight holds: its header and data must live until
 * ucp is done with them. */
typedef struct {
    ucx_am_hdr_t h;
    ucx_unit_t *u;
    size_t len;
    uint8_t data[];
} am_buf_t;

static void am_sent(void *req, ucs_status_t status, void *user)
{
    am_buf_t *b = user;

    if (b->u != NULL && kvt__ucx_unit_orphan_done(b->u)) {
        b->u = NULL;
    } else if (b->u != NULL) {
        if (status != UCS_OK && b->u->status == KVT_OK)
            b->u->status = kvt__ucx_status(status);
        b->u->refs--;
        kvt__ucx_sess_touch(b->u->s);
    }
    free(b);
    ucp_request_free(req);
}

kvt_status_t kvt__ucx_am_send(ucp_ep_h ep, unsigned id, uint64_t token,
                              uint64_t value, const void *data, size_t len,
                              ucx_unit_t *u)
{
    ucp_request_param_t p = {0};
    am_buf_t *b = malloc(sizeof(*b) + len);
    void *r;

    if (b == NULL)
        return KVT_ERR_NO_MEMORY;
    b->h = (ucx_am_hdr_t){token, value};
    b->u = u;
    b->len = len;
    if (len > 0)
        memcpy(b->data, data, len);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = am_sent;
    p.user_data = b;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    r = ucp_am_send_nbx(ep, id, &b->h, sizeof(b->h), b->data, len, &p);
    if (r == NULL) {
        free(b);
        return KVT_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        free(b);
        return kvt__ucx_status(UCS_PTR_STATUS(r));
    }
    if (u != NULL)
        u->refs++;
    return KVT_OK;
}

/* ---- Closing endpoints -----------------------------------------------------
 */

void kvt__ucx_ep_close(ucx_worker_t *wk, ucp_ep_h ep, int force)
{
    ucp_request_param_t p = {0};
    void *r;

    if (ep == NULL)
        return;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    r = ucp_ep_close_nbx(ep, &p);
    if (r == NULL || UCS_PTR_IS_ERR(r))
        return;
    if (wk->nclosing == wk->closing_cap) {
        unsigned cap = wk->closing_cap ? 2 * wk->closing_cap : 16;
        void **n = realloc(wk->closing, cap * sizeof(*n));
        if (n == NULL) {
            /* Left to ucp, which frees it with the worker. */
            KVT_LOG_E("ucx: out of memory: an endpoint closes unwatched");
            return;
        }
        wk->closing = n;
        wk->closing_cap = cap;
    }
    wk->closing[wk->nclosing++] = r;
}

int kvt__ucx_closing_reap(ucx_worker_t *wk)
{
    unsigned k = 0;

    for (unsigned i = 0; i < wk->nclosing; i++) {
        if (ucp_request_check_status(wk->closing[i]) != UCS_INPROGRESS)
            ucp_request_free(wk->closing[i]);
        else
            wk->closing[k++] = wk->closing[i];
    }
    wk->nclosing = k;
    return k > 0;
}

/* ---- Target side: inbound peers --------------------------------------------
 */

static ucx_inbound_t *inbound_find(ucx_worker_t *wk, uint64_t token)
{
    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next)
        if (in->token == token && !in->dead)
            return in;
    return NULL;
}

/* Drop @in (@failed: and its connection, which is not trusted any more);
 * an acknowledgement it owed is not waited for any more. */
static void inbound_drop(ucx_worker_t *wk, ucx_inbound_t *in, int failed)
{
    if (in->dead)
        return;
    in->dead = 1;
    wk->inbound_dead = 1;
    if (in->owed != 0) {
        kvt__ucx_regchg_ack(wk->ucx, in->owed);
        in->owed = 0;
    }
    if (in->conn != NULL) {
        if (failed)
            kvt__ucx_conn_fail(in->conn);
        kvt__ucx_conn_put(wk, in->conn);
        in->conn = NULL;
    }
}

static void inbound_reap(ucx_worker_t *wk)
{
    ucx_inbound_t **pp = &wk->inbound;

    while (*pp != NULL) {
        ucx_inbound_t *in = *pp;
        if (in->error && !in->dead)
            inbound_drop(wk, in, 1);
        if (in->dead) {
            *pp = in->next;
            atomic_fetch_sub(&wk->ucx->ninbound, 1);
            free(in);
        } else {
            pp = &in->next;
        }
    }
    wk->inbound_error = 0;
    wk->inbound_dead = 0;
}

/* Drop @in, which has not proved the token: no message of it is owed an
 * answer, and its connection goes unless another session uses it. */
static void inbound_drop_untrusted(ucx_worker_t *wk, ucx_inbound_t *in)
{
    if (in->dead)
        return;
    if (in->conn != NULL) {
        kvt__ucx_conn_put_untrusted(wk, in->conn);
        in->conn = NULL;
    }
    inbound_drop(wk, in, 0);
}

/* Drop @in, which was just told it is refused: its connection goes once
 * that answer is out, unless another session uses it. */
static void inbound_drop_refused(ucx_worker_t *wk, ucx_inbound_t *in)
{
    if (in->dead)
        return;
    if (in->conn != NULL) {
        kvt__ucx_conn_put_refused(wk, in->conn);
        in->conn = NULL;
    }
    inbound_drop(wk, in, 0);
}

void kvt__ucx_inbound_tick(ucx_worker_t *wk, uint64_t now)
{
    int dropped = 0;

    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next) {
        if (in->dead || !in->auth_wait || now < in->auth_until)
            continue;
        KVT_LOG_W_RL("ucx: authentication failed: an initiator did not "
                     "answer the challenge within %llu s; dropped",
                     (unsigned long long)(UCX_AUTH_NS / 1000000000ull));
        kvt__engine_refused(wk->ucx->e);
        inbound_drop_untrusted(wk, in);
        dropped = 1;
    }
    if (dropped)
        inbound_reap(wk);
}

/*
 * Take a place among the initiators this engine serves (counted in
 * ninbound): 1 when taken, 0 when it serves its most already and no
 * place could be made. At the cap, the initiator of this worker that has
 * waited longest without proving the token is dropped to make room, as
 * the control plane does with connections that have not said HELLO: a
 * flood of peers that never authenticate cannot keep out those that do.
 */
static int inbound_admit(ucx_worker_t *wk)
{
    kvt__ucx_t *ucx = wk->ucx;
    ucx_inbound_t *victim = NULL;

    if (atomic_fetch_add(&ucx->ninbound, 1) < ucx->max_inbound)
        return 1;
    atomic_fetch_sub(&ucx->ninbound, 1);
    /* Sessions that ended earlier in this batch of events (BYE, a failed
     * proof) give their places back now rather than at its end. */
    if (wk->inbound_dead || wk->inbound_error) {
        inbound_reap(wk);
        if (atomic_fetch_add(&ucx->ninbound, 1) < ucx->max_inbound)
            return 1;
        atomic_fetch_sub(&ucx->ninbound, 1);
    }
    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next)
        if (!in->dead && in->auth_wait &&
            (victim == NULL || in->auth_until < victim->auth_until))
            victim = in;
    if (victim == NULL)
        return 0;
    KVT_LOG_W_RL("ucx: serving %u initiators, its most: dropping one that "
                 "has not proved the auth token to make room",
                 ucx->max_inbound);
    kvt__engine_refused(ucx->e);
    inbound_drop_untrusted(wk, victim);
    inbound_reap(wk);
    /* Another worker may have taken the place meanwhile. */
    if (atomic_fetch_add(&ucx->ninbound, 1) < ucx->max_inbound)
        return 1;
    atomic_fetch_sub(&ucx->ninbound, 1);
    return 0;
}

/* Tell an initiator that came past the cap: REFUSED | BUSY, on the
 * connection back to it, which goes once the answer is out (unless
 * another session uses it). */
static void refuse_busy(ucx_worker_t *wk, ucx_event_t *ev)
{
    ucx_conn_t *c;
    kvt_status_t st;

    KVT_LOG_W_RL("ucx: refusing an initiator: this engine serves %u "
                 "initiators, its most",
                 wk->ucx->max_inbound);
    kvt__engine_refused(wk->ucx->e);
    c = kvt__ucx_conn_get(wk, ev->data + 8, ev->value, &st);
    if (c == NULL)
        return;
    kvt__ucx_am_send(c->ep, UCX_AM_HELLO_ACK, ev->token,
                     UCX_ACK_REFUSED | UCX_ACK_BUSY, NULL, 0, NULL);
    kvt__ucx_conn_put_refused(wk, c);
}

/*
 * Authentication (ucx_auth.c), when either side has a token: refuse a
 * HELLO that does not match this engine's setting, else challenge it.
 * 0 to go on (with @in waiting for its AUTH, or without a token on
 * either side), -1 when @in was refused (told so), -2 when it cannot be
 * told anything.
 */
static int auth_hello(ucx_worker_t *wk, ucx_inbound_t *in, ucx_event_t *ev,
                      uint64_t gen, uint64_t ack)
{
    const kvt__engine_cfg_t *cfg = wk->ucx->cfg;
    int offers = ev->len == 8 + ev->value + UCX_NONCE_LEN;
    uint8_t chal[UCX_NONCE_LEN + UCX_MAC_LEN];
    const uint8_t *nonce_i = ev->data + 8 + ev->value;

    if (!cfg->auth.on && !offers)
        return 0;
    if (!cfg->auth.on || !offers ||
        kvt__auth_random(chal, UCX_NONCE_LEN) != KVT_OK) {
        KVT_LOG_W("ucx: authentication failed: an initiator %s",
                  offers ? "offers an auth token, this engine has none"
                         : "offers no auth token");
        kvt__engine_refused(wk->ucx->e);
        kvt__ucx_am_send(in->conn->ep, UCX_AM_HELLO_ACK, in->token,
                         UCX_ACK_REFUSED, NULL, 0, NULL);
        return -1;
    }
    kvt__ucx_auth_mac(cfg, 1, ev->data + 8, ev->value, wk->addr, wk->addr_len,
                      nonce_i, chal, gen, chal + UCX_NONCE_LEN);
    kvt__ucx_auth_mac(cfg, 0, ev->data + 8, ev->value, wk->addr, wk->addr_len,
                      nonce_i, chal, gen, in->want);
    in->auth_wait = 1;
    in->auth_until = kvt__now_ns() + UCX_AUTH_NS;
    if (kvt__ucx_am_send(in->conn->ep, UCX_AM_HELLO_ACK, in->token, ack, chal,
                         sizeof(chal), NULL) != KVT_OK)
        return -2;
    return 0;
}

/* AUTH: the initiator's proof; the session is served from now on. */
static void on_auth(ucx_worker_t *wk, ucx_event_t *ev)
{
    ucx_inbound_t *in = inbound_find(wk, ev->token);
    int ok;

    if (in == NULL || !in->auth_wait)
        return;
    ok = ev->len == UCX_MAC_LEN &&
         kvt__ct_equal(ev->data, in->want, UCX_MAC_LEN);
    in->auth_wait = 0;
    if (!ok) {
        KVT_LOG_W("ucx: authentication failed: an initiator did not prove "
                  "the auth token (another token?)");
        kvt__engine_refused(wk->ucx->e);
    }
    if (kvt__ucx_am_send(in->conn->ep, UCX_AM_HELLO_ACK, in->token,
                         ok ? UCX_ACK_AUTHED : UCX_ACK_REFUSED, NULL, 0,
                         NULL) != KVT_OK)
        inbound_drop(wk, in, 1);
    else if (!ok)
        inbound_drop_refused(wk, in);
}

static void on_hello(ucx_worker_t *wk, ucx_event_t *ev)
{
    kvt__ucx_t *ucx = wk->ucx;
    ucx_inbound_t *in;
    uint64_t gen;
    kvt_status_t st;

    if (ev->value == 0 || ev->value > UCX_ADDR_MAX ||
        (ev->len != 8 + ev->value &&
         ev->len != 8 + ev->value + UCX_NONCE_LEN) ||
        inbound_find(wk, ev->token)) {
        KVT_LOG_W("ucx: a malformed HELLO dropped");
        return;
    }
    /* Counted (inbound_admit()) before the generation is read, as
     * mem_changed() bumps it before it counts: an initiator is either
     * told of a change or sees that its descriptor predates it. */
    if (!inbound_admit(wk)) {
        refuse_busy(wk, ev);
        return;
    }
    in = calloc(1, sizeof(*in));
    if (in == NULL) {
        atomic_fetch_sub(&ucx->ninbound, 1);
        return;
    }
    in->token = ev->token;
    in->wk = wk;
    in->conn = kvt__ucx_conn_get(wk, ev->data + 8, ev->value, &st);
    if (in->conn == NULL) {
        KVT_LOG_W("ucx: cannot reach an initiator back: %s",
                  kvt_status_str(st));
        free(in);
        atomic_fetch_sub(&ucx->ninbound, 1);
        return;
    }
    in->next = wk->inbound;
    wk->inbound = in;
    memcpy(&gen, ev->data, 8);
    if (ucx->cfg->auth.on || ev->len != 8 + ev->value) {
        int r = auth_hello(wk, in, ev, gen,
                           gen != atomic_load(&ucx->gen) ? UCX_ACK_STALE : 0);
        if (r == -1)
            inbound_drop_refused(wk, in);
        else if (r == -2)
            inbound_drop(wk, in, 1);
        return;
    }
    if (kvt__ucx_am_send(in->conn->ep, UCX_AM_HELLO_ACK, in->token,
                         gen != atomic_load(&ucx->gen), NULL, 0,
                         NULL) != KVT_OK)
        inbound_drop(wk, in, 1);
}

static void on_notify(ucx_worker_t *wk, ucx_event_t *ev)
{
    char from[KVT_WIRE_NAME_MAX + 1];
    size_t nl = ev->value;

    if (nl == 0 || nl > KVT_WIRE_NAME_MAX || nl > ev->len ||
        ev->len - nl > KVT_NOTIFY_MAX || memchr(ev->data, 0, nl) != NULL) {
        KVT_LOG_W("ucx: a malformed notification dropped");
        return;
    }
    if (wk->ucx->cfg->auth.on) {
        /* Only from a session that proved the token. */
        ucx_inbound_t *in = inbound_find(wk, ev->token);
        if (in == NULL || in->auth_wait) {
            KVT_LOG_W("ucx: authentication failed: a notification from an "
                      "unauthenticated peer dropped");
            return;
        }
    }
    memcpy(from, ev->data, nl);
    from[nl] = '\0';
    kvt__engine_landed(wk->ucx->e);
    kvt__notify_push(wk->ucx->e, from, ev->data + nl, ev->len - nl);
}

/* This worker's part of registry change @gen (0: drop every peer that
 * still owes an acknowledgement). */
void kvt__ucx_reg_changed(ucx_worker_t *wk, uint64_t gen)
{
    unsigned asked = 0;

    if (gen == 0) {
        for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next)
            if (in->owed != 0) {
                KVT_LOG_W("ucx: dropping an initiator that did not confirm "
                          "a registry change");
                inbound_drop(wk, in, 1);
            }
        inbound_reap(wk);
        return;
    }
    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next) {
        if (in->dead || in->error || in->auth_wait)
            continue;
        if (kvt__ucx_am_send(in->conn->ep, UCX_AM_REG_CHANGED, in->token, gen,
                             NULL, 0, NULL) != KVT_OK) {
            in->error = 1;
            continue;
        }
        in->owed = gen;
        asked++;
    }
    KVT_LOG_D("ucx: registry change %llu sent to %u initiators",
              (unsigned long long)gen, asked);
    kvt__ucx_regchg_done(wk->ucx, gen, asked);
    inbound_reap(wk);
}

void kvt__ucx_inbound_close_all(ucx_worker_t *wk)
{
    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next)
        inbound_drop(wk, in, 0);
    inbound_reap(wk);
}

/* ---- Events ----------------------------------------------------------------
 */

/*
 * Initiator: a HELLO_ACK for @s. 1 when the session is open, 0 when it
 * waits for the next one (AUTH was sent), else why it was refused
 * (logged): KVT_ERR_AUTH when authentication failed, KVT_ERR_BUSY when
 * the target serves its most initiators already.
 */
static int hello_ack(ucx_worker_t *wk, ucx_session_t *s, ucx_event_t *ev)
{
    const kvt__engine_cfg_t *cfg = wk->ucx->cfg;
    uint8_t mac[UCX_MAC_LEN];

    if ((ev->value & UCX_ACK_REFUSED) && (ev->value & UCX_ACK_BUSY)) {
        KVT_LOG_E("ucx: segment %s refused this engine: it serves as many "
                  "initiators as it takes",
                  s->base.name);
        return KVT_ERR_BUSY;
    }
    if (ev->value & UCX_ACK_REFUSED) {
        KVT_LOG_E("ucx: authentication failed: segment %s refused this "
                  "engine (auth token missing or different)",
                  s->base.name);
        return KVT_ERR_AUTH;
    }
    if (ev->value & UCX_ACK_STALE)
        s->stale = 1; /* its descriptor predates a change */
    if (!cfg->auth.on)
        return ev->len == 0 ? 1 : KVT_ERR_AUTH;
    if (s->auth_sent)
        return (ev->value & UCX_ACK_AUTHED) ? 1 : KVT_ERR_AUTH;
    if (ev->len != UCX_NONCE_LEN + UCX_MAC_LEN) {
        KVT_LOG_E("ucx: authentication failed: segment %s does not "
                  "authenticate (no auth token set there)",
                  s->base.name);
        return KVT_ERR_AUTH;
    }
    kvt__ucx_auth_mac(cfg, 1, wk->addr, wk->addr_len, s->peer_addr,
                      s->peer_addr_len, s->nonce, ev->data, s->desc_gen, mac);
    if (!kvt__ct_equal(mac, ev->data + UCX_NONCE_LEN, UCX_MAC_LEN)) {
        KVT_LOG_E("ucx: authentication failed: segment %s did not prove the "
                  "auth token (another token?)",
                  s->base.name);
        return KVT_ERR_AUTH;
    }
    kvt__ucx_auth_mac(cfg, 0, wk->addr, wk->addr_len, s->peer_addr,
                      s->peer_addr_len, s->nonce, ev->data, s->desc_gen, mac);
    s->auth_sent = 1;
    if (kvt__ucx_am_send(s->conn->ep, UCX_AM_AUTH, s->token, 0, mac,
                         sizeof(mac), NULL) != KVT_OK)
        return KVT_ERR_AUTH;
    return 0;
}

static void on_event(ucx_worker_t *wk, ucx_event_t *ev)
{
    ucx_inbound_t *in;
    ucx_session_t *s;

    switch (ev->id) {
    case UCX_AM_HELLO:
        on_hello(wk, ev);
        break;
    case UCX_AM_BYE:
        in = inbound_find(wk, ev->token);
        if (in != NULL)
            inbound_drop(wk, in, 0);
        break;
    case UCX_AM_NOTIFY:
        on_notify(wk, ev);
        break;
    case UCX_AM_AUTH:
        on_auth(wk, ev);
        break;
    case UCX_AM_REG_ACK:
        in = inbound_find(wk, ev->token);
        if (in != NULL && in->owed != 0 && ev->value == in->owed) {
            in->owed = 0;
            in->acked = ev->value;
            kvt__ucx_regchg_ack(wk->ucx, ev->value);
        }
        break;
    case UCX_AM_HELLO_ACK:
        s = kvt__ucx_sess_by_token(wk, ev->token);
        if (s != NULL) {
            int r = hello_ack(wk, s, ev);
            if (r == 0)
                break;
            if (r < 0)
                kvt__ucx_sess_fail(s, r, 0);
            pthread_mutex_lock(&s->lock);
            if (s->opened == 0)
                s->opened = r > 0 ? 1 : -r;
            pthread_cond_broadcast(&s->cond);
            pthread_mutex_unlock(&s->lock);
        }
        break;
    case UCX_AM_REG_CHANGED:
        s = kvt__ucx_sess_by_token(wk, ev->token);
        if (s != NULL && s->failed == KVT_OK) {
            s->stale = 1;
            s->ack_gen = ev->value;
            kvt__ucx_sess_close_epoch(s);
            kvt__ucx_sess_touch(s);
        }
        break;
    default:
        break;
    }
}

void kvt__ucx_events(ucx_worker_t *wk)
{
    while (wk->ev_head != NULL) {
        ucx_event_t *ev = wk->ev_head;
        wk->ev_head = ev->next;
        if (wk->ev_head == NULL)
            wk->ev_tail = NULL;
        on_event(wk, ev);
        free(ev);
    }
    if (wk->inbound_error || wk->inbound_dead)
        inbound_reap(wk);
}
