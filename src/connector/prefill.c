/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefill side of a room, and the sender calls that feed it: decode
 * ranks announce their blocks (ROOM), the caller gives chunks of source
 * blocks, and every (chunk, decode rank) pair becomes a job whose writes
 * are submitted layer group by layer group as the chunk's step marks
 * layers ready. A decode rank is told DONE once every job for it has
 * completed; the room succeeds when every decode rank has taken its DONE.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

/* At most this many ROOMs wait for a sender to be created. */
#define ORPHANS_MAX 65536u

/* ---- Announcements ------------------------------------------------------- */

/* Whether decode rank @d of @D feeds from prefill rank @p of @P, and
 * whether that prefill rank is a dummy for replicated caches. */
static int maps_to(uint32_t P, uint32_t p, uint32_t D, uint32_t d, int *dummy_p)
{
    if (P >= D) {
        *dummy_p = (p % (P / D)) != 0;
        return d == p / (P / D);
    }
    *dummy_p = 0;
    return p == d / (D / P);
}

/* Validate a ROOM against the session it came on (the decode layout) and
 * this rank's place; @why on failure. */
static kvt_status_t room_valid(kvt_conn_h c, const kvtc__sess_t *s,
                               const kvtc__room_msg_t *q, char *why, size_t wl)
{
    const kvtc__layout_t *dl = &s->peer_lay;
    int dummy;

    if (q->tp_size != s->peer.tp_size || q->tp_rank != s->peer.tp_rank) {
        snprintf(why, wl,
                 "the announcement names decode rank %u/%u, the "
                 "handshake %u/%u",
                 q->tp_rank, q->tp_size, s->peer.tp_rank, s->peer.tp_size);
        return KVT_ERR_INVALID_PARAM;
    }
    if (!maps_to(c->tp_size, c->tp_rank, q->tp_size, q->tp_rank, &dummy)) {
        snprintf(why, wl,
                 "decode rank %u of %u does not read from prefill "
                 "rank %u of %u",
                 q->tp_rank, q->tp_size, c->tp_rank, c->tp_size);
        return KVT_ERR_INVALID_PARAM;
    }
    if (dummy != ((q->flags & KVTC__ROOM_DUMMY) != 0)) {
        snprintf(why, wl,
                 "decode and prefill disagree on which prefill "
                 "rank sends the replicated caches");
        return KVT_ERR_INVALID_PARAM;
    }
    if (q->naux != dl->naux) {
        snprintf(why, wl, "%u aux slots for %u aux buffers", q->naux, dl->naux);
        return KVT_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < q->naux; i++) {
        if (q->aux_slots[i] != UINT64_MAX &&
            q->aux_slots[i] >= dl->aux[i].count) {
            snprintf(why, wl,
                     "aux slot %" PRIu64 " of buffer %u is out "
                     "of range",
                     q->aux_slots[i], i);
            return KVT_ERR_INVALID_PARAM;
        }
    }
    for (uint64_t i = 0; i < q->nblocks; i++) {
        if (q->ids[i] >= dl->num_blocks) {
            snprintf(why, wl, "decode block %u is out of range", q->ids[i]);
            return KVT_ERR_INVALID_PARAM;
        }
    }
    return KVT_OK;
}

/* Check the targets against init(): fail the room on a mismatch. */
static void prefill_check(struct kvt_room *r)
{
    if (!r->inited || r->failing)
        return;
    for (uint32_t i = 0; i < r->npeers; i++) {
        const kvtc__room_msg_t *q = &r->peers[i].req;
        if (q->first_block > r->num_blocks ||
            q->nblocks != r->num_blocks - q->first_block) {
            kvtc__room_fail(r, KVT_ERR_INVALID_PARAM,
                            "decode rank %u asked for blocks %" PRIu64
                            "..%" PRIu64 " of a request of %" PRIu64 " blocks",
                            r->peers[i].rank, q->first_block,
                            q->first_block + q->nblocks, r->num_blocks);
            return;
        }
    }
}

/* Take @q (its arrays move into the peer) as a target of @r, or refuse
 * it. */
static void attach(kvt_conn_h c, struct kvt_room *r, kvtc__sess_t *s,
                   kvtc__room_msg_t *q)
{
    uint32_t want = q->tp_size > c->tp_size ? q->tp_size / c->tp_size : 1;
    char why[KVTC__WHY_MAX] = "";
    kvtc__peer_t *p;

    if (kvtc__room_is_final(r) || r->failing)
        snprintf(why, sizeof(why), "the room has failed on prefill: %s",
                 r->failing ? r->freason : r->reason);
    else if (r->nexpect != 0 && r->nexpect != want)
        snprintf(why, sizeof(why), "decode ranks disagree on decode tp");
    else if (r->nexpect != 0 && r->npeers >= r->nexpect)
        snprintf(why, sizeof(why), "every decode rank announced already");
    for (uint32_t i = 0; why[0] == '\0' && i < r->npeers; i++)
        if (r->peers[i].sess == s || r->peers[i].rank == q->tp_rank)
            snprintf(why, sizeof(why), "decode rank %u announced twice",
                     q->tp_rank);
    if (why[0] != '\0') {
        kvtc__queue_reply(c, s, KVTC__CM_NAK, r->id, KVT_ERR_INVALID_PARAM,
                          why);
        kvtc__room_msg_clear(q);
        return;
    }
    p = kvtc__room_add_peer(r, s);
    if (p == NULL) {
        kvtc__queue_reply(c, s, KVTC__CM_NAK, r->id, KVT_ERR_NO_MEMORY,
                          "prefill is out of memory");
        kvtc__room_msg_clear(q);
        return;
    }
    r->nexpect = want;
    p->rank = q->tp_rank;
    p->flags = q->flags;
    p->st = KVTC__PEER_ACTIVE;
    p->req = *q;
    memset(q, 0, sizeof(*q));
    prefill_check(r);
    r->dirty = 1;
}

void kvtc__prefill_on_room(kvt_conn_h c, kvtc__sess_t *s, uint64_t room,
                           kvtc__room_msg_t *q)
{
    struct kvt_room *r = kvtc__room_find(c, room);
    char why[KVTC__WHY_MAX];
    kvtc__orphan_t *o;
    size_t n = 0;
    kvt_status_t st = room_valid(c, s, q, why, sizeof(why));

    if (st != KVT_OK) {
        KVTC__LOG_W("connector: refusing room %" PRIu64 " from %s: %s", room,
                    s->name, why);
        kvtc__queue_reply(c, s, KVTC__CM_NAK, room, st, why);
        kvtc__room_msg_clear(q);
        return;
    }
    if (r != NULL && r->role == KVT_ROLE_PREFILL) {
        attach(c, r, s, q);
        return;
    }
    for (kvtc__tomb_t *t = c->tombs; t != NULL; t = t->next) {
        if (t->room == room) {
            kvtc__queue_reply(c, s, KVTC__CM_NAK, room, KVT_ERR_CANCELED,
                              t->why);
            kvtc__room_msg_clear(q);
            return;
        }
    }
    for (o = c->orphans; o != NULL; o = o->next)
        n++;
    o = n < ORPHANS_MAX ? calloc(1, sizeof(*o)) : NULL;
    if (o == NULL) {
        kvtc__queue_reply(c, s, KVTC__CM_NAK, room, KVT_ERR_NO_SPACE,
                          "too many rooms announced before their request "
                          "reached prefill");
        kvtc__room_msg_clear(q);
        return;
    }
    o->sess = s;
    kvtc__sess_ref(s);
    o->room = room;
    o->t = kvtc__conn_now_ms();
    o->req = *q;
    memset(q, 0, sizeof(*q));
    o->next = c->orphans;
    c->orphans = o;
}

/* Attach the ROOMs that arrived before the sender was created. */
static void prefill_adopt(kvt_conn_h c, struct kvt_room *r)
{
    for (kvtc__orphan_t **pp = &c->orphans; *pp != NULL;) {
        kvtc__orphan_t *o = *pp;
        if (o->room != r->id) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        if (o->sess->state == KVTC__SESS_ALIVE)
            attach(c, r, o->sess, &o->req);
        kvtc__room_msg_clear(&o->req);
        kvtc__sess_unref(o->sess);
        free(o);
    }
}

/* ---- Jobs ---------------------------------------------------------------- */

/* The pairs (source block, decode block) of chunk @k that decode rank
 * @p asked for, grouped in runs. */
static kvtc__job_t *job_new(kvt_conn_h c, struct kvt_room *r, kvtc__chunk_t *k,
                            uint32_t peer)
{
    const kvtc__room_msg_t *q = &r->peers[peer].req;
    uint64_t lo = k->offset > q->first_block ? k->offset : q->first_block;
    uint64_t hi = k->offset + k->n, qend = q->first_block + q->nblocks;
    kvtc__job_t *j = calloc(1, sizeof(*j));
    uint32_t *dst = NULL;
    size_t n;

    if (j == NULL)
        return NULL;
    if (hi > qend)
        hi = qend;
    n = hi > lo ? (size_t)(hi - lo) : 0;
    j->chunk = k;
    j->peer = peer;
    if (n > 0) {
        j->runs = malloc(n * sizeof(*j->runs));
        dst = malloc(n * sizeof(*dst));
        if (j->runs == NULL || dst == NULL) {
            free(dst);
            free(j->runs);
            free(j);
            return NULL;
        }
        for (size_t i = 0; i < n; i++)
            dst[i] = q->ids[lo - q->first_block + i];
        j->nruns = kvtc__runs_build(k->ids + (lo - k->offset), dst, n,
                                    kvtc__max_run(c->lay.tokens), j->runs);
        free(dst);
    }
    if (k->is_last && r->aux != NULL &&
        !(r->peers[peer].flags & KVTC__ROOM_DUMMY))
        for (uint32_t i = 0; i < q->naux; i++)
            if (q->aux_slots[i] != UINT64_MAX)
                j->want_aux = 1;
    return j;
}

/* Descriptors of layers [l0, l1) for job @j (or only their count when
 * @out is NULL). */
static size_t layer_descs(kvt_conn_h c, const struct kvt_room *r,
                          const kvtc__job_t *j, uint32_t l0, uint32_t l1,
                          kvt_xfer_desc_t *out)
{
    const kvtc__peer_t *p = &r->peers[j->peer];
    int dummy = (p->flags & KVTC__ROOM_DUMMY) != 0;
    size_t n = 0;

    for (uint32_t l = l0; l < l1; l++) {
        for (uint32_t i = c->lay.first[l]; i < c->lay.first[l + 1]; i++) {
            const kvtc__xplan_t *x = &p->sess->plan[i];
            if (dummy && x->skip_if_dummy)
                continue;
            for (size_t k = 0; k < j->nruns; k++) {
                if (out == NULL)
                    n += kvtc__xplan_count(x, &j->runs[k]);
                else
                    n += kvtc__xplan_descs(x, &j->runs[k], p->sess->seg, l,
                                           out + n);
            }
        }
    }
    return n;
}

static size_t aux_descs(kvt_conn_h c, const struct kvt_room *r,
                        const kvtc__job_t *j, kvt_xfer_desc_t *out)
{
    const kvtc__peer_t *p = &r->peers[j->peer];
    const kvtc__layout_t *dl = &p->sess->peer_lay;
    size_t n = 0;

    for (uint32_t i = 0; i < c->lay.naux; i++) {
        uint64_t item = c->lay.aux[i].item_bytes;
        if (p->req.aux_slots[i] == UINT64_MAX)
            continue;
        if (out != NULL)
            out[n] = (kvt_xfer_desc_t){
                .opcode = KVT_OP_WRITE,
                .segment = p->sess->seg,
                .local_addr =
                    (void *)(uintptr_t)(c->lay.aux[i].base + r->aux[i] * item),
                .remote_addr = dl->aux[i].base + p->req.aux_slots[i] * item,
                .length = item,
                .user_data = UINT64_MAX};
        n++;
    }
    return n;
}

/* Report a failed job: a transport failure kills the session (and with
 * it every room on it); any other error fails this room. */
static void job_failed(kvt_conn_h c, struct kvt_room *r, kvtc__job_t *j,
                       kvt_status_t st)
{
    kvtc__peer_t *p = &r->peers[j->peer];

    switch (st) {
    case KVT_ERR_CONN_LOST:
    case KVT_ERR_TIMEDOUT:
    case KVT_ERR_UNREACHABLE:
    case KVT_ERR_CLOSED:
    case KVT_ERR_CANCELED:
        kvtc__sess_kill(c, p->sess, st, "writes to %s failed: %s",
                        p->sess->name, kvt_status_str(st));
        break;
    default:
        break;
    }
    kvtc__room_fail(r, st, "writes to decode rank %u (%s) failed: %s", p->rank,
                    p->sess->name, kvt_status_str(st));
}

/* Grow the worker's descriptor scratch to @n; 0 or -1 (no memory). */
static int descs_reserve(kvt_conn_h c, size_t n)
{
    kvt_xfer_desc_t *d;
    size_t cap = c->cap_descs ? c->cap_descs : 256;

    if (n <= c->cap_descs)
        return 0;
    while (cap < n)
        cap *= 2;
    d = realloc(c->descs, cap * sizeof(*d));
    if (d == NULL)
        return -1;
    c->descs = d;
    c->cap_descs = cap;
    return 0;
}

/* Submit @n descriptors from the scratch into the job's batch, creating
 * it (sized for every descriptor the job will ever have) on first use. */
static int job_submit(kvt_conn_h c, struct kvt_room *r, kvtc__job_t *j,
                      size_t n)
{
    kvtc__peer_t *p = &r->peers[j->peer];
    kvt_status_t st;

    if (j->batch == NULL) {
        size_t cap = layer_descs(c, r, j, 0, c->lay.nlayers, NULL) +
                     (j->want_aux ? aux_descs(c, r, j, NULL) : 0);
        st = kvt_batch_create(c->engine, cap ? cap : 1, &j->batch);
        if (st != KVT_OK) {
            j->batch = NULL;
            job_failed(c, r, j, st);
            return -1;
        }
        kvtc__conn_batch_watch(c, j->batch);
        j->cap = cap;
    }
    if (!p->started) {
        kvtc__cmb_t b;
        p->started = 1;
        kvtc__cmb_init(&b, KVTC__CM_STARTED, p->sess->id, r->id);
        if (kvtc__cmb_finish(&b) == KVT_OK)
            kvtc__ctrl_send(c, p->sess, &b, r->id, r->serial, j->peer);
    }
    st = kvt_batch_submit(j->batch, c->descs, n);
    if (st != KVT_OK) {
        job_failed(c, r, j, st);
        return -1;
    }
    return 0;
}

/*
 * Submit what is ready: layer groups [g*I, min((g+1)*I, L)) once their
 * last layer is ready (in the manner of tokenspeed's submit_interval),
 * then the aux items once the step has ended. Nothing is submitted for a
 * failing room or a target that is not active.
 */
static void job_advance(kvt_conn_h c, struct kvt_room *r, kvtc__job_t *j)
{
    uint32_t L = c->lay.nlayers, I = c->submit_interval, ready, upto;
    int aux_ready;
    size_t n;

    if (j->all_submitted || r->failing ||
        r->peers[j->peer].st != KVTC__PEER_ACTIVE)
        return;
    kvtc__step_state(c, j->chunk->step, &ready, &aux_ready);
    upto = ready >= L ? L : (ready / I) * I;
    if (upto > j->next_layer) {
        n = layer_descs(c, r, j, j->next_layer, upto, NULL);
        if (n > 0) {
            if (descs_reserve(c, n) != 0) {
                job_failed(c, r, j, KVT_ERR_NO_MEMORY);
                return;
            }
            layer_descs(c, r, j, j->next_layer, upto, c->descs);
            if (job_submit(c, r, j, n) != 0)
                return;
        }
        j->next_layer = upto;
    }
    if (j->next_layer == L && j->want_aux && !j->aux_done && aux_ready) {
        n = aux_descs(c, r, j, NULL);
        if (descs_reserve(c, n) != 0) {
            job_failed(c, r, j, KVT_ERR_NO_MEMORY);
            return;
        }
        aux_descs(c, r, j, c->descs);
        if (job_submit(c, r, j, n) != 0)
            return;
        j->aux_done = 1;
    }
    if (j->next_layer == L && (!j->want_aux || j->aux_done))
        j->all_submitted = 1;
}

/* Poll the job's batch; returns non-zero while writes are in flight. */
static int job_poll(kvt_conn_h c, struct kvt_room *r, kvtc__job_t *j)
{
    kvt_batch_state_t bs;
    kvt_status_t st;

    if (j->final)
        return 0;
    if (j->batch == NULL) {
        if (j->all_submitted || r->failing) {
            j->final = 1;
            j->st = j->all_submitted ? KVT_OK : KVT_ERR_CANCELED;
        }
        return 0;
    }
    st = kvt_batch_query(j->batch, &bs);
    if (bs.pending > 0)
        return 1;
    if (st != KVT_OK || j->all_submitted || r->failing) {
        j->final = 1;
        j->st = st == KVT_OK && !j->all_submitted ? KVT_ERR_CANCELED : st;
        if (kvt_batch_free(j->batch) == KVT_OK)
            j->batch = NULL;
        if (st != KVT_OK)
            job_failed(c, r, j, st);
    }
    return 0;
}

static int prefill_quiescent(struct kvt_room *r)
{
    for (kvtc__job_t *j = r->jobs; j != NULL; j = j->next)
        if (j->batch != NULL)
            return 0;
    return 1;
}

/* Create the jobs of pairs (chunk, target) that have none: targets are
 * only ever appended, so each chunk remembers how many it has covered. */
static void make_jobs(kvt_conn_h c, struct kvt_room *r)
{
    for (kvtc__chunk_t *k = r->chunks; k != NULL; k = k->next) {
        for (; k->covered < r->npeers; k->covered++) {
            kvtc__job_t *j;
            if (r->peers[k->covered].st != KVTC__PEER_ACTIVE)
                continue;
            j = job_new(c, r, k, k->covered);
            if (j == NULL) {
                kvtc__room_fail(r, KVT_ERR_NO_MEMORY, "out of memory");
                return;
            }
            j->next = r->jobs;
            r->jobs = j;
        }
    }
}

/* Every job for target @i is final and OK, and the last chunk was
 * given. */
static int target_complete(const struct kvt_room *r, uint32_t i)
{
    size_t chunks = 0, ok = 0;

    if (!r->got_last)
        return 0;
    for (const kvtc__chunk_t *k = r->chunks; k != NULL; k = k->next)
        chunks++;
    for (const kvtc__job_t *j = r->jobs; j != NULL; j = j->next) {
        if (j->peer != i)
            continue;
        if (!j->final || j->st != KVT_OK)
            return 0;
        ok++;
    }
    return ok == chunks;
}

/*
 * A failing room first waits for its own writes to be final, then tells
 * every decode rank still active (ABORT, or ABORT_ACK to the one that
 * aborted) and turns FAILED when every one of them has acknowledged,
 * finished or died.
 */
static int fail_progress(kvt_conn_h c, struct kvt_room *r, uint64_t now)
{
    int busy = 0, open = 0;

    for (kvtc__job_t *j = r->jobs; j != NULL; j = j->next)
        busy |= job_poll(c, r, j);
    if (!prefill_quiescent(r))
        return 1;
    for (uint32_t i = 0; i < r->npeers; i++) {
        kvtc__peer_t *p = &r->peers[i];
        if (p->need_ack) {
            kvtc__peer_abort_ack(c, r, i);
            if (p->st != KVTC__PEER_DONE)
                p->st = KVTC__PEER_QUIET;
        }
        switch (p->st) {
        case KVTC__PEER_ACTIVE:
            kvtc__peer_abort_start(c, r, i, now);
            open = 1;
            break;
        case KVTC__PEER_ABORTING:
            open |= kvtc__peer_abort_wait(c, r, i, now);
            break;
        case KVTC__PEER_DONE_SENDING:
            open = 1;
            break;
        default:
            break;
        }
    }
    if (!open)
        kvtc__room_final(r, KVT_POLL_FAILED);
    return busy;
}

int kvtc__prefill_tick(kvt_conn_h c, struct kvt_room *r, uint64_t now)
{
    int busy = 0, bootstrapped, done = 1;

    if (kvtc__room_is_final(r))
        return 0;
    if (r->failing)
        return fail_progress(c, r, now);
    bootstrapped = r->nexpect > 0 && r->npeers == r->nexpect;
    if (bootstrapped && r->state == KVT_POLL_BOOTSTRAPPING)
        kvtc__room_set(r, KVT_POLL_WAITING_FOR_INPUT,
                       "%u decode rank(s) announced the room", r->npeers);
    if (bootstrapped && r->inited && r->chunks != NULL &&
        r->state == KVT_POLL_WAITING_FOR_INPUT)
        kvtc__room_set(r, KVT_POLL_TRANSFERRING, "sending to %u decode rank(s)",
                       r->npeers);
    if (!r->inited)
        return 0;
    make_jobs(c, r);
    for (kvtc__job_t *j = r->jobs; j != NULL && !r->failing; j = j->next) {
        job_advance(c, r, j);
        busy |= job_poll(c, r, j);
    }
    if (r->failing)
        return 1;
    for (uint32_t i = 0; i < r->npeers; i++) {
        kvtc__peer_t *p = &r->peers[i];
        if (p->st == KVTC__PEER_ACTIVE && target_complete(r, i)) {
            kvtc__cmb_t b;
            p->st = KVTC__PEER_DONE_SENDING;
            kvtc__cmb_init(&b, KVTC__CM_DONE, p->sess->id, r->id);
            if (kvtc__cmb_finish(&b) == KVT_OK)
                kvtc__ctrl_send(c, p->sess, &b, r->id, r->serial, i);
        }
        done &= p->st == KVTC__PEER_DONE;
    }
    if (bootstrapped && done)
        kvtc__room_set(r, KVT_POLL_SUCCESS,
                       "every block and aux item reached %u decode rank(s)",
                       r->npeers);
    return busy;
}

/* ---- Public calls -------------------------------------------------------- */

kvt_status_t kvt_sender_create(kvt_conn_h c, const char *bootstrap_addr,
                               uint64_t room, kvt_sender_h *sender_p)
{
    struct kvt_room *r;
    kvt_status_t st;

    (void)bootstrap_addr;
    if (c == NULL || sender_p == NULL || c->role != KVT_ROLE_PREFILL)
        return KVT_ERR_INVALID_PARAM;
    pthread_mutex_lock(&c->lock);
    st = kvtc__room_new(c, room, KVT_ROLE_PREFILL, &r);
    if (st != KVT_OK)
        goto out;
    snprintf(r->reason, sizeof(r->reason),
             "waiting for decode to announce the room");
    for (kvtc__tomb_t **pp = &c->tombs; *pp != NULL; pp = &(*pp)->next) {
        kvtc__tomb_t *t = *pp;
        if (t->room == room && t->aborted) {
            kvtc__room_fail(r, KVT_ERR_CANCELED, "%s", t->why);
            *pp = t->next;
            free(t);
            break;
        }
    }
    prefill_adopt(c, r);
    kvtc__conn_wake(c);
    *sender_p = r;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_sender_init(kvt_sender_h r, uint64_t num_blocks,
                             const uint64_t *aux_slots, size_t num_aux_slots)
{
    kvt_conn_h c;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (r == NULL || r->role != KVT_ROLE_PREFILL || num_blocks == 0 ||
        num_blocks > UINT32_MAX)
        return st;
    c = r->conn;
    pthread_mutex_lock(&c->lock);
    if (r->inited || kvtc__room_is_final(r))
        goto out;
    st = kvtc__room_aux(c, aux_slots, num_aux_slots, &r->aux);
    if (st != KVT_OK)
        goto out;
    r->num_blocks = num_blocks;
    r->inited = 1;
    prefill_check(r);
    r->dirty = 1;
    kvtc__conn_wake(c);
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_sender_send_step(kvt_sender_h r, uint64_t step,
                                  const uint32_t *ids, size_t n, int is_last)
{
    kvt_conn_h c;
    kvtc__chunk_t *k = NULL;
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (r == NULL || r->role != KVT_ROLE_PREFILL || (n > 0 && ids == NULL))
        return st;
    c = r->conn;
    pthread_mutex_lock(&c->lock);
    if (!r->inited || r->got_last || step > c->next_step ||
        n > r->num_blocks - r->next_block ||
        (is_last && r->next_block + n != r->num_blocks))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= c->lay.num_blocks)
            goto out;
    st = KVT_OK;
    r->next_block += n;
    r->got_last = is_last != 0;
    if (r->got_last)
        r->t_last_ns = kvtc__conn_now_ns();
    if (kvtc__room_is_final(r) || r->failing)
        goto out;
    k = calloc(1, sizeof(*k));
    if (k == NULL || (n > 0 && (k->ids = malloc(n * sizeof(*ids))) == NULL)) {
        free(k);
        kvtc__room_fail(r, KVT_ERR_NO_MEMORY, "out of memory for a chunk");
        goto out;
    }
    if (n > 0)
        memcpy(k->ids, ids, n * sizeof(*ids));
    k->step = step;
    k->offset = r->next_block - n;
    k->n = (uint32_t)n;
    k->is_last = is_last != 0;
    *r->chunk_tail = k;
    r->chunk_tail = &k->next;
    r->dirty = 1;
    kvtc__conn_wake(c);
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_sender_send(kvt_sender_h r, const uint32_t *ids, size_t n,
                             int is_last)
{
    return kvt_sender_send_step(r, 0, ids, n, is_last);
}
