/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions: opening (endpoint, HELLO, HELLO_ACK), submission into the
 * worker's inbox, and on the worker their service after progress,
 * failure, registry changes (the descriptor fetched again) and release.
 * The data path is ucx_data.c's and the peer's regions ucx_rkey.c's;
 * neither calls back here.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <unistd.h>

#include "transport/ucx/ucx.h"
#include "util/auth.h"
#include "util/log.h"
#include "util/time.h"

/* ---- Opening
 * ----------------------------------------------------------------- */

/* The address of the peer's worker that serves ours (its section:
 * u32 count, then u32 length and address each). */
static kvt_status_t peer_worker(ucx_session_t *s, const kvt__segdesc_t *d)
{
    const kvt__segdesc_tl_t *sec = kvt__segdesc_tl(d, kvt__tl_ucx.id);
    const uint8_t *p, *end;
    uint32_t n, pick;

    if (sec == NULL || sec->len < 12)
        return KVT_ERR_PROTOCOL;
    p = sec->body;
    end = p + sec->len;
    memcpy(&s->desc_gen, p, 8);
    memcpy(&n, p + 8, 4);
    p += 12;
    if (n == 0)
        return KVT_ERR_PROTOCOL;
    pick = s->wk->id % n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l;
        if ((size_t)(end - p) < 4)
            return KVT_ERR_PROTOCOL;
        memcpy(&l, p, 4);
        p += 4;
        if (l == 0 || l > UCX_ADDR_MAX || (size_t)(end - p) < l)
            return KVT_ERR_PROTOCOL;
        if (i == pick) {
            s->peer_addr = malloc(l);
            if (s->peer_addr == NULL)
                return KVT_ERR_NO_MEMORY;
            memcpy(s->peer_addr, p, l);
            s->peer_addr_len = l;
        }
        p += l;
    }
    return KVT_OK;
}

static void open_done(ucx_session_t *s, int result)
{
    pthread_mutex_lock(&s->lock);
    if (s->opened == 0)
        s->opened = result;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* Worker: the endpoint and HELLO. */
void kvt__ucx_sess_connect(ucx_session_t *s)
{
    ucx_worker_t *wk = s->wk;
    kvt_status_t kst;

    s->wnext = wk->sessions;
    if (wk->sessions)
        wk->sessions->wprev = s;
    wk->sessions = s;
    if (atomic_load(&s->killed) != 0) {
        kvt__ucx_sess_fail(s, atomic_load(&s->killed), 0);
        open_done(s, -KVT_ERR_CANCELED);
        return;
    }
    s->conn = kvt__ucx_conn_get(wk, s->peer_addr, s->peer_addr_len, &kst);
    if (s->conn == NULL) {
        KVT_LOG_W("ucx: %s: cannot be reached: %s", s->base.name,
                  kvt_status_str(kst));
        kvt__ucx_sess_fail(s, kst, 0);
        open_done(s, -(int)kst);
        return;
    }
    {
        /* With a token: the nonce follows the address (ucx_auth.c). */
        uint8_t hello[8 + UCX_ADDR_MAX + UCX_NONCE_LEN];
        size_t len = 8 + wk->addr_len;
        memcpy(hello, &s->desc_gen, 8);
        memcpy(hello + 8, wk->addr, wk->addr_len);
        kst = KVT_OK;
        if (wk->ucx->cfg->auth.on) {
            kst = kvt__auth_random(s->nonce, UCX_NONCE_LEN);
            memcpy(hello + len, s->nonce, UCX_NONCE_LEN);
            len += UCX_NONCE_LEN;
        }
        if (kst == KVT_OK)
            kst = kvt__ucx_am_send(s->conn->ep, UCX_AM_HELLO, s->token,
                                   wk->addr_len, hello, len, NULL);
    }
    if (kst != KVT_OK) {
        kvt__ucx_sess_fail(s, KVT_ERR_CONN_LOST, 0);
        open_done(s, -KVT_ERR_CONN_LOST);
    }
}

kvt_status_t kvt__ucx_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                           kvt__session_t **s_p, const char **why_p)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;
    uint64_t deadline = kvt__now_ns() + ucx->cfg->connect_timeout_ms * 1000000;
    ucx_session_t *s;
    ucx_msg_t *m;
    kvt_status_t st;
    int result;

    *s_p = NULL;
    s = calloc(1, sizeof(*s));
    m = calloc(1, sizeof(*m));
    if (s == NULL || m == NULL) {
        free(s);
        free(m);
        return KVT_ERR_NO_MEMORY;
    }
    s->wk =
        &ucx->workers[atomic_fetch_add(&ucx->next_worker, 1) % ucx->nworkers];
    s->token = atomic_fetch_add(&ucx->next_token, 1);
    snprintf(s->addr, sizeof(s->addr), "%s", peer->addr);
    s->pidfd = -1;
    if (peer->desc->host_id == ucx->cfg->host_id && peer->desc->pid != 0)
        s->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)peer->desc->pid, 0);
    pthread_mutex_init(&s->lock, NULL);
    kvt__ucx_cond_init(&s->cond);
    st = peer_worker(s, peer->desc);
    if (st == KVT_OK)
        st = kvt__ucx_regions_load(s, peer->desc);
    if (st != KVT_OK) {
        *why_p = "its ucx section is malformed";
        kvt__ucx_session_destroy(&s->base); /* touches nothing of the base */
        free(m);
        return st;
    }
    kvt__session_init(&s->base, tl, peer);
    *s_p = &s->base;
    m->kind = MSG_OPEN;
    m->s = s;
    kvt__ucx_post(s->wk, m, 1);

    pthread_mutex_lock(&s->lock);
    while (s->opened == 0) {
        uint64_t now = kvt__now_ns();
        struct timespec ts;
        if (now >= deadline)
            break;
        kvt__ucx_abstime(&ts, deadline - now);
        pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    }
    result = s->opened;
    pthread_mutex_unlock(&s->lock);
    if (result == 1)
        return KVT_OK;
    if (result == 0) {
        *why_p = "no answer to its handshake";
        kvt__ucx_kill(&s->base, KVT_ERR_TIMEDOUT);
        return KVT_ERR_TIMEDOUT;
    }
    if (result == -KVT_ERR_ACCESS)
        *why_p = "authentication failed";
    else if (result == -KVT_ERR_BUSY)
        *why_p = "it serves as many initiators as it takes";
    else
        *why_p = "it cannot be reached through ucx";
    return (kvt_status_t)-result;
}

/* ---- Submission (any thread)
 * --------------------------------------------------- */

kvt_status_t kvt__ucx_submit(kvt__session_t *base, const kvt__xfer_t *x,
                             size_t n, kvt__sub_t *sub)
{
    ucx_session_t *s = (ucx_session_t *)base;
    kvt_status_t why = atomic_load(&s->killed);
    size_t notes = 0, off = 0;
    ucx_msg_t *m;

    if (why == KVT_OK)
        why = atomic_load(&base->dead);
    if (why != KVT_OK) {
        for (size_t i = 0; i < n; i++) {
            kvt__comp_expect(x[i].comp, 1);
            kvt__comp_done(x[i].comp, why);
        }
        return KVT_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (x[i].op == KVT_OP_NOTIFY)
            notes += x[i].len;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVT_ERR_NO_MEMORY;
    m->x = malloc(n * sizeof(*x));
    m->notes = notes ? malloc(notes) : NULL;
    if (m->x == NULL || (notes && m->notes == NULL)) {
        free(m->x);
        free(m->notes);
        free(m);
        return KVT_ERR_NO_MEMORY;
    }
    memcpy(m->x, x, n * sizeof(*x));
    for (size_t i = 0; i < n; i++) {
        kvt__comp_expect(x[i].comp, 1);
        if (x[i].op == KVT_OP_NOTIFY) {
            memcpy(m->notes + off, (const void *)(uintptr_t)x[i].laddr,
                   x[i].len);
            m->x[i].laddr = (uint64_t)(uintptr_t)(m->notes + off);
            off += x[i].len;
        }
    }
    m->kind = MSG_XFER;
    m->s = s;
    m->n = n;
    kvt__sub_note(sub, NULL); /* the worker completes it */
    kvt__ucx_post(s->wk, m, !sub->plugged);
    if (sub->plugged)
        atomic_store(&s->wk->need_wake, 1);
    return KVT_OK;
}

void kvt__ucx_flush_tl(kvt__tl_t *tl)
{
    kvt__ucx_t *ucx = (kvt__ucx_t *)tl;

    for (unsigned i = 0; i < ucx->nworkers; i++)
        if (atomic_exchange(&ucx->workers[i].need_wake, 0))
            kvt__ucx_wake(&ucx->workers[i]);
}

void kvt__ucx_kill(kvt__session_t *base, kvt_status_t why)
{
    ucx_session_t *s = (ucx_session_t *)base;
    int32_t zero = 0;
    ucx_msg_t *m;

    if (!atomic_compare_exchange_strong(&s->killed, &zero, (int32_t)why))
        return;
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        KVT_LOG_E("ucx: out of memory: %s is failed when next served",
                  base->name);
        kvt__ucx_wake(s->wk);
        return;
    }
    m->kind = MSG_KILL;
    m->s = s;
    m->why = why;
    kvt__ucx_post(s->wk, m, 1);
}

void kvt__ucx_session_destroy(kvt__session_t *base)
{
    ucx_session_t *s = (ucx_session_t *)base;

    kvt__ucx_regions_free(s);
    if (s->pidfd >= 0)
        close(s->pidfd);
    free(s->peer_addr);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

/* Whether a peer on this host has exited (its pidfd is readable). */
static int peer_exited(ucx_session_t *s, uint64_t now)
{
    struct pollfd p = {.fd = s->pidfd, .events = POLLIN};

    if (s->pidfd < 0 || now < s->next_pid_check)
        return 0;
    s->next_pid_check = now + 20000000ull; /* every 20 ms at most */
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP));
}

/* ---- Failure, service, release (worker)
 * ------------------------------------------ */

/* Complete every unit of @s now with @why, and leave those with requests
 * in flight to ucp, which frees them with their last request. */
static void orphan_all(ucx_session_t *s, kvt_status_t why)
{
    ucx_unit_t *lists[2] = {s->fifo_head, s->gets_head};

    s->fifo_head = s->fifo_tail = s->gets_head = s->gets_tail = NULL;
    s->epoch = NULL;
    for (int k = 0; k < 2; k++) {
        ucx_unit_t *u = lists[k], *next;
        for (; u != NULL; u = next) {
            next = u->next;
            for (uint32_t i = 0; i < u->ncomps; i++)
                kvt__comp_done(u->comps[i], why);
            if (u->comps != &u->comp1)
                free(u->comps);
            u->comps = &u->comp1;
            u->ncomps = 0;
            u->s = NULL;
            u->orphan = 1;
            if (u->refs == 0) {
                free(u->msg);
                free(u);
            } else {
                s->conn->orphans = 1;
            }
        }
    }
}

/*
 * Leave the connection. When nothing is in flight the peer is told (BYE)
 * and the connection stays for the next session; otherwise what is in
 * flight is abandoned with it: the connection fails (and is forced closed
 * once its last user leaves), which completes those requests.
 */
static void ep_close(ucx_session_t *s)
{
    if (s->conn == NULL)
        return;
    if (!kvt__ucx_sess_busy(s) && !s->ep_error && !s->conn->error) {
        kvt__ucx_am_send(s->conn->ep, UCX_AM_BYE, s->token, 0, NULL, 0, NULL);
    } else {
        /* Work in flight on a connection UCX did not fail (a peer that
         * stopped answering, a close that outlived its linger) ends now;
         * the connection goes once ucp returns it. */
        if (kvt__ucx_sess_busy(s) && !s->conn->dead)
            orphan_all(s, s->failed != KVT_OK ? s->failed : KVT_ERR_CANCELED);
        kvt__ucx_conn_fail(s->conn);
    }
    kvt__ucx_conn_put(s->wk, s->conn);
    s->conn = NULL;
    s->linger = 0;
}

void kvt__ucx_sess_fail(ucx_session_t *s, kvt_status_t why, int evict)
{
    int32_t zero = 0;
    ucx_msg_t *m;

    if (s->failed != KVT_OK)
        return;
    /* Closed by its user (or the engine): what is in flight may still
     * land, for a second, before the endpoint is forced closed; a peer
     * whose endpoint is closed under its in-flight requests may not take
     * it well. */
    s->linger = why == KVT_ERR_CANCELED && s->conn != NULL && !s->ep_error;
    if (s->linger) {
        kvt__ucx_sess_close_epoch(s);
        s->linger_until = kvt__now_ns() + 1000000000ull;
    }
    s->failed = why;
    atomic_compare_exchange_strong(&s->base.dead, &zero, (int32_t)why);
    if (s->epoch != NULL) {
        /* Its puts were never flushed, even if its user closed the
         * session: nothing says they landed. */
        if (s->epoch->status == KVT_OK)
            s->epoch->status = why;
        s->epoch->posted = 1;
        s->epoch = NULL;
    }
    while ((m = s->held_head) != NULL) {
        s->held_head = m->next;
        kvt__ucx_complete_msg(m, why);
    }
    s->held_tail = NULL;
    if (!s->linger)
        ep_close(s);
    kvt__ucx_sess_touch(s);
    if (evict) {
        KVT_LOG_W("ucx: %s: session failed: %s", s->base.name,
                  kvt_status_str(why));
        kvt__session_evict(&s->base);
    }
}

/* Fetch the peer's descriptor again (blocking, bounded by the connect
 * timeout) and load its regions. */
static void refetch(ucx_session_t *s)
{
    kvt__segdesc_t d;
    kvt_status_t st;

    memset(&d, 0, sizeof(d));
    st = kvt__ctrl_fetch(s->base.engine, s->base.name, s->addr, &d);
    if (st == KVT_OK) {
        kvt__ucx_regions_free(s);
        st = kvt__ucx_regions_load(s, &d);
        kvt__segdesc_clear(&d);
    }
    if (st != KVT_OK) {
        KVT_LOG_W("ucx: %s: cannot fetch its descriptor again: %s",
                  s->base.name, kvt_status_str(st));
        kvt__ucx_sess_fail(s, st == KVT_ERR_NO_MEMORY ? st : KVT_ERR_CONN_LOST,
                           1);
        return;
    }
    s->stale = 0;
    KVT_LOG_D("ucx: %s: descriptor fetched again (%zu regions)", s->base.name,
              s->nregions);
}

static void release(ucx_session_t *s)
{
    ucx_worker_t *wk = s->wk;

    for (size_t i = 0; i < s->nregions; i++)
        if (s->regions[i].rkey != NULL) {
            ucp_rkey_destroy(s->regions[i].rkey);
            s->regions[i].rkey = NULL;
        }
    if (s->wprev)
        s->wprev->wnext = s->wnext;
    else
        wk->sessions = s->wnext;
    if (s->wnext)
        s->wnext->wprev = s->wprev;
    s->released = 1;
    kvt__session_release(&s->base);
}

int kvt__ucx_sess_service(ucx_session_t *s, uint64_t now)
{
    uint64_t tmo = kvt__engine_cfg(s->base.engine)->timeout_ns;
    kvt_status_t killed = atomic_load(&s->killed);

    if (s->failed == KVT_OK && killed != KVT_OK)
        kvt__ucx_sess_fail(s, killed, 0);
    if (s->failed == KVT_OK && s->ep_error)
        kvt__ucx_sess_fail(s, KVT_ERR_CONN_LOST, 1);
    if (s->failed == KVT_OK && kvt__ucx_sess_busy(s) && peer_exited(s, now))
        kvt__ucx_sess_fail(s, KVT_ERR_CONN_LOST, 1);
    kvt__ucx_fifo_advance(s);
    if (s->failed == KVT_OK && !kvt__ucx_sess_busy(s) && s->epoch == NULL) {
        if (s->ack_gen != 0) {
            KVT_LOG_D("ucx: %s: registry change %llu acknowledged",
                      s->base.name, (unsigned long long)s->ack_gen);
            kvt__ucx_am_send(s->conn->ep, UCX_AM_REG_ACK, s->token, s->ack_gen,
                             NULL, 0, NULL);
            s->ack_gen = 0;
        }
        if (s->stale && s->held_head != NULL)
            refetch(s);
    }
    if (s->failed == KVT_OK && !s->stale && s->held_head != NULL) {
        kvt__ucx_run_held(s);
        kvt__ucx_sess_close_epoch(s); /* what it wrote */
    }
    if (s->failed == KVT_OK && tmo > 0) {
        uint64_t t0 = UINT64_MAX;
        if (s->fifo_head)
            t0 = s->fifo_head->t0;
        if (s->gets_head && s->gets_head->t0 < t0)
            t0 = s->gets_head->t0;
        if (t0 != UINT64_MAX && now > t0 && now - t0 > tmo)
            kvt__ucx_sess_fail(s, KVT_ERR_TIMEDOUT, 1);
    }
    kvt__ucx_fifo_advance(s);
    if (s->linger &&
        (!kvt__ucx_sess_busy(s) || s->ep_error || now >= s->linger_until))
        ep_close(s);
    if (s->linger && s->conn == NULL)
        s->linger = 0;
    if (s->failed != KVT_OK && !kvt__ucx_sess_busy(s) && !s->touched &&
        s->conn == NULL) {
        release(s);
        return 0;
    }
    return 1;
}

ucx_session_t *kvt__ucx_sess_by_token(ucx_worker_t *wk, uint64_t token)
{
    for (ucx_session_t *s = wk->sessions; s != NULL; s = s->wnext)
        if (s->token == token)
            return s;
    return NULL;
}
