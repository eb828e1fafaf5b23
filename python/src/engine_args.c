/* SPDX-License-Identifier: Apache-2.0 */
/*
 * initialize() and initialize_ext() of kvt.TransferEngine: Mooncake's
 * arguments (local_hostname with its port and device suffix, the
 * metadata server and its type, protocol, device_name) translated into
 * kvt engine parameters, and the engine's creation.
 */
#include "kvtpy.h"

#include <stdio.h>

/*
 * Split "host", "host:port", "[v6]:port" or a bare IPv6 address. @host
 * gets the host without brackets; *port_p is 0 when none was given.
 * Returns 0, or -1 for a malformed port.
 */
static int split_host_port(const char *s, char *host, size_t hostsz,
                           uint16_t *port_p)
{
    const char *colon = strrchr(s, ':');
    const char *hs = s, *he;
    char *end;
    long port;

    *port_p = 0;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL)
            return -1;
        hs = s + 1;
        he = rb;
        colon = rb[1] == ':' ? rb + 1 : NULL;
        if (rb[1] != '\0' && colon == NULL)
            return -1;
    } else if (colon != NULL && strchr(s, ':') != colon) {
        colon = NULL; /* bare IPv6 address */
        he = s + strlen(s);
    } else {
        he = colon ? colon : s + strlen(s);
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

/*
 * Ascend-style names: vllm-ascend passes "HOST:PORT:npu_N" as
 * local_hostname (Mooncake's Ascend transport keys its device by it). kvt
 * serves the host and port alone, and inference engines build the peer's
 * name from get_rpc_port() as "HOST:PORT", so the device part is dropped.
 * Copies @s without a trailing ":npu_<digits>" into @buf; returns where
 * the suffix started in @s, or NULL when there is none (@buf is @s then).
 */
static const char *strip_device_suffix(const char *s, char *buf, size_t bufsz)
{
    const char *c = strrchr(s, ':');
    const char *d;

    if (c == NULL || strncmp(c + 1, "npu_", 4) != 0 || c[5] == '\0')
        goto none;
    for (d = c + 5; *d != '\0'; d++)
        if (*d < '0' || *d > '9')
            goto none;
    if ((size_t)(c - s) >= bufsz)
        goto none;
    memcpy(buf, s, (size_t)(c - s));
    buf[c - s] = '\0';
    return c + 1;
none:
    snprintf(buf, bufsz, "%s", s);
    return NULL;
}

static int is_p2p(const char *s)
{
    return s != NULL &&
           (strcmp(s, "P2PHANDSHAKE") == 0 || strcmp(s, "p2p") == 0);
}

/* Whether this library has the ucx transport. */
static int ucx_built(void)
{
    kvt_transport_info_t t[16];
    size_t n = 0;

    if (kvt_transports(t, 16, &n) != KVT_OK)
        return 0;
    for (size_t i = 0; i < n && i < 16; i++)
        if (t[i].id == KVT_TRANSPORT_UCX)
            return 1;
    return 0;
}

/*
 * Create the engine. @metadata is a full URI, or "p2p". In p2p mode the
 * port of @local_hostname is ignored and a free one is picked, as Mooncake
 * does, unless MC_LEGACY_RPC_PORT_BINDING is set; with a metadata server
 * the port, if given, is bound. Either way the segment is named
 * "host:rpc_port", the name inference engines build from get_rpc_port().
 */
static int do_initialize(kvtpy_engine_t *self, const char *local_hostname,
                         const char *metadata, const char *protocol,
                         const char *device_name)
{
    kvt_engine_params_t p = {0};
    int p2p = is_p2p(metadata);
    kvt_engine_h engine = NULL;
    char host[256], name[512];
    const char *device;
    uint16_t port;
    kvt_status_t st;

    if (self->engine != NULL || self->initializing) {
        kvtpy_log("error", "initialize: this TransferEngine is already "
                           "initialized");
        return -1;
    }
    device = strip_device_suffix(local_hostname, name, sizeof(name));
    if (device != NULL)
        kvtpy_log("info",
                  "initialize: '%s' in local_hostname names a device; kvt "
                  "serves '%s' (the segment is host:rpc_port)",
                  device, name);
    if (split_host_port(name, host, sizeof(host), &port) < 0) {
        kvtpy_log("error", "initialize: local_hostname '%s' is not host[:port]",
                  local_hostname);
        return -1;
    }
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_METADATA_URI;
    p.local_host = host[0] ? host : "127.0.0.1";
    p.metadata_uri = p2p ? "p2p" : metadata;
    if (!p2p || getenv("MC_LEGACY_RPC_PORT_BINDING") != NULL) {
        p.field_mask |= KVT_ENGINE_PARAM_PORT;
        p.port = port;
    }
    if (protocol != NULL && strcmp(protocol, "tcp") == 0) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        p.transports = KVT_TRANSPORT_TCP;
    } else if (protocol != NULL && strcmp(protocol, "rdma") == 0 &&
               ucx_built()) {
        /* RDMA goes through ucx (UCX picks the fabric, and shared
         * memory for a peer on this host); tcp serves a peer ucx cannot
         * reach, and the log says so. */
        p.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        p.transports = KVT_TRANSPORT_UCX | KVT_TRANSPORT_TCP;
        if (device_name != NULL && *device_name != '\0') {
            p.field_mask |= KVT_ENGINE_PARAM_NET_DEVICES;
            p.net_devices = device_name;
        }
    } else if (protocol != NULL && *protocol != '\0' &&
               strcmp(protocol, "shm") != 0) {
        kvtpy_log("warning",
                  "initialize: protocol '%s' is not a kvt transport; kvt "
                  "picks per peer among those it has (tcp, and shm for "
                  "same-host peers)",
                  protocol);
    }
    if (device_name != NULL && *device_name != '\0' &&
        !(p.field_mask & KVT_ENGINE_PARAM_NET_DEVICES))
        kvtpy_log("info", "initialize: device_name '%s' is not used by kvt",
                  device_name);

    /* Another thread may call initialize() while this one waits without
     * the GIL; the flag makes it refuse instead of creating a second
     * engine. */
    self->initializing = 1;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_engine_create(&p, &engine);
    Py_END_ALLOW_THREADS
    self->initializing = 0;
    if (st != KVT_OK) {
        if (!p2p && st == KVT_ERR_NOT_SUPPORTED)
            kvtpy_log("error",
                      "initialize: metadata server '%s' needs a metadata "
                      "backend this kvt build does not have (`kvt info` "
                      "lists those built in); P2PHANDSHAKE needs none",
                      metadata);
        else
            kvtpy_log("error", "initialize(%s): %s (%s)", local_hostname,
                      kvt_status_name(st), kvt_status_str(st));
        return -1;
    }
    self->engine = engine;
    kvtpy_log("info", "kvt engine up: segment %s, metadata %s",
              kvt_engine_segment_name(engine), p.metadata_uri);
    return 0;
}

/* None is accepted where Mooncake takes a C string (pybind11 passes it as
 * NULL). */
static int opt_cstr(PyObject *o, const char *what, const char **s)
{
    *s = NULL;
    if (o == NULL || o == Py_None)
        return 0;
    *s = kvtpy_cstr(o, what);
    return *s == NULL ? -1 : 0;
}

PyObject *kvtpy_m_initialize(PyObject *self, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"local_hostname", "metadata_server",
                                         "protocol", "device_name"};
    const char *local, *server, *protocol, *device;
    PyObject *a[4], *uri = NULL, *r;

    if (kvtpy_args("initialize", args, nargs, kwnames, params, 4, 4, a) < 0 ||
        opt_cstr(a[0], "local_hostname", &local) < 0 ||
        opt_cstr(a[1], "metadata_server", &server) < 0 ||
        opt_cstr(a[2], "protocol", &protocol) < 0 ||
        opt_cstr(a[3], "device_name", &device) < 0)
        return NULL;
    if (local == NULL || server == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "local_hostname and metadata_server must be str");
        return NULL;
    }
    /* Mooncake: "P2PHANDSHAKE", a full URI, or host:port of etcd. */
    if (!is_p2p(server) && strstr(server, "://") == NULL) {
        uri = PyUnicode_FromFormat("etcd://%s", server);
        if (uri == NULL)
            return NULL;
        server = PyUnicode_AsUTF8AndSize(uri, NULL);
    }
    r = kvtpy_int(
        do_initialize((kvtpy_engine_t *)self, local, server, protocol, device));
    Py_XDECREF(uri);
    return r;
}

PyObject *kvtpy_m_initialize_ext(PyObject *self, PyObject *const *args,
                                 Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"local_hostname", "metadata_server",
                                         "protocol", "device_name",
                                         "metadata_type"};
    const char *local, *server, *protocol, *device, *type;
    PyObject *a[5], *uri = NULL, *r;

    if (kvtpy_args("initialize_ext", args, nargs, kwnames, params, 5, 5, a) <
            0 ||
        opt_cstr(a[0], "local_hostname", &local) < 0 ||
        opt_cstr(a[1], "metadata_server", &server) < 0 ||
        opt_cstr(a[2], "protocol", &protocol) < 0 ||
        opt_cstr(a[3], "device_name", &device) < 0 ||
        opt_cstr(a[4], "metadata_type", &type) < 0)
        return NULL;
    if (local == NULL || server == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "local_hostname and metadata_server must be str");
        return NULL;
    }
    /* Mooncake: P2PHANDSHAKE wins; else a server without a scheme gets
     * metadata_type as its scheme. */
    if (is_p2p(type)) {
        server = "p2p";
    } else if (!is_p2p(server) && strstr(server, "://") == NULL) {
        uri = PyUnicode_FromFormat("%s://%s", type ? type : "etcd", server);
        if (uri == NULL)
            return NULL;
        server = PyUnicode_AsUTF8AndSize(uri, NULL);
    }
    r = kvtpy_int(
        do_initialize((kvtpy_engine_t *)self, local, server, protocol, device));
    Py_XDECREF(uri);
    return r;
}
