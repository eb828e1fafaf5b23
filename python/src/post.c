/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt.Post: one posted transfer of the NIXL agent (kvt.nixl), made by
 * TransferEngine._post(). It owns a kvt batch holding the transfer's
 * descriptors, and the notifications to deliver once it has succeeded.
 *
 * A notification must reach the peer only after its memory was read (a
 * READ: vLLM's prefill frees its blocks on it) or written (a WRITE), and
 * only if that succeeded, which only this side knows. So the data batch's
 * idle callback queues the post, and the notifications go out in a second
 * batch of NOTIFY descriptors once every descriptor succeeded; a failed
 * transfer sends none. A transfer without data sends its notifications
 * in its one batch.
 *
 * The descriptors are built in C from three uint64 buffers (numpy arrays
 * or anything with the buffer protocol), so a batch of thousands of
 * descriptors costs no Python loop.
 *
 * Lifetime: a Post holds a strong reference to its TransferEngine, so the
 * engine (and the batches inside it) lives at least as long. Its dealloc
 * and release() wait until the post is final (every descriptor is bounded
 * by the transfer timeout), no thread submits its notifications and no
 * thread waits in wait(), then free the batches. The post thread never
 * touches a Python object.
 */
#define PY_SSIZE_T_CLEAN
#include "kvtpy.h"

#include <errno.h>
#include <time.h>

enum { POST_PENDING = 0, POST_NOTIFYING = 1, POST_FINAL = 2 };

typedef struct post_core {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int phase;           /* POST_*; under lock */
    kvt_status_t status; /* the final status; under lock */
    kvt_engine_h engine;
    kvt_segment_t seg;
    kvt_batch_h batch;
    uint32_t op;
    /* READ only: raw notification payloads sent after the reads. */
    size_t nnotif;
    char **notif;
    size_t *notif_len;
    int notif_sent;      /* they went in the batch itself */
    uint64_t t0_mono_ns; /* when _post() began */
    uint64_t start_us;   /* steady clock (CLOCK_MONOTONIC), microseconds */
    uint64_t post_ns;    /* time spent submitting */
    uint64_t done_ns;    /* monotonic time it went final; under lock */
    uint64_t total_bytes;
    uint64_t ndesc;     /* data descriptors submitted */
    kvt_batch_h nbatch; /* the notifications, once dispatched */
    int dispatching;    /* a thread is submitting nbatch; under lock */
    int users;          /* threads in wait() without the GIL; under lock */
    struct post_core *next, *prev; /* the queue of notifications to send */
    int queued;                    /* on that queue; under q_lock */
} post_core_t;

typedef struct {
    PyObject_HEAD PyObject *engine; /* strong reference */
    post_core_t *core;
} post_obj_t;

static PyTypeObject *post_type;

static uint64_t now_ns(clockid_t clk)
{
    struct timespec ts;

    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void core_finish(post_core_t *c, kvt_status_t st)
{
    pthread_mutex_lock(&c->lock);
    c->status = st;
    c->done_ns = now_ns(CLOCK_MONOTONIC);
    c->phase = POST_FINAL;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* ---- Notifications that follow reads ------------------------------------- */

/*
 * A data batch going idle (successfully) queues its post here. The
 * notifications then go out in a second batch of NOTIFY descriptors,
 * submitted (never blocking) by whichever comes first: the post thread,
 * woken by the queue, or a thread asking for the post's state (an
 * application polling check_xfer_state() saves the thread wake-up). The
 * second batch going idle makes the post final.
 */
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static post_core_t *q_head, *q_tail;
static int q_started;

/* Unlink @c; under q_lock. */
static void q_unlink(post_core_t *c)
{
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        q_head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    else
        q_tail = c->prev;
    c->next = c->prev = NULL;
    c->queued = 0;
}

/* The notification batch's idle callback. */
static void notif_idle(kvt_batch_h b, void *arg)
{
    core_finish(arg, kvt_batch_query(b, NULL));
}

/* Submit the notifications of a post taken off the queue. */
static void notify_dispatch(post_core_t *c)
{
    kvt_xfer_desc_t *d = calloc(c->nnotif, sizeof(*d));
    kvt_status_t st = KVT_ERR_NO_MEMORY;

    if (d != NULL) {
        for (size_t i = 0; i < c->nnotif; i++) {
            d[i].opcode = KVT_OP_NOTIFY;
            d[i].segment = c->seg;
            d[i].local_addr = c->notif[i];
            d[i].length = c->notif_len[i];
        }
        st = kvt_batch_create(c->engine, c->nnotif, &c->nbatch);
        if (st == KVT_OK)
            st = kvt_batch_set_idle_cb(c->nbatch, notif_idle, c);
        /* Refused as a whole only (nothing submitted, no callback):
         * per-descriptor failures reach notif_idle. */
        if (st == KVT_OK)
            st = kvt_batch_submit(c->nbatch, d, c->nnotif);
        free(d);
    }
    if (st != KVT_OK)
        core_finish(c, st);
    /* The batch may have gone idle, and the post final, inside the
     * submission: only now may a waiter free it. */
    pthread_mutex_lock(&c->lock);
    c->dispatching = 0;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* Take @c off the queue if it is still there; 1 when this caller did. */
static int q_take(post_core_t *c)
{
    int took = 0;

    pthread_mutex_lock(&q_lock);
    if (c->queued) {
        q_unlink(c);
        took = 1;
    }
    pthread_mutex_unlock(&q_lock);
    return took;
}

static void *post_thread(void *arg)
{
    (void)arg;
    for (;;) {
        post_core_t *c;

        pthread_mutex_lock(&q_lock);
        while (q_head == NULL)
            pthread_cond_wait(&q_cond, &q_lock);
        c = q_head;
        q_unlink(c);
        pthread_mutex_unlock(&q_lock);
        notify_dispatch(c);
    }
    return NULL;
}

/* Start the post thread once; 0, or an errno. Called with the GIL. */
static int post_thread_start(void)
{
    pthread_t t;
    pthread_attr_t a;
    int rc = 0;

    pthread_mutex_lock(&q_lock);
    if (!q_started) {
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&t, &a, post_thread, NULL);
        pthread_attr_destroy(&a);
        if (rc == 0)
            q_started = 1;
    }
    pthread_mutex_unlock(&q_lock);
    return rc;
}

/* The data batch's idle callback: must not block or call into kvt beyond
 * kvt_batch_query() on this batch. */
static void post_idle(kvt_batch_h b, void *arg)
{
    post_core_t *c = arg;

    if (c->nnotif > 0 && !c->notif_sent && kvt_batch_query(b, NULL) == KVT_OK) {
        pthread_mutex_lock(&c->lock);
        c->phase = POST_NOTIFYING;
        c->dispatching = 1; /* until notify_dispatch() has submitted */
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_lock(&q_lock);
        c->next = NULL;
        c->prev = q_tail;
        if (q_tail != NULL)
            q_tail->next = c;
        else
            q_head = c;
        q_tail = c;
        c->queued = 1;
        pthread_cond_signal(&q_cond);
        pthread_mutex_unlock(&q_lock);
        return;
    }
    core_finish(c, kvt_batch_query(b, NULL));
}

static void core_free(post_core_t *c)
{
    if (c->nbatch != NULL) {
        kvt_batch_set_idle_cb(c->nbatch, NULL, NULL);
        kvt_batch_free(c->nbatch);
    }
    if (c->batch != NULL) {
        kvt_batch_set_idle_cb(c->batch, NULL, NULL);
        kvt_batch_free(c->batch);
    }
    for (size_t i = 0; i < c->nnotif; i++)
        free(c->notif[i]);
    free(c->notif);
    free(c->notif_len);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Wait until the post is final, up to @timeout_ms (negative: no limit).
 * Returns 1 when final. Without the GIL. */
static int core_wait(post_core_t *c, int64_t timeout_ms)
{
    struct timespec dl;
    int final;

    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (dl.tv_nsec >= 1000000000) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000;
        }
    }
    pthread_mutex_lock(&c->lock);
    while (c->phase != POST_FINAL || c->dispatching) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->cond, &c->lock);
        } else if (pthread_cond_timedwait(&c->cond, &c->lock, &dl) ==
                   ETIMEDOUT) {
            break;
        }
    }
    final = c->phase == POST_FINAL && !c->dispatching;
    pthread_mutex_unlock(&c->lock);
    return final;
}

/* Wait until the post is final, nobody submits its notifications and no
 * other thread waits on it: then it may be freed. Without the GIL. */
static void core_quiesce(post_core_t *c)
{
    pthread_mutex_lock(&c->lock);
    while (c->phase != POST_FINAL || c->dispatching || c->users > 0)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* ---- Building the descriptors ------------------------------------------- */

typedef struct {
    Py_buffer view;
    int held;
} u64buf_t;

/* A read-only view of a C-contiguous buffer of 8-byte unsigned (or
 * signed, non-negative by contract) integers. */
static int u64buf_get(PyObject *o, const char *what, u64buf_t *b)
{
    const char *f;

    b->held = 0;
    if (PyObject_GetBuffer(o, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    b->held = 1;
    f = b->view.format != NULL ? b->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (b->view.itemsize != 8 || f[1] != '\0' ||
        strchr("QqLlKk", f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s: a contiguous buffer of 64-bit integers is needed "
                     "(numpy uint64), got format '%s'",
                     what, b->view.format != NULL ? b->view.format : "B");
        return -1;
    }
    return 0;
}

static void u64buf_release(u64buf_t *b)
{
    if (b->held)
        PyBuffer_Release(&b->view);
    b->held = 0;
}

/* Copy the raw notification payloads of a tuple/list of bytes. */
static int notifs_copy(PyObject *seq, post_core_t *c)
{
    Py_ssize_t n = kvtpy_seq_len(seq, "notifs");

    if (n < 0)
        return -1;
    if (n == 0)
        return 0;
    c->notif = calloc((size_t)n, sizeof(*c->notif));
    c->notif_len = calloc((size_t)n, sizeof(*c->notif_len));
    if (c->notif == NULL || c->notif_len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        char *p;
        Py_ssize_t len;

        if (it == NULL)
            return -1;
        if (!PyBytes_Check(it)) {
            Py_DECREF(it);
            PyErr_SetString(PyExc_TypeError, "notifs: bytes items expected");
            return -1;
        }
        if (PyBytes_AsStringAndSize(it, &p, &len) < 0) {
            Py_DECREF(it);
            return -1;
        }
        if ((size_t)len > KVT_NOTIFY_MAX) {
            Py_DECREF(it);
            PyErr_Format(PyExc_ValueError,
                         "notifs: a payload of %zd bytes is over %d", len,
                         KVT_NOTIFY_MAX);
            return -1;
        }
        c->notif[i] = malloc(len > 0 ? (size_t)len : 1);
        if (c->notif[i] == NULL) {
            Py_DECREF(it);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(c->notif[i], p, (size_t)len);
        c->notif_len[i] = (size_t)len;
        c->nnotif = (size_t)i + 1;
        Py_DECREF(it);
    }
    return 0;
}

/*
 * Submit: descriptors [0, n) from the arrays, then, for WRITE, one NOTIFY
 * descriptor per payload. Without the GIL.
 */
static kvt_status_t core_submit(post_core_t *c, const char *target,
                                const uint64_t *la, const uint64_t *ra,
                                const uint64_t *ln, size_t n, int *opened)
{
    size_t nn = 0, k = 0;
    kvt_xfer_desc_t *d;
    kvt_status_t st;

    *opened = 0;
    st = kvt_segment_open(c->engine, target, &c->seg);
    if (st != KVT_OK)
        return st;
    *opened = 1;
    d = calloc(n + c->nnotif + 1, sizeof(*d));
    if (d == NULL)
        return KVT_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (ln[i] == 0)
            continue;
        d[k].opcode = c->op;
        d[k].segment = c->seg;
        d[k].local_addr = (void *)(uintptr_t)la[i];
        d[k].remote_addr = ra[i];
        d[k].length = ln[i];
        c->total_bytes += ln[i];
        k++;
    }
    c->ndesc = k;
    if (k == 0)
        nn = c->nnotif; /* nothing to follow: in the batch itself */
    for (size_t i = 0; i < nn; i++, k++) {
        d[k].opcode = KVT_OP_NOTIFY;
        d[k].segment = c->seg;
        d[k].local_addr = c->notif[i];
        d[k].length = c->notif_len[i];
    }
    if (k == 0) {
        free(d);
        return KVT_OK;
    }
    st = kvt_batch_create(c->engine, k, &c->batch);
    if (st == KVT_OK)
        st = kvt_batch_set_idle_cb(c->batch, post_idle, c);
    if (st == KVT_OK) {
        if (nn > 0)
            c->notif_sent = 1; /* copied at submission */
        c->phase = POST_PENDING;
        st = kvt_batch_submit(c->batch, d, k);
    }
    free(d);
    return st;
}

/*
 * _post(target, op, local_addrs, remote_addrs, lengths, notifs=()) ->
 * kvt.Post. @op is 0 (READ) or 1 (WRITE); the three arrays have one
 * element per descriptor; @notifs are raw notification payloads (bytes of
 * at most NOTIFY_MAX each), delivered in order once the transfer is done.
 * Raises kvt.Error when the target cannot be opened or the batch not
 * made; a descriptor that fails validation fails the post instead.
 */
PyObject *kvtpy_m__post(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    static const char *const params[] = {
        "target", "op", "local_addrs", "remote_addrs", "lengths", "notifs"};
    kvtpy_engine_t *e = (kvtpy_engine_t *)self;
    u64buf_t la = {0}, ra = {0}, ln = {0};
    PyObject *a[6];
    const char *target;
    post_core_t *c = NULL;
    post_obj_t *obj = NULL;
    kvt_status_t st;
    size_t n;
    long op;
    int opened = 0;

    if (kvtpy_args("_post", args, nargs, kwnames, params, 5, 6, a) < 0 ||
        kvtpy_need_engine(e) < 0)
        return NULL;
    target = kvtpy_cstr(a[0], "target");
    if (target == NULL)
        return NULL;
    op = PyLong_AsLong(a[1]);
    if (op == -1 && PyErr_Occurred())
        return NULL;
    if (op != KVT_OP_READ && op != KVT_OP_WRITE) {
        PyErr_Format(PyExc_ValueError, "_post: op %ld is not READ or WRITE",
                     op);
        return NULL;
    }
    if (u64buf_get(a[2], "local_addrs", &la) < 0 ||
        u64buf_get(a[3], "remote_addrs", &ra) < 0 ||
        u64buf_get(a[4], "lengths", &ln) < 0)
        goto out;
    n = (size_t)(la.view.len / 8);
    if ((size_t)(ra.view.len / 8) != n || (size_t)(ln.view.len / 8) != n) {
        PyErr_SetString(PyExc_ValueError,
                        "_post: the three arrays differ in length");
        goto out;
    }
    if (post_thread_start() != 0) {
        PyErr_SetString(PyExc_RuntimeError, "_post: no post thread");
        goto out;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    pthread_mutex_init(&c->lock, NULL);
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&c->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    c->phase = POST_FINAL;
    c->engine = e->engine;
    c->op = (uint32_t)op;
    if (a[5] != NULL && notifs_copy(a[5], c) < 0)
        goto out;
    obj = PyObject_New(post_obj_t, post_type);
    if (obj == NULL)
        goto out;
    obj->engine = NULL;
    obj->core = NULL;
    c->start_us = now_ns(CLOCK_MONOTONIC) / 1000;
    c->t0_mono_ns = now_ns(CLOCK_MONOTONIC);
    Py_BEGIN_ALLOW_THREADS
    st = core_submit(c, target, la.view.buf, ra.view.buf, ln.view.buf, n,
                     &opened);
    Py_END_ALLOW_THREADS
    c->post_ns = now_ns(CLOCK_MONOTONIC) - c->t0_mono_ns;
    if (c->batch == NULL) {
        /* Nothing submitted: final at once, with the reason. */
        c->done_ns = now_ns(CLOCK_MONOTONIC);
        c->status = st;
        c->phase = POST_FINAL;
    } else if (st != KVT_OK) {
        /* Refused as a whole (kvt_batch_submit()): nothing pending. */
        if (kvt_batch_query(c->batch, NULL) != KVT_INPROGRESS) {
            pthread_mutex_lock(&c->lock);
            if (c->phase != POST_FINAL) {
                c->phase = POST_FINAL;
                c->status = st;
                c->done_ns = now_ns(CLOCK_MONOTONIC);
            }
            pthread_mutex_unlock(&c->lock);
        }
    }
    if (!opened) {
        Py_DECREF(obj);
        obj = NULL;
        kvtpy_raise(st, "_post: opening the target");
        goto out;
    }
    Py_INCREF(self);
    obj->engine = self;
    obj->core = c;
    c = NULL;
out:
    u64buf_release(&la);
    u64buf_release(&ra);
    u64buf_release(&ln);
    if (c != NULL)
        core_free(c);
    return (PyObject *)obj;
}

/* ---- kvt.Post ----------------------------------------------------------- */

static post_core_t *need_core(PyObject *self)
{
    post_core_t *c = ((post_obj_t *)self)->core;

    if (c == NULL)
        kvtpy_state_error("the post was released");
    return c;
}

/* state() -> 1 while in progress, 0 done, or the negative kvt status it
 * failed with. Does not block. */
static PyObject *post_state(PyObject *self, PyObject *unused)
{
    post_core_t *c = need_core(self);
    long v;
    int phase;

    (void)unused;
    if (c == NULL)
        return NULL;
    pthread_mutex_lock(&c->lock);
    phase = c->phase;
    v = phase == POST_FINAL ? (long)c->status : 1;
    pthread_mutex_unlock(&c->lock);
    /* Reads done, notifications not sent yet: send them from here rather
     * than wait for the post thread to wake up (never blocks). */
    if (phase == POST_NOTIFYING && q_take(c)) {
        notify_dispatch(c);
        pthread_mutex_lock(&c->lock);
        v = c->phase == POST_FINAL ? (long)c->status : 1;
        pthread_mutex_unlock(&c->lock);
    }
    return PyLong_FromLong(v);
}

/* wait(timeout_ms=-1) -> state(), after waiting for the post to be final
 * or the timeout to pass; the GIL is released meanwhile. */
static PyObject *post_wait(PyObject *self, PyObject *args)
{
    post_core_t *c = need_core(self);
    long long tmo = -1;

    if (c == NULL || !PyArg_ParseTuple(args, "|L", &tmo))
        return NULL;
    /* release() from another thread must not free @c meanwhile. */
    pthread_mutex_lock(&c->lock);
    c->users++;
    pthread_mutex_unlock(&c->lock);
    Py_BEGIN_ALLOW_THREADS
    core_wait(c, tmo);
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&c->lock);
    c->users--;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return post_state(self, NULL);
}

/* telemetry() -> (start_us, post_us, xfer_us, total_bytes, desc_count);
 * xfer_us is 0 until the post is final. */
static PyObject *post_telemetry(PyObject *self, PyObject *unused)
{
    post_core_t *c = need_core(self);
    uint64_t xfer_us = 0;

    (void)unused;
    if (c == NULL)
        return NULL;
    pthread_mutex_lock(&c->lock);
    if (c->phase == POST_FINAL && c->done_ns >= c->t0_mono_ns)
        xfer_us = (c->done_ns - c->t0_mono_ns) / 1000;
    pthread_mutex_unlock(&c->lock);
    return Py_BuildValue(
        "(KKKKK)", (unsigned long long)c->start_us,
        (unsigned long long)(c->post_ns / 1000), (unsigned long long)xfer_us,
        (unsigned long long)c->total_bytes, (unsigned long long)c->ndesc);
}

/* Wait for the post to be final, then free it. Without the GIL. */
static void post_drop(post_obj_t *p)
{
    post_core_t *c = p->core;

    p->core = NULL;
    if (c == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS
    core_quiesce(c);
    core_free(c);
    Py_END_ALLOW_THREADS
}

/* release(): wait until final (bounded by the transfer timeout), then
 * free the batch. Idempotent. */
static PyObject *post_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    post_drop((post_obj_t *)self);
    Py_RETURN_NONE;
}

static void post_dealloc(PyObject *self)
{
    post_obj_t *p = (post_obj_t *)self;
    PyTypeObject *tp = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);

    post_drop(p);
    Py_CLEAR(p->engine);
    tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef post_methods[] = {
    {"state", post_state, METH_NOARGS,
     "state() -> 1 in progress, 0 done, or the negative kvt status it failed "
     "with"},
    {"wait", post_wait, METH_VARARGS,
     "wait(timeout_ms=-1) -> state() once final or after the timeout"},
    {"telemetry", post_telemetry, METH_NOARGS,
     "telemetry() -> (start_us, post_us, xfer_us, total_bytes, desc_count)"},
    {"release", post_release, METH_NOARGS,
     "release(): wait until final, then free the batch"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot post_slots[] = {
    {Py_tp_doc, (void *)"A transfer posted by TransferEngine._post()."},
    {Py_tp_dealloc, post_dealloc},
    {Py_tp_methods, post_methods},
    {0, NULL},
};

static PyType_Spec post_spec = {
    .name = "kvt.Post",
    .basicsize = sizeof(post_obj_t),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = post_slots,
};

/* A child of fork() has no post thread: start afresh there. */
static void q_atfork_child(void)
{
    pthread_mutex_init(&q_lock, NULL);
    pthread_cond_init(&q_cond, NULL);
    q_head = q_tail = NULL;
    q_started = 0;
}

int kvtpy_post_init(PyObject *m)
{
    static int atfork_done;

    if (!atfork_done && pthread_atfork(NULL, NULL, q_atfork_child) == 0)
        atfork_done = 1;
    post_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &post_spec, NULL);
    if (post_type == NULL)
        return -1;
    /* The module keeps a reference; post_type keeps its own. */
    Py_INCREF((PyObject *)post_type);
    if (PyModule_AddObject(m, "Post", (PyObject *)post_type) < 0) {
        Py_DECREF((PyObject *)post_type);
        return -1;
    }
    return 0;
}
