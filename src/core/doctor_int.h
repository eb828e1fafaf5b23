/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_DOCTOR_INT_H
#define KVT_CORE_DOCTOR_INT_H

/*
 * The doctor's parts (kvt/doctor.h): the report and the run (doctor.c),
 * this host's checks (doctor_host.c), a metadata server's and a peer's
 * (doctor_peer.c). A run captures what kvt logs on its thread
 * (kvt__log_capture()), so a check's detail can carry the cause the code
 * that failed logged.
 */
#include <stdarg.h>
#include <sys/types.h>

#include <kvt/doctor.h>

#include "util/log.h"
#include "util/time.h"

#define KVT__DOC_MAGIC "kvt-doctor-scratch-1" /* a scratch region's head */
#define KVT__DOC_HEAD 4096                    /* left alone by writers */

struct kvt_doctor_report {
    kvt_doctor_check_t *c;
    size_t n, cap;
};

typedef struct {
    kvt_doctor_report_h r;
    const char *peer;       /* NULL: none */
    const char *meta_uri;   /* NULL: none */
    const char *local_host; /* never NULL */
    int host_asked;         /* local_host given in the params */
    uint32_t transports;    /* as asked */
    int token_set;          /* auth_token given in the params */
    const char *token;      /* when token_set */
    uint32_t kinds;         /* 1 << kind; kinds_asked: named by the caller */
    int kinds_asked;
    uint64_t timeout_ms;
    uint64_t probe_bytes;
    uint32_t peers_expected;
    uint64_t host_id; /* of this host, as engines compute it */
    int nomem;        /* a check could not be recorded */
    int out_fd;       /* in the peer checks' child: the pipe to the parent; -1
                         elsewhere */
    size_t sent;      /* checks already written to out_fd */
    kvt__log_capture_t cap; /* this thread's log, during the run */
    char cause[1024];
} kvt__doc_t;

/* Record a check: its detail from @fmt; @fix may be NULL. Returns it (its
 * numbers unmeasured), or NULL when out of memory (d->nomem set). */
kvt_doctor_check_t *kvt__doc_add(kvt__doc_t *d, const char *id,
                                 kvt_doctor_level_t level, kvt_status_t st,
                                 const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Forget what was captured so far: the next step's cause starts empty. */
void kvt__doc_cause_reset(kvt__doc_t *d);
/* What kvt logged since the reset (the most severe line), or @dflt. */
const char *kvt__doc_cause(kvt__doc_t *d, const char *dflt);

/* An engine for the checks: on d->local_host, port 0, p2p, @transports,
 * the run's token and timeouts, one worker. */
kvt_status_t kvt__doc_engine(kvt__doc_t *d, uint32_t transports,
                             kvt_engine_h *e_p);

/* Whether @host resolves to a loopback address only; the first address
 * into @addr (may be NULL). -1 when it does not resolve. */
int kvt__doc_loopback(const char *host, char *addr, size_t cap);

/* The peer checks' child starts step @id: the checks finished so far go
 * to the parent, and the step's name, so that a step that hangs is named
 * (nothing happens outside the child). */
void kvt__doc_step(kvt__doc_t *d, const char *id);
/* The child is still in step @id (a long step says so now and then, so
 * that it is not taken for a hung one); nothing else is sent. */
void kvt__doc_beat(kvt__doc_t *d, const char *id);

/*
 * Run @fn in a child process whose checks stream back into @d's report
 * as they finish: a transport stuck in the network (a connect() that the
 * kernel retries for minutes) cannot hold the caller. When no record
 * comes for @stall_ms, or the child dies before its end, the child is
 * killed and @stalled(d, step, ms) records what the step it was in means
 * (@ms 0: it died).
 */
typedef struct {
    pid_t pid; /* -1: none */
    int rd, go;
} kvt__doc_child_t;

/* kvt__doc_run_child() in two parts: the child forked now, before the
 * parent goes on (it may initialise a device driver, which a child forked
 * after cannot use), and run when finish() says go. start() returns 0, or
 * -1 with a check recorded. */
int kvt__doc_child_start(kvt__doc_t *d, kvt__doc_child_t *ch,
                         void (*fn)(kvt__doc_t *));
void kvt__doc_child_finish(kvt__doc_t *d, kvt__doc_child_t *ch,
                           uint64_t stall_ms,
                           void (*stalled)(kvt__doc_t *, const char *,
                                           uint64_t));

void kvt__doc_run_child(kvt__doc_t *d, void (*fn)(kvt__doc_t *),
                        uint64_t stall_ms,
                        void (*stalled)(kvt__doc_t *, const char *, uint64_t));

/* What a step of the peer checks that hung for @ms (0: whose process
 * died) means, recorded as its check (doctor_peer.c). */
void kvt__doc_stalled(kvt__doc_t *d, const char *step, uint64_t ms);

/* Engines of the peer checks' child are left to its exit: a transport
 * stuck in the network could hold a teardown. */
static inline void kvt__doc_drop_engine(kvt__doc_t *d, kvt_engine_h e)
{
    if (d->out_fd < 0)
        kvt_engine_destroy(e);
}

static inline double kvt__doc_ms_since(uint64_t t0)
{
    return (double)(kvt__now_ns() - t0) / 1e6;
}

/* The transfer check of the peer at @addr on transport @id (@name) alone
 * (doctor_xfer.c). */
void kvt__doc_transfer(kvt__doc_t *d, uint32_t id, const char *name,
                       const char *addr);

void kvt__doc_host(kvt__doc_t *d);
/* The peer checks, in a child forked by kvt__doc_peer_start() (before the
 * host checks) and run by kvt__doc_peer_finish(). */
void kvt__doc_peer_start(kvt__doc_t *d, kvt__doc_child_t *ch);
void kvt__doc_peer_finish(kvt__doc_t *d, kvt__doc_child_t *ch);

#endif
