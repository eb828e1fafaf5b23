/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The doctor's checks of a metadata server and of a peer, in the order a
 * first transfer goes through them: the entry in the metadata server,
 * the name the peer advertises, name resolution, TCP reach of its port,
 * the handshake step by step (wire version, authentication, descriptor),
 * the transport of each pair of memory kinds and why, then on each
 * transport a verified write and read of the peer's scratch region, with
 * bandwidth and latency. A step that fails ends the checks that need it;
 * each failure names the fault and its fix.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/ctrl.h"
#include "core/doctor_int.h"
#include "core/engine_int.h"
#include "meta/meta.h"
#include "util/sock.h"
#include "util/time.h"

/* Engines of the peer checks' child are left to its exit: a transport
 * stuck in the network could hold a teardown. */
static void drop_engine(kvt__doc_t *d, kvt_engine_h e)
{
    if (d->out_fd < 0)
        kvt_engine_destroy(e);
}

static double ms_since(uint64_t t0)
{
    return (double)(kvt__now_ns() - t0) / 1e6;
}

/* ---- The metadata server -------------------------------------------------
 */

/* The peer's entry (d->peer as the key) into @desc, or the server's reach
 * alone without a peer. Returns 1 when @desc was filled, 0 when not, -1
 * when the checks stop here. */
static int check_metadata(kvt__doc_t *d, kvt__segdesc_t *desc)
{
    kvt__meta_params_t mp = {0};
    kvt__meta_t *m = NULL;
    kvt_doctor_check_t *c;
    uint8_t *v = NULL;
    size_t vlen = 0;
    uint64_t t0;
    kvt_status_t st;

    mp.field_mask = KVT__META_PARAM_TIMEOUT;
    mp.timeout_ms = d->timeout_ms;
    if (d->token_set && d->token[0] != '\0') {
        mp.field_mask |= KVT__META_PARAM_AUTH;
        kvt__auth_init(&mp.auth, d->token);
    } else if (!d->token_set && getenv("KVT_AUTH_TOKEN") != NULL &&
               getenv("KVT_AUTH_TOKEN")[0] != '\0') {
        mp.field_mask |= KVT__META_PARAM_AUTH;
        kvt__auth_init(&mp.auth, getenv("KVT_AUTH_TOKEN"));
    }
    kvt__doc_step(d, "metadata.server");
    kvt__doc_cause_reset(d);
    st = kvt__meta_create(d->meta_uri, &mp, &m);
    if (st != KVT_OK) {
        kvt__doc_add(d, "metadata.server", KVT_DOCTOR_FAIL, st,
                     "write it as http://HOST:PORT/metadata, etcd://HOST:PORT "
                     "or redis://HOST:PORT (docs/metadata.md)",
                     "'%s' is not a metadata address kvt can use: %s",
                     d->meta_uri, kvt__doc_cause(d, kvt_status_str(st)));
        return -1;
    }
    t0 = kvt__now_ns();
    /* A key nobody publishes: the server answers "not found" when it is
     * reachable, speaks its protocol and takes this side's credentials. */
    st = kvt__meta_get(m, "kvt-doctor/probe", &v, &vlen);
    free(v);
    if (st != KVT_OK && st != KVT_ERR_NOT_FOUND) {
        kvt__doc_add(
            d, "metadata.server", KVT_DOCTOR_FAIL, st,
            st == KVT_ERR_AUTH
                ? "give this side the servers' auth token (KVT_AUTH_TOKEN, "
                  "--auth-token)"
            : st == KVT_ERR_PROTOCOL
                ? "check the address's scheme and path: kvt metad serves "
                  "http://HOST:PORT/metadata"
                : "start the metadata server, or fix its address",
            "metadata server %s: %s", d->meta_uri,
            kvt__doc_cause(d, kvt_status_str(st)));
        kvt__meta_destroy(m);
        return -1;
    }
    c = kvt__doc_add(d, "metadata.server", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "metadata server %s answers%s", d->meta_uri,
                     mp.field_mask & KVT__META_PARAM_AUTH
                         ? " and takes this side's token"
                         : "");
    if (c != NULL)
        c->ms = ms_since(t0);
    if (d->peer == NULL) {
        kvt__meta_destroy(m);
        return 0;
    }
    kvt__doc_cause_reset(d);
    st = kvt__meta_lookup_segdesc(m, d->peer, desc);
    kvt__meta_destroy(m);
    if (st != KVT_OK) {
        kvt__doc_add(d, "metadata.entry", KVT_DOCTOR_FAIL, st,
                     st == KVT_ERR_NOT_FOUND
                         ? "start the peer with this metadata server, or "
                           "check the key: it is the peer's segment name"
                         : "see the cause",
                     "the server holds no usable entry for '%s': %s", d->peer,
                     kvt__doc_cause(d, kvt_status_str(st)));
        return -1;
    }
    kvt__doc_add(d, "metadata.entry", KVT_DOCTOR_OK, KVT_OK, NULL,
                 "'%s' is published: %s:%u (pid %u), %u regions", d->peer,
                 desc->host, desc->port, desc->pid, desc->nregions);
    return 1;
}

/* ---- Reach -------------------------------------------------------------- */

/* A TCP connection to host:port within the timeout: 0, or the errno that
 * ended it (ETIMEDOUT when the bound passed). */
static int tcp_reach(const char *host, uint16_t port, uint64_t timeout_ms)
{
    struct addrinfo hints = {0}, *res = NULL;
    char ps[8];
    int err = EHOSTUNREACH;

    hints.ai_socktype = SOCK_STREAM;
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return EHOSTUNREACH;
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        struct pollfd p;
        socklen_t sl = sizeof(err);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            err = 0;
        } else if (errno != EINPROGRESS) {
            err = errno;
        } else {
            p.fd = fd;
            p.events = POLLOUT;
            if (poll(&p, 1, (int)timeout_ms) <= 0)
                err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
                err = errno;
        }
        close(fd);
        if (err == 0)
            break;
    }
    freeaddrinfo(res);
    return err;
}

/* The name the peer advertises: one that resolves to loopback here while
 * the peer runs on another host cannot be reached from here. 0 when
 * fine. */
static int check_advertised(kvt__doc_t *d, const kvt__segdesc_t *desc,
                            const char *from)
{
    char addr[64] = "";
    int loop = kvt__doc_loopback(desc->host, addr, sizeof(addr));

    if (loop == 1 && desc->pid != 0 && desc->host_id != d->host_id) {
        kvt__doc_add(d, "peer.advertised", KVT_DOCTOR_FAIL, KVT_ERR_UNREACHABLE,
                     "start the peer with local_host set to an address "
                     "other hosts reach (not localhost, nor a name that "
                     "/etc/hosts maps to 127.0.x.x)",
                     "%s says the peer is at %s:%u, which resolves to %s "
                     "(loopback), but the peer runs on another host: no "
                     "other host can reach it by that name",
                     from, desc->host, desc->port, addr);
        return -1;
    }
    kvt__doc_add(d, "peer.advertised", KVT_DOCTOR_OK, KVT_OK, NULL,
                 "%s says the peer is at %s:%u (%s)%s", from, desc->host,
                 desc->port, loop < 0 ? "does not resolve here" : addr,
                 desc->host_id == d->host_id ? ", on this host" : "");
    return 0;
}

/* Name resolution and TCP reach of the port. 0 when reached. */
static int check_reach(kvt__doc_t *d, const char *addr, int from_meta,
                       const kvt__segdesc_t *meta_desc)
{
    char host[KVT_WIRE_NAME_MAX + 1], ip[64] = "";
    uint16_t port;
    uint64_t t0 = kvt__now_ns();
    kvt_doctor_check_t *c;
    int err;

    if (kvt__sock_split_hostport(addr, host, sizeof(host), &port) != KVT_OK) {
        kvt__doc_add(d, "peer.resolve", KVT_DOCTOR_FAIL, KVT_ERR_INVALID_PARAM,
                     "name the peer as host:port (its segment name), or "
                     "give the metadata server that holds its key "
                     "(--metadata)",
                     "'%s' is not host:port", addr);
        return -1;
    }
    if (kvt__doc_loopback(host, ip, sizeof(ip)) < 0) {
        kvt__doc_add(d, "peer.resolve", KVT_DOCTOR_FAIL, KVT_ERR_UNREACHABLE,
                     "use a name this host resolves (DNS, /etc/hosts) or "
                     "the peer's address",
                     "'%s' does not resolve here", host);
        return -1;
    }
    c = kvt__doc_add(d, "peer.resolve", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "'%s' resolves to %s", host, ip);
    if (c != NULL)
        c->ms = ms_since(t0);
    kvt__doc_step(d, "peer.control");
    t0 = kvt__now_ns();
    err = tcp_reach(host, port, d->timeout_ms);
    if (err == 0) {
        c = kvt__doc_add(d, "peer.control", KVT_DOCTOR_OK, KVT_OK, NULL,
                         "TCP to %s:%u connects (the control port; kvt's tcp "
                         "data connections use it too)",
                         ip, port);
        if (c != NULL)
            c->ms = ms_since(t0);
        return 0;
    }
    if (err == ECONNREFUSED && from_meta)
        kvt__doc_add(d, "metadata.stale", KVT_DOCTOR_FAIL, KVT_ERR_UNREACHABLE,
                     "restart the peer so that it publishes again, or delete "
                     "the key; an entry lives on for the server's TTL "
                     "(KVT_METADATA_TTL) after its engine stops refreshing it",
                     "the metadata entry for '%s' is stale: it names %s:%u "
                     "(pid %u), where nothing listens now (connection "
                     "refused): left behind by a peer that exited or "
                     "restarted on another port",
                     d->peer, host, port, meta_desc->pid);
    else if (err == ECONNREFUSED)
        kvt__doc_add(d, "peer.control", KVT_DOCTOR_FAIL, KVT_ERR_UNREACHABLE,
                     "check that the peer runs and listens on that port (its "
                     "segment name is host:port of its listener)",
                     "nothing listens on %s:%u (connection refused)", ip, port);
    else if (err == ETIMEDOUT)
        kvt__doc_add(d, "peer.control", KVT_DOCTOR_FAIL, KVT_ERR_TIMEDOUT,
                     "let TCP to that port through the firewalls between "
                     "the hosts, or check the route",
                     "no answer from %s:%u within %llu ms: a firewall drops "
                     "the packets, or there is no route",
                     ip, port, (unsigned long long)d->timeout_ms);
    else
        kvt__doc_add(d, "peer.control", KVT_DOCTOR_FAIL, KVT_ERR_UNREACHABLE,
                     "check the route to the peer's network",
                     "cannot reach %s:%u: %s", ip, port, strerror(err));
    return -1;
}

/* The handshake step by step: version, authentication, descriptor. */
static int check_handshake(kvt__doc_t *d, kvt_engine_h e, const char *addr,
                           kvt__segdesc_t *desc)
{
    kvt__ctrl_trace_t tr;
    kvt_doctor_check_t *c;
    kvt_status_t st;
    const char *fix = NULL;
    char what[256];

    kvt__doc_step(d, "peer.handshake");
    kvt__doc_cause_reset(d);
    st = kvt__ctrl_fetch_traced(e, addr, addr, desc, &tr);
    if (tr.peer_major >= 0)
        kvt__doc_add(
            d, "peer.version",
            tr.peer_major == KVT_WIRE_VERSION_MAJOR ? KVT_DOCTOR_OK
                                                    : KVT_DOCTOR_FAIL,
            tr.peer_major == KVT_WIRE_VERSION_MAJOR ? KVT_OK : KVT_ERR_VERSION,
            tr.peer_major == KVT_WIRE_VERSION_MAJOR
                ? NULL
                : "run kvt of the same wire protocol's major version on both "
                  "sides (kvt info shows it)",
            "the peer speaks kvt wire protocol %d.%d, this side %d.%d%s",
            tr.peer_major, tr.peer_minor, KVT_WIRE_VERSION_MAJOR,
            KVT_WIRE_VERSION_MINOR,
            tr.peer_major == KVT_WIRE_VERSION_MAJOR
                ? ""
                : ": the two cannot talk (the major versions differ)");
    if (st == KVT_ERR_VERSION ||
        (tr.peer_major >= 0 && tr.peer_major != KVT_WIRE_VERSION_MAJOR))
        return -1;
    if (st == KVT_ERR_AUTH) {
        if (tr.auth == 2 || strstr(tr.peer_reason, "has no auth token")) {
            snprintf(what, sizeof(what),
                     "this side has an auth token, the peer none (the "
                     "peer's side is not authenticated)");
            fix = "set the same auth token on the peer, or none here";
        } else if (tr.auth == 3 || strstr(tr.peer_reason, "wrong auth")) {
            snprintf(what, sizeof(what),
                     "the two sides have different auth tokens (token "
                     "mismatch)");
            fix = "give both sides the same KVT_AUTH_TOKEN";
        } else if (!tr.auth_here ||
                   strstr(tr.peer_reason, "requires an auth token")) {
            snprintf(what, sizeof(what),
                     "the peer requires an auth token and this side has "
                     "none (token missing)");
            fix = "set KVT_AUTH_TOKEN (or --auth-token) to the peer's token";
        } else {
            snprintf(what, sizeof(what), "the peer refused this side: %.150s",
                     tr.peer_reason);
            fix = "give both sides the same KVT_AUTH_TOKEN";
        }
        kvt__doc_add(d, "peer.auth", KVT_DOCTOR_FAIL, st, fix,
                     "authentication failed: %s", what);
        return -1;
    }
    if (st != KVT_OK) {
        kvt__doc_add(
            d, "peer.handshake", KVT_DOCTOR_FAIL, st,
            st == KVT_ERR_TIMEDOUT
                ? "check that the port is a kvt engine's and that it is not "
                  "stuck (its log)"
            : st == KVT_ERR_PROTOCOL
                ? "point at the engine's own port: another service answers "
                  "on this one"
            : st == KVT_ERR_BUSY ? "try again, or raise the peer's limits"
                                 : "see the cause",
            "%s (connected after %.1f ms; %s)",
            st == KVT_ERR_TIMEDOUT    ? "the port accepted, but nothing "
                                        "answered the handshake in time"
            : st == KVT_ERR_PROTOCOL  ? "the port does not speak kvt's "
                                        "protocol"
            : st == KVT_ERR_CONN_LOST ? "the peer closed the connection "
                                        "during the handshake"
                                      : kvt_status_str(st),
            tr.connected_ms, kvt__doc_cause(d, kvt_status_name(st)));
        return -1;
    }
    kvt__doc_add(d, "peer.auth", KVT_DOCTOR_OK, KVT_OK, NULL, "%s",
                 tr.auth == 1 ? "authenticated: both sides proved the token"
                              : "no authentication on either side");
    c = kvt__doc_add(d, "peer.handshake", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "connected %.1f ms, HELLO answered %.1f ms, %sdescriptor "
                     "%.1f ms: segment '%s', pid %u, %u regions, %s host",
                     tr.connected_ms, tr.hello_ms,
                     tr.auth == 1 ? "authenticated, " : "", tr.desc_ms,
                     desc->name, desc->pid, desc->nregions,
                     desc->host_id == d->host_id ? "this" : "another");
    if (c != NULL)
        c->ms = tr.desc_ms;
    return 0;
}

/* ---- Selection and transfers ---------------------------------------------
 */

static void check_selection(kvt__doc_t *d, kvt_engine_h e, const char *addr,
                            const kvt__segdesc_t *desc)
{
    static const char *const kn[KVT_MEM_KINDS] = {"host", "cuda"};
    uint32_t rk = 1u << KVT_MEM_HOST;
    kvt_segment_t seg;
    kvt_status_t st;

    for (uint32_t i = 0; i < desc->nregions; i++)
        if (desc->regions[i].kind < KVT_MEM_KINDS)
            rk |= 1u << desc->regions[i].kind;
    kvt__doc_step(d, "peer.select");
    kvt__doc_cause_reset(d);
    if (d->kinds & (1u << KVT_MEM_CUDA)) {
        /* Device memory in use here, as a serving engine has it, so that
         * the device pairs are routed as they would be. */
        kvt_mem_params_t mp = {0};
        void *mem = NULL;
        mp.field_mask = KVT_MEM_PARAM_KIND;
        mp.kind = KVT_MEM_CUDA;
        if (kvt_mem_alloc_ex(e, 2u << 20, &mp, &mem) != KVT_OK) {
            d->kinds &= ~(1u << KVT_MEM_CUDA);
            kvt__doc_add(d, "peer.select.cuda", KVT_DOCTOR_SKIP, KVT_OK,
                         "run kvt doctor from a process that has not used "
                         "the CUDA driver yet (the command line does not)",
                         "device memory pairs not checked against the peer: "
                         "the peer checks run in a forked process, where "
                         "the driver this process initialised cannot be "
                         "used (%s)",
                         kvt__doc_cause(d, "no device memory"));
            kvt__doc_cause_reset(d);
        }
    }
    st = kvt_segment_open(e, addr, &seg);
    if (st == KVT_ERR_TIMEDOUT || st == KVT_ERR_CONN_LOST ||
        st == KVT_ERR_UNREACHABLE) {
        kvt__doc_add(d, "peer.select", KVT_DOCTOR_FAIL, st,
                     "see the peer.transfer check of each transport: the one "
                     "that fails there is the one blocked",
                     "the handshake went through, but the best transport's "
                     "session could not be set up (%s): its data path is "
                     "blocked%s%s",
                     kvt_status_name(st), d->cause[0] ? ": " : "", d->cause);
        return;
    }
    if (st != KVT_OK) {
        kvt__doc_add(d, "peer.select", KVT_DOCTOR_FAIL, st, "see the cause",
                     "no transport session could be opened: %s",
                     kvt__doc_cause(d, kvt_status_str(st)));
        return;
    }
    for (unsigned l = 0; l < KVT_MEM_KINDS; l++)
        for (unsigned r = 0; r < KVT_MEM_KINDS; r++) {
            char id[64], why[KVT__WHY_MAX];
            if (!(d->kinds & (1u << l)) || !(rk & (1u << r)))
                continue;
            snprintf(id, sizeof(id), "peer.select.%s-%s", kn[l], kn[r]);
            kvt_segment_transport_reason(e, seg, (kvt_mem_kind_t)l,
                                         (kvt_mem_kind_t)r, why, sizeof(why));
            kvt__doc_add(d, id,
                         strncmp(why, "none", 4) == 0 ? KVT_DOCTOR_FAIL
                         : strstr(why, "could not be opened") != NULL ||
                                 strstr(why, "does not offer") != NULL
                             ? KVT_DOCTOR_WARN
                             : KVT_DOCTOR_OK,
                         strncmp(why, "none", 4) == 0 ? KVT_ERR_NOT_SUPPORTED
                                                      : KVT_OK,
                         strncmp(why, "none", 4) == 0
                             ? "see docs/transports.md for each reason"
                         : strstr(why, "could not be opened") != NULL ||
                                 strstr(why, "does not offer") != NULL
                             ? "a better transport was passed over: see its "
                               "reason (docs/transports.md)"
                             : NULL,
                         "%s->%s: %s", kn[l], kn[r], why);
        }
}

/* The peer's scratch region (kvt_doctor_scratch()) into *addr_p and
 * *len_p (0: none): the first 64 bytes of every read-write host region
 * of 64 KiB or more (the first 1024 such), read in one batch into @buf,
 * and the first that bears the mark. Returns the batch's failure, if
 * any. */
static kvt_status_t find_scratch(kvt_engine_h e, kvt_segment_t seg,
                                 const kvt__segdesc_t *desc, uint8_t *buf,
                                 uint64_t *addr_p, uint64_t *len_p)
{
    enum { MAX = 1024 };
    size_t ml = strlen(KVT__DOC_MAGIC), n = 0;
    kvt_xfer_desc_t *r = calloc(MAX, sizeof(*r));
    uint32_t *idx = calloc(MAX, sizeof(*idx));
    kvt_status_t st = KVT_OK;
    kvt_batch_h b;

    *addr_p = *len_p = 0;
    if (r == NULL || idx == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t i = 0; i < desc->nregions && n < MAX; i++) {
        const kvt_remote_region_t *x = &desc->regions[i];
        if (x->kind != KVT_MEM_HOST || x->access != KVT_ACCESS_REMOTE_RW ||
            x->length < (64u << 10))
            continue;
        r[n].opcode = KVT_OP_READ;
        r[n].segment = seg;
        r[n].local_addr = buf + n * 64;
        r[n].remote_addr = x->addr;
        r[n].length = 64;
        idx[n++] = i;
    }
    if (n == 0)
        goto out;
    st = kvt_batch_create(e, n, &b);
    if (st != KVT_OK)
        goto out;
    st = kvt_batch_submit_wait(b, r, n, -1);
    kvt_batch_free(b);
    for (size_t k = 0; st == KVT_OK && k < n; k++) {
        const kvt_remote_region_t *x = &desc->regions[idx[k]];
        char *m = (char *)buf + k * 64;
        unsigned long long len;
        m[63] = '\0';
        /* The mark says the length asked for; the region may be longer
         * (kvt_mem_alloc() rounds it up). */
        if (memcmp(m, KVT__DOC_MAGIC, ml) == 0 &&
            sscanf(m + ml, " %llu", &len) == 1 && len >= (64u << 10) &&
            len <= x->length) {
            *addr_p = x->addr;
            *len_p = len;
            break;
        }
    }
out:
    free(r);
    free(idx);
    return st;
}

/* Move @n descriptors of @len bytes between @local and the peer's
 * @raddr, all at once; the batch's status. */
static kvt_status_t move(kvt_engine_h e, kvt_segment_t seg, uint32_t op,
                         void *local, uint64_t raddr, uint64_t len, size_t n)
{
    kvt_xfer_desc_t x[64];
    kvt_batch_h b;
    kvt_status_t st;

    if (n > 64)
        n = 64;
    for (size_t i = 0; i < n; i++) {
        memset(&x[i], 0, sizeof(x[i]));
        x[i].opcode = op;
        x[i].segment = seg;
        x[i].local_addr = local;
        x[i].remote_addr = raddr;
        x[i].length = len;
    }
    st = kvt_batch_create(e, n, &b);
    if (st != KVT_OK)
        return st;
    st = kvt_batch_submit_wait(b, x, n, -1);
    kvt_batch_free(b);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* On transport @id alone: open, find the scratch region, write a pattern
 * and read it back, then bandwidth (writes) and latency (64-byte reads). */
static void check_transfer(kvt__doc_t *d, uint32_t id, const char *name,
                           const char *addr)
{
    char cid[64];
    kvt_engine_h e = NULL;
    kvt_segment_t seg;
    kvt__segdesc_t desc = {0};
    kvt_doctor_check_t *c;
    kvt_status_t st;
    uint64_t raddr = 0, rlen = 0, chunk, t0;
    uint8_t *buf = NULL, *back = NULL;
    kvt__seg_t *g;

    snprintf(cid, sizeof(cid), "peer.transfer.%s", name);
    kvt__doc_step(d, cid);
    kvt__doc_cause_reset(d);
    st = kvt__doc_engine(d, id, &e);
    if (st == KVT_OK)
        st = kvt_segment_open(e, addr, &seg);
    if (st == KVT_ERR_TIMEDOUT || st == KVT_ERR_CONN_LOST ||
        st == KVT_ERR_UNREACHABLE)
        goto failed; /* the handshake went through: the data path did not */
    if (st != KVT_OK) {
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, st,
                     "see the cause (docs/transports.md)", "%s: no session: %s",
                     name, kvt__doc_cause(d, kvt_status_str(st)));
        goto out;
    }
    chunk = 4u << 20;
    buf = aligned_alloc(4096, chunk);
    back = aligned_alloc(4096, chunk);
    if (buf == NULL || back == NULL ||
        kvt_mem_register(e, buf, chunk, KVT_ACCESS_REMOTE_RW) != KVT_OK ||
        kvt_mem_register(e, back, chunk, KVT_ACCESS_REMOTE_RW) != KVT_OK) {
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, KVT_ERR_NO_MEMORY, NULL,
                     "%s: no memory for the buffers", name);
        goto out;
    }
    g = kvt__seg_get(e, seg);
    if (g != NULL) {
        pthread_mutex_lock(&g->desc_lock);
        desc.nregions = g->desc.nregions;
        desc.regions = malloc(desc.nregions * sizeof(*desc.regions) + 1);
        if (desc.regions != NULL)
            memcpy(desc.regions, g->desc.regions,
                   desc.nregions * sizeof(*desc.regions));
        else
            desc.nregions = 0;
        pthread_mutex_unlock(&g->desc_lock);
        kvt__seg_unref(g);
    }
    kvt__doc_cause_reset(d);
    st = find_scratch(e, seg, &desc, back, &raddr, &rlen);
    free(desc.regions);
    if (st != KVT_OK)
        goto failed;
    if (raddr == 0) {
        kvt__doc_add(d, cid, KVT_DOCTOR_SKIP, KVT_OK,
                     "run `kvt doctor --serve` on the peer's host (or call "
                     "kvt_doctor_scratch() there) to measure transfers",
                     "%s: a session opens, but the peer exposes no scratch "
                     "region; the doctor writes into no other memory",
                     name);
        goto out;
    }
    if (chunk > rlen - KVT__DOC_HEAD)
        chunk = (rlen - KVT__DOC_HEAD) & ~(uint64_t)4095;
    {
        /* Verified: 64 KiB at a random place, of a pattern of this run's
         * own (so that two doctors at one peer rarely meet; a mismatch is
         * tried again elsewhere before it counts). */
        uint64_t v = chunk < (64u << 10) ? chunk : (64u << 10);
        uint64_t slots = (rlen - KVT__DOC_HEAD) / v, tag = 0, off = 0;
        int tries = 0, same = 0;
        if (getrandom(&tag, sizeof(tag), 0) != sizeof(tag))
            tag = kvt__now_ns() ^ (uint64_t)getpid();
        t0 = kvt__now_ns();
        while (st == KVT_OK && !same && tries++ < 3) {
            tag = tag * 6364136223846793005ull + 1442695040888963407ull;
            off = KVT__DOC_HEAD + (tag >> 33) % slots * v;
            for (uint64_t i = 0; i < v; i++)
                buf[i] = (uint8_t)(i * 131 + (tag >> 40) + (i >> 12));
            st = move(e, seg, KVT_OP_WRITE, buf, raddr + off, v, 1);
            if (st == KVT_OK)
                st = move(e, seg, KVT_OP_READ, back, raddr + off, v, 1);
            same = st == KVT_OK && memcmp(buf, back, v) == 0;
        }
        if (st != KVT_OK)
            goto failed;
        if (!same) {
            kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, KVT_ERR_IO,
                         "run it again (another doctor may have written "
                         "there at the same moment); if it stays, report it",
                         "%s: %llu bytes written and read back differ, three "
                         "times at three places",
                         name, (unsigned long long)v);
            goto out;
        }
        c = kvt__doc_add(d, cid, KVT_DOCTOR_OK, KVT_OK, NULL,
                         "%s: %llu bytes written and read back, verified", name,
                         (unsigned long long)v);
        if (c == NULL)
            goto out;
        c->ms = ms_since(t0);
        kvt__doc_beat(d, cid);
    }
    if (d->probe_bytes > 0) {
        /* Bandwidth: writes of @chunk, 16 at a time, until probe_bytes
         * or the timeout; each batch tells the parent the step lives. */
        uint64_t moved = 0, limit = d->timeout_ms * 1000000ull;
        t0 = kvt__now_ns();
        while (st == KVT_OK && moved < d->probe_bytes &&
               kvt__now_ns() - t0 < limit) {
            uint64_t left = (d->probe_bytes - moved + chunk - 1) / chunk;
            size_t n = left > 16 ? 16 : (size_t)left;
            st = move(e, seg, KVT_OP_WRITE, buf, raddr + KVT__DOC_HEAD, chunk,
                      n);
            moved += n * chunk;
            kvt__doc_beat(d, cid);
        }
        if (st != KVT_OK)
            goto failed;
        c = &d->r->c[d->r->n - 1];
        c->mbps = (double)moved / ((double)(kvt__now_ns() - t0) / 1e9) / 1e6;
    }
    {
        double lat[33];
        for (int i = 0; st == KVT_OK && i < 33; i++) {
            t0 = kvt__now_ns();
            st = move(e, seg, KVT_OP_READ, back, raddr + KVT__DOC_HEAD, 64, 1);
            lat[i] = (double)(kvt__now_ns() - t0) / 1e3;
        }
        if (st != KVT_OK)
            goto failed;
        qsort(lat, 33, sizeof(lat[0]), cmp_double);
        c = &d->r->c[d->r->n - 1];
        c->lat_us = lat[16];
    }
    goto out;

failed:
    if (st == KVT_ERR_TIMEDOUT || st == KVT_ERR_CONN_LOST ||
        st == KVT_ERR_UNREACHABLE)
        kvt__doc_add(
            d, cid, KVT_DOCTOR_FAIL, st,
            id == KVT_TRANSPORT_UCX
                ? "let TCP from this host to the peer's UCX ports through "
                  "the firewall (UCX's tcp transport listens on ports of its "
                  "own, not kvt's), or use tcp"
                : "let the data connections through the firewall",
            "%s: the control port answered, but the data path did not "
            "(%s within %llu ms): a firewall drops the %s data "
            "connections%s",
            name, kvt_status_name(st), (unsigned long long)d->timeout_ms, name,
            id == KVT_TRANSPORT_UCX ? " to the ports UCX listens on" : "");
    else
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, st, "see the cause",
                     "%s: transfer failed: %s", name,
                     kvt__doc_cause(d, kvt_status_str(st)));
out:
    kvt__doc_step(d, NULL);
    drop_engine(d, e);
    if (d->out_fd < 0) {
        free(buf);
        free(back);
    }
}

static void peer_checks(kvt__doc_t *d)
{
    kvt__segdesc_t meta = {0}, live = {0};
    char addr[KVT_WIRE_NAME_MAX + 8];
    kvt_engine_h e = NULL;
    kvt_status_t st;
    int from_meta = 0;

    if (d->meta_uri != NULL) {
        int r = check_metadata(d, &meta);
        if (r < 0 || d->peer == NULL)
            goto out;
        from_meta = 1;
        if (check_advertised(d, &meta, "the metadata server") != 0)
            goto out;
        snprintf(addr, sizeof(addr),
                 strchr(meta.host, ':') ? "[%s]:%u" : "%s:%u", meta.host,
                 meta.port);
    } else {
        snprintf(addr, sizeof(addr), "%s", d->peer);
    }
    if (check_reach(d, addr, from_meta, &meta) != 0)
        goto out;
    kvt__doc_cause_reset(d);
    st = kvt__doc_engine(d, d->transports, &e);
    if (st != KVT_OK) {
        kvt__doc_add(d, "peer.handshake", KVT_DOCTOR_FAIL, st,
                     "see host.transport.*", "no engine starts here: %s",
                     kvt__doc_cause(d, kvt_status_str(st)));
        goto out;
    }
    if (check_handshake(d, e, addr, &live) != 0)
        goto out;
    if (!from_meta && check_advertised(d, &live, "its descriptor") != 0)
        goto out;
    if (from_meta && (live.pid != meta.pid || live.port != meta.port))
        kvt__doc_add(d, "metadata.stale", KVT_DOCTOR_FAIL, KVT_ERR_PROTOCOL,
                     "restart the peer so that it publishes again, or "
                     "delete the key",
                     "the metadata entry for '%s' is stale: it holds pid %u "
                     "on port %u, but the engine answering there is pid %u "
                     "on port %u",
                     d->peer, meta.pid, meta.port, live.pid, live.port);
    check_selection(d, e, addr, &live);
    for (unsigned i = 0; i < e->ntl; i++)
        if (kvt__segdesc_tl(&live, e->tl[i]->ops->id) != NULL &&
            (!(e->tl[i]->ops->caps.flags & KVT__TL_SAME_HOST) ||
             (live.host_id == d->host_id && live.pid != 0)))
            check_transfer(d, e->tl[i]->ops->id, e->tl[i]->ops->name, addr);
out:
    drop_engine(d, e);
    kvt__segdesc_clear(&meta);
    kvt__segdesc_clear(&live);
}

void kvt__doc_stalled(kvt__doc_t *d, const char *step, uint64_t ms)
{
    if (ms == 0) {
        kvt__doc_add(d, step[0] ? step : "doctor", KVT_DOCTOR_FAIL, KVT_ERR_IO,
                     "report it, with the output of kvt doctor",
                     "the peer checks ended early (their process died)");
    } else if (strncmp(step, "peer.transfer.", 14) == 0) {
        const char *name = step + 14;
        int ucx = strcmp(name, "ucx") == 0;
        kvt__doc_add(
            d, step, KVT_DOCTOR_FAIL, KVT_ERR_TIMEDOUT,
            ucx ? "let TCP from this host to the peer's UCX ports through "
                  "the firewall (UCX's tcp transport listens on ports of its "
                  "own, not kvt's), or use tcp"
                : "let the data connections through the firewall",
            "%s: the control port answered, but the data path did not: no "
            "answer and no refusal for %llu ms: a firewall drops the %s data "
            "connections%s",
            name, (unsigned long long)ms, name,
            ucx ? " to the ports UCX listens on" : "");
    } else {
        kvt__doc_add(
            d, step[0] ? step : "doctor", KVT_DOCTOR_FAIL, KVT_ERR_TIMEDOUT,
            "check the network path to the peer and the peer's log",
            "the step did not finish within %llu ms", (unsigned long long)ms);
    }
}

void kvt__doc_peer_start(kvt__doc_t *d, kvt__doc_child_t *ch)
{
    if (kvt__doc_child_start(d, ch, peer_checks) != 0)
        ch->pid = -1;
}

void kvt__doc_peer_finish(kvt__doc_t *d, kvt__doc_child_t *ch)
{
    kvt__doc_child_finish(d, ch, 2 * d->timeout_ms + 1000, kvt__doc_stalled);
}
