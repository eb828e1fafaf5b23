/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_META_TEST_H
#define KVT_TESTS_META_TEST_H

/*
 * Helpers for the metadata tests: free loopback ports, a minimal HTTP/1.1
 * client over a raw socket (so that tests control every byte they send),
 * and starting and stopping server processes (redis-server, etcd, kvt
 * metad) that die with the test case that started them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvt_test.h"

/* A port that was free a moment ago on 127.0.0.1. */
static inline uint16_t mt_free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    CHECK(fd >= 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline int mt_connect(uint16_t port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct timeval tv = {10, 0};

    if (fd < 0)
        return -1;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int mt_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

typedef struct {
    int code;
    char head[8192]; /* status line and headers */
    char *body;      /* malloc'd, NUL-terminated */
    size_t len;
} mt_resp_t;

static inline void mt_resp_free(mt_resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

/*
 * Read one response from @fd: headers, then Content-Length bytes, or up
 * to EOF without one. Returns the status code, -1 on I/O error.
 */
static inline int mt_read_resp(int fd, mt_resp_t *r)
{
    size_t hl = 0, want = (size_t)-1, cap = 4096;
    char *end, *cl;

    memset(r, 0, sizeof(*r));
    r->code = -1;
    while (hl < sizeof(r->head) - 1) {
        ssize_t n = recv(fd, r->head + hl, 1, 0);
        if (n <= 0)
            return -1;
        hl++;
        if (hl >= 4 && memcmp(r->head + hl - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    r->head[hl] = '\0';
    if (sscanf(r->head, "HTTP/1.%*d %d", &r->code) != 1)
        return -1;
    cl = strcasestr(r->head, "\r\nContent-Length:");
    if (cl != NULL)
        want = strtoul(cl + 17, &end, 10);
    r->body = malloc(cap + 1);
    CHECK(r->body != NULL);
    while (r->len < want) {
        ssize_t n;
        if (r->len == cap) {
            cap *= 2;
            r->body = realloc(r->body, cap + 1);
            CHECK(r->body != NULL);
        }
        n = recv(fd, r->body + r->len,
                 (want - r->len < cap - r->len) ? want - r->len : cap - r->len,
                 0);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        r->len += (size_t)n;
    }
    r->body[r->len] = '\0';
    return r->code;
}

/*
 * One request on a fresh connection ("Connection: close"). @extra: more
 * header lines, each ending in \r\n, or NULL. @body NULL: no body and no
 * Content-Length. Returns the status code, -1 on I/O error.
 */
static inline int mt_http(uint16_t port, const char *method, const char *target,
                          const char *extra, const void *body, size_t len,
                          mt_resp_t *r)
{
    size_t cap =
        strlen(method) + strlen(target) + (extra ? strlen(extra) : 0) + 256;
    char *head = malloc(cap);
    int fd, n, code = -1;

    memset(r, 0, sizeof(*r));
    r->code = -1;
    CHECK(head != NULL);
    fd = mt_connect(port);
    if (fd < 0)
        goto out;
    n = snprintf(head, cap,
                 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Connection: close\r\n%s",
                 method, target, extra ? extra : "");
    if (body != NULL)
        n +=
            snprintf(head + n, cap - (size_t)n, "Content-Length: %zu\r\n", len);
    n += snprintf(head + n, cap - (size_t)n, "\r\n");
    /* A server may answer and close before taking all we send (413, 414,
     * 431): the answer is read all the same. */
    if (mt_send_all(fd, head, (size_t)n) == 0 && body != NULL)
        mt_send_all(fd, body, len);
    code = mt_read_resp(fd, r);
    close(fd);
out:
    free(head);
    return code;
}

/* The same, and discard the answer: the status code only. */
static inline int mt_code(uint16_t port, const char *method, const char *target,
                          const void *body, size_t len)
{
    mt_resp_t r;
    int code = mt_http(port, method, target, NULL, body, len, &r);
    mt_resp_free(&r);
    return code;
}

/* Whether a program is found in PATH (or is a path that exists). */
static inline int mt_have(const char *prog)
{
    char buf[4096];
    const char *path = getenv("PATH");

    if (strchr(prog, '/') != NULL)
        return access(prog, X_OK) == 0;
    while (path != NULL && *path != '\0') {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, prog);
        if (access(buf, X_OK) == 0)
            return 1;
        path = colon ? colon + 1 : NULL;
    }
    return 0;
}

/*
 * Start @argv[0] (searched in PATH) with stdout and stderr to @log (or
 * /dev/null). The child dies when the thread that started it exits, so a
 * crashed or timed-out case leaves no server behind.
 */
static inline pid_t mt_spawn(char *const argv[], const char *log)
{
    pid_t parent = getpid(), pid = fork();

    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(log ? log : "/dev/null",
                      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM, then SIGKILL after @grace_ms; returns the wait status. */
static inline int mt_stop(pid_t pid, int grace_ms)
{
    int status = 0;

    kill(pid, SIGTERM);
    for (int i = 0; i < grace_ms / 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

/* Poll @port until it accepts a connection, for at most @ms. */
static inline int mt_wait_port(uint16_t port, pid_t pid, int ms)
{
    for (int i = 0; i < ms / 20; i++) {
        int fd = mt_connect(port), status;
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid)
            return -1;
        usleep(20000);
    }
    return -1;
}

/* rm -rf of a directory made by mkdtemp(). */
static inline void mt_rmdir(const char *dir)
{
    char cmd[4200];
    if (dir == NULL || strncmp(dir, "/tmp/", 5) != 0)
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#endif
