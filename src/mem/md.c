/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory domains built in (md.h). The build writes md_list.h, one
 * KVT__MD(name) line per domain added with kvt_add_memory_domain().
 */
#include "mem/md.h"

#include <string.h>

#include "util/log.h"

#define KVT__MD(n) extern const kvt__md_ops_t kvt__md_##n;
#include "md_list.h"
#undef KVT__MD

static const kvt__md_ops_t *const registered[] = {
#define KVT__MD(n) &kvt__md_##n,
#include "md_list.h"
#undef KVT__MD
    NULL};

const kvt__md_ops_t *kvt__md_registered(size_t i)
{
    return i < sizeof(registered) / sizeof(registered[0]) ? registered[i]
                                                          : NULL;
}

const kvt__md_ops_t *kvt__md_of(kvt_mem_kind_t kind)
{
    for (size_t i = 0; registered[i] != NULL; i++)
        if (registered[i]->kind == kind)
            return registered[i];
    return NULL;
}

kvt_status_t kvt__md_resolve(const void *addr, size_t len, kvt_mem_kind_t kind,
                             int32_t device, kvt_mem_kind_t *kind_p,
                             int32_t *device_p)
{
    const kvt__md_ops_t *md;
    kvt_status_t st;

    if (kind == KVT_MEM_AUTO) {
        /* Every domain that can tell its own memory, device domains
         * first: a driver answers in microseconds what it knows (and a
         * device domain answers nothing, at no cost, in a process its
         * driver was never loaded in), where telling host memory reads
         * the process's map, milliseconds with thousands of mappings,
         * for every range it has not seen. Host memory last; what none
         * claims is checked as host memory, which says why it is
         * refused. */
        for (int host = 0; host < 2; host++) {
            for (size_t i = 0; registered[i] != NULL; i++) {
                int32_t dev = -1;
                int c;
                md = registered[i];
                if ((md->kind == KVT_MEM_HOST) != host || md->detect == NULL)
                    continue;
                c = md->detect(addr, len, &dev);
                if (c < 0)
                    return KVT_ERR_NOT_SUPPORTED;
                if (c > 0) {
                    *kind_p = md->kind;
                    *device_p = dev;
                    return KVT_OK;
                }
            }
        }
        kind = KVT_MEM_HOST;
        device = -1;
    }
    md = kvt__md_of(kind);
    if (md == NULL) {
        KVT_LOG_W("register: memory kind %d is not supported by this build",
                  (int)kind);
        return KVT_ERR_NOT_SUPPORTED;
    }
    st = md->check != NULL ? md->check(addr, len, device) : KVT_OK;
    if (st != KVT_OK)
        return st;
    *kind_p = kind;
    *device_p = kind == KVT_MEM_HOST ? -1 : device;
    return KVT_OK;
}

kvt_status_t kvt_mem_copy(void *dst, const void *src, size_t len)
{
    if (len == 0)
        return KVT_OK;
    if (dst == NULL || src == NULL)
        return KVT_ERR_INVALID_PARAM;
    for (size_t i = 0; registered[i] != NULL; i++) {
        int c = registered[i]->copy != NULL ? registered[i]->copy(dst, src, len)
                                            : 0;
        if (c != 0)
            return c > 0 ? KVT_OK : KVT_ERR_IO;
    }
    memcpy(dst, src, len);
    return KVT_OK;
}

kvt_status_t kvt_mem_domains(kvt_mem_domain_info_t *out, size_t max,
                             size_t *count_p)
{
    size_t n = 0;

    if (count_p == NULL || (out == NULL && max > 0))
        return KVT_ERR_INVALID_PARAM;
    for (size_t i = 0; registered[i] != NULL; i++, n++) {
        const kvt__md_ops_t *md = registered[i];
        kvt_mem_domain_info_t *d;
        if (n >= max)
            continue;
        d = &out[n];
        memset(d, 0, sizeof(*d));
        d->name = md->name;
        d->kind = md->kind;
        if (md->query != NULL) {
            d->available = md->query(&d->devices, &d->detail);
        } else {
            d->available = 1;
            d->detail = "";
        }
    }
    *count_p = n;
    return KVT_OK;
}
