/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decode side of a room, and the receiver calls that create and
 * init it: find the prefill ranks that hold this rank's KV heads
 * (bootstrap lookup, then a session with each), announce the destination
 * blocks to each of them once init() gave them, and count their DONE
 * messages (on the rx thread, rx.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

/*
 * Decode rank d of D reads from prefill ranks of group g (P ranks each):
 * with P >= D, the P/D ranks d*P/D .. (d+1)*P/D-1, each holding a slice
 * of d's heads, the first of them also sending the replicated caches and
 * the aux items (the others are dummies for those); with P < D, rank
 * d/(D/P) alone, which holds d's heads among others.
 */
static void resolve(kvt_conn_h c, struct kvt_room *r)
{
    kvtc__topo_t *t = kvtc__topo_get(c, r->server);
    uint32_t P, D = c->tp_size, d = c->tp_rank, k, first, n;
    uint64_t g;

    if (t == NULL) {
        kvtc__room_fail(r, KVT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (t->why[0] != '\0')
        snprintf(r->wait_why, sizeof(r->wait_why), "%s", t->why);
    if (t->state != KVTC__TOPO_OK)
        return;
    P = t->tp_total / t->dp;
    g = r->group >= 0 ? (uint64_t)r->group : r->id % t->dp;
    if (g >= t->dp) {
        kvtc__room_fail(r, KVT_ERR_INVALID_PARAM,
                        "prefill dp group %" PRIu64 " does not exist (dp size "
                        "%u)",
                        g, t->dp);
        return;
    }
    if (P % D != 0 && D % P != 0) {
        kvtc__room_fail(r, KVT_ERR_INVALID_PARAM,
                        "prefill tp %u and decode tp %u: one must divide the "
                        "other",
                        P, D);
        return;
    }
    k = P >= D ? P / D : D / P;
    first = P >= D ? d * k : d / k;
    n = P >= D ? k : 1;
    for (uint32_t j = 0, missing = 0; j <= n; j++) {
        /* Every address must be known first (the slow thread looks the
         * missing ones up). */
        if (j < n && t->names[g * P + first + j][0] == '\0') {
            t->need[g * P + first + j] = 1;
            missing = 1;
        }
        if (j == n && missing) {
            pthread_cond_signal(&c->slow_cv);
            return;
        }
    }
    for (uint32_t j = 0; j < n; j++) {
        const char *name = t->names[g * P + first + j];
        kvtc__sess_t *s = kvtc__sess_find(c, name);
        kvtc__peer_t *p;
        if (s == NULL)
            s = kvtc__sess_new(c, name);
        if (s == NULL || (p = kvtc__room_add_peer(r, s)) == NULL) {
            kvtc__room_fail(r, KVT_ERR_NO_MEMORY, "out of memory");
            return;
        }
        p->rank = first + j;
        p->flags = j > 0 ? KVTC__ROOM_DUMMY : 0;
        p->st = KVTC__PEER_WAIT;
    }
    r->nexpect = n;
    r->resolved = 1;
    snprintf(r->wait_why, sizeof(r->wait_why),
             "handshaking with %u prefill rank(s)", n);
}

static void announce(kvt_conn_h c, struct kvt_room *r, uint32_t i)
{
    kvtc__peer_t *p = &r->peers[i];
    kvtc__room_msg_t q;
    uint64_t none[KVTC__LAY_MAX_AUX];
    kvtc__cmb_t b;

    for (uint32_t a = 0; a < c->lay.naux; a++)
        none[a] = r->aux ? r->aux[a] : UINT64_MAX;
    q = (kvtc__room_msg_t){c->tp_rank,  c->tp_size, p->flags, r->first_block,
                           c->lay.naux, none,       r->nids,  r->ids};
    p->st = KVTC__PEER_ANNOUNCING;
    kvtc__cmb_init(&b, KVTC__CM_ROOM, p->sess->id, r->id);
    kvtc__cm_room_encode(&b, &q);
    if (kvtc__cmb_finish(&b) != KVT_OK) {
        kvtc__room_fail(r, KVT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    kvtc__ctrl_send(c, p->sess, &b, r->id, r->serial, i);
}

/*
 * A failing room aborts the prefill ranks it announced to and that have
 * not finished, acknowledges those that aborted, and turns FAILED when
 * none may still write into its blocks.
 */
static int fail_progress(kvt_conn_h c, struct kvt_room *r, uint64_t now)
{
    int open = 0;

    for (uint32_t i = 0; i < r->npeers; i++) {
        kvtc__peer_t *p = &r->peers[i];
        kvtc__peer_abort_ack(c, r, i);
        /* A prefill rank not announced to yet is told too (its sender
         * may exist already), once its handshake ends; a dead one is
         * quiet. */
        if (p->st == KVTC__PEER_WAIT && p->sess->state == KVTC__SESS_DEAD)
            p->st = KVTC__PEER_QUIET;
        if (p->st == KVTC__PEER_WAIT && p->sess->state != KVTC__SESS_ALIVE) {
            open = 1;
            continue;
        }
        switch (p->st) {
        case KVTC__PEER_DONE:
            p->st = KVTC__PEER_QUIET;
            break;
        case KVTC__PEER_WAIT:
        case KVTC__PEER_ANNOUNCING:
        case KVTC__PEER_ACTIVE:
            kvtc__peer_abort_start(c, r, i, now);
            open = 1;
            break;
        case KVTC__PEER_ABORTING:
            open |= kvtc__peer_abort_wait(c, r, i, now);
            break;
        default:
            break;
        }
    }
    if (!open)
        kvtc__room_final(r, KVT_POLL_FAILED);
    return 0;
}

int kvtc__decode_tick(kvt_conn_h c, struct kvt_room *r, uint64_t now)
{
    int alive = 1;

    if (kvtc__room_is_final(r))
        return 0;
    if (r->failing)
        return fail_progress(c, r, now);
    if (!r->resolved) {
        resolve(c, r);
        if (!r->resolved || r->failing)
            return 0;
    }
    for (uint32_t i = 0; i < r->npeers; i++)
        alive &= r->peers[i].sess->state == KVTC__SESS_ALIVE;
    if (!alive)
        return 0;
    if (r->state == KVT_POLL_BOOTSTRAPPING)
        kvtc__room_set(r, KVT_POLL_WAITING_FOR_INPUT,
                       "bootstrapped with %u prefill rank(s)%s", r->npeers,
                       r->inited ? "" : "; waiting for init()");
    if (!r->inited)
        return 0;
    for (uint32_t i = 0; i < r->npeers && !r->failing; i++)
        if (r->peers[i].st == KVTC__PEER_WAIT)
            announce(c, r, i);
    return 0;
}

/* ---- Public calls -------------------------------------------------------- */

kvt_status_t kvt_receiver_create(kvt_conn_h c, const char *bootstrap_addr,
                                 uint64_t room, int64_t prefill_dp_group,
                                 kvt_receiver_h *receiver_p)
{
    const char *server = bootstrap_addr && *bootstrap_addr ? bootstrap_addr
                         : c                               ? c->server
                                                           : NULL;
    struct kvt_room *r;
    kvt_status_t st;

    if (c == NULL || receiver_p == NULL || c->role != KVT_ROLE_DECODE ||
        server == NULL || *server == '\0' || strlen(server) >= KVTC__NAME_MAX)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&c->lock);
    st = kvtc__room_new(c, room, KVT_ROLE_DECODE, &r);
    if (st == KVT_OK) {
        snprintf(r->server, sizeof(r->server), "%s", server);
        r->group = prefill_dp_group;
        snprintf(r->reason, sizeof(r->reason),
                 "looking up the prefill ranks at %s", server);
        kvtc__conn_wake(c);
        *receiver_p = r;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_receiver_init(kvt_receiver_h r, const uint32_t *ids, size_t n,
                               uint64_t first_block, const uint64_t *aux_slots,
                               size_t num_aux)
{
    kvt_conn_h c;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (r == NULL || r->role != KVT_ROLE_DECODE || (n > 0 && ids == NULL) ||
        n > KVTC__CM_MAX / 4 || first_block > UINT32_MAX)
        return st;
    c = r->conn;
    pthread_mutex_lock(&c->lock);
    if (r->inited || kvtc__room_is_final(r))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= c->lay.num_blocks)
            goto out;
    st = kvtc__room_aux(c, aux_slots, num_aux, &r->aux);
    if (st != KVT_OK)
        goto out;
    r->ids = malloc((n ? n : 1) * sizeof(*ids));
    if (r->ids == NULL) {
        free(r->aux);
        r->aux = NULL;
        st = KVT_ERR_NO_MEMORY;
        goto out;
    }
    if (n > 0)
        memcpy(r->ids, ids, n * sizeof(*ids));
    r->nids = n;
    r->first_block = first_block;
    r->inited = 1;
    /* The waiting timeout counts from init() on. */
    r->t_state = kvtc__conn_now_ms();
    r->dirty = 1;
    kvtc__conn_wake(c);
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}
