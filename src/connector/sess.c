/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions with peer ranks (handshake, liveness, death), control messages
 * (sending, completion) and the decoding of what arrives.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

#define REASM_MAX_BYTES (256ull << 20)
#define ORPHANS_MAX 65536u

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

void kvtc__sess_ref(kvtc__sess_t *s)
{
    s->refs++;
}

void kvtc__sess_unref(kvtc__sess_t *s)
{
    s->refs--;
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

static kvtc__peer_t *peer_of(struct kvt_room *r, const kvtc__sess_t *s)
{
    for (uint32_t i = 0; i < r->npeers; i++)
        if (r->peers[i].sess == s)
            return &r->peers[i];
    return NULL;
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

/* ---- Receiving ----------------------------------------------------------- */

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

static void on_hello(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    kvtc__sess_t *old = kvtc__sess_find(c, from), *s;
    kvtc__layout_t lay;
    kvtc__hello_t h;
    kvtc__xplan_t *plan = NULL;
    char why[KVTC__WHY_MAX] = "";
    kvt_status_t st;

    if (old != NULL && old->id == m->session)
        return; /* a duplicate */
    memset(&lay, 0, sizeof(lay));
    st = kvtc__cm_hello_decode(m, &h, &lay, why, sizeof(why));
    if (st == KVT_ERR_PROTOCOL) {
        KVTC__LOG_W("connector: malformed handshake from %s", from);
        return;
    }
    if (st == KVT_OK && h.role != KVT_ROLE_DECODE) {
        st = KVT_ERR_INVALID_PARAM;
        snprintf(why, sizeof(why), "a handshake from a non-decode rank");
    }
    if (st == KVT_OK) {
        plan = calloc(c->lay.ncaches, sizeof(*plan));
        if (plan == NULL) {
            st = KVT_ERR_NO_MEMORY;
            snprintf(why, sizeof(why), "prefill is out of memory");
        } else {
            st =
                kvtc__layout_plan(&c->lay, c->tp_size, c->tp_rank, &lay,
                                  h.tp_size, h.tp_rank, plan, why, sizeof(why));
        }
    }
    if (old != NULL)
        kvtc__sess_kill(c, old, KVT_ERR_CONN_LOST,
                        "%s handshook again (restarted?)", from);
    s = kvtc__sess_new(c, from);
    if (s == NULL) {
        kvtc__layout_clear(&lay);
        free(plan);
        return;
    }
    s->id = m->session;
    s->peer = h;
    s->peer_lay = lay;
    s->plan = plan;
    s->verdict = st;
    if (st != KVT_OK) {
        KVTC__LOG_W("connector: refusing decode rank %u (%s): %s", h.tp_rank,
                    from, why);
        snprintf(s->why, sizeof(s->why), "prefill rank %u refused: %s",
                 c->tp_rank, why);
    }
}

/* A message from a decode rank (prefill side). */
static void prefill_msg(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    kvtc__sess_t *s;
    struct kvt_room *r;
    kvtc__peer_t *p;
    kvtc__status_msg_t sm;

    if (m->type == KVTC__CM_HELLO) {
        on_hello(c, from, m);
        return;
    }
    s = kvtc__sess_find(c, from);
    if (s == NULL || s->id != m->session) {
        KVTC__LOG_D("connector: message %u from %s outside a session", m->type,
                    from);
        return;
    }
    r = kvtc__room_find(c, m->room);
    switch (m->type) {
    case KVTC__CM_ROOM: {
        kvtc__room_msg_t req;
        if (s->state != KVTC__SESS_ALIVE) {
            kvtc__queue_reply(c, s, KVTC__CM_NAK, m->room, KVT_ERR_CONN_LOST,
                              "the session is not established");
            return;
        }
        if (kvtc__cm_room_decode(m, &req) != KVT_OK) {
            kvtc__queue_reply(c, s, KVTC__CM_NAK, m->room, KVT_ERR_PROTOCOL,
                              "malformed room announcement");
            return;
        }
        kvtc__prefill_on_room(c, s, m->room, &req);
        return;
    }
    case KVTC__CM_ABORT:
        if (kvtc__cm_status_decode(m, &sm) != KVT_OK)
            return;
        p = r && r->role == KVT_ROLE_PREFILL ? peer_of(r, s) : NULL;
        if (p != NULL) {
            if (p->st != KVTC__PEER_DONE && p->st != KVTC__PEER_QUIET)
                p->need_ack = 1;
            else
                kvtc__queue_reply(c, s, KVTC__CM_ABORT_ACK, m->room, KVT_OK,
                                  "");
            kvtc__room_fail(r, KVT_ERR_CANCELED, "decode rank %u (%s): %s",
                            p->rank, from, sm.reason);
            return;
        }
        for (kvtc__orphan_t **pp = &c->orphans; *pp != NULL;
             pp = &(*pp)->next) {
            kvtc__orphan_t *o = *pp;
            if (o->room == m->room && o->sess == s) {
                *pp = o->next;
                kvtc__room_msg_clear(&o->req);
                kvtc__sess_unref(o->sess);
                free(o);
                break;
            }
        }
        if (r != NULL && r->role == KVT_ROLE_PREFILL) {
            kvtc__room_fail(r, KVT_ERR_CANCELED, "decode rank %u (%s): %s",
                            s->peer.tp_rank, from, sm.reason);
        } else if (r == NULL) {
            kvtc__tomb_t *t = calloc(1, sizeof(*t));
            if (t != NULL) {
                t->room = m->room;
                t->t = kvtc__conn_now_ms();
                t->aborted = 1;
                snprintf(t->why, sizeof(t->why),
                         "decode rank %u (%s) aborted the room before this "
                         "rank had it: %s",
                         s->peer.tp_rank, from, sm.reason);
                t->next = c->tombs;
                c->tombs = t;
            }
        }
        kvtc__queue_reply(c, s, KVTC__CM_ABORT_ACK, m->room, KVT_OK, "");
        return;
    case KVTC__CM_ABORT_ACK:
        p = r && r->role == KVT_ROLE_PREFILL ? peer_of(r, s) : NULL;
        if (p != NULL && p->st == KVTC__PEER_ABORTING) {
            p->st = KVTC__PEER_QUIET;
            r->dirty = 1;
        }
        return;
    default:
        return;
    }
}

static int all_done(const struct kvt_room *r)
{
    for (uint32_t i = 0; i < r->npeers; i++)
        if (r->peers[i].st != KVTC__PEER_DONE)
            return 0;
    return r->npeers > 0 && r->npeers == r->nexpect;
}

/* A message from a prefill rank (decode side). */
static void decode_msg(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    kvtc__sess_t *s = kvtc__sess_find(c, from);
    struct kvt_room *r;
    kvtc__peer_t *p;
    kvtc__status_msg_t sm;

    if (s == NULL || s->id != m->session) {
        KVTC__LOG_D("connector: message %u from %s outside a session", m->type,
                    from);
        return;
    }
    r = kvtc__room_find(c, m->room);
    if (r != NULL && r->role != KVT_ROLE_DECODE)
        r = NULL;
    p = r ? peer_of(r, s) : NULL;
    switch (m->type) {
    case KVTC__CM_HELLO_ACK:
        if (s->state != KVTC__SESS_HELLO ||
            kvtc__cm_status_decode(m, &sm) != KVT_OK)
            return;
        if (sm.status != KVT_OK) {
            kvtc__sess_kill(c, s,
                            sm.status <= 0 && sm.status > -100
                                ? (kvt_status_t)sm.status
                                : KVT_ERR_PROTOCOL,
                            "%s", sm.reason);
            return;
        }
        s->peer = sm.who;
        s->state = KVTC__SESS_ALIVE;
        s->t_state = s->t_ping = s->t_pong = kvtc__conn_now_ms();
        return;
    case KVTC__CM_NAK:
        if (p == NULL || kvtc__cm_status_decode(m, &sm) != KVT_OK)
            return;
        if (p->st != KVTC__PEER_DONE)
            p->st = KVTC__PEER_QUIET;
        kvtc__room_fail(
            r, sm.status < 0 ? (kvt_status_t)sm.status : KVT_ERR_PROTOCOL,
            "prefill rank %u (%s) refused the room: %s", p->rank, from,
            sm.reason);
        return;
    case KVTC__CM_STARTED:
        if (p == NULL)
            return;
        p->started = 1;
        if (!r->failing && r->state == KVT_POLL_WAITING_FOR_INPUT)
            kvtc__room_set(r, KVT_POLL_TRANSFERRING,
                           "prefill rank %u started writing", p->rank);
        return;
    case KVTC__CM_DONE:
        if (p == NULL ||
            (p->st != KVTC__PEER_ACTIVE && p->st != KVTC__PEER_ANNOUNCING &&
             p->st != KVTC__PEER_ABORTING))
            return;
        p->st = KVTC__PEER_DONE;
        r->dirty = 1;
        if (!r->failing && all_done(r))
            kvtc__room_set(r, KVT_POLL_SUCCESS,
                           "every block and aux item arrived from %u prefill "
                           "rank(s)",
                           r->npeers);
        return;
    case KVTC__CM_ABORT:
        if (kvtc__cm_status_decode(m, &sm) != KVT_OK)
            return;
        if (p == NULL) {
            kvtc__queue_reply(c, s, KVTC__CM_ABORT_ACK, m->room, KVT_OK, "");
            return;
        }
        if (p->st != KVTC__PEER_DONE)
            p->st = KVTC__PEER_QUIET;
        p->need_ack = 1;
        kvtc__room_fail(
            r, sm.status < 0 ? (kvt_status_t)sm.status : KVT_ERR_CANCELED,
            "prefill rank %u (%s): %s", p->rank, from, sm.reason);
        return;
    case KVTC__CM_ABORT_ACK:
        if (p != NULL && p->st == KVTC__PEER_ABORTING) {
            p->st = KVTC__PEER_QUIET;
            r->dirty = 1;
        }
        return;
    default:
        return;
    }
}

/*
 * Liveness above the engine: a PING is answered only by a rank that knows
 * the session (same name, same id, not dead), so a session that one side
 * dropped (a restart, a timeout there) ends on the other side too, within
 * the peer timeout, instead of leaving its rooms to their own timeouts.
 */
static int on_liveness(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    kvtc__sess_t *s;

    if (m->type != KVTC__CM_PING && m->type != KVTC__CM_PONG)
        return 0;
    s = kvtc__sess_find(c, from);
    if (s == NULL || s->id != m->session)
        return 1;
    if (m->type == KVTC__CM_PING)
        kvtc__queue_reply(c, s, KVTC__CM_PONG, 0, KVT_OK, "");
    else
        s->t_pong = kvtc__conn_now_ms();
    return 1;
}

static void dispatch(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    if (on_liveness(c, from, m))
        return;
    if (c->role == KVT_ROLE_PREFILL)
        prefill_msg(c, from, m);
    else
        decode_msg(c, from, m);
}

/* Collect a FRAG; dispatch the message once every byte is in. Pieces
 * arrive in order on one session; duplicates or overlaps are not
 * expected and are not defended beyond the bounds checks. */
static void on_frag(kvt_conn_h c, const char *from, const kvtc__cm_t *m)
{
    kvtc__frag_t f;
    kvtc__reasm_t *a, **pp;
    kvtc__cm_t inner;

    if (kvtc__cm_frag_decode(m, &f) != KVT_OK)
        return;
    for (pp = &c->reasm; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->msg_id == f.msg_id && strcmp((*pp)->from, from) == 0)
            break;
    a = *pp;
    if (a == NULL) {
        if (c->reasm_bytes + f.total > REASM_MAX_BYTES)
            return;
        a = calloc(1, sizeof(*a));
        if (a == NULL || (a->buf = malloc(f.total)) == NULL) {
            free(a);
            return;
        }
        snprintf(a->from, sizeof(a->from), "%s", from);
        a->msg_id = f.msg_id;
        a->total = f.total;
        a->t = kvtc__conn_now_ms();
        a->next = c->reasm;
        c->reasm = a;
        c->reasm_bytes += f.total;
        pp = &c->reasm;
    } else if (a->total != f.total) {
        return;
    }
    memcpy(a->buf + f.offset, f.data, f.len);
    a->got += f.len;
    if (a->got < a->total)
        return;
    *pp = a->next;
    c->reasm_bytes -= a->total;
    if (kvtc__cm_parse(a->buf, a->total, &inner) == KVT_OK &&
        inner.type != KVTC__CM_FRAG)
        dispatch(c, from, &inner);
    free(a->buf);
    free(a);
}

void kvtc__rx_dispatch(kvt_conn_h c, const char *from, const uint8_t *buf,
                       size_t len)
{
    kvtc__cm_t m;

    if (kvtc__cm_parse(buf, len, &m) != KVT_OK) {
        KVTC__LOG_D("connector: ignoring a %zu-byte notification from %s", len,
                    from);
        return;
    }
    if (m.type == KVTC__CM_FRAG)
        on_frag(c, from, &m);
    else
        dispatch(c, from, &m);
}
