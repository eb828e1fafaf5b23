/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transfer methods of kvt.TransferEngine: synchronous and asynchronous
 * transfers, batch ids and their status, notifications sent with a
 * transfer.
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

#include <stdatomic.h>
#include <time.h>

/*
 * Sleep until every descriptor of @b is final; the batch's status. Every
 * descriptor is bounded by the transfer timeout, so this ends.
 */
static kvt_status_t wait_final(kvt_batch_h b)
{
    return kvt_batch_wait(b, -1);
}

/* A batch with room for @n descriptors: a pooled one when @n fits. */
static kvt_batch_h pool_get(kvtpy_engine_t *self, size_t n)
{
    kvt_batch_h b = NULL;

    if (n <= KVTPY_POOL_CAP) {
        pthread_mutex_lock(&self->pool_lock);
        if (self->npool > 0)
            b = self->pool[--self->npool];
        pthread_mutex_unlock(&self->pool_lock);
        if (b != NULL)
            return b;
        n = KVTPY_POOL_CAP;
    }
    if (kvt_batch_create(self->engine, n, &b) != KVT_OK)
        return NULL;
    return b;
}

/* Return a batch whose descriptors are all final. */
static void pool_put(kvtpy_engine_t *self, kvt_batch_h b, size_t n)
{
    if (n <= KVTPY_POOL_CAP && kvt_batch_reset(b) == KVT_OK) {
        pthread_mutex_lock(&self->pool_lock);
        if (self->npool < KVTPY_POOL_MAX) {
            self->pool[self->npool++] = b;
            b = NULL;
        }
        pthread_mutex_unlock(&self->pool_lock);
    }
    if (b != NULL)
        kvt_batch_free(b);
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

int kvtpy_check_hint(PyObject *hint)
{
    if (hint == NULL || hint == Py_None || PyUnicode_Check(hint))
        return 0;
    PyErr_SetString(PyExc_TypeError, "transport_hint must be a str");
    return -1;
}

void kvtpy_descs_fini(descs_t *ds)
{
    if (ds->d != ds->inline_d)
        free(ds->d);
}

/* Append one descriptor; zero-length pieces move nothing and are dropped
 * (kvt refuses them, Mooncake completes them). */
static void descs_add(descs_t *ds, uint32_t op, uint64_t local, uint64_t remote,
                      uint64_t len)
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

int kvtpy_descs_from_lists(descs_t *ds, const char *fname, uint32_t op,
                           PyObject *bufs, PyObject *peers, PyObject *lens)
{
    Py_ssize_t nb, np, nl;

    ds->d = ds->inline_d;
    ds->n = 0;
    nb = kvtpy_seq_len(bufs, "buffers");
    if (nb < 0)
        return -1;
    np = kvtpy_seq_len(peers, "peer_buffer_addresses");
    if (np < 0)
        return -1;
    nl = kvtpy_seq_len(lens, "lengths");
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
        if (kvtpy_u64_item(bufs, i, "buffers[i]", &b) < 0 ||
            kvtpy_u64_item(peers, i, "peer_buffer_addresses[i]", &p) < 0 ||
            kvtpy_u64_item(lens, i, "lengths[i]", &l) < 0) {
            kvtpy_descs_fini(ds);
            ds->d = ds->inline_d;
            return -1;
        }
        descs_add(ds, op, b, p, l);
    }
    return 0;
}

int kvtpy_descs_from_one(descs_t *ds, uint32_t op, PyObject *buf,
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

/* ---- Synchronous transfers ----------------------------------------------- */

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
 * How long a synchronous call of at most SPIN_BYTES polls its batch before
 * it sleeps: KVT_SYNC_SPIN_US microseconds (default 50; 0: never). A small
 * synchronous transfer is all round trip, and a sleeping caller adds its
 * own wake-up to it (about 29 us on the development VMs, half the round
 * trip: docs/benchmarks.md, "kvt beside Mooncake's wheel"); Mooncake's
 * synchronous calls poll for as long as they take. Larger transfers sleep
 * at once: the CPU is better left to the copies.
 */
#define SPIN_BYTES (64u << 10)
#define SPIN_DEFAULT_US 50

static int64_t spin_ns(void)
{
    static _Atomic int64_t ns = -1;
    int64_t v = atomic_load_explicit(&ns, memory_order_relaxed);
    const char *e;

    if (v >= 0)
        return v;
    e = getenv("KVT_SYNC_SPIN_US");
    v = SPIN_DEFAULT_US;
    if (e != NULL && *e != '\0') {
        char *end;
        long us = strtol(e, &end, 10);
        if (*end == '\0' && us >= 0 && us <= 1000000)
            v = us;
    }
    v *= 1000;
    atomic_store_explicit(&ns, v, memory_order_relaxed);
    return v;
}

static int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Submit and wait, polling first when the transfer is small and goes over
 * the network (over shm the calling thread copies it itself). */
static kvt_status_t submit_wait(kvt_engine_h e, kvt_segment_t seg,
                                kvt_batch_h b, descs_t *ds)
{
    int64_t spin = spin_ns(), end;
    const char *t = NULL;
    uint64_t bytes = 0;
    kvt_status_t st;

    for (size_t i = 0; i < ds->n; i++)
        bytes += ds->d[i].length;
    if (spin == 0 || bytes > SPIN_BYTES ||
        (kvt_segment_transport(e, seg, KVT_MEM_HOST, KVT_MEM_HOST, &t) ==
             KVT_OK &&
         strcmp(t, "shm") == 0))
        /* The calling thread may read its own responses. */
        return kvt_batch_submit_wait(b, ds->d, ds->n, -1);
    st = kvt_batch_submit(b, ds->d, ds->n);
    if (st != KVT_OK)
        return st;
    end = mono_ns() + spin;
    do {
        st = kvt_batch_query(b, NULL);
    } while (st == KVT_INPROGRESS && mono_ns() < end);
    return st == KVT_INPROGRESS ? kvt_batch_wait(b, -1) : st;
}

/*
 * Open the target, run the descriptors to completion and, when they all
 * succeeded, send the notification. Runs without the GIL. Every step is
 * bounded: opening by the connect timeout, each descriptor by the
 * transfer timeout, the notification by the transfer timeout.
 */
static void run_sync(kvtpy_engine_t *self, sync_req_t *r)
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
        r->st = submit_wait(self->engine, seg, b, r->ds);
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
static PyObject *sync_common(kvtpy_engine_t *self, const char *fname,
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
        return kvtpy_int(-1);
    }
    return kvtpy_int(0);
}

static const char *const one_params[] = {"target_hostname", "buffer",
                                         "peer_buffer_address", "length",
                                         "transport_hint"};
static const char *const one_op_params[] = {
    "target_hostname", "buffer", "peer_buffer_address", "length",
    "opcode",          "notify", "transport_hint"};
static const char *const batch_params[] = {"target_hostname", "buffers",
                                           "peer_buffer_addresses", "lengths",
                                           "transport_hint"};
static const char *const batch_op_params[] = {
    "target_hostname", "buffers", "peer_buffer_addresses", "lengths",
    "opcode",          "notify",  "transport_hint"};
static const char *const async_op_params[] = {
    "target_hostname", "buffers", "peer_buffer_addresses",
    "lengths",         "opcode",  "transport_hint"};

static PyObject *sync_one(kvtpy_engine_t *self, const char *fname, uint32_t op,
                          PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    PyObject *a[5];
    descs_t ds;

    if (kvtpy_args(fname, args, nargs, kwnames, one_params, 4, 5, a) < 0 ||
        kvtpy_check_hint(a[4]) < 0 || kvtpy_need_engine(self) < 0)
        return NULL;
    if (kvtpy_descs_from_one(&ds, op, a[1], a[2], a[3]) < 0)
        return NULL;
    return sync_common(self, fname, a[0], &ds, NULL);
}

PyObject *kvtpy_m_transfer_sync_write(PyObject *self, PyObject *const *args,
                                      Py_ssize_t nargs, PyObject *kwnames)
{
    return sync_one((kvtpy_engine_t *)self, "transfer_sync_write", KVT_OP_WRITE,
                    args, nargs, kwnames);
}

PyObject *kvtpy_m_transfer_sync_read(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames)
{
    return sync_one((kvtpy_engine_t *)self, "transfer_sync_read", KVT_OP_READ,
                    args, nargs, kwnames);
}

PyObject *kvtpy_m_transfer_sync(PyObject *self, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[7];
    uint32_t op;
    descs_t ds;

    if (kvtpy_args("transfer_sync", args, nargs, kwnames, one_op_params, 5, 7,
                   a) < 0 ||
        opcode_of(a[4], &op) < 0 || kvtpy_check_hint(a[6]) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    if (kvtpy_descs_from_one(&ds, op, a[1], a[2], a[3]) < 0)
        return NULL;
    return sync_common((kvtpy_engine_t *)self, "transfer_sync", a[0], &ds,
                       a[5]);
}

static PyObject *sync_batch(kvtpy_engine_t *self, const char *fname,
                            uint32_t op, PyObject *target, PyObject *bufs,
                            PyObject *peers, PyObject *lens, PyObject *notify)
{
    PyObject *r;
    descs_t ds;
    int rc;

    rc = kvtpy_descs_from_lists(&ds, fname, op, bufs, peers, lens);
    if (rc < 0)
        return NULL;
    if (rc > 0)
        return kvtpy_int(-1);
    r = sync_common(self, fname, target, &ds, notify);
    kvtpy_descs_fini(&ds);
    return r;
}

static PyObject *batch_sync_rw(kvtpy_engine_t *self, const char *fname,
                               uint32_t op, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];

    if (kvtpy_args(fname, args, nargs, kwnames, batch_params, 4, 5, a) < 0 ||
        kvtpy_check_hint(a[4]) < 0 || kvtpy_need_engine(self) < 0)
        return NULL;
    return sync_batch(self, fname, op, a[0], a[1], a[2], a[3], NULL);
}

PyObject *kvtpy_m_batch_transfer_sync_write(PyObject *self,
                                            PyObject *const *args,
                                            Py_ssize_t nargs, PyObject *kwnames)
{
    return batch_sync_rw((kvtpy_engine_t *)self, "batch_transfer_sync_write",
                         KVT_OP_WRITE, args, nargs, kwnames);
}

PyObject *kvtpy_m_batch_transfer_sync_read(PyObject *self,
                                           PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames)
{
    return batch_sync_rw((kvtpy_engine_t *)self, "batch_transfer_sync_read",
                         KVT_OP_READ, args, nargs, kwnames);
}

PyObject *kvtpy_m_batch_transfer_sync(PyObject *self, PyObject *const *args,
                                      Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[7];
    uint32_t op;

    if (kvtpy_args("batch_transfer_sync", args, nargs, kwnames, batch_op_params,
                   5, 7, a) < 0 ||
        opcode_of(a[4], &op) < 0 || kvtpy_check_hint(a[6]) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    return sync_batch((kvtpy_engine_t *)self, "batch_transfer_sync", op, a[0],
                      a[1], a[2], a[3], a[5]);
}

/* ---- Asynchronous transfers --------------------------------------------- */

/*
 * Open the target and submit the descriptors into a batch of their own;
 * without the GIL. Sets *batch_p on success. A descriptor that fails
 * validation does not fail the submission: its slot is final at once and
 * the id reports the failure.
 */
static kvt_status_t submit_async(kvtpy_engine_t *self, const char *target,
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
static PyObject *async_common(kvtpy_engine_t *self, const char *fname,
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
            wait_final(b);
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

static PyObject *async_batch(kvtpy_engine_t *self, const char *fname,
                             uint32_t op, PyObject *target, PyObject *bufs,
                             PyObject *peers, PyObject *lens)
{
    PyObject *r;
    descs_t ds;
    int rc;

    rc = kvtpy_descs_from_lists(&ds, fname, op, bufs, peers, lens);
    if (rc < 0)
        return NULL;
    if (rc > 0)
        return PyLong_FromUnsignedLongLong(0);
    r = async_common(self, fname, target, &ds);
    kvtpy_descs_fini(&ds);
    return r;
}

static PyObject *async_rw(kvtpy_engine_t *self, const char *fname, uint32_t op,
                          PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    PyObject *a[5];

    if (kvtpy_args(fname, args, nargs, kwnames, batch_params, 4, 5, a) < 0 ||
        kvtpy_check_hint(a[4]) < 0 || kvtpy_need_engine(self) < 0)
        return NULL;
    return async_batch(self, fname, op, a[0], a[1], a[2], a[3]);
}

PyObject *kvtpy_m_batch_transfer_async_write(PyObject *self,
                                             PyObject *const *args,
                                             Py_ssize_t nargs,
                                             PyObject *kwnames)
{
    return async_rw((kvtpy_engine_t *)self, "batch_transfer_async_write",
                    KVT_OP_WRITE, args, nargs, kwnames);
}

PyObject *kvtpy_m_batch_transfer_async_read(PyObject *self,
                                            PyObject *const *args,
                                            Py_ssize_t nargs, PyObject *kwnames)
{
    return async_rw((kvtpy_engine_t *)self, "batch_transfer_async_read",
                    KVT_OP_READ, args, nargs, kwnames);
}

PyObject *kvtpy_m_batch_transfer_async(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[6];
    uint32_t op;

    if (kvtpy_args("batch_transfer_async", args, nargs, kwnames,
                   async_op_params, 5, 6, a) < 0 ||
        opcode_of(a[4], &op) < 0 || kvtpy_check_hint(a[5]) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    return async_batch((kvtpy_engine_t *)self, "batch_transfer_async", op, a[0],
                       a[1], a[2], a[3]);
}

PyObject *kvtpy_m_transfer_submit_write(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];
    descs_t ds;

    if (kvtpy_args("transfer_submit_write", args, nargs, kwnames, one_params, 4,
                   5, a) < 0 ||
        kvtpy_check_hint(a[4]) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    if (kvtpy_descs_from_one(&ds, KVT_OP_WRITE, a[1], a[2], a[3]) < 0)
        return NULL;
    return async_common((kvtpy_engine_t *)self, "transfer_submit_write", a[0],
                        &ds);
}

/*
 * transfer_check_status(id): 1 completed, 0 pending, -1 failed, -2 timed
 * out. As in Mooncake, the id is freed when it completed or failed and
 * stays valid while pending or timed out. An unknown id reads as failed.
 */
PyObject *kvtpy_m_transfer_check_status(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    kvt_status_t st;
    uint64_t id;

    if (kvtpy_need_engine(e) < 0 || kvtpy_u64(arg, "batch_id", &id) < 0)
        return NULL;
    st = kvtpy_ids_check(&e->ids, id);
    switch (st) {
    case KVT_OK:
        return kvtpy_int(1);
    case KVT_INPROGRESS:
        return kvtpy_int(0);
    case KVT_ERR_TIMEDOUT:
        kvtpy_log("warning", "transfer_check_status(%llu): timed out",
                  (unsigned long long)id);
        return kvtpy_int(-2);
    case KVT_ERR_NOT_FOUND:
        kvtpy_log("warning",
                  "transfer_check_status(%llu): unknown batch id (never "
                  "issued, or already freed)",
                  (unsigned long long)id);
        return kvtpy_int(-1);
    default:
        kvtpy_log("warning", "transfer_check_status(%llu): failed: %s (%s)",
                  (unsigned long long)id, kvt_status_name(st),
                  kvt_status_str(st));
        return kvtpy_int(-1);
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
PyObject *kvtpy_m_get_batch_transfer_status(PyObject *self, PyObject *arg)
{
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    kvt_batch_h *batches = NULL;
    kvt_status_t *sts = NULL;
    uint32_t *slots = NULL;
    uint64_t *ids = NULL;
    PyObject *r = NULL;
    Py_ssize_t n;
    int failed = 0;

    if (kvtpy_need_engine(e) < 0)
        return NULL;
    n = kvtpy_seq_len(arg, "batch_ids");
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
        if (kvtpy_u64_item(arg, i, "batch_ids[i]", &ids[i]) < 0)
            goto out;
    Py_BEGIN_ALLOW_THREADS
    kvtpy_ids_acquire(&e->ids, ids, (size_t)n, batches, slots);
    for (Py_ssize_t i = 0; i < n; i++)
        sts[i] = batches[i] ? wait_final(batches[i]) : KVT_ERR_NOT_FOUND;
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
    r = kvtpy_int(failed ? -1 : 0);
out:
    free(ids);
    free(batches);
    free(slots);
    free(sts);
    return r;
}

/* kvt extension: a notification on its own, ordered after every write
 * this engine submitted to the target before it. */
PyObject *kvtpy_m_send_notify(PyObject *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const params[] = {"target_hostname", "notify"};
    PyObject *a[2];
    descs_t ds = {.n = 0};

    ds.d = ds.inline_d;
    if (kvtpy_args("send_notify", args, nargs, kwnames, params, 2, 2, a) < 0 ||
        kvtpy_need_engine((kvtpy_engine_t *)self) < 0)
        return NULL;
    if (a[1] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "notify must be a TransferNotify");
        return NULL;
    }
    return sync_common((kvtpy_engine_t *)self, "send_notify", a[0], &ds, a[1]);
}
