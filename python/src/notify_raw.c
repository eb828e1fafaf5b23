/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Raw notifications of TransferEngine, for the NIXL agent (kvt.nixl):
 * payloads sent and received as they are, without the Mooncake-style
 * packing of get_notifies()/send_notify(); kvt.nixl puts its own header
 * (the sending agent's name, fragments of long messages) inside.
 */
#define PY_SSIZE_T_CLEAN
#include "kvtpy.h"

/* _notify_send_raw(target, payload) -> 0 or a negative kvt status. Blocks
 * (without the GIL) at most the transfer timeout. */
PyObject *kvtpy_m__notify_send_raw(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"target", "payload"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    PyObject *a[2];
    const char *target;
    char *p;
    Py_ssize_t len;
    kvt_segment_t seg;
    kvt_status_t st;

    if (kvtpy_args("_notify_send_raw", args, nargs, kwnames, params, 2, 2, a) <
            0 ||
        kvtpy_need_engine(e) < 0)
        return NULL;
    target = kvtpy_cstr(a[0], "target");
    if (target == NULL)
        return NULL;
    if (!PyBytes_Check(a[1])) {
        PyErr_SetString(PyExc_TypeError, "payload: bytes expected");
        return NULL;
    }
    if (PyBytes_AsStringAndSize(a[1], &p, &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, target, &seg);
    if (st == KVT_OK)
        st = kvt_notify_send(e->engine, seg, p, (size_t)len);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)st);
}

#define RAW_CHUNK 64

/* _notify_recv_raw(timeout_ms=0) -> list of (sender segment, payload),
 * oldest first; sleeps up to the timeout (GIL released) when none is
 * queued. */
PyObject *kvtpy_m__notify_recv_raw(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"timeout_ms"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    PyObject *a[1], *list = NULL;
    kvt_notify_t *buf;
    long long tmo = 0;
    size_t got;
    kvt_status_t st;

    if (kvtpy_args("_notify_recv_raw", args, nargs, kwnames, params, 0, 1, a) <
            0 ||
        kvtpy_need_engine(e) < 0)
        return NULL;
    if (a[0] != NULL) {
        tmo = PyLong_AsLongLong(a[0]);
        if (tmo == -1 && PyErr_Occurred())
            return NULL;
    }
    buf = malloc(RAW_CHUNK * sizeof(*buf));
    if (buf == NULL)
        return PyErr_NoMemory();
    list = PyList_New(0);
    if (list == NULL)
        goto out;
    do {
        Py_BEGIN_ALLOW_THREADS
        st = kvt_notify_recv(e->engine, buf, RAW_CHUNK, &got, tmo);
        Py_END_ALLOW_THREADS
        tmo = 0;
        if (st != KVT_OK)
            break;
        for (size_t i = 0; i < got; i++) {
            PyObject *t = Py_BuildValue("(sy#)", buf[i].from, buf[i].data,
                                        (Py_ssize_t)buf[i].length);
            if (t == NULL || PyList_Append(list, t) < 0) {
                Py_XDECREF(t);
                Py_CLEAR(list);
                goto out;
            }
            Py_DECREF(t);
        }
    } while (got == RAW_CHUNK);
out:
    free(buf);
    return list;
}
