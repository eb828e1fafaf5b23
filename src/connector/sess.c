/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions with peer ranks (handshake, liveness, death) and the control
 * messages sent on them (sending, replies owed, completion). What
 * arrives is decoded and applied by rx.c.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

/* ---- Sessions ---------------------------------------------------------- */

kvtc__sess_t *kvtc__sess_find(kvt_conn_h c, const char *name)
{
    for (kvtc__sess_t *s = c->sessions; s != NULL; s = s->next)
        if (s->state != KVTC__SESS_DEAD && strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

kvtc__sess_t *kvtc__sess_new(kvt_conn_h c, const char *name)
{
    kvtc__sess_t *s = calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->state = KVTC__SESS_NEW;
    s->t_state = kvtc__conn_now_ms();
    if (c->role == KVT_ROLE_DECODE)
        while (s->id == 0)
            s->id = kvtc__conn_random(c);
    s->next = c->sessions;
    c->sessions = s;
    pthread_cond_signal(&c->slow_cv);
    return s;
}

static void sess_free(kvtc__sess_t *s)
{
    kvtc__layout_clear(&s->peer_lay);
    free(s->plan);
    free(s);
}

void kvtc__sess_free_all(kvt_conn_h c)
{
    while (c->sessions != NULL) {
        kvtc__sess_t *s = c->sessions;
        c->sessions = s->next;
        sess_free(s);
    }
}

/*
 * A session dies once. Its engine segment is closed, which cancels this
 * side's writes still in flight on it and makes the next open dial
 * afresh. Every room with a peer on it that has not finished loses that
 * peer (it will move no data any more) and fails; rooms whose peer there
 * had already finished are untouched.
 */
void kvtc__sess_kill(kvt_conn_h c, kvtc__sess_t *s, kvt_status_t err,
                     const char *fmt, ...)
{
    va_list ap;

    if (s->state == KVTC__SESS_DEAD)
        return;
    s->state = KVTC__SESS_DEAD;
    s->t_state = kvtc__conn_now_ms();
    s->err = err;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof(s->why), fmt, ap);
    va_end(ap);
    KVTC__LOG_W("connector: %s session with %s is dead: %s",
                kvtc__role_str(c->role), s->name, s->why);
    if (s->seg != 0)
        kvt_segment_close(c->engine, s->seg);
    if (c->role == KVT_ROLE_DECODE)
        kvtc__topo_forget(c, s->name);
    for (struct kvt_room *r = c->rooms; r != NULL; r = r->next) {
        for (uint32_t i = 0; i < r->npeers; i++) {
            kvtc__peer_t *p = &r->peers[i];
            if (p->sess != s || p->st == KVTC__PEER_DONE)
                continue;
            p->st = KVTC__PEER_QUIET;
            p->need_ack = 0;
            kvtc__room_fail(r, err, "%s rank %u (%s): %s",
                            c->role == KVT_ROLE_DECODE ? "prefill" : "decode",
                            p->rank, s->name, s->why);
        }
    }
    kvtc__conn_wake(c);
}

/* ---- Sending ------------------------------------------------------------- */

void kvtc__ctrl_send(kvt_conn_h c, kvtc__sess_t *s, kvtc__cmb_t *b,
                     uint64_t room, uint64_t serial, uint32_t peer)
{
    uint8_t type = b->buf[5];
    uint8_t *frags = NULL;
    size_t *sizes = NULL, n = 1;
    kvt_xfer_desc_t one, *d = &one;
    kvtc__ctrl_t *m = NULL;
    kvt_batch_h batch = NULL;
    kvt_status_t st;

    if (s->state == KVTC__SESS_DEAD || s->seg == 0)
        goto out;
    if (b->len > KVT_NOTIFY_MAX) {
        st = kvtc__cm_fragment(b->buf, b->len, c->next_msg_id++, KVT_NOTIFY_MAX,
                               &frags, &sizes, &n);
        if (st != KVT_OK)
            goto err;
        d = calloc(n, sizeof(*d));
        if (d == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto err;
        }
        for (size_t i = 0; i < n; i++)
            d[i] = (kvt_xfer_desc_t){.opcode = KVT_OP_NOTIFY,
                                     .segment = s->seg,
                                     .local_addr = frags + i * KVT_NOTIFY_MAX,
                                     .length = sizes[i]};
    } else {
        one = (kvt_xfer_desc_t){.opcode = KVT_OP_NOTIFY,
                                .segment = s->seg,
                                .local_addr = b->buf,
                                .length = b->len};
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto err;
    }
    st = kvt_batch_create(c->engine, n, &batch);
    if (st != KVT_OK)
        goto err;
    kvtc__conn_batch_watch(c, batch);
    st = kvt_batch_submit(batch, d, n);
    if (st != KVT_OK)
        goto err;
    m->sess = s;
    kvtc__sess_ref(s);
    m->batch = batch;
    m->type = type;
    m->room = room;
    m->serial = serial;
    m->peer = peer;
    m->t_sent = kvtc__conn_now_ms();
    m->next = c->ctrls;
    c->ctrls = m;
    m = NULL;
    goto out;

err:
    kvt_batch_free(batch);
    kvtc__sess_kill(c, s, st, "cannot send to %s: %s", s->name,
                    kvt_status_str(st));
out:
    free(m);
    if (d != &one)
        free(d);
    free(frags);
    free(sizes);
    kvtc__cmb_free(b);
}

void kvtc__ctrl_status(kvt_conn_h c, kvtc__sess_t *s, uint8_t type,
                       uint64_t room, uint64_t serial, uint32_t peer,
                       kvt_status_t st, const char *why)
{
    kvtc__status_msg_t sm;
    kvtc__cmb_t b;

    memset(&sm, 0, sizeof(sm));
    sm.status = st;
    sm.who = (kvtc__hello_t){(uint32_t)c->role, c->tp_rank, c->tp_size,
                             c->dp_rank, c->dp_size};
    snprintf(sm.reason, sizeof(sm.reason), "%s", why ? why : "");
    kvtc__cmb_init(&b, type, s->id, room);
    kvtc__cm_status_encode(&b, &sm);
    if (kvtc__cmb_finish(&b) != KVT_OK) {
        kvtc__sess_kill(c, s, KVT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    kvtc__ctrl_send(c, s, &b, room, serial, peer);
}

static void send_plain(kvt_conn_h c, kvtc__sess_t *s, uint8_t type,
                       uint64_t room)
{
    kvtc__cmb_t b;

    kvtc__cmb_init(&b, type, s->id, room);
    if (kvtc__cmb_finish(&b) != KVT_OK) {
        kvtc__sess_kill(c, s, KVT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    kvtc__ctrl_send(c, s, &b, room, 0, 0);
}

static void send_hello(kvt_conn_h c, kvtc__sess_t *s)
{
    kvtc__hello_t h = {(uint32_t)c->role, c->tp_rank, c->tp_size, c->dp_rank,
                       c->dp_size};
    kvtc__cmb_t b;

    kvtc__cmb_init(&b, KVTC__CM_HELLO, s->id, 0);
    kvtc__cm_hello_encode(&b, &h, &c->lay);
    if (kvtc__cmb_finish(&b) != KVT_OK) {
        kvtc__sess_kill(c, s, KVT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    kvtc__ctrl_send(c, s, &b, 0, 0, 0);
}

/* What a successful control message completes. */
static void ctrl_done(kvt_conn_h c, kvtc__ctrl_t *m)
{
    struct kvt_room *r;

    if (m->type == KVTC__CM_PING) {
        m->sess->ping_inflight = 0;
        return;
    }
    if (m->type != KVTC__CM_ROOM && m->type != KVTC__CM_DONE)
        return;
    r = kvtc__room_find(c, m->room);
    if (r == NULL || r->serial != m->serial || m->peer >= r->npeers)
        return;
    if (m->type == KVTC__CM_ROOM &&
        r->peers[m->peer].st == KVTC__PEER_ANNOUNCING)
        r->peers[m->peer].st = KVTC__PEER_ACTIVE;
    if (m->type == KVTC__CM_DONE &&
        r->peers[m->peer].st == KVTC__PEER_DONE_SENDING)
        r->peers[m->peer].st = KVTC__PEER_DONE;
    r->dirty = 1;
}

/* Sent by the next kvtc__sess_tick(). */
void kvtc__queue_reply(kvt_conn_h c, kvtc__sess_t *s, uint8_t type,
                       uint64_t room, kvt_status_t st, const char *why)
{
    kvtc__reply_t *q = calloc(1, sizeof(*q));

    if (q == NULL)
        return;
    q->sess = s;
    kvtc__sess_ref(s);
    q->type = type;
    q->room = room;
    q->status = st;
    snprintf(q->why, sizeof(q->why), "%s", why ? why : "");
    q->next = c->replies;
    c->replies = q;
}

void kvtc__sess_forgive(kvt_conn_h c, uint64_t gap_ms)
{
    for (kvtc__ctrl_t *m = c->ctrls; m != NULL; m = m->next)
        m->t_sent += gap_ms;
    for (kvtc__sess_t *s = c->sessions; s != NULL; s = s->next) {
        s->t_state += gap_ms;
        s->t_pong += gap_ms;
    }
    KVTC__LOG_I("connector: no round for %" PRIu64 " ms (this process "
                "was not running); the peers' silence over that time is "
                "not held against them",
                gap_ms);
}

/*
 * Control messages complete when the peer's engine took them; a failure
 * or a message unanswered for the peer timeout kills the session. Then
 * owed replies go out, handshakes advance, live sessions are pinged, and
 * dead ones nobody refers to are freed.
 */
int kvtc__sess_tick(kvt_conn_h c, uint64_t now)
{
    for (kvtc__ctrl_t **pp = &c->ctrls; *pp != NULL;) {
        kvtc__ctrl_t *m = *pp;
        kvt_status_t st = kvt_batch_query(m->batch, NULL);
        if (st == KVT_INPROGRESS) {
            if (kvtc__since(now, m->t_sent) > c->peer_ms)
                kvtc__sess_kill(c, m->sess, KVT_ERR_TIMEDOUT,
                                "%s took no message for %" PRIu64 " ms",
                                m->sess->name, c->peer_ms);
            pp = &m->next;
            continue;
        }
        if (st == KVT_OK)
            ctrl_done(c, m);
        else
            kvtc__sess_kill(c, m->sess, st, "a message to %s failed: %s",
                            m->sess->name, kvt_status_str(st));
        *pp = m->next;
        kvt_batch_free(m->batch);
        kvtc__sess_unref(m->sess);
        free(m);
    }
    while (c->replies != NULL) {
        kvtc__reply_t *q = c->replies;
        c->replies = q->next;
        if (q->sess->state != KVTC__SESS_DEAD && q->sess->seg != 0)
            kvtc__ctrl_status(c, q->sess, q->type, q->room, 0, 0, q->status,
                              q->why);
        kvtc__sess_unref(q->sess);
        free(q);
    }
    for (kvtc__sess_t **pp = &c->sessions; *pp != NULL;) {
        kvtc__sess_t *s = *pp;
        switch (s->state) {
        case KVTC__SESS_OPENED:
            if (c->role == KVT_ROLE_DECODE) {
                s->state = KVTC__SESS_HELLO;
                s->t_state = now;
                send_hello(c, s);
            } else if (s->verdict == KVT_OK) {
                s->state = KVTC__SESS_ALIVE;
                s->t_state = s->t_ping = s->t_pong = now;
                kvtc__ctrl_status(c, s, KVTC__CM_HELLO_ACK, 0, 0, 0, KVT_OK,
                                  "");
            } else {
                /* Refused: tell decode why, then let the session go
                 * without closing the segment under the answer. */
                kvtc__ctrl_status(c, s, KVTC__CM_HELLO_ACK, 0, 0, 0, s->verdict,
                                  s->why);
                s->state = KVTC__SESS_DEAD;
                s->err = s->verdict;
            }
            break;
        case KVTC__SESS_HELLO:
            if (kvtc__since(now, s->t_state) > c->peer_ms)
                kvtc__sess_kill(c, s, KVT_ERR_TIMEDOUT,
                                "%s did not answer the handshake in %" PRIu64
                                " ms",
                                s->name, c->peer_ms);
            break;
        case KVTC__SESS_ALIVE:
            if (kvtc__since(now, s->t_pong) > c->peer_ms) {
                kvtc__sess_kill(c, s, KVT_ERR_TIMEDOUT,
                                "%s has not answered pings for %" PRIu64
                                " ms (the session is gone there?)",
                                s->name, c->peer_ms);
                break;
            }
            if (!s->ping_inflight &&
                kvtc__since(now, s->t_ping) >= c->heartbeat_ms) {
                s->ping_inflight = 1;
                s->t_ping = now;
                send_plain(c, s, KVTC__CM_PING, 0);
            }
            break;
        case KVTC__SESS_DEAD:
            if (s->refs == 0) {
                *pp = s->next;
                sess_free(s);
                continue;
            }
            break;
        default:
            break;
        }
        pp = &s->next;
    }
    return c->ctrls != NULL;
}
