/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine of Mooncake's C API: createTransferEngine()'s arguments
 * translated into kvt engine parameters (as the Python binding's
 * initialize() does), the registry of live engines that checks every
 * handle, the mapping of kvt statuses to Mooncake's codes, and the calls
 * about the engine as a whole and its transports.
 */
#include "mc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Live engines: a handle is used only once it is found here, so a stale
 * or foreign one is refused without being dereferenced. */
static pthread_rwlock_t live_lock = PTHREAD_RWLOCK_INITIALIZER;
static kvtmc_engine_t **live;
static size_t nlive, livecap;

kvtmc_engine_t *kvtmc__engine(transfer_engine_t engine, const char *call)
{
    kvtmc_engine_t *e = NULL;

    pthread_rwlock_rdlock(&live_lock);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == engine)
            e = live[i];
    pthread_rwlock_unlock(&live_lock);
    if (e == NULL)
        KVTMC__LOG_E("%s: %p is not a live transfer engine", call, engine);
    return e;
}

static int live_add(kvtmc_engine_t *e)
{
    int rc = -1;

    pthread_rwlock_wrlock(&live_lock);
    if (nlive == livecap) {
        size_t cap = livecap ? livecap * 2 : 8;
        kvtmc_engine_t **n = realloc(live, cap * sizeof(*n));
        if (n == NULL)
            goto out;
        live = n;
        livecap = cap;
    }
    live[nlive++] = e;
    rc = 0;
out:
    pthread_rwlock_unlock(&live_lock);
    return rc;
}

static int live_remove(kvtmc_engine_t *e)
{
    int found = 0;

    pthread_rwlock_wrlock(&live_lock);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == e) {
            live[i] = live[--nlive];
            found = 1;
            break;
        }
    pthread_rwlock_unlock(&live_lock);
    return found;
}

int kvtmc__err(kvt_status_t st)
{
    switch (st) {
    case KVT_OK:
        return 0;
    case KVT_ERR_INVALID_PARAM:
    case KVT_ERR_OVERFLOW:
        return MC_ERR_INVALID_ARGUMENT;
    case KVT_ERR_NO_SPACE:
    case KVT_ERR_AGAIN:
        return MC_ERR_TOO_MANY_REQUESTS;
    case KVT_ERR_NOT_REGISTERED:
        return MC_ERR_ADDRESS_NOT_REGISTERED;
    case KVT_ERR_BUSY:
        return MC_ERR_BATCH_BUSY;
    case KVT_ERR_EXISTS:
        return MC_ERR_ADDRESS_OVERLAPPED;
    case KVT_ERR_UNREACHABLE:
    case KVT_ERR_CONN_LOST:
    case KVT_ERR_TIMEDOUT:
    case KVT_ERR_IO:
        return MC_ERR_SOCKET;
    case KVT_ERR_PROTOCOL:
        return MC_ERR_MALFORMED_JSON;
    case KVT_ERR_VERSION:
    case KVT_ERR_ACCESS:
    case KVT_ERR_AUTH:
        return MC_ERR_REJECT_HANDSHAKE;
    case KVT_ERR_NOT_FOUND:
        return MC_ERR_METADATA;
    case KVT_ERR_CANCELED:
    case KVT_ERR_CLOSED:
        return MC_ERR_ENDPOINT;
    case KVT_ERR_NO_MEMORY:
        return MC_ERR_MEMORY;
    case KVT_ERR_NOT_SUPPORTED:
    default:
        return MC_ERR_NOT_IMPLEMENTED;
    }
}

int kvtmc__status_code(kvt_status_t st)
{
    int e = kvtmc__err(st);

    return e == MC_ERR_NOT_IMPLEMENTED ? MC_STATUS_NOT_IMPLEMENTED : -e;
}

/*
 * Split "host", "host:port" or "[v6]:port" (a bare IPv6 address is all
 * host) into @host and *port_p (0 when none). A trailing ":npu_N" (the
 * Ascend form) is dropped first. Returns 0, or -1 when malformed.
 */
static int split_host_port(const char *s, char *host, size_t hostsz,
                           uint16_t *port_p)
{
    char buf[512];
    const char *hs = buf, *he, *colon, *c;
    char *end;
    long port;

    snprintf(buf, sizeof(buf), "%s", s);
    c = strrchr(buf, ':');
    if (c != NULL && strncmp(c + 1, "npu_", 4) == 0 &&
        strspn(c + 5, "0123456789") == strlen(c + 5) && c[5] != '\0')
        buf[c - buf] = '\0';
    colon = strrchr(buf, ':');
    *port_p = 0;
    if (buf[0] == '[') {
        const char *rb = strchr(buf, ']');
        if (rb == NULL || (rb[1] != '\0' && rb[1] != ':'))
            return -1;
        hs = buf + 1;
        he = rb;
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else if (colon != NULL && strchr(buf, ':') != colon) {
        colon = NULL; /* a bare IPv6 address */
        he = buf + strlen(buf);
    } else {
        he = colon ? colon : buf + strlen(buf);
    }
    if ((size_t)(he - hs) >= hostsz)
        return -1;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    if (colon != NULL) {
        port = strtol(colon + 1, &end, 10);
        if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535)
            return -1;
        *port_p = (uint16_t)port;
    }
    return 0;
}

static int is_p2p(const char *s)
{
    return strcmp(s, "P2PHANDSHAKE") == 0 || strcmp(s, "p2p") == 0;
}

static int transport_built(uint32_t id)
{
    kvt_transport_info_t t[16];
    size_t n = 0;

    if (kvt_transports(t, 16, &n) != KVT_OK)
        return 0;
    for (size_t i = 0; i < n && i < 16; i++)
        if (t[i].id == id)
            return 1;
    return 0;
}

/*
 * Mooncake's init(): in P2PHANDSHAKE mode the engine listens on the host
 * of @local_server_name at a free port and is named "host:port"; with a
 * metadata server it is named @local_server_name and the port is free
 * too. MC_LEGACY_RPC_PORT_BINDING binds the given port instead.
 */
KVTMC_API transfer_engine_t createTransferEngine(
    const char *metadata_conn_string, const char *local_server_name,
    const char *ip_or_host_name, uint64_t rpc_port, int auto_discover)
{
    kvt_engine_params_t p = {0};
    kvtmc_engine_t *e = NULL;
    char uri[1024];
    uint16_t port = 0;
    int p2p;
    kvt_status_t st;

    if (metadata_conn_string == NULL) {
        KVTMC__LOG_E("createTransferEngine: no metadata_conn_string");
        goto err;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        goto err;
    p2p = is_p2p(metadata_conn_string);
    if (local_server_name != NULL && *local_server_name != '\0' &&
        split_host_port(local_server_name, e->host, sizeof(e->host), &port) <
            0) {
        KVTMC__LOG_E("createTransferEngine: local_server_name '%s' is not "
                     "host[:port]",
                     local_server_name);
        goto err_free;
    }
    if (e->host[0] == '\0')
        snprintf(e->host, sizeof(e->host), "%s",
                 ip_or_host_name && *ip_or_host_name ? ip_or_host_name
                                                     : "127.0.0.1");
    if (port == 0 && rpc_port <= 65535)
        port = (uint16_t)rpc_port;
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_METADATA_URI;
    p.local_host = e->host;
    if (p2p)
        snprintf(uri, sizeof(uri), "p2p");
    else if (strstr(metadata_conn_string, "://") == NULL)
        snprintf(uri, sizeof(uri), "etcd://%s", metadata_conn_string);
    else
        snprintf(uri, sizeof(uri), "%s", metadata_conn_string);
    p.metadata_uri = uri;
    if (getenv("MC_LEGACY_RPC_PORT_BINDING") != NULL) {
        p.field_mask |= KVT_ENGINE_PARAM_PORT;
        p.port = port;
    }
    if (!p2p && local_server_name != NULL && *local_server_name != '\0') {
        p.field_mask |= KVT_ENGINE_PARAM_SEGMENT_NAME;
        p.segment_name = local_server_name;
    }
    if (auto_discover && transport_built(KVT_TRANSPORT_UCX)) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        p.transports =
            KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM;
    }
    st = kvt_engine_create(&p, &e->kvt);
    if (st != KVT_OK) {
        KVTMC__LOG_E("createTransferEngine(%s, %s): %s (%s)%s", uri, e->host,
                     kvt_status_name(st), kvt_status_str(st),
                     st == KVT_ERR_NOT_SUPPORTED && !p2p
                         ? "; this kvt build may lack that metadata "
                           "backend (`kvt info` lists them)"
                         : "");
        goto err_free;
    }
    e->name = strdup(kvt_engine_segment_name(e->kvt));
    if (e->name == NULL)
        goto err_engine;
    pthread_rwlock_init(&e->seg_lock, NULL);
    pthread_rwlock_init(&e->batch_lock, NULL);
    e->magic = KVTMC_MAGIC;
    if (live_add(e) < 0)
        goto err_locks;
    KVTMC__LOG_I("transfer engine up: segment %s, metadata %s", e->name, uri);
    return e;

err_locks:
    pthread_rwlock_destroy(&e->batch_lock);
    pthread_rwlock_destroy(&e->seg_lock);
    free(e->name);
err_engine:
    kvt_engine_destroy(e->kvt);
err_free:
    free(e);
err:
    return NULL;
}

KVTMC_API void destroyTransferEngine(transfer_engine_t engine)
{
    kvtmc_engine_t *e = engine;

    if (engine == NULL || !live_remove(e)) {
        if (engine != NULL)
            KVTMC__LOG_E("destroyTransferEngine: %p is not a live transfer "
                         "engine",
                         engine);
        return;
    }
    /* kvt's engine ends what is in flight and frees its batches; the
     * tables' wrappers go after it. */
    kvt_engine_destroy(e->kvt);
    kvtmc__batches_free(e);
    kvtmc__segments_free(e);
    pthread_rwlock_destroy(&e->batch_lock);
    pthread_rwlock_destroy(&e->seg_lock);
    free(e->name);
    e->magic = 0;
    free(e);
}

KVTMC_API int getLocalIpAndPort(transfer_engine_t engine, char *buf_out,
                                size_t buf_len)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "getLocalIpAndPort");
    int v6;

    if (e == NULL || (buf_out == NULL && buf_len > 0))
        return MC_ERR_INVALID_ARGUMENT;
    v6 = strchr(e->host, ':') != NULL;
    if (buf_len > 0)
        snprintf(buf_out, buf_len, "%s%s%s:%u", v6 ? "[" : "", e->host,
                 v6 ? "]" : "", (unsigned)kvt_engine_rpc_port(e->kvt));
    return 0;
}

KVTMC_API transport_t installTransport(transfer_engine_t engine,
                                       const char *proto, void **args)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "installTransport");

    if (e == NULL || proto == NULL)
        return NULL;
    if (strcmp(proto, "tcp") == 0)
        return &e->transport_token[0];
    if (strcmp(proto, "shm") == 0)
        return &e->transport_token[1];
    if (strcmp(proto, "rdma") == 0) {
        KVTMC__LOG_W(
            "installTransport(rdma): kvt picks the transport per "
            "peer: ucx where this engine runs it (createTransferEngine "
            "with auto_discover and a build with UCX), else tcp, "
            "and shm for a peer on this host");
        return &e->transport_token[2];
    }
    KVTMC__LOG_E("installTransport(%s): not a kvt transport (kvt has tcp, "
                 "shm, and ucx for rdma)",
                 proto);
    return NULL;
}

KVTMC_API int uninstallTransport(transfer_engine_t engine, const char *proto)
{
    if (kvtmc__engine(engine, "uninstallTransport") == NULL || proto == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    KVTMC__LOG_I("uninstallTransport(%s): kvt keeps its transports running",
                 proto);
    return 0;
}

KVTMC_API int discoverTopology(transfer_engine_t engine)
{
    if (kvtmc__engine(engine, "discoverTopology") == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    KVTMC__LOG_W("discoverTopology: not supported (kvt keeps no NIC "
                 "topology; ucx picks its devices itself)");
    return MC_ERR_NOT_IMPLEMENTED;
}

KVTMC_API int removeLocalSegment(transfer_engine_t engine,
                                 const char *segment_name)
{
    if (kvtmc__engine(engine, "removeLocalSegment") == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    KVTMC__LOG_W("removeLocalSegment(%s): not supported (kvt withdraws its "
                 "descriptor when the engine is destroyed)",
                 segment_name ? segment_name : "");
    return MC_ERR_NOT_IMPLEMENTED;
}

KVTMC_API int warmupEfaSegment(transfer_engine_t engine,
                               const char *segment_name)
{
    if (kvtmc__engine(engine, "warmupEfaSegment") == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    KVTMC__LOG_I("warmupEfaSegment(%s): kvt has no EFA transport; nothing to "
                 "warm up",
                 segment_name ? segment_name : "");
    return 0;
}

KVTMC_API int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats,
                              size_t *count)
{
    if (stats == NULL || count == NULL ||
        kvtmc__engine(engine, "getNicLoadStats") == NULL)
        return -1;
    *count = 0;
    return 0;
}

KVTMC_API void enableGracefulShutdown(transfer_engine_t engine)
{
    if (kvtmc__engine(engine, "enableGracefulShutdown") == NULL)
        return;
    KVTMC__LOG_I("enableGracefulShutdown: destroyTransferEngine() always "
                 "ends transfers in flight and closes every session");
}
