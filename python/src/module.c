/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt._kvt: the module object, the TransferOpcode enum and the helpers the
 * type implementations share (argument parsing, integer and string
 * conversion, logging through Python's logging module).
 */
#include "kvtpy.h"

#include <stdarg.h>
#include <stdio.h>

PyObject *kvtpy_logger;
PyTypeObject *kvtpy_notify_type;

void kvtpy_log(const char *level, const char *fmt, ...)
{
    PyObject *type, *value, *tb, *msg, *r;
    char buf[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (kvtpy_logger == NULL)
        return;
    /* Logging must not eat an exception the caller is about to raise. */
    PyErr_Fetch(&type, &value, &tb);
    /* The C library's lines first: the cause before this line about it. */
    kvtpy_logbridge_flush();
    msg = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    if (msg != NULL) {
        r = PyObject_CallMethod(kvtpy_logger, level, "O", msg);
        Py_XDECREF(r);
        Py_DECREF(msg);
    }
    if (PyErr_Occurred())
        PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

int kvtpy_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames, const char *const *params, int nreq,
               int nparams, PyObject **out)
{
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;

    if (nargs > nparams) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %d arguments (%zd given)", fname,
                     nparams, nargs);
        return -1;
    }
    for (int i = 0; i < nparams; i++)
        out[i] = i < nargs ? args[i] : NULL;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GetItem(kwnames, k);
        int found = 0;
        for (int i = 0; i < nparams; i++) {
            if (PyUnicode_CompareWithASCIIString(key, params[i]) != 0)
                continue;
            if (out[i] != NULL) {
                PyErr_Format(PyExc_TypeError,
                             "%s() got multiple values for argument '%s'",
                             fname, params[i]);
                return -1;
            }
            out[i] = args[nargs + k];
            found = 1;
            break;
        }
        if (!found) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
    }
    for (int i = 0; i < nreq; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing required argument '%s' (pos %d)", fname,
                         params[i], i + 1);
            return -1;
        }
    }
    return 0;
}

int kvtpy_u64(PyObject *o, const char *what, uint64_t *v)
{
    PyObject *idx;
    unsigned long long x;

    if (PyLong_Check(o)) {
        Py_INCREF(o);
        idx = o;
    } else {
        idx = PyNumber_Index(o);
        if (idx == NULL) {
            PyObject *tn;
            PyErr_Clear();
            tn = PyType_GetName(Py_TYPE(o));
            PyErr_Format(PyExc_TypeError, "%s must be an integer, not %S", what,
                         tn ? tn : Py_None);
            Py_XDECREF(tn);
            return -1;
        }
    }
    x = PyLong_AsUnsignedLongLong(idx);
    Py_DECREF(idx);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "%s must be an integer in [0, 2**64)",
                     what);
        return -1;
    }
    *v = (uint64_t)x;
    return 0;
}

/* A new reference to item @i of a list, tuple or other sequence. */
static PyObject *seq_item(PyObject *seq, Py_ssize_t i)
{
    PyObject *o;

    if (PyList_Check(seq)) {
        o = PyList_GetItem(seq, i);
        Py_XINCREF(o);
        return o;
    }
    if (PyTuple_Check(seq)) {
        o = PyTuple_GetItem(seq, i);
        Py_XINCREF(o);
        return o;
    }
    return PySequence_GetItem(seq, i);
}

Py_ssize_t kvtpy_seq_len(PyObject *seq, const char *what)
{
    if (PyUnicode_Check(seq) || PyBytes_Check(seq) || !PySequence_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of integers", what);
        return -1;
    }
    return PySequence_Size(seq);
}

int kvtpy_u64_item(PyObject *seq, Py_ssize_t i, const char *what, uint64_t *v)
{
    PyObject *o = seq_item(seq, i);
    int rc;

    if (o == NULL)
        return -1;
    rc = kvtpy_u64(o, what, v);
    Py_DECREF(o);
    return rc;
}

const char *kvtpy_cstr(PyObject *o, const char *what)
{
    const char *s;
    Py_ssize_t n;

    if (PyUnicode_Check(o)) {
        s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL)
            return NULL;
    } else if (PyBytes_Check(o)) {
        s = PyBytes_AsString(o);
        n = PyBytes_Size(o);
        if (s == NULL)
            return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be str or bytes", what);
        return NULL;
    }
    if ((size_t)n != strlen(s)) {
        PyErr_Format(PyExc_ValueError, "%s contains a NUL character", what);
        return NULL;
    }
    return s;
}

/*
 * TransferOpcode as an IntEnum: Mooncake's pybind11 enum is arithmetic
 * (usable as an int) with members Read = 0 and Write = 1, which are also
 * kvt's KVT_OP_READ and KVT_OP_WRITE. Mooncake's documentation spells them
 * READ and WRITE, so both spellings exist (the upper-case ones are
 * aliases).
 */
static PyObject *make_opcode_enum(void)
{
    PyObject *mod, *intenum, *members, *kwargs = NULL, *args = NULL;
    PyObject *r = NULL;

    mod = PyImport_ImportModule("enum");
    if (mod == NULL)
        return NULL;
    intenum = PyObject_GetAttrString(mod, "IntEnum");
    Py_DECREF(mod);
    if (intenum == NULL)
        return NULL;
    members =
        Py_BuildValue("[(si)(si)(si)(si)]", "Read", KVT_OP_READ, "Write",
                      KVT_OP_WRITE, "READ", KVT_OP_READ, "WRITE", KVT_OP_WRITE);
    if (members == NULL)
        goto out;
    args = Py_BuildValue("(sO)", "TransferOpcode", members);
    kwargs = Py_BuildValue("{ss}", "module", "kvt");
    if (args != NULL && kwargs != NULL)
        r = PyObject_Call(intenum, args, kwargs);
out:
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(members);
    Py_DECREF(intenum);
    return r;
}

static PyObject *status_str(PyObject *mod, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvt_status_str((kvt_status_t)v));
}

static PyObject *metrics_port(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    return PyLong_FromLong(kvt_metrics_port());
}

static PyObject *metrics_listen(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"port", "host", NULL};
    const char *host = NULL;
    int port = 0;
    uint16_t got = 0;
    kvt_status_t st;

    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iz", kwlist, &port, &host))
        return NULL;
    if (port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = kvt_metrics_listen(host, (uint16_t)port, &got);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        return kvtpy_raise(st, "metrics_listen");
    return PyLong_FromLong(got);
}

static PyMethodDef module_methods[] = {
    {"status_str", status_str, METH_O,
     "status_str(code) -> str: the message of a kvt status code (as "
     "returned by register_memory and friends)."},
    {"metrics_port", metrics_port, METH_NOARGS,
     "metrics_port() -> the port of this process's /metrics listener, 0 "
     "when none runs (KVT_METRICS_PORT starts one with the first engine)."},
    {"metrics_listen", (PyCFunction)(void (*)(void))metrics_listen,
     METH_VARARGS | METH_KEYWORDS,
     "metrics_listen(port=0, host=None) -> port: serve /metrics of every "
     "engine of this process (127.0.0.1 unless host says otherwise)."},
    {"doctor_json", (PyCFunction)(void (*)(void))kvtpy_doctor_json,
     METH_VARARGS | METH_KEYWORDS,
     "doctor_json(peer=None, metadata=None, host=None, transports=None, "
     "auth_token=None, mem=None, timeout=None, probe_bytes=None, "
     "peers=None) -> str: kvt_doctor_run()'s report as JSON (kvt.doctor() "
     "parses it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvt._kvt",
    .m_doc = "kvt's CPython binding: TransferEngine with the API of "
             "mooncake.engine.TransferEngine.",
    .m_size = -1,
    .m_methods = module_methods,
};

/* ---- The kvt.Error hierarchy -------------------------------------------- */

/* One subclass per family of statuses; each also derives from the builtin
 * exception a caller would have caught before (ValueError for bad
 * arguments, ConnectionError for a lost peer, ...). */
enum {
    EXC_ERROR,
    EXC_STATE,
    EXC_INVALID,
    EXC_NOT_FOUND,
    EXC_NOT_SUPPORTED,
    EXC_RESOURCE,
    EXC_ACCESS,
    EXC_TIMEOUT,
    EXC_PEER,
    EXC_PROTOCOL,
    EXC_CANCELED,
    EXC_BUSY,
    EXC_AUTH, /* an AccessError */
    EXC_N
};

static PyObject *exc[EXC_N];

static const struct {
    const char *name, *doc;
} exc_info[EXC_N] = {
    {"Error", "A kvt call failed; .status is the kvt status (negative)."},
    {"StateError", "Used before it was initialized, or after close()."},
    {"InvalidArgumentError",
     "Bad arguments: KVT_ERR_INVALID_PARAM, EXISTS, NOT_REGISTERED, "
     "OVERFLOW."},
    {"NotFoundError", "KVT_ERR_NOT_FOUND."},
    {"NotSupportedError", "KVT_ERR_NOT_SUPPORTED."},
    {"ResourceError", "KVT_ERR_NO_MEMORY, NO_SPACE."},
    {"AccessError", "The peer refused the range: KVT_ERR_ACCESS."},
    {"TransferTimeoutError", "KVT_ERR_TIMEDOUT."},
    {"PeerError", "The peer is gone or unreachable: KVT_ERR_UNREACHABLE, "
                  "CONN_LOST, IO."},
    {"ProtocolError", "KVT_ERR_PROTOCOL, VERSION."},
    {"CanceledError", "KVT_ERR_CANCELED, CLOSED."},
    {"BusyError", "KVT_ERR_BUSY, AGAIN."},
    {"AuthError", "Authentication failed (the auth token missing or not the "
                  "peer's): KVT_ERR_AUTH. An AccessError."},
};

static int exc_family(kvt_status_t st)
{
    switch (st) {
    case KVT_ERR_INVALID_PARAM:
    case KVT_ERR_EXISTS:
    case KVT_ERR_NOT_REGISTERED:
    case KVT_ERR_OVERFLOW:
        return EXC_INVALID;
    case KVT_ERR_NOT_FOUND:
        return EXC_NOT_FOUND;
    case KVT_ERR_NOT_SUPPORTED:
        return EXC_NOT_SUPPORTED;
    case KVT_ERR_NO_MEMORY:
    case KVT_ERR_NO_SPACE:
        return EXC_RESOURCE;
    case KVT_ERR_ACCESS:
        return EXC_ACCESS;
    case KVT_ERR_AUTH:
        return EXC_AUTH;
    case KVT_ERR_TIMEDOUT:
        return EXC_TIMEOUT;
    case KVT_ERR_UNREACHABLE:
    case KVT_ERR_CONN_LOST:
    case KVT_ERR_IO:
        return EXC_PEER;
    case KVT_ERR_PROTOCOL:
    case KVT_ERR_VERSION:
        return EXC_PROTOCOL;
    case KVT_ERR_CANCELED:
    case KVT_ERR_CLOSED:
        return EXC_CANCELED;
    case KVT_ERR_BUSY:
    case KVT_ERR_AGAIN:
        return EXC_BUSY;
    default:
        return EXC_ERROR;
    }
}

static PyObject *raise_with(int family, long status, PyObject *msg)
{
    PyObject *e;
    if (msg == NULL)
        return NULL;
    PyObject *v;

    e = PyObject_CallFunctionObjArgs(exc[family], msg, NULL);
    Py_DECREF(msg);
    if (e == NULL)
        return NULL;
    v = PyLong_FromLong(status);
    if (v != NULL && PyObject_SetAttrString(e, "status", v) == 0)
        PyErr_SetObject(exc[family], e);
    Py_XDECREF(v);
    Py_DECREF(e);
    return NULL;
}

PyObject *kvtpy_raise(kvt_status_t st, const char *what)
{
    return raise_with(exc_family(st), (long)st,
                      PyUnicode_FromFormat("%s: %s (%s)", what,
                                           kvt_status_str(st),
                                           kvt_status_name(st)));
}

PyObject *kvtpy_state_error(const char *msg)
{
    return raise_with(EXC_STATE, (long)KVT_ERR_INVALID_PARAM,
                      PyUnicode_FromString(msg));
}

static int exc_init(PyObject *m)
{
    PyObject *builtin[EXC_N] = {
        NULL,
        PyExc_RuntimeError,
        PyExc_ValueError,
        PyExc_LookupError,
        NULL,
        PyExc_MemoryError,
        PyExc_PermissionError,
        PyExc_TimeoutError,
        PyExc_ConnectionError,
        NULL,
        NULL,
        NULL,
        NULL, /* AuthError: under AccessError, below */
    };
    char qual[64];

    for (int i = 0; i < EXC_N; i++) {
        PyObject *bases;
        snprintf(qual, sizeof(qual), "kvt.%s", exc_info[i].name);
        if (i == EXC_ERROR)
            bases = Py_BuildValue("(O)", PyExc_Exception);
        else if (i == EXC_AUTH)
            bases = Py_BuildValue("(O)", exc[EXC_ACCESS]);
        else if (builtin[i] != NULL)
            bases = Py_BuildValue("(OO)", exc[EXC_ERROR], builtin[i]);
        else
            bases = Py_BuildValue("(O)", exc[EXC_ERROR]);
        if (bases == NULL)
            return -1;
        Py_XDECREF(exc[i]);
        exc[i] = PyErr_NewExceptionWithDoc(qual, exc_info[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (exc[i] == NULL ||
            PyModule_AddObjectRef(m, exc_info[i].name, exc[i]) < 0)
            return -1;
    }
    return 0;
}

/* Built with the CUDA memory domain: CUDA device memory is registered and
 * moved (where a driver is found at run time). */
#ifdef KVT_HAVE_CUDA
#define KVT_PY_HAVE_CUDA 1
#else
#define KVT_PY_HAVE_CUDA 0
#endif

PyMODINIT_FUNC PyInit__kvt(void);

PyMODINIT_FUNC PyInit__kvt(void)
{
    PyObject *m, *logging, *opcode = NULL;
    PyTypeObject *engine_type = NULL;

    m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    logging = PyImport_ImportModule("logging");
    if (logging == NULL)
        goto err;
    Py_XDECREF(kvtpy_logger);
    kvtpy_logger = PyObject_CallMethod(logging, "getLogger", "s", "kvt");
    Py_DECREF(logging);
    if (kvtpy_logger == NULL)
        goto err;

    if (exc_init(m) < 0)
        goto err;
    kvtpy_notify_type = kvtpy_notify_type_create(m);
    if (kvtpy_notify_type == NULL)
        goto err;
    if (PyModule_AddObjectRef(m, "TransferNotify",
                              (PyObject *)kvtpy_notify_type) < 0)
        goto err;
    engine_type = kvtpy_engine_type_create(m);
    if (engine_type == NULL)
        goto err;
    if (PyModule_AddObjectRef(m, "TransferEngine", (PyObject *)engine_type) < 0)
        goto err;

    opcode = make_opcode_enum();
    if (opcode == NULL)
        goto err;
    /* Mooncake exposes the enum on the module, on the class, and (through
     * pybind11's export_values) its members on the module. */
    if (PyModule_AddObjectRef(m, "TransferOpcode", opcode) < 0 ||
        PyObject_SetAttrString((PyObject *)engine_type, "TransferOpcode",
                               opcode) < 0)
        goto err;
    for (int i = 0; i < 2; i++) {
        const char *name = i == 0 ? "Read" : "Write";
        PyObject *v = PyObject_GetAttrString(opcode, name);
        if (v == NULL || PyModule_AddObject(m, name, v) < 0) {
            Py_XDECREF(v);
            goto err;
        }
    }
    if (kvtpy_connector_init(m) < 0 || kvtpy_logbridge_init(m) < 0 ||
        kvtpy_post_init(m) < 0)
        goto err;
    if (PyModule_AddIntConstant(m, "NOTIFY_MAX", KVT_NOTIFY_MAX) < 0 ||
        PyModule_AddIntConstant(m, "VERSION_MAJOR", KVT_VERSION_MAJOR) < 0 ||
        PyModule_AddIntConstant(m, "VERSION_MINOR", KVT_VERSION_MINOR) < 0 ||
        PyModule_AddIntConstant(m, "VERSION_PATCH", KVT_VERSION_PATCH) < 0 ||
        PyModule_AddIntConstant(m, "HAVE_CUDA", KVT_PY_HAVE_CUDA) < 0)
        goto err;
    Py_DECREF(opcode);
    Py_DECREF((PyObject *)engine_type);
    return m;

err:
    Py_XDECREF(opcode);
    Py_XDECREF((PyObject *)engine_type);
    Py_DECREF(m);
    return NULL;
}
