/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_PROTO_SEGDESC_H
#define KVT_PROTO_SEGDESC_H

/*
 * The segment descriptor: what a peer needs to address an engine, as the
 * control plane sends it (docs/protocol.md, "Segment descriptor"). The
 * encoding is a list of versioned sections: the common part, the
 * regions, one section per transport the engine offers, and per
 * transport the packed remote keys of the regions that have one. A
 * decoder skips the sections it does not know, so that newer engines stay
 * readable. The codec is pure (no I/O) and fuzzed.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/engine.h>
#include <kvt/status.h>

#define KVT_SEGDESC_FORMAT 2
/* Regions one descriptor may hold: more than a paged KV cache registers
 * (65,536 blocks), and within the control plane's payload limit. */
#define KVT_SEGDESC_MAX_REGIONS (1u << 20)
#define KVT_SEGDESC_MAX_TL 16 /* transport sections */
#define KVT_SEGDESC_KEY_MAX 4096
#define KVT_SEGDESC_TL_NAME_MAX 15
#define KVT_SEGDESC_STR_MAX 127

/* Section types. */
enum {
    KVT__SD_COMMON = 1,
    KVT__SD_REGIONS = 2,
    KVT__SD_TRANSPORT = 3,
    KVT__SD_KEYS = 4,
};

/* A region's packed remote key for one transport. */
typedef struct {
    uint32_t region; /* index into the descriptor's regions */
    uint32_t len;
    const uint8_t *data; /* inside the owning transport section's blob */
} kvt__segdesc_key_t;

/* One transport's part: its section (opaque to the core) and its keys,
 * sorted by region. */
typedef struct {
    uint32_t id;      /* its KVT_TRANSPORT_* bit */
    uint16_t version; /* of the transport's own section format */
    char name[KVT_SEGDESC_TL_NAME_MAX + 1];
    uint32_t len;
    uint8_t *body; /* owned; NULL when len is 0 */
    uint32_t nkeys;
    kvt__segdesc_key_t *keys; /* owned */
    uint8_t *keyblob;         /* owned: what keys[].data point into */
} kvt__segdesc_tl_t;

typedef struct {
    char name[KVT_SEGDESC_STR_MAX + 1];
    char host[KVT_SEGDESC_STR_MAX + 1];
    uint16_t port;    /* the control plane's listener */
    uint64_t host_id; /* boot id and pid namespace, hashed */
    uint32_t pid;
    uint32_t transports; /* the ids of tl[], as a bit set */
    uint32_t nregions;
    kvt_remote_region_t *regions; /* owned */
    uint32_t ntl;
    kvt__segdesc_tl_t tl[KVT_SEGDESC_MAX_TL];
} kvt__segdesc_t;

/* Encode into a malloc'd buffer (*buf_p, *len_p). KVT_ERR_OVERFLOW past
 * the limits above, KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__segdesc_encode(const kvt__segdesc_t *d, uint8_t **buf_p,
                                 size_t *len_p);

/*
 * Decode and check (the trust boundary for what a peer sends): every
 * length within the buffer, the common section exactly once, strings
 * without NUL and within their limit, regions non-empty and not wrapping,
 * transports distinct, keys for a listed transport, for an existing
 * region, in increasing region order, at most KVT_SEGDESC_KEY_MAX bytes.
 * Sections of unknown type are skipped. On success @d owns its arrays
 * (kvt__segdesc_clear()); on failure it owns nothing. KVT_ERR_PROTOCOL,
 * KVT_ERR_VERSION (a format or a mandatory section of another version),
 * KVT_ERR_NO_MEMORY.
 */
kvt_status_t kvt__segdesc_decode(const uint8_t *buf, size_t len,
                                 kvt__segdesc_t *d);

/* Free what @d owns and empty it (its common part stays). */
void kvt__segdesc_clear(kvt__segdesc_t *d);

/* Move everything @src owns to @dst (whose own arrays are freed first);
 * @src is left empty. */
void kvt__segdesc_move(kvt__segdesc_t *dst, kvt__segdesc_t *src);

/* The section of transport @id, or NULL. */
const kvt__segdesc_tl_t *kvt__segdesc_tl(const kvt__segdesc_t *d, uint32_t id);

/* Add a transport section to @d (copying @body) before encoding.
 * KVT_ERR_OVERFLOW when full or @name is too long, KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__segdesc_add_tl(kvt__segdesc_t *d, uint32_t id,
                                 const char *name, uint16_t version,
                                 const void *body, uint32_t len);

/* The key of region @region in @tl, or NULL (*len_p set when found). */
const uint8_t *kvt__segdesc_key(const kvt__segdesc_tl_t *tl, uint32_t region,
                                uint32_t *len_p);

#endif
