/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx's refusal paths (docs/ucx.md, Messages and Limits), against a
 * target engine in a child process and a raw ucx peer in this one that
 * sends ucx's messages as it pleases:
 *
 * - a raw peer that proves the token is served (the control: the raw
 *   peer speaks the protocol, so what the target refuses below it
 *   refuses for the reason the case gives);
 * - no token, a wrong MAC, an AUTH of the wrong length, malformed HELLOs,
 *   AUTH or NOTIFY from a session that has not proved the token: refused
 *   (HELLO_ACK REFUSED) or dropped, every refusal counted, and nothing
 *   reaches the target's notification queue;
 * - a peer that is challenged and stays silent is dropped after the
 *   authentication deadline: counted, and its proof is not taken after;
 * - the cap on initiators: past it an engine is refused KVT_ERR_BUSY,
 *   counted and logged on both sides, while those served go on working;
 *   once one leaves, the refused one is served; and a peer that has not
 *   proved the token makes room for one that does.
 *
 * Run over UCX's tcp on lo (tests/transport/CMakeLists.txt sets the
 * environment); skipped when ucx is not built in.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvt_test.h"
#include "peer.h"

#ifndef KVT_TEST_UCX

int main(void)
{
    fprintf(stderr, "skipped: ucx is not built in\n");
    return KVT_TEST_SKIP;
}

#else

#include "core/engine_int.h"
#include "transport/ucx/ucx.h"
#include "util/auth.h"

#define TOKEN "correct horse battery staple"
#define WAIT_S 3.0  /* for an answer that must come */
#define QUIET_S 0.5 /* for one that must not */

/* ---- The raw peer ----------------------------------------------------- */

typedef struct {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_address_t *addr;
    size_t addr_len;
    ucp_ep_h ep; /* to the target's worker */
    /* The target: its worker's address and registry generation. */
    uint8_t taddr[UCX_ADDR_MAX];
    size_t taddr_len;
    uint64_t gen;
    /* HELLO_ACKs received: how many, and the last. */
    int nacks;
    uint64_t ack_token, ack_value;
    size_t ack_len;
    uint8_t ack_data[UCX_NONCE_LEN + UCX_MAC_LEN];
    int ep_failed; /* the endpoint's error handler ran */
} raw_t;

static ucs_status_t on_ack(void *arg, const void *header, size_t hlen,
                           void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    raw_t *r = arg;
    ucx_am_hdr_t h;

    (void)param;
    CHECK(hlen == sizeof(h) && len <= sizeof(r->ack_data));
    memcpy(&h, header, sizeof(h));
    r->ack_token = h.token;
    r->ack_value = h.value;
    r->ack_len = len;
    memcpy(r->ack_data, data, len);
    r->nacks++;
    return UCS_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    raw_t *r = arg;

    (void)ep;
    (void)status;
    r->ep_failed = 1;
}

/* The target's worker 0 and generation, from the descriptor that an
 * engine with the token fetches over the control plane. */
static void target_worker(raw_t *r, const peer_t *p)
{
    kvt_engine_params_t prm = {0};
    const kvt__segdesc_tl_t *sec;
    const uint8_t *b;
    kvt_segment_t seg;
    kvt__seg_t *sg;
    kvt_engine_h e;
    uint32_t n, l;

    prm.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_AUTH_TOKEN;
    prm.transports = KVT_TRANSPORT_TCP;
    prm.auth_token = TOKEN;
    CHECK_OK(kvt_engine_create(&prm, &e));
    CHECK_OK(kvt_segment_open(e, p->segment, &seg));
    sg = kvt__seg_get(e, seg);
    CHECK(sg != NULL);
    pthread_mutex_lock(&sg->desc_lock);
    sec = kvt__segdesc_tl(&sg->desc, KVT_TRANSPORT_UCX);
    CHECK(sec != NULL && sec->len >= 16);
    b = sec->body;
    memcpy(&r->gen, b, 8);
    memcpy(&n, b + 8, 4);
    memcpy(&l, b + 12, 4);
    CHECK(n >= 1 && l > 0 && l <= sizeof(r->taddr) && 16 + l <= sec->len);
    memcpy(r->taddr, b + 16, l);
    r->taddr_len = l;
    pthread_mutex_unlock(&sg->desc_lock);
    kvt__seg_unref(sg);
    kvt_engine_destroy(e);
}

static void raw_start(raw_t *r, const peer_t *p)
{
    ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_am_handler_param_t hp = {
        .field_mask =
            UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
            UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = UCX_AM_HELLO_ACK,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = on_ack,
        .arg = r};
    ucp_ep_params_t ep = {0};
    ucp_config_t *cfg;

    memset(r, 0, sizeof(*r));
    target_worker(r, p);
    CHECK(ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
    CHECK(ucp_init(&cp, cfg, &r->ctx) == UCS_OK);
    ucp_config_release(cfg);
    CHECK(ucp_worker_create(r->ctx, &wp, &r->w) == UCS_OK);
    CHECK(ucp_worker_get_address(r->w, &r->addr, &r->addr_len) == UCS_OK);
    CHECK(r->addr_len <= UCX_ADDR_MAX);
    CHECK(ucp_worker_set_am_recv_handler(r->w, &hp) == UCS_OK);
    /* Peer failure handling, as the engines use: UCX refuses endpoints
     * between workers that differ in it. */
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)r->taddr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = r;
    CHECK(ucp_ep_create(r->w, &ep, &r->ep) == UCS_OK);
}

static void raw_progress(raw_t *r, double seconds)
{
    double t0 = kvt_test_now();

    do {
        ucp_worker_progress(r->w);
    } while (kvt_test_now() - t0 < seconds);
}

static void raw_stop(raw_t *r)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *q = ucp_ep_close_nbx(r->ep, &p);

    while (q != NULL && !UCS_PTR_IS_ERR(q) &&
           ucp_request_check_status(q) == UCS_INPROGRESS)
        ucp_worker_progress(r->w);
    if (q != NULL && !UCS_PTR_IS_ERR(q))
        ucp_request_free(q);
    ucp_worker_release_address(r->w, r->addr);
    ucp_worker_destroy(r->w);
    ucp_cleanup(r->ctx);
}

/* Send message @id with the header {@token, @value} and @len bytes. */
static void raw_send(raw_t *r, unsigned id, uint64_t token, uint64_t value,
                     const void *data, size_t len)
{
    ucx_am_hdr_t h = {token, value};
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_EAGER};
    double t0 = kvt_test_now();
    void *q = ucp_am_send_nbx(r->ep, id, &h, sizeof(h), data, len, &p);

    CHECK(!UCS_PTR_IS_ERR(q));
    while (q != NULL && ucp_request_check_status(q) == UCS_INPROGRESS) {
        CHECK(kvt_test_now() - t0 < WAIT_S);
        ucp_worker_progress(r->w);
    }
    if (q != NULL) {
        CHECK(ucp_request_check_status(q) == UCS_OK);
        ucp_request_free(q);
    }
}

/* A HELLO for session @token: the generation, this worker's address, and
 * with @nonce (may be NULL) the nonce, then @extra bytes of zeros; @value
 * says the address's length (r->addr_len unless malformed). */
static void raw_hello(raw_t *r, uint64_t token, const uint8_t *nonce,
                      size_t extra, uint64_t value)
{
    uint8_t m[8 + UCX_ADDR_MAX + UCX_NONCE_LEN + 16] = {0};
    size_t len = 8 + r->addr_len;

    CHECK(extra <= 16);
    memcpy(m, &r->gen, 8);
    memcpy(m + 8, r->addr, r->addr_len);
    if (nonce != NULL) {
        memcpy(m + len, nonce, UCX_NONCE_LEN);
        len += UCX_NONCE_LEN;
    }
    raw_send(r, UCX_AM_HELLO, token, value, m, len + extra);
}

/* Whether a HELLO_ACK for @token comes within @seconds. */
static int raw_ack(raw_t *r, uint64_t token, double seconds)
{
    double t0 = kvt_test_now();
    int n = r->nacks;

    while (kvt_test_now() - t0 < seconds) {
        ucp_worker_progress(r->w);
        if (r->nacks != n) {
            CHECK(r->ack_token == token);
            return 1;
        }
    }
    return 0;
}

/* The initiator's MAC for the challenge last received. */
static void raw_mac(raw_t *r, const uint8_t *nonce, uint8_t *mac)
{
    kvt__engine_cfg_t cfg;

    memset(&cfg, 0, sizeof(cfg));
    CHECK_OK(kvt__auth_init(&cfg.auth, TOKEN));
    CHECK(r->ack_len == UCX_NONCE_LEN + UCX_MAC_LEN);
    kvt__ucx_auth_mac(&cfg, 0, r->addr, r->addr_len, r->taddr, r->taddr_len,
                      nonce, r->ack_data, r->gen, mac);
}

/* A challenge for @token, after a HELLO with @nonce. */
static void raw_challenged(raw_t *r, uint64_t token, const uint8_t *nonce)
{
    raw_hello(r, token, nonce, 0, r->addr_len);
    CHECK(raw_ack(r, token, WAIT_S));
    CHECK((r->ack_value & (UCX_ACK_REFUSED | UCX_ACK_AUTHED)) == 0);
    CHECK(r->ack_len == UCX_NONCE_LEN + UCX_MAC_LEN);
}

static void raw_notify(raw_t *r, uint64_t token, const char *msg)
{
    char m[64];
    int n = snprintf(m, sizeof(m), "raw:1%s", msg);

    raw_send(r, UCX_AM_NOTIFY, token, 5, m, (size_t)n);
}

/* ---- The target ------------------------------------------------------- */

static unsigned long long refused(peer_t *p)
{
    const char *r = peer_cmd(p, "refused");

    CHECK(r != NULL && strcmp(r, "?") != 0);
    return strtoull(r, NULL, 10);
}

/* The notification the target has queued (within @ms), or "none". */
static const char *queued(peer_t *p, int ms)
{
    return peer_cmd(p, "notify %d 0 0 0", ms);
}

static kvt_engine_h initiator(const char *token)
{
    kvt_engine_params_t prm = {0};
    kvt_engine_h e = NULL;

    prm.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_AUTH_TOKEN;
    prm.transports = KVT_TRANSPORT_UCX;
    prm.auth_token = token != NULL ? token : "";
    CHECK_OK(kvt_engine_create(&prm, &e));
    return e;
}

/* One write of @len bytes of pattern @seed at @off into @p's main region
 * from @e, checked at the target. */
static void write_checked(kvt_engine_h e, kvt_segment_t seg, peer_t *p,
                          uint64_t off, uint64_t len, uint64_t seed)
{
    uint8_t *buf = malloc(len);
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;

    CHECK(buf != NULL);
    pattern_fill(buf, len, seed, off);
    CHECK_OK(kvt_mem_register(e, buf, len, KVT_ACCESS_REMOTE_RW));
    d.opcode = KVT_OP_WRITE;
    d.segment = seg;
    d.local_addr = buf;
    d.remote_addr = p->main_addr + off;
    d.length = len;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    CHECK_OK(kvt_batch_wait(b, 10000));
    CHECK_OK(kvt_batch_free(b));
    CHECK(strcmp(peer_cmd(p, "check %llu %llu %llu",
                          (unsigned long long)(p->main_addr + off),
                          (unsigned long long)len, (unsigned long long)seed),
                 "0") == 0);
    CHECK_OK(kvt_mem_unregister(e, buf));
    free(buf);
}

/* ---- Cases ------------------------------------------------------------ */

/* A raw peer that proves the token is served: its notification lands. */
KVT_TEST(raw_proof_served)
{
    uint8_t nonce[UCX_NONCE_LEN], mac[UCX_MAC_LEN];
    peer_t p;
    raw_t r;

    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, TOKEN);
    raw_start(&r, &p);
    CHECK_OK(kvt__auth_random(nonce, sizeof(nonce)));
    raw_challenged(&r, 11, nonce);
    raw_mac(&r, nonce, mac);
    raw_send(&r, UCX_AM_AUTH, 11, 0, mac, sizeof(mac));
    CHECK(raw_ack(&r, 11, WAIT_S));
    CHECK(r.ack_value & UCX_ACK_AUTHED);
    CHECK((r.ack_value & UCX_ACK_REFUSED) == 0);
    raw_notify(&r, 11, "proved");
    CHECK(strcmp(queued(&p, 3000), "proved 0") == 0);
    CHECK(refused(&p) == 0);
    raw_send(&r, UCX_AM_BYE, 11, 0, NULL, 0);
    raw_stop(&r);
    peer_stop(&p);
}

/*
 * Every way of not proving the token, from a raw peer: each refusal is
 * answered REFUSED and counted; malformed HELLOs and messages of sessions
 * that are unknown or not authenticated are dropped without an answer;
 * no notification reaches the queue. The target still serves a peer
 * that proves the token afterwards.
 */
KVT_TEST(raw_refusals)
{
    uint8_t nonce[UCX_NONCE_LEN], mac[UCX_MAC_LEN], zeros[UCX_MAC_LEN + 1];
    static const size_t bad_len[] = {0, UCX_MAC_LEN - 1, UCX_MAC_LEN + 1};
    uint64_t token = 100;
    peer_t p;
    raw_t r;

    memset(zeros, 0, sizeof(zeros));
    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, TOKEN);
    raw_start(&r, &p);
    CHECK_OK(kvt__auth_random(nonce, sizeof(nonce)));

    /* No token: refused at once; its notification and a proof made for
     * it afterwards (the session is gone) are dropped. */
    raw_hello(&r, ++token, NULL, 0, r.addr_len);
    CHECK(raw_ack(&r, token, WAIT_S));
    CHECK(r.ack_value & UCX_ACK_REFUSED);
    CHECK(r.ack_len == 0);
    raw_notify(&r, token, "no-token");
    raw_send(&r, UCX_AM_AUTH, token, 0, zeros, UCX_MAC_LEN);
    CHECK(!raw_ack(&r, token, QUIET_S));
    CHECK(refused(&p) == 1);

    /* A wrong MAC; a notification between challenge and AUTH. */
    raw_challenged(&r, ++token, nonce);
    raw_notify(&r, token, "before-auth");
    raw_send(&r, UCX_AM_AUTH, token, 0, zeros, UCX_MAC_LEN);
    CHECK(raw_ack(&r, token, WAIT_S));
    CHECK((r.ack_value & UCX_ACK_REFUSED) && !(r.ack_value & UCX_ACK_AUTHED));
    raw_notify(&r, token, "wrong-mac");
    CHECK(refused(&p) == 2);

    /* AUTH of the wrong length: empty, one byte short, one too many. */
    for (size_t i = 0; i < sizeof(bad_len) / sizeof(bad_len[0]); i++) {
        raw_challenged(&r, ++token, nonce);
        raw_send(&r, UCX_AM_AUTH, token, 0, zeros, bad_len[i]);
        CHECK(raw_ack(&r, token, WAIT_S));
        CHECK(r.ack_value & UCX_ACK_REFUSED);
        raw_notify(&r, token, "garbled");
    }
    CHECK(refused(&p) == 5);

    /* The right proof for a session that was refused, or never began. */
    raw_challenged(&r, ++token, nonce);
    raw_mac(&r, nonce, mac);
    raw_send(&r, UCX_AM_AUTH, token, 0, zeros, UCX_MAC_LEN);
    CHECK(raw_ack(&r, token, WAIT_S));
    CHECK(r.ack_value & UCX_ACK_REFUSED);
    raw_send(&r, UCX_AM_AUTH, token, 0, mac, sizeof(mac));
    CHECK(!raw_ack(&r, token, QUIET_S));
    raw_send(&r, UCX_AM_AUTH, 999, 0, mac, sizeof(mac));
    CHECK(!raw_ack(&r, 999, QUIET_S));
    CHECK(refused(&p) == 6);

    /* Malformed HELLOs: no address length, one past the data, a length
     * that leaves stray bytes, one over the limit. Dropped unanswered. */
    raw_hello(&r, ++token, nonce, 0, 0);
    CHECK(!raw_ack(&r, token, QUIET_S));
    raw_hello(&r, ++token, nonce, 0, r.addr_len + UCX_NONCE_LEN + 1);
    CHECK(!raw_ack(&r, token, QUIET_S));
    raw_hello(&r, ++token, nonce, 5, r.addr_len);
    CHECK(!raw_ack(&r, token, QUIET_S));
    raw_hello(&r, ++token, NULL, 0, UCX_ADDR_MAX + 1);
    CHECK(!raw_ack(&r, token, QUIET_S));

    CHECK(strcmp(queued(&p, 0), "none") == 0);

    /* Still served: the proof, then a notification that lands. */
    raw_challenged(&r, ++token, nonce);
    raw_mac(&r, nonce, mac);
    raw_send(&r, UCX_AM_AUTH, token, 0, mac, sizeof(mac));
    CHECK(raw_ack(&r, token, WAIT_S));
    CHECK(r.ack_value & UCX_ACK_AUTHED);
    raw_notify(&r, token, "after");
    CHECK(strcmp(queued(&p, 3000), "after 0") == 0);
    CHECK(refused(&p) == 6);
    raw_stop(&r);
    peer_stop(&p);
}

/*
 * A peer that is challenged and never answers is dropped once the
 * authentication deadline (UCX_AUTH_NS) has passed, not before: counted
 * as refused, and its proof is not taken afterwards (the session is
 * gone). Meanwhile and after, an engine with the token is served.
 */
KVT_TEST(silent_peer_dropped)
{
    uint8_t nonce[UCX_NONCE_LEN], mac[UCX_MAC_LEN];
    double t0, limit = UCX_AUTH_NS / 1e9;
    kvt_segment_t seg;
    kvt_engine_h e;
    peer_t p;
    raw_t r;

    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, TOKEN);
    raw_start(&r, &p);
    CHECK_OK(kvt__auth_random(nonce, sizeof(nonce)));
    raw_challenged(&r, 21, nonce);
    t0 = kvt_test_now();
    raw_mac(&r, nonce, mac);

    e = initiator(TOKEN);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    write_checked(e, seg, &p, 0, 1 << 20, 5);
    CHECK(refused(&p) == 0);
    while (refused(&p) == 0) {
        CHECK(kvt_test_now() - t0 < limit + 3.0);
        raw_progress(&r, 0.1);
    }
    CHECK(kvt_test_now() - t0 > limit - 0.5);
    CHECK(refused(&p) == 1);
    raw_send(&r, UCX_AM_AUTH, 21, 0, mac, sizeof(mac));
    CHECK(!raw_ack(&r, 21, 1.0));
    raw_notify(&r, 21, "late");
    CHECK(strcmp(queued(&p, 200), "none") == 0);
    write_checked(e, seg, &p, 1 << 20, 1 << 20, 6);
    kvt_engine_destroy(e);
    raw_stop(&r);
    peer_stop(&p);
}

/*
 * The cap on initiators (2 here): a third engine is refused with
 * KVT_ERR_BUSY, the refusal counted and logged on both sides, while the
 * two served go on working; once one of them leaves, the third is
 * served.
 */
KVT_TEST(inbound_cap)
{
    char log[] = "/tmp/kvt-ucx-cap-XXXXXX";
    kvt_segment_t seg[3];
    kvt_engine_h e[3];
    kvt_status_t st;
    int old = kvt_test_log_to(log);
    double t0;
    peer_t p;

    kvt__ucx_inbound_max_set(2); /* for the target, forked next */
    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, NULL);
    kvt__ucx_inbound_max_set(0);
    for (int i = 0; i < 3; i++)
        e[i] = initiator(NULL);
    CHECK_OK(kvt_segment_open(e[0], p.segment, &seg[0]));
    CHECK_OK(kvt_segment_open(e[1], p.segment, &seg[1]));
    write_checked(e[0], seg[0], &p, 0, 1 << 20, 1);
    write_checked(e[1], seg[1], &p, 1 << 20, 1 << 20, 2);
    CHECK_ST(kvt_segment_open(e[2], p.segment, &seg[2]), KVT_ERR_BUSY);
    CHECK(refused(&p) == 1);
    write_checked(e[0], seg[0], &p, 0, 1 << 20, 3);
    write_checked(e[1], seg[1], &p, 1 << 20, 1 << 20, 4);

    /* One leaves (BYE): its place is free again, soon. */
    CHECK_OK(kvt_segment_close(e[0], seg[0]));
    t0 = kvt_test_now();
    while ((st = kvt_segment_open(e[2], p.segment, &seg[2])) == KVT_ERR_BUSY) {
        CHECK(kvt_test_now() - t0 < 5.0);
        usleep(50000);
    }
    CHECK_OK(st);
    write_checked(e[2], seg[2], &p, 2 << 20, 1 << 20, 5);
    write_checked(e[1], seg[1], &p, 1 << 20, 1 << 20, 6);
    for (int i = 0; i < 3; i++)
        kvt_engine_destroy(e[i]);
    peer_stop(&p);
    kvt_test_log_back(old);
    CHECK(kvt_test_count_in_file(log, "serves 2 initiators, its most") >= 1);
    CHECK(kvt_test_count_in_file(log, "serves as many initiators as it takes") >= 1);
    unlink(log);
}

/*
 * At the cap (1 here), a peer that has not proved the token makes room
 * for one that comes: the engine with the token is served, the silent
 * peer is dropped (counted), and its proof is not taken afterwards.
 */
KVT_TEST(cap_makes_room)
{
    uint8_t nonce[UCX_NONCE_LEN], mac[UCX_MAC_LEN];
    kvt_segment_t seg;
    kvt_engine_h e;
    peer_t p;
    raw_t r;

    kvt__ucx_inbound_max_set(1);
    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, TOKEN);
    kvt__ucx_inbound_max_set(0);
    raw_start(&r, &p);
    CHECK_OK(kvt__auth_random(nonce, sizeof(nonce)));
    raw_challenged(&r, 31, nonce);
    raw_mac(&r, nonce, mac);
    e = initiator(TOKEN);
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    write_checked(e, seg, &p, 0, 1 << 20, 7);
    CHECK(refused(&p) == 1);
    raw_send(&r, UCX_AM_AUTH, 31, 0, mac, sizeof(mac));
    CHECK(!raw_ack(&r, 31, QUIET_S));
    /* And with the place taken by a peer that did prove it, the next
     * one is refused. */
    raw_hello(&r, 32, nonce, 0, r.addr_len);
    CHECK(raw_ack(&r, 32, WAIT_S));
    CHECK((r.ack_value & UCX_ACK_REFUSED) && (r.ack_value & UCX_ACK_BUSY));
    CHECK(refused(&p) == 2);
    write_checked(e, seg, &p, 0, 1 << 20, 8);
    kvt_engine_destroy(e);
    raw_stop(&r);
    peer_stop(&p);
}

/* The peer's "conns": how many endpoints its ucx transport has open to
 * peer workers (kvt__ucx_t.nconns). */
static int conns_cmd(kvt_engine_h e, const char *line, char *out, size_t cap)
{
    if (strncmp(line, "conns", 5) != 0)
        return 0;
    for (unsigned i = 0; i < KVT__TL_MAX; i++) {
        kvt__tl_t *tl = e->tl[i];
        if (tl != NULL && strcmp(tl->ops->name, "ucx") == 0) {
            snprintf(out, cap, "%u",
                     atomic_load(&((kvt__ucx_t *)tl)->nconns));
            return 1;
        }
    }
    snprintf(out, cap, "none");
    return 1;
}

static unsigned conns(peer_t *p)
{
    const char *r = peer_cmd(p, "conns");

    CHECK(r != NULL && strcmp(r, "none") != 0);
    return (unsigned)strtoul(r, NULL, 10);
}

/*
 * Initiators refused at the cap leave nothing behind at the target: its
 * endpoint back to each is closed once the refusal is out, while the
 * refused engines live on. The one served is unaffected.
 */
KVT_TEST(refused_leave_no_endpoints)
{
    enum { K = 6 };
    kvt_engine_h e0, e[K];
    kvt_segment_t s0, s;
    unsigned before, after = 0;
    double t0;
    peer_t p;

    peer_cmd_hook = conns_cmd;
    kvt__ucx_inbound_max_set(1); /* for the target, forked next */
    peer_start_token(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, NULL);
    kvt__ucx_inbound_max_set(0);
    e0 = initiator(NULL);
    CHECK_OK(kvt_segment_open(e0, p.segment, &s0));
    write_checked(e0, s0, &p, 0, 1 << 20, 1);
    before = conns(&p);
    CHECK(before >= 1);
    for (int i = 0; i < K; i++) {
        e[i] = initiator(NULL);
        CHECK_ST(kvt_segment_open(e[i], p.segment, &s), KVT_ERR_BUSY);
    }
    CHECK(refused(&p) == K);
    t0 = kvt_test_now();
    while ((after = conns(&p)) > before && kvt_test_now() - t0 < 10)
        usleep(50000);
    fprintf(stderr, "target endpoints: %u before %d refusals, %u after\n",
            before, K, after);
    CHECK(after == before);
    write_checked(e0, s0, &p, 0, 1 << 20, 2);
    for (int i = 0; i < K; i++)
        kvt_engine_destroy(e[i]);
    kvt_engine_destroy(e0);
    peer_stop(&p);
}

static const kvt_test_case_t cases[] = {
    KVT_CASE(raw_proof_served, 60), KVT_CASE(raw_refusals, 60),
    KVT_CASE(silent_peer_dropped, 60), KVT_CASE(inbound_cap, 60),
    KVT_CASE(cap_makes_room, 60), KVT_CASE(refused_leave_no_endpoints, 60),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return kvt_test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}

#endif
