/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What arrives from peers, on the rx thread: control messages are
 * parsed, reassembled from fragments, checked against their session,
 * and applied to sessions and rooms (replies are queued for the worker,
 * never sent from here).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

#define REASM_MAX_BYTES (256ull << 20)

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
        p = r && r->role == KVT_ROLE_PREFILL ? kvtc__room_peer_of(r, s) : NULL;
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
        p = r && r->role == KVT_ROLE_PREFILL ? kvtc__room_peer_of(r, s) : NULL;
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
    p = r ? kvtc__room_peer_of(r, s) : NULL;
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
