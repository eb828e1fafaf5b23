/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A session's data path, on its worker: puts gathered in epochs closed by
 * flushes, gets tracked one unit each, notifications sent in FIFO order
 * once every unit before them has finished; the units, their requests and
 * their completion, and the submissions held until the session may post
 * them. It calls ucx_rkey.c for the peer's keys; ucx_ep.c calls it, never
 * the other way.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx/ucx.h"
#include "transport/ucx/ucx_status.h"
#include "util/time.h"

static int unit_idle(const ucx_unit_t *u)
{
    return u->posted && u->refs == 0;
}

static ucx_unit_t *unit_new(ucx_session_t *s, int kind)
{
    ucx_unit_t *u = calloc(1, sizeof(*u));

    if (u == NULL)
        return NULL;
    u->s = s;
    u->kind = (uint8_t)kind;
    u->t0 = kvt__now_ns();
    u->cap = 1;
    u->comps = &u->comp1;
    return u;
}

static int unit_add(ucx_unit_t *u, kvt__comp_t *c)
{
    if (u->ncomps == u->cap) {
        uint32_t cap = u->cap * 2;
        kvt__comp_t **n = malloc(cap * sizeof(*n));
        if (n == NULL)
            return -1;
        memcpy(n, u->comps, u->ncomps * sizeof(*n));
        if (u->comps != &u->comp1)
            free(u->comps);
        u->comps = n;
        u->cap = cap;
    }
    u->comps[u->ncomps++] = c;
    return 0;
}

static void unit_finish(ucx_unit_t *u)
{
    /* The rule, and why: ucx_status.h. */
    kvt_status_t st = kvt__ucx_unit_status(u->s->failed, u->status,
                                           u->kind == UNIT_EPOCH, u->posted);

    for (uint32_t i = 0; i < u->ncomps; i++)
        kvt__comp_done(u->comps[i], st);
    if (u->comps != &u->comp1)
        free(u->comps);
    free(u->msg);
    free(u);
}

static void list_append(ucx_unit_t **head, ucx_unit_t **tail, ucx_unit_t *u)
{
    u->next = NULL;
    u->prev = *tail;
    if (*tail)
        (*tail)->next = u;
    else
        *head = u;
    *tail = u;
}

static void list_remove(ucx_unit_t **head, ucx_unit_t **tail, ucx_unit_t *u)
{
    if (u->prev)
        u->prev->next = u->next;
    else
        *head = u->next;
    if (u->next)
        u->next->prev = u->prev;
    else
        *tail = u->prev;
}

int kvt__ucx_unit_orphan_done(ucx_unit_t *u)
{
    if (!u->orphan)
        return 0;
    if (--u->refs == 0) {
        free(u->msg);
        free(u);
    }
    return 1;
}

static void req_done(void *req, ucs_status_t status, void *user)
{
    ucx_unit_t *u = user;

    ucp_request_free(req);
    if (kvt__ucx_unit_orphan_done(u))
        return;
    if (status != UCS_OK && u->status == KVT_OK)
        u->status = kvt__ucx_status(status);
    u->refs--;
    if (u->kind == UNIT_GET && unit_idle(u)) {
        list_remove(&u->s->gets_head, &u->s->gets_tail, u);
        unit_finish(u);
    } else {
        kvt__ucx_sess_touch(u->s);
    }
}

/* Account one request's result. */
static void req_posted(ucx_unit_t *u, ucs_status_ptr_t r)
{
    if (r == NULL)
        return;
    if (UCS_PTR_IS_ERR(r)) {
        if (u->status == KVT_OK)
            u->status = kvt__ucx_status(UCS_PTR_STATUS(r));
        u->s->ep_error = 1;
        return;
    }
    u->refs++;
}

void kvt__ucx_sess_close_epoch(ucx_session_t *s)
{
    ucx_unit_t *u = s->epoch;
    ucp_request_param_t p = {0};

    if (u == NULL)
        return;
    s->epoch = NULL;
    if (s->conn != NULL && s->failed == KVT_OK) {
        p.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = req_done;
        p.user_data = u;
        req_posted(u, ucp_ep_flush_nbx(s->conn->ep, &p));
    } else if (u->status == KVT_OK) {
        /* Its puts cannot be flushed: nothing says they landed. */
        u->status = s->failed != KVT_OK ? s->failed : KVT_ERR_CONN_LOST;
    }
    u->posted = 1;
    kvt__ucx_sess_touch(s);
}

/* Check every piece of @x; NULL when one is refused. */
static int xfer_check(ucx_session_t *s, const kvt__xfer_t *x, uint32_t acc)
{
    for (uint32_t i = 0; i < x->count; i++)
        if (kvt__ucx_region_find(s, x->raddr + i * x->rstride, x->len, acc) ==
            NULL)
            return 0;
    return 1;
}

static void xfer_one(ucx_session_t *s, const kvt__xfer_t *x)
{
    int wr = x->op == KVT_OP_WRITE;
    ucp_request_param_t p = {0};
    ucx_rregion_t *whole;
    uint32_t acc;
    ucx_unit_t *u;

    if (x->op == KVT_OP_NOTIFY) {
        const char *me = kvt__engine_cfg(s->base.engine)->seg_name;
        size_t nl = strlen(me);
        kvt__ucx_sess_close_epoch(s);
        u = unit_new(s, UNIT_NOTIFY);
        if (u == NULL || (u->msg = malloc(nl + x->len)) == NULL) {
            free(u);
            kvt__comp_done(x->comp, KVT_ERR_NO_MEMORY);
            return;
        }
        memcpy(u->msg, me, nl);
        memcpy(u->msg + nl, (const void *)(uintptr_t)x->laddr, x->len);
        u->len = (uint32_t)(nl + x->len);
        u->nlen = (uint32_t)nl;
        u->ncomps = 1;
        u->comp1 = x->comp;
        list_append(&s->fifo_head, &s->fifo_tail, u);
        kvt__ucx_sess_touch(s);
        return;
    }
    /* Usually one region holds the whole span: one lookup for every
     * piece. Otherwise each piece is checked, then looked up again. */
    acc = wr ? KVT_ACCESS_REMOTE_WRITE : KVT_ACCESS_REMOTE_READ;
    whole = kvt__ucx_region_find(s, x->raddr,
                                 (x->count - 1) * x->rstride + x->len, acc);
    if (whole == NULL && !xfer_check(s, x, acc)) {
        kvt__comp_done(x->comp, KVT_ERR_ACCESS);
        return;
    }
    if (wr) {
        if (s->epoch == NULL) {
            s->epoch = unit_new(s, UNIT_EPOCH);
            if (s->epoch == NULL) {
                kvt__comp_done(x->comp, KVT_ERR_NO_MEMORY);
                return;
            }
            list_append(&s->fifo_head, &s->fifo_tail, s->epoch);
        }
        u = s->epoch;
    } else {
        u = unit_new(s, UNIT_GET);
        if (u == NULL) {
            kvt__comp_done(x->comp, KVT_ERR_NO_MEMORY);
            return;
        }
        list_append(&s->gets_head, &s->gets_tail, u);
    }
    if (unit_add(u, x->comp) < 0) {
        kvt__comp_done(x->comp, KVT_ERR_NO_MEMORY);
        if (!wr) {
            u->posted = 1;
            if (u->refs == 0) {
                list_remove(&s->gets_head, &s->gets_tail, u);
                unit_finish(u);
            }
        }
        return;
    }
    /* A put needs no callback of its own: the flush that closes its
     * epoch completes after it, with its failure. Its request (if any) is
     * handed back at once and completes on its own. A get is tracked. */
    if (!wr) {
        p.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = req_done;
        p.user_data = u;
    }
    for (uint32_t i = 0; i < x->count; i++) {
        uint64_t ra = x->raddr + i * x->rstride;
        void *la = (void *)(uintptr_t)(x->laddr + i * x->lstride);
        ucx_rregion_t *r =
            whole ? whole : kvt__ucx_region_find(s, ra, x->len, 0);
        ucs_status_ptr_t q;
        if (wr) {
            q = ucp_put_nbx(s->conn->ep, la, x->len, ra, r->rkey, &p);
            if (q != NULL && !UCS_PTR_IS_ERR(q)) {
                ucp_request_free(q);
                continue;
            }
        } else {
            q = ucp_get_nbx(s->conn->ep, la, x->len, ra, r->rkey, &p);
        }
        req_posted(u, q);
    }
    if (!wr) {
        u->posted = 1;
        if (u->refs == 0) {
            list_remove(&s->gets_head, &s->gets_tail, u);
            unit_finish(u);
        }
    }
}

void kvt__ucx_complete_msg(ucx_msg_t *m, kvt_status_t st)
{
    for (size_t i = m->done; i < m->n; i++)
        kvt__comp_done(m->x[i].comp, st);
    free(m->x);
    free(m->notes);
    free(m);
}

static void held_append(ucx_session_t *s, ucx_msg_t *m)
{
    m->next = NULL;
    if (s->held_tail)
        s->held_tail->next = m;
    else
        s->held_head = m;
    s->held_tail = m;
}

/*
 * Post @m's descriptors from where it stopped, until @budget bytes are
 * posted (so that a large submission is posted and completes in
 * flush-sized steps, and other sessions get their turn). Returns 1 when
 * it is done (and freed).
 */
static int run_msg(ucx_session_t *s, ucx_msg_t *m, uint64_t *budget)
{
    while (m->done < m->n) {
        const kvt__xfer_t *x = &m->x[m->done];
        uint64_t b = x->op == KVT_OP_NOTIFY ? 0 : kvt__xfer_bytes(x);
        if (b > 0 && *budget == 0) {
            kvt__ucx_sess_close_epoch(s);
            return 0;
        }
        m->done++;
        xfer_one(s, x);
        *budget = b >= *budget ? 0 : *budget - b;
    }
    free(m->x);
    free(m->notes);
    free(m);
    return 1;
}

/* Post what the session has queued, in order, within one turn's budget. */
void kvt__ucx_run_held(ucx_session_t *s)
{
    uint64_t budget = UCX_TURN_BYTES;

    while (s->failed == KVT_OK && !s->stale && s->held_head != NULL) {
        ucx_msg_t *m = s->held_head, *next = m->next;
        if (!run_msg(s, m, &budget))
            break;
        s->held_head = next;
        if (next == NULL)
            s->held_tail = NULL;
    }
    kvt__ucx_sess_touch(s);
}

void kvt__ucx_sess_xfer(ucx_session_t *s, ucx_msg_t *m)
{
    if (s->failed != KVT_OK) {
        kvt__ucx_complete_msg(m, s->failed);
        return;
    }
    held_append(s, m);
    if (!s->stale && s->held_head == m)
        kvt__ucx_run_held(s);
    else
        kvt__ucx_sess_touch(s);
}

void kvt__ucx_fifo_advance(ucx_session_t *s)
{
    ucx_unit_t *u;

    while ((u = s->fifo_head) != NULL) {
        if (u->kind == UNIT_NOTIFY && !u->posted) {
            if (s->failed == KVT_OK) {
                kvt_status_t st =
                    kvt__ucx_am_send(s->conn->ep, UCX_AM_NOTIFY, s->token,
                                     u->nlen, u->msg, u->len, u);
                if (st != KVT_OK)
                    u->status = st;
            }
            u->posted = 1;
        }
        if (!unit_idle(u))
            break;
        list_remove(&s->fifo_head, &s->fifo_tail, u);
        unit_finish(u);
    }
}

int kvt__ucx_sess_busy(const ucx_session_t *s)
{
    return s->fifo_head != NULL || s->gets_head != NULL;
}

void kvt__ucx_sess_touch(ucx_session_t *s)
{
    if (s->touched || s->released)
        return;
    s->touched = 1;
    s->tnext = s->wk->touched;
    s->wk->touched = s;
}
