/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TransferNotify, and how a (name, msg) pair travels in one kvt
 * notification.
 *
 * Mooncake's notifications carry two strings chosen by the sender, a name
 * and a message. A kvt notification carries one payload of at most
 * KVT_NOTIFY_MAX bytes plus the sender's segment name. The binding packs
 * the pair into the payload behind a marker that text never starts with:
 *
 *     "\0MCN" | name length (u16, little endian) | name | msg
 *
 * A payload without the marker (sent by the C API or the connector) is
 * presented as name = the sender's segment name, msg = the payload, so
 * Python code can read notifications from any kvt peer.
 */
#include "kvtpy.h"

#include <structmember.h>

#include "notify_pack.h"

#define NOTIFY_MAGIC KVTPY_NOTIFY_MAGIC
#define NOTIFY_MAGIC_LEN KVTPY_NOTIFY_MAGIC_LEN
#define NOTIFY_HDR_LEN KVTPY_NOTIFY_HDR_LEN

typedef struct {
    PyObject_HEAD PyObject *name;
    PyObject *msg;
} notify_obj;

/* What field_bytes() below can send: str, bytes or another bytes-like. */
static int is_text(PyObject *v)
{
    return PyUnicode_Check(v) || PyBytes_Check(v) || PyObject_CheckBuffer(v);
}

static int notify_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"name", "msg", NULL};
    notify_obj *n = (notify_obj *)self;
    PyObject *name = NULL, *msg = NULL, *old;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:TransferNotify", kwlist,
                                     &name, &msg))
        return -1;
    /* Refused here, as Mooncake's constructor refuses them, rather than
     * at the first send. */
    if ((name != NULL && !is_text(name)) || (msg != NULL && !is_text(msg))) {
        PyErr_SetString(PyExc_TypeError,
                        "TransferNotify: name and msg must be str or bytes");
        return -1;
    }
    if (name == NULL)
        name = PyUnicode_FromString("");
    else
        Py_INCREF(name);
    if (msg == NULL)
        msg = PyUnicode_FromString("");
    else
        Py_INCREF(msg);
    if (name == NULL || msg == NULL) {
        Py_XDECREF(name);
        Py_XDECREF(msg);
        return -1;
    }
    old = n->name;
    n->name = name;
    Py_XDECREF(old);
    old = n->msg;
    n->msg = msg;
    Py_XDECREF(old);
    return 0;
}

static int notify_traverse(PyObject *self, visitproc visit, void *arg)
{
    notify_obj *n = (notify_obj *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(n->name);
    Py_VISIT(n->msg);
    return 0;
}

static int notify_clear(PyObject *self)
{
    notify_obj *n = (notify_obj *)self;
    Py_CLEAR(n->name);
    Py_CLEAR(n->msg);
    return 0;
}

static void notify_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);

    PyObject_GC_UnTrack(self);
    notify_clear(self);
    tp_free(self);
    Py_DECREF(tp);
}

static PyObject *notify_repr(PyObject *self)
{
    notify_obj *n = (notify_obj *)self;
    return PyUnicode_FromFormat("TransferNotify(name=%R, msg=%R)",
                                n->name ? n->name : Py_None,
                                n->msg ? n->msg : Py_None);
}

static PyMemberDef notify_members[] = {
    {"name", T_OBJECT_EX, offsetof(notify_obj, name), 0,
     "the notification's name, chosen by the sender"},
    {"msg", T_OBJECT_EX, offsetof(notify_obj, msg), 0,
     "the notification's message"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot notify_slots[] = {
    {Py_tp_doc,
     (void *)"TransferNotify(name='', msg='')\n\n"
             "A notification: sent with transfer_sync(..., notify=) or "
             "batch_transfer_sync(..., notify=) after the transfer "
             "completed, received with get_notifies()."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, notify_init},
    {Py_tp_traverse, notify_traverse},
    {Py_tp_clear, notify_clear},
    {Py_tp_dealloc, notify_dealloc},
    {Py_tp_repr, notify_repr},
    {Py_tp_members, notify_members},
    {0, NULL},
};

static PyType_Spec notify_spec = {
    .name = "kvt.TransferNotify",
    .basicsize = sizeof(notify_obj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = notify_slots,
};

PyTypeObject *kvtpy_notify_type_create(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &notify_spec, NULL);
}

/* The bytes of a str (UTF-8, lone surrogates passed through as they came
 * in) or bytes-like field. New reference to a bytes object. */
static PyObject *field_bytes(PyObject *notify, const char *field)
{
    PyObject *v = PyObject_GetAttrString(notify, field), *b;

    if (v == NULL)
        return NULL;
    if (PyUnicode_Check(v)) {
        b = PyUnicode_AsEncodedString(v, "utf-8", "surrogateescape");
    } else if (PyBytes_Check(v)) {
        Py_INCREF(v);
        b = v;
    } else if (PyObject_CheckBuffer(v)) {
        b = PyBytes_FromObject(v);
    } else {
        PyErr_Format(PyExc_TypeError, "notify.%s must be str or bytes", field);
        b = NULL;
    }
    Py_DECREF(v);
    return b;
}

int kvtpy_notify_encode(PyObject *notify, char *buf, size_t *len_p)
{
    PyObject *name = NULL, *msg = NULL;
    Py_ssize_t nlen, mlen;
    int rc = -1;

    if (!PyObject_TypeCheck(notify, kvtpy_notify_type)) {
        PyErr_SetString(PyExc_TypeError, "notify must be a TransferNotify");
        goto out;
    }
    name = field_bytes(notify, "name");
    if (name == NULL)
        goto out;
    msg = field_bytes(notify, "msg");
    if (msg == NULL)
        goto out;
    nlen = PyBytes_Size(name);
    mlen = PyBytes_Size(msg);
    if (nlen > 0xffff ||
        (size_t)(NOTIFY_HDR_LEN + nlen + mlen) > KVT_NOTIFY_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "notification too long: name %zd + msg %zd bytes, at "
                     "most %d in all",
                     nlen, mlen, KVT_NOTIFY_MAX - NOTIFY_HDR_LEN);
        goto out;
    }
    memcpy(buf, NOTIFY_MAGIC, NOTIFY_MAGIC_LEN);
    buf[4] = (char)(nlen & 0xff);
    buf[5] = (char)(nlen >> 8);
    memcpy(buf + NOTIFY_HDR_LEN, PyBytes_AsString(name), (size_t)nlen);
    memcpy(buf + NOTIFY_HDR_LEN + nlen, PyBytes_AsString(msg), (size_t)mlen);
    *len_p = (size_t)(NOTIFY_HDR_LEN + nlen + mlen);
    rc = 0;
out:
    Py_XDECREF(name);
    Py_XDECREF(msg);
    return rc;
}

static PyObject *text(const char *p, size_t n)
{
    return PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, "surrogateescape");
}

PyObject *kvtpy_notify_decode(const kvt_notify_t *n)
{
    PyObject *name, *msg, *obj;
    size_t noff, nlen, moff, mlen;

    if (kvtpy_notify_unpack(n->data, n->length, &noff, &nlen, &moff, &mlen))
        name = text(n->data + noff, nlen);
    else
        name = text(n->from, strnlen(n->from, sizeof(n->from)));
    msg = text(n->data + moff, mlen);
    if (name == NULL || msg == NULL) {
        Py_XDECREF(name);
        Py_XDECREF(msg);
        return NULL;
    }
    obj = PyObject_CallFunctionObjArgs((PyObject *)kvtpy_notify_type, name, msg,
                                       NULL);
    Py_DECREF(name);
    Py_DECREF(msg);
    return obj;
}
