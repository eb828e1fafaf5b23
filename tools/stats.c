/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt stats: a live view of one or more processes' /metrics (the
 * listener KVT_METRICS_PORT starts): throughput per engine and transport,
 * descriptors per second, latency percentiles over the last interval,
 * failures, in-flight descriptors, sessions, and connector rooms by
 * state. Refreshed every interval; a table redrawn in place on a
 * terminal, plain lines (one per engine and transport, with a time
 * stamp) otherwise.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define MAX_TARGETS 16
#define MAX_ROWS 256
#define NB 20 /* latency buckets (kvt/metrics.h) */

typedef struct {
    char target[64];
    char engine[160];
    char transport[16];
    double wbytes, rbytes, descs, fails, sessions;
    double swbytes, srbytes; /* served: peers' writes here, reads from here */
    double bucket[NB];       /* cumulative counts, all size classes */
    double le[NB];
    int nb;
    int seen;
} row_t;

typedef struct {
    row_t rows[MAX_ROWS];
    int n;
    /* Connector rooms per engine: by state. */
    char cengine[MAX_ROWS][160];
    double rooms[MAX_ROWS][5];
    int nc;
} snap_t;

static const char *const states[5] = {
    "failed", "bootstrapping", "waiting_for_input", "transferring", "success"};

/* GET /metrics from host:port within 2 s; malloc'd body or NULL. */
static char *fetch(const char *target)
{
    char host[64], port[16], req[160], *buf = NULL, *body;
    const char *colon = strrchr(target, ':');
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    size_t len = 0, cap = 0;
    int fd = -1;

    if (colon == NULL || (size_t)(colon - target) >= sizeof(host))
        return NULL;
    memcpy(host, target, (size_t)(colon - target));
    host[colon - target] = '\0';
    snprintf(port, sizeof(port), "%s", colon + 1);
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return NULL;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        goto fail;
    snprintf(req, sizeof(req),
             "GET /metrics HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
             target);
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
        goto fail;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        ssize_t r;
        if (poll(&pf, 1, 2000) <= 0)
            goto fail;
        if (len + 65536 > cap) {
            char *n = realloc(buf, cap = 2 * cap + 65536);
            if (n == NULL)
                goto fail;
            buf = n;
        }
        r = recv(fd, buf + len, cap - len - 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    freeaddrinfo(ai);
    if (buf == NULL)
        return NULL;
    buf[len] = '\0';
    body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || body == NULL) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
fail:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    free(buf);
    return NULL;
}

/* The value of label @name in @labels ("a=\"x\",b=\"y\""), into @out. */
static int label(const char *labels, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);

    for (const char *p = labels; (p = strstr(p, name)) != NULL; p++) {
        if ((p == labels || p[-1] == ',' || p[-1] == '{') && p[n] == '=' &&
            p[n + 1] == '"') {
            size_t k = 0;
            for (p += n + 2; *p != '\0' && *p != '"' && k + 1 < cap; p++) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                out[k++] = *p;
            }
            out[k] = '\0';
            return 0;
        }
    }
    return -1;
}

static row_t *row_of(snap_t *s, const char *target, const char *engine,
                     const char *transport)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->rows[i].target, target) &&
            !strcmp(s->rows[i].engine, engine) &&
            !strcmp(s->rows[i].transport, transport))
            return &s->rows[i];
    if (s->n == MAX_ROWS)
        return NULL;
    memset(&s->rows[s->n], 0, sizeof(row_t));
    snprintf(s->rows[s->n].target, sizeof(s->rows[0].target), "%s", target);
    snprintf(s->rows[s->n].engine, sizeof(s->rows[0].engine), "%s", engine);
    snprintf(s->rows[s->n].transport, sizeof(s->rows[0].transport), "%s",
             transport);
    return &s->rows[s->n++];
}

/* Fold one scrape of @target into @s. */
static void parse(snap_t *s, const char *target, char *text)
{
    for (char *line = strtok(text, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        char name[96], labels[512] = "", eng[160] = "", tl[16] = "",
                       op[16] = "", le[32] = "";
        char *brace = strchr(line, '{'), *sp;
        double v;
        row_t *r;

        if (line[0] == '#' || brace == NULL)
            continue;
        sp = strrchr(line, ' ');
        if (sp == NULL || (size_t)(brace - line) >= sizeof(name))
            continue;
        memcpy(name, line, (size_t)(brace - line));
        name[brace - line] = '\0';
        snprintf(labels, sizeof(labels), "%.*s", (int)(sp - brace), brace);
        v = strtod(sp + 1, NULL);
        label(labels, "engine", eng, sizeof(eng));
        if (!strcmp(name, "kvt_conn_rooms")) {
            char st[32] = "";
            int k = 0;
            label(labels, "state", st, sizeof(st));
            while (k < s->nc && strcmp(s->cengine[k], eng) != 0)
                k++;
            if (k == s->nc && s->nc < MAX_ROWS)
                snprintf(s->cengine[s->nc++], sizeof(s->cengine[0]), "%s", eng);
            for (int i = 0; k < s->nc && i < 5; i++)
                if (!strcmp(st, states[i]))
                    s->rooms[k][i] = v;
            continue;
        }
        if (label(labels, "transport", tl, sizeof(tl)) != 0)
            continue;
        r = row_of(s, target, eng, tl);
        if (r == NULL)
            continue;
        r->seen = 1;
        label(labels, "op", op, sizeof(op));
        if (!strcmp(name, "kvt_transfer_bytes_total")) {
            if (!strcmp(op, "write"))
                r->wbytes = v;
            else if (!strcmp(op, "read"))
                r->rbytes = v;
        } else if (!strcmp(name, "kvt_served_bytes_total")) {
            if (!strcmp(op, "write"))
                r->swbytes = v;
            else if (!strcmp(op, "read"))
                r->srbytes = v;
        } else if (!strcmp(name, "kvt_transfer_descriptors_total")) {
            r->descs += v;
        } else if (!strcmp(name, "kvt_transfer_failures_total")) {
            r->fails += v;
        } else if (!strcmp(name, "kvt_sessions_open")) {
            r->sessions = v;
        } else if (!strcmp(name, "kvt_transfer_latency_seconds_bucket") &&
                   label(labels, "le", le, sizeof(le)) == 0) {
            /* Buckets come in order for each size class: sum them. */
            double bound = !strcmp(le, "+Inf") ? INFINITY : strtod(le, NULL);
            int k = 0;
            while (k < r->nb && r->le[k] != bound)
                k++;
            if (k == r->nb && r->nb < NB)
                r->le[r->nb++] = bound;
            if (k < NB)
                r->bucket[k] += v;
        }
    }
}

/* The @q quantile (0..1) of the latency between two readings, in us:
 * the upper bound of the bucket that holds it; -1 without samples. */
static double quantile(const row_t *a, const row_t *b, double q)
{
    double total = b->bucket[b->nb - 1] - (a ? a->bucket[b->nb - 1] : 0);

    if (b->nb == 0 || total <= 0)
        return -1;
    for (int k = 0; k < b->nb; k++) {
        double c = b->bucket[k] - (a ? a->bucket[k] : 0);
        if (c >= q * total)
            return isinf(b->le[k]) ? INFINITY : b->le[k] * 1e6;
    }
    return INFINITY;
}

static const row_t *prev_of(const snap_t *p, const row_t *r)
{
    for (int i = 0; p != NULL && i < p->n; i++)
        if (!strcmp(p->rows[i].target, r->target) &&
            !strcmp(p->rows[i].engine, r->engine) &&
            !strcmp(p->rows[i].transport, r->transport))
            return &p->rows[i];
    return NULL;
}

static void fmt_us(char *out, size_t cap, double us)
{
    if (us < 0)
        snprintf(out, cap, "-");
    else if (isinf(us))
        snprintf(out, cap, ">10s");
    else if (us < 1000)
        snprintf(out, cap, "%.0fus", us);
    else if (us < 1e6)
        snprintf(out, cap, "%.0fms", us / 1e3);
    else
        snprintf(out, cap, "%.0fs", us / 1e6);
}

static void show(const snap_t *p, const snap_t *s, double dt, int tty, int nt,
                 char **targets, const int *down)
{
    char ts[32];
    time_t now = time(NULL);

    strftime(ts, sizeof(ts), "%H:%M:%S", localtime(&now));
    if (tty) {
        printf("\033[H\033[2Jkvt stats  %s  every %.1f s\n\n", ts, dt);
        printf("%-22s %-5s %10s %10s %9s %7s %7s %6s %5s %10s %10s\n", "engine",
               "tl", "write MB/s", "read MB/s", "desc/s", "p50", "p99",
               "fail/s", "sess", "served w", "served r");
    }
    for (int i = 0; i < s->n; i++) {
        const row_t *r = &s->rows[i], *a = prev_of(p, r);
        double w = a ? (r->wbytes - a->wbytes) / dt / 1e6 : 0;
        double rd = a ? (r->rbytes - a->rbytes) / dt / 1e6 : 0;
        double d = a ? (r->descs - a->descs) / dt : 0;
        double f = a ? (r->fails - a->fails) / dt : 0;
        double sw = a ? (r->swbytes - a->swbytes) / dt / 1e6 : 0;
        double sr = a ? (r->srbytes - a->srbytes) / dt / 1e6 : 0;
        char p50[16], p99[16];
        fmt_us(p50, sizeof(p50), a ? quantile(a, r, 0.5) : -1);
        fmt_us(p99, sizeof(p99), a ? quantile(a, r, 0.99) : -1);
        if (tty)
            printf("%-22.22s %-5s %10.1f %10.1f %9.0f %7s %7s %6.1f "
                   "%5.0f %10.1f %10.1f\n",
                   r->engine, r->transport, w, rd, d, p50, p99, f, r->sessions,
                   sw, sr);
        else
            printf("%s engine=%s transport=%s write_MBps=%.1f read_MBps=%.1f "
                   "desc_per_s=%.0f p50=%s p99=%s fail_per_s=%.1f "
                   "sessions=%.0f served_write_MBps=%.1f "
                   "served_read_MBps=%.1f\n",
                   ts, r->engine, r->transport, w, rd, d, p50, p99, f,
                   r->sessions, sw, sr);
    }
    for (int k = 0; k < s->nc; k++) {
        if (tty)
            printf("\nrooms of %s: bootstrapping %.0f, waiting %.0f, "
                   "transferring %.0f, success %.0f, failed %.0f",
                   s->cengine[k], s->rooms[k][1], s->rooms[k][2],
                   s->rooms[k][3], s->rooms[k][4], s->rooms[k][0]);
        else
            printf("%s engine=%s rooms_bootstrapping=%.0f "
                   "rooms_waiting=%.0f rooms_transferring=%.0f "
                   "rooms_success=%.0f rooms_failed=%.0f\n",
                   ts, s->cengine[k], s->rooms[k][1], s->rooms[k][2],
                   s->rooms[k][3], s->rooms[k][4], s->rooms[k][0]);
    }
    for (int t = 0; t < nt; t++)
        if (down[t])
            printf(tty ? "\n%s: no answer" : "%s target=%s down\n",
                   tty ? targets[t] : ts, targets[t]);
    if (tty)
        printf("\n");
    fflush(stdout);
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: kvt stats [--interval=SECONDS] [--count=N] HOST:PORT...\n"
           "\n"
           "A live view of processes' /metrics (start them with\n"
           "KVT_METRICS_PORT=PORT): throughput per engine and transport,\n"
           "descriptors per second, latency percentiles (the upper bound of\n"
           "the bucket) over the last interval, failures, sessions and\n"
           "connector rooms. A table on a terminal, plain lines otherwise.\n"
           "--count=N stops after N refreshes (default: until interrupted).\n");
}

int kvt_cmd_stats(int argc, char **argv)
{
    char *targets[MAX_TARGETS];
    int nt = 0, down[MAX_TARGETS];
    double interval = 1.0;
    long count = -1;
    snap_t *prev = NULL, *cur;
    int tty = isatty(STDOUT_FILENO);

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv[i], "help")) {
            usage(stdout);
            return 0;
        } else if ((v = cli_opt(argc, argv, &i, "interval")) != NULL) {
            interval = strtod(v, NULL);
            if (interval < 0.1 || interval > 3600) {
                fprintf(stderr, "kvt stats: --interval=%s: 0.1 to 3600\n", v);
                return 2;
            }
        } else if ((v = cli_opt(argc, argv, &i, "count")) != NULL) {
            count = strtol(v, NULL, 10);
        } else if (argv[i][0] == '-') {
            usage(stderr);
            return 2;
        } else if (nt < MAX_TARGETS) {
            targets[nt++] = argv[i];
        }
    }
    if (nt == 0) {
        usage(stderr);
        return 2;
    }
    /* The first reading is the baseline of the first refresh. */
    for (long round = 0; count < 0 || round <= count; round++) {
        int any = 0;
        cur = calloc(1, sizeof(*cur));
        if (cur == NULL)
            return 1;
        for (int t = 0; t < nt; t++) {
            char *text = fetch(targets[t]);
            down[t] = text == NULL;
            if (text != NULL) {
                parse(cur, targets[t], text);
                any = 1;
            }
            free(text);
        }
        if (round == 0 && !any) {
            fprintf(stderr, "kvt stats: no answer from %s%s\n", targets[0],
                    nt > 1 ? " nor the others" : "");
            free(cur);
            return 1;
        }
        if (round > 0)
            show(prev, cur, interval, tty, nt, targets, down);
        free(prev);
        prev = cur;
        if (count >= 0 && round >= count)
            break;
        usleep((useconds_t)(interval * 1e6));
    }
    free(prev);
    return 0;
}
