/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The segment table: opened remote segments by handle and by name.
 *
 * Handles. A kvt_segment_t is generation << 32 | (slot index + 1). Closing
 * a segment frees its slot and bumps the slot's generation, so a stale
 * handle is refused (KVT_ERR_NOT_FOUND) even once the slot holds another
 * segment; lookups are an index and a compare.
 *
 * Names. The live segments (opened, neither closed nor failed) are indexed
 * by name in a chained hash table, so that kvt_segment_open() of a name
 * already open returns its handle at once. A segment whose session fails
 * leaves the index (kvt__session_evict()) but keeps its handle until it is
 * closed: transfers on it fail with the reason.
 *
 * Lifetime: see struct kvt__seg. Everything here is under sess_lock,
 * except the reference counts (atomics) and the descriptor (desc_lock);
 * no lock is held while calling into a transport.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "meta/meta.h"
#include "core/tl.h"
#include "mem/dev.h"
#include "util/log.h"

#define SLOTS_MAX (1u << 30)

static uint32_t name_hash(const char *name)
{
    uint32_t h = 2166136261u;
    for (; *name; name++) {
        h ^= (uint8_t)*name;
        h *= 16777619u;
    }
    return h;
}

static kvt__seg_t *names_find_locked(kvt_engine_h e, const char *name)
{
    kvt__seg_t *g;

    if (e->names_cap == 0)
        return NULL;
    g = e->names[name_hash(name) & (e->names_cap - 1)];
    for (; g != NULL; g = g->name_next)
        if (strcmp(g->name, name) == 0)
            return g;
    return NULL;
}

static kvt_status_t names_add_locked(kvt_engine_h e, kvt__seg_t *g)
{
    uint32_t b;

    if (e->nnames + 1 > e->names_cap) {
        uint32_t cap = e->names_cap ? 2 * e->names_cap : 64;
        kvt__seg_t **n = calloc(cap, sizeof(*n));
        if (n == NULL)
            return KVT_ERR_NO_MEMORY;
        for (uint32_t i = 0; i < e->names_cap; i++) {
            kvt__seg_t *x = e->names[i], *next;
            for (; x != NULL; x = next) {
                next = x->name_next;
                b = name_hash(x->name) & (cap - 1);
                x->name_next = n[b];
                n[b] = x;
            }
        }
        free(e->names);
        e->names = n;
        e->names_cap = cap;
    }
    b = name_hash(g->name) & (e->names_cap - 1);
    g->name_next = e->names[b];
    e->names[b] = g;
    g->named = 1;
    e->nnames++;
    return KVT_OK;
}

static void names_remove_locked(kvt_engine_h e, kvt__seg_t *g)
{
    kvt__seg_t **pp;

    if (!g->named)
        return;
    pp = &e->names[name_hash(g->name) & (e->names_cap - 1)];
    for (; *pp != NULL; pp = &(*pp)->name_next) {
        if (*pp == g) {
            *pp = g->name_next;
            break;
        }
    }
    g->named = 0;
    e->nnames--;
}

/* Take a free slot for @g and set its handle. */
static kvt_status_t slot_take_locked(kvt_engine_h e, kvt__seg_t *g)
{
    uint32_t i;

    if (e->free_slot != 0) {
        i = e->free_slot - 1;
        e->free_slot = e->slots[i].next_free;
    } else {
        if (e->nslots == e->slots_cap) {
            uint32_t cap = e->slots_cap ? 2 * e->slots_cap : 64;
            kvt__seg_slot_t *n;
            if (cap > SLOTS_MAX)
                return KVT_ERR_NO_SPACE;
            n = realloc(e->slots, cap * sizeof(*n));
            if (n == NULL)
                return KVT_ERR_NO_MEMORY;
            e->slots = n;
            e->slots_cap = cap;
        }
        i = e->nslots++;
        e->slots[i].gen = 1;
    }
    e->slots[i].seg = g;
    e->slots[i].next_free = 0;
    g->handle = ((uint64_t)e->slots[i].gen << 32) | (i + 1);
    return KVT_OK;
}

/* The slot of a live handle, or NULL. */
static kvt__seg_slot_t *slot_of_locked(kvt_engine_h e, kvt_segment_t handle)
{
    uint64_t i = (handle & 0xffffffffu);
    kvt__seg_slot_t *sl;

    if (i == 0 || i > e->nslots)
        return NULL;
    sl = &e->slots[i - 1];
    if (sl->seg == NULL || sl->gen != (uint32_t)(handle >> 32))
        return NULL;
    return sl;
}

static void slot_free_locked(kvt_engine_h e, kvt__seg_slot_t *sl)
{
    uint32_t i = (uint32_t)(sl - e->slots);

    sl->seg->handle = 0;
    sl->seg = NULL;
    if (++sl->gen == 0) /* a handle is never 0 */
        sl->gen = 1;
    sl->next_free = e->free_slot;
    e->free_slot = i + 1;
}

kvt__seg_t *kvt__seg_get(kvt_engine_h e, kvt_segment_t handle)
{
    kvt__seg_slot_t *sl;
    kvt__seg_t *g = NULL;

    pthread_mutex_lock(&e->sess_lock);
    sl = slot_of_locked(e, handle);
    if (sl != NULL) {
        g = sl->seg;
        atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&e->sess_lock);
    return g;
}

void kvt__seg_ref(kvt__seg_t *g)
{
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
}

static void seg_free(kvt__seg_t *g)
{
    for (unsigned i = 0; i < g->nsess; i++) {
        unsigned t = g->sess[i]->tl->index;
        g->sess[i]->ops->destroy_session(g->sess[i]);
        if (t < KVT__STATS_TL)
            atomic_fetch_add(&g->engine->stats.sess_closed[t], 1);
    }
    pthread_mutex_destroy(&g->desc_lock);
    kvt__segdesc_clear(&g->desc);
    free(g);
}

void kvt__seg_unref(kvt__seg_t *g)
{
    kvt_engine_h e = g->engine;

    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_lock(&e->sess_lock);
    if (g->prev)
        g->prev->next = g->next;
    else
        e->segs = g->next;
    if (g->next)
        g->next->prev = g->prev;
    pthread_mutex_unlock(&e->sess_lock);
    seg_free(g);
}

void kvt__segs_free_all(kvt_engine_h e)
{
    kvt__seg_t *g, *next;

    for (g = e->segs; g != NULL; g = next) {
        next = g->next;
        seg_free(g);
    }
    e->segs = NULL;
    free(e->slots);
    free(e->names);
    e->slots = NULL;
    e->names = NULL;
    e->nslots = e->slots_cap = e->free_slot = 0;
    e->names_cap = e->nnames = 0;
}

/* ---- What transports call ------------------------------------------------ */

void kvt__session_init(kvt__session_t *s, kvt__tl_t *tl,
                       const kvt__tl_peer_t *peer)
{
    kvt__seg_t *seg = peer->seg;

    s->engine = seg->engine;
    s->tl = tl;
    s->ops = tl->ops;
    s->seg = seg;
    memcpy(s->name, seg->name, sizeof(s->name));
    atomic_store(&s->dead, 0);
    kvt__seg_ref(seg);
    if (tl->index < KVT__STATS_TL)
        atomic_fetch_add(&s->engine->stats.sess_opened[tl->index], 1);
}

void kvt__session_hold(kvt__session_t *s)
{
    kvt__seg_ref(s->seg);
}

void kvt__session_release(kvt__session_t *s)
{
    kvt__seg_unref(s->seg);
}

/* Kill every session of @g; each may release @g's last reference only
 * once the caller's own is gone. */
static void kill_all(kvt__seg_t *g, kvt_status_t why)
{
    for (unsigned i = 0; i < g->nsess; i++)
        g->sess[i]->ops->kill(g->sess[i], why);
}

/*
 * A session failed: the segment leaves the name index, and its other
 * sessions die with it (one peer, one fate: a peer that lost one
 * transport is not trusted with the others). A dead session's kill()
 * returns at once, so this does not recurse more than once.
 */
void kvt__session_evict(kvt__session_t *s)
{
    kvt_engine_h e = s->engine;
    kvt__seg_t *g = s->seg;
    kvt_status_t why = atomic_load(&s->dead);

    pthread_mutex_lock(&e->sess_lock);
    names_remove_locked(e, g);
    pthread_mutex_unlock(&e->sess_lock);
    for (unsigned i = 0; i < g->nsess; i++)
        if (g->sess[i] != s)
            g->sess[i]->ops->kill(g->sess[i],
                                  why != KVT_OK ? why : KVT_ERR_CONN_LOST);
}

/* The kinds of memory a descriptor's regions are. */
static uint32_t remote_kinds(const kvt__segdesc_t *d)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < d->nregions; i++)
        if (d->regions[i].kind < 32)
            k |= 1u << d->regions[i].kind;
    return k;
}

kvt__session_t *kvt__seg_route(kvt__seg_t *g, unsigned lkind, uint64_t raddr,
                               uint64_t span)
{
    unsigned rkind = KVT_MEM_HOST;

    if (lkind >= KVT_MEM_KINDS)
        return NULL;
    if ((atomic_load_explicit(&g->rkinds, memory_order_relaxed) &
         ~KVT__MEM_BIT(KVT_MEM_HOST)) == 0)
        return g->route[lkind][KVT_MEM_HOST];
    pthread_mutex_lock(&g->desc_lock);
    {
        /* The peer has device memory: look the range up. A range in no
         * region the descriptor lists (stale, or wrong) goes as host
         * memory; the target refuses what it does not hold. */
        uint32_t lo = 0, hi = g->desc.nregions;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            const kvt_remote_region_t *x = &g->desc.regions[mid];
            if (x->addr + x->length <= raddr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < g->desc.nregions && g->desc.regions[lo].addr <= raddr &&
            raddr + span <=
                g->desc.regions[lo].addr + g->desc.regions[lo].length &&
            g->desc.regions[lo].kind < KVT_MEM_KINDS)
            rkind = g->desc.regions[lo].kind;
    }
    pthread_mutex_unlock(&g->desc_lock);
    return g->route[lkind][rkind];
}

/* ---- The public calls ---------------------------------------------------- */

/* A live segment of that name: opened, not closed, its session usable. */
static kvt__seg_t *live_by_name_locked(kvt_engine_h e, const char *name)
{
    kvt__seg_t *g = names_find_locked(e, name);

    for (unsigned i = 0; g != NULL && i < g->nsess; i++)
        if (atomic_load(&g->sess[i]->dead) != 0)
            return NULL;
    return g;
}

/* Where to dial: the name itself in p2p mode, else the address the peer
 * published. */
static kvt_status_t resolve(kvt_engine_h e, const char *name, char *addr,
                            size_t cap)
{
    kvt__segdesc_t d;
    kvt_status_t st;

    if (e->meta == NULL) {
        snprintf(addr, cap, "%s", name);
        return KVT_OK;
    }
    st = kvt__meta_lookup_segdesc(e->meta, name, &d);
    if (st != KVT_OK) {
        KVT_LOG_W("segment %s: metadata lookup failed: %s", name,
                  kvt_status_str(st));
        /* Not published: nobody to reach. What else the backend says is
         * a failure of the network or of what it holds. */
        if (st == KVT_ERR_NOT_FOUND)
            return KVT_ERR_UNREACHABLE;
        if (st != KVT_ERR_UNREACHABLE && st != KVT_ERR_TIMEDOUT &&
            st != KVT_ERR_IO && st != KVT_ERR_NO_MEMORY)
            return KVT_ERR_PROTOCOL;
        return st;
    }
    snprintf(addr, cap, strchr(d.host, ':') ? "[%s]:%u" : "%s:%u", d.host,
             d.port);
    kvt__segdesc_clear(&d);
    return KVT_OK;
}

kvt_status_t kvt_segment_open(kvt_engine_h e, const char *name,
                              kvt_segment_t *segment_p)
{
    kvt__seg_t *g, *other;
    kvt_status_t st;

    if (e == NULL || name == NULL || segment_p == NULL || *name == '\0' ||
        strlen(name) > KVT_WIRE_NAME_MAX)
        return KVT_ERR_INVALID_PARAM;
    if (atomic_load(&e->stopping))
        return KVT_ERR_CLOSED;
    pthread_mutex_lock(&e->sess_lock);
    g = live_by_name_locked(e, name);
    if (g != NULL) {
        *segment_p = g->handle;
        pthread_mutex_unlock(&e->sess_lock);
        return KVT_OK;
    }
    pthread_mutex_unlock(&e->sess_lock);

    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return KVT_ERR_NO_MEMORY;
    g->engine = e;
    atomic_init(&g->refs, 1); /* the handle's, once it has one */
    snprintf(g->name, sizeof(g->name), "%s", name);
    pthread_mutex_init(&g->desc_lock, NULL);
    pthread_mutex_lock(&e->sess_lock);
    g->next = e->segs;
    if (e->segs)
        e->segs->prev = g;
    e->segs = g;
    pthread_mutex_unlock(&e->sess_lock);
    st = resolve(e, name, g->addr, sizeof(g->addr));
    if (st != KVT_OK)
        goto err_unref;

    /* Handshake without holding the table lock; another thread may open
     * the same name meanwhile, and the first to finish wins. */
    st = kvt__ctrl_fetch(e, name, g->addr, &g->desc);
    if (st != KVT_OK)
        goto err_unref;
    atomic_store(&g->rkinds, remote_kinds(&g->desc));
    st = kvt__transport_open(e, g);
    if (st != KVT_OK)
        goto err_kill;

    pthread_mutex_lock(&e->sess_lock);
    other = live_by_name_locked(e, name);
    if (other != NULL) {
        *segment_p = other->handle;
    } else {
        st = slot_take_locked(e, g);
        if (st == KVT_OK && names_add_locked(e, g) != KVT_OK) {
            slot_free_locked(e, slot_of_locked(e, g->handle));
            st = KVT_ERR_NO_MEMORY;
        }
        *segment_p = g->handle;
    }
    pthread_mutex_unlock(&e->sess_lock);
    if (other != NULL || st != KVT_OK) {
        /* Lost the race (or no room): this one is dropped. */
        kill_all(g, KVT_ERR_CANCELED);
        kvt__seg_unref(g);
        return st;
    }
    KVT_LOG_D("opened segment %s", name);
    return KVT_OK;

err_kill:
    kill_all(g, st);
err_unref:
    kvt__seg_unref(g);
    return st;
}

kvt_status_t kvt_segment_regions(kvt_engine_h e, kvt_segment_t segment,
                                 int refresh, kvt_remote_region_t *regions,
                                 size_t max, size_t *count_p)
{
    kvt__segdesc_t fresh;
    kvt__seg_t *g;
    kvt_status_t st = KVT_OK;

    if (e == NULL || count_p == NULL || (regions == NULL && max > 0))
        return KVT_ERR_INVALID_PARAM;
    g = kvt__seg_get(e, segment);
    if (g == NULL)
        return KVT_ERR_NOT_FOUND;
    if (refresh) {
        st = kvt__ctrl_fetch(e, g->name, g->addr, &fresh);
        if (st != KVT_OK)
            goto out;
        pthread_mutex_lock(&g->desc_lock);
        kvt__segdesc_move(&g->desc, &fresh);
        atomic_store(&g->rkinds, remote_kinds(&g->desc));
        pthread_mutex_unlock(&g->desc_lock);
    }
    pthread_mutex_lock(&g->desc_lock);
    for (size_t i = 0; i < max && i < g->desc.nregions; i++)
        regions[i] = g->desc.regions[i];
    *count_p = g->desc.nregions;
    pthread_mutex_unlock(&g->desc_lock);
out:
    kvt__seg_unref(g);
    return st;
}

kvt_status_t kvt_segment_close(kvt_engine_h e, kvt_segment_t segment)
{
    kvt__seg_slot_t *sl;
    kvt__seg_t *g = NULL;

    if (e == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&e->sess_lock);
    sl = slot_of_locked(e, segment);
    if (sl != NULL) {
        g = sl->seg;
        names_remove_locked(e, g);
        slot_free_locked(e, sl);
    }
    pthread_mutex_unlock(&e->sess_lock);
    if (g == NULL)
        return KVT_ERR_NOT_FOUND;
    kill_all(g, KVT_ERR_CANCELED);
    kvt__seg_unref(g); /* the handle's reference */
    return KVT_OK;
}

kvt_status_t kvt_segment_info(kvt_engine_h e, kvt_segment_t segment,
                              kvt_segment_info_t *info_p)
{
    kvt__seg_t *g;

    if (e == NULL || info_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    g = kvt__seg_get(e, segment);
    if (g == NULL)
        return KVT_ERR_NOT_FOUND;
    memset(info_p, 0, sizeof(*info_p));
    pthread_mutex_lock(&g->desc_lock);
    info_p->offered = g->desc.transports;
    info_p->nregions = g->desc.nregions;
    info_p->same_host = g->desc.host_id == e->cfg.host_id && g->desc.pid != 0;
    pthread_mutex_unlock(&g->desc_lock);
    kvt__seg_unref(g);
    return KVT_OK;
}

kvt_status_t kvt_segment_transport(kvt_engine_h e, kvt_segment_t segment,
                                   kvt_mem_kind_t local, kvt_mem_kind_t remote,
                                   const char **name_p)
{
    kvt__seg_t *g;
    kvt_status_t st = KVT_OK;

    if (e == NULL || name_p == NULL || (unsigned)local >= KVT_MEM_KINDS ||
        (unsigned)remote >= KVT_MEM_KINDS)
        return KVT_ERR_INVALID_PARAM;
    g = kvt__seg_get(e, segment);
    if (g == NULL)
        return KVT_ERR_NOT_FOUND;
    /* Device memory here through a transport that needs this process's
     * driver (chosen before it was asked: a pair not in use yet) is not
     * served where the driver is unusable. */
    if (g->route[local][remote] != NULL &&
        !(local != KVT_MEM_HOST &&
          (g->route[local][remote]->tl->ops->caps.flags & KVT__TL_DEV_DRIVER) &&
          !kvt__dev_usable()))
        *name_p = g->route[local][remote]->ops->name;
    else
        st = KVT_ERR_NOT_SUPPORTED;
    kvt__seg_unref(g);
    return st;
}

kvt_status_t kvt_segment_transport_reason(kvt_engine_h e, kvt_segment_t segment,
                                          kvt_mem_kind_t local,
                                          kvt_mem_kind_t remote, char *buf,
                                          size_t cap)
{
    kvt__seg_t *g;

    if (e == NULL || buf == NULL || cap == 0 ||
        (unsigned)local >= KVT_MEM_KINDS || (unsigned)remote >= KVT_MEM_KINDS)
        return KVT_ERR_INVALID_PARAM;
    g = kvt__seg_get(e, segment);
    if (g == NULL)
        return KVT_ERR_NOT_FOUND;
    if (local != KVT_MEM_HOST && g->route[local][remote] != NULL &&
        (g->route[local][remote]->tl->ops->caps.flags & KVT__TL_DEV_DRIVER) &&
        !kvt__dev_usable())
        snprintf(buf, cap, "none (%s: no device driver here: %s)",
                 g->route[local][remote]->ops->name, kvt__dev_why());
    else
        snprintf(buf, cap, "%s", g->why[local][remote]);
    kvt__seg_unref(g);
    return KVT_OK;
}
