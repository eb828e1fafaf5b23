/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory allocated through kvt: memfd-backed shared mappings, so that a
 * same-host peer can map the very pages (the fd travels over a Unix
 * socket) instead of copying through the kernel. The memfd is sealed
 * against shrinking and growing, so that no peer holding it can truncate
 * the pages under this process (which would turn its accesses into
 * SIGBUS).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "mem/md.h"
#include "util/log.h"

#define HUGE_2M (2ull << 20)
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static kvt_status_t map_memfd(size_t length, kvt__alloc_t *a)
{
    size_t len;
    int fd;

    /* Huge pages first, for large allocations when the pool has them. */
    if (length >= HUGE_2M) {
        len = (length + HUGE_2M - 1) & ~(HUGE_2M - 1);
        fd = memfd_create("kvt", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING);
        if (fd >= 0) {
            if (ftruncate(fd, (off_t)len) == 0 &&
                fcntl(fd, F_ADD_SEALS, SEALS) == 0) {
                void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_POPULATE, fd, 0);
                if (p != MAP_FAILED) {
                    a->addr = p;
                    a->length = len;
                    a->fd = fd;
                    return KVT_OK;
                }
            }
            close(fd);
        }
    }
    len = (length + 4095) & ~(size_t)4095;
    fd = memfd_create("kvt", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        KVT_LOG_E("memfd_create: %s", strerror(errno));
        return KVT_ERR_NO_MEMORY;
    }
    if (ftruncate(fd, (off_t)len) != 0 || fcntl(fd, F_ADD_SEALS, SEALS) != 0) {
        KVT_LOG_E("cannot size a %zu-byte memfd: %s", len, strerror(errno));
        close(fd);
        return KVT_ERR_NO_MEMORY;
    }
    a->addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a->addr == MAP_FAILED) {
        KVT_LOG_E("cannot map a %zu-byte memfd: %s", len, strerror(errno));
        close(fd);
        return KVT_ERR_NO_MEMORY;
    }
    madvise(a->addr, len, MADV_HUGEPAGE);
    a->length = len;
    a->fd = fd;
    return KVT_OK;
}

/*
 * The allocation is listed (with a fresh id) before it is registered, so
 * that the registry change a registration announces to same-host peers
 * already knows the region can be mapped; a failed registration unlists
 * it again. A peer that mapped it meanwhile holds pages that were never
 * registered, which it cannot write: every copy is checked against the
 * registry.
 */
/* Device memory from its domain, registered, listed (not shared as a
 * memfd: same-host peers do not map it). */
static kvt_status_t alloc_device(kvt_engine_h e, size_t length,
                                 const kvt_mem_params_t *p, void **addr_p)
{
    const kvt__md_ops_t *md = kvt__md_of(p->kind);
    kvt_mem_params_t rp = *p;
    kvt__alloc_t *a, **pp;
    kvt_status_t st;

    if (md == NULL || md->alloc == NULL) {
        KVT_LOG_E("alloc: this build cannot allocate memory of kind %d",
                  (int)p->kind);
        return KVT_ERR_NOT_SUPPORTED;
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVT_ERR_NO_MEMORY;
    st = md->alloc(length, p->device, &a->addr);
    if (st != KVT_OK) {
        free(a);
        return st;
    }
    a->length = length;
    a->fd = -1;
    a->kind = (uint8_t)p->kind;
    a->device = (int16_t)p->device;
    rp.field_mask |= KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
    st = kvt_mem_register_ex(e, a->addr, length, &rp);
    if (st != KVT_OK) {
        md->free(a->addr, length, p->device);
        free(a);
        return st;
    }
    pthread_mutex_lock(&e->alloc_lock);
    if (++e->alloc_last_id == 0)
        ++e->alloc_last_id;
    a->id = e->alloc_last_id;
    pp = &e->allocs;
    a->next = *pp;
    *pp = a;
    pthread_mutex_unlock(&e->alloc_lock);
    *addr_p = a->addr;
    return KVT_OK;
}

/* Give an allocation's memory back (it is unlisted and unregistered). */
static void alloc_release(kvt__alloc_t *a)
{
    if (a->kind != KVT_MEM_HOST) {
        const kvt__md_ops_t *md = kvt__md_of((kvt_mem_kind_t)a->kind);
        if (md != NULL && md->free != NULL)
            md->free(a->addr, a->length, a->device);
    } else {
        munmap(a->addr, a->length);
        close(a->fd);
    }
    free(a);
}

kvt_status_t kvt_mem_alloc_ex(kvt_engine_h e, size_t length,
                              const kvt_mem_params_t *params, void **addr_p)
{
    kvt_mem_params_t p = {0};
    uint64_t m = params != NULL ? params->field_mask : 0;

    if (e == NULL || addr_p == NULL || length == 0 ||
        (m & ~(uint64_t)(KVT_MEM_PARAM_ACCESS | KVT_MEM_PARAM_KIND |
                         KVT_MEM_PARAM_DEVICE)) != 0)
        return KVT_ERR_INVALID_PARAM;
    p.field_mask = m;
    p.access =
        (m & KVT_MEM_PARAM_ACCESS) ? params->access : KVT_ACCESS_REMOTE_RW;
    p.kind = (m & KVT_MEM_PARAM_KIND) ? params->kind : KVT_MEM_HOST;
    p.device = (m & KVT_MEM_PARAM_DEVICE) ? params->device : 0;
    if (p.kind == KVT_MEM_HOST)
        return kvt_mem_alloc(e, length, p.access, addr_p);
    if (p.kind == KVT_MEM_AUTO || p.kind >= KVT_MEM_KINDS)
        return KVT_ERR_INVALID_PARAM;
    p.field_mask |= KVT_MEM_PARAM_ACCESS;
    return alloc_device(e, length, &p, addr_p);
}

kvt_status_t kvt_mem_alloc(kvt_engine_h e, size_t length, uint32_t access,
                           void **addr_p)
{
    kvt__alloc_t *a, **pp;
    kvt_status_t st;

    if (e == NULL || addr_p == NULL || length == 0)
        return KVT_ERR_INVALID_PARAM;
    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVT_ERR_NO_MEMORY;
    st = map_memfd(length, a);
    if (st != KVT_OK)
        goto err_free;
    pthread_mutex_lock(&e->alloc_lock);
    if (++e->alloc_last_id == 0)
        ++e->alloc_last_id;
    a->id = e->alloc_last_id;
    a->next = e->allocs;
    e->allocs = a;
    pthread_mutex_unlock(&e->alloc_lock);
    st = kvt_mem_register(e, a->addr, a->length, access);
    if (st != KVT_OK)
        goto err_unlist;
    *addr_p = a->addr;
    return KVT_OK;

err_unlist:
    pthread_mutex_lock(&e->alloc_lock);
    for (pp = &e->allocs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&e->alloc_lock);
    munmap(a->addr, a->length);
    close(a->fd);
err_free:
    free(a);
    return st;
}

kvt_status_t kvt_mem_free(kvt_engine_h e, void *addr)
{
    kvt__alloc_t **pp, *a = NULL;

    if (e == NULL || addr == NULL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&e->alloc_lock);
    for (pp = &e->allocs; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->addr == addr) {
            a = *pp;
            *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&e->alloc_lock);
    if (a == NULL)
        return KVT_ERR_NOT_FOUND;
    kvt_mem_unregister(e, a->addr);
    alloc_release(a);
    return KVT_OK;
}

void kvt__alloc_free_all(kvt_engine_h e)
{
    kvt__alloc_t *a = e->allocs, *n;
    for (; a != NULL; a = n) {
        n = a->next;
        alloc_release(a);
    }
    e->allocs = NULL;
}

kvt_status_t kvt__alloc_list(kvt_engine_h e, kvt__alloc_ref_t **refs_p,
                             size_t *n_p)
{
    kvt__alloc_ref_t *v = NULL;
    size_t n = 0, k = 0;

    pthread_mutex_lock(&e->alloc_lock);
    for (kvt__alloc_t *a = e->allocs; a != NULL; a = a->next)
        n += a->kind == KVT_MEM_HOST;
    if (n > 0) {
        v = malloc(n * sizeof(*v));
        if (v == NULL) {
            pthread_mutex_unlock(&e->alloc_lock);
            return KVT_ERR_NO_MEMORY;
        }
    }
    for (kvt__alloc_t *a = e->allocs; a != NULL; a = a->next)
        if (a->kind == KVT_MEM_HOST)
            v[k++] = (kvt__alloc_ref_t){(uint64_t)(uintptr_t)a->addr, a->length,
                                        a->id};
    pthread_mutex_unlock(&e->alloc_lock);
    *refs_p = v;
    *n_p = n;
    return KVT_OK;
}

/* Lock order: the registry's read lock, then alloc_lock (as every path
 * that takes both). */
kvt_status_t kvt__alloc_export(kvt_engine_h e, uint32_t id, int *fd_p,
                               uint64_t *addr_p, uint64_t *length_p)
{
    kvt_status_t st = KVT_ERR_NOT_FOUND;

    kvt__memreg_rdlock(&e->reg);
    pthread_mutex_lock(&e->alloc_lock);
    for (kvt__alloc_t *a = e->allocs; a != NULL; a = a->next) {
        uint64_t start = (uint64_t)(uintptr_t)a->addr;
        int fd;
        if (a->id != id || a->kind != KVT_MEM_HOST)
            continue;
        if (!kvt__memreg_overlaps_locked(&e->reg, start, start + a->length))
            break;
        fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            st = KVT_ERR_IO;
            break;
        }
        *fd_p = fd;
        *addr_p = start;
        *length_p = a->length;
        st = KVT_OK;
        break;
    }
    pthread_mutex_unlock(&e->alloc_lock);
    kvt__memreg_unlock(&e->reg);
    return st;
}
