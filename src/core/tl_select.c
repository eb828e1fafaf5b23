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
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

static const char *const kind_names[KVT_MEM_KINDS] = {"host", "cuda"};

/* Append to @buf (NUL-terminated, @cap bytes) what @fmt says. */
static void put(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    va_list ap;

    if (n + 1 >= cap)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* Why @ops, built in, is not one of @e's transports. */
static void off_reason(kvt_engine_h e, const kvt__tl_ops_t *ops, char *buf,
                       size_t cap)
{
    for (unsigned k = 0; k < e->ntl_off; k++)
        if (e->tl_off[k] == ops) {
            put(buf, cap, "could not be started here (%s)",
                kvt_status_str(e->tl_off_st[k]));
            return;
        }
    if ((ops->caps.flags & KVT__TL_EXPLICIT) &&
        e->transports == KVT_TRANSPORT_ALL)
        put(buf, cap, "runs only when named in the engine's transports");
    else
        put(buf, cap, "not in this engine's transports");
}

/* Why transport @i of @e does not serve (@l, @r) to the peer of @d, into
 * @buf; empty when it does. As kvt__tl_select() decides, with every
 * reason said. */
static void not_serving(kvt_engine_h e, const kvt__segdesc_t *d, unsigned i,
                        kvt_mem_kind_t l, kvt_mem_kind_t r, char *buf,
                        size_t cap)
{
    const kvt__tl_ops_t *ops = e->tl[i]->ops;
    const char *w = NULL;

    if ((e->tl[i]->local_mem & KVT__MEM_BIT(l)) == 0)
        put(buf, cap, "does not move %s memory here", kind_names[l]);
    else if ((e->tl[i]->remote_mem & KVT__MEM_BIT(r)) == 0)
        put(buf, cap, "does not reach %s memory in a peer", kind_names[r]);
    else if ((ops->caps.flags & KVT__TL_SAME_HOST) && d->pid == 0)
        put(buf, cap, "the peer's host is not known (same host only)");
    else if ((ops->caps.flags & KVT__TL_SAME_HOST) &&
             d->host_id != e->cfg.host_id)
        put(buf, cap, "the peer is on another host");
    else if (kvt__segdesc_tl(d, ops->id) == NULL)
        put(buf, cap, "the peer does not offer it");
    else if ((ops->caps.flags & KVT__TL_DEV_DRIVER) &&
             (l != KVT_MEM_HOST || r != KVT_MEM_HOST) && !kvt__dev_usable())
        put(buf, cap, "no device driver here: %s", kvt__dev_why());
    else if (ops->reachable != NULL && !ops->reachable(e->tl[i], d, &w))
        put(buf, cap, "%s", w != NULL ? w : "the peer is not reachable");
}

void kvt__tl_explain(kvt_engine_h e, const kvt__segdesc_t *d,
                     kvt_mem_kind_t local, kvt_mem_kind_t remote, int chosen,
                     const char *note, const char *const *failed, char *buf,
                     size_t cap)
{
    static const struct {
        uint32_t id;
        const char *name;
    } known[] = {{KVT_TRANSPORT_TCP, "tcp"},
                 {KVT_TRANSPORT_SHM, "shm"},
                 {KVT_TRANSPORT_UCX, "ucx"}};
    char why[KVT__TL_MAX][KVT__WHY_MAX];
    unsigned serving = 0;
    const kvt__tl_ops_t *ops;

    if (cap == 0)
        return;
    buf[0] = '\0';
    for (unsigned i = 0; i < e->ntl; i++) {
        why[i][0] = '\0';
        not_serving(e, d, i, local, remote, why[i], sizeof(why[i]));
        if (why[i][0] == '\0' && failed != NULL && failed[i] != NULL)
            put(why[i], sizeof(why[i]), "its session could not be opened: %s",
                failed[i]);
        if (why[i][0] == '\0')
            serving++;
    }
    if (chosen < 0) {
        put(buf, cap, "none");
    } else {
        const kvt__tl_ops_t *c = e->tl[chosen]->ops;
        put(buf, cap, "%s (", c->name);
        if (note != NULL)
            put(buf, cap, "%s", note);
        else if (serving <= 1)
            put(buf, cap, "the only transport that serves it");
        else
            put(buf, cap, "the highest priority of the %u that serve it",
                serving);
        if (c->id == KVT_TRANSPORT_TCP &&
            (local != KVT_MEM_HOST || remote != KVT_MEM_HOST))
            put(buf, cap, "; device memory staged through pinned host memory");
        put(buf, cap, ")");
    }
    for (unsigned i = 0; i < e->ntl; i++) {
        if ((int)i == chosen)
            continue;
        put(buf, cap, "; %s: %s", e->tl[i]->ops->name,
            why[i][0] != '\0' ? why[i]
            : chosen >= 0 && e->tl[i]->ops->caps.priority <=
                                 e->tl[chosen]->ops->caps.priority
                ? "serves it too, at a lower priority"
                : "serves it, but not every kind of memory in use");
    }
    for (size_t k = 0; (ops = kvt__tl_registered(k)) != NULL; k++) {
        int runs = 0;
        for (unsigned i = 0; i < e->ntl; i++)
            runs |= e->tl[i]->ops == ops;
        if (!runs) {
            put(buf, cap, "; %s: ", ops->name);
            off_reason(e, ops, buf, cap);
        }
    }
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++)
        if (kvt__tl_by_id(known[k].id) == NULL &&
            e->transports != KVT_TRANSPORT_ALL && (e->transports & known[k].id))
            put(buf, cap, "; %s: not built into this library", known[k].name);
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
 * segment, or the first of the candidates that opens; seg->why[l][r] says
 * why, and *told_p is set when a better transport was passed over for a
 * reason worth a warning. Returns the session, or NULL with *st_p the last
 * failure (KVT_ERR_NOT_SUPPORTED when no transport can serve the pair at
 * all).
 */
static kvt__session_t *route_one(kvt_engine_h e, kvt__seg_t *seg, unsigned l,
                                 unsigned r, kvt_status_t *st_p, int *told_p)
{
    unsigned order[KVT__TL_MAX], n;
    const char *why[KVT__TL_MAX], *failed[KVT__TL_MAX] = {0};
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
                failed[order[k]] = why[order[k]];
                continue;
            }
        }
        {
            char told[256];
            reasons(e, why, order[k], told, sizeof(told));
            *told_p |= told[0] != '\0';
        }
        kvt__tl_explain(e, &seg->desc, (kvt_mem_kind_t)l, (kvt_mem_kind_t)r,
                        (int)order[k], NULL, failed, seg->why[l][r],
                        sizeof(seg->why[l][r]));
        *st_p = KVT_OK;
        return s;
    }
    kvt__tl_explain(e, &seg->desc, (kvt_mem_kind_t)l, (kvt_mem_kind_t)r, -1,
                    NULL, failed, seg->why[l][r], sizeof(seg->why[l][r]));
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
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++) {
            int used = (lk & KVT__MEM_BIT(l)) && (rk & KVT__MEM_BIT(r));
            seg->route[l][r] =
                serves(e, seg, (unsigned)best, l, r, used) ? s : NULL;
            if (used)
                kvt__tl_explain(e, &seg->desc, (kvt_mem_kind_t)l,
                                (kvt_mem_kind_t)r, best,
                                "one transport for every kind of memory in "
                                "use, so that a notification follows the "
                                "writes before it",
                                NULL, seg->why[l][r], sizeof(seg->why[l][r]));
        }
    return 1;
}

/*
 * The segment's routes are set: the reasons of pairs not in use yet, and
 * one log line for the session with the route of every pair in use and
 * why: a warning when a better transport was passed over for a reason
 * worth telling (@told), else at info level.
 */
static void say(kvt__seg_t *seg, uint32_t lk, uint32_t rk, int told)
{
    char line[KVT_MEM_KINDS * KVT_MEM_KINDS * (KVT__WHY_MAX + 24)];

    line[0] = '\0';
    for (unsigned l = 0; l < KVT_MEM_KINDS; l++)
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++) {
            if (!(lk & KVT__MEM_BIT(l)) || !(rk & KVT__MEM_BIT(r))) {
                snprintf(seg->why[l][r], sizeof(seg->why[l][r]),
                         "%s (not in use when the segment opened%s)",
                         seg->route[l][r] != NULL ? seg->route[l][r]->ops->name
                                                  : "none",
                         seg->route[l][r] != NULL
                             ? "; its session was open for other memory"
                             : "; no session open then serves it");
                continue;
            }
            put(line, sizeof(line), "%s%s->%s: %s", line[0] ? " | " : "",
                kind_names[l], kind_names[r], seg->why[l][r]);
        }
    if (told)
        KVT_LOG_W("segment %s: %s", seg->name, line);
    else
        KVT_LOG_I("segment %s: %s", seg->name, line);
}

kvt_status_t kvt__transport_open(kvt_engine_h e, kvt__seg_t *seg)
{
    kvt_status_t first = KVT_ERR_NOT_SUPPORTED;
    uint32_t lk = KVT__MEM_BIT(KVT_MEM_HOST), rk = lk;
    int any = 0, told = 0;

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
        if (r > 0) {
            say(seg, lk, rk, 0);
            return KVT_OK;
        }
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
            seg->route[l][r] = route_one(e, seg, l, r, &st, &told);
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
        KVT_LOG_E("segment %s: no transport this engine runs serves it: %s",
                  seg->name, seg->why[KVT_MEM_HOST][KVT_MEM_HOST]);
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
    say(seg, lk, rk, told);
    return KVT_OK;
}
