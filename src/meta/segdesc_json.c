/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Segment descriptors as JSON documents (docs/metadata.md, "Segment
 * descriptor"): what an engine publishes in a metadata backend so that
 * peers can find its listener and its regions. Version 1:
 *
 *   {"kvt_segment": 1, "compat": "<16 hex digits>",
 *    "name": "10.0.0.1:15000", "host": "10.0.0.1",
 *    "ports": {"rpc": 15000}, "host_id": "<16 hex digits>", "pid": 4242,
 *    "transports": [{"name": "tcp", "port": 15000}, {"name": "shm"}],
 *    "regions": [{"addr": 140000000000, "length": 4096,
 *                 "access": ["write", "read"], "kind": "host",
 *                 (for device memory: "kind": "cuda", "device": 0)
 *                 "keys": {}}]}
 *
 * The decoder is the trust boundary for descriptors read from a shared
 * server: it checks every field and refuses the whole document on the
 * first fault.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvt/engine.h>

#include "proto/segdesc.h"
#include "proto/wire.h"
#include "meta/meta.h"
#include "util/hash.h"
#include "util/log.h"

uint64_t kvt__segdesc_compat_hash(void)
{
    char buf[128];
    const uint16_t probe = 1;
    int n = snprintf(
        buf, sizeof(buf), "kvt wire=%d segdesc-json=%d endian=%s ptr=%zu",
        KVT_WIRE_VERSION_MAJOR, KVT_SEGDESC_JSON_VERSION,
        *(const uint8_t *)&probe ? "little" : "big", sizeof(void *));

    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    return kvt__fnv1a(KVT_FNV1A_SEED, buf, (size_t)n);
}

#ifdef KVT_WITH_JSON
#include "meta/json_parse.h"

/*
 * Transports are named as the binary descriptor names them: the section's
 * own name (its transport's table), else, for a descriptor that has only
 * the bit (one decoded from JSON), the name the wire protocol gives that
 * id. A name the protocol does not know is ignored when decoding, so
 * that newer peers stay reachable over what both know.
 */
static const char *transport_name(const kvt__segdesc_t *d, uint32_t id)
{
    const kvt__segdesc_tl_t *tl = kvt__segdesc_tl(d, id);

    if (tl != NULL && tl->name[0] != '\0')
        return tl->name;
    return kvt__wire_tl_name(id);
}

static const char *const kind_names[] = {"host", "cuda"};

#define MAX_TRANSPORTS 32
#define MAX_KEY_LEN 4096

/* json-c's add functions fail only on allocation; one flag collects it. */
static void add(json_object *o, const char *k, json_object *v, int *oom)
{
    if (v == NULL || json_object_object_add(o, k, v) != 0) {
        json_object_put(v);
        *oom = 1;
    }
}

static void push(json_object *a, json_object *v, int *oom)
{
    if (v == NULL || json_object_array_add(a, v) != 0) {
        json_object_put(v);
        *oom = 1;
    }
}

static json_object *hex64(uint64_t v)
{
    char buf[17];
    snprintf(buf, sizeof(buf), "%016" PRIx64, v);
    return json_object_new_string(buf);
}

static json_object *region_json(const kvt_remote_region_t *r, int *oom)
{
    json_object *o = json_object_new_object(), *acc;

    if (o == NULL) {
        *oom = 1;
        return NULL;
    }
    add(o, "addr", json_object_new_uint64(r->addr), oom);
    add(o, "length", json_object_new_uint64(r->length), oom);
    acc = json_object_new_array();
    if (acc != NULL && (r->access & KVT_ACCESS_REMOTE_WRITE))
        push(acc, json_object_new_string("write"), oom);
    if (acc != NULL && (r->access & KVT_ACCESS_REMOTE_READ))
        push(acc, json_object_new_string("read"), oom);
    add(o, "access", acc, oom);
    add(o, "kind", json_object_new_string(kind_names[r->kind]), oom);
    if (r->kind != KVT_MEM_HOST)
        add(o, "device", json_object_new_int(r->device), oom);
    add(o, "keys", json_object_new_object(), oom);
    return o;
}

kvt_status_t kvt__segdesc_to_json(const kvt__segdesc_t *d, char **json_p,
                                  size_t *len_p)
{
    json_object *root, *ports, *tps, *regs;
    const char *s;
    size_t len;
    char *out;
    int oom = 0;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (d->name[0] == '\0' || d->host[0] == '\0' || d->port == 0 ||
        strnlen(d->name, sizeof(d->name)) == sizeof(d->name) ||
        strnlen(d->host, sizeof(d->host)) == sizeof(d->host)) {
        KVT_LOG_E("segment descriptor without a name, host or port");
        goto err;
    }
    if (d->nregions > KVT_SEGDESC_MAX_REGIONS) {
        KVT_LOG_E("segment descriptor with %u regions (limit %u)", d->nregions,
                  KVT_SEGDESC_MAX_REGIONS);
        st = KVT_ERR_OVERFLOW;
        goto err;
    }
    for (uint32_t i = 0; i < d->nregions; i++) {
        const kvt_remote_region_t *r = &d->regions[i];
        if (r->length == 0 || r->addr > UINT64_MAX - r->length ||
            r->kind >= sizeof(kind_names) / sizeof(kind_names[0])) {
            KVT_LOG_E("segment descriptor region %u is invalid", i);
            goto err;
        }
    }
    st = KVT_ERR_NO_MEMORY;
    root = json_object_new_object();
    if (root == NULL)
        goto err;
    add(root, "kvt_segment", json_object_new_int(KVT_SEGDESC_JSON_VERSION),
        &oom);
    add(root, "compat", hex64(kvt__segdesc_compat_hash()), &oom);
    add(root, "name", json_object_new_string(d->name), &oom);
    add(root, "host", json_object_new_string(d->host), &oom);
    ports = json_object_new_object();
    if (ports != NULL)
        add(ports, "rpc", json_object_new_int(d->port), &oom);
    add(root, "ports", ports, &oom);
    add(root, "host_id", hex64(d->host_id), &oom);
    add(root, "pid", json_object_new_int64(d->pid), &oom);
    tps = json_object_new_array();
    for (uint32_t id = 1; tps != NULL && id != 0; id <<= 1) {
        const char *name;
        json_object *t;
        if ((d->transports & id) == 0 ||
            (name = transport_name(d, id)) == NULL)
            continue;
        t = json_object_new_object();
        if (t != NULL) {
            add(t, "name", json_object_new_string(name), &oom);
            if (id == KVT_TRANSPORT_TCP)
                add(t, "port", json_object_new_int(d->port), &oom);
        }
        push(tps, t, &oom);
    }
    add(root, "transports", tps, &oom);
    regs = json_object_new_array_ext(d->nregions > 0 ? (int)d->nregions : 1);
    for (uint32_t i = 0; regs != NULL && i < d->nregions; i++)
        push(regs, region_json(&d->regions[i], &oom), &oom);
    add(root, "regions", regs, &oom);
    if (oom)
        goto err_root;
    s = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s == NULL || (out = malloc(len + 1)) == NULL)
        goto err_root;
    memcpy(out, s, len + 1);
    json_object_put(root);
    *json_p = out;
    *len_p = len;
    return KVT_OK;

err_root:
    json_object_put(root);
err:
    if (st == KVT_ERR_NO_MEMORY)
        KVT_LOG_E("out of memory encoding a segment descriptor");
    return st;
}

static int parse_hex64(const char *s, uint64_t *v_p)
{
    uint64_t v = 0;

    if (s == NULL || strlen(s) != 16)
        return -1;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int x = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (x < 0)
            return -1;
        v = v << 4 | (uint64_t)x;
    }
    *v_p = v;
    return 0;
}

/* Fields of one region; returns NULL or the reason it is refused. */
static const char *parse_region(json_object *o, kvt_remote_region_t *r)
{
    json_object *v;
    const char *kind;
    size_t n;

    if (!json_object_is_type(o, json_type_object))
        return "region is not an object";
    if (!json_object_object_get_ex(o, "addr", &v) ||
        kvt__json_u64(v, &r->addr) != 0)
        return "region addr is not an unsigned integer";
    if (!json_object_object_get_ex(o, "length", &v) ||
        kvt__json_u64(v, &r->length) != 0 || r->length == 0)
        return "region length is not a positive integer";
    if (r->addr > UINT64_MAX - r->length)
        return "region wraps around the address space";
    if (!json_object_object_get_ex(o, "access", &v) ||
        !json_object_is_type(v, json_type_array) ||
        (n = json_object_array_length(v)) > 2)
        return "region access is not a list of rights";
    r->access = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *a = json_object_array_get_idx(v, i);
        const char *s = json_object_is_type(a, json_type_string)
                            ? json_object_get_string(a)
                            : "";
        if (strcmp(s, "write") == 0)
            r->access |= KVT_ACCESS_REMOTE_WRITE;
        else if (strcmp(s, "read") == 0)
            r->access |= KVT_ACCESS_REMOTE_READ;
        else
            return "region access holds an unknown right";
    }
    kind = kvt__json_str(o, "kind", 16);
    r->kind = UINT32_MAX;
    for (uint32_t i = 0; kind != NULL && i < 2; i++)
        if (strcmp(kind, kind_names[i]) == 0)
            r->kind = i;
    if (r->kind == UINT32_MAX)
        return "region kind is unknown";
    r->device = -1;
    if (r->kind != KVT_MEM_HOST) {
        uint64_t dev = 0;
        if (json_object_object_get_ex(o, "device", &v) &&
            (kvt__json_u64(v, &dev) != 0 || dev > 65534))
            return "region device is not a device ordinal";
        r->device = (int32_t)dev;
    }
    if (json_object_object_get_ex(o, "keys", &v)) {
        if (!json_object_is_type(v, json_type_object))
            return "region keys is not an object";
        json_object_object_foreach(v, k, kv)
        {
            (void)k;
            if (!json_object_is_type(kv, json_type_string) ||
                json_object_get_string_len(kv) > MAX_KEY_LEN)
                return "region key is not a string of at most 4096 bytes";
        }
    }
    return NULL;
}

static const char *parse_transports(json_object *root, kvt__segdesc_t *d)
{
    json_object *v;
    size_t n;

    if (!json_object_object_get_ex(root, "transports", &v) ||
        !json_object_is_type(v, json_type_array) ||
        (n = json_object_array_length(v)) > MAX_TRANSPORTS)
        return "transports is not a list";
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(v, i), *port;
        const char *name;
        uint64_t p;

        if (!json_object_is_type(t, json_type_object) ||
            (name = kvt__json_str(t, "name", 64)) == NULL)
            return "transport without a name";
        if (json_object_object_get_ex(t, "port", &port) &&
            (kvt__json_u64(port, &p) != 0 || p == 0 || p > 65535))
            return "transport port out of range";
        d->transports |= kvt__wire_tl_id(name);
    }
    return NULL;
}

/* Fields of the document; returns NULL or the reason it is refused. */
static const char *parse_root(json_object *root, kvt__segdesc_t *d,
                              kvt_status_t *st)
{
    json_object *v, *regs;
    const char *s, *why;
    uint64_t u;
    size_t n;

    if (!json_object_is_type(root, json_type_object))
        return "not a JSON object";
    if (!json_object_object_get_ex(root, "kvt_segment", &v) ||
        kvt__json_u64(v, &u) != 0)
        return "no kvt_segment version";
    if (u != KVT_SEGDESC_JSON_VERSION) {
        *st = KVT_ERR_VERSION;
        return "descriptor schema version differs from ours (1)";
    }
    if (parse_hex64(kvt__json_str(root, "compat", 16), &u) != 0)
        return "no compat hash";
    if (u != kvt__segdesc_compat_hash()) {
        *st = KVT_ERR_VERSION;
        return "compat hash differs: peer built with another wire "
               "protocol major version or for another architecture";
    }
    if ((s = kvt__json_str(root, "name", KVT_WIRE_NAME_MAX)) == NULL)
        return "name is not a string of 1..127 bytes";
    strcpy(d->name, s);
    if ((s = kvt__json_str(root, "host", KVT_WIRE_NAME_MAX)) == NULL)
        return "host is not a string of 1..127 bytes";
    strcpy(d->host, s);
    if (!json_object_object_get_ex(root, "ports", &v) ||
        !json_object_is_type(v, json_type_object) ||
        !json_object_object_get_ex(v, "rpc", &v) || kvt__json_u64(v, &u) != 0 ||
        u == 0 || u > 65535)
        return "ports.rpc is not a port number";
    d->port = (uint16_t)u;
    if (parse_hex64(kvt__json_str(root, "host_id", 16), &d->host_id) != 0)
        return "host_id is not 16 hex digits";
    if (json_object_object_get_ex(root, "pid", &v)) {
        if (kvt__json_u64(v, &u) != 0 || u > UINT32_MAX)
            return "pid out of range";
        d->pid = (uint32_t)u;
    }
    if ((why = parse_transports(root, d)) != NULL)
        return why;
    if (!json_object_object_get_ex(root, "regions", &regs) ||
        !json_object_is_type(regs, json_type_array))
        return "regions is not a list";
    n = json_object_array_length(regs);
    if (n > KVT_SEGDESC_MAX_REGIONS)
        return "more than 65536 regions";
    if (n == 0)
        return NULL;
    d->regions = calloc(n, sizeof(*d->regions));
    if (d->regions == NULL) {
        *st = KVT_ERR_NO_MEMORY;
        return "out of memory";
    }
    d->nregions = (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        if ((why = parse_region(json_object_array_get_idx(regs, i),
                                &d->regions[i])) != NULL)
            return why;
    return NULL;
}

kvt_status_t kvt__segdesc_from_json(const char *json, size_t len,
                                    kvt__segdesc_t *d)
{
    json_object *root;
    const char *why = "malformed JSON";
    kvt_status_t st = KVT_ERR_PROTOCOL;

    memset(d, 0, sizeof(*d));
    if (len > KVT_SEGDESC_JSON_MAX) {
        why = "larger than 16 MiB";
        goto err;
    }
    root = kvt__json_parse(json, len);
    if (root == NULL)
        goto err;
    why = parse_root(root, d, &st);
    json_object_put(root);
    if (why != NULL)
        goto err_desc;
    return KVT_OK;

err_desc:
    kvt__segdesc_clear(d);
    memset(d, 0, sizeof(*d));
err:
    KVT_LOG_W("refusing segment descriptor: %s", why);
    return st;
}

#else /* !KVT_WITH_JSON */

kvt_status_t kvt__segdesc_to_json(const kvt__segdesc_t *d, char **json_p,
                                  size_t *len_p)
{
    (void)d;
    (void)json_p;
    (void)len_p;
    KVT_LOG_E("JSON segment descriptors need json-c, which this build "
              "lacks (KVT_WITH_JSON=OFF)");
    return KVT_ERR_NOT_SUPPORTED;
}

kvt_status_t kvt__segdesc_from_json(const char *json, size_t len,
                                    kvt__segdesc_t *d)
{
    (void)json;
    (void)len;
    memset(d, 0, sizeof(*d));
    KVT_LOG_E("JSON segment descriptors need json-c, which this build "
              "lacks (KVT_WITH_JSON=OFF)");
    return KVT_ERR_NOT_SUPPORTED;
}

#endif
