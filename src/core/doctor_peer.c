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
#include <sys/socket.h>
#include <unistd.h>

#include "core/ctrl.h"
#include "core/doctor_int.h"
#include "core/engine_int.h"
#include "meta/meta.h"
#include "util/sock.h"
#include "util/time.h"

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
                     "metadata server %s answers (a key nobody publishes "
                     "came back 'not found')%s",
                     d->meta_uri,
                     mp.field_mask & KVT__META_PARAM_AUTH
                         ? " and did not refuse this side's token"
                         : "");
    if (c != NULL)
        c->ms = kvt__doc_ms_since(t0);
    if (d->peer == NULL) {
        kvt__meta_destroy(m);
        return 0;
    }
    kvt__doc_step(d, "metadata.entry");
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

    uint64_t deadline = kvt__now_ns() + timeout_ms * 1000000ull;

    hints.ai_socktype = SOCK_STREAM;
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return EHOSTUNREACH;
    /* One bound for all of the name's addresses. */
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        uint64_t now = kvt__now_ns();
        struct pollfd p;
        socklen_t sl = sizeof(err);
        if (now >= deadline) {
            if (fd >= 0)
                close(fd);
            err = ETIMEDOUT;
            break;
        }
        timeout_ms = (deadline - now + 999999) / 1000000;
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
    int loop;

    kvt__doc_step(d, "peer.advertised");
    loop = kvt__doc_loopback(desc->host, addr, sizeof(addr));

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

    kvt__doc_step(d, "peer.resolve");
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
        c->ms = kvt__doc_ms_since(t0);
    kvt__doc_step(d, "peer.control");
    t0 = kvt__now_ns();
    err = tcp_reach(host, port, d->timeout_ms);
    if (err == 0) {
        c = kvt__doc_add(d, "peer.control", KVT_DOCTOR_OK, KVT_OK, NULL,
                         "TCP to %s:%u connects (the control port; kvt's tcp "
                         "data connections use it too)",
                         ip, port);
        if (c != NULL)
            c->ms = kvt__doc_ms_since(t0);
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

/* Whether the reason @why of a pair (kvt_segment_transport_reason()) has
 * a transport of higher priority than the chosen one left out for a
 * reason worth a warning: the peer does not offer it, or its session
 * could not be opened. */
static int passed_over(kvt_engine_h e, const char *why)
{
    int chosen = -1;

    for (unsigned i = 0; i < e->ntl; i++) {
        size_t n = strlen(e->tl[i]->ops->name);
        if (strncmp(why, e->tl[i]->ops->name, n) == 0 && why[n] == ' ')
            chosen = e->tl[i]->ops->caps.priority;
    }
    for (unsigned i = 0; i < e->ntl; i++) {
        char a[64], b[64];
        if (e->tl[i]->ops->caps.priority <= chosen)
            continue;
        snprintf(a, sizeof(a), "; %s: the peer does not offer it",
                 e->tl[i]->ops->name);
        snprintf(b, sizeof(b), "; %s: its session could not be opened",
                 e->tl[i]->ops->name);
        if (strstr(why, a) != NULL || strstr(why, b) != NULL)
            return 1;
    }
    return 0;
}

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
            {
                int none = strncmp(why, "none", 4) == 0;
                int passed = !none && passed_over(e, why);
                kvt__doc_add(d, id,
                             none     ? KVT_DOCTOR_FAIL
                             : passed ? KVT_DOCTOR_WARN
                                      : KVT_DOCTOR_OK,
                             none ? KVT_ERR_NOT_SUPPORTED : KVT_OK,
                             none ? "see docs/transports.md for each reason"
                             : passed
                                 ? "a better transport was passed over: see "
                                   "its reason (docs/transports.md)"
                                 : NULL,
                             "%s->%s: %s", kn[l], kn[r], why);
            }
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
            kvt__doc_transfer(d, e->tl[i]->ops->id, e->tl[i]->ops->name, addr);
out:
    kvt__doc_drop_engine(d, e);
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
