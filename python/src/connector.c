/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt._kvt.Connector: the thin C layer under kvt.connector
 * (python/kvt/connector.py), which gives it SGLang's shape, and the
 * registration of the connector's types (Connector, Room in
 * connector_room.c, BootstrapServer in connector_boot.c). A Connector
 * owns its own engine and kvt_conn_h. Every call that may block
 * (creation, wait, destroy) releases the GIL.
 */
#include "kvtpy.h"

#include <stdio.h>

#include <kvt/connector.h>

/* Raise the kvt.Error subclass that fits a kvt status. */
static PyObject *raise_status(const char *what, kvt_status_t st)
{
    return kvtpy_raise(st, what);
}

/* An unsigned value of item @i of a tuple-like sequence. */
static int item_u64(PyObject *seq, Py_ssize_t i, const char *what, uint64_t *v)
{
    return kvtpy_u64_item(seq, i, what, v);
}

/* ---- Connector --------------------------------------------------------- */

static int parse_caches(PyObject *list, kvt_kv_cache_t **out_p, size_t *n_p)
{
    Py_ssize_t n = kvtpy_seq_len(list, "caches");
    kvt_kv_cache_t *c;

    if (n < 0)
        return -1;
    c = calloc(n ? n : 1, sizeof(*c));
    if (c == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_GetItem(list, i);
        uint64_t v[9];
        int bad = t == NULL || kvtpy_seq_len(t, "a cache") != 9;
        for (int k = 0; !bad && k < 9; k++)
            bad = item_u64(t, k, "a cache field", &v[k]) < 0;
        Py_XDECREF(t);
        if (bad || v[0] > UINT32_MAX || v[1] > UINT32_MAX ||
            v[2] > UINT32_MAX || v[3] > UINT32_MAX || v[4] > UINT32_MAX ||
            v[5] > UINT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError,
                                "a cache is (layer, kind, block_layout, "
                                "tokens_per_block, heads, head_bytes, base, "
                                "block_bytes, num_blocks)");
            free(c);
            return -1;
        }
        c[i] = (kvt_kv_cache_t){
            (uint32_t)v[0],          (uint32_t)v[1], (uint32_t)v[2],
            (uint32_t)v[3],          (uint32_t)v[4], (uint32_t)v[5],
            (void *)(uintptr_t)v[6], v[7],           v[8]};
    }
    *out_p = c;
    *n_p = (size_t)n;
    return 0;
}

static int parse_aux(PyObject *list, kvt_aux_buffer_t **out_p, size_t *n_p)
{
    Py_ssize_t n = list == NULL || list == Py_None
                       ? 0
                       : kvtpy_seq_len(list, "aux buffers");
    kvt_aux_buffer_t *a;

    if (n < 0)
        return -1;
    a = calloc(n ? n : 1, sizeof(*a));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_GetItem(list, i);
        uint64_t v[3];
        int bad = t == NULL || kvtpy_seq_len(t, "an aux buffer") != 3;
        for (int k = 0; !bad && k < 3; k++)
            bad = item_u64(t, k, "an aux field", &v[k]) < 0;
        Py_XDECREF(t);
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError,
                                "an aux buffer is (base, item_bytes, "
                                "count)");
            free(a);
            return -1;
        }
        a[i] = (kvt_aux_buffer_t){(void *)(uintptr_t)v[0], v[1], v[2]};
    }
    *out_p = a;
    *n_p = (size_t)n;
    return 0;
}

/*
 * "tcp,shm" -> KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, by the names
 * kvt_transports() gives. NULL or "" leaves the engine's default (0 here).
 * -1 with ValueError naming the unknown transport.
 */
static int parse_transports(const char *names, uint32_t *bits_p)
{
    kvt_transport_info_t t[16];
    size_t n = 0;
    uint32_t bits = 0;
    const char *s = names;

    *bits_p = 0;
    if (names == NULL || *names == '\0')
        return 0;
    if (kvt_transports(t, 16, &n) != KVT_OK)
        n = 0;
    while (*s != '\0') {
        size_t len = strcspn(s, ",");
        size_t i;

        for (i = 0; i < n && i < 16; i++)
            if (strlen(t[i].name) == len && strncmp(t[i].name, s, len) == 0)
                break;
        if (i == n || i == 16) {
            char name[64];

            /* PyErr_Format() knows no precision. */
            snprintf(name, sizeof(name), "%.*s", (int)len, s);
            PyErr_Format(PyExc_ValueError,
                         "transports: unknown transport '%s' in '%s'", name,
                         names);
            return -1;
        }
        bits |= t[i].id;
        s += len;
        if (*s == ',')
            s++;
    }
    *bits_p = bits;
    return 0;
}

static PyObject *conn_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"role",
                             "caches",
                             "num_layers",
                             "num_draft_layers",
                             "aux",
                             "bootstrap_addr",
                             "tp_rank",
                             "tp_size",
                             "dp_rank",
                             "dp_size",
                             "local_host",
                             "bootstrap_timeout_ms",
                             "waiting_timeout_ms",
                             "transfer_timeout_ms",
                             "heartbeat_ms",
                             "peer_timeout_ms",
                             "submit_interval",
                             "register_ttl_s",
                             "transports",
                             NULL};
    const char *role = NULL, *boot = NULL, *host = "127.0.0.1";
    const char *tls = NULL;
    uint32_t tl_bits = 0;
    PyObject *caches = NULL, *aux = NULL;
    unsigned int nl = 0, nd = 0, tpr = 0, tps = 1, dpr = 0, dps = 1;
    unsigned long long bto = 0, wto = 0, xto = 0, hb = 0, pto = 0;
    unsigned int interval = 0;
    int ttl = -1;
    kvt_kv_layout_t lay = {0};
    kvt_kv_cache_t *c = NULL;
    kvt_aux_buffer_t *a = NULL;
    kvt_conn_params_t p = {0};
    kvt_engine_params_t ep = {0};
    kvtpy_conn_t *self = NULL;
    char why[256];
    kvt_status_t st;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOI|IOzIIIIsKKKKKIiz", kwlist,
                                     &role, &caches, &nl, &nd, &aux, &boot,
                                     &tpr, &tps, &dpr, &dps, &host, &bto, &wto,
                                     &xto, &hb, &pto, &interval, &ttl, &tls))
        return NULL;
    if (parse_transports(tls, &tl_bits) < 0)
        return NULL;
    if (strcmp(role, "prefill") != 0 && strcmp(role, "decode") != 0) {
        PyErr_SetString(PyExc_ValueError, "role must be 'prefill' or 'decode'");
        return NULL;
    }
    if (parse_caches(caches, &c, &lay.num_caches) < 0 ||
        parse_aux(aux, &a, &lay.num_aux) < 0)
        goto out;
    lay.num_layers = nl;
    lay.num_draft_layers = nd;
    lay.caches = c;
    lay.aux = a;
    if (kvt_kv_layout_check(&lay, why, sizeof(why)) != KVT_OK) {
        PyErr_Format(PyExc_ValueError, "invalid KV layout: %s", why);
        goto out;
    }
    self = (kvtpy_conn_t *)PyType_GenericAlloc(type, 0);
    if (self == NULL)
        goto out;
    self->role = role[0] == 'p' ? KVT_ROLE_PREFILL : KVT_ROLE_DECODE;
    ep.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST;
    ep.local_host = host;
    if (tl_bits != 0) {
        ep.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        ep.transports = tl_bits;
    }
    p.field_mask = KVT_CONN_PARAM_ROLE | KVT_CONN_PARAM_ENGINE |
                   KVT_CONN_PARAM_LAYOUT | KVT_CONN_PARAM_TP_RANK |
                   KVT_CONN_PARAM_TP_SIZE | KVT_CONN_PARAM_DP_RANK |
                   KVT_CONN_PARAM_DP_SIZE;
    p.role = self->role;
    p.layout = &lay;
    p.tp_rank = tpr;
    p.tp_size = tps;
    p.dp_rank = dpr;
    p.dp_size = dps;
#define OPT(bit, field, v)                                                     \
    if (v) {                                                                   \
        p.field_mask |= bit;                                                   \
        p.field = v;                                                           \
    }
    OPT(KVT_CONN_PARAM_BOOTSTRAP_TIMEOUT, bootstrap_timeout_ms, bto)
    OPT(KVT_CONN_PARAM_WAITING_TIMEOUT, waiting_timeout_ms, wto)
    OPT(KVT_CONN_PARAM_TRANSFER_TIMEOUT, transfer_timeout_ms, xto)
    OPT(KVT_CONN_PARAM_HEARTBEAT, heartbeat_ms, hb)
    OPT(KVT_CONN_PARAM_PEER_TIMEOUT, peer_timeout_ms, pto)
    OPT(KVT_CONN_PARAM_SUBMIT_INTERVAL, submit_interval, interval)
#undef OPT
    if (ttl >= 0) {
        p.field_mask |= KVT_CONN_PARAM_REGISTER_TTL;
        p.register_ttl_s = (uint32_t)ttl;
    }
    if (boot != NULL && *boot != '\0') {
        p.field_mask |= KVT_CONN_PARAM_BOOTSTRAP_ADDR;
        p.bootstrap_addr = boot;
    }
    Py_BEGIN_ALLOW_THREADS;
    st = kvt_engine_create(&ep, &self->engine);
    if (st == KVT_OK) {
        p.engine = self->engine;
        st = kvt_conn_create(&p, &self->conn);
        if (st != KVT_OK) {
            kvt_engine_destroy(self->engine);
            self->engine = NULL;
        }
    }
    Py_END_ALLOW_THREADS;
    if (st != KVT_OK) {
        raise_status("creating the connector", st);
        Py_CLEAR(self);
    }
out:
    free(c);
    free(a);
    return (PyObject *)self;
}

static void conn_close_now(kvtpy_conn_t *self)
{
    kvt_conn_h conn = self->conn;
    kvt_engine_h eng = self->engine;

    self->conn = NULL;
    self->engine = NULL;
    if (conn == NULL && eng == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS;
    kvt_conn_destroy(conn);
    kvt_engine_destroy(eng);
    Py_END_ALLOW_THREADS;
}

static void conn_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    conn_close_now((kvtpy_conn_t *)o);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(o);
    Py_DECREF(tp);
}

static int need_conn(kvtpy_conn_t *self)
{
    if (self->conn == NULL) {
        kvtpy_state_error("the connector is closed");
        return -1;
    }
    return 0;
}

static PyObject *conn_close(PyObject *o, PyObject *unused)
{
    conn_close_now((kvtpy_conn_t *)o);
    Py_RETURN_NONE;
}

static PyObject *conn_segment_name(PyObject *o, PyObject *unused)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    if (need_conn(self) < 0)
        return NULL;
    return PyUnicode_FromString(kvt_engine_segment_name(self->engine));
}

/* get_metrics(): the rooms by state, the time spent in states and the
 * prefill tail, as a dict. */
static PyObject *conn_get_metrics(PyObject *o, PyObject *unused)
{
    static const char *const names[5] = {"failed", "bootstrapping",
                                         "waiting_for_input", "transferring",
                                         "success"};
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    kvt_conn_stats_t s = {.version = KVT_STATS_VERSION};
    PyObject *d, *states, *tail;
    kvt_status_t st;
    uint64_t cum = 0;

    (void)unused;
    if (need_conn(self) < 0)
        return NULL;
    st = kvt_conn_stats(self->conn, &s);
    if (st != KVT_OK)
        return raise_status("get_metrics", st);
    states = PyDict_New();
    tail = PyList_New(0);
    for (unsigned i = 0; states != NULL && i < 5; i++) {
        PyObject *x =
            Py_BuildValue("{sKsKsKsd}", "rooms", (unsigned long long)s.rooms[i],
                          "entered", (unsigned long long)s.entered[i], "left",
                          (unsigned long long)s.left[i], "seconds",
                          (double)s.state_ns[i] / 1e9);
        if (x == NULL || PyDict_SetItemString(states, names[i], x) < 0) {
            Py_XDECREF(x);
            Py_CLEAR(states);
            break;
        }
        Py_DECREF(x);
    }
    for (unsigned b = 0; tail != NULL && b < KVT_STATS_LATENCY_BUCKETS; b++) {
        uint64_t us = kvt_stats_latency_bound_us(b);
        PyObject *pair;
        cum += s.tail[b];
        pair = Py_BuildValue("(dK)", us ? (double)us / 1e6 : Py_HUGE_VAL,
                             (unsigned long long)cum);
        if (pair == NULL || PyList_Append(tail, pair) < 0) {
            Py_XDECREF(pair);
            Py_CLEAR(tail);
            break;
        }
        Py_DECREF(pair);
    }
    if (states == NULL || tail == NULL) {
        Py_XDECREF(states);
        Py_XDECREF(tail);
        return NULL;
    }
    d = Py_BuildValue("{sNs{sNsdsK}}", "states", states, "tail", "buckets",
                      tail, "sum_seconds", (double)s.tail_sum_ns / 1e9, "count",
                      (unsigned long long)s.tails);
    return d;
}

static PyObject *conn_step_begin(PyObject *o, PyObject *unused)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    uint64_t step;
    kvt_status_t st;

    if (need_conn(self) < 0)
        return NULL;
    st = kvt_conn_step_begin(self->conn, &step);
    if (st != KVT_OK)
        return raise_status("step_begin", st);
    return PyLong_FromUnsignedLongLong(step);
}

static PyObject *conn_layer_ready(PyObject *o, PyObject *args)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    unsigned long long step;
    unsigned int layer;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "KI", &step, &layer) || need_conn(self) < 0)
        return NULL;
    st = kvt_conn_layer_ready(self->conn, step, layer);
    if (st != KVT_OK)
        return raise_status("layer_ready", st);
    Py_RETURN_NONE;
}

static PyObject *conn_step_end(PyObject *o, PyObject *args)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    unsigned long long step;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "K", &step) || need_conn(self) < 0)
        return NULL;
    st = kvt_conn_step_end(self->conn, step);
    if (st != KVT_OK)
        return raise_status("step_end", st);
    Py_RETURN_NONE;
}

static PyObject *conn_sender(PyObject *o, PyObject *args)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    unsigned long long id;
    struct kvt_room *room;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "K", &id) || need_conn(self) < 0)
        return NULL;
    st = kvt_sender_create(self->conn, NULL, id, &room);
    if (st != KVT_OK)
        return raise_status("creating the sender", st);
    return kvtpy_room_wrap(self, room);
}

static PyObject *conn_receiver(PyObject *o, PyObject *args)
{
    kvtpy_conn_t *self = (kvtpy_conn_t *)o;
    unsigned long long id;
    const char *boot = NULL;
    long long group = -1;
    struct kvt_room *room;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "K|zL", &id, &boot, &group) ||
        need_conn(self) < 0)
        return NULL;
    st = kvt_receiver_create(self->conn, boot, id, group, &room);
    if (st != KVT_OK)
        return raise_status("creating the receiver", st);
    return kvtpy_room_wrap(self, room);
}

static PyMethodDef conn_methods[] = {
    {"close", conn_close, METH_NOARGS,
     "close(): abort what is not final, stop, free (rooms become "
     "unusable)"},
    {"segment_name", conn_segment_name, METH_NOARGS,
     "segment_name() -> the engine's segment name (host:port)"},
    {"get_metrics", conn_get_metrics, METH_NOARGS,
     "get_metrics() -> dict: rooms by state, time in each state, the "
     "prefill tail (kvt extension)"},
    {"step_begin", conn_step_begin, METH_NOARGS,
     "step_begin() -> id of a new forward step (prefill)"},
    {"layer_ready", conn_layer_ready, METH_VARARGS,
     "layer_ready(step, layer): layers 0..layer of step are computed"},
    {"step_end", conn_step_end, METH_VARARGS,
     "step_end(step): every layer and the aux items of step are ready"},
    {"sender", conn_sender, METH_VARARGS, "sender(room) -> Room (prefill)"},
    {"receiver", conn_receiver, METH_VARARGS,
     "receiver(room, bootstrap_addr=None, dp_group=-1) -> Room (decode)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot conn_slots[] = {
    {Py_tp_doc, (void *)"Connector(role, caches, num_layers, ...): a kvt "
                        "KV connector with its own engine (see "
                        "kvt.connector)."},
    {Py_tp_new, conn_new},
    {Py_tp_dealloc, conn_dealloc},
    {Py_tp_methods, conn_methods},
    {0, NULL},
};

static PyType_Spec conn_spec = {
    .name = "kvt.Connector",
    .basicsize = sizeof(kvtpy_conn_t),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = conn_slots,
};

/* ---- Module ------------------------------------------------------------ */

static int add_type(PyObject *m, const char *name, PyType_Spec *spec,
                    PyTypeObject **type_p)
{
    PyObject *t = PyType_FromModuleAndSpec(m, spec, NULL);
    int rc;

    if (t == NULL)
        return -1;
    rc = PyModule_AddObjectRef(m, name, t);
    if (rc == 0 && type_p != NULL)
        *type_p = (PyTypeObject *)t; /* the module keeps it alive */
    Py_DECREF(t);
    return rc;
}

int kvtpy_connector_init(PyObject *m)
{
    if (add_type(m, "Connector", &conn_spec, NULL) < 0 ||
        add_type(m, "Room", &kvtpy_room_spec, &kvtpy_room_type) < 0 ||
        add_type(m, "BootstrapServer", &kvtpy_boot_spec, NULL) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "CACHE_K", KVT_CACHE_K) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_V", KVT_CACHE_V) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_LATENT", KVT_CACHE_LATENT) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_K_SCALE", KVT_CACHE_K_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_V_SCALE", KVT_CACHE_V_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_LATENT_SCALE",
                                KVT_CACHE_LATENT_SCALE) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_KV", KVT_CACHE_KV) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_TOKEN_MAJOR", KVT_BLOCK_TOKEN_MAJOR) <
            0 ||
        PyModule_AddIntConstant(m, "BLOCK_HEAD_MAJOR", KVT_BLOCK_HEAD_MAJOR) <
            0)
        return -1;
    return 0;
}
