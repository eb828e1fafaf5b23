/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_PEER_H
#define KVT_TESTS_PEER_H

/*
 * A target engine in a child process, driven over a pair of pipes, for
 * tests that need a real peer: it registers memory, reports its segment
 * name and addresses, and answers commands (verify, fill, unregister,
 * unregister then overwrite, count, wait for a notification, count the
 * peers it refused) until it is killed or told to exit.
 */
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <kvt/kvt.h>

#define PEER_MAIN_LEN (64ull << 20)
#define PEER_SMALL_LEN (1ull << 20)

typedef struct {
    pid_t pid;
    int to_fd, from_fd;
    char segment[128];
    uint64_t main_addr;  /* PEER_MAIN_LEN, read-write */
    uint64_t ro_addr;    /* PEER_SMALL_LEN, remote read only */
    uint64_t wo_addr;    /* PEER_SMALL_LEN, remote write only */
    uint64_t guard_addr; /* PEER_SMALL_LEN right after main, never registered */
} peer_t;

typedef struct {
    uint32_t transports; /* KVT_TRANSPORT_* */
    uint64_t timeout_ms; /* 0: default */
    int managed;         /* allocate the main region with kvt_mem_alloc */
    int leader_exits;    /* serve from a second thread; the first exits
                            (pthread_exit(): the leader is a zombie) on
                            the command "leave" */
    int cuda;            /* the main region in device memory (devmem.h); the
                            commands reach it through copies */
} peer_opts_t;

/* Deterministic content: byte i of a stream with @seed. */
static inline uint8_t pattern_byte(uint64_t seed, uint64_t i)
{
    uint64_t x =
        (i >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    return (uint8_t)(x >> (8 * (i & 7))); /* byte i%8 of a little-endian word */
}

void pattern_fill(void *buf, uint64_t len, uint64_t seed, uint64_t off);
uint64_t pattern_check(const void *buf, uint64_t len, uint64_t seed,
                       uint64_t off);

int peer_start(peer_t *p, const peer_opts_t *o);
/* peer_start() of a peer serving @transports (default options) with
 * @token (NULL: none) as its shared secret, through its environment
 * (KVT_AUTH_TOKEN), which is cleared again here. */
void peer_start_token(peer_t *p, uint32_t transports, const char *token);
/* A test program's own commands: set before peer_start(), asked (in the
 * peer, with its engine) for any line the peer does not know; it writes
 * the reply line (no newline) into @out and returns 1, or returns 0. */
extern int (*peer_cmd_hook)(kvt_engine_h e, const char *line, char *out,
                            size_t cap);
/* Sends a command line, returns the reply line (static buffer) or NULL. */
const char *peer_cmd(peer_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void peer_stop(peer_t *p);
void peer_kill(peer_t *p, int sig);

/* The transport carrying host memory to @seg ("(none)" if none). */
const char *seg_transport(kvt_engine_h e, kvt_segment_t seg);
/* Whether the peer behind @seg offers @transport (a KVT_TRANSPORT_* bit). */
int seg_offers(kvt_engine_h e, kvt_segment_t seg, uint32_t transport);

/* An initiator engine with the given options. */
kvt_engine_h engine_new(uint32_t transports, uint64_t timeout_ms);

#endif
