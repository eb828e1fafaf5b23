/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which transport carries a peer's transfers: one function over the
 * transports' capabilities and the peer's descriptor, with the user's
 * choice (the engine's `transports`) as the override.
 *
 * A transport can serve a pair (memory kind here, memory kind there) when
 * this engine runs it (the user allowed it and it could be set up), the
 * peer offers it (its descriptor has the transport's section), it moves
 * both kinds, and it can reach the peer: a same-host transport only a
 * peer whose host id (a hash of the boot id and the pid namespace) is this
 * engine's own, then its own reachable() check. Of those, the highest
 * priority is tried first and the next on failure.
 *
 * A peer on another host takes a network transport silently (at debug
 * level). Anything else that keeps a better transport off a peer is said
 * once, when the session opens; transfers never switch transport.
 */
#include <stdio.h>
#include <string.h>

#include "core/engine_int.h"
#include "transport/transport.h"
#include "util/log.h"

unsigned kvt__tl_select(kvt_engine_h e, const kvt__segdesc_t *d,
                        kvt_mem_kind_t local, kvt_mem_kind_t remote,
                        unsigned *order, const char **why)
{
    unsigned n = 0;

    for (unsigned i = 0; i < e->ntl; i++) {
        const kvt__tl_ops_t *ops = e->tl[i]->ops;
        const char *w = NULL;
        int ok;

        why[i] = NULL;
        if ((ops->caps.local_mem & KVT__MEM_BIT(local)) == 0 ||
            (ops->caps.remote_mem & KVT__MEM_BIT(remote)) == 0)
            ok = 0; /* not a transport for this memory: nothing to say */
        else if ((ops->caps.flags & KVT__TL_SAME_HOST) &&
                 (d->host_id != e->cfg.host_id || d->pid == 0))
            ok = 0; /* another host: nothing to say either */
        else if (kvt__segdesc_tl(d, ops->id) == NULL)
            ok = 0, w = "the peer does not offer it";
        else
            ok = ops->reachable == NULL || ops->reachable(e->tl[i], d, &w);
        if (!ok) {
            why[i] = w;
            continue;
        }
        /* Insertion by priority; the registry's order breaks ties. */
        {
            unsigned k = n++;
            while (k > 0 && e->tl[order[k - 1]]->ops->caps.priority <
                                ops->caps.priority) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = i;
        }
    }
    return n;
}

/* The transports that lost to the chosen one for a reason worth telling,
 * in @buf. */
static void reasons(kvt_engine_h e, const char *const *why, unsigned chosen,
                    char *buf, size_t cap)
{
    size_t used = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < e->ntl && used < cap; i++) {
        if (why[i] == NULL ||
            e->tl[i]->ops->caps.priority <= e->tl[chosen]->ops->caps.priority)
            continue;
        used += (size_t)snprintf(buf + used, cap - used,
                                 "%s%s is not available (%s)", used ? "; " : "",
                                 e->tl[i]->ops->name, why[i]);
    }
}

/* The session of @seg with transport @tl, if one is open. */
static kvt__session_t *sess_of(kvt__seg_t *seg, kvt__tl_t *tl)
{
    for (unsigned i = 0; i < seg->nsess; i++)
        if (seg->sess[i]->tl == tl)
            return seg->sess[i];
    return NULL;
}

/*
 * The best transport for one pair of kinds: one already open for the
 * segment, or the first of the candidates that opens. Returns the
 * session, or NULL with *st_p the last failure (KVT_ERR_NOT_SUPPORTED
 * when no transport can serve the pair at all).
 */
static kvt__session_t *route_one(kvt_engine_h e, kvt__seg_t *seg, unsigned l,
                                 unsigned r, kvt_status_t *st_p)
{
    unsigned order[KVT__TL_MAX], n;
    const char *why[KVT__TL_MAX];
    kvt__tl_peer_t peer = {seg, seg->name, seg->addr, &seg->desc};

    *st_p = KVT_ERR_NOT_SUPPORTED;
    n = kvt__tl_select(e, &seg->desc, (kvt_mem_kind_t)l, (kvt_mem_kind_t)r,
                       order, why);
    for (unsigned k = 0; k < n; k++) {
        kvt__tl_t *tl = e->tl[order[k]];
        kvt__session_t *s = sess_of(seg, tl);
        const char *w = NULL;

        if (s == NULL) {
            kvt_status_t st = tl->ops->open(tl, &peer, &s, &w);
            if (s != NULL)
                seg->sess[seg->nsess++] = s; /* failed or not, it stays */
            if (st != KVT_OK) {
                *st_p = st;
                if (s != NULL)
                    return NULL; /* a failed session: the open fails */
                why[order[k]] = w != NULL ? w : kvt_status_str(st);
                continue;
            }
        }
        {
            char told[256];
            reasons(e, why, order[k], told, sizeof(told));
            if (told[0] != '\0')
                KVT_LOG_W("segment %s: %s: falling back to %s", seg->name, told,
                          tl->ops->name);
            else if (l == KVT_MEM_HOST && r == KVT_MEM_HOST)
                KVT_LOG_I("segment %s: using %s", seg->name, tl->ops->name);
        }
        *st_p = KVT_OK;
        return s;
    }
    return NULL;
}

kvt_status_t kvt__transport_open(kvt_engine_h e, kvt__seg_t *seg)
{
    kvt_status_t first = KVT_ERR_NOT_SUPPORTED;
    int any = 0;

    for (unsigned l = 0; l < KVT_MEM_KINDS; l++) {
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++) {
            kvt_status_t st;
            seg->route[l][r] = route_one(e, seg, l, r, &st);
            if (seg->route[l][r] != NULL) {
                any = 1;
            } else if (st != KVT_ERR_NOT_SUPPORTED) {
                return st; /* a transport that should serve it failed */
            } else if (l == KVT_MEM_HOST && r == KVT_MEM_HOST) {
                first = st;
            }
        }
    }
    if (!any) {
        KVT_LOG_E("segment %s offers no transport this engine runs", seg->name);
        return first;
    }
    return KVT_OK;
}
