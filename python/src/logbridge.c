/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt's C log lines into Python's logging.
 *
 * The C library logs from its own threads, possibly while holding its
 * locks, so the handler it calls must neither take the GIL nor block: it
 * copies the line into a bounded queue under a mutex and signals. A Python
 * thread of kvt's (kvt/_logbridge.py) waits in _log_next() without the
 * GIL and hands each line to the logger "kvt". When the queue is full the
 * line is dropped and counted; the count is delivered as a line of its
 * own once there is room.
 *
 * The mutex is never held while the GIL is taken (kvtpy.h's rule): the
 * waiter copies lines out under the mutex, releases it, then takes the
 * GIL to build Python objects.
 */
#include "kvtpy.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

#define LOGQ_CAP 1024 /* lines held while Python is not draining */
#define LOGQ_BATCH 64 /* lines handed over per _log_next() */
#define LOGQ_FILE 64

typedef struct {
    int level;
    int line;
    char file[LOGQ_FILE];
    char msg[1024];
} logq_line_t;

static pthread_mutex_t logq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t logq_cv;
static pthread_once_t logq_once = PTHREAD_ONCE_INIT;
static logq_line_t *logq;     /* ring of LOGQ_CAP, allocated once */
static unsigned logq_head;    /* next to hand over */
static unsigned logq_len;     /* lines queued */
static uint64_t logq_dropped; /* lines dropped since the last report */
static int logq_on;           /* the handler is installed */
/* A batch _log_next() handed over and the pump has not passed on yet
 * (_log_handed() clears it): a caller flushing waits for it, so that lines
 * reach the logger in the order kvt logged them. */
static int logq_pending;

static void logq_child(void)
{
    /* After fork() only the forking thread exists: a mutex another thread
     * held is unusable, so start afresh. Lines queued before the fork were
     * the parent's to deliver. */
    pthread_mutex_init(&logq_mu, NULL);
    pthread_cond_init(&logq_cv, NULL);
    logq_head = logq_len = 0;
    logq_dropped = 0;
}

static void logq_init(void)
{
    pthread_condattr_t a;

    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&logq_cv, &a);
    pthread_condattr_destroy(&a);
    pthread_atfork(NULL, NULL, logq_child);
}

static void logq_handler(void *arg, kvt_log_level_t level, const char *file,
                         int line, const char *msg)
{
    logq_line_t *l;

    (void)arg;
    pthread_mutex_lock(&logq_mu);
    if (logq_len == LOGQ_CAP) {
        logq_dropped++;
        pthread_mutex_unlock(&logq_mu);
        return;
    }
    l = &logq[(logq_head + logq_len++) % LOGQ_CAP];
    l->level = (int)level;
    l->line = line;
    snprintf(l->file, sizeof(l->file), "%s", file);
    snprintf(l->msg, sizeof(l->msg), "%s", msg);
    pthread_cond_signal(&logq_cv);
    pthread_mutex_unlock(&logq_mu);
}

/* _log_capture(on) -> None: install (True) or remove (False) the handler.
 * Removing wakes a waiting _log_next(), which then returns what is left
 * and None after it. */
static PyObject *log_capture(PyObject *mod, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);

    (void)mod;
    if (on < 0)
        return NULL;
    pthread_once(&logq_once, logq_init);
    if (on && logq == NULL) {
        logq = calloc(LOGQ_CAP, sizeof(*logq));
        if (logq == NULL)
            return PyErr_NoMemory();
    }
    pthread_mutex_lock(&logq_mu);
    logq_on = on;
    pthread_cond_broadcast(&logq_cv);
    pthread_mutex_unlock(&logq_mu);
    /* Waits for any thread inside the handler; no mutex held here. */
    Py_BEGIN_ALLOW_THREADS
    kvt_log_set_handler(on ? logq_handler : NULL, NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* _log_next(timeout) -> list of (level, file, line, msg); [] when nothing
 * came within @timeout seconds; None once capture is off and the queue
 * is empty. Waits without the GIL. Levels are kvt_log_level_t values. */
static PyObject *log_next(PyObject *mod, PyObject *arg)
{
    logq_line_t *out;
    unsigned n = 0;
    uint64_t dropped = 0;
    int stopped = 0;
    double timeout = PyFloat_AsDouble(arg);
    struct timespec dl;
    PyObject *list;

    (void)mod;
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (timeout < 0)
        timeout = 0;
    pthread_once(&logq_once, logq_init);
    out = malloc(LOGQ_BATCH * sizeof(*out));
    if (out == NULL)
        return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)timeout;
    dl.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&logq_mu);
    while (logq_len == 0 && logq_dropped == 0 && logq_on) {
        if (pthread_cond_timedwait(&logq_cv, &logq_mu, &dl) == ETIMEDOUT)
            break;
    }
    while (logq_len > 0 && n < LOGQ_BATCH) {
        out[n++] = logq[logq_head];
        logq_head = (logq_head + 1) % LOGQ_CAP;
        logq_len--;
    }
    if (logq_len == 0) {
        dropped = logq_dropped;
        logq_dropped = 0;
        stopped = !logq_on;
    }
    logq_pending = n > 0 || dropped > 0;
    pthread_mutex_unlock(&logq_mu);
    Py_END_ALLOW_THREADS

    if (stopped && n == 0 && dropped == 0) {
        free(out);
        Py_RETURN_NONE;
    }
    list = PyList_New(0);
    for (unsigned i = 0; list != NULL && i <= n; i++) {
        PyObject *t;
        char buf[128];

        if (i == n && dropped == 0)
            break;
        if (i < n) {
            t = Py_BuildValue(
                "(isiN)", out[i].level, out[i].file, out[i].line,
                PyUnicode_DecodeUTF8(out[i].msg, (Py_ssize_t)strlen(out[i].msg),
                                     "replace"));
        } else {
            snprintf(buf, sizeof(buf),
                     "%llu kvt log lines were dropped: Python's logging "
                     "did not keep up",
                     (unsigned long long)dropped);
            t = Py_BuildValue("(isis)", (int)KVT_LOG_LEVEL_WARN, "logbridge.c",
                              __LINE__, buf);
        }
        if (t == NULL || PyList_Append(list, t) < 0)
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    free(out);
    return list;
}

/* _log_handed() -> None: the pump passed on the batch _log_next() gave. */
static PyObject *log_handed(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    pthread_mutex_lock(&logq_mu);
    logq_pending = 0;
    pthread_cond_broadcast(&logq_cv);
    pthread_mutex_unlock(&logq_mu);
    Py_RETURN_NONE;
}

void kvtpy_logbridge_flush(void)
{
    PyObject *mod, *list, *r;
    logq_line_t *out;
    unsigned n = 0;
    struct timespec dl;

    if (logq == NULL)
        return;
    out = malloc(LOGQ_CAP * sizeof(*out));
    if (out == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += 200 * 1000000L; /* a pump that does not pass it on */
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&logq_mu);
    while (logq_on && logq_pending)
        if (pthread_cond_timedwait(&logq_cv, &logq_mu, &dl) == ETIMEDOUT)
            break;
    while (logq_on && logq_len > 0) {
        out[n++] = logq[logq_head];
        logq_head = (logq_head + 1) % LOGQ_CAP;
        logq_len--;
    }
    pthread_mutex_unlock(&logq_mu);
    Py_END_ALLOW_THREADS
    list = n > 0 ? PyList_New(0) : NULL;
    for (unsigned i = 0; list != NULL && i < n; i++) {
        PyObject *t = Py_BuildValue(
            "(isiN)", out[i].level, out[i].file, out[i].line,
            PyUnicode_DecodeUTF8(out[i].msg, (Py_ssize_t)strlen(out[i].msg),
                                 "replace"));
        if (t == NULL || PyList_Append(list, t) < 0)
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    free(out);
    if (list == NULL)
        return;
    mod = PyImport_ImportModule("kvt._logbridge");
    r = mod != NULL ? PyObject_CallMethod(mod, "_hand", "O", list) : NULL;
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_XDECREF(mod);
    Py_DECREF(list);
}

/* _log_emit(level, msg) -> None: log @msg through the C library at @level,
 * as kvt itself would (for tests of the bridge). */
static PyObject *log_emit(PyObject *mod, PyObject *args)
{
    int level;
    const char *msg;

    (void)mod;
    if (!PyArg_ParseTuple(args, "is", &level, &msg))
        return NULL;
    if (level < KVT_LOG_LEVEL_ERROR || level > KVT_LOG_LEVEL_TRACE) {
        PyErr_SetString(PyExc_ValueError, "level out of range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    kvt_log_printf((kvt_log_level_t)level, __FILE__, __LINE__, "%s", msg);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef logbridge_methods[] = {
    {"_log_capture", log_capture, METH_O,
     "_log_capture(on): route kvt's C log lines to a queue (True) or back "
     "to stderr (False)."},
    {"_log_next", log_next, METH_O,
     "_log_next(timeout) -> [(level, file, line, msg)], [] on timeout, "
     "None once capture is off and nothing is left."},
    {"_log_handed", log_handed, METH_NOARGS,
     "_log_handed(): the batch of the last _log_next() was passed on."},
    {"_log_emit", log_emit, METH_VARARGS,
     "_log_emit(level, msg): log a line through kvt's C log."},
    {NULL, NULL, 0, NULL},
};

int kvtpy_logbridge_init(PyObject *m)
{
    return PyModule_AddFunctions(m, logbridge_methods);
}
