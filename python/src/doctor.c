/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt.doctor(): kvt_doctor_run() for Python (kvt/doctor.h). The C side
 * returns the report's JSON; kvt/__init__.py parses it and may log it.
 */
#include "kvtpy.h"

#include <stdlib.h>

#include <kvt/doctor.h>

/* A list of names from Python into bits through @parse; ValueError
 * naming @what when it does not parse. */
static int bits_of(PyObject *o, const char *what, const char *choices,
                   kvt_status_t (*parse)(const char *, uint32_t *),
                   uint32_t *out)
{
    const char *s = kvtpy_cstr(o, what);

    if (s == NULL)
        return -1;
    if (parse(s, out) != KVT_OK) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' is not a list of %s", what, s,
                     choices);
        return -1;
    }
    return 0;
}

PyObject *kvtpy_doctor_json(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"peer",       "metadata", "host",    "transports",
                             "auth_token", "mem",      "timeout", "probe_bytes",
                             "peers",      NULL};
    PyObject *transports = Py_None, *mem = Py_None, *timeout = Py_None,
             *probe = Py_None, *peers = Py_None, *token = Py_None, *out;
    kvt_doctor_params_t p = {0};
    kvt_doctor_report_h r = NULL;
    kvt_status_t st;
    char *json = NULL;

    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "|zzzOOOOOO", kwlist, &p.peer, &p.metadata_uri,
            &p.local_host, &transports, &token, &mem, &timeout, &probe, &peers))
        return NULL;
    if (p.peer != NULL)
        p.field_mask |= KVT_DOCTOR_PARAM_PEER;
    if (p.metadata_uri != NULL)
        p.field_mask |= KVT_DOCTOR_PARAM_METADATA_URI;
    if (p.local_host != NULL)
        p.field_mask |= KVT_DOCTOR_PARAM_LOCAL_HOST;
    if (transports != Py_None) {
        if (bits_of(transports, "transports", "tcp, shm, ucx, all",
                    kvt_transport_bits, &p.transports) < 0)
            return NULL;
        p.field_mask |= KVT_DOCTOR_PARAM_TRANSPORTS;
    }
    if (token != Py_None) {
        p.auth_token = kvtpy_cstr(token, "auth_token");
        if (p.auth_token == NULL)
            return NULL;
        p.field_mask |= KVT_DOCTOR_PARAM_AUTH_TOKEN;
    }
    if (mem != Py_None) {
        if (bits_of(mem, "mem", "host, cuda", kvt_mem_kind_bits, &p.mem_kinds) <
            0)
            return NULL;
        p.field_mask |= KVT_DOCTOR_PARAM_MEM_KINDS;
    }
    if (timeout != Py_None) {
        double s = PyFloat_AsDouble(timeout);
        if (s == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(s > 0) || s > 600) {
            PyErr_SetString(PyExc_ValueError,
                            "timeout: seconds, over 0 and up to 600");
            return NULL;
        }
        p.timeout_ms = (uint64_t)(s * 1000 + 0.5);
        p.timeout_ms = p.timeout_ms ? p.timeout_ms : 1;
        p.field_mask |= KVT_DOCTOR_PARAM_TIMEOUT;
    }
    if (probe != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(probe);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        p.probe_bytes = v;
        p.field_mask |= KVT_DOCTOR_PARAM_PROBE_BYTES;
    }
    if (peers != Py_None) {
        unsigned long v = PyLong_AsUnsignedLong(peers);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (v == 0 || v > 1000000) {
            PyErr_SetString(PyExc_ValueError, "peers: 1 to 1000000");
            return NULL;
        }
        p.peers_expected = (uint32_t)v;
        p.field_mask |= KVT_DOCTOR_PARAM_PEERS_EXPECTED;
    }
    Py_BEGIN_ALLOW_THREADS
    st = kvt_doctor_run(&p, &r);
    if (st == KVT_OK)
        st = kvt_doctor_json(r, &json);
    kvt_doctor_free(r);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        return kvtpy_raise(st, "doctor");
    out = PyUnicode_FromString(json);
    free(json);
    return out;
}
