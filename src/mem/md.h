/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_MEM_MD_H
#define KVT_MEM_MD_H

/*
 * Memory domains: the kinds of memory an engine can register (host memory
 * now; device memory of an accelerator next), each one static table
 * registered with KVT_MEM_DOMAIN_REGISTER() and listed by the build
 * (kvt_add_memory_domain() in src/CMakeLists.txt), as transports are.
 *
 * A domain answers two questions about a range at registration: whether
 * the range is its memory (detect(), for a caller that does not say; the
 * device domains answer first, each only once its driver is in the
 * process, then the host domain claims what the process can read), and
 * whether a
 * range the caller says is its memory really is (check()). The transports
 * that move a kind say so in their capabilities (core/tl.h); the
 * registry records each region's kind and device.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/kvt.h> /* IWYU pragma: keep */

typedef struct {
    const char *name; /* "host", "cuda" */
    kvt_mem_kind_t kind;
    /* Whether [addr, +len) is this domain's memory: 1, with *device_p its
     * device; 0 when not; -1 when it is but cannot be registered (it runs
     * past its allocation, say: logged here). */
    int (*detect)(const void *addr, size_t len, int32_t *device_p);
    /* Whether [addr, +len) on @device may be registered as this kind:
     * KVT_OK, or why not (logged here). */
    kvt_status_t (*check)(const void *addr, size_t len, int32_t device);
    /* Whether the domain can serve memory now (a driver and devices
     * found): 1 or 0, with the number of devices (0 for host memory) and
     * a line for people (static storage). NULL: always, no devices. */
    int (*query)(int32_t *devices_p, const char **detail_p);
    /* Allocate @len bytes of this kind on @device (kvt_mem_alloc_ex()),
     * and free them. NULL: the domain does not allocate. */
    kvt_status_t (*alloc)(size_t len, int32_t device, void **addr_p);
    void (*free)(void *addr, size_t len, int32_t device);
    /* Copy @len bytes when either side is this domain's memory, and wait:
     * 1 (done), 0 (neither is: not this domain's), -1 (failed, logged). */
    int (*copy)(void *dst, const void *src, size_t len);
} kvt__md_ops_t;

#define KVT_MEM_DOMAIN_REGISTER(short_name, ...)                               \
    __attribute__((visibility("hidden")))                                      \
    const kvt__md_ops_t kvt__md_##short_name = __VA_ARGS__

/* The domain of @kind, or NULL when none is built in. */
const kvt__md_ops_t *kvt__md_of(kvt_mem_kind_t kind);

/*
 * The kind and device of a range to register: stated by the caller
 * (@kind not KVT_MEM_AUTO: checked by its domain), or detected. Fails
 * with KVT_ERR_NOT_SUPPORTED for a kind no domain of this build serves,
 * or what the domain's check() says.
 */
kvt_status_t kvt__md_resolve(const void *addr, size_t len, kvt_mem_kind_t kind,
                             int32_t device, kvt_mem_kind_t *kind_p,
                             int32_t *device_p);

/* Whether [addr, +len) is mapped readable in this process from end to end
 * (host memory; mem/host.c). */
int kvt__host_readable(const void *addr, size_t len);

/* The domains built in; NULL past the last. */
const kvt__md_ops_t *kvt__md_registered(size_t i);

#endif
