/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mooncake's stream-ordered calls: transfer_write_on_cuda,
 * transfer_read_on_cuda and their batch forms, on
 * kvt_transfer_on_stream(). The transfer starts once the work queued on
 * the stream before the call is done, and the stream's later work waits
 * for it; the call itself returns at once (None), as Mooncake's does.
 *
 * Failures: the transfer runs after the call has returned, where nothing
 * can be raised. Mooncake ends the process (_exit(1)) from the driver's
 * thread. kvt logs the failure at error level and counts it in the
 * engine's stream state; the engine's next stream-ordered call raises
 * kvt.Error naming it (and queues nothing), so that the application
 * learns of it at its next step without losing the process.
 *
 * The state outlives the Python object when the stream still holds
 * transfers (their completion calls reach it from the driver's thread,
 * without the GIL): one reference for the engine object, one per queued
 * transfer.
 */
#include "kvtpy.h"

#include <stdatomic.h>
#include <stdio.h>

struct kvtpy_cuda_state {
    _Atomic unsigned refs;
    _Atomic uint64_t failed;  /* transfers that failed so far */
    _Atomic int first_status; /* the first failure not yet raised */
    _Atomic int last_status;  /* the latest failure */
    uint64_t raised;          /* failures raised so far; with the GIL */
};

void kvtpy_cuda_state_unref(struct kvtpy_cuda_state *cs)
{
    if (cs != NULL && atomic_fetch_sub(&cs->refs, 1) == 1)
        free(cs);
}

/* The completion of one stream-ordered transfer, on the driver's thread:
 * no GIL, no CUDA call, no blocking. */
static void on_done(kvt_status_t st, void *arg)
{
    struct kvtpy_cuda_state *cs = arg;
    int none = 0;

    if (st != KVT_OK) {
        atomic_store(&cs->last_status, (int)st);
        atomic_compare_exchange_strong(&cs->first_status, &none, (int)st);
        atomic_fetch_add(&cs->failed, 1);
        kvt_log_printf(KVT_LOG_LEVEL_ERROR, __FILE__, __LINE__,
                       "a transfer ordered on a CUDA stream failed: %s; "
                       "the stream went on",
                       kvt_status_str(st));
    }
    kvtpy_cuda_state_unref(cs);
}

static struct kvtpy_cuda_state *state_of(kvtpy_engine_t *self)
{
    if (self->cuda == NULL) {
        self->cuda = calloc(1, sizeof(*self->cuda));
        if (self->cuda == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->cuda->refs = 1;
    }
    return self->cuda;
}

static const char *const one_params[] = {
    "target_hostname", "buffer",     "peer_buffer_address",
    "length",          "stream_ptr", "transport_hint"};
static const char *const batch_params[] = {
    "target_hostname", "buffers",    "peer_buffer_addresses",
    "lengths",         "stream_ptr", "transport_hint"};

/*
 * Open the target (as Mooncake does, before anything is queued), then
 * queue the descriptors on the stream. Raises RuntimeError where Mooncake
 * raises (target cannot be opened, lists of different lengths, the driver
 * refused), kvt.Error for an earlier transfer that failed.
 */
static PyObject *on_cuda(kvtpy_engine_t *self, const char *fname,
                         PyObject *target, descs_t *ds, PyObject *stream_o)
{
    struct kvtpy_cuda_state *cs;
    const char *name;
    uint64_t stream = 0;
    kvt_segment_t seg;
    kvt_status_t st;
    uint64_t failed;

    name = kvtpy_cstr(target, "target_hostname");
    if (name == NULL ||
        (stream_o != NULL && kvtpy_u64(stream_o, "stream_ptr", &stream) < 0))
        return NULL;
    cs = state_of(self);
    if (cs == NULL)
        return NULL;
    failed = atomic_load(&cs->failed);
    if (failed > cs->raised) {
        int first = atomic_exchange(&cs->first_status, 0);
        char what[160];
        snprintf(what, sizeof(what),
                 "%s: %llu earlier transfer(s) ordered on a CUDA stream "
                 "failed; nothing was queued; the first",
                 fname, (unsigned long long)(failed - cs->raised));
        cs->raised = failed;
        /* A failure counted after the last raise whose status came too
         * late to be the first: the latest is its status. */
        if (first == 0)
            first = atomic_load(&cs->last_status);
        return kvtpy_raise(first, what);
    }
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(self->engine, name, &seg);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        PyErr_Format(PyExc_RuntimeError, "%s: failed to open segment %s: %s",
                     fname, name, kvt_status_str(st));
        return NULL;
    }
    if (ds->n == 0) /* only zero-length pieces: nothing to order */
        Py_RETURN_NONE;
    for (size_t i = 0; i < ds->n; i++)
        ds->d[i].segment = seg;
    atomic_fetch_add(&cs->refs, 1);
    st = kvt_transfer_on_stream(self->engine, ds->d, ds->n,
                                (void *)(uintptr_t)stream, on_done, cs);
    if (st != KVT_OK) {
        atomic_fetch_sub(&cs->refs, 1); /* the object still holds one */
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "%s: cannot order the transfer on CUDA stream 0x%llx: %s "
                 "(the log says why)",
                 fname, (unsigned long long)stream, kvt_status_str(st));
        PyErr_SetString(PyExc_RuntimeError, msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *one(PyObject *self, const char *fname, uint32_t op,
                     PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    PyObject *a[6], *r;
    descs_t ds;

    if (kvtpy_args(fname, args, nargs, kwnames, one_params, 4, 6, a) < 0 ||
        kvtpy_need_engine(e) < 0 || kvtpy_check_hint(a[5]) < 0)
        return NULL;
    if (kvtpy_descs_from_one(&ds, op, a[1], a[2], a[3]) < 0)
        return NULL;
    r = on_cuda(e, fname, a[0], &ds, a[4]);
    kvtpy_descs_fini(&ds);
    return r;
}

static PyObject *batch(PyObject *self, const char *fname, uint32_t op,
                       PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    PyObject *a[6], *r;
    descs_t ds;
    int rc;

    if (kvtpy_args(fname, args, nargs, kwnames, batch_params, 4, 6, a) < 0 ||
        kvtpy_need_engine(e) < 0 || kvtpy_check_hint(a[5]) < 0)
        return NULL;
    rc = kvtpy_descs_from_lists(&ds, fname, op, a[1], a[2], a[3]);
    if (rc < 0)
        return NULL;
    if (rc > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "buffers, peer_buffer_addresses and lengths have "
                        "different size");
        return NULL;
    }
    r = on_cuda(e, fname, a[0], &ds, a[4]);
    kvtpy_descs_fini(&ds);
    return r;
}

PyObject *kvtpy_m_transfer_write_on_cuda(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    return one(self, "transfer_write_on_cuda", KVT_OP_WRITE, args, nargs,
               kwnames);
}

PyObject *kvtpy_m_transfer_read_on_cuda(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames)
{
    return one(self, "transfer_read_on_cuda", KVT_OP_READ, args, nargs,
               kwnames);
}

PyObject *kvtpy_m_batch_transfer_write_on_cuda(PyObject *self,
                                               PyObject *const *args,
                                               Py_ssize_t nargs,
                                               PyObject *kwnames)
{
    return batch(self, "batch_transfer_write_on_cuda", KVT_OP_WRITE, args,
                 nargs, kwnames);
}

PyObject *kvtpy_m_batch_transfer_read_on_cuda(PyObject *self,
                                              PyObject *const *args,
                                              Py_ssize_t nargs,
                                              PyObject *kwnames)
{
    return batch(self, "batch_transfer_read_on_cuda", KVT_OP_READ, args, nargs,
                 kwnames);
}
