/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connections: one endpoint per peer worker, per worker, shared by every
 * session and every inbound peer of this worker that goes there, and kept
 * when they close. UCX gives the far side of each endpoint an endpoint of
 * its own that lives as long as the worker; an endpoint per session would
 * leave one behind on both sides for every session ever opened.
 *
 * A connection fails when its error handler runs (the peer died or cut
 * it) or when a session gives up on work it has in flight (a timeout);
 * a failed connection takes no new users, and is closed when its last
 * user leaves.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/ucx/ucx.h"
#include "util/log.h"

static void conn_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_conn_t *c = arg;

    (void)ep;
    KVT_LOG_D("ucx: a connection failed: %s", ucs_status_string(status));
    c->dead = 1;
    c->error = 1;
    c->wk->conn_error = 1;
}

ucx_conn_t *kvt__ucx_conn_get(ucx_worker_t *wk, const void *addr, size_t len,
                              kvt_status_t *st_p)
{
    ucp_ep_params_t p = {0};
    ucx_conn_t *c;
    ucs_status_t st;

    for (c = wk->conns; c != NULL; c = c->next) {
        if (!c->error && c->len == len && memcmp(c->addr, addr, len) == 0) {
            c->refs++;
            return c;
        }
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL || (c->addr = malloc(len)) == NULL) {
        free(c);
        *st_p = KVT_ERR_NO_MEMORY;
        return NULL;
    }
    memcpy(c->addr, addr, len);
    c->len = len;
    c->wk = wk;
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = (const ucp_address_t *)c->addr;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = conn_err;
    p.err_handler.arg = c;
    st = ucp_ep_create(wk->w, &p, &c->ep);
    c->peer_failures = st == UCS_OK;
    if (st == UCS_ERR_UNREACHABLE) {
        /* UCX's shared-memory transports handle peer failure only when
         * asked to (UCX_POSIX_ERROR_HANDLING=y, UCX_SYSV_ERROR_HANDLING=y);
         * without it a dead peer is found by the transfer timeout. */
        static _Atomic int said;
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(wk->w, &p, &c->ep);
        if (st == UCS_OK && !atomic_exchange(&said, 1))
            KVT_LOG_I("ucx: a peer is reached without peer failure "
                      "handling (for shared memory, "
                      "UCX_POSIX_ERROR_HANDLING=y gives it); a dead peer is "
                      "found by the transfer timeout");
    }
    if (st != UCS_OK) {
        KVT_LOG_W("ucx: cannot create an endpoint: %s", ucs_status_string(st));
        free(c->addr);
        free(c);
        *st_p = kvt__ucx_status(st) == KVT_ERR_NO_MEMORY ? KVT_ERR_NO_MEMORY
                                                         : KVT_ERR_UNREACHABLE;
        return NULL;
    }
    c->refs = 1;
    c->next = wk->conns;
    wk->conns = c;
    atomic_fetch_add(&wk->ucx->nconns, 1);
    return c;
}

void kvt__ucx_conn_fail(ucx_conn_t *c)
{
    if (!c->error) {
        c->error = 1;
        c->wk->conn_error = 1;
    }
}

void kvt__ucx_conn_put_untrusted(ucx_worker_t *wk, ucx_conn_t *c)
{
    if (c->refs == 1)
        kvt__ucx_conn_fail(c);
    kvt__ucx_conn_put(wk, c);
}

void kvt__ucx_conn_put_refused(ucx_worker_t *wk, ucx_conn_t *c)
{
    if (c->refs == 1) {
        c->linger = 1;
        kvt__ucx_conn_fail(c);
    }
    kvt__ucx_conn_put(wk, c);
}

static void conn_close(ucx_worker_t *wk, ucx_conn_t *c)
{
    ucx_conn_t **pp = &wk->conns;

    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    /* Forced (which drops what is in flight) when UCX failed it, or when
     * nothing was left on it; gracefully when a session gave up on
     * requests that a live peer may still answer: forcing the close of
     * UCX's tcp under them has crashed UCX 1.13 (an assertion in its tcp
     * connection manager). Gracefully too when it carries a refusal
     * (linger) to a peer still there, which is to read it. */
    kvt__ucx_ep_close(wk, c->ep,
                      c->peer_failures && (c->dead || !c->orphans) &&
                          !(c->linger && !c->dead));
    free(c->addr);
    free(c);
    atomic_fetch_sub(&wk->ucx->nconns, 1);
}

void kvt__ucx_conn_put(ucx_worker_t *wk, ucx_conn_t *c)
{
    if (--c->refs == 0 && c->error)
        conn_close(wk, c);
}

void kvt__ucx_conns_check(ucx_worker_t *wk)
{
    ucx_conn_t *c, *next;

    if (!atomic_exchange(&wk->conn_error, 0))
        return;
    for (ucx_session_t *s = wk->sessions; s != NULL; s = s->wnext)
        if (s->conn != NULL && s->conn->error && !s->ep_error) {
            s->ep_error = 1;
            kvt__ucx_sess_touch(s);
        }
    for (ucx_inbound_t *in = wk->inbound; in != NULL; in = in->next)
        if (in->conn != NULL && in->conn->error) {
            in->error = 1;
            wk->inbound_error = 1;
        }
    for (c = wk->conns; c != NULL; c = next) {
        next = c->next;
        if (c->error && c->refs == 0)
            conn_close(wk, c);
    }
}

void kvt__ucx_conns_close_all(ucx_worker_t *wk)
{
    while (wk->conns != NULL) {
        ucx_conn_t *c = wk->conns;
        wk->conns = c->next;
        kvt__ucx_ep_close(wk, c->ep, c->peer_failures);
        free(c->addr);
        free(c);
        atomic_fetch_sub(&wk->ucx->nconns, 1);
    }
}
