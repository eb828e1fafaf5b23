/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_BOOTSTRAP_H
#define KVT_META_BOOTSTRAP_H

/*
 * PD bootstrap entries, in the manner of SGLang's bootstrap server: each
 * prefill rank registers its role, parallel sizes, rank, and the host and
 * port of its engine; decode ranks look one rank up, or the sizes, or the
 * whole topology. docs/metadata.md describes the routes.
 *
 * kvt__boot_parse() is the pure, fuzzable validator of a registration
 * body; the table below is what `kvt metad` keeps of them.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

#include "meta/meta.h"

#define KVT_BOOT_MAX_RANKS 4096u
#define KVT_BOOT_ROLE_MAX 31u

/* One registration (the body of PUT /route). */
typedef struct {
    char role[KVT_BOOT_ROLE_MAX + 1]; /* "Prefill", "Decode", ... */
    uint32_t tp_size;                 /* ranks in all: tp_size or world_size */
    uint32_t dp_size;     /* data-parallel groups, divides tp_size */
    uint32_t engine_rank; /* 0..tp_size-1 */
    char rank_ip[KVT_META_HOST_MAX + 1];
    uint16_t rank_port;
} kvt__boot_rank_t;

/*
 * Validate a registration body: a JSON object with "role" (string of
 * 1..31 bytes), "tp_size" or "world_size" (1..4096), "dp_size" (1..tp_size,
 * dividing it), "engine_rank" (0..tp_size-1), "rank_ip" (1..255 bytes, no
 * spaces or control characters) and "rank_port" (1..65535); integers may
 * also be given as decimal strings, as SGLang's int() accepts. Other fields
 * are ignored. Pure, no logging.
 *
 * Returns KVT_OK with @r filled, or KVT_ERR_PROTOCOL (not a JSON object)
 * or KVT_ERR_INVALID_PARAM (a field missing, mistyped or out of range),
 * with *why_p set to a static sentence naming the fault.
 */
kvt_status_t kvt__boot_parse(const char *body, size_t len, kvt__boot_rank_t *r,
                             const char **why_p);

/*
 * The bootstrap client's decoding of GET /route answers (untrusted), pure
 * and without logging. The sizes answer {"prefill_tp_size",
 * "prefill_dp_size"}: both in 1..2^20 and dp dividing tp. A rank's answer
 * {"rank_ip", "rank_port"}: @name gets "ip:port" ("[ip]:port" for IPv6),
 * the ip 1..255 bytes without spaces or control characters, the port in
 * 1..65535. Integers may be JSON integers or decimal strings. KVT_OK, or
 * KVT_ERR_PROTOCOL with *why_p a static sentence.
 */
kvt_status_t kvt__boot_sizes_parse(const char *body, size_t len, uint32_t *tp_p,
                                   uint32_t *dp_p, const char **why_p);
kvt_status_t kvt__boot_route_parse(const char *body, size_t len, char *name,
                                   size_t cap, const char **why_p);

/* The data-parallel group of a validated registration, and its rank in
 * that group (what SGLang's GET /route calls engine_rank). */
static inline uint32_t kvt__boot_dp_group(const kvt__boot_rank_t *r)
{
    return r->engine_rank / (r->tp_size / r->dp_size);
}

static inline uint32_t kvt__boot_tp_rank(const kvt__boot_rank_t *r)
{
    return r->engine_rank % (r->tp_size / r->dp_size);
}

/* ---- The table kept by `kvt metad` (metad_boot.c) ---------------------- */

typedef struct kvt__boot_table kvt__boot_table_t;

kvt_status_t kvt__boot_table_create(kvt__boot_table_t **t_p);
void kvt__boot_table_destroy(kvt__boot_table_t *t);

/*
 * Register @r (replacing the same dp group and rank), expiring at
 * @expires_ms (0: never). The first live registration fixes tp_size and
 * dp_size until the table is empty again. Returns an HTTP status: 200,
 * 409 (sizes differ from the registered ones), 507 (table full), 500 (no
 * memory); nothing changes unless 200.
 */
int kvt__boot_table_put(kvt__boot_table_t *t, const kvt__boot_rank_t *r,
                        uint64_t expires_ms, uint64_t now_ms);

/*
 * Answer GET /route?engine_rank=R&target_dp_group=G: for R = G = -1 the
 * sizes {"prefill_tp_size","prefill_dp_size"}, otherwise the entry
 * {"rank_ip","rank_port"}. On 200 *json_p is malloc'd; 404 when nothing
 * matches, 400 for other negative values, 500 for no memory.
 */
int kvt__boot_table_get(kvt__boot_table_t *t, int64_t rank, int64_t dp_group,
                        uint64_t now_ms, char **json_p, size_t *len_p);

/* Remove one entry: 200 or 404 (400 for negative values). */
int kvt__boot_table_del(kvt__boot_table_t *t, int64_t rank, int64_t dp_group,
                        uint64_t now_ms);

/* GET /topology: {"prefill_tp_size", "prefill_dp_size", "ranks": [...]}
 * with every live entry sorted by dp group and rank; 200 or 500. */
int kvt__boot_table_topology(kvt__boot_table_t *t, uint64_t now_ms,
                             char **json_p, size_t *len_p);

/* Drop expired entries; returns how many. */
size_t kvt__boot_table_purge(kvt__boot_table_t *t, uint64_t now_ms);
size_t kvt__boot_table_count(kvt__boot_table_t *t);

#endif
