/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The doctor's report and run (kvt/doctor.h): the checks are recorded in
 * the order they run; the host's first, then a metadata server's and a
 * peer's (doctor_host.c, doctor_peer.c). The scratch region that peers'
 * doctors may write into is here too.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/doctor_int.h"
#include "core/engine_int.h"

/* Make @s (NUL-terminated) one line of valid UTF-8, in place: control
 * bytes (the records' separators among them) and bytes of no valid UTF-8
 * sequence become '?'. A peer's words end up in details. */
static void sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;

    while (*p != '\0') {
        unsigned n = *p < 0x80             ? 1
                     : (*p & 0xe0) == 0xc0 ? 2
                     : (*p & 0xf0) == 0xe0 ? 3
                     : (*p & 0xf8) == 0xf0 ? 4
                                           : 0;
        unsigned k = 1;
        while (n > 1 && k < n && (p[k] & 0xc0) == 0x80)
            k++;
        if (n == 1 && (*p < 0x20 || *p == 0x7f)) {
            *p++ = '?';
        } else if (n == 0 || k < n || (n == 2 && *p < 0xc2) ||
                   (n == 4 && *p > 0xf4)) {
            *p++ = '?'; /* not a sequence: this byte goes */
        } else {
            p += n;
        }
    }
}

kvt_doctor_check_t *kvt__doc_add(kvt__doc_t *d, const char *id,
                                 kvt_doctor_level_t level, kvt_status_t st,
                                 const char *fix, const char *fmt, ...)
{
    kvt_doctor_report_h r = d->r;
    kvt_doctor_check_t *c;
    char detail[1536];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 32;
        kvt_doctor_check_t *n = realloc(r->c, cap * sizeof(*n));
        if (n == NULL) {
            d->nomem = 1;
            return NULL;
        }
        r->c = n;
        r->cap = cap;
    }
    c = &r->c[r->n];
    memset(c, 0, sizeof(*c));
    c->id = strdup(id);
    c->detail = strdup(detail);
    c->fix = fix != NULL ? strdup(fix) : NULL;
    if (c->id == NULL || c->detail == NULL || (fix != NULL && c->fix == NULL)) {
        free((char *)c->id);
        free((char *)c->detail);
        free((char *)c->fix);
        d->nomem = 1;
        return NULL;
    }
    sanitize((char *)c->id);
    sanitize((char *)c->detail);
    if (c->fix != NULL)
        sanitize((char *)c->fix);
    c->level = level;
    c->status = st;
    c->ms = c->mbps = c->lat_us = -1;
    r->n++;
    return c;
}

void kvt__doc_cause_reset(kvt__doc_t *d)
{
    kvt__log_capture(&d->cap);
}

const char *kvt__doc_cause(kvt__doc_t *d, const char *dflt)
{
    return d->cause[0] != '\0' ? d->cause : dflt;
}

kvt_status_t kvt__doc_engine(kvt__doc_t *d, uint32_t transports,
                             kvt_engine_h *e_p)
{
    kvt_engine_params_t p = {0};

    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS |
                   KVT_ENGINE_PARAM_NUM_WORKERS |
                   KVT_ENGINE_PARAM_CONNECT_TIMEOUT |
                   KVT_ENGINE_PARAM_TRANSFER_TIMEOUT;
    p.local_host = d->local_host;
    p.transports = transports;
    p.num_workers = 1;
    p.connect_timeout_ms = d->timeout_ms;
    p.transfer_timeout_ms = d->timeout_ms;
    if (d->token_set) {
        p.field_mask |= KVT_ENGINE_PARAM_AUTH_TOKEN;
        p.auth_token = d->token;
    }
    return kvt_engine_create(&p, e_p);
}

int kvt__doc_loopback(const char *host, char *addr, size_t cap)
{
    struct addrinfo hints = {0}, *res = NULL;
    int loop = 1, any = 0;

    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL)
        return -1;
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        char buf[INET6_ADDRSTRLEN] = "?";
        int l;
        if (a->ai_family == AF_INET) {
            struct in_addr in = ((struct sockaddr_in *)a->ai_addr)->sin_addr;
            l = (ntohl(in.s_addr) >> 24) == 127;
            inet_ntop(AF_INET, &in, buf, sizeof(buf));
        } else if (a->ai_family == AF_INET6) {
            struct in6_addr in6 =
                ((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            l = IN6_IS_ADDR_LOOPBACK(&in6);
            inet_ntop(AF_INET6, &in6, buf, sizeof(buf));
        } else {
            continue;
        }
        if (!any && addr != NULL)
            snprintf(addr, cap, "%s", buf);
        any = 1;
        loop &= l;
    }
    freeaddrinfo(res);
    return any ? loop : -1;
}

static kvt_status_t setup(kvt__doc_t *d, const kvt_doctor_params_t *p)
{
    uint64_t m = p != NULL ? p->field_mask : 0;
    const uint64_t known = (KVT_DOCTOR_PARAM_PEERS_EXPECTED << 1) - 1;

    if (m & ~known)
        return KVT_ERR_INVALID_PARAM;
    d->local_host = "127.0.0.1";
    d->transports = KVT_TRANSPORT_ALL;
    d->kinds = 1u << KVT_MEM_HOST;
    d->timeout_ms = 3000;
    d->probe_bytes = 64ull << 20;
    d->peers_expected = 64;
    if ((m & KVT_DOCTOR_PARAM_PEER) && p->peer != NULL && p->peer[0] != '\0')
        d->peer = p->peer;
    if ((m & KVT_DOCTOR_PARAM_METADATA_URI) && p->metadata_uri != NULL &&
        p->metadata_uri[0] != '\0')
        d->meta_uri = p->metadata_uri;
    if ((m & KVT_DOCTOR_PARAM_LOCAL_HOST) && p->local_host != NULL &&
        p->local_host[0] != '\0') {
        d->local_host = p->local_host;
        d->host_asked = 1;
    }
    if (m & KVT_DOCTOR_PARAM_TRANSPORTS) {
        if (p->transports == 0)
            return KVT_ERR_INVALID_PARAM;
        d->transports = p->transports;
    }
    if (m & KVT_DOCTOR_PARAM_AUTH_TOKEN) {
        d->token_set = 1;
        d->token = p->auth_token != NULL ? p->auth_token : "";
    }
    if (m & KVT_DOCTOR_PARAM_MEM_KINDS) {
        if (p->mem_kinds == 0 || (p->mem_kinds >> KVT_MEM_KINDS) != 0)
            return KVT_ERR_INVALID_PARAM;
        d->kinds = p->mem_kinds;
        d->kinds_asked = 1;
    }
    if (m & KVT_DOCTOR_PARAM_TIMEOUT) {
        if (p->timeout_ms == 0 || p->timeout_ms > 600000)
            return KVT_ERR_INVALID_PARAM;
        d->timeout_ms = p->timeout_ms;
    }
    if (m & KVT_DOCTOR_PARAM_PROBE_BYTES) {
        if (p->probe_bytes > (1ull << 40))
            return KVT_ERR_INVALID_PARAM;
        d->probe_bytes = p->probe_bytes;
    }
    if (m & KVT_DOCTOR_PARAM_PEERS_EXPECTED)
        d->peers_expected = p->peers_expected;
    return KVT_OK;
}

kvt_status_t kvt_doctor_run(const kvt_doctor_params_t *params,
                            kvt_doctor_report_h *report_p)
{
    kvt__log_capture_t *was = kvt__log_cap;
    kvt__doc_child_t child = {.pid = -1};
    kvt__doc_t *d;
    kvt_status_t st;
    int peers = 0;

    if (report_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    kvt__log_init();
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return KVT_ERR_NO_MEMORY;
    st = setup(d, params);
    if (st == KVT_OK) {
        d->r = calloc(1, sizeof(*d->r));
        st = d->r != NULL ? KVT_OK : KVT_ERR_NO_MEMORY;
    }
    if (st != KVT_OK) {
        free(d);
        return st;
    }
    d->out_fd = -1;
    d->cap.buf = d->cause;
    d->cap.cap = sizeof(d->cause);
    kvt__doc_cause_reset(d);
    d->host_id = kvt__host_identity();
    /* The peer checks' child is forked first: the host checks may
     * initialise the CUDA driver, which a child forked after could not
     * use. Its records come after the host's. */
    if (d->peer != NULL || d->meta_uri != NULL) {
        kvt__doc_peer_start(d, &child);
        peers = 1;
    }
    kvt__doc_host(d);
    if (peers)
        kvt__doc_peer_finish(d, &child);
    kvt__log_cap = was; /* as it was, what it holds kept */
    if (d->nomem) {
        kvt_doctor_free(d->r);
        free(d);
        return KVT_ERR_NO_MEMORY;
    }
    *report_p = d->r;
    free(d);
    return KVT_OK;
}

size_t kvt_doctor_count(kvt_doctor_report_h r)
{
    return r != NULL ? r->n : 0;
}

const kvt_doctor_check_t *kvt_doctor_check(kvt_doctor_report_h r, size_t i)
{
    return r != NULL && i < r->n ? &r->c[i] : NULL;
}

kvt_doctor_level_t kvt_doctor_worst(kvt_doctor_report_h r)
{
    kvt_doctor_level_t w = KVT_DOCTOR_OK;

    for (size_t i = 0; r != NULL && i < r->n; i++)
        if (r->c[i].level != KVT_DOCTOR_SKIP && r->c[i].level > w)
            w = r->c[i].level;
    return w;
}

void kvt_doctor_free(kvt_doctor_report_h r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free((char *)r->c[i].id);
        free((char *)r->c[i].detail);
        free((char *)r->c[i].fix);
    }
    free(r->c);
    free(r);
}

/* ---- JSON ---------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    int bad;
} jbuf_t;

static void jput(jbuf_t *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void jput(jbuf_t *j, const char *fmt, ...)
{
    va_list ap;
    int k;

    for (;;) {
        va_start(ap, fmt);
        k = vsnprintf(j->s + j->n, j->cap - j->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            j->bad = 1;
            return;
        }
        if ((size_t)k < j->cap - j->n) {
            j->n += (size_t)k;
            return;
        }
        {
            size_t cap = 2 * j->cap + (size_t)k;
            char *s = realloc(j->s, cap);
            if (s == NULL) {
                j->bad = 1;
                j->n = 0;
                return;
            }
            j->s = s;
            j->cap = cap;
        }
    }
}

static void jstr(jbuf_t *j, const char *v)
{
    if (v == NULL) {
        jput(j, "null");
        return;
    }
    jput(j, "\"");
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\')
            jput(j, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            jput(j, "\\u%04x", *p);
        else
            jput(j, "%c", *p);
    }
    jput(j, "\"");
}

static void jnum(jbuf_t *j, double v)
{
    if (!(v >= 0) || isinf(v))
        jput(j, "null");
    else
        jput(j, "%.3f", v);
}

kvt_status_t kvt_doctor_json(kvt_doctor_report_h r, char **json_p)
{
    static const char *const lv[] = {"ok", "warn", "fail", "skip"};
    kvt_doctor_level_t w = kvt_doctor_worst(r);
    jbuf_t j = {0};

    if (r == NULL || json_p == NULL)
        return KVT_ERR_INVALID_PARAM;
    j.cap = 1024;
    j.s = malloc(j.cap);
    if (j.s == NULL)
        return KVT_ERR_NO_MEMORY;
    jput(&j, "{\"ok\": %s, \"worst\": \"%s\", \"checks\": [",
         w == KVT_DOCTOR_FAIL ? "false" : "true", lv[w]);
    for (size_t i = 0; i < r->n; i++) {
        const kvt_doctor_check_t *c = &r->c[i];
        jput(&j, "%s{\"id\": ", i ? ", " : "");
        jstr(&j, c->id);
        jput(&j, ", \"level\": \"%s\", \"status\": ", lv[c->level]);
        jstr(&j, c->status != KVT_OK ? kvt_status_name(c->status) : NULL);
        jput(&j, ", \"detail\": ");
        jstr(&j, c->detail);
        jput(&j, ", \"fix\": ");
        jstr(&j, c->fix);
        jput(&j, ", \"ms\": ");
        jnum(&j, c->ms);
        jput(&j, ", \"mbps\": ");
        jnum(&j, c->mbps);
        jput(&j, ", \"lat_us\": ");
        jnum(&j, c->lat_us);
        jput(&j, "}");
    }
    jput(&j, "]}");
    if (j.bad) {
        free(j.s);
        return KVT_ERR_NO_MEMORY;
    }
    *json_p = j.s;
    return KVT_OK;
}

/* ---- The scratch region ---------------------------------------------------
 */

kvt_status_t kvt_doctor_scratch(kvt_engine_h e, size_t length, void **addr_p)
{
    void *addr = NULL;
    kvt_status_t st;

    if (e == NULL)
        return KVT_ERR_INVALID_PARAM;
    if (length == 0)
        length = 8u << 20;
    if (length < (64u << 10))
        return KVT_ERR_INVALID_PARAM;
    st = kvt_mem_alloc(e, length, KVT_ACCESS_REMOTE_RW, &addr);
    if (st != KVT_OK)
        return st;
    /* kvt_mem_alloc() memory is zero-filled: the mark and its length. */
    snprintf(addr, KVT__DOC_HEAD, "%s %zu", KVT__DOC_MAGIC, length);
    if (addr_p != NULL)
        *addr_p = addr;
    return KVT_OK;
}

/* ---- Records between the peer checks' child and the parent -------------- */

/* Write all of @buf; the child has nothing to do but this. */
static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* A record: fields separated by 0x1f, ended by 0x1e. Check: "C", id,
 * level, status, ms, mbps, lat_us, fix ("" for none; "\x01" for NULL),
 * detail. Step: "S", id. */
/* @s with the record's separators (0x1e, 0x1f) and the NULL mark (0x01)
 * made '?', into @out: a peer's words end up in details. */
static const char *clean(const char *s, char *out, size_t cap)
{
    size_t i = 0;

    for (; s[i] != '\0' && i + 1 < cap; i++)
        out[i] =
            s[i] == '\x1e' || s[i] == '\x1f' || s[i] == '\x01' ? '?' : s[i];
    out[i] = '\0';
    return out;
}

void kvt__doc_step(kvt__doc_t *d, const char *id)
{
    char buf[4096], cid[128], fix[512], detail[1600];
    int n;

    if (d->out_fd < 0)
        return;
    for (; d->sent < d->r->n; d->sent++) {
        const kvt_doctor_check_t *c = &d->r->c[d->sent];
        n = snprintf(buf, sizeof(buf),
                     "C\x1f%s\x1f%d\x1f%d\x1f%.6f\x1f%.6f\x1f"
                     "%.6f\x1f%s\x1f%s\x1e",
                     clean(c->id, cid, sizeof(cid)), (int)c->level,
                     (int)c->status, c->ms, c->mbps, c->lat_us,
                     c->fix != NULL ? clean(c->fix, fix, sizeof(fix)) : "\x01",
                     clean(c->detail, detail, sizeof(detail)));
        if (n <= 0)
            continue;
        if ((size_t)n >= sizeof(buf)) { /* cut: the record still ends */
            n = (int)sizeof(buf) - 1;
            buf[n - 1] = '\x1e';
        }
        write_all(d->out_fd, buf, (size_t)n);
    }
    if (id != NULL) {
        n = snprintf(buf, sizeof(buf), "S\x1f%s\x1e",
                     clean(id, cid, sizeof(cid)));
        if (n > 0)
            write_all(d->out_fd, buf, (size_t)n);
    }
}

void kvt__doc_beat(kvt__doc_t *d, const char *id)
{
    char buf[160], cid[128];
    int n;

    if (d->out_fd < 0)
        return;
    n = snprintf(buf, sizeof(buf), "S\x1f%s\x1e", clean(id, cid, sizeof(cid)));
    if (n > 0 && (size_t)n < sizeof(buf))
        write_all(d->out_fd, buf, (size_t)n);
}

/* One record from the child, in @rec (NUL-terminated, separators kept):
 * a check is added; a step's name goes to @step. */
static void take_record(kvt__doc_t *d, char *rec, char *step, size_t cap)
{
    char *f[9];
    int n = 0;

    for (char *p = rec; n < 9;) {
        f[n++] = p;
        p = strchr(p, '\x1f');
        if (p == NULL)
            break;
        *p++ = '\0';
    }
    if (n == 2 && !strcmp(f[0], "S")) {
        snprintf(step, cap, "%s", f[1]);
    } else if (n == 9 && !strcmp(f[0], "C") && atoi(f[2]) >= KVT_DOCTOR_OK &&
               atoi(f[2]) <= KVT_DOCTOR_SKIP) {
        kvt_doctor_check_t *c = kvt__doc_add(
            d, f[1], (kvt_doctor_level_t)atoi(f[2]), (kvt_status_t)atoi(f[3]),
            strcmp(f[7], "\x01") ? f[7] : NULL, "%s", f[8]);
        if (c != NULL) {
            c->ms = atof(f[4]);
            c->mbps = atof(f[5]);
            c->lat_us = atof(f[6]);
        }
    }
}

int kvt__doc_child_start(kvt__doc_t *d, kvt__doc_child_t *ch,
                         void (*fn)(kvt__doc_t *))
{
    int p[2], go[2];
    pid_t parent = getpid();

    ch->pid = -1;
    if (pipe2(p, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) {
        kvt__doc_add(d, "doctor", KVT_DOCTOR_FAIL, KVT_ERR_IO, NULL,
                     "cannot make a pipe: %s", strerror(errno));
        return -1;
    }
    ch->pid = fork();
    if (ch->pid == 0) {
        /* The child: wait for the word, run the checks, stream them, and
         * leave at once: its engines go with it, whatever a transport is
         * stuck in. It holds nothing of the parent's open (listeners,
         * other runs' pipes) and dies with it. */
        size_t base = d->r->n;
        char c;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (dup3(p[1], 3, O_CLOEXEC) != 3 || dup3(go[0], 4, O_CLOEXEC) != 4)
            _exit(1);
        close_range(5, ~0u, 0);
        if (read(4, &c, 1) != 1)
            _exit(0); /* the parent changed its mind, or died */
        d->out_fd = 3;
        d->sent = base;
        fn(d);
        kvt__doc_step(d, "end");
        _exit(0);
    }
    close(p[1]);
    close(go[0]);
    if (ch->pid < 0) {
        close(p[0]);
        close(go[1]);
        kvt__doc_add(d, "doctor", KVT_DOCTOR_FAIL, KVT_ERR_IO, NULL,
                     "cannot fork the peer checks: %s", strerror(errno));
        return -1;
    }
    ch->rd = p[0];
    ch->go = go[1];
    return 0;
}

void kvt__doc_child_finish(kvt__doc_t *d, kvt__doc_child_t *ch,
                           uint64_t stall_ms,
                           void (*stalled)(kvt__doc_t *, const char *,
                                           uint64_t))
{
    char step[128] = "", *buf = NULL;
    size_t len = 0, cap = 0;
    int done = 0;
    pid_t pid = ch->pid;

    if (pid < 0)
        return;
    if (write(ch->go, "g", 1) != 1) {
        kill(pid, SIGKILL);
        done = 1;
    }
    close(ch->go);
    while (!done) {
        struct pollfd pf = {ch->rd, POLLIN, 0};
        int r = poll(&pf, 1, (int)stall_ms);
        ssize_t n;
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0) {
            kill(pid, SIGKILL);
            stalled(d, step, stall_ms);
            break;
        }
        if (len + 4096 > cap) {
            char *nb = realloc(buf, cap + 65536);
            if (nb == NULL) {
                d->nomem = 1;
                kill(pid, SIGKILL);
                break;
            }
            buf = nb;
            cap += 65536;
        }
        n = read(ch->rd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (strcmp(step, "end") != 0)
                stalled(d, step, 0);
            break;
        }
        len += (size_t)n;
        for (;;) {
            char *end = memchr(buf, '\x1e', len);
            if (end == NULL)
                break;
            *end = '\0';
            take_record(d, buf, step, sizeof(step));
            len -= (size_t)(end + 1 - buf);
            memmove(buf, end + 1, len);
            if (!strcmp(step, "end"))
                done = 1;
        }
    }
    free(buf);
    close(ch->rd);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    ch->pid = -1;
}

void kvt__doc_run_child(kvt__doc_t *d, void (*fn)(kvt__doc_t *),
                        uint64_t stall_ms,
                        void (*stalled)(kvt__doc_t *, const char *, uint64_t))
{
    kvt__doc_child_t ch;

    if (kvt__doc_child_start(d, &ch, fn) == 0)
        kvt__doc_child_finish(d, &ch, stall_ms, stalled);
}
