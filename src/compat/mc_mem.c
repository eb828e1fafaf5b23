/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Local memory of Mooncake's C API: registration with Mooncake's
 * location strings ("cpu:0", "cuda:1", "*") mapped onto kvt's memory
 * kinds, and kvt's statuses onto Mooncake's error codes.
 */
#include "mc_int.h"

#include <stdlib.h>
#include <string.h>

/* @location -> kvt's kind and device. "cuda:N" is device memory of
 * device N; "cpu", "cpu:N" host memory; anything else (NULL, "*", a
 * name kvt does not know) is told from the memory itself. */
static void location_params(const char *location, int remote_accessible,
                            kvt_mem_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->field_mask = KVT_MEM_PARAM_ACCESS;
    p->access = remote_accessible ? KVT_ACCESS_REMOTE_RW : 0;
    if (location == NULL)
        return;
    if (strncmp(location, "cuda", 4) == 0) {
        p->field_mask |= KVT_MEM_PARAM_KIND | KVT_MEM_PARAM_DEVICE;
        p->kind = KVT_MEM_CUDA;
        p->device = location[4] == ':' ? atoi(location + 5) : 0;
    } else if (strncmp(location, "cpu", 3) == 0) {
        p->field_mask |= KVT_MEM_PARAM_KIND;
        p->kind = KVT_MEM_HOST;
    }
}

/* Registration's statuses: kvt's NOT_SUPPORTED is memory of a kind this
 * build or machine has no domain for (Mooncake: no such device), IO a
 * transport that could not register it. */
static int reg_err(kvt_status_t st)
{
    if (st == KVT_ERR_NOT_SUPPORTED)
        return MC_ERR_DEVICE_NOT_FOUND;
    if (st == KVT_ERR_IO)
        return MC_ERR_CONTEXT;
    return kvtmc__err(st);
}

static int unreg_err(kvt_status_t st)
{
    return st == KVT_ERR_NOT_FOUND ? MC_ERR_ADDRESS_NOT_REGISTERED
                                   : kvtmc__err(st);
}

KVTMC_API int registerLocalMemory(transfer_engine_t engine, void *addr,
                                  size_t length, const char *location,
                                  int remote_accessible)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "registerLocalMemory");
    kvt_mem_params_t p;
    kvt_status_t st;

    if (e == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    location_params(location, remote_accessible, &p);
    st = kvt_mem_register_ex(e->kvt, addr, length, &p);
    if (st != KVT_OK)
        KVTMC__LOG_E("registerLocalMemory(%p, %zu, %s): %s (%s)", addr, length,
                     location ? location : "*", kvt_status_name(st),
                     kvt_status_str(st));
    return reg_err(st);
}

KVTMC_API int unregisterLocalMemory(transfer_engine_t engine, void *addr)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "unregisterLocalMemory");

    if (e == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    return unreg_err(kvt_mem_unregister(e->kvt, addr));
}

KVTMC_API int registerLocalMemoryBatch(transfer_engine_t engine,
                                       buffer_entry_t *buffer_list,
                                       size_t buffer_len, const char *location)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "registerLocalMemoryBatch");
    kvt_mem_region_t *r;
    kvt_mem_params_t p;
    kvt_status_t st;

    if (e == NULL || (buffer_list == NULL && buffer_len > 0))
        return MC_ERR_INVALID_ARGUMENT;
    if (buffer_len == 0)
        return 0;
    r = calloc(buffer_len, sizeof(*r));
    if (r == NULL)
        return MC_ERR_MEMORY;
    location_params(location, 1, &p);
    for (size_t i = 0; i < buffer_len; i++) {
        r[i].addr = buffer_list[i].addr;
        r[i].length = buffer_list[i].length;
        r[i].access = p.access;
        r[i].kind = (p.field_mask & KVT_MEM_PARAM_KIND) ? p.kind : KVT_MEM_AUTO;
        r[i].device = p.device;
    }
    st = kvt_mem_register_batch(e->kvt, r, buffer_len);
    free(r);
    if (st != KVT_OK)
        KVTMC__LOG_E("registerLocalMemoryBatch(%zu regions, %s): %s (%s)",
                     buffer_len, location ? location : "*", kvt_status_name(st),
                     kvt_status_str(st));
    return reg_err(st);
}

KVTMC_API int unregisterLocalMemoryBatch(transfer_engine_t engine,
                                         void **addr_list, size_t addr_len)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "unregisterLocalMemoryBatch");

    if (e == NULL || (addr_list == NULL && addr_len > 0))
        return MC_ERR_INVALID_ARGUMENT;
    return unreg_err(kvt_mem_unregister_batch(e->kvt, addr_list, addr_len));
}
