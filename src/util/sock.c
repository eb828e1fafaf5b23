/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sockets: host:port parsing, listen, connect with a deadline, tuning,
 * and send and receive of whole buffers.
 */
#include "util/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/log.h"
#include "util/time.h"

kvt_status_t kvt__sock_split_hostport(const char *name, char *host,
                                      size_t host_len, uint16_t *port_p)
{
    const char *colon, *hstart = name, *hend;
    char *end;
    unsigned long port;

    if (name == NULL || *name == '\0')
        return KVT_ERR_INVALID_PARAM;
    if (name[0] == '[') {
        hstart = name + 1;
        hend = strchr(hstart, ']');
        if (hend == NULL || hend[1] != ':')
            return KVT_ERR_INVALID_PARAM;
        colon = hend + 1;
    } else {
        colon = strrchr(name, ':');
        if (colon == NULL)
            return KVT_ERR_INVALID_PARAM;
        hend = colon;
    }
    if (hend == hstart || (size_t)(hend - hstart) >= host_len)
        return KVT_ERR_INVALID_PARAM;
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || port == 0 ||
        port > 65535)
        return KVT_ERR_INVALID_PARAM;
    memcpy(host, hstart, (size_t)(hend - hstart));
    host[hend - hstart] = '\0';
    *port_p = (uint16_t)port;
    return KVT_OK;
}

static kvt_status_t resolve(const char *host, uint16_t port, int passive,
                            struct addrinfo **res_p)
{
    struct addrinfo hints = {0};
    char service[8];
    int rc;

    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    snprintf(service, sizeof(service), "%u", port);
    rc = getaddrinfo(host, service, &hints, res_p);
    if (rc != 0) {
        KVT_LOG_W("cannot resolve '%s': %s", host, gai_strerror(rc));
        return KVT_ERR_UNREACHABLE;
    }
    return KVT_OK;
}

kvt_status_t kvt__sock_set_nonblock(int fd, int on)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0)
        return KVT_ERR_IO;
    flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, flags) == 0 ? KVT_OK : KVT_ERR_IO;
}

kvt_status_t kvt__sock_listen(const char *host, uint16_t port, int *fd_p,
                              uint16_t *bound_port_p)
{
    struct addrinfo *res, *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    kvt_status_t st;
    int fd = -1, one = 1, err = 0;

    st = resolve(host, port, 1, &res);
    if (st != KVT_OK)
        return KVT_ERR_INVALID_PARAM;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        KVT_LOG_E("cannot listen on %s:%u: %s", host, port, strerror(err));
        return KVT_ERR_IO;
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        close(fd);
        return KVT_ERR_IO;
    }
    *bound_port_p =
        ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                       : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_p = fd;
    return KVT_OK;
}

void kvt__sock_tune(int fd, uint64_t user_timeout_ms)
{
    int one = 1, buf = 8 << 20, idle = 5, intvl = 2, cnt = 3;
    unsigned uto =
        user_timeout_ms > 0xffffffffu ? 0xffffffffu : (unsigned)user_timeout_ms;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
}

kvt_status_t kvt__sock_connect(const char *host, uint16_t port,
                               uint64_t timeout_ms, int *fd_p)
{
    uint64_t deadline = kvt__now_ns() + timeout_ms * 1000000ull;
    struct addrinfo *res, *ai;
    kvt_status_t st = KVT_ERR_UNREACHABLE;
    int fd = -1, one = 1;

    if (resolve(host, port, 0, &res) != KVT_OK)
        return KVT_ERR_UNREACHABLE;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        struct pollfd pfd;
        int err = 0, rc;
        socklen_t el = sizeof(err);

        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno != EINPROGRESS) {
            err = errno;
            goto next;
        }
        if (rc != 0) {
            int64_t left;
            pfd.fd = fd;
            pfd.events = POLLOUT;
            do {
                left = (int64_t)(deadline - kvt__now_ns()) / 1000000;
                if (left < 0)
                    left = 0;
                rc = poll(&pfd, 1, (int)left);
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                st = KVT_ERR_TIMEDOUT;
                err = ETIMEDOUT;
                goto next;
            }
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            if (err != 0)
                goto next;
        }
        if (kvt__sock_set_nonblock(fd, 0) != KVT_OK)
            goto next;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        *fd_p = fd;
        return KVT_OK;
    next:
        KVT_LOG_D("connect %s:%u: %s", host, port, strerror(err));
        close(fd);
        fd = -1;
        if (st == KVT_ERR_TIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    return st;
}

static kvt_status_t wait_fd(int fd, short events, uint64_t deadline_ns)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int rc;

    for (;;) {
        int64_t left = (int64_t)(deadline_ns - kvt__now_ns());
        if (left <= 0)
            return KVT_ERR_TIMEDOUT;
        rc = poll(&pfd, 1, (int)((left + 999999) / 1000000));
        if (rc > 0)
            return KVT_OK;
        if (rc < 0 && errno != EINTR)
            return KVT_ERR_IO;
    }
}

kvt_status_t kvt__sock_send_all(int fd, const void *buf, size_t len,
                                uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            kvt_status_t st = wait_fd(fd, POLLOUT, deadline_ns);
            if (st != KVT_OK)
                return st;
        } else {
            return KVT_ERR_CONN_LOST;
        }
    }
    return KVT_OK;
}

kvt_status_t kvt__sock_recv_all(int fd, void *buf, size_t len,
                                uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            kvt_status_t st = wait_fd(fd, POLLIN, deadline_ns);
            if (st != KVT_OK)
                return st;
        } else {
            return KVT_ERR_CONN_LOST;
        }
    }
    return KVT_OK;
}

struct iovec *kvt__iov_advance(struct iovec *iov, int *cnt_p, size_t n)
{
    int cnt = *cnt_p;
    while (cnt > 0 && n >= iov->iov_len) {
        n -= iov->iov_len;
        iov++;
        cnt--;
    }
    if (cnt > 0 && n > 0) {
        iov->iov_base = (char *)iov->iov_base + n;
        iov->iov_len -= n;
    }
    *cnt_p = cnt;
    return iov;
}

char *kvt__sock_peer_str(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN];

    snprintf(buf, len, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return buf;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host)) != NULL)
            snprintf(buf, len, "%s:%u", host, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host)) != NULL)
            snprintf(buf, len, "[%s]:%u", host, ntohs(a->sin6_port));
    }
    return buf;
}
