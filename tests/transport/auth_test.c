/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Authentication by a shared secret (docs/security.md), against a target
 * engine in a child process: with the right token every operation works
 * over tcp and over shm; without one, with a wrong one, or with one the
 * target does not have, the descriptor fetch fails with KVT_ERR_AUTH
 * and says why. Raw peers that skip the proof and send WRITE, READ,
 * NOTIFY or SEG_QUERY right behind their HELLO, or that answer the
 * challenge with a wrong MAC, get ERROR/KVT_ERR_ACCESS and nothing else:
 * the target's memory and notification queue are unchanged after each.
 * The shm socket refuses the same peers before it hands out a channel.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/engine_int.h"
#include "proto/wire.h"
#include "kvt_test.h"
#include "peer.h"
#include "transport/shm/shm.h"
#include "transport/shm/shm_sess.h"
#include "util/auth.h"
#include "util/sock.h"

#define LEN 65536u
#define SEED 7u
#define TOKEN "correct horse battery staple"

/* A target serving @transports with @token (NULL: none) in its
 * environment, its main region filled with the pattern SEED. */
static void target_start(peer_t *p, uint32_t transports, const char *token)
{
    peer_start_token(p, transports, token);
    CHECK(strcmp(peer_cmd(p, "fill %llu %u %u",
                          (unsigned long long)p->main_addr, LEN, SEED),
                 "ok") == 0);
}

/* The target's main region still holds the pattern, and no notification
 * reached it. */
static void target_untouched(peer_t *p)
{
    CHECK(strcmp(peer_cmd(p, "check %llu %u %u",
                          (unsigned long long)p->main_addr, LEN, SEED),
                 "0") == 0);
    CHECK(strcmp(peer_cmd(p, "notify 0 0 0 0"), "none") == 0);
}

/* An initiator with @token (NULL: none, whatever the environment says). */
static kvt_engine_h initiator(uint32_t transports, const char *token)
{
    kvt_engine_params_t prm = {0};
    kvt_engine_h e = NULL;

    CHECK(setenv(KVT_AUTH_ENV, "from the environment, not used", 1) == 0);
    prm.field_mask = KVT_ENGINE_PARAM_TRANSPORTS | KVT_ENGINE_PARAM_AUTH_TOKEN;
    prm.transports = transports;
    prm.auth_token = token;
    CHECK_OK(kvt_engine_create(&prm, &e));
    CHECK(unsetenv(KVT_AUTH_ENV) == 0);
    return e;
}

static kvt_status_t xfer(kvt_engine_h e, kvt_segment_t seg, uint32_t op,
                         void *local, uint64_t remote, uint64_t len)
{
    kvt_xfer_desc_t d = {0};
    kvt_batch_h b;
    kvt_status_t st;

    d.opcode = op;
    d.segment = seg;
    d.local_addr = local;
    d.remote_addr = remote;
    d.length = len;
    CHECK_OK(kvt_batch_create(e, 1, &b));
    CHECK_OK(kvt_batch_submit(b, &d, 1));
    st = kvt_batch_wait(b, 30000);
    CHECK(st != KVT_INPROGRESS);
    CHECK_OK(kvt_batch_free(b));
    return st;
}

/* With the same token on both sides: write, read and notify work, over
 * the transport @want. */
static void right_token(uint32_t transports, const char *want)
{
    uint8_t *buf = malloc(LEN);
    kvt_segment_t seg;
    kvt_engine_h e;
    peer_t p;

    CHECK(buf != NULL);
    target_start(&p, transports, TOKEN);
    e = initiator(transports, TOKEN);
    CHECK_OK(kvt_mem_register(e, buf, LEN, KVT_ACCESS_REMOTE_RW));
    CHECK_OK(kvt_segment_open(e, p.segment, &seg));
    if (transports != KVT_TRANSPORT_TCP &&
        !seg_offers(e, seg, transports & ~(uint32_t)KVT_TRANSPORT_TCP)) {
        kvt_engine_destroy(e);
        peer_stop(&p);
        SKIP("the target does not offer the transport");
    }
    CHECK(strcmp(seg_transport(e, seg), want) == 0);
    CHECK_OK(xfer(e, seg, KVT_OP_READ, buf, p.main_addr, LEN));
    CHECK(pattern_check(buf, LEN, SEED, 0) == 0);
    pattern_fill(buf, LEN, SEED + 1, 0);
    CHECK_OK(xfer(e, seg, KVT_OP_WRITE, buf, p.main_addr, LEN));
    CHECK_OK(kvt_notify_send(e, seg, "done", 4));
    CHECK(strcmp(peer_cmd(&p, "notify 5000 %llu %u %u",
                          (unsigned long long)p.main_addr, LEN, SEED + 1),
                 "done 0") == 0);
    kvt_engine_destroy(e);
    peer_stop(&p);
    free(buf);
}

KVT_TEST(right_token_tcp)
{
    right_token(KVT_TRANSPORT_TCP, "tcp");
}

KVT_TEST(right_token_shm)
{
    right_token(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, "shm");
}

/* Over ucx the session's own HELLO proves the token too (challenge and
 * AUTH on ucx's messages): with the same token it opens and works. */
KVT_TEST(right_token_ucx)
{
    right_token(KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX, "ucx");
}

/* Every mismatch is refused at the descriptor fetch with KVT_ERR_AUTH
 * and a log line naming the reason, on both sides; nothing reaches the
 * target's memory or queue. */
static void mismatch(uint32_t transports)
{
    static const struct {
        const char *target, *initiator;
    } cases[] = {
        {TOKEN, NULL},      /* no token here */
        {TOKEN, "wrong"},   /* another token */
        {TOKEN, TOKEN "x"}, /* a longer one */
        {NULL, TOKEN},      /* none there */
    };
    char log[] = "/tmp/kvt-auth-test-XXXXXX";

    close(kvt_test_log_to(log)); /* the checks read what it says */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_segment_t seg;
        kvt_engine_h e;
        peer_t p;

        target_start(&p, transports, cases[i].target);
        e = initiator(transports, cases[i].initiator);
        CHECK_ST(kvt_segment_open(e, p.segment, &seg), KVT_ERR_AUTH);
        CHECK_ST(kvt_segment_open(e, p.segment, &seg), KVT_ERR_AUTH);
        target_untouched(&p);
        kvt_engine_destroy(e);
        peer_stop(&p);
    }
    /* Both sides' lines (the target inherited this stderr): a target
     * refuses what lacks a token or offers one it lacks; an initiator
     * refuses a target that cannot prove the token. */
    CHECK(kvt_test_count_in_file(log, "authentication failed") >= 10);
    CHECK(kvt_test_count_in_file(log, "requires an auth token") >= 2);
    CHECK(kvt_test_count_in_file(log, "did not prove the auth token") >= 4);
    CHECK(kvt_test_count_in_file(log, "has no auth token set") >= 2);
    unlink(log);
}

KVT_TEST(mismatch_tcp)
{
    mismatch(KVT_TRANSPORT_TCP);
}

KVT_TEST(mismatch_shm)
{
    mismatch(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM);
}

KVT_TEST(mismatch_ucx)
{
    mismatch(KVT_TRANSPORT_TCP | KVT_TRANSPORT_UCX);
}

/* ---- Raw peers ----------------------------------------------------------- */

static int dial(peer_t *p)
{
    const char *colon = strrchr(p->segment, ':');
    int fd;

    CHECK(colon != NULL);
    CHECK_OK(
        kvt__sock_connect("127.0.0.1", (uint16_t)atoi(colon + 1), 2000, &fd));
    return fd;
}

static size_t put_frame(uint8_t *out, uint8_t type, const void *body,
                        uint32_t blen, const void *payload, uint64_t plen)
{
    kvt__wire_hdr_t h = {KVT_WIRE_VERSION_MAJOR,
                         KVT_WIRE_VERSION_MINOR,
                         type,
                         0,
                         blen,
                         0,
                         plen,
                         9};
    kvt__wire_hdr_encode(&h, out);
    if (blen)
        memcpy(out + KVT_WIRE_HDR_LEN, body, blen);
    if (plen)
        memcpy(out + KVT_WIRE_HDR_LEN + blen, payload, plen);
    return KVT_WIRE_HDR_LEN + blen + plen;
}

/* Read until the target closes (within 5 s); the frames' types and
 * statuses into @types/@sts (room for 8); returns how many. */
static int frames_until_eof(int fd, int *types, int32_t *sts)
{
    static uint8_t buf[1 << 20];
    size_t have = 0, off = 0;
    double t0 = kvt_test_now();
    int n = 0;

    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        ssize_t got;
        CHECK(kvt_test_now() - t0 < 5.0);
        if (poll(&pf, 1, 100) <= 0)
            continue;
        got = recv(fd, buf + have, sizeof(buf) - have, 0);
        if (got <= 0)
            break;
        have += (size_t)got;
    }
    while (have - off >= KVT_WIRE_HDR_LEN && n < 8) {
        kvt__wire_hdr_t h;
        CHECK_OK(kvt__wire_hdr_decode(buf + off, KVT_WIRE_HDR_LEN, &h));
        types[n] = h.type;
        sts[n++] = h.status;
        off += KVT_WIRE_HDR_LEN + h.body_len + h.payload_len;
    }
    return n;
}

/* Like frames_until_eof() for one frame without waiting for the close:
 * its type, its body into @body (room for 256). */
static int one_frame(int fd, uint8_t *body, size_t *blen_p)
{
    uint8_t hb[KVT_WIRE_HDR_LEN];
    uint64_t deadline = (uint64_t)((kvt_test_now() + 5) * 1e9);
    kvt__wire_hdr_t h;

    CHECK_OK(kvt__sock_recv_all(fd, hb, sizeof(hb), deadline));
    CHECK_OK(kvt__wire_hdr_decode(hb, sizeof(hb), &h));
    CHECK(h.body_len <= 256 && h.payload_len == 0);
    CHECK_OK(kvt__sock_recv_all(fd, body, h.body_len, deadline));
    *blen_p = h.body_len;
    return h.type;
}

/*
 * One raw connection: HELLO for @transport (with a nonce when @nonce),
 * then, when @nonce, the target's challenge answered with a MAC of zeros,
 * and @what right behind without waiting. The target must answer ERROR
 * with KVT_ERR_ACCESS and close, and answer nothing else.
 */
static void raw_refused(peer_t *p, uint32_t transport, int nonce, uint8_t what)
{
    static uint8_t out[2 * LEN];
    kvt__wire_hello_t h = {.nconns = 1,
                           .session_id = transport ? (7ull << 32) | 1 : 0,
                           .transport = transport,
                           .name = "intruder:1",
                           .auth = nonce};
    uint8_t body[KVT_WIRE_HELLO_MAX], pieces[KVT_WIRE_PIECE_LEN];
    uint8_t zeros[KVT_WIRE_MAC_LEN] = {0}, chal[256];
    kvt__wire_piece_t pc = {p->main_addr, 4096, 1, 0};
    uint8_t *payload = malloc(4096);
    size_t n, off = 0, clen;
    int types[8], fd = dial(p), nf;
    int32_t sts[8];

    CHECK(payload != NULL);
    memset(payload, 0xee, 4096);
    n = kvt__wire_hello_encode(&h, body, sizeof(body));
    off += put_frame(out, KVT_WIRE_HELLO, body, (uint32_t)n, NULL, 0);
    if (nonce) {
        CHECK(send(fd, out, off, MSG_NOSIGNAL) == (ssize_t)off);
        CHECK(one_frame(fd, chal, &clen) == KVT_WIRE_AUTH_CHALLENGE);
        CHECK(clen >= KVT_WIRE_CHALLENGE_MIN);
        off = put_frame(out, KVT_WIRE_AUTH, zeros, sizeof(zeros), NULL, 0);
    }
    kvt__wire_piece_encode(&pc, pieces);
    if (what == KVT_WIRE_WRITE)
        off +=
            put_frame(out + off, what, pieces, sizeof(pieces), payload, 4096);
    else if (what == KVT_WIRE_READ) {
        kvt__wire_hdr_t rh = {KVT_WIRE_VERSION_MAJOR,
                              KVT_WIRE_VERSION_MINOR,
                              what,
                              0,
                              sizeof(pieces),
                              0,
                              4096,
                              10};
        kvt__wire_hdr_encode(&rh, out + off);
        memcpy(out + off + KVT_WIRE_HDR_LEN, pieces, sizeof(pieces));
        off += KVT_WIRE_HDR_LEN + sizeof(pieces);
    } else if (what == KVT_WIRE_NOTIFY)
        off += put_frame(out + off, what, "forged", 6, NULL, 0);
    else
        off += put_frame(out + off, what, NULL, 0, NULL, 0);
    /* The target may close before it has read everything. */
    (void)send(fd, out, off, MSG_NOSIGNAL);
    nf = frames_until_eof(fd, types, sts);
    CHECK(nf == 1);
    CHECK(types[0] == KVT_WIRE_ERROR && sts[0] == KVT_ERR_ACCESS);
    close(fd);
    free(payload);
}

KVT_TEST(raw_peers_refused)
{
    static const uint8_t ops[] = {KVT_WIRE_WRITE, KVT_WIRE_READ,
                                  KVT_WIRE_NOTIFY, KVT_WIRE_PING};
    peer_t p;

    target_start(&p, KVT_TRANSPORT_TCP, TOKEN);
    for (int nonce = 0; nonce <= 1; nonce++) {
        for (size_t i = 0; i < sizeof(ops); i++) {
            raw_refused(&p, KVT_TRANSPORT_TCP, nonce, ops[i]);
            target_untouched(&p);
        }
        /* The descriptor, on a control connection. */
        raw_refused(&p, 0, nonce, KVT_WIRE_SEG_QUERY);
        target_untouched(&p);
    }
    peer_stop(&p);
}

/* A raw peer of the shm socket: without a token it is refused at once;
 * with a wrong MAC after the challenge too; neither gets a channel. */
KVT_TEST(raw_shm_refused)
{
    const kvt__engine_cfg_t *cfg;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const char *colon;
    kvt_engine_h e;
    size_t nl;
    peer_t p;

    target_start(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, TOKEN);
    e = initiator(KVT_TRANSPORT_TCP, NULL);
    cfg = kvt__engine_cfg(e); /* the same host: the same host id */
    colon = strrchr(p.segment, ':');
    nl = kvt__shm_sock_name(sa.sun_path, cfg->host_id, (uint32_t)p.pid,
                            (uint16_t)atoi(colon + 1));
    for (int nonce = 0; nonce <= 1; nonce++) {
        struct timeval tv = {5, 0};
        kvt__shm_msg_t m;
        int memfd = -1, s = socket(AF_UNIX, SOCK_SEQPACKET, 0);

        CHECK(s >= 0);
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (connect(s, (struct sockaddr *)&sa,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nl)) !=
            0) {
            kvt_engine_destroy(e);
            peer_stop(&p);
            SKIP("the target serves no shm socket");
        }
        kvt__shm_msg_init(&m, KVT_SHM_HELLO);
        m.pid = (uint32_t)getpid();
        snprintf(m.name, sizeof(m.name), "intruder:1");
        m.id = (uint64_t)nonce;
        CHECK(send(s, &m, sizeof(m), MSG_NOSIGNAL) == sizeof(m));
        if (nonce) {
            CHECK(kvt__shm_recv_msg(s, &m, &memfd) == sizeof(m));
            CHECK(m.type == KVT_SHM_CHALLENGE && memfd < 0);
            kvt__shm_msg_init(&m, KVT_SHM_AUTH); /* a MAC of zeros */
            CHECK(send(s, &m, sizeof(m), MSG_NOSIGNAL) == sizeof(m));
        }
        CHECK(kvt__shm_recv_msg(s, &m, &memfd) == sizeof(m));
        CHECK(m.type == KVT_SHM_HELLO_ACK && m.status == KVT_ERR_ACCESS);
        CHECK(memfd < 0);
        CHECK(strncmp(m.name, "authentication failed", 21) == 0);
        close(s);
        target_untouched(&p);
    }
    kvt_engine_destroy(e);
    peer_stop(&p);
}

/* ---- The ptracer grant (docs/shm.md, Permissions) ------------------------ */

typedef struct {
    pid_t pid;
    int go_fd;   /* write a byte: the opener closes and exits */
    char transp; /* 's' (shm), 't' (tcp), '?' (failed) */
} opener_t;

/* A process that opens the target's segment, reports the transport, and
 * keeps the session until told to go. Forked while this process runs no
 * engine. */
static void opener_start(opener_t *o, peer_t *p)
{
    int rep[2], go[2];

    CHECK(pipe(rep) == 0 && pipe(go) == 0);
    o->pid = fork();
    CHECK(o->pid >= 0);
    if (o->pid == 0) {
        kvt_engine_h e = initiator(KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, NULL);
        kvt_segment_t seg;
        char c = '?', b;
        if (kvt_segment_open(e, p->segment, &seg) == KVT_OK)
            c = seg_transport(e, seg)[0];
        if (write(rep[1], &c, 1) != 1 || read(go[0], &b, 1) < 0)
            _exit(2);
        kvt_engine_destroy(e);
        _exit(0);
    }
    close(rep[1]);
    close(go[0]);
    CHECK(read(rep[0], &o->transp, 1) == 1);
    close(rep[0]);
    o->go_fd = go[1];
}

static void opener_stop(opener_t *o)
{
    int status;

    CHECK(write(o->go_fd, "x", 1) == 1);
    close(o->go_fd);
    CHECK(waitpid(o->pid, &status, 0) == o->pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Where Yama's scope is 1 (simulated here, so that the policy is tested
 * on any kernel), a target grants attaching to one peer process at a
 * time: a second process is refused the channel and goes over tcp; once
 * the first has left, the next gets shm. With KVT_SHM_PTRACER_ANY=1,
 * both get shm. */
KVT_TEST(ptracer_one_process)
{
    opener_t a, b, c;
    peer_t p;
    int tries = 0;

    kvt__shm_yama_scope_set(1); /* the target, forked next, inherits it */
    target_start(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, NULL);
    opener_start(&a, &p);
    if (a.transp != 's') {
        opener_stop(&a);
        peer_stop(&p);
        SKIP("shm is not available between these processes");
    }
    opener_start(&b, &p);
    CHECK(b.transp == 't');
    opener_stop(&b);
    opener_stop(&a);
    /* The target withdraws the grant when it sees the channel close. */
    for (;;) {
        opener_start(&c, &p);
        opener_stop(&c);
        if (c.transp == 's')
            break;
        CHECK(c.transp == 't' && ++tries < 50);
        usleep(20000);
    }
    peer_stop(&p);

    CHECK(setenv("KVT_SHM_PTRACER_ANY", "1", 1) == 0);
    target_start(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, NULL);
    CHECK(unsetenv("KVT_SHM_PTRACER_ANY") == 0);
    opener_start(&a, &p);
    opener_start(&b, &p);
    CHECK(a.transp == 's' && b.transp == 's');
    opener_stop(&a);
    opener_stop(&b);
    peer_stop(&p);
}

/* With Yama's scope really 1: a process that is neither the target's
 * ancestor nor its peer cannot read the target's memory while the target
 * serves a peer over shm (with PR_SET_PTRACER_ANY it could). */
KVT_TEST(ptracer_yama)
{
    opener_t a;
    peer_t p;
    pid_t pid;
    int status;

    if (kvt__shm_yama_scope() != 1)
        SKIP("Yama ptrace_scope is not 1 here");
    target_start(&p, KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM, NULL);
    opener_start(&a, &p);
    if (a.transp != 's') {
        opener_stop(&a);
        peer_stop(&p);
        SKIP("shm is not available between these processes");
    }
    /* A sibling of the target: not its ancestor. */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        uint64_t v;
        struct iovec l = {&v, sizeof(v)};
        struct iovec r = {(void *)(uintptr_t)p.main_addr, sizeof(v)};
        _exit(process_vm_readv(p.pid, &l, 1, &r, 1, 0) < 0 ? 0 : 1);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    opener_stop(&a);
    peer_stop(&p);
}

/* A child of fork() serves none of its parent's shm channels and has no
 * grant of the kernel's: the first peer process it admits gets the grant.
 * (The parent's count and pid, copied into the child, refused every peer
 * of the child: kvt_doctor_run() forks a child whose engines serve.) */
KVT_TEST(ptracer_after_fork)
{
    /* Pids that may be granted harmlessly where Yama is real: this
     * process's parent, and this process. */
    const long a = (long)getppid(), b = (long)getpid();
    long holder = 0;
    pid_t pid;
    int status;

    CHECK(unsetenv("KVT_SHM_PTRACER_ANY") == 0);
    kvt__shm_yama_scope_set(1);
    CHECK(kvt__shm_ptracer_admit((pid_t)a, &holder) == 1 && holder == a);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        long h = 0;
        _exit(kvt__shm_ptracer_admit((pid_t)b, &h) == 1 && h == b ? 0 : 1);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's grant stands: another process is still refused. */
    CHECK(kvt__shm_ptracer_admit((pid_t)b, &holder) == -1 && holder == a);
    kvt__shm_ptracer_release();
    CHECK(kvt__shm_ptracer_admit((pid_t)b, &holder) == 1 && holder == b);
    kvt__shm_ptracer_release();
    kvt__shm_yama_scope_set(-2);
}

KVT_TEST_MAIN(KVT_CASE(right_token_tcp, 60), KVT_CASE(right_token_shm, 60),
              KVT_CASE(right_token_ucx, 60), KVT_CASE(mismatch_ucx, 120),
              KVT_CASE(mismatch_tcp, 120), KVT_CASE(mismatch_shm, 120),
              KVT_CASE(raw_peers_refused, 60), KVT_CASE(raw_shm_refused, 60),
              KVT_CASE(ptracer_one_process, 60), KVT_CASE(ptracer_yama, 60),
              KVT_CASE(ptracer_after_fork, 30))
