/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics methods of kvt.TransferEngine (a kvt extension): the
 * engine's counters as nested dictionaries (docs/metrics.md), and as
 * Prometheus text.
 */
#include "kvtpy.h"

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

PyObject *kvtpy_m_get_metrics(PyObject *self, PyObject *unused)
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
            put_u64(x, "served_writes", s->served[i].writes) < 0 ||
            put_u64(x, "served_reads", s->served[i].reads) < 0 ||
            put_u64(x, "served_write_bytes", s->served[i].write_bytes) < 0 ||
            put_u64(x, "served_read_bytes", s->served[i].read_bytes) < 0 ||
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

PyObject *kvtpy_m_get_metrics_text(PyObject *self, PyObject *unused)
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
