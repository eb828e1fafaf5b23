/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt._kvt.Room: a sender or receiver room of a Connector (connector.c),
 * which it keeps alive, and the reading of the block ids and aux slots
 * its calls take. Every call that may block (wait, close) releases the
 * GIL.
 */
#include "kvtpy.h"

#include <kvt/connector.h>

PyTypeObject *kvtpy_room_type;

/* Block ids from a buffer of 4- or 8-byte integers (array.array, numpy)
 * or any sequence of ints; *ids_p is malloc'd. */
static int ids_from(PyObject *o, uint32_t **ids_p, size_t *n_p)
{
    uint32_t *ids = NULL;
    Py_ssize_t n;
    Py_buffer view;

    if (PyObject_CheckBuffer(o) &&
        PyObject_GetBuffer(o, &view, PyBUF_FORMAT | PyBUF_ND) == 0) {
        const char *f = view.format ? view.format : "B";
        char code;
        int ok;
        if (*f == '<' || *f == '=' || *f == '@')
            f++;
        code = *f;
        ok = view.itemsize == 4 || view.itemsize == 8;
        ok = ok && f[1] == '\0' && strchr("iIlLqQ", code) != NULL;
        n = ok ? view.len / view.itemsize : 0;
        if (!ok) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError,
                            "block ids must be integers of 4 or 8 bytes");
            return -1;
        }
        ids = malloc((n ? n : 1) * sizeof(*ids));
        if (ids == NULL) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int is_signed = code == 'i' || code == 'l' || code == 'q';
            int64_t v;
            if (view.itemsize == 4 && is_signed)
                v = ((const int32_t *)view.buf)[i];
            else if (view.itemsize == 4)
                v = ((const uint32_t *)view.buf)[i];
            else if (is_signed)
                v = ((const int64_t *)view.buf)[i];
            else
                v = ((const uint64_t *)view.buf)[i] > UINT32_MAX
                        ? -1
                        : (int64_t)((const uint64_t *)view.buf)[i];
            if (v < 0 || v > (int64_t)UINT32_MAX) {
                PyBuffer_Release(&view);
                free(ids);
                PyErr_SetString(PyExc_ValueError, "block id out of range");
                return -1;
            }
            ids[i] = (uint32_t)v;
        }
        PyBuffer_Release(&view);
        *ids_p = ids;
        *n_p = (size_t)n;
        return 0;
    }
    PyErr_Clear();
    n = kvtpy_seq_len(o, "block ids");
    if (n < 0)
        return -1;
    ids = malloc((n ? n : 1) * sizeof(*ids));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (kvtpy_u64_item(o, i, "block id", &v) < 0 || v > UINT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "block id out of range");
            free(ids);
            return -1;
        }
        ids[i] = (uint32_t)v;
    }
    *ids_p = ids;
    *n_p = (size_t)n;
    return 0;
}

/* None -> no slot, an int -> one slot for every buffer, a sequence -> one
 * per buffer. *slots_p is malloc'd (or NULL). */
static int slots_from(PyObject *o, uint64_t **slots_p, size_t *n_p)
{
    uint64_t *s;
    Py_ssize_t n;

    *slots_p = NULL;
    *n_p = 0;
    if (o == NULL || o == Py_None)
        return 0;
    if (PyLong_Check(o) || PyIndex_Check(o)) {
        s = malloc(sizeof(*s));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (kvtpy_u64(o, "aux slot", s) < 0) {
            free(s);
            return -1;
        }
        *slots_p = s;
        *n_p = 1;
        return 0;
    }
    n = kvtpy_seq_len(o, "aux slots");
    if (n < 0)
        return -1;
    s = malloc((n ? n : 1) * sizeof(*s));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kvtpy_u64_item(o, i, "aux slot", &s[i]) < 0) {
            free(s);
            return -1;
        }
    }
    *slots_p = s;
    *n_p = (size_t)n;
    return 0;
}

static int need_room(kvtpy_room_t *self)
{
    if (self->room == NULL || self->owner->conn == NULL) {
        kvtpy_state_error("the room is closed");
        return -1;
    }
    return 0;
}

static void room_close_now(kvtpy_room_t *self)
{
    struct kvt_room *room = self->room;

    self->room = NULL;
    if (room == NULL || self->owner->conn == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS;
    kvt_room_destroy(room);
    Py_END_ALLOW_THREADS;
}

static void room_dealloc(PyObject *o)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    PyTypeObject *tp = Py_TYPE(o);

    room_close_now(self);
    Py_XDECREF((PyObject *)self->owner);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(o);
    Py_DECREF(tp);
}

static PyObject *room_close(PyObject *o, PyObject *unused)
{
    room_close_now((kvtpy_room_t *)o);
    Py_RETURN_NONE;
}

static PyObject *room_init_sender(PyObject *o, PyObject *args)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    unsigned long long n;
    PyObject *aux = Py_None;
    uint64_t *slots;
    size_t ns;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "K|O", &n, &aux) || need_room(self) < 0 ||
        slots_from(aux, &slots, &ns) < 0)
        return NULL;
    st = kvt_sender_init(self->room, n, slots, ns);
    free(slots);
    if (st != KVT_OK)
        return kvtpy_raise(st, "init");
    Py_RETURN_NONE;
}

static PyObject *room_init_receiver(PyObject *o, PyObject *args)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    PyObject *ids_o, *aux = Py_None;
    unsigned long long first = 0;
    uint32_t *ids;
    uint64_t *slots;
    size_t n, ns;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "O|KO", &ids_o, &first, &aux) ||
        need_room(self) < 0)
        return NULL;
    if (ids_from(ids_o, &ids, &n) < 0)
        return NULL;
    if (slots_from(aux, &slots, &ns) < 0) {
        free(ids);
        return NULL;
    }
    st = kvt_receiver_init(self->room, ids, n, first, slots, ns);
    free(ids);
    free(slots);
    if (st != KVT_OK)
        return kvtpy_raise(st, "init");
    Py_RETURN_NONE;
}

static PyObject *room_send(PyObject *o, PyObject *args)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    PyObject *ids_o;
    int is_last;
    unsigned long long step = 0;
    uint32_t *ids;
    size_t n;
    kvt_status_t st;

    if (!PyArg_ParseTuple(args, "Op|K", &ids_o, &is_last, &step) ||
        need_room(self) < 0 || ids_from(ids_o, &ids, &n) < 0)
        return NULL;
    st = kvt_sender_send_step(self->room, step, ids, n, is_last);
    free(ids);
    if (st != KVT_OK)
        return kvtpy_raise(st, "send");
    Py_RETURN_NONE;
}

static PyObject *room_poll(PyObject *o, PyObject *unused)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    if (need_room(self) < 0)
        return NULL;
    return PyLong_FromLong(kvt_room_poll(self->room));
}

static PyObject *room_info(PyObject *o, PyObject *unused)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    kvt_room_info_t info;

    if (need_room(self) < 0)
        return NULL;
    kvt_room_info(self->room, &info);
    return Py_BuildValue("(iss)", (int)info.state, kvt_status_name(info.error),
                         info.reason);
}

static PyObject *room_wait(PyObject *o, PyObject *args)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    double timeout = -1;
    kvt_poll_t s;

    if (!PyArg_ParseTuple(args, "|d", &timeout) || need_room(self) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    s = kvt_room_wait(self->room,
                      timeout < 0 ? -1 : (int64_t)(timeout * 1000.0));
    Py_END_ALLOW_THREADS;
    return PyLong_FromLong(s);
}

static PyObject *room_abort(PyObject *o, PyObject *args)
{
    kvtpy_room_t *self = (kvtpy_room_t *)o;
    const char *why = NULL;

    if (!PyArg_ParseTuple(args, "|z", &why) || need_room(self) < 0)
        return NULL;
    kvt_room_abort(self->room, why);
    Py_RETURN_NONE;
}

static PyMethodDef room_methods[] = {
    {"init_sender", room_init_sender, METH_VARARGS,
     "init_sender(num_blocks, aux_slots=None)"},
    {"init_receiver", room_init_receiver, METH_VARARGS,
     "init_receiver(block_ids, first_block=0, aux_slots=None)"},
    {"send", room_send, METH_VARARGS,
     "send(block_ids, is_last, step=0): a chunk (step 0: every layer is "
     "ready)"},
    {"poll", room_poll, METH_NOARGS, "poll() -> KVPoll value"},
    {"info", room_info, METH_NOARGS, "info() -> (state, error name, reason)"},
    {"wait", room_wait, METH_VARARGS,
     "wait(timeout_s=-1) -> state once final or at the timeout"},
    {"abort", room_abort, METH_VARARGS, "abort(reason=None)"},
    {"close", room_close, METH_NOARGS,
     "close(): release (aborts and waits if not final)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot room_slots[] = {
    {Py_tp_doc, (void *)"A sender or receiver room of a Connector."},
    {Py_tp_dealloc, room_dealloc},
    {Py_tp_methods, room_methods},
    {0, NULL},
};

PyType_Spec kvtpy_room_spec = {
    .name = "kvt.Room",
    .basicsize = sizeof(kvtpy_room_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = room_slots,
};

PyObject *kvtpy_room_wrap(kvtpy_conn_t *owner, struct kvt_room *room)
{
    kvtpy_room_t *r = PyObject_New(kvtpy_room_t, kvtpy_room_type);

    if (r == NULL) {
        Py_BEGIN_ALLOW_THREADS;
        kvt_room_destroy(room);
        Py_END_ALLOW_THREADS;
        return NULL;
    }
    Py_INCREF((PyObject *)owner);
    r->owner = owner;
    r->room = room;
    return (PyObject *)r;
}
