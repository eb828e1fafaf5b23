/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transports built in. The build writes transport_list.h, one
 * KVT__TL(name) line per transport added with kvt_add_transport()
 * (src/CMakeLists.txt); each defines kvt__tl_<name> with
 * KVT_TRANSPORT_REGISTER(). Nothing else names a transport.
 */
#include <string.h>

#include "core/tl.h"
#include "util/log.h"

#define KVT__TL(n) extern const kvt__tl_ops_t kvt__tl_##n;
#include "transport_list.h"
#undef KVT__TL

static const kvt__tl_ops_t *const registered[] = {
#define KVT__TL(n) &kvt__tl_##n,
#include "transport_list.h"
#undef KVT__TL
    NULL};

const kvt__tl_ops_t *kvt__tl_registered(size_t i)
{
    return i < sizeof(registered) / sizeof(registered[0]) ? registered[i]
                                                          : NULL;
}

const kvt__tl_ops_t *kvt__tl_by_name(const char *name)
{
    for (size_t i = 0; registered[i] != NULL; i++)
        if (strcmp(registered[i]->name, name) == 0)
            return registered[i];
    return NULL;
}

const kvt__tl_ops_t *kvt__tl_by_id(uint32_t id)
{
    for (size_t i = 0; registered[i] != NULL; i++)
        if (registered[i]->id == id)
            return registered[i];
    return NULL;
}

int kvt__tl_ops_sound(const kvt__tl_ops_t *o)
{
    const char *missing = NULL;

    if (o->name == NULL || o->name[0] == '\0' ||
        strlen(o->name) > KVT_SEGDESC_TL_NAME_MAX)
        missing = "a name";
    else if (o->id == 0 || (o->id & (o->id - 1)) != 0)
        missing = "an id of one bit";
    else if (o->create == NULL || o->destroy == NULL)
        missing = "create() and destroy()";
    else if (o->open == NULL || o->submit == NULL || o->kill == NULL ||
             o->destroy_session == NULL)
        missing = "open(), submit(), kill() and destroy_session()";
    else if (o->caps.local_mem == 0 || o->caps.remote_mem == 0)
        missing = "the memory kinds it moves";
    if (missing != NULL)
        KVT_LOG_E("transport %s is not usable: it lacks %s",
                  o->name ? o->name : "(unnamed)", missing);
    return missing == NULL;
}

kvt_status_t kvt_transports(kvt_transport_info_t *out, size_t max,
                            size_t *count_p)
{
    size_t n = 0;

    if (count_p == NULL || (out == NULL && max > 0))
        return KVT_ERR_INVALID_PARAM;
    for (size_t i = 0; registered[i] != NULL; i++) {
        const kvt__tl_ops_t *o = registered[i];
        if (n < max) {
            kvt_transport_info_t *t = &out[n];
            memset(t, 0, sizeof(*t));
            t->name = o->name;
            t->id = o->id;
            t->flags =
                ((o->caps.flags & KVT__TL_SAME_HOST) ? KVT_TRANSPORT_F_SAME_HOST
                                                     : 0) |
                ((o->caps.flags & KVT__TL_STRIDED) ? KVT_TRANSPORT_F_STRIDED
                                                   : 0) |
                ((o->caps.flags & KVT__TL_EXPLICIT) ? KVT_TRANSPORT_F_EXPLICIT
                                                    : 0);
            t->local_mem = o->caps.local_mem;
            t->remote_mem = o->caps.remote_mem;
            t->priority = o->caps.priority;
        }
        n++;
    }
    *count_p = n;
    return KVT_OK;
}

/* The bits of a list of names: @table's names, NULL-ended, with their
 * bits; "all" (@all != 0) for @all. */
static kvt_status_t name_bits(const char *names, const char *const *table,
                              const uint32_t *bits, uint32_t all,
                              uint32_t *bits_p)
{
    uint32_t out = 0;
    const char *p = names;

    if (names == NULL || bits_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    while (*p != '\0') {
        size_t n = strcspn(p, ", ");
        size_t k = 0;
        if (n == 0) {
            p++;
            continue;
        }
        if (all != 0 && n == 3 && strncmp(p, "all", 3) == 0) {
            out |= all;
        } else {
            for (; table[k] != NULL; k++)
                if (strlen(table[k]) == n && strncmp(p, table[k], n) == 0)
                    break;
            if (table[k] == NULL)
                return KVT_ERR_INVALID_PARAM;
            out |= bits[k];
        }
        p += n;
    }
    if (out == 0)
        return KVT_ERR_INVALID_PARAM;
    *bits_p = out;
    return KVT_OK;
}

kvt_status_t kvt_transport_bits(const char *names, uint32_t *bits_p)
{
    static const char *const n[] = {"tcp", "shm", "ucx", NULL};
    static const uint32_t b[] = {KVT_TRANSPORT_TCP, KVT_TRANSPORT_SHM,
                                 KVT_TRANSPORT_UCX};

    return name_bits(names, n, b, KVT_TRANSPORT_ALL, bits_p);
}

kvt_status_t kvt_mem_kind_bits(const char *names, uint32_t *bits_p)
{
    static const char *const n[] = {"host", "cuda", NULL};
    static const uint32_t b[] = {1u << KVT_MEM_HOST, 1u << KVT_MEM_CUDA};

    return name_bits(names, n, b, 0, bits_p);
}
