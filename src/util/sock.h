/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_SOCK_H
#define KVT_UTIL_SOCK_H

/*
 * Sockets: host:port parsing, listen, connect with a deadline, tuning,
 * and send and receive of whole buffers (sock.c).
 */

#include <stddef.h>
#include <stdint.h>

#include <kvt/status.h>

/*
 * Split "host:port" (or "[v6addr]:port") into its parts. @host receives at
 * most @host_len - 1 characters. KVT_ERR_INVALID_PARAM when malformed.
 */
kvt_status_t kvt__sock_split_hostport(const char *name, char *host,
                                      size_t host_len, uint16_t *port_p);

/* Bind and listen on host:port (port 0: any); *fd_p is non-blocking. */
kvt_status_t kvt__sock_listen(const char *host, uint16_t port, int *fd_p,
                              uint16_t *bound_port_p);

/*
 * Connect to host:port within @timeout_ms. The returned socket is blocking,
 * with TCP_NODELAY. KVT_ERR_UNREACHABLE when refused, unroutable or the
 * name does not resolve; KVT_ERR_TIMEDOUT when the bound passes.
 */
kvt_status_t kvt__sock_connect(const char *host, uint16_t port,
                               uint64_t timeout_ms, int *fd_p);

/* Options for data connections: no delay, large buffers, keepalive, and a
 * TCP user timeout so a cut link is noticed within @user_timeout_ms. */
void kvt__sock_tune(int fd, uint64_t user_timeout_ms);

kvt_status_t kvt__sock_set_nonblock(int fd, int on);

/* The peer's address of a connected socket, "host:port" ("[v6]:port"),
 * or "?" when it has none; into @buf of @len bytes. Returns @buf. */
#define KVT_SOCK_ADDR_MAX 64
char *kvt__sock_peer_str(int fd, char *buf, size_t len);

/* Send/receive exactly @len bytes on a blocking socket before @deadline_ns
 * (monotonic). KVT_ERR_TIMEDOUT, KVT_ERR_CONN_LOST. */
kvt_status_t kvt__sock_send_all(int fd, const void *buf, size_t len,
                                uint64_t deadline_ns);
kvt_status_t kvt__sock_recv_all(int fd, void *buf, size_t len,
                                uint64_t deadline_ns);

/*
 * Advance an iovec cursor by @n bytes: skips whole entries, trims the
 * first partial one. Returns the new first entry; *cnt_p is updated.
 */
struct iovec *kvt__iov_advance(struct iovec *iov, int *cnt_p, size_t n);

#endif
