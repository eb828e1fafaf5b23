/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The peers of a room (the ranks on the other side, one session each),
 * and the abort exchange a failing room runs with each of them: an
 * ABORT to a peer that may still move data, an ABORT_ACK to one that
 * aborted, and the peer timeout for the acknowledgement.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

kvtc__peer_t *kvtc__room_add_peer(struct kvt_room *r, kvtc__sess_t *s)
{
    kvtc__peer_t *p;

    if (r->npeers == r->cap_peers) {
        uint32_t cap = r->cap_peers ? 2 * r->cap_peers : 4;
        p = realloc(r->peers, cap * sizeof(*p));
        if (p == NULL)
            return NULL;
        r->peers = p;
        r->cap_peers = cap;
    }
    p = &r->peers[r->npeers++];
    memset(p, 0, sizeof(*p));
    p->sess = s;
    kvtc__sess_ref(s);
    return p;
}

kvtc__peer_t *kvtc__room_peer_of(struct kvt_room *r, const kvtc__sess_t *s)
{
    for (uint32_t i = 0; i < r->npeers; i++)
        if (r->peers[i].sess == s)
            return &r->peers[i];
    return NULL;
}

void kvtc__peer_abort_ack(kvt_conn_h c, struct kvt_room *r, uint32_t i)
{
    kvtc__peer_t *p = &r->peers[i];
    if (p->need_ack) {
        p->need_ack = 0;
        kvtc__ctrl_status(c, p->sess, KVTC__CM_ABORT_ACK, r->id, 0, i, KVT_OK,
                          "");
    }
}

void kvtc__peer_abort_start(kvt_conn_h c, struct kvt_room *r, uint32_t i,
                            uint64_t now)
{
    kvtc__peer_t *p = &r->peers[i];
    p->st = KVTC__PEER_ABORTING;
    p->t_abort = now;
    kvtc__ctrl_status(c, p->sess, KVTC__CM_ABORT, r->id, 0, i, r->ferr,
                      r->freason);
}

int kvtc__peer_abort_wait(kvt_conn_h c, struct kvt_room *r, uint32_t i,
                          uint64_t now)
{
    kvtc__peer_t *p = &r->peers[i];
    if (kvtc__since(now, p->t_abort) > c->peer_ms)
        kvtc__sess_kill(c, p->sess, KVT_ERR_TIMEDOUT,
                        "%s did not acknowledge an abort in %" PRIu64 " ms",
                        p->sess->name, c->peer_ms);
    return p->st == KVTC__PEER_ABORTING;
}
