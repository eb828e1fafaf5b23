/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt._kvt.BootstrapServer: the connector's bootstrap server (kvt metad)
 * in this process. Starting and stopping it release the GIL.
 */
#include "kvtpy.h"

#include <kvt/connector.h>

typedef struct {
    PyObject_HEAD kvt_bootstrap_h server;
} boot_obj_t;

static PyObject *boot_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"port", "host", NULL};
    unsigned int port = 0;
    const char *host = NULL;
    boot_obj_t *self;
    kvt_status_t st;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Iz", kwlist, &port, &host))
        return NULL;
    if (port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return NULL;
    }
    self = (boot_obj_t *)PyType_GenericAlloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    st = kvt_bootstrap_start(host, (uint16_t)port, &self->server);
    Py_END_ALLOW_THREADS;
    if (st != KVT_OK) {
        self->server = NULL;
        Py_DECREF(self);
        return kvtpy_raise(st, "starting the bootstrap server");
    }
    return (PyObject *)self;
}

static void boot_close_now(boot_obj_t *self)
{
    kvt_bootstrap_h s = self->server;

    self->server = NULL;
    if (s == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS;
    kvt_bootstrap_stop(s);
    Py_END_ALLOW_THREADS;
}

static void boot_dealloc(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    boot_close_now((boot_obj_t *)o);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(o);
    Py_DECREF(tp);
}

static PyObject *boot_port(PyObject *o, PyObject *unused)
{
    boot_obj_t *self = (boot_obj_t *)o;
    return PyLong_FromLong(self->server ? kvt_bootstrap_port(self->server) : 0);
}

static PyObject *boot_close(PyObject *o, PyObject *unused)
{
    boot_close_now((boot_obj_t *)o);
    Py_RETURN_NONE;
}

static PyMethodDef boot_methods[] = {
    {"port", boot_port, METH_NOARGS, "port() -> the port it listens on"},
    {"close", boot_close, METH_NOARGS, "close(): stop the server"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot boot_slots[] = {
    {Py_tp_doc, (void *)"BootstrapServer(port=0, host=None): kvt metad in "
                        "this process."},
    {Py_tp_new, boot_new},
    {Py_tp_dealloc, boot_dealloc},
    {Py_tp_methods, boot_methods},
    {0, NULL},
};

PyType_Spec kvtpy_boot_spec = {
    .name = "kvt.BootstrapServer",
    .basicsize = sizeof(boot_obj_t),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = boot_slots,
};
