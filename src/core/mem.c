/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Registering memory: the public calls over the registry (memreg.c), the
 * memory domains (mem/md.h) and the transports' registration hooks.
 *
 * Registration: each range gets its kind and device from its domain
 * (stated and checked, or detected), then every transport that moves that
 * kind registers it (mem_reg(): a handle, and a packed key for peers),
 * then the regions enter the registry all at once, then the transports
 * learn that the registry changed (same-host peers re-check against it)
 * and the metadata publisher is told. Any failure undoes everything done
 * for the call, so a batch is registered whole or not at all.
 *
 * Unregistration: the region leaves the registry first (new transfers are
 * refused), then the change is announced (no same-host copy validated
 * against the old registry runs any more when it returns), then the
 * transports drop their registrations.
 */
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "mem/md.h"
#include "util/log.h"

/* Drop what transports keep for @r. */
static void keys_drop(kvt_engine_h e, const kvt__region_t *r)
{
    if (r->keys == NULL)
        return;
    for (unsigned k = 0; k < e->ntl; k++) {
        kvt__tl_t *tl = e->tl[k];
        kvt__tl_key_t *key = &r->keys[k];
        if (key->memh != NULL || key->rkey != NULL) {
            if (tl->ops->mem_dereg != NULL)
                tl->ops->mem_dereg(tl, r, key);
            free(key->rkey);
        }
    }
    free(r->keys);
}

/* Have every transport that moves @r's kind register it. */
static kvt_status_t keys_take(kvt_engine_h e, kvt__region_t *r)
{
    for (unsigned k = 0; k < e->ntl; k++) {
        kvt__tl_t *tl = e->tl[k];
        kvt_status_t st;

        if (tl->ops->mem_reg == NULL ||
            (tl->local_mem & KVT__MEM_BIT(r->kind)) == 0)
            continue;
        if (r->keys == NULL) {
            r->keys = calloc(KVT__TL_MAX, sizeof(*r->keys));
            if (r->keys == NULL)
                return KVT_ERR_NO_MEMORY;
        }
        st = tl->ops->mem_reg(tl, r, &r->keys[k]);
        if (st != KVT_OK)
            return st;
    }
    return KVT_OK;
}

static void regions_changed(kvt_engine_h e)
{
    /* Peers that check against a copy of the registry (same-host ones)
     * see the new one from now on. */
    for (unsigned i = 0; i < e->ntl; i++)
        if (e->tl[i]->ops->mem_changed != NULL)
            e->tl[i]->ops->mem_changed(e->tl[i]);
    kvt__engine_publish_soon(e);
}

/* Register @n regions as the public calls describe them. */
static kvt_status_t register_regions(kvt_engine_h e, const kvt_mem_region_t *in,
                                     size_t n)
{
    kvt__region_t *tmp;
    kvt_status_t st = KVT_OK;
    size_t i;

    if (n == 0)
        return KVT_OK;
    if (in == NULL)
        return KVT_ERR_INVALID_PARAM;
    tmp = calloc(n, sizeof(*tmp));
    if (tmp == NULL)
        return KVT_ERR_NO_MEMORY;
    for (i = 0; i < n && st == KVT_OK; i++) {
        uint64_t a = (uint64_t)(uintptr_t)in[i].addr;
        kvt_mem_kind_t kind;
        int32_t dev;

        if (in[i].addr == NULL || in[i].length == 0 ||
            a > UINT64_MAX - in[i].length ||
            (in[i].access & ~(uint32_t)KVT_ACCESS_REMOTE_RW) != 0) {
            KVT_LOG_W("register: invalid region %p+%zu access %#x", in[i].addr,
                      in[i].length, in[i].access);
            st = KVT_ERR_INVALID_PARAM;
            break;
        }
        st = kvt__md_resolve(in[i].addr, in[i].length, in[i].kind, in[i].device,
                             &kind, &dev);
        if (st != KVT_OK)
            break;
        tmp[i] = (kvt__region_t){.start = a,
                                 .end = a + in[i].length,
                                 .access = in[i].access,
                                 .kind = (uint16_t)kind,
                                 .device = (int16_t)dev};
        st = keys_take(e, &tmp[i]);
    }
    if (st == KVT_OK)
        st = kvt__memreg_add(&e->reg, tmp, n);
    if (st != KVT_OK) {
        for (size_t j = 0; j < n; j++)
            keys_drop(e, &tmp[j]);
    } else {
        regions_changed(e);
    }
    free(tmp);
    return st;
}

kvt_status_t kvt_mem_register(kvt_engine_h e, void *addr, size_t length,
                              uint32_t access)
{
    kvt_mem_region_t r = {addr, length, access, KVT_MEM_AUTO, -1, 0};

    if (e == NULL)
        return KVT_ERR_INVALID_PARAM;
    return register_regions(e, &r, 1);
}

kvt_status_t kvt_mem_register_ex(kvt_engine_h e, void *addr, size_t length,
                                 const kvt_mem_params_t *params)
{
    kvt_mem_region_t r = {addr,         length, KVT_ACCESS_REMOTE_RW,
                          KVT_MEM_AUTO, -1,     0};
    uint64_t m = params != NULL ? params->field_mask : 0;

    if (e == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (m & ~(uint64_t)(KVT_MEM_PARAM_ACCESS | KVT_MEM_PARAM_KIND |
                        KVT_MEM_PARAM_DEVICE))
        return KVT_ERR_INVALID_PARAM;
    if (m & KVT_MEM_PARAM_ACCESS)
        r.access = params->access;
    if (m & KVT_MEM_PARAM_KIND)
        r.kind = params->kind;
    if (m & KVT_MEM_PARAM_DEVICE)
        r.device = params->device;
    return register_regions(e, &r, 1);
}

kvt_status_t kvt_mem_register_batch(kvt_engine_h e,
                                    const kvt_mem_region_t *regions,
                                    size_t count)
{
    if (e == NULL)
        return KVT_ERR_INVALID_PARAM;
    return register_regions(e, regions, count);
}

kvt_status_t kvt_mem_unregister(kvt_engine_h e, void *addr)
{
    kvt__region_t r;
    kvt_status_t st;

    if (e == NULL || addr == NULL)
        return KVT_ERR_INVALID_PARAM;
    st = kvt__memreg_remove(&e->reg, (uint64_t)(uintptr_t)addr, &r);
    if (st != KVT_OK)
        return st;
    regions_changed(e);
    keys_drop(e, &r);
    return KVT_OK;
}

kvt_status_t kvt_mem_unregister_batch(kvt_engine_h e, void *const *addrs,
                                      size_t count)
{
    kvt_status_t first = KVT_OK;

    if (e == NULL || (addrs == NULL && count > 0))
        return KVT_ERR_INVALID_PARAM;
    for (size_t i = 0; i < count; i++) {
        kvt_status_t st = kvt_mem_unregister(e, addrs[i]);
        if (st != KVT_OK && first == KVT_OK)
            first = st;
    }
    return first;
}

/*
 * This engine's regions and the transports' keys for them, into @d (whose
 * transport sections are there already): one read of the registry, so
 * that the key indices match the regions.
 */
kvt_status_t kvt__mem_describe(kvt_engine_h e, kvt__segdesc_t *d)
{
    kvt__memreg_t *reg = &e->reg;
    kvt_status_t st = KVT_OK;
    size_t n;

    kvt__memreg_rdlock(reg);
    n = kvt__memreg_count_locked(reg);
    if (n > KVT_SEGDESC_MAX_REGIONS) {
        st = KVT_ERR_OVERFLOW;
        goto out;
    }
    if (n > 0) {
        d->regions = calloc(n, sizeof(*d->regions));
        if (d->regions == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const kvt__region_t *r = kvt__memreg_at_locked(reg, i);
        d->regions[i] = (kvt_remote_region_t){
            r->start, r->end - r->start, r->access, r->kind, r->device, 0};
    }
    d->nregions = (uint32_t)n;
    for (unsigned k = 0; k < e->ntl && st == KVT_OK; k++) {
        kvt__segdesc_tl_t *tl = NULL;
        uint32_t nkeys = 0;
        size_t blob = 0;
        uint8_t *b;

        for (uint32_t t = 0; t < d->ntl; t++)
            if (d->tl[t].id == e->tl[k]->ops->id)
                tl = &d->tl[t];
        for (size_t i = 0; tl != NULL && i < n; i++) {
            const kvt__region_t *r = kvt__memreg_at_locked(reg, i);
            if (r->keys != NULL && r->keys[k].rkey_len > 0) {
                nkeys++;
                blob += r->keys[k].rkey_len;
            }
        }
        if (nkeys == 0)
            continue;
        tl->keys = calloc(nkeys, sizeof(*tl->keys));
        tl->keyblob = malloc(blob);
        if (tl->keys == NULL || tl->keyblob == NULL) {
            st = KVT_ERR_NO_MEMORY;
            break;
        }
        b = tl->keyblob;
        for (size_t i = 0; i < n; i++) {
            const kvt__region_t *r = kvt__memreg_at_locked(reg, i);
            if (r->keys == NULL || r->keys[k].rkey_len == 0)
                continue;
            memcpy(b, r->keys[k].rkey, r->keys[k].rkey_len);
            tl->keys[tl->nkeys++] =
                (kvt__segdesc_key_t){(uint32_t)i, r->keys[k].rkey_len, b};
            b += r->keys[k].rkey_len;
        }
    }
out:
    kvt__memreg_unlock(reg);
    return st;
}

void kvt__mem_release_all(kvt_engine_h e)
{
    kvt__memreg_t *reg = &e->reg;

    kvt__memreg_rdlock(reg);
    for (size_t i = 0; i < kvt__memreg_count_locked(reg); i++) {
        kvt__region_t *r = (kvt__region_t *)kvt__memreg_at_locked(reg, i);
        keys_drop(e, r);
        r->keys = NULL;
    }
    kvt__memreg_unlock(reg);
}
