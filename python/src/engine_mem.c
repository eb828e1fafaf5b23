/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory methods of kvt.TransferEngine: registering and unregistering
 * the caller's buffers (Mooncake's locations told apart), buffers the
 * engine allocates, and copies between Python objects and raw addresses.
 */
#include "kvtpy.h"

/*
 * Mooncake locations: none or "*": told from the memory (device memory a
 * memory domain of this build detects, host memory otherwise); "cpu:N":
 * host memory; "cuda:N": memory of CUDA device N (checked). Others (other
 * accelerators) are refused: *kind is KVT_MEM_KINDS then.
 */
static int kind_of(PyObject *loc, kvt_mem_kind_t *kind, int32_t *device)
{
    const char *s;
    char *end;
    long n;

    *kind = KVT_MEM_AUTO;
    *device = -1;
    if (loc == NULL || loc == Py_None)
        return 0;
    s = kvtpy_cstr(loc, "location");
    if (s == NULL)
        return -1;
    if (s[0] == '\0' || strcmp(s, "*") == 0)
        return 0;
    if (strncmp(s, "cpu", 3) == 0) {
        *kind = KVT_MEM_HOST;
        return 0;
    }
    if (strncmp(s, "cuda", 4) == 0) {
        *kind = KVT_MEM_CUDA;
        *device = 0;
        if (s[4] == ':') {
            n = strtol(s + 5, &end, 10);
            if (end == s + 5 || *end != '\0' || n < 0 || n > INT32_MAX)
                *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
            else
                *device = (int32_t)n;
        } else if (s[4] != '\0') {
            *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
        }
        return 0;
    }
    *kind = (kvt_mem_kind_t)KVT_MEM_KINDS;
    return 0;
}

/* A location kind_of() refused: logged, KVT_ERR_NOT_SUPPORTED. */
static PyObject *bad_location(const char *fname, PyObject *loc)
{
    const char *s = kvtpy_cstr(loc, "location");

    kvtpy_log("error",
              "%s: location '%s': kvt registers host memory ('cpu:N') and "
              "CUDA memory ('cuda:N'), or tells them apart ('*')",
              fname, s != NULL ? s : "?");
    return kvtpy_int(KVT_ERR_NOT_SUPPORTED);
}

static PyObject *register_regions(kvtpy_engine_t *self, const char *fname,
                                  kvt_mem_region_t *r, size_t n)
{
    kvt_status_t st;

    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_register_batch(self->engine, r, n);
    Py_END_ALLOW_THREADS
    if (st == KVT_OK)
        return kvtpy_int(0);
    kvtpy_log("error", "%s(%#llx, %llu%s): %s (%s)", fname,
              (unsigned long long)(uintptr_t)r[0].addr,
              (unsigned long long)r[0].length, n > 1 ? ", ..." : "",
              kvt_status_name(st), kvt_status_str(st));
    return kvtpy_int(st);
}

PyObject *kvtpy_m_register_memory(PyObject *self, PyObject *const *args,
                                  Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "capacity", "location"};
    PyObject *a[3];
    uint64_t addr, len;
    kvt_mem_region_t r = {0};
    kvt_mem_kind_t kind;
    int32_t dev;

    if (kvtpy_args("register_memory", args, nargs, kwnames, params, 2, 3, a) <
            0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "capacity", &len) < 0 || kind_of(a[2], &kind, &dev) < 0)
        return NULL;
    if (kind == (kvt_mem_kind_t)KVT_MEM_KINDS)
        return bad_location("register_memory", a[2]);
    r.addr = (void *)(uintptr_t)addr;
    r.length = (size_t)len;
    r.access = KVT_ACCESS_REMOTE_RW;
    r.kind = kind;
    r.device = dev;
    return register_regions((kvtpy_engine_t *)self, "register_memory", &r, 1);
}

PyObject *kvtpy_m_batch_register_memory(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addresses", "capacities",
                                         "location"};
    kvt_mem_region_t *r = NULL;
    PyObject *a[3], *ret = NULL;
    Py_ssize_t n, nc;
    kvt_mem_kind_t kind;
    int32_t dev;

    if (kvtpy_args("batch_register_memory", args, nargs, kwnames, params, 2, 3,
                   a) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kind_of(a[2], &kind, &dev) < 0)
        return NULL;
    if (kind == (kvt_mem_kind_t)KVT_MEM_KINDS)
        return bad_location("batch_register_memory", a[2]);
    n = kvtpy_seq_len(a[0], "buffer_addresses");
    if (n < 0)
        return NULL;
    nc = kvtpy_seq_len(a[1], "capacities");
    if (nc < 0)
        return NULL;
    if (n != nc) {
        kvtpy_log("error",
                  "batch_register_memory: %zd addresses but %zd capacities", n,
                  nc);
        return kvtpy_int(KVT_ERR_INVALID_PARAM);
    }
    if (n == 0)
        return kvtpy_int(0);
    r = calloc((size_t)n, sizeof(*r));
    if (r == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t addr, len;
        if (kvtpy_u64_item(a[0], i, "buffer_addresses[i]", &addr) < 0 ||
            kvtpy_u64_item(a[1], i, "capacities[i]", &len) < 0)
            goto out;
        r[i].addr = (void *)(uintptr_t)addr;
        r[i].length = (size_t)len;
        r[i].access = KVT_ACCESS_REMOTE_RW;
        r[i].kind = kind;
        r[i].device = dev;
    }
    ret = register_regions((kvtpy_engine_t *)self, "batch_register_memory", r,
                           (size_t)n);
out:
    free(r);
    return ret;
}

static PyObject *unregister_addrs(kvtpy_engine_t *self, const char *fname,
                                  void **addrs, size_t n)
{
    kvt_status_t st;

    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_unregister_batch(self->engine, addrs, n);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        kvtpy_log("error", "%s(%#llx%s): %s (%s)", fname,
                  (unsigned long long)(uintptr_t)addrs[0], n > 1 ? ", ..." : "",
                  kvt_status_name(st), kvt_status_str(st));
    return kvtpy_int(st);
}

PyObject *kvtpy_m_unregister_memory(PyObject *self, PyObject *arg)
{
    uint64_t addr;
    void *p;

    if (kvtpy_need_engine((kvtpy_engine_t *)self) < 0 ||
        kvtpy_u64(arg, "buffer_addr", &addr) < 0)
        return NULL;
    p = (void *)(uintptr_t)addr;
    return unregister_addrs((kvtpy_engine_t *)self, "unregister_memory", &p, 1);
}

PyObject *kvtpy_m_batch_unregister_memory(PyObject *self, PyObject *arg)
{
    PyObject *ret = NULL;
    void **addrs;
    Py_ssize_t n;

    if (kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    n = kvtpy_seq_len(arg, "buffer_addresses");
    if (n < 0)
        return NULL;
    if (n == 0)
        return kvtpy_int(0);
    addrs = calloc((size_t)n, sizeof(*addrs));
    if (addrs == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (kvtpy_u64_item(arg, i, "buffer_addresses[i]", &v) < 0)
            goto out;
        addrs[i] = (void *)(uintptr_t)v;
    }
    ret = unregister_addrs((kvtpy_engine_t *)self, "batch_unregister_memory",
                           addrs, (size_t)n);
out:
    free(addrs);
    return ret;
}

/*
 * allocate_managed_buffer(length): Mooncake carves buffers out of a buddy
 * allocator over large registered chunks; kvt allocates each one with
 * kvt_mem_alloc() (memfd-backed, page-aligned, zero-filled, registered),
 * which also lets same-host peers map it directly.
 */
PyObject *kvtpy_m_allocate_managed_buffer(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    void *p = NULL;
    kvt_status_t st;
    uint64_t len;

    if (kvtpy_need_engine(e) < 0 || kvtpy_u64(arg, "length", &len) < 0)
        return NULL;
    /* Mooncake gives a buffer for length 0 too (its smallest slab); so
     * does kvt, of one byte (a page). */
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_alloc(e->engine, len ? (size_t)len : 1, KVT_ACCESS_REMOTE_RW,
                       &p);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("error", "allocate_managed_buffer(%llu): %s (%s)",
                  (unsigned long long)len, kvt_status_name(st),
                  kvt_status_str(st));
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong((uint64_t)(uintptr_t)p);
}

PyObject *kvtpy_m_free_managed_buffer(PyObject *self, PyObject *const *args,
                                      Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "length"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    uint64_t addr, len;
    kvt_status_t st;
    PyObject *a[2];

    if (kvtpy_args("free_managed_buffer", args, nargs, kwnames, params, 2, 2,
                   a) < 0 ||
        kvtpy_need_engine(e) < 0 || kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "length", &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_free(e->engine, (void *)(uintptr_t)addr);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        kvtpy_log("error", "free_managed_buffer(%#llx): %s (%s)",
                  (unsigned long long)addr, kvt_status_name(st),
                  kvt_status_str(st));
    return kvtpy_int(st);
}

/*
 * write_bytes_to_buffer / read_bytes_from_buffer copy between Python
 * objects and raw addresses, exactly as Mooncake's do: the address is
 * trusted (a wrong one crashes the process, as memcpy would).
 */
PyObject *kvtpy_m_write_bytes_to_buffer(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"dest_address", "src_ptr", "length"};
    PyObject *a[3];
    uint64_t addr, len;
    Py_buffer view;

    if (kvtpy_args("write_bytes_to_buffer", args, nargs, kwnames, params, 3, 3,
                   a) < 0 ||
        kvtpy_u64(a[0], "dest_address", &addr) < 0 ||
        kvtpy_u64(a[2], "length", &len) < 0)
        return NULL;
    if (PyUnicode_Check(a[1])) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(a[1], &n);
        if (s == NULL)
            return NULL;
        if (len > (uint64_t)n) {
            PyErr_Format(PyExc_ValueError,
                         "length %llu exceeds the %zd bytes of the data",
                         (unsigned long long)len, n);
            return NULL;
        }
        if (len > 0 && addr == 0) {
            PyErr_SetString(PyExc_ValueError, "dest_address is 0");
            return NULL;
        }
        memcpy((void *)(uintptr_t)addr, s, (size_t)len);
        return kvtpy_int(0);
    }
    if (PyObject_GetBuffer(a[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (len > (uint64_t)view.len || (len > 0 && addr == 0)) {
        if (addr == 0)
            PyErr_SetString(PyExc_ValueError, "dest_address is 0");
        else
            PyErr_Format(PyExc_ValueError,
                         "length %llu exceeds the %zd bytes of the data",
                         (unsigned long long)len, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy((void *)(uintptr_t)addr, view.buf, (size_t)len);
    PyBuffer_Release(&view);
    return kvtpy_int(0);
}

PyObject *kvtpy_m_read_bytes_from_buffer(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"source_address", "length"};
    PyObject *a[2];
    uint64_t addr, len;

    if (kvtpy_args("read_bytes_from_buffer", args, nargs, kwnames, params, 2, 2,
                   a) < 0 ||
        kvtpy_u64(a[0], "source_address", &addr) < 0 ||
        kvtpy_u64(a[1], "length", &len) < 0)
        return NULL;
    if (len > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "length too large");
        return NULL;
    }
    if (len > 0 && addr == 0) {
        PyErr_SetString(PyExc_ValueError, "source_address is 0");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)(uintptr_t)addr,
                                     (Py_ssize_t)len);
}
