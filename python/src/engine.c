/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt.TransferEngine: the methods of mooncake.engine.TransferEngine, with
 * the same names, argument order, defaults and return conventions, on top
 * of kvt's C API.
 *
 * Every call that moves bytes or waits runs with the GIL released. Remote
 * segments are named "host:rpc_port" and opened through
 * kvt_segment_open(), which caches them by name and evicts a segment whose
 * session failed, so the next call handshakes afresh.
 *
 * Synchronous calls reuse batches from a small per-engine pool instead of
 * creating one per call; asynchronous calls get their own batch, named by
 * an id from the table in batch_ids.c.
 */
#include "kvtpy.h"

#include <stdlib.h>
#include <string.h>

/* Synchronous calls of up to POOL_CAP descriptors use pooled batches of
 * that capacity; POOL_MAX of them are kept for concurrent callers. */
#define POOL_CAP 64
#define POOL_MAX 8
/* Notifications taken per kvt_notify_recv() call by get_notifies(). */
#define NOTIFY_CHUNK 16

typedef struct {
    PyObject_HEAD
    kvt_engine_h engine;
    pthread_mutex_t pool_lock;
    kvt_batch_h pool[POOL_MAX];
    int npool;
    kvtpy_ids_t ids;
    /* get_notifies() scratch space, only used with the GIL held. */
    kvt_notify_t *nbuf;
} engine_obj;

/* ---- Helpers ------------------------------------------------------------ */

static int need_engine(engine_obj *self)
{
    if (self->engine != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "TransferEngine is not initialized: call initialize() "
                    "or initialize_ext() first (and check it returned 0)");
    return -1;
}

static PyObject *ret_int(long v)
{
    return PyLong_FromLong(v);
}

static kvt_batch_h pool_get(engine_obj *self, size_t n)
{
    kvt_batch_h b = NULL;

    if (n <= POOL_CAP) {
        pthread_mutex_lock(&self->pool_lock);
        if (self->npool > 0)
            b = self->pool[--self->npool];
        pthread_mutex_unlock(&self->pool_lock);
        if (b != NULL)
            return b;
        n = POOL_CAP;
    }
    if (kvt_batch_create(self->engine, n, &b) != KVT_OK)
        return NULL;
    return b;
}

/* Return a batch whose descriptors are all final. */
static void pool_put(engine_obj *self, kvt_batch_h b, size_t n)
{
    if (n <= POOL_CAP && kvt_batch_reset(b) == KVT_OK) {
        pthread_mutex_lock(&self->pool_lock);
        if (self->npool < POOL_MAX) {
            self->pool[self->npool++] = b;
            b = NULL;
        }
        pthread_mutex_unlock(&self->pool_lock);
    }
    if (b != NULL)
        kvt_batch_free(b);
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

static Py_ssize_t seq_len(PyObject *seq, const char *what)
{
    Py_ssize_t n;

    if (PyUnicode_Check(seq) || PyBytes_Check(seq) || !PySequence_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of integers", what);
        return -1;
    }
    n = PySequence_Size(seq);
    return n;
}

static int u64_item(PyObject *seq, Py_ssize_t i, const char *what,
                    uint64_t *v)
{
    PyObject *o = seq_item(seq, i);
    int rc;

    if (o == NULL)
        return -1;
    rc = kvtpy_u64(o, what, v);
    Py_DECREF(o);
    return rc;
}

static int opcode_of(PyObject *o, uint32_t *op)
{
    uint64_t v;

    if (kvtpy_u64(o, "opcode", &v) < 0)
        return -1;
    if (v != KVT_OP_READ && v != KVT_OP_WRITE) {
        PyErr_Format(PyExc_ValueError,
                     "opcode must be TransferOpcode.Read or .Write, not %llu",
                     (unsigned long long)v);
        return -1;
    }
    *op = (uint32_t)v;
    return 0;
}

/* The transport hint selects a transport in Mooncake's TENT backend and is
 * ignored by its classic one; kvt chooses per peer, so it is accepted and
 * checked for type only. */
static int check_hint(PyObject *hint)
{
    if (hint == NULL || hint == Py_None || PyUnicode_Check(hint))
        return 0;
    PyErr_SetString(PyExc_TypeError, "transport_hint must be a str");
    return -1;
}

/*
 * The descriptors of a transfer request, built with the GIL held and used
 * without it. Small requests live in the inline array.
 */
typedef struct {
    kvt_xfer_desc_t inline_d[8];
    kvt_xfer_desc_t *d;
    size_t n;
} descs_t;

static void descs_fini(descs_t *ds)
{
    if (ds->d != ds->inline_d)
        free(ds->d);
}

/* Append one descriptor; zero-length pieces move nothing and are dropped
 * (kvt refuses them, Mooncake completes them). */
static void descs_add(descs_t *ds, uint32_t op, uint64_t local,
                      uint64_t remote, uint64_t len)
{
    kvt_xfer_desc_t *d;

    if (len == 0)
        return;
    d = &ds->d[ds->n++];
    memset(d, 0, sizeof(*d));
    d->opcode = op;
    d->local_addr = (void *)(uintptr_t)local;
    d->remote_addr = remote;
    d->length = len;
}

/*
 * Build descriptors from three parallel lists. Returns 0; 1 when the list
 * lengths differ (logged: Mooncake returns a failure code for that, it
 * does not raise); -1 with an exception set for wrong types.
 */
static int descs_from_lists(descs_t *ds, const char *fname, uint32_t op,
                            PyObject *bufs, PyObject *peers, PyObject *lens)
{
    Py_ssize_t nb, np, nl;

    ds->d = ds->inline_d;
    ds->n = 0;
    nb = seq_len(bufs, "buffers");
    if (nb < 0)
        return -1;
    np = seq_len(peers, "peer_buffer_addresses");
    if (np < 0)
        return -1;
    nl = seq_len(lens, "lengths");
    if (nl < 0)
        return -1;
    if (nb != np || nb != nl) {
        kvtpy_log("error",
                  "%s: buffers, peer_buffer_addresses and lengths have "
                  "different sizes (%zd, %zd, %zd)",
                  fname, nb, np, nl);
        return 1;
    }
    if ((size_t)nb > sizeof(ds->inline_d) / sizeof(ds->inline_d[0])) {
        ds->d = malloc((size_t)nb * sizeof(*ds->d));
        if (ds->d == NULL) {
            ds->d = ds->inline_d;
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        uint64_t b, p, l;
        if (u64_item(bufs, i, "buffers[i]", &b) < 0 ||
            u64_item(peers, i, "peer_buffer_addresses[i]", &p) < 0 ||
            u64_item(lens, i, "lengths[i]", &l) < 0) {
            descs_fini(ds);
            ds->d = ds->inline_d;
            return -1;
        }
        descs_add(ds, op, b, p, l);
    }
    return 0;
}

static int descs_from_one(descs_t *ds, uint32_t op, PyObject *buf,
                          PyObject *peer, PyObject *len)
{
    uint64_t b, p, l;

    ds->d = ds->inline_d;
    ds->n = 0;
    if (kvtpy_u64(buf, "buffer", &b) < 0 ||
        kvtpy_u64(peer, "peer_buffer_address", &p) < 0 ||
        kvtpy_u64(len, "length", &l) < 0)
        return -1;
    descs_add(ds, op, b, p, l);
    return 0;
}

/* ---- Synchronous transfers ------------------------------------------------ */

typedef enum {
    STAGE_OPEN,
    STAGE_TRANSFER,
    STAGE_NOTIFY,
} stage_t;

typedef struct {
    const char *target;
    descs_t *ds;
    const char *notify; /* encoded notification, or NULL */
    size_t notify_len;
    kvt_status_t st;
    stage_t stage;
} sync_req_t;

/*
 * Open the target, run the descriptors to completion and, when they all
 * succeeded, send the notification. Runs without the GIL. Every step is
 * bounded: opening by the connect timeout, each descriptor by the
 * transfer timeout, the notification by the transfer timeout.
 */
static void run_sync(engine_obj *self, sync_req_t *r)
{
    kvt_segment_t seg;
    kvt_batch_h b;

    r->stage = STAGE_OPEN;
    r->st = kvt_segment_open(self->engine, r->target, &seg);
    if (r->st != KVT_OK)
        return;
    r->stage = STAGE_TRANSFER;
    if (r->ds->n > 0) {
        for (size_t i = 0; i < r->ds->n; i++)
            r->ds->d[i].segment = seg;
        b = pool_get(self, r->ds->n);
        if (b == NULL) {
            r->st = KVT_ERR_NO_MEMORY;
            return;
        }
        r->st = kvt_batch_submit(b, r->ds->d, r->ds->n);
        if (r->st == KVT_OK)
            r->st = kvt_batch_wait(b, -1);
        pool_put(self, b, r->ds->n);
        if (r->st != KVT_OK)
            return;
    }
    if (r->notify != NULL) {
        r->stage = STAGE_NOTIFY;
        r->st = kvt_notify_send(self->engine, seg, r->notify, r->notify_len);
    }
}

static void log_failure(const char *fname, const char *target, stage_t stage,
                        kvt_status_t st)
{
    static const char *const what[] = {
        [STAGE_OPEN] = "cannot open segment",
        [STAGE_TRANSFER] = "transfer failed",
        [STAGE_NOTIFY] = "notification failed",
    };
    kvtpy_log("warning", "%s(%s): %s: %s (%s)", fname, target, what[stage],
              kvt_status_name(st), kvt_status_str(st));
}

/* The body shared by every synchronous call: 0 on success, -1 on failure
 * (logged with the reason), NULL with an exception for bad arguments. */
static PyObject *sync_common(engine_obj *self, const char *fname,
                             PyObject *target, descs_t *ds, PyObject *notify)
{
    char nbuf[KVT_NOTIFY_MAX];
    sync_req_t r = {0};

    r.target = kvtpy_cstr(target, "target_hostname");
    if (r.target == NULL)
        return NULL;
    r.ds = ds;
    if (notify != NULL && notify != Py_None) {
        if (kvtpy_notify_encode(notify, nbuf, &r.notify_len) < 0)
            return NULL;
        r.notify = nbuf;
    }
    Py_BEGIN_ALLOW_THREADS
    run_sync(self, &r);
    Py_END_ALLOW_THREADS
    if (r.st != KVT_OK) {
        log_failure(fname, r.target, r.stage, r.st);
        return ret_int(-1);
    }
    return ret_int(0);
}

static const char *const one_params[] = {
    "target_hostname", "buffer", "peer_buffer_address", "length",
    "transport_hint"};
static const char *const one_op_params[] = {
    "target_hostname", "buffer", "peer_buffer_address", "length", "opcode",
    "notify", "transport_hint"};
static const char *const batch_params[] = {
    "target_hostname", "buffers", "peer_buffer_addresses", "lengths",
    "transport_hint"};
static const char *const batch_op_params[] = {
    "target_hostname", "buffers", "peer_buffer_addresses", "lengths",
    "opcode", "notify", "transport_hint"};
static const char *const async_op_params[] = {
    "target_hostname", "buffers", "peer_buffer_addresses", "lengths",
    "opcode", "transport_hint"};

static PyObject *sync_one(engine_obj *self, const char *fname, uint32_t op,
                          PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    PyObject *a[5];
    descs_t ds;

    if (kvtpy_args(fname, args, nargs, kwnames, one_params, 4, 5, a) < 0 ||
        check_hint(a[4]) < 0 || need_engine(self) < 0)
        return NULL;
    if (descs_from_one(&ds, op, a[1], a[2], a[3]) < 0)
        return NULL;
    return sync_common(self, fname, a[0], &ds, NULL);
}

static PyObject *m_transfer_sync_write(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames)
{
    return sync_one((engine_obj *)self, "transfer_sync_write", KVT_OP_WRITE,
                    args, nargs, kwnames);
}

static PyObject *m_transfer_sync_read(PyObject *self, PyObject *const *args,
                                      Py_ssize_t nargs, PyObject *kwnames)
{
    return sync_one((engine_obj *)self, "transfer_sync_read", KVT_OP_READ,
                    args, nargs, kwnames);
}

static PyObject *m_transfer_sync(PyObject *self, PyObject *const *args,
                                 Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[7];
    uint32_t op;
    descs_t ds;

    if (kvtpy_args("transfer_sync", args, nargs, kwnames, one_op_params, 5, 7,
                   a) < 0 ||
        opcode_of(a[4], &op) < 0 || check_hint(a[6]) < 0 ||
        need_engine((engine_obj *)self) < 0)
        return NULL;
    if (descs_from_one(&ds, op, a[1], a[2], a[3]) < 0)
        return NULL;
    return sync_common((engine_obj *)self, "transfer_sync", a[0], &ds, a[5]);
}

static PyObject *sync_batch(engine_obj *self, const char *fname, uint32_t op,
                            PyObject *target, PyObject *bufs, PyObject *peers,
                            PyObject *lens, PyObject *notify)
{
    PyObject *r;
    descs_t ds;
    int rc;

    rc = descs_from_lists(&ds, fname, op, bufs, peers, lens);
    if (rc < 0)
        return NULL;
    if (rc > 0)
        return ret_int(-1);
    r = sync_common(self, fname, target, &ds, notify);
    descs_fini(&ds);
    return r;
}

static PyObject *batch_sync_rw(engine_obj *self, const char *fname,
                               uint32_t op, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];

    if (kvtpy_args(fname, args, nargs, kwnames, batch_params, 4, 5, a) < 0 ||
        check_hint(a[4]) < 0 || need_engine(self) < 0)
        return NULL;
    return sync_batch(self, fname, op, a[0], a[1], a[2], a[3], NULL);
}

static PyObject *m_batch_transfer_sync_write(PyObject *self,
                                             PyObject *const *args,
                                             Py_ssize_t nargs,
                                             PyObject *kwnames)
{
    return batch_sync_rw((engine_obj *)self, "batch_transfer_sync_write",
                         KVT_OP_WRITE, args, nargs, kwnames);
}

static PyObject *m_batch_transfer_sync_read(PyObject *self,
                                            PyObject *const *args,
                                            Py_ssize_t nargs,
                                            PyObject *kwnames)
{
    return batch_sync_rw((engine_obj *)self, "batch_transfer_sync_read",
                         KVT_OP_READ, args, nargs, kwnames);
}

static PyObject *m_batch_transfer_sync(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[7];
    uint32_t op;

    if (kvtpy_args("batch_transfer_sync", args, nargs, kwnames,
                   batch_op_params, 5, 7, a) < 0 ||
        opcode_of(a[4], &op) < 0 || check_hint(a[6]) < 0 ||
        need_engine((engine_obj *)self) < 0)
        return NULL;
    return sync_batch((engine_obj *)self, "batch_transfer_sync", op, a[0],
                      a[1], a[2], a[3], a[5]);
}

/* ---- Asynchronous transfers --------------------------------------------- */

/*
 * Open the target and submit the descriptors into a batch of their own;
 * without the GIL. Sets *batch_p on success. A descriptor that fails
 * validation does not fail the submission: its slot is final at once and
 * the id reports the failure.
 */
static kvt_status_t submit_async(engine_obj *self, const char *target,
                                 descs_t *ds, kvt_batch_h *batch_p,
                                 stage_t *stage_p)
{
    kvt_segment_t seg;
    kvt_batch_h b;
    kvt_status_t st;

    *stage_p = STAGE_OPEN;
    st = kvt_segment_open(self->engine, target, &seg);
    if (st != KVT_OK)
        return st;
    *stage_p = STAGE_TRANSFER;
    st = kvt_batch_create(self->engine, ds->n > 0 ? ds->n : 1, &b);
    if (st != KVT_OK)
        return st;
    for (size_t i = 0; i < ds->n; i++)
        ds->d[i].segment = seg;
    st = kvt_batch_submit(b, ds->d, ds->n);
    if (st != KVT_OK) {
        kvt_batch_free(b);
        return st;
    }
    *batch_p = b;
    return KVT_OK;
}

/* Submit and name the batch: the id, or 0 on failure (logged). */
static PyObject *async_common(engine_obj *self, const char *fname,
                              PyObject *target, descs_t *ds)
{
    const char *name = kvtpy_cstr(target, "target_hostname");
    kvt_batch_h b = NULL;
    kvt_status_t st;
    stage_t stage;
    uint64_t id = 0;

    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = submit_async(self, name, ds, &b, &stage);
    if (st == KVT_OK) {
        id = kvtpy_ids_add(&self->ids, b);
        if (id == 0) {
            /* Nowhere to keep it: let it finish, then drop it. */
            kvt_batch_wait(b, -1);
            kvt_batch_free(b);
            st = KVT_ERR_NO_MEMORY;
        }
    }
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        log_failure(fname, name, stage, st);
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong(id);
}

static PyObject *async_batch(engine_obj *self, const char *fname, uint32_t op,
                             PyObject *target, PyObject *bufs,
                             PyObject *peers, PyObject *lens)
{
    PyObject *r;
    descs_t ds;
    int rc;

    rc = descs_from_lists(&ds, fname, op, bufs, peers, lens);
    if (rc < 0)
        return NULL;
    if (rc > 0)
        return PyLong_FromUnsignedLongLong(0);
    r = async_common(self, fname, target, &ds);
    descs_fini(&ds);
    return r;
}

static PyObject *async_rw(engine_obj *self, const char *fname, uint32_t op,
                          PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    PyObject *a[5];

    if (kvtpy_args(fname, args, nargs, kwnames, batch_params, 4, 5, a) < 0 ||
        check_hint(a[4]) < 0 || need_engine(self) < 0)
        return NULL;
    return async_batch(self, fname, op, a[0], a[1], a[2], a[3]);
}

static PyObject *m_batch_transfer_async_write(PyObject *self,
                                              PyObject *const *args,
                                              Py_ssize_t nargs,
                                              PyObject *kwnames)
{
    return async_rw((engine_obj *)self, "batch_transfer_async_write",
                    KVT_OP_WRITE, args, nargs, kwnames);
}

static PyObject *m_batch_transfer_async_read(PyObject *self,
                                             PyObject *const *args,
                                             Py_ssize_t nargs,
                                             PyObject *kwnames)
{
    return async_rw((engine_obj *)self, "batch_transfer_async_read",
                    KVT_OP_READ, args, nargs, kwnames);
}

static PyObject *m_batch_transfer_async(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[6];
    uint32_t op;

    if (kvtpy_args("batch_transfer_async", args, nargs, kwnames,
                   async_op_params, 5, 6, a) < 0 ||
        opcode_of(a[4], &op) < 0 || check_hint(a[5]) < 0 ||
        need_engine((engine_obj *)self) < 0)
        return NULL;
    return async_batch((engine_obj *)self, "batch_transfer_async", op, a[0],
                       a[1], a[2], a[3]);
}

static PyObject *m_transfer_submit_write(PyObject *self,
                                         PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];
    descs_t ds;

    if (kvtpy_args("transfer_submit_write", args, nargs, kwnames, one_params,
                   4, 5, a) < 0 ||
        check_hint(a[4]) < 0 || need_engine((engine_obj *)self) < 0)
        return NULL;
    if (descs_from_one(&ds, KVT_OP_WRITE, a[1], a[2], a[3]) < 0)
        return NULL;
    return async_common((engine_obj *)self, "transfer_submit_write", a[0],
                        &ds);
}

/*
 * transfer_check_status(id): 1 completed, 0 pending, -1 failed, -2 timed
 * out. As in Mooncake, the id is freed when it completed or failed and
 * stays valid while pending or timed out. An unknown id reads as failed.
 */
static PyObject *m_transfer_check_status(PyObject *self, PyObject *arg)
{
    engine_obj *e = (engine_obj *)self;
    kvt_status_t st;
    uint64_t id;

    if (need_engine(e) < 0 || kvtpy_u64(arg, "batch_id", &id) < 0)
        return NULL;
    st = kvtpy_ids_check(&e->ids, id);
    switch (st) {
    case KVT_OK:
        return ret_int(1);
    case KVT_INPROGRESS:
        return ret_int(0);
    case KVT_ERR_TIMEDOUT:
        kvtpy_log("warning", "transfer_check_status(%llu): timed out",
                  (unsigned long long)id);
        return ret_int(-2);
    case KVT_ERR_NOT_FOUND:
        kvtpy_log("warning",
                  "transfer_check_status(%llu): unknown batch id (never "
                  "issued, or already freed)",
                  (unsigned long long)id);
        return ret_int(-1);
    default:
        kvtpy_log("warning", "transfer_check_status(%llu): failed: %s (%s)",
                  (unsigned long long)id, kvt_status_name(st),
                  kvt_status_str(st));
        return ret_int(-1);
    }
}

/*
 * get_batch_transfer_status(ids): sleep until every listed batch is final,
 * then free all of the ids, as Mooncake does. 0 when all completed, -1
 * otherwise. Unlike Mooncake, it does not return at the first failure
 * while other batches are still in flight: when it returns, no listed
 * transfer touches memory any more (each is bounded by the transfer
 * timeout, so neither does this wait run unbounded).
 */
static PyObject *m_get_batch_transfer_status(PyObject *self, PyObject *arg)
{
    engine_obj *e = (engine_obj *)self;
    kvt_batch_h *batches = NULL;
    kvt_status_t *sts = NULL;
    uint32_t *slots = NULL;
    uint64_t *ids = NULL;
    PyObject *r = NULL;
    Py_ssize_t n;
    int failed = 0;

    if (need_engine(e) < 0)
        return NULL;
    n = seq_len(arg, "batch_ids");
    if (n < 0)
        return NULL;
    ids = calloc((size_t)n + 1, sizeof(*ids));
    batches = calloc((size_t)n + 1, sizeof(*batches));
    slots = calloc((size_t)n + 1, sizeof(*slots));
    sts = calloc((size_t)n + 1, sizeof(*sts));
    if (ids == NULL || batches == NULL || slots == NULL || sts == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (u64_item(arg, i, "batch_ids[i]", &ids[i]) < 0)
            goto out;
    Py_BEGIN_ALLOW_THREADS
    kvtpy_ids_acquire(&e->ids, ids, (size_t)n, batches, slots);
    for (Py_ssize_t i = 0; i < n; i++)
        sts[i] = batches[i] ? kvt_batch_wait(batches[i], -1)
                            : KVT_ERR_NOT_FOUND;
    kvtpy_ids_finish(&e->ids, batches, slots, (size_t)n);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sts[i] == KVT_OK)
            continue;
        failed = 1;
        if (sts[i] == KVT_ERR_NOT_FOUND && batches[i] == NULL)
            kvtpy_log("warning",
                      "get_batch_transfer_status: unknown batch id %llu",
                      (unsigned long long)ids[i]);
        else
            kvtpy_log("warning",
                      "get_batch_transfer_status: batch %llu failed: %s (%s)",
                      (unsigned long long)ids[i], kvt_status_name(sts[i]),
                      kvt_status_str(sts[i]));
    }
    r = ret_int(failed ? -1 : 0);
out:
    free(ids);
    free(batches);
    free(slots);
    free(sts);
    return r;
}

/* ---- Notifications and probes ------------------------------------------- */

static PyObject *m_get_notifies(PyObject *self, PyObject *unused)
{
    engine_obj *e = (engine_obj *)self;
    PyObject *list;
    size_t got;

    if (need_engine(e) < 0)
        return NULL;
    list = PyList_New(0);
    if (list == NULL)
        return NULL;
    do {
        /* Does not block (timeout 0), so the GIL stays held and guards
         * the scratch buffer. */
        if (kvt_notify_recv(e->engine, e->nbuf, NOTIFY_CHUNK, &got, 0) !=
            KVT_OK)
            break;
        for (size_t i = 0; i < got; i++) {
            PyObject *n = kvtpy_notify_decode(&e->nbuf[i]);
            if (n == NULL || PyList_Append(list, n) < 0) {
                Py_XDECREF(n);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(n);
        }
    } while (got == NOTIFY_CHUNK);
    return list;
}

/* kvt extension: a notification on its own, ordered after every write
 * this engine submitted to the target before it. */
static PyObject *m_send_notify(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"target_hostname", "notify"};
    PyObject *a[2];
    descs_t ds = {.n = 0};

    ds.d = ds.inline_d;
    if (kvtpy_args("send_notify", args, nargs, kwnames, params, 2, 2, a) <
            0 ||
        need_engine((engine_obj *)self) < 0)
        return NULL;
    if (a[1] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "notify must be a TransferNotify");
        return NULL;
    }
    return sync_common((engine_obj *)self, "send_notify", a[0], &ds, a[1]);
}

/*
 * send_probe(peer): 0 when the peer answers a fresh handshake and
 * descriptor query, -1 otherwise. The query goes over a new connection, so
 * it also catches a peer whose cached session has not failed yet.
 */
static PyObject *m_send_probe(PyObject *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"peer_server_name"};
    engine_obj *e = (engine_obj *)self;
    const char *name;
    kvt_segment_t seg;
    kvt_status_t st;
    stage_t stage = STAGE_OPEN;
    PyObject *a[1];
    size_t count;

    if (kvtpy_args("send_probe", args, nargs, kwnames, params, 1, 1, a) < 0 ||
        need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(a[0], "peer_server_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK) {
        stage = STAGE_TRANSFER;
        st = kvt_segment_regions(e->engine, seg, 1, NULL, 0, &count);
    }
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("info", "send_probe(%s): %s: %s", name,
                  stage == STAGE_OPEN ? "cannot open segment"
                                      : "descriptor query failed",
                  kvt_status_name(st));
        return ret_int(-1);
    }
    return ret_int(0);
}

/*
 * get_first_buffer_address(segment): the lowest-addressed region the peer
 * registered (kvt keeps regions sorted by address; Mooncake returns the
 * first registered), or 0. The descriptor is fetched afresh so that
 * regions registered after the segment was first opened count.
 */
static PyObject *m_get_first_buffer_address(PyObject *self, PyObject *arg)
{
    engine_obj *e = (engine_obj *)self;
    kvt_remote_region_t region;
    const char *name;
    kvt_segment_t seg;
    kvt_status_t st;
    size_t count = 0;

    if (need_engine(e) < 0)
        return NULL;
    name = kvtpy_cstr(arg, "segment_name");
    if (name == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_segment_open(e->engine, name, &seg);
    if (st == KVT_OK)
        st = kvt_segment_regions(e->engine, seg, 1, &region, 1, &count);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("warning", "get_first_buffer_address(%s): %s (%s)", name,
                  kvt_status_name(st), kvt_status_str(st));
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong(count > 0 ? region.addr : 0);
}

/* ---- Memory --------------------------------------------------------------- */

/* Mooncake locations: "*" (any), "cpu:N", "cuda:N", ... Only GPU ones
 * change the memory kind. */
static int kind_of(PyObject *loc, kvt_mem_kind_t *kind)
{
    const char *s;

    *kind = KVT_MEM_HOST;
    if (loc == NULL || loc == Py_None)
        return 0;
    s = kvtpy_cstr(loc, "location");
    if (s == NULL)
        return -1;
    if (strncmp(s, "cuda", 4) == 0 || strncmp(s, "npu", 3) == 0 ||
        strncmp(s, "musa", 4) == 0)
        *kind = KVT_MEM_CUDA;
    return 0;
}

static PyObject *register_regions(engine_obj *self, const char *fname,
                                  kvt_mem_region_t *r, size_t n)
{
    kvt_status_t st;

    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_register_batch(self->engine, r, n);
    Py_END_ALLOW_THREADS
    if (st == KVT_OK)
        return ret_int(0);
    if (st == KVT_ERR_NOT_SUPPORTED && n > 0 && r[0].kind != KVT_MEM_HOST)
        kvtpy_log("error",
                  "%s: device memory is not supported by the transports "
                  "in this kvt build (host memory only)",
                  fname);
    else
        kvtpy_log("error", "%s(%#llx, %llu%s): %s (%s)", fname,
                  (unsigned long long)(uintptr_t)r[0].addr,
                  (unsigned long long)r[0].length, n > 1 ? ", ..." : "",
                  kvt_status_name(st), kvt_status_str(st));
    return ret_int(st);
}

static PyObject *m_register_memory(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "capacity",
                                         "location"};
    PyObject *a[3];
    uint64_t addr, len;
    kvt_mem_region_t r;
    kvt_mem_kind_t kind;

    if (kvtpy_args("register_memory", args, nargs, kwnames, params, 2, 3, a) <
            0 ||
        need_engine((engine_obj *)self) < 0 ||
        kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "capacity", &len) < 0 || kind_of(a[2], &kind) < 0)
        return NULL;
    r.addr = (void *)(uintptr_t)addr;
    r.length = (size_t)len;
    r.access = KVT_ACCESS_REMOTE_RW;
    r.kind = kind;
    return register_regions((engine_obj *)self, "register_memory", &r, 1);
}

static PyObject *m_batch_register_memory(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addresses", "capacities",
                                         "location"};
    kvt_mem_region_t *r = NULL;
    PyObject *a[3], *ret = NULL;
    Py_ssize_t n, nc;
    kvt_mem_kind_t kind;

    if (kvtpy_args("batch_register_memory", args, nargs, kwnames, params, 2,
                   3, a) < 0 ||
        need_engine((engine_obj *)self) < 0 || kind_of(a[2], &kind) < 0)
        return NULL;
    n = seq_len(a[0], "buffer_addresses");
    if (n < 0)
        return NULL;
    nc = seq_len(a[1], "capacities");
    if (nc < 0)
        return NULL;
    if (n != nc) {
        kvtpy_log("error",
                  "batch_register_memory: %zd addresses but %zd capacities",
                  n, nc);
        return ret_int(KVT_ERR_INVALID_PARAM);
    }
    if (n == 0)
        return ret_int(0);
    r = calloc((size_t)n, sizeof(*r));
    if (r == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t addr, len;
        if (u64_item(a[0], i, "buffer_addresses[i]", &addr) < 0 ||
            u64_item(a[1], i, "capacities[i]", &len) < 0)
            goto out;
        r[i].addr = (void *)(uintptr_t)addr;
        r[i].length = (size_t)len;
        r[i].access = KVT_ACCESS_REMOTE_RW;
        r[i].kind = kind;
    }
    ret = register_regions((engine_obj *)self, "batch_register_memory", r,
                           (size_t)n);
out:
    free(r);
    return ret;
}

static PyObject *unregister_addrs(engine_obj *self, const char *fname,
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
    return ret_int(st);
}

static PyObject *m_unregister_memory(PyObject *self, PyObject *arg)
{
    uint64_t addr;
    void *p;

    if (need_engine((engine_obj *)self) < 0 ||
        kvtpy_u64(arg, "buffer_addr", &addr) < 0)
        return NULL;
    p = (void *)(uintptr_t)addr;
    return unregister_addrs((engine_obj *)self, "unregister_memory", &p, 1);
}

static PyObject *m_batch_unregister_memory(PyObject *self, PyObject *arg)
{
    PyObject *ret = NULL;
    void **addrs;
    Py_ssize_t n;

    if (need_engine((engine_obj *)self) < 0)
        return NULL;
    n = seq_len(arg, "buffer_addresses");
    if (n < 0)
        return NULL;
    if (n == 0)
        return ret_int(0);
    addrs = calloc((size_t)n, sizeof(*addrs));
    if (addrs == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (u64_item(arg, i, "buffer_addresses[i]", &v) < 0)
            goto out;
        addrs[i] = (void *)(uintptr_t)v;
    }
    ret = unregister_addrs((engine_obj *)self, "batch_unregister_memory",
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
static PyObject *m_allocate_managed_buffer(PyObject *self, PyObject *arg)
{
    engine_obj *e = (engine_obj *)self;
    void *p = NULL;
    kvt_status_t st;
    uint64_t len;

    if (need_engine(e) < 0 || kvtpy_u64(arg, "length", &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_alloc(e->engine, (size_t)len, KVT_ACCESS_REMOTE_RW, &p);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        kvtpy_log("error", "allocate_managed_buffer(%llu): %s (%s)",
                  (unsigned long long)len, kvt_status_name(st),
                  kvt_status_str(st));
        return PyLong_FromUnsignedLongLong(0);
    }
    return PyLong_FromUnsignedLongLong((uint64_t)(uintptr_t)p);
}

static PyObject *m_free_managed_buffer(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"buffer_addr", "length"};
    engine_obj *e = (engine_obj *)self;
    uint64_t addr, len;
    kvt_status_t st;
    PyObject *a[2];

    if (kvtpy_args("free_managed_buffer", args, nargs, kwnames, params, 2, 2,
                   a) < 0 ||
        need_engine(e) < 0 || kvtpy_u64(a[0], "buffer_addr", &addr) < 0 ||
        kvtpy_u64(a[1], "length", &len) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kvt_mem_free(e->engine, (void *)(uintptr_t)addr);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK)
        kvtpy_log("error", "free_managed_buffer(%#llx): %s (%s)",
                  (unsigned long long)addr, kvt_status_name(st),
                  kvt_status_str(st));
    return ret_int(st);
}

/*
 * write_bytes_to_buffer / read_bytes_from_buffer copy between Python
 * objects and raw addresses, exactly as Mooncake's do: the address is
 * trusted (a wrong one crashes the process, as memcpy would).
 */
static PyObject *m_write_bytes_to_buffer(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"dest_address", "src_ptr",
                                         "length"};
    PyObject *a[3];
    uint64_t addr, len;
    Py_buffer view;

    if (kvtpy_args("write_bytes_to_buffer", args, nargs, kwnames, params, 3,
                   3, a) < 0 ||
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
        return ret_int(0);
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
    return ret_int(0);
}

static PyObject *m_read_bytes_from_buffer(PyObject *self,
                                          PyObject *const *args,
                                          Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"source_address", "length"};
    PyObject *a[2];
    uint64_t addr, len;

    if (kvtpy_args("read_bytes_from_buffer", args, nargs, kwnames, params, 2,
                   2, a) < 0 ||
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

/* ---- Initialisation ------------------------------------------------------ */

/*
 * Split "host", "host:port", "[v6]:port" or a bare IPv6 address. @host
 * gets the host without brackets; *port_p is 0 when none was given.
 * Returns 0, or -1 for a malformed port.
 */
static int split_host_port(const char *s, char *host, size_t hostsz,
                           uint16_t *port_p)
{
    const char *colon = strrchr(s, ':');
    const char *hs = s, *he;
    char *end;
    long port;

    *port_p = 0;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL)
            return -1;
        hs = s + 1;
        he = rb;
        colon = rb[1] == ':' ? rb + 1 : NULL;
        if (rb[1] != '\0' && colon == NULL)
            return -1;
    } else if (colon != NULL && strchr(s, ':') != colon) {
        colon = NULL; /* bare IPv6 address */
        he = s + strlen(s);
    } else {
        he = colon ? colon : s + strlen(s);
    }
    if ((size_t)(he - hs) >= hostsz)
        return -1;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    if (colon != NULL) {
        port = strtol(colon + 1, &end, 10);
        if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535)
            return -1;
        *port_p = (uint16_t)port;
    }
    return 0;
}

static int is_p2p(const char *s)
{
    return s != NULL && (strcmp(s, "P2PHANDSHAKE") == 0 ||
                         strcmp(s, "p2p") == 0);
}

/*
 * Create the engine. @metadata is a full URI, or "p2p". In p2p mode the
 * port of @local_hostname is ignored and a free one is picked, as Mooncake
 * does, unless MC_LEGACY_RPC_PORT_BINDING is set; with a metadata server
 * the segment is named @local_hostname and its port (if any) is bound.
 */
static int do_initialize(engine_obj *self, const char *local_hostname,
                         const char *metadata, const char *protocol,
                         const char *device_name)
{
    kvt_engine_params_t p = {0};
    int p2p = is_p2p(metadata);
    kvt_engine_h engine = NULL;
    char host[256];
    uint16_t port;
    kvt_status_t st;

    if (self->engine != NULL) {
        kvtpy_log("error", "initialize: this TransferEngine is already "
                           "initialized");
        return -1;
    }
    if (split_host_port(local_hostname, host, sizeof(host), &port) < 0) {
        kvtpy_log("error",
                  "initialize: local_hostname '%s' is not host[:port]",
                  local_hostname);
        return -1;
    }
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_METADATA_URI;
    p.local_host = host[0] ? host : "127.0.0.1";
    p.metadata_uri = p2p ? "p2p" : metadata;
    if (!p2p || getenv("MC_LEGACY_RPC_PORT_BINDING") != NULL) {
        p.field_mask |= KVT_ENGINE_PARAM_PORT;
        p.port = port;
    }
    if (!p2p) {
        p.field_mask |= KVT_ENGINE_PARAM_SEGMENT_NAME;
        p.segment_name = local_hostname;
    }
    if (protocol != NULL && strcmp(protocol, "tcp") == 0) {
        p.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
        p.transports = KVT_TRANSPORT_TCP;
    } else if (protocol != NULL && *protocol != '\0' &&
               strcmp(protocol, "shm") != 0) {
        kvtpy_log("warning",
                  "initialize: protocol '%s' is not a kvt transport; kvt "
                  "picks per peer among those it has (tcp, and shm for "
                  "same-host peers)",
                  protocol);
    }
    if (device_name != NULL && *device_name != '\0')
        kvtpy_log("info", "initialize: device_name '%s' is not used by kvt",
                  device_name);

    Py_BEGIN_ALLOW_THREADS
    st = kvt_engine_create(&p, &engine);
    Py_END_ALLOW_THREADS
    if (st != KVT_OK) {
        if (!p2p && st == KVT_ERR_NOT_SUPPORTED)
            kvtpy_log("error",
                      "initialize: metadata server '%s' needs a metadata "
                      "backend this kvt build does not have; use "
                      "P2PHANDSHAKE (peers are named host:rpc_port)",
                      metadata);
        else
            kvtpy_log("error", "initialize(%s): %s (%s)", local_hostname,
                      kvt_status_name(st), kvt_status_str(st));
        return -1;
    }
    self->engine = engine;
    kvtpy_log("info", "kvt engine up, segment %s",
              kvt_engine_segment_name(engine));
    return 0;
}

/* None is accepted where Mooncake takes a C string (pybind11 passes it as
 * NULL). */
static int opt_cstr(PyObject *o, const char *what, const char **s)
{
    *s = NULL;
    if (o == NULL || o == Py_None)
        return 0;
    *s = kvtpy_cstr(o, what);
    return *s == NULL ? -1 : 0;
}

static PyObject *m_initialize(PyObject *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"local_hostname", "metadata_server",
                                         "protocol", "device_name"};
    const char *local, *server, *protocol, *device;
    PyObject *a[4], *uri = NULL, *r;

    if (kvtpy_args("initialize", args, nargs, kwnames, params, 4, 4, a) < 0 ||
        opt_cstr(a[0], "local_hostname", &local) < 0 ||
        opt_cstr(a[1], "metadata_server", &server) < 0 ||
        opt_cstr(a[2], "protocol", &protocol) < 0 ||
        opt_cstr(a[3], "device_name", &device) < 0)
        return NULL;
    if (local == NULL || server == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "local_hostname and metadata_server must be str");
        return NULL;
    }
    /* Mooncake: "P2PHANDSHAKE", a full URI, or host:port of etcd. */
    if (!is_p2p(server) && strstr(server, "://") == NULL) {
        uri = PyUnicode_FromFormat("etcd://%s", server);
        if (uri == NULL)
            return NULL;
        server = PyUnicode_AsUTF8AndSize(uri, NULL);
    }
    r = ret_int(do_initialize((engine_obj *)self, local, server, protocol,
                              device));
    Py_XDECREF(uri);
    return r;
}

static PyObject *m_initialize_ext(PyObject *self, PyObject *const *args,
                                  Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"local_hostname", "metadata_server",
                                         "protocol", "device_name",
                                         "metadata_type"};
    const char *local, *server, *protocol, *device, *type;
    PyObject *a[5], *uri = NULL, *r;

    if (kvtpy_args("initialize_ext", args, nargs, kwnames, params, 5, 5, a) <
            0 ||
        opt_cstr(a[0], "local_hostname", &local) < 0 ||
        opt_cstr(a[1], "metadata_server", &server) < 0 ||
        opt_cstr(a[2], "protocol", &protocol) < 0 ||
        opt_cstr(a[3], "device_name", &device) < 0 ||
        opt_cstr(a[4], "metadata_type", &type) < 0)
        return NULL;
    if (local == NULL || server == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "local_hostname and metadata_server must be str");
        return NULL;
    }
    /* Mooncake: P2PHANDSHAKE wins; else a server without a scheme gets
     * metadata_type as its scheme. */
    if (is_p2p(type)) {
        server = "p2p";
    } else if (!is_p2p(server) && strstr(server, "://") == NULL) {
        uri = PyUnicode_FromFormat("%s://%s", type ? type : "etcd", server);
        if (uri == NULL)
            return NULL;
        server = PyUnicode_AsUTF8AndSize(uri, NULL);
    }
    r = ret_int(do_initialize((engine_obj *)self, local, server, protocol,
                              device));
    Py_XDECREF(uri);
    return r;
}

static PyObject *m_get_rpc_port(PyObject *self, PyObject *unused)
{
    engine_obj *e = (engine_obj *)self;

    if (need_engine(e) < 0)
        return NULL;
    return ret_int(kvt_engine_rpc_port(e->engine));
}

/* ---- Type ----------------------------------------------------------------- */

static PyObject *engine_new(PyTypeObject *type, PyObject *args,
                            PyObject *kwargs)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    engine_obj *self = (engine_obj *)alloc(type, 0);

    if (self == NULL)
        return NULL;
    self->nbuf = malloc(NOTIFY_CHUNK * sizeof(*self->nbuf));
    if (self->nbuf == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    pthread_mutex_init(&self->pool_lock, NULL);
    kvtpy_ids_init(&self->ids);
    return (PyObject *)self;
}

static int engine_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_Size(args) != 0 || (kwargs && PyDict_Size(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "TransferEngine() takes no "
                                         "arguments; call initialize()");
        return -1;
    }
    return 0;
}

static void engine_dealloc(PyObject *obj)
{
    engine_obj *self = (engine_obj *)obj;
    PyTypeObject *tp = Py_TYPE(obj);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);

    /* A half-built object (engine_new failed) has no nbuf and no locks. */
    if (self->nbuf != NULL) {
        /* Destroying the engine cancels what is in flight and frees every
         * batch, the pooled ones and those behind ids included. Worker
         * threads never take the GIL, so it may stay held. */
        kvt_engine_destroy(self->engine);
        self->engine = NULL;
        kvtpy_ids_fini(&self->ids);
        pthread_mutex_destroy(&self->pool_lock);
        free(self->nbuf);
    }
    tp_free(obj);
    Py_DECREF(tp);
}

#define FAST(name, doc)                                                        \
    {#name, (PyCFunction)(void (*)(void))m_##name,                             \
     METH_FASTCALL | METH_KEYWORDS, doc}
#define ONE(name, doc) {#name, m_##name, METH_O, doc}
#define NONE(name, doc) {#name, m_##name, METH_NOARGS, doc}

static PyMethodDef engine_methods[] = {
    FAST(initialize,
         "initialize(local_hostname, metadata_server, protocol, device_name)"
         " -> 0 or -1\n\nmetadata_server 'P2PHANDSHAKE' needs no server: "
         "peers are named host:rpc_port."),
    FAST(initialize_ext,
         "initialize_ext(local_hostname, metadata_server, protocol, "
         "device_name, metadata_type) -> 0 or -1"),
    NONE(get_rpc_port, "get_rpc_port() -> the port peers reach this engine "
                       "on"),
    FAST(register_memory,
         "register_memory(buffer_addr, capacity, location='*') -> 0 or a "
         "negative kvt status"),
    ONE(unregister_memory,
        "unregister_memory(buffer_addr) -> 0 or a negative kvt status"),
    FAST(batch_register_memory,
         "batch_register_memory(buffer_addresses, capacities, location='*')"
         " -> 0 or a negative kvt status (all or none are registered)"),
    ONE(batch_unregister_memory,
        "batch_unregister_memory(buffer_addresses) -> 0 or the first "
        "failure's negative kvt status"),
    ONE(allocate_managed_buffer,
        "allocate_managed_buffer(length) -> address of registered memory, or"
        " 0"),
    FAST(free_managed_buffer,
         "free_managed_buffer(buffer_addr, length) -> 0 or a negative kvt "
         "status"),
    FAST(write_bytes_to_buffer,
         "write_bytes_to_buffer(dest_address, src_ptr, length) -> 0\n\n"
         "Copies length bytes of src_ptr (bytes-like or str) to the "
         "address."),
    FAST(read_bytes_from_buffer,
         "read_bytes_from_buffer(source_address, length) -> bytes"),
    ONE(get_first_buffer_address,
        "get_first_buffer_address(segment_name) -> address of the peer's "
        "lowest registered region, or 0"),
    FAST(transfer_sync_write,
         "transfer_sync_write(target_hostname, buffer, peer_buffer_address, "
         "length, transport_hint='') -> 0 or -1"),
    FAST(transfer_sync_read,
         "transfer_sync_read(target_hostname, buffer, peer_buffer_address, "
         "length, transport_hint='') -> 0 or -1"),
    FAST(transfer_sync,
         "transfer_sync(target_hostname, buffer, peer_buffer_address, "
         "length, opcode, notify=None, transport_hint='') -> 0 or -1"),
    FAST(batch_transfer_sync_write,
         "batch_transfer_sync_write(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, transport_hint='') -> 0 or -1"),
    FAST(batch_transfer_sync_read,
         "batch_transfer_sync_read(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, transport_hint='') -> 0 or -1"),
    FAST(batch_transfer_sync,
         "batch_transfer_sync(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, opcode, notify=None, "
         "transport_hint='') -> 0 or -1"),
    FAST(batch_transfer_async_write,
         "batch_transfer_async_write(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, transport_hint='') -> batch id, "
         "or 0"),
    FAST(batch_transfer_async_read,
         "batch_transfer_async_read(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, transport_hint='') -> batch id, "
         "or 0"),
    FAST(batch_transfer_async,
         "batch_transfer_async(target_hostname, buffers, "
         "peer_buffer_addresses, lengths, opcode, transport_hint='') -> "
         "batch id, or 0"),
    FAST(transfer_submit_write,
         "transfer_submit_write(target_hostname, buffer, "
         "peer_buffer_address, length, transport_hint='') -> batch id, or "
         "0"),
    ONE(transfer_check_status,
        "transfer_check_status(batch_id) -> 1 completed, 0 pending, -1 "
        "failed, -2 timed out\n\nThe id is freed when it completed or "
        "failed."),
    ONE(get_batch_transfer_status,
        "get_batch_transfer_status(batch_ids) -> 0 if all completed, else "
        "-1\n\nWaits until every listed batch is final, then frees the "
        "ids."),
    NONE(get_notifies,
         "get_notifies() -> list of TransferNotify received since the last "
         "call"),
    FAST(send_notify,
         "send_notify(target_hostname, notify) -> 0 or -1 (kvt extension)\n"
         "\nDelivered after every write this engine submitted to the target"
         " before it."),
    FAST(send_probe,
         "send_probe(peer_server_name) -> 0 if the peer answers, else -1"),
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_doc, (void *)"TransferEngine()\n\n"
                        "kvt's implementation of "
                        "mooncake.engine.TransferEngine. Call initialize() "
                        "before anything else."},
    {Py_tp_new, engine_new},
    {Py_tp_init, engine_init},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "kvt.TransferEngine",
    .basicsize = sizeof(engine_obj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = engine_slots,
};

PyTypeObject *kvtpy_engine_type_create(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &engine_spec,
                                                    NULL);
}
