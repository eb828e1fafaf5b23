/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt.TransferEngine: the type, initialisation, memory, notifications
 * received and probes. The transfer methods live in transfer.c. Every
 * method keeps the name, argument order, defaults and return convention
 * of mooncake.engine.TransferEngine.
 */
#include "kvtpy.h"

#include <stdio.h>

/* Notifications taken per kvt_notify_recv() call by get_notifies(). */
#define NOTIFY_CHUNK 16

int kvtpy_need_engine(kvtpy_engine_t *self)
{
    if (self->engine != NULL)
        return 0;
    kvtpy_state_error("TransferEngine is not initialized: call initialize() "
                      "or initialize_ext() first (and check it returned 0)");
    return -1;
}

/* ---- Notifications and probes ------------------------------------------- */

static PyObject *m_get_notifies(PyObject *self, PyObject *unused)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    PyObject *list = NULL;
    kvt_notify_t *buf;
    size_t got;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    /* Per call, not per engine: building the objects below may run
     * arbitrary Python code (a collection's finalizers), and with it
     * another thread's get_notifies(). */
    buf = malloc(NOTIFY_CHUNK * sizeof(*buf));
    if (buf == NULL)
        return PyErr_NoMemory();
    list = PyList_New(0);
    if (list == NULL)
        goto out;
    do {
        /* Does not block (timeout 0): the GIL may stay held. */
        if (kvt_notify_recv(e->engine, buf, NOTIFY_CHUNK, &got, 0) != KVT_OK)
            break;
        for (size_t i = 0; i < got; i++) {
            PyObject *n = kvtpy_notify_decode(&buf[i]);
            if (n == NULL || PyList_Append(list, n) < 0) {
                /* The rest of this chunk is lost with the error. */
                Py_XDECREF(n);
                Py_CLEAR(list);
                goto out;
            }
            Py_DECREF(n);
        }
    } while (got == NOTIFY_CHUNK);
out:
    free(buf);
    return list;
}

/*
 * send_probe(peer): 0 when the peer answers a fresh handshake and
 * descriptor query, -1 otherwise. The query goes over a new connection, so
 * it also catches a peer whose cached session has not failed yet.
 */
static PyObject *m_send_probe(PyObject *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"peer_server_name"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    const char *name;
    kvt_segment_t seg;
    kvt_status_t st;
    int opened = 0;
    PyObject *a[1];
    size_t count;

    if (kvtpy_args("send_probe", args, nargs, kwnames, params, 1, 1, a) < 0 ||
        kvtpy_need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(a[0], "peer_server_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK) {
        opened = 1;
        st = kvt_segment_regions(e->engine, seg, 1, NULL, 0, &count);
    }
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("info", "send_probe(%s): %s: %s", name,
                  opened ? "descriptor query failed" : "cannot open segment",
                  kvt_status_name(st));
        return kvtpy_int(-1);
    }
    return kvtpy_int(0);
}

/*
 * get_segment_transport(segment) (kvt's own): the name of the transport
 * that carries host-memory transfers to the segment ("tcp", "shm",
 * "ucx"), opening it if need be; "" when it cannot be opened.
 */
static PyObject *m_get_segment_transport(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    const char *name, *t = "";
    kvt_segment_t seg;
    kvt_status_t st;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(arg, "segment_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK && kvt_segment_transport(e->engine, seg, KVT_MEM_HOST,
                                              KVT_MEM_HOST, &t) != KVT_OK)
        t = "";
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(t);
}

/*
 * get_first_buffer_address(segment): the lowest-addressed region the peer
 * registered (kvt keeps regions sorted by address; Mooncake returns the
 * first registered), or 0. The descriptor is fetched afresh so that
 * regions registered after the segment was first opened count.
 */
static PyObject *m_get_first_buffer_address(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    kvt_remote_region_t region;
    const char *name;
    kvt_segment_t seg;
    kvt_status_t st;
    size_t count = 0;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(arg, "segment_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK)
        st = kvt_segment_regions(e->engine, seg, 1, &region, 1, &count);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("warning", "get_first_buffer_address(%s): %s (%s)", name,
                  kvt_status_name(st), kvt_status_str(st));
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong(count > 0 ? region.addr : 0);
}

/* ---- Memory -------------------------------------------------------------- */

/*
 * Mooncake locations: none or "*": told from the memory (device memory a
 * memory domain of this build detects, host memory otherwise); "cpu:N":
 * host memory; "cuda:N": memory of CUDA device N (checked). Others (other
 * accelerators) are refused: *kind is KVT_MEM_KINDS then.
 */
static int kind_of(PyObject *loc, kvt_mem_kind_t *kind, int32_t *device)
{
    const char *s;
    char *end;
    long n;

    *kind = KVT_MEM_AUTO;
    *device = -1;
    if (loc == NULL || loc == Py_None)
        return 0;
    s = kvtpy_cstr(loc, "location");
    if (s == NULL)
        return -1;
    if (s[0] == '\0' || strcmp(s, "*") == 0)
        return 0;
    if (strncmp(s, "cpu", 3) == 0) {
        *kind = KVT_MEM_HOST;
        return 0;
    }
    if (strncmp(s, "cuda", 4) == 0) {
        *kind = KVT_MEM_CUDA;
        *device = 0;
        if (s[4] == ':') {
            n = strtol(s + 5, &end, 10);
            if (end == s + 5 || *end != '\0' || n < 0 || n > INT32_MAX)
                *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
            else
                *device = (int32_t)n;
        } else if (s[4] != '\0') {
            *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
        }
        return 0;
    }
    *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
    return 0;
}

/* A location kind_of() refused: logged, KVT_ERR_NOT_SUPPORTED. */
static PyObject *bad_location(const char *fname, PyObject *loc)
{
    const char *s = kvtpy_cstr(loc, "location");

    kvtpy_log("error",
              "%s: location '%s': kvt registers host memory ('cpu:N') and "
              "CUDA memory ('cuda:N'), or tells them apart ('*')",
              fname, s != NULL ? s : "?");
    return kvtpy_int(KVT_ERR_NOT_SUPPORTED);
}

static PyObject *register_regions(kvtpy_engine_t *self, const char *fname,
                                  kvt_mem_region_t *r, size_t n)
{
    kvt_status_t st;

    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_register_batch(self->engine, r, n);
    Py_END_ALLOW_THREADS
    if (st == KVT_OK)
        return kvtpy_int(0);
    kvtpy_log("error", "%s(%#llx, %llu%s): %s (%s)", fname,
              (unsigned long long)(uintptr_t)r[0].addr,
              (unsigned long long)r[0].length, n > 1 ? ", ..." : "",
              kvt_status_name(st), kvt_status_str(st));
    return kvtpy_int(st);
}

static PyObject *m_register_memory(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "capacity", "location"};
    PyObject *a[3];
    uint64_t addr, len;
    kvt_mem_region_t r = {0};
    kvt_mem_kind_t kind;
    int32_t dev;

    if (kvtpy_args("register_memory", args, nargs, kwnames, params, 2, 3, a) <
            0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "capacity", &len) < 0 || kind_of(a[2], &kind, &dev) < 0)
        return NULL;
    if (kind == (kvt_mem_kind_t)KVT_MEM_KINDS)
        return bad_location("register_memory", a[2]);
    r.addr = (void *)(uintptr_t)addr;
    r.length = (size_t)len;
    r.access = KVT_ACCESS_REMOTE_RW;
    r.kind = kind;
    r.device = dev;
    return register_regions((kvtpy_engine_t *)self, "register_memory", &r, 1);
}

static PyObject *m_batch_register_memory(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addresses", "capacities",
                                         "location"};
    kvt_mem_region_t *r = NULL;
    PyObject *a[3], *ret = NULL;
    Py_ssize_t n, nc;
    kvt_mem_kind_t kind;
    int32_t dev;

    if (kvtpy_args("batch_register_memory", args, nargs, kwnames, params, 2, 3,
                   a) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kind_of(a[2], &kind, &dev) < 0)
        return NULL;
    if (kind == (kvt_mem_kind_t)KVT_MEM_KINDS)
        return bad_location("batch_register_memory", a[2]);
    n = kvtpy_seq_len(a[0], "buffer_addresses");
    if (n < 0)
        return NULL;
    nc = kvtpy_seq_len(a[1], "capacities");
    if (nc < 0)
        return NULL;
    if (n != nc) {
        kvtpy_log("error",
                  "batch_register_memory: %zd addresses but %zd capacities", n,
                  nc);
        return kvtpy_int(KVT_ERR_INVALID_PARAM);
    }
    if (n == 0)
        return kvtpy_int(0);
    r = calloc((size_t)n, sizeof(*r));
    if (r == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t addr, len;
        if (kvtpy_u64_item(a[0], i, "buffer_addresses[i]", &addr) < 0 ||
            kvtpy_u64_item(a[1], i, "capacities[i]", &len) < 0)
            goto out;
        r[i].addr = (void *)(uintptr_t)addr;
        r[i].length = (size_t)len;
        r[i].access = KVT_ACCESS_REMOTE_RW;
        r[i].kind = kind;
        r[i].device = dev;
    }
    ret = register_regions((kvtpy_engine_t *)self, "batch_register_memory", r,
                           (size_t)n);
out:
    free(r);
    return ret;
}

static PyObject *unregister_addrs(kvtpy_engine_t *self, const char *fname,
                                  void **addrs, size_t n)
{
    kvt_status_t st;

    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_unregister_batch(self->engine, addrs, n);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        kvtpy_log("error", "%s(%#llx%s): %s (%s)", fname,
                  (unsigned long long)(uintptr_t)addrs[0], n > 1 ? ", ..." : "",
                  kvt_status_name(st), kvt_status_str(st));
    return kvtpy_int(st);
}

static PyObject *m_unregister_memory(PyObject *self, PyObject *arg)
{
    uint64_t addr;
    void *p;

    if (kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kvtpy_u64(arg, "buffer_addr", &addr) < 0)
        return NULL;
    p = (void *)(uintptr_t)addr;
    return unregister_addrs((kvtpy_engine_t *)self, "unregister_memory", &p, 1);
}

static PyObject *m_batch_unregister_memory(PyObject *self, PyObject *arg)
{
    PyObject *ret = NULL;
    void **addrs;
    Py_ssize_t n;

    if (kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    n = kvtpy_seq_len(arg, "buffer_addresses");
    if (n < 0)
        return NULL;
    if (n == 0)
        return kvtpy_int(0);
    addrs = calloc((size_t)n, sizeof(*addrs));
    if (addrs == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (kvtpy_u64_item(arg, i, "buffer_addresses[i]", &v) < 0)
            goto out;
        addrs[i] = (void *)(uintptr_t)v;
    }
    ret = unregister_addrs((kvtpy_engine_t *)self, "batch_unregister_memory",
                           addrs, (size_t)n);
out:
    free(addrs);
    return ret;
}

/*
 * allocate_managed_buffer(length): Mooncake carves buffers out of a buddy
 * allocator over large registered chunks; kvt allocates each one with
 * kvt_mem_alloc() (memfd-backed, page-aligned, zero-filled, registered),
 * which also lets same-host peers map it directly.
 */
static PyObject *m_allocate_managed_buffer(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    void *p = NULL;
    kvt_status_t st;
    uint64_t len;

    if (kvtpy_need_engine(e) < 0 || kvtpy_u64(arg, "length", &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_alloc(e->engine, (size_t)len, KVT_ACCESS_REMOTE_RW, &p);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("error", "allocate_managed_buffer(%llu): %s (%s)",
                  (unsigned long long)len, kvt_status_name(st),
                  kvt_status_str(st));
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong((uint64_t)(uintptr_t)p);
}

static PyObject *m_free_managed_buffer(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "length"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    uint64_t addr, len;
    kvt_status_t st;
    PyObject *a[2];

    if (kvtpy_args("free_managed_buffer", args, nargs, kwnames, params, 2, 2,
                   a) < 0 ||
        kvtpy_need_engine(e) < 0 || kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "length", &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_free(e->engine, (void *)(uintptr_t)addr);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        kvtpy_log("error", "free_managed_buffer(%#llx): %s (%s)",
                  (unsigned long long)addr, kvt_status_name(st),
                  kvt_status_str(st));
    return kvtpy_int(st);
}

/*
 * write_bytes_to_buffer / read_bytes_from_buffer copy between Python
 * objects and raw addresses, exactly as Mooncake's do: the address is
 * trusted (a wrong one crashes the process, as memcpy would).
 */
static PyObject *m_write_bytes_to_buffer(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"dest_address", "src_ptr", "length"};
    PyObject *a[3];
    uint64_t addr, len;
    Py_buffer view;

    if (kvtpy_args("write_bytes_to_buffer", args, nargs, kwnames, params, 3, 3,
                   a) < 0 ||
        kvtpy_u64(a[0], "dest_address", &addr) < 0 ||
        kvtpy_u64(a[2], "length", &len) < 0)
        return NULL;
    if (PyUnicode_Check(a[1])) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(a[1], &n);
        if (s == NULL)
            return NULL;
        if (len > (uint64_t)n) {
            PyErr_Format(PyExc_ValueError,
                         "length %llu exceeds the %zd bytes of the data",
                         (unsigned long long)len, n);
            return NULL;
        }
        if (len > 0 && addr == 0) {
            PyErr_SetString(PyExc_ValueError, "dest_address is 0");
            return NULL;
        }
        memcpy((void *)(uintptr_t)addr, s, (size_t)len);
        return kvtpy_int(0);
    }
    if (PyObject_GetBuffer(a[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (len > (uint64_t)view.len || (len > 0 && addr == 0)) {
        if (addr == 0)
            PyErr_SetString(PyExc_ValueError, "dest_address is 0");
        else
            PyErr_Format(PyExc_ValueError,
                         "length %llu exceeds the %zd bytes of the data",
                         (unsigned long long)len, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy((void *)(uintptr_t)addr, view.buf, (size_t)len);
    PyBuffer_Release(&view);
    return kvtpy_int(0);
}

static PyObject *m_read_bytes_from_buffer(PyObject *self, PyObject *const *args,
                                          Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"source_address", "length"};
    PyObject *a[2];
    uint64_t addr, len;

    if (kvtpy_args("read_bytes_from_buffer", args, nargs, kwnames, params, 2, 2,
                   a) < 0 ||
        kvtpy_u64(a[0], "source_address", &addr) < 0 ||
        kvtpy_u64(a[1], "length", &len) < 0)
        return NULL;
    if (len > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "length too large");
        return NULL;
    }
    if (len > 0 && addr == 0) {
        PyErr_SetString(PyExc_ValueError, "source_address is 0");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)(uintptr_t)addr,
                                     (Py_ssize_t)len);
}

/* ---- Initialisation ------------------------------------------------------ */

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

/*
 * Create the engine. @metadata is a full URI, or "p2p". In p2p mode the
 * port of @local_hostname is ignored and a free one is picked, as Mooncake
 * does, unless MC_LEGACY_RPC_PORT_BINDING is set; with a metadata server
 * the port, if given, is bound. Either way the segment is named
 * "host:rpc_port", the name inference engines build from get_rpc_port().
 */
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

static PyObject *m_initialize(PyObject *self, PyObject *const *args,
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

static PyObject *m_initialize_ext(PyObject *self, PyObject *const *args,
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

static PyObject *m_get_rpc_port(PyObject *self, PyObject *unused)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    return kvtpy_int(kvt_engine_rpc_port(e->engine));
}

/* ---- Metrics (kvt extension) ----------------------------------------------
 */

/* d[key] = v (an int); 0 or -1. */
static int put_u64(PyObject *d, const char *key, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int rc = o != NULL ? PyDict_SetItemString(d, key, o) : -1;

    Py_XDECREF(o);
    return rc;
}

/* {status name: count} of the non-zero entries of @v. */
static PyObject *by_status(const uint64_t *v)
{
    PyObject *d = PyDict_New();

    for (unsigned i = 1; d != NULL && i < KVT_STATS_STATUSES; i++) {
        if (v[i] != 0 && put_u64(d, kvt_status_name(-(int)i), v[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* d[key] = o, taking o's reference; 0 or -1. */
static int put_obj(PyObject *d, const char *key, PyObject *o)
{
    int rc = o != NULL ? PyDict_SetItemString(d, key, o) : -1;

    Py_XDECREF(o);
    return rc;
}

static PyObject *latency_dict(const kvt_transport_stats_t *t)
{
    static const char *const cls[KVT_STATS_SIZE_CLASSES] = {
        "le_4KiB", "le_64KiB", "le_1MiB", "gt_1MiB"};
    PyObject *d = PyDict_New();

    for (unsigned c = 0; d != NULL && c < KVT_STATS_SIZE_CLASSES; c++) {
        PyObject *h = PyDict_New(), *b = PyList_New(0);
        uint64_t cum = 0;
        int bad = h == NULL || b == NULL;
        for (unsigned k = 0; !bad && k < KVT_STATS_LATENCY_BUCKETS; k++) {
            uint64_t us = kvt_stats_latency_bound_us(k);
            PyObject *pair;
            cum += t->latency[c][k];
            pair = Py_BuildValue("(dK)", us ? (double)us / 1e6 : Py_HUGE_VAL,
                                 (unsigned long long)cum);
            bad = pair == NULL || PyList_Append(b, pair) < 0;
            Py_XDECREF(pair);
        }
        if (!bad)
            bad = put_obj(h, "buckets", b) < 0;
        else
            Py_XDECREF(b);
        if (!bad)
            bad = put_u64(h, "count", cum) < 0 ||
                  put_obj(h, "sum_seconds",
                          PyFloat_FromDouble((double)t->latency_sum_ns[c] /
                                             1e9)) < 0;
        if (bad || put_obj(d, cls[c], h) < 0) {
            if (bad)
                Py_XDECREF(h);
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyObject *m_get_metrics(PyObject *self, PyObject *unused)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    kvt_engine_stats_t *s;
    PyObject *d = NULL, *tls = NULL;
    kvt_status_t st;

    (void)unused;
    if (kvtpy_need_engine(e) < 0)
        return NULL;
    s = PyMem_Malloc(sizeof(*s));
    if (s == NULL)
        return PyErr_NoMemory();
    s->version = KVT_STATS_VERSION;
    st = kvt_engine_stats(e->engine, s);
    if (st != KVT_OK) {
        PyMem_Free(s);
        return kvtpy_raise(st, "get_metrics");
    }
    d = PyDict_New();
    tls = PyDict_New();
    if (d == NULL || tls == NULL)
        goto fail;
    if (put_u64(d, "batches", s->batches) < 0 ||
        put_u64(d, "descriptors", s->descriptors) < 0 ||
        put_u64(d, "inflight", s->inflight) < 0 ||
        put_obj(d, "refused", by_status(s->refused)) < 0 ||
        put_u64(d, "notifies_received", s->notifies_received) < 0 ||
        put_u64(d, "notifies_dropped", s->notifies_dropped) < 0 ||
        put_u64(d, "handshakes_refused", s->handshakes_refused) < 0 ||
        put_u64(d, "handshakes_failed", s->handshakes_failed) < 0 ||
        put_u64(d, "segments_open", s->segments_open) < 0 ||
        put_u64(d, "regions", s->regions) < 0 ||
        put_u64(d, "region_bytes", s->region_bytes) < 0)
        goto fail;
    for (unsigned i = 0; i < s->ntransports; i++) {
        const kvt_transport_stats_t *t = &s->transports[i];
        PyObject *x = PyDict_New();
        if (x == NULL || put_u64(x, "writes", t->writes) < 0 ||
            put_u64(x, "reads", t->reads) < 0 ||
            put_u64(x, "notifies", t->notifies) < 0 ||
            put_u64(x, "write_bytes", t->write_bytes) < 0 ||
            put_u64(x, "read_bytes", t->read_bytes) < 0 ||
            put_obj(x, "failures", by_status(t->failures)) < 0 ||
            put_obj(x, "latency", latency_dict(t)) < 0 ||
            put_u64(x, "sessions_opened", t->sessions_opened) < 0 ||
            put_u64(x, "sessions_open", t->sessions_open) < 0 ||
            put_obj(tls, t->name, x) < 0) {
            goto fail;
        }
    }
    if (put_obj(d, "transports", tls) < 0) {
        tls = NULL;
        goto fail;
    }
    PyMem_Free(s);
    return d;
fail:
    PyMem_Free(s);
    Py_XDECREF(d);
    Py_XDECREF(tls);
    return NULL;
}

static PyObject *m_get_metrics_text(PyObject *self, PyObject *unused)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    size_t len = 0;
    kvt_status_t st;
    PyObject *r;
    char *buf;

    (void)unused;
    if (kvtpy_need_engine(e) < 0)
        return NULL;
    for (;;) {
        st = kvt_engine_metrics_text(e->engine, NULL, 0, &len);
        if (st != KVT_ERR_NO_SPACE && st != KVT_OK)
            return kvtpy_raise(st, "get_metrics_text");
        buf = PyMem_Malloc(len + 4096);
        if (buf == NULL)
            return PyErr_NoMemory();
        st = kvt_engine_metrics_text(e->engine, buf, len + 4096, &len);
        if (st == KVT_OK)
            break;
        PyMem_Free(buf);
        if (st != KVT_ERR_NO_SPACE)
            return kvtpy_raise(st, "get_metrics_text");
    }
    r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
    PyMem_Free(buf);
    return r;
}

/* ---- Type ---------------------------------------------------------------- */

static PyObject *engine_new(PyTypeObject *type, PyObject *args,
                            PyObject *kwargs)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    kvtpy_engine_t *self = (kvtpy_engine_t *)alloc(type, 0);

    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->pool_lock, NULL);
    kvtpy_ids_init(&self->ids);
    return (PyObject *)self;
}

static int engine_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_Size(args) != 0 || (kwargs && PyDict_Size(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "TransferEngine() takes no "
                                         "arguments; call initialize()");
        return -1;
    }
    return 0;
}

static void engine_dealloc(PyObject *obj)
{
    kvtpy_engine_t *self = (kvtpy_engine_t *)obj;
    PyTypeObject *tp = Py_TYPE(obj);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);

    /* Destroying the engine cancels what is in flight and frees every
     * batch, the pooled ones and those behind ids included. It waits for
     * the engine's threads, which take the GIL to log (logging.getLogger
     * ("kvt")): released meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    kvt_engine_destroy(self->engine);
    Py_END_ALLOW_THREADS
    self->engine = NULL;
    kvtpy_ids_fini(&self->ids);
    pthread_mutex_destroy(&self->pool_lock);
    tp_free(obj);
    Py_DECREF(tp);
}

#define FAST(name, doc)                                                        \
    {                                                                          \
#name, (PyCFunction)(void (*)(void))m_##name,                          \
            METH_FASTCALL | METH_KEYWORDS, doc                                 \
    }
#define ONE(name, doc)                                                         \
    {                                                                          \
#name, m_##name, METH_O, doc                                           \
    }
#define NONE(name, doc)                                                        \
    {                                                                          \
#name, m_##name, METH_NOARGS, doc                                      \
    }
/* Methods defined in transfer.c. */
#define XFAST(name, doc)                                                       \
    {                                                                          \
#name, (PyCFunction)(void (*)(void))kvtpy_m_##name,                    \
            METH_FASTCALL | METH_KEYWORDS, doc                                 \
    }
#define XONE(name, doc)                                                        \
    {                                                                          \
#name, kvtpy_m_##name, METH_O, doc                                     \
    }

static PyMethodDef engine_methods[] = {
    FAST(initialize,
         "initialize(local_hostname, metadata_server, protocol, device_name)"
         " -> 0 or -1\n\nmetadata_server 'P2PHANDSHAKE' needs no server: "
         "peers are named host:rpc_port."),
    FAST(initialize_ext,
         "initialize_ext(local_hostname, metadata_server, protocol, "
         "device_name, metadata_type) -> 0 or -1"),
    NONE(get_rpc_port, "get_rpc_port() -> the port peers reach this engine "
                       "on"),
    FAST(register_memory,
         "register_memory(buffer_addr, capacity, location='*') -> 0 or a "
         "negative kvt status"),
    ONE(unregister_memory,
        "unregister_memory(buffer_addr) -> 0 or a negative kvt status"),
    FAST(batch_register_memory,
         "batch_register_memory(buffer_addresses, capacities, location='*')"
         " -> 0 or a negative kvt status (all or none are registered)"),
    ONE(batch_unregister_memory,
        "batch_unregister_memory(buffer_addresses) -> 0 or the first "
        "failure's negative kvt status"),
    ONE(allocate_managed_buffer,
        "allocate_managed_buffer(length) -> address of registered memory, or"
        " 0"),
    FAST(free_managed_buffer,
         "free_managed_buffer(buffer_addr, length) -> 0 or a negative kvt "
         "status"),
    FAST(write_bytes_to_buffer,
         "write_bytes_to_buffer(dest_address, src_ptr, length) -> 0\n\n"
         "Copies length bytes of src_ptr (bytes-like or str) to the "
         "address."),
    FAST(read_bytes_from_buffer,
         "read_bytes_from_buffer(source_address, length) -> bytes"),
    ONE(get_segment_transport,
        "get_segment_transport(segment_name) -> the transport that carries "
        "transfers to it ('tcp', 'shm', 'ucx'), or '' (kvt's own)"),
    ONE(get_first_buffer_address,
        "get_first_buffer_address(segment_name) -> address of the peer's "
        "lowest registered region, or 0"),
    XFAST(transfer_sync_write,
          "transfer_sync_write(target_hostname, buffer, peer_buffer_address, "
          "length, transport_hint='') -> 0 or -1"),
    XFAST(transfer_sync_read,
          "transfer_sync_read(target_hostname, buffer, peer_buffer_address, "
          "length, transport_hint='') -> 0 or -1"),
    XFAST(transfer_sync,
          "transfer_sync(target_hostname, buffer, peer_buffer_address, "
          "length, opcode, notify=None, transport_hint='') -> 0 or -1"),
    XFAST(batch_transfer_sync_write,
          "batch_transfer_sync_write(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, transport_hint='') -> 0 or -1"),
    XFAST(batch_transfer_sync_read,
          "batch_transfer_sync_read(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, transport_hint='') -> 0 or -1"),
    XFAST(batch_transfer_sync,
          "batch_transfer_sync(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, opcode, notify=None, "
          "transport_hint='') -> 0 or -1"),
    XFAST(batch_transfer_async_write,
          "batch_transfer_async_write(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, transport_hint='') -> batch id, "
          "or 0"),
    XFAST(batch_transfer_async_read,
          "batch_transfer_async_read(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, transport_hint='') -> batch id, "
          "or 0"),
    XFAST(batch_transfer_async,
          "batch_transfer_async(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, opcode, transport_hint='') -> "
          "batch id, or 0"),
    XFAST(transfer_submit_write,
          "transfer_submit_write(target_hostname, buffer, "
          "peer_buffer_address, length, transport_hint='') -> batch id, or "
          "0"),
    XONE(transfer_check_status,
         "transfer_check_status(batch_id) -> 1 completed, 0 pending, -1 "
         "failed, -2 timed out\n\nThe id is freed when it completed or "
         "failed."),
    XONE(get_batch_transfer_status,
         "get_batch_transfer_status(batch_ids) -> 0 if all completed, else "
         "-1\n\nWaits until every listed batch is final, then frees the "
         "ids."),
    NONE(get_notifies,
         "get_notifies() -> list of TransferNotify received since the last "
         "call"),
    XFAST(send_notify,
          "send_notify(target_hostname, notify) -> 0 or -1 (kvt extension)\n"
          "\nDelivered after every write this engine submitted to the target"
          " before it."),
    NONE(get_metrics,
         "get_metrics() -> dict of the engine's counters (kvt extension; "
         "docs/metrics.md)"),
    NONE(get_metrics_text,
         "get_metrics_text() -> the engine's metrics as Prometheus text "
         "(kvt extension)"),
    FAST(send_probe,
         "send_probe(peer_server_name) -> 0 if the peer answers, else -1"),
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_doc, (void *)"TransferEngine()\n\n"
                        "kvt's implementation of "
                        "mooncake.engine.TransferEngine. Call initialize() "
                        "before anything else."},
    {Py_tp_new, engine_new},
    {Py_tp_init, engine_init},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "kvt.TransferEngine",
    .basicsize = sizeof(kvtpy_engine_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = engine_slots,
};

PyTypeObject *kvtpy_engine_type_create(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &engine_spec, NULL);
}
