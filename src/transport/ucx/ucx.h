/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_UCX_UCX_H
#define KVT_TRANSPORT_UCX_UCX_H

/*
 * The ucx transport: one-sided writes and reads through libucp, so that
 * kvt reaches every fabric UCX drives (rc/dc/ud verbs, shared memory,
 * tcp). docs/ucx.md says how to run it; docs/protocol.md its messages.
 *
 * One ucp_context per engine; one ucp_worker per kvt worker thread, each
 * touched by its own thread only (UCS_THREAD_MODE_SINGLE: no lock on the
 * data path). Other threads hand work to a worker through its inbox
 * (a mutex-protected list and an eventfd). A session lives on one worker:
 * its endpoint, its FIFO of units, its table of the peer's regions and
 * their unpacked keys are that worker's alone.
 *
 * A session's transfers: a READ is one unit of ucp_get_nbx requests (one
 * per piece), complete when they all are; WRITEs posted since the last
 * flush form an epoch, closed by ucp_ep_flush_nbx, complete when the
 * flush is (the data has landed in the peer); a NOTIFY is an active
 * message sent only when every unit before it in the FIFO has finished,
 * so it lands after every earlier write. Units finish in FIFO order.
 *
 * Messages (active messages, ids below): the initiator's HELLO names its
 * worker's address and a token; the target connects back and answers
 * HELLO_ACK. When the target's registry changes, it sends REG_CHANGED to
 * every initiator and waits (bounded) for REG_ACK, which an initiator
 * sends once nothing it posted under the old keys is in flight; its next
 * transfer fetches the descriptor anew. BYE ends a session.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "core/tl.h"

extern const kvt__tl_ops_t kvt__tl_ucx;

enum {
    UCX_AM_HELLO = 0x4b01,
    UCX_AM_HELLO_ACK,
    UCX_AM_BYE,
    UCX_AM_NOTIFY,
    UCX_AM_REG_CHANGED,
    UCX_AM_REG_ACK,
    UCX_AM_AUTH,
};

/* HELLO_ACK values: bit 0, the descriptor's generation is not the
 * current one; REFUSED, the session is not served: authentication
 * failed, or with BUSY too, the target serves its most initiators
 * already; AUTHED, the initiator's AUTH proved the token. With a token,
 * the first HELLO_ACK is the challenge (its data: the target's nonce and
 * MAC); the second says AUTHED or REFUSED (ucx_auth.c). */
#define UCX_ACK_STALE 1u
#define UCX_ACK_REFUSED 2u
#define UCX_ACK_AUTHED 4u
#define UCX_ACK_BUSY 8u
#define UCX_NONCE_LEN 32
#define UCX_MAC_LEN 32
/* How long a challenged initiator has to send its AUTH (as the control
 * plane's HELLO deadline); then it is dropped. */
#define UCX_AUTH_NS (10ull * 1000000000ull)
/* Initiators (sessions of peers) one engine serves at once, on all its
 * workers: past it a HELLO makes room by dropping the oldest initiator
 * of its worker that has not proved the token yet, or is refused
 * (REFUSED | BUSY). */
#define UCX_INBOUND_MAX 1024u

/* The header of every message: the initiator's token for the session,
 * and a value (HELLO: the length of the worker address, which follows the
 * registry generation of the descriptor the initiator fetched (u64);
 * HELLO_ACK: 1 when that generation is not the current one;
 * REG_CHANGED, REG_ACK: the registry generation; NOTIFY: the length of
 * the sender's name that follows, then the message). */
typedef struct {
    uint64_t token;
    uint64_t value;
} ucx_am_hdr_t;

#define UCX_SECTION_VERSION 1
/* Bytes a session posts in one turn of its worker before flushing and
 * letting completions (and other sessions) through. */
#define UCX_TURN_BYTES (8ull << 20)
#define UCX_ADDR_MAX 4096 /* a worker address, packed */

typedef struct kvt__ucx kvt__ucx_t;
typedef struct ucx_worker ucx_worker_t;
typedef struct ucx_session ucx_session_t;
typedef struct ucx_unit ucx_unit_t;
typedef struct ucx_msg ucx_msg_t;
typedef struct ucx_inbound ucx_inbound_t;
typedef struct ucx_conn ucx_conn_t;

/* An endpoint to one peer worker, shared (ucx_conn.c). */
struct ucx_conn {
    ucx_conn_t *next;
    ucx_worker_t *wk;
    ucp_ep_h ep;
    uint8_t *addr; /* the peer worker's address */
    size_t len;
    unsigned refs;    /* sessions and inbound peers using it */
    _Atomic int dead; /* its error handler ran */
    int orphans;      /* requests were left on it (see ucx_ep.c) */
    /* Failed: no new users, closed when unused. Set by the error handler,
     * which UCX may call from its own thread. */
    _Atomic int error;
    int peer_failures; /* created with peer failure handling */
    int linger;        /* closed gracefully: a refusal is on its way */
};

/* A region of the peer, from its descriptor; its key unpacked on first
 * use. */
typedef struct {
    uint64_t start;
    uint64_t end;
    uint32_t access;
    uint32_t klen;
    uint8_t *key; /* packed, owned */
    ucp_rkey_h rkey;
} ucx_rregion_t;

enum { UNIT_EPOCH = 1, UNIT_NOTIFY, UNIT_GET, UNIT_ACK };

/* Work in flight for one session (see the header comment). */
struct ucx_unit {
    ucx_unit_t *next, *prev;
    ucx_session_t *s;
    uint8_t kind;
    uint8_t posted;  /* its requests are all posted */
    uint8_t orphan;  /* completed early; freed when ucp returns it */
    int32_t status;  /* the first failure of its requests */
    uint32_t refs;   /* requests not yet completed */
    uint32_t ncomps; /* descriptors it completes */
    uint32_t cap;
    uint64_t t0;         /* when it was taken */
    kvt__comp_t **comps; /* ncomps of them */
    kvt__comp_t *comp1;  /* the inline one, when cap is 1 */
    uint32_t len;        /* NOTIFY: the message (with the sender's name) */
    uint32_t nlen;       /* of which the name */
    uint8_t *msg;
};

/* What other threads hand a worker. */
enum { MSG_OPEN = 1, MSG_XFER, MSG_KILL, MSG_REG_CHANGED };
struct ucx_msg {
    ucx_msg_t *next;
    int kind;
    ucx_session_t *s;
    kvt_status_t why; /* MSG_KILL */
    uint64_t gen;     /* MSG_REG_CHANGED */
    size_t n;         /* MSG_XFER: descriptors, copied */
    size_t done;      /* how many of them are posted */
    kvt__xfer_t *x;
    uint8_t *notes; /* their NOTIFY messages, copied */
};

struct ucx_session {
    kvt__session_t base;
    ucx_worker_t *wk;
    uint64_t token;
    char addr[KVT_WIRE_NAME_MAX + 32]; /* the peer's listener */
    uint8_t *peer_addr;                /* its worker's address */
    size_t peer_addr_len;
    /* Set by kill() from any thread: refuse new work with it. */
    _Atomic int32_t killed;

    /* The opener waits on these for HELLO_ACK. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int opened;    /* 1: acknowledged; <0: a kvt_status_t failure */
    int auth_sent; /* AUTH sent: the next HELLO_ACK decides */
    uint8_t nonce[UCX_NONCE_LEN]; /* in HELLO when this engine has a token */
    uint64_t desc_gen; /* the registry generation of the peer's descriptor */
    /* A peer on this host: its process, watched while work is in flight
     * (UCX's shared memory finds a dead peer only by keepalive). */
    int pidfd;
    uint64_t next_pid_check;

    /* The worker's alone from here on. */
    ucx_session_t *wnext, *wprev; /* the worker's sessions */
    ucx_conn_t *conn;             /* NULL once it left it */
    int ep_error;                 /* its connection failed */
    int linger; /* closed: in-flight work may finish until linger_until */
    uint64_t linger_until;
    kvt_status_t failed;
    ucx_rregion_t *regions; /* sorted by start */
    size_t nregions;
    size_t last;      /* the region found last */
    int stale;        /* the peer's registry changed: fetch again */
    uint64_t ack_gen; /* REG_ACK owed for this generation (0: none) */
    ucx_unit_t *fifo_head, *fifo_tail; /* epochs, notifies, acks */
    ucx_unit_t *gets_head, *gets_tail; /* reads */
    ucx_unit_t *epoch;                 /* the open epoch */
    ucx_msg_t *held_head, *held_tail;  /* work waiting for a fetch */
    int touched;                       /* in the worker's touched list */
    ucx_session_t *tnext;
    int released;
};

/* A peer that opened a session to this engine (target side). */
struct ucx_inbound {
    ucx_inbound_t *next;
    ucx_worker_t *wk;
    uint64_t token;
    ucx_conn_t *conn;          /* back to the initiator's worker */
    uint64_t acked;            /* the last generation it acknowledged */
    uint64_t owed;             /* the generation it has yet to acknowledge */
    int auth_wait;             /* challenged; served only after its AUTH */
    uint64_t auth_until;       /* dropped when still waiting then */
    uint8_t want[UCX_MAC_LEN]; /* the MAC its AUTH must carry */
    int dead;
    int error; /* its error handler ran */
};

/* A message received, kept until the worker is out of ucp's progress
 * (where endpoints may not be created). */
typedef struct ucx_event {
    struct ucx_event *next;
    unsigned id;
    uint64_t token;
    uint64_t value;
    size_t len;
    uint8_t data[];
} ucx_event_t;

struct ucx_worker {
    kvt__ucx_t *ucx;
    unsigned id;
    ucp_worker_h w;
    int efd;  /* ucp's */
    int evfd; /* ours: the inbox is not empty */
    int epfd;
    pthread_t thread;
    uint8_t *addr; /* packed worker address */
    size_t addr_len;

    pthread_mutex_t lock; /* the inbox */
    ucx_msg_t *in_head, *in_tail;
    int asleep_hint;
    _Atomic int need_wake; /* a plugged submission left it asleep */

    /* The worker thread's alone. */
    ucx_session_t *sessions;
    ucx_session_t *touched;
    ucx_inbound_t *inbound;
    ucx_conn_t *conns;
    _Atomic int conn_error; /* some connection failed */
    ucx_event_t *ev_head, *ev_tail;
    void **closing; /* close requests ucp is not done with */
    unsigned nclosing, closing_cap;
    int inbound_error; /* an inbound endpoint's error handler ran */
    int inbound_dead;  /* some inbound peers were dropped: reap them */
    uint64_t next_tick;
};

/* A registry change the target waits to have acknowledged. */
typedef struct {
    uint64_t gen;
    unsigned workers_left; /* workers that have yet to send it */
    unsigned acks_left;    /* peers that have yet to acknowledge it */
} ucx_regchg_t;

struct kvt__ucx {
    kvt__tl_t base;
    kvt_engine_h e;
    const kvt__engine_cfg_t *cfg;
    ucp_context_h ctx;
    /* Endpoints open to peer workers, on all workers (ucx_conn.c): a
     * gauge, read by tests. */
    _Atomic unsigned nconns;
    unsigned nworkers;
    ucx_worker_t *workers;
    uint8_t *section; /* this engine's descriptor section */
    uint32_t section_len;
    _Atomic unsigned next_worker;
    _Atomic uint64_t next_token;
    _Atomic int stopping;
    int started;

    pthread_mutex_t reg_serial; /* one registry change at a time */
    pthread_mutex_t lock;       /* guards chg */
    pthread_cond_t cond;
    ucx_regchg_t chg;
    /* The registry's generation, as initiators were told it (bumped by
     * mem_changed() before it looks at ninbound), and how many initiators
     * this engine serves (counted by on_hello() before it reads gen). */
    _Atomic uint64_t gen;
    _Atomic unsigned ninbound;
    unsigned max_inbound; /* UCX_INBOUND_MAX, unless a test set another */
};

/* ucx_worker.c */
void *kvt__ucx_worker_main(void *arg);
void kvt__ucx_post(ucx_worker_t *wk, ucx_msg_t *m, int wake);
void kvt__ucx_wake(ucx_worker_t *wk);
kvt_status_t kvt__ucx_status(ucs_status_t st);

/* ucx_ep.c: sessions (opening, submission, service, failure, release),
 * on their worker's thread unless said. */
kvt_status_t kvt__ucx_open(kvt__tl_t *tl, const kvt__tl_peer_t *peer,
                           kvt__session_t **s_p, const char **why_p);
kvt_status_t kvt__ucx_submit(kvt__session_t *s, const kvt__xfer_t *x, size_t n,
                             kvt__sub_t *sub);
void kvt__ucx_kill(kvt__session_t *s, kvt_status_t why);
void kvt__ucx_session_destroy(kvt__session_t *s);
void kvt__ucx_flush_tl(kvt__tl_t *tl);
/* Worker side. */
void kvt__ucx_sess_connect(ucx_session_t *s);
/* Fail @s: everything in flight ends with @why; @evict: the failure is
 * the session's own (the segment is evicted). */
void kvt__ucx_sess_fail(ucx_session_t *s, kvt_status_t why, int evict);
/* After progress: acks, fetches, the FIFO, reaping. Returns whether the
 * session still needs the worker. */
int kvt__ucx_sess_service(ucx_session_t *s, uint64_t now);
ucx_session_t *kvt__ucx_sess_by_token(ucx_worker_t *wk, uint64_t token);

/* ucx_data.c: a session's data path, on its worker's thread. */
void kvt__ucx_sess_xfer(ucx_session_t *s, ucx_msg_t *m);
void kvt__ucx_sess_close_epoch(ucx_session_t *s);
int kvt__ucx_sess_busy(const ucx_session_t *s);
void kvt__ucx_sess_touch(ucx_session_t *s);
void kvt__ucx_complete_msg(ucx_msg_t *m, kvt_status_t st);
/* A request of unit @u ended: whether @u was an orphan (then it is freed
 * with its last request, and nothing else is to be done). */
int kvt__ucx_unit_orphan_done(ucx_unit_t *u);
/* Post what @s holds, in order, within one turn's budget. */
void kvt__ucx_run_held(ucx_session_t *s);
/* Send the NOTIFYs now due and finish the FIFO's units that are done. */
void kvt__ucx_fifo_advance(ucx_session_t *s);

/* ucx_rkey.c: the peer's regions and their keys, the session's worker's
 * alone once the session is open. */
/* Free the table of @s, with the keys it unpacked. */
void kvt__ucx_regions_free(ucx_session_t *s);
/* Load the table of @s from the peer's descriptor @d (its ucx keys). */
kvt_status_t kvt__ucx_regions_load(ucx_session_t *s, const kvt__segdesc_t *d);
/* The region that holds [addr, +len) with @access, its key unpacked. */
ucx_rregion_t *kvt__ucx_region_find(ucx_session_t *s, uint64_t addr,
                                    uint64_t len, uint32_t access);

/* ucx_conn.c: connections. */
ucx_conn_t *kvt__ucx_conn_get(ucx_worker_t *wk, const void *addr, size_t len,
                              kvt_status_t *st_p);
void kvt__ucx_conn_put(ucx_worker_t *wk, ucx_conn_t *c);
void kvt__ucx_conn_fail(ucx_conn_t *c);
/* kvt__ucx_conn_put() for a user that never proved the auth token: when
 * no one else uses @c, it is closed (dropping what is in flight) rather
 * than kept for later sessions. */
void kvt__ucx_conn_put_untrusted(ucx_worker_t *wk, ucx_conn_t *c);
/* kvt__ucx_conn_put() after a refusal was sent on @c: when no one else
 * uses it, it is closed once that answer is flushed, so that a stream of
 * refused initiators leaves no endpoints (nor, over UCX's tcp,
 * descriptors) behind. */
void kvt__ucx_conn_put_refused(ucx_worker_t *wk, ucx_conn_t *c);
/* After progress: failed connections fail their users. */
void kvt__ucx_conns_check(ucx_worker_t *wk);
void kvt__ucx_conns_close_all(ucx_worker_t *wk);

/* ucx_am.c: messages. */
kvt_status_t kvt__ucx_am_setup(ucx_worker_t *wk);
kvt_status_t kvt__ucx_am_send(ucp_ep_h ep, unsigned id, uint64_t token,
                              uint64_t value, const void *data, size_t len,
                              ucx_unit_t *u);
void kvt__ucx_reg_changed(ucx_worker_t *wk, uint64_t gen);
/* ucx_auth.c: the proof of the shared secret on ucx's own HELLO, when
 * either side has one (docs/ucx.md). The MACs cover both workers'
 * addresses, both nonces and the descriptor's generation. */
void kvt__ucx_auth_mac(const kvt__engine_cfg_t *cfg, int target,
                       const void *iaddr, size_t ilen, const void *taddr,
                       size_t tlen, const uint8_t *nonce_i,
                       const uint8_t *nonce_t, uint64_t gen, uint8_t *out);
void kvt__ucx_inbound_close_all(ucx_worker_t *wk);
/* On the worker's tick: drop the initiators whose AUTH is overdue. */
void kvt__ucx_inbound_tick(ucx_worker_t *wk, uint64_t now);
void kvt__ucx_regchg_done(kvt__ucx_t *ucx, uint64_t gen, unsigned acks);
void kvt__ucx_regchg_ack(kvt__ucx_t *ucx, uint64_t gen);
/* Handle what the handlers kept (out of ucp's progress). */
void kvt__ucx_events(ucx_worker_t *wk);
/* Close @ep (force: drop what is in flight); done in the background. */
void kvt__ucx_ep_close(ucx_worker_t *wk, ucp_ep_h ep, int force);
/* Free close requests that are done; whether some are still running. */
int kvt__ucx_closing_reap(ucx_worker_t *wk);

/* For tests: engines created from now on in this process (and in
 * processes it forks) serve at most @n initiators over ucx (0: the
 * default, UCX_INBOUND_MAX). */
void kvt__ucx_inbound_max_set(unsigned n);

/* Condition variables on the monotonic clock, and deadlines for them. */
void kvt__ucx_cond_init(pthread_cond_t *c);
void kvt__ucx_abstime(struct timespec *ts, uint64_t ns_from_now);

#endif
