/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt.TransferEngine: the type, its method table, and the methods small
 * enough to need no file of their own (notifications received, probes,
 * the rpc port). Initialisation is in engine_args.c, memory in
 * engine_mem.c, metrics in engine_metrics.c, transfers in transfer.c.
 * Every method keeps the name, argument order, defaults and return
 * convention of mooncake.engine.TransferEngine.
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
 * The route of host-memory transfers to the segment named by @arg, opening
 * it if need be: its transport's name ("tcp", "shm", "ucx"), or with
 * @reason why it and not the others (kvt_segment_transport_reason()); ""
 * when the segment cannot be opened (the log says why).
 */
static PyObject *segment_route(PyObject *self, PyObject *arg, int reason)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    char out[512] = "";
    const char *name, *t = NULL;
    kvt_segment_t seg;
    kvt_status_t st;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(arg, "segment_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK && reason)
        st = kvt_segment_transport_reason(e->engine, seg, KVT_MEM_HOST,
                                          KVT_MEM_HOST, out, sizeof(out));
    else if (st == KVT_OK && kvt_segment_transport(e->engine, seg, KVT_MEM_HOST,
                                                   KVT_MEM_HOST, &t) == KVT_OK)
        snprintf(out, sizeof(out), "%s", t);
    if (st != KVT_OK)
        out[0] = '\0';
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(out);
}

/* get_segment_transport(segment) (kvt's own): segment_route(). */
static PyObject *m_get_segment_transport(PyObject *self, PyObject *arg)
{
    return segment_route(self, arg, 0);
}

/* get_segment_transport_reason(segment) (kvt's own): segment_route(). */
static PyObject *m_get_segment_transport_reason(PyObject *self, PyObject *arg)
{
    return segment_route(self, arg, 1);
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

static PyObject *m_get_rpc_port(PyObject *self, PyObject *unused)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    return kvtpy_int(kvt_engine_rpc_port(e->engine));
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
    /* Transfers still queued on streams keep the state alive. */
    kvtpy_cuda_state_unref(self->cuda);
    self->cuda = NULL;
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
/* Methods defined in engine_args.c, engine_mem.c, engine_metrics.c and
 * transfer.c. */
#define XFAST(name, doc)                                                       \
    {                                                                          \
#name, (PyCFunction)(void (*)(void))kvtpy_m_##name,                    \
            METH_FASTCALL | METH_KEYWORDS, doc                                 \
    }
#define XONE(name, doc)                                                        \
    {                                                                          \
#name, kvtpy_m_##name, METH_O, doc                                     \
    }

#define XNONE(name, doc)                                                       \
    {                                                                          \
#name, kvtpy_m_##name, METH_NOARGS, doc                                \
    }

static PyMethodDef engine_methods[] = {
    XFAST(initialize,
          "initialize(local_hostname, metadata_server, protocol, device_name)"
          " -> 0 or -1\n\nmetadata_server 'P2PHANDSHAKE' needs no server: "
          "peers are named host:rpc_port."),
    XFAST(initialize_ext,
          "initialize_ext(local_hostname, metadata_server, protocol, "
          "device_name, metadata_type) -> 0 or -1"),
    NONE(get_rpc_port, "get_rpc_port() -> the port peers reach this engine "
                       "on"),
    XFAST(register_memory,
          "register_memory(buffer_addr, capacity, location='*') -> 0 or a "
          "negative kvt status"),
    XONE(unregister_memory,
         "unregister_memory(buffer_addr) -> 0 or a negative kvt status"),
    XFAST(batch_register_memory,
          "batch_register_memory(buffer_addresses, capacities, location='*')"
          " -> 0 or a negative kvt status (all or none are registered)"),
    XONE(batch_unregister_memory,
         "batch_unregister_memory(buffer_addresses) -> 0 or the first "
         "failure's negative kvt status"),
    XONE(allocate_managed_buffer,
         "allocate_managed_buffer(length) -> address of registered memory, or"
         " 0"),
    XFAST(free_managed_buffer,
          "free_managed_buffer(buffer_addr, length) -> 0 or a negative kvt "
          "status"),
    XFAST(write_bytes_to_buffer,
          "write_bytes_to_buffer(dest_address, src_ptr, length) -> 0\n\n"
          "Copies length bytes of src_ptr (bytes-like or str) to the "
          "address."),
    XFAST(read_bytes_from_buffer,
          "read_bytes_from_buffer(source_address, length) -> bytes"),
    ONE(get_segment_transport,
        "get_segment_transport(segment_name) -> the transport that carries "
        "transfers to it ('tcp', 'shm', 'ucx'), or '' (kvt's own)"),
    ONE(get_segment_transport_reason,
        "get_segment_transport_reason(segment_name) -> why that transport "
        "carries host-memory transfers to it and the others do not, or '' "
        "(kvt's own)"),
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
    XNONE(get_metrics,
          "get_metrics() -> dict of the engine's counters (kvt extension; "
          "docs/metrics.md)"),
    XNONE(get_metrics_text,
          "get_metrics_text() -> the engine's metrics as Prometheus text "
          "(kvt extension)"),
    XFAST(_post,
          "_post(target, op, local_addrs, remote_addrs, lengths, notifs=()) "
          "-> kvt.Post (the NIXL agent's transfers; kvt.nixl)"),
    XFAST(_notify_send_raw,
          "_notify_send_raw(target, payload) -> 0 or a negative kvt status"),
    XFAST(_notify_recv_raw,
          "_notify_recv_raw(timeout_ms=0) -> list of (sender, payload)"),
    FAST(send_probe,
         "send_probe(peer_server_name) -> 0 if the peer answers, else -1"),
    XFAST(transfer_write_on_cuda,
          "transfer_write_on_cuda(target_hostname, buffer, "
          "peer_buffer_address, length, stream_ptr=0, transport_hint='') -> "
          "None\n\nThe write starts once the work queued on the CUDA stream "
          "before it is done; the stream's later work waits for it."),
    XFAST(transfer_read_on_cuda,
          "transfer_read_on_cuda(target_hostname, buffer, "
          "peer_buffer_address, length, stream_ptr=0, transport_hint='') -> "
          "None\n\nAs transfer_write_on_cuda, reading."),
    XFAST(batch_transfer_write_on_cuda,
          "batch_transfer_write_on_cuda(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, stream_ptr=0, transport_hint='')"
          " -> None"),
    XFAST(batch_transfer_read_on_cuda,
          "batch_transfer_read_on_cuda(target_hostname, buffers, "
          "peer_buffer_addresses, lengths, stream_ptr=0, transport_hint='')"
          " -> None"),
    XNONE(get_engine_ptr,
          "get_engine_ptr() -> the address of kvt's engine (a kvt_engine_h;"
          " 0 before initialize)"),
    XNONE(get_engine, "get_engine(): refused (Mooncake's C++ engine object)"),
    XFAST(get_local_topology,
          "get_local_topology(device_name=None) -> JSON: for each location "
          "(cpu:N, cuda:N), [preferred NICs, other NICs]"),
    XFAST(warmup_efa_segment,
          "warmup_efa_segment(segment_name) -> 0 or -1\n\nOpens the segment "
          "(handshake and connections) ahead of the first transfer."),
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
