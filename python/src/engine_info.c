/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a TransferEngine says of itself and its host, in Mooncake's terms:
 * get_engine_ptr, get_local_topology, warmup_efa_segment, and get_engine
 * (refused: it hands out Mooncake's C++ object).
 */
#include "kvtpy.h"

#include <dirent.h>
#include <stdio.h>

/*
 * get_engine_ptr() -> the address of the engine's kvt_engine_h (0 before
 * initialize()). Mooncake gives its C++ TransferEngine; code that casts
 * this to Mooncake's class must not be given kvt's.
 */
PyObject *kvtpy_m_get_engine_ptr(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(
        (unsigned long long)(uintptr_t)((kvtpy_engine_t *)self)->engine);
}

/* get_engine(): Mooncake's InnerTransferEngine (its C++ engine, for its
 * own C++ extensions); kvt has no such object. */
PyObject *kvtpy_m_get_engine(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return kvtpy_raise(KVT_ERR_NOT_SUPPORTED,
                       "get_engine() returns Mooncake's C++ engine object, "
                       "which kvt does not have; get_engine_ptr() gives kvt's "
                       "engine handle (a kvt_engine_h)");
}

/*
 * warmup_efa_segment(segment_name) -> 0 or -1. Mooncake's connects its EFA
 * endpoints to the segment ahead of the first transfer (a no-op returning
 * 0 without EFA). kvt has no EFA transport; it does the part that applies
 * to every transport: it opens the segment, so that the handshake and the
 * connections are done before the first transfer. -1 (logged) when the
 * segment cannot be opened.
 */
PyObject *kvtpy_m_warmup_efa_segment(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"segment_name"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    const char *name;
    kvt_segment_t seg;
    kvt_status_t st;
    PyObject *a[1];

    if (kvtpy_args("warmup_efa_segment", args, nargs, kwnames, params, 1, 1,
                   a) < 0 ||
        kvtpy_need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(a[0], "segment_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("error", "warmup_efa_segment(%s): cannot open segment: %s",
                  name, kvt_status_str(st));
        return PyLong_FromLong(-1);
    }
    return PyLong_FromLong(0);
}

/* ---- get_local_topology ------------------------------------------------- */

#define TOPO_MAX 512

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The locations this host has, as Mooncake names them: "cpu:N" for each
 * NUMA node of /sys/devices/system/node, "cuda:N" for each CUDA device
 * kvt can use. Returns how many (at most @max), names malloc'ed.
 */
static int locations(char **out, int max)
{
    kvt_mem_domain_info_t d[8];
    struct dirent *de;
    size_t nd = 0;
    int n = 0;
    DIR *dir;

    dir = opendir("/sys/devices/system/node");
    while (dir != NULL && (de = readdir(dir)) != NULL && n < max) {
        char *end;
        long id;
        if (strncmp(de->d_name, "node", 4) != 0)
            continue;
        id = strtol(de->d_name + 4, &end, 10);
        if (end == de->d_name + 4 || *end != '\0' || id < 0)
            continue;
        if (asprintf(&out[n], "cpu:%ld", id) > 0)
            n++;
    }
    if (dir != NULL)
        closedir(dir);
    if (kvt_mem_domains(d, 8, &nd) == KVT_OK) {
        for (size_t i = 0; i < nd && i < 8; i++) {
            if (d[i].kind != KVT_MEM_CUDA || !d[i].available)
                continue;
            for (int k = 0; k < d[i].devices && n < max; k++)
                if (asprintf(&out[n], "cuda:%d", k) > 0)
                    n++;
        }
    }
    qsort(out, (size_t)n, sizeof(out[0]), by_name);
    return n;
}

/*
 * get_local_topology(device_name=None) -> JSON text: for each location,
 * [preferred NICs, other NICs], in the layout Mooncake's writer gives it.
 * kvt does not bind transfers to RDMA NICs by location (UCX chooses its
 * devices), so both lists are empty, as Mooncake's are on a host without
 * RDMA NICs; @device_name (a NIC filter in Mooncake) then filters nothing.
 * Needs no initialize(). The first call may load the CUDA driver.
 */
PyObject *kvtpy_m_get_local_topology(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"device_name"};
    char *loc[TOPO_MAX];
    PyObject *a[1] = {NULL}, *r;
    size_t cap = 16, len;
    char *buf;
    int n;

    (void)self;
    if (kvtpy_args("get_local_topology", args, nargs, kwnames, params, 0, 1,
                   a) < 0)
        return NULL;
    if (a[0] != NULL && a[0] != Py_None && !PyUnicode_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "device_name must be a str or None");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    n = locations(loc, TOPO_MAX);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < n; i++)
        cap += strlen(loc[i]) + 32;
    buf = malloc(cap);
    if (buf == NULL) {
        for (int i = 0; i < n; i++)
            free(loc[i]);
        return PyErr_NoMemory();
    }
    len = (size_t)snprintf(buf, cap, n > 0 ? "{\n" : "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(buf + len, cap - len,
                                "\t\"%s\" : \n\t[\n\t\t[],\n\t\t[]\n\t]%s\n",
                                loc[i], i + 1 < n ? "," : "");
        free(loc[i]);
    }
    snprintf(buf + len, cap - len, "}\n");
    r = PyUnicode_FromString(buf);
    free(buf);
    return r;
}
