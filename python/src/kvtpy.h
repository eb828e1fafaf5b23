/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVTPY_H
#define KVTPY_H

/*
 * Internal declarations of the kvt._kvt extension module. The module is
 * built against the CPython limited API of 3.11 (an abi3 .so), so it only
 * uses functions of the stable ABI: no PyList_GET_ITEM, no private
 * structure fields.
 *
 * Locking rule for the whole module: a pthread mutex of this module is
 * never held while acquiring the GIL, and no Python object is touched
 * while one is held. Code holding the GIL may take such a mutex briefly
 * (its holders never wait for the GIL, so this cannot deadlock).
 */
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kvt/kvt.h>

/* ---- module.c: shared objects and helpers ------------------------------- */

/* Set once by the module's init function; strong references. */
extern PyObject *kvtpy_logger;          /* logging.getLogger("kvt") */
extern PyTypeObject *kvtpy_notify_type; /* kvt.TransferNotify */

/* Log through Python's logging module at @level ("debug", "info",
 * "warning", "error"). Needs the GIL; keeps any pending exception. */
void kvtpy_log(const char *level, const char *fmt, ...);

/*
 * Collect the arguments of a METH_FASTCALL | METH_KEYWORDS method into
 * @out[0..nparams) by parameter name. The first @nreq parameters are
 * required; optional ones not given are left NULL. Returns 0, or -1 with
 * a TypeError set. Borrowed references.
 */
int kvtpy_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames, const char *const *params, int nreq,
               int nparams, PyObject **out);

/* An unsigned 64-bit value from an int or any object with __index__
 * (numpy integers). Returns 0, or -1 with TypeError/OverflowError set that
 * names @what. */
int kvtpy_u64(PyObject *o, const char *what, uint64_t *v);

/* The length of a list, tuple or other sequence that is not a string;
 * -1 with TypeError set otherwise. */
Py_ssize_t kvtpy_seq_len(PyObject *seq, const char *what);

/* Item @i of a sequence as an unsigned 64-bit value (see kvtpy_u64). */
int kvtpy_u64_item(PyObject *seq, Py_ssize_t i, const char *what, uint64_t *v);

/* A NUL-terminated UTF-8 view of a str or bytes object, valid while @o
 * lives. Returns NULL with an exception set. */
const char *kvtpy_cstr(PyObject *o, const char *what);

/* ---- logbridge.c: kvt's C log lines into Python's logging -------------- */

/* Add _log_capture, _log_next and _log_emit to the module. */
int kvtpy_logbridge_init(PyObject *m);
/* Pass kvt's C log lines queued so far to the logger "kvt" now, on the
 * calling thread (GIL held), after the batch the log thread holds: so
 * that a failure's cause, logged by the C library, is out before the
 * binding's own line about it and before the call returns. Errors are
 * swallowed. */
void kvtpy_logbridge_flush(void);

/* ---- notify.c: TransferNotify and the notification payload -------------- */

PyTypeObject *kvtpy_notify_type_create(PyObject *module);

/*
 * Encode a TransferNotify-like object (any object with .name and .msg,
 * each str or bytes) into @buf (KVT_NOTIFY_MAX bytes). Sets *len_p.
 * Returns 0, or -1 with an exception set (wrong types, too long).
 */
int kvtpy_notify_encode(PyObject *notify, char *buf, size_t *len_p);

/* Build a TransferNotify from a received notification. New reference, or
 * NULL with an exception set. */
PyObject *kvtpy_notify_decode(const kvt_notify_t *n);

/* ---- batch_ids.c: the table behind Mooncake-style batch ids ------------- */

/*
 * Mooncake hands out batch ids as plain integers. kvt maps each id to a
 * kvt_batch_h through this table: id = generation << 32 | (index + 1), so
 * 0 is never an id, and an id that was freed (its slot's generation has
 * moved on) is recognised as unknown instead of aliasing a newer batch.
 *
 * An entry may be referenced by callers waiting on it with the table lock
 * released (refs). Releasing the id makes it unknown at once; the batch is
 * freed, and the slot reused, when the last reference is dropped. Batches
 * are only released once none of their descriptors is pending, so
 * kvt_batch_free() never refuses here.
 */
typedef struct {
    kvt_batch_h batch;
    uint32_t gen;
    uint32_t refs;
    int live;
} kvtpy_id_entry_t;

typedef struct {
    pthread_mutex_t lock;
    kvtpy_id_entry_t *entries;
    uint32_t *free_slots;
    size_t nfree;
    size_t count;
    size_t cap;
} kvtpy_ids_t;

void kvtpy_ids_init(kvtpy_ids_t *t);
/* Frees the table itself; the batches belong to the engine, which frees
 * them on destruction. */
void kvtpy_ids_fini(kvtpy_ids_t *t);
/* A new id for @b, or 0 when out of memory. */
uint64_t kvtpy_ids_add(kvtpy_ids_t *t, kvt_batch_h b);

/*
 * Non-blocking check of one id, with Mooncake's freeing rule applied:
 * completed and failed ids are released, pending and timed-out ones stay.
 * Returns the batch's kvt_batch_query() status, or KVT_ERR_NOT_FOUND for
 * an unknown id.
 */
kvt_status_t kvtpy_ids_check(kvtpy_ids_t *t, uint64_t id);

/* Take a reference on each of @n ids: @batches[i] is set to its batch, or
 * NULL for an unknown id (whose @slots[i] is then unused). */
void kvtpy_ids_acquire(kvtpy_ids_t *t, const uint64_t *ids, size_t n,
                       kvt_batch_h *batches, uint32_t *slots);
/* Release the ids acquired above and drop the references. Every batch
 * must be final. */
void kvtpy_ids_finish(kvtpy_ids_t *t, const kvt_batch_h *batches,
                      const uint32_t *slots, size_t n);

/* ---- connector*.c: kvt.Connector, kvt.Room, kvt.BootstrapServer ------- */

/* A Connector: its own engine and kvt_conn_h. */
typedef struct {
    PyObject_HEAD kvt_engine_h engine;
    kvt_conn_h conn; /* NULL once closed */
    int role;
} kvtpy_conn_t;

/* A sender or receiver room of a Connector. */
typedef struct {
    PyObject_HEAD kvtpy_conn_t *owner; /* strong reference */
    struct kvt_room *room;
} kvtpy_room_t;

/* connector.c: add Connector, Room, BootstrapServer and the layout
 * constants to the module. */
int kvtpy_connector_init(PyObject *m);

/* connector_room.c: the Room type, created by kvtpy_connector_init()
 * (the module keeps it alive). */
extern PyType_Spec kvtpy_room_spec;
extern PyTypeObject *kvtpy_room_type;
/* A Room for @room, owned by @owner (a new reference to it is taken).
 * New reference, or NULL with an exception set and @room destroyed. */
PyObject *kvtpy_room_wrap(kvtpy_conn_t *owner, struct kvt_room *room);

/* connector_boot.c: the BootstrapServer type. */
extern PyType_Spec kvtpy_boot_spec;

/* ---- post.c: kvt.Post, the NIXL agent's transfers --------------------- */

/* Add the Post type to the module. */
int kvtpy_post_init(PyObject *m);
PyObject *kvtpy_m__post(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);
/* notify_raw.c: raw notification payloads (kvt.nixl). */
PyObject *kvtpy_m__notify_send_raw(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvtpy_m__notify_recv_raw(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames);

/* ---- engine*.c and transfer.c: kvt.TransferEngine --------------------- */

/* Synchronous calls of up to KVTPY_POOL_CAP descriptors use pooled
 * batches of that capacity; KVTPY_POOL_MAX of them are kept, enough for
 * that many threads calling at once. */
#define KVTPY_POOL_CAP 64
#define KVTPY_POOL_MAX 8

typedef struct {
    PyObject_HEAD
        /* NULL until initialize() succeeds; then fixed for the object's life,
         * so methods read it without a lock. */
        kvt_engine_h engine;
    pthread_mutex_t pool_lock;
    kvt_batch_h pool[KVTPY_POOL_MAX];
    int npool;
    kvtpy_ids_t ids;
    /* Set, with the GIL held, while initialize() creates the engine. */
    int initializing;
    /* Stream-ordered transfers (transfer_cuda.c); NULL until the first. */
    struct kvtpy_cuda_state *cuda;
} kvtpy_engine_t;

PyTypeObject *kvtpy_engine_type_create(PyObject *module);

/* ---- transfer.c: the descriptors of Mooncake-style calls ---------------- */

/*
 * The descriptors of a transfer request, built with the GIL held and used
 * without it (their segments set once the target is open). Small requests
 * live in the inline array. Zero-length pieces are dropped (kvt refuses
 * them, Mooncake completes them), so n may be 0.
 */
typedef struct {
    kvt_xfer_desc_t inline_d[8];
    kvt_xfer_desc_t *d;
    size_t n;
} descs_t;

void kvtpy_descs_fini(descs_t *ds);
/*
 * Build descriptors of opcode @op from three parallel lists. Returns 0; 1
 * when the list lengths differ (logged: Mooncake returns a failure code
 * for that, it does not raise); -1 with an exception set for wrong types.
 */
int kvtpy_descs_from_lists(descs_t *ds, const char *fname, uint32_t op,
                           PyObject *bufs, PyObject *peers, PyObject *lens);
/* One descriptor from one buffer, peer address and length: 0, or -1 with
 * an exception set. */
int kvtpy_descs_from_one(descs_t *ds, uint32_t op, PyObject *buf,
                         PyObject *peer, PyObject *len);
/* The transport hint selects a transport in Mooncake's TENT backend and is
 * ignored by its classic one; kvt chooses per peer, so it is accepted and
 * checked for type only: 0, or -1 with TypeError set. */
int kvtpy_check_hint(PyObject *hint);

/* ---- engine_info.c ------------------------------------------------------ */

PyObject *kvtpy_m_get_engine_ptr(PyObject *self, PyObject *unused);
PyObject *kvtpy_m_get_engine(PyObject *self, PyObject *unused);
PyObject *kvtpy_m_warmup_efa_segment(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvtpy_m_get_local_topology(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames);

/* ---- transfer_cuda.c: Mooncake's *_on_cuda calls ------------------------ */

struct kvtpy_cuda_state;
/* Drop the engine object's reference (NULL: nothing). */
void kvtpy_cuda_state_unref(struct kvtpy_cuda_state *cs);
PyObject *kvtpy_m_transfer_write_on_cuda(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvtpy_m_transfer_read_on_cuda(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvtpy_m_batch_transfer_write_on_cuda(PyObject *self,
                                               PyObject *const *args,
                                               Py_ssize_t nargs,
                                               PyObject *kwnames);
PyObject *kvtpy_m_batch_transfer_read_on_cuda(PyObject *self,
                                              PyObject *const *args,
                                              Py_ssize_t nargs,
                                              PyObject *kwnames);

/* 0 when initialized, else -1 with kvt.StateError set. */
int kvtpy_need_engine(kvtpy_engine_t *self);

/* module.c: the kvt.Error hierarchy. Raise the subclass of kvt.Error
 * that fits @st ("what: message (KVT_ERR_...)", with .status set);
 * returns NULL. */
PyObject *kvtpy_raise(kvt_status_t st, const char *what);

/* kvt.doctor_json() (doctor.c). */
PyObject *kvtpy_doctor_json(PyObject *mod, PyObject *args, PyObject *kw);
/* kvt.StateError (an object used before it is ready or after it is
 * closed) with @msg; returns NULL. */
PyObject *kvtpy_state_error(const char *msg);

static inline PyObject *kvtpy_int(long v)
{
    return PyLong_FromLong(v);
}

/* Methods from engine_args.c, engine_mem.c, engine_metrics.c and
 * transfer.c, put in the type's method table by engine.c. */
#define KVTPY_FASTCALL(name)                                                   \
    PyObject *kvtpy_m_##name(PyObject *self, PyObject *const *args,            \
                             Py_ssize_t nargs, PyObject *kwnames)
KVTPY_FASTCALL(initialize);
KVTPY_FASTCALL(initialize_ext);
KVTPY_FASTCALL(register_memory);
KVTPY_FASTCALL(batch_register_memory);
PyObject *kvtpy_m_unregister_memory(PyObject *self, PyObject *arg);
PyObject *kvtpy_m_batch_unregister_memory(PyObject *self, PyObject *arg);
PyObject *kvtpy_m_allocate_managed_buffer(PyObject *self, PyObject *arg);
KVTPY_FASTCALL(free_managed_buffer);
KVTPY_FASTCALL(write_bytes_to_buffer);
KVTPY_FASTCALL(read_bytes_from_buffer);
PyObject *kvtpy_m_get_metrics(PyObject *self, PyObject *unused);
PyObject *kvtpy_m_get_metrics_text(PyObject *self, PyObject *unused);
KVTPY_FASTCALL(transfer_sync_write);
KVTPY_FASTCALL(transfer_sync_read);
KVTPY_FASTCALL(transfer_sync);
KVTPY_FASTCALL(batch_transfer_sync_write);
KVTPY_FASTCALL(batch_transfer_sync_read);
KVTPY_FASTCALL(batch_transfer_sync);
KVTPY_FASTCALL(batch_transfer_async_write);
KVTPY_FASTCALL(batch_transfer_async_read);
KVTPY_FASTCALL(batch_transfer_async);
KVTPY_FASTCALL(transfer_submit_write);
KVTPY_FASTCALL(send_notify);
PyObject *kvtpy_m_transfer_check_status(PyObject *self, PyObject *arg);
PyObject *kvtpy_m_get_batch_transfer_status(PyObject *self, PyObject *arg);

#endif
