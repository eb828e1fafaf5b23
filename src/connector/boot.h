/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CONNECTOR_BOOT_H
#define KVT_CONNECTOR_BOOT_H

/*
 * The connector's client of the bootstrap routes (docs/metadata.md):
 * prefill ranks register with PUT /route and withdraw with DELETE /route;
 * decode ranks read the prefill sizes and the rank addresses with GET
 * /route. One client per thread (it keeps a libcurl handle and its
 * connection). Every call is bounded by @timeout_ms and returns a
 * sentence in @why on failure.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

typedef struct kvt__bootc kvt__bootc_t;

/* KVT_OK, KVT_ERR_NOT_SUPPORTED (built without libcurl or json-c),
 * KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__bootc_create(kvt__bootc_t **c_p);
void kvt__bootc_destroy(kvt__bootc_t *c);

/* Register a prefill rank: engine rank @engine_rank of @tp_total ranks in
 * @dp_size groups, reachable at @ip:@port; @ttl_s 0 means no expiry. */
kvt_status_t kvt__bootc_register(kvt__bootc_t *c, const char *server,
                                 const char *ip, uint16_t port,
                                 uint32_t tp_total, uint32_t dp_size,
                                 uint32_t engine_rank, uint32_t ttl_s,
                                 uint64_t timeout_ms, char *why, size_t wl);

/* Withdraw rank @rank of group @group (best effort). */
kvt_status_t kvt__bootc_unregister(kvt__bootc_t *c, const char *server,
                                   uint32_t rank, uint32_t group,
                                   uint64_t timeout_ms);

/* The prefill instance's total tp size and dp size. KVT_ERR_NOT_FOUND
 * when no prefill rank is registered yet. */
kvt_status_t kvt__bootc_sizes(kvt__bootc_t *c, const char *server,
                              uint32_t *tp_total_p, uint32_t *dp_p,
                              uint64_t timeout_ms, char *why, size_t wl);

/* The address of rank @rank of group @group, as "ip:port" in @name
 * (@cap bytes). KVT_ERR_NOT_FOUND when it is not registered (yet). */
kvt_status_t kvt__bootc_route(kvt__bootc_t *c, const char *server,
                              uint32_t rank, uint32_t group, char *name,
                              size_t cap, uint64_t timeout_ms, char *why,
                              size_t wl);

#endif
