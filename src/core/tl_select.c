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

#include "core/engine_int.h"
#include "core/tl.h"
#include "mem/dev.h"
#include "util/log.h"

unsigned kvt__tl_select(kvt_engine_h e, const kvt__segdesc_t *d,
                        kvt_mem_kind_t local, kvt_mem_kind_t remote,
                        int ask_driver, unsigned *order, const char **why)
{
    unsigned n = 0;

    for (unsigned i = 0; i < e->ntl; i++) {
        const kvt__tl_ops_t *ops = e->tl[i]->ops;
        const char *w = NULL;
        int ok;

        why[i] = NULL;
        if ((e->tl[i]->local_mem & KVT__MEM_BIT(local)) == 0 ||
            (e->tl[i]->remote_mem & KVT__MEM_BIT(remote)) == 0)
            ok = 0; /* not a transport for this memory: nothing to say */
        else if ((ops->caps.flags & KVT__TL_SAME_HOST) &&
                 (d->host_id != e->cfg.host_id || d->pid == 0))
            ok = 0; /* another host: nothing to say either */
        else if (kvt__segdesc_tl(d, ops->id) == NULL)
            ok = 0, w = "the peer does not offer it";
        else if (ask_driver && (ops->caps.flags & KVT__TL_DEV_DRIVER) &&
                 (local != KVT_MEM_HOST || remote != KVT_MEM_HOST) &&
                 !kvt__dev_usable())
            ok = 0, w = kvt__dev_why(); /* no device driver here */
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
    n = kvt__tl_select(e, &seg->desc, (kvt_mem_kind_t)l, (kvt_mem_kind_t)r, 1,
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

/* Whether transport @i of @e can serve (@l, @r) to the peer of @seg
 * (@ask_driver: as kvt__tl_select()). */
static int serves(kvt_engine_h e, kvt__seg_t *seg, unsigned i, unsigned l,
                  unsigned r, int ask_driver)
{
    unsigned order[KVT__TL_MAX], n;
    const char *why[KVT__TL_MAX];

    n = kvt__tl_select(e, &seg->desc, (kvt_mem_kind_t)l, (kvt_mem_kind_t)r,
                       ask_driver, order, why);
    for (unsigned k = 0; k < n; k++)
        if (order[k] == i)
            return 1;
    return 0;
}

/*
 * With device memory on either side, one transport for every pair of
 * kinds in use, when one serves them all: a NOTIFY is ordered after the
 * writes its own transport carried, so a peer whose device memory went
 * over one transport and host memory over another could see a
 * notification before the device bytes. The transport of highest
 * priority that serves every pair in use is opened, and carries every
 * pair it can. Returns 1 when done, 0 when none serves them all (or it
 * could not be set up: then the pairs are routed one by one), -1 when
 * its open failed with a session (*st_p: the open fails, as route_one()
 * has it).
 */
static int route_single(kvt_engine_h e, kvt__seg_t *seg, uint32_t lk,
                        uint32_t rk, kvt_status_t *st_p)
{
    int best = -1;
    kvt__tl_peer_t peer = {seg, seg->name, seg->addr, &seg->desc};
    kvt__session_t *s;
    const char *w = NULL;

    for (unsigned i = 0; i < e->ntl; i++) {
        int all = 1;
        for (unsigned l = 0; all && l < KVT_MEM_KINDS; l++)
            for (unsigned r = 0; all && r < KVT_MEM_KINDS; r++)
                if ((lk & KVT__MEM_BIT(l)) && (rk & KVT__MEM_BIT(r)))
                    all = serves(e, seg, i, l, r, 1);
        if (all && (best < 0 || e->tl[i]->ops->caps.priority >
                                    e->tl[best]->ops->caps.priority))
            best = (int)i;
    }
    if (best < 0)
        return 0;
    s = sess_of(seg, e->tl[best]);
    if (s == NULL) {
        kvt_status_t st = e->tl[best]->ops->open(e->tl[best], &peer, &s, &w);
        if (s != NULL)
            seg->sess[seg->nsess++] = s; /* failed or not, it stays */
        if (st != KVT_OK) {
            *st_p = st;
            return s != NULL ? -1 : 0;
        }
    }
    for (unsigned l = 0; l < KVT_MEM_KINDS; l++)
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++)
            seg->route[l][r] =
                serves(e, seg, (unsigned)best, l, r,
                       (lk & KVT__MEM_BIT(l)) && (rk & KVT__MEM_BIT(r)))
                    ? s
                    : NULL;
    KVT_LOG_I("segment %s: using %s (device memory in use)", seg->name,
              e->tl[best]->ops->name);
    return 1;
}

kvt_status_t kvt__transport_open(kvt_engine_h e, kvt__seg_t *seg)
{
    kvt_status_t first = KVT_ERR_NOT_SUPPORTED;
    uint32_t lk = KVT__MEM_BIT(KVT_MEM_HOST), rk = lk;
    int any = 0;

    /* The kinds in use: host memory, device memory registered here, and
     * the kinds of the peer's regions. */
    kvt__memreg_rdlock(&e->reg);
    if (e->reg.ndev > 0)
        lk |= KVT__MEM_BIT(KVT_MEM_CUDA);
    kvt__memreg_unlock(&e->reg);
    for (uint32_t i = 0; i < seg->desc.nregions; i++)
        if (seg->desc.regions[i].kind < KVT_MEM_KINDS)
            rk |= KVT__MEM_BIT(seg->desc.regions[i].kind);
    if (((lk | rk) & ~KVT__MEM_BIT(KVT_MEM_HOST)) != 0) {
        kvt_status_t st = KVT_OK;
        int r = route_single(e, seg, lk, rk, &st);
        if (r > 0)
            return KVT_OK;
        if (r < 0)
            return st;
        KVT_LOG_W("segment %s: no transport moves every kind of memory in "
                  "use; each pair goes its own way, and a notification is "
                  "ordered only after the writes of its own transport",
                  seg->name);
    }
    for (unsigned l = 0; l < KVT_MEM_KINDS; l++) {
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++) {
            kvt_status_t st;
            seg->route[l][r] = NULL;
            if (!(lk & KVT__MEM_BIT(l)) || !(rk & KVT__MEM_BIT(r)))
                continue; /* not in use: below */
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
    /* Pairs not in use when the segment opened (device memory registered
     * later) go to a session already open that serves them; none is
     * opened for them. */
    for (unsigned l = 0; l < KVT_MEM_KINDS; l++)
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++)
            if ((!(lk & KVT__MEM_BIT(l)) || !(rk & KVT__MEM_BIT(r))))
                for (unsigned k = 0; k < seg->nsess; k++)
                    if (seg->route[l][r] == NULL &&
                        !atomic_load(&seg->sess[k]->dead) &&
                        serves(e, seg, seg->sess[k]->tl->index, l, r, 0))
                        seg->route[l][r] = seg->sess[k];
    return KVT_OK;
}
