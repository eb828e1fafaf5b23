/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_DOCTOR_H
#define KVT_DOCTOR_H

/*
 * The doctor: what is wrong before the first transfer. One call runs the
 * checks of this host (transports and memory kinds built and usable, the
 * address an engine would advertise and whether it is reachable through
 * it, shared-memory permissions, descriptor limit, clock source), of a
 * metadata server, and of a peer (name resolution, TCP reach, the
 * handshake step by step, authentication, wire version, the transport of
 * each pair of memory kinds and why, then a short verified write and read
 * on each usable transport with its bandwidth and latency), and says for
 * each what it found and, where something is wrong, the fix in one
 * sentence. `kvt doctor` prints it; docs/doctor.md lists every check.
 *
 * The doctor writes into a peer's memory only where that peer exposes a
 * scratch region for it (kvt_doctor_scratch(), `kvt doctor --serve`): a
 * region whose first bytes say so. Without one, the transfer checks are
 * skipped, saying so.
 */
#include <stddef.h>
#include <stdint.h>

#include <kvt/defs.h>
#include <kvt/engine.h>
#include <kvt/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a check found. */
typedef enum {
    KVT_DOCTOR_OK = 0,
    KVT_DOCTOR_WARN = 1, /* works, but not as an operator would want */
    KVT_DOCTOR_FAIL = 2, /* transfers would fail (or this check could not
                            run); the fix says what to do */
    KVT_DOCTOR_SKIP = 3, /* not run: what it needs is missing (said why) */
} kvt_doctor_level_t;

/* One check's result. Strings live as long as the report. */
typedef struct {
    const char *id; /* stable, dotted: "host.transport.tcp",
                       "peer.handshake", "peer.transfer.shm" */
    kvt_doctor_level_t level;
    kvt_status_t status; /* the kvt status behind a failure; KVT_OK else */
    const char *detail;  /* what was found: one line for people */
    const char *fix;     /* one sentence; NULL when there is nothing to do */
    double ms;           /* how long it took; negative: not timed */
    double mbps;         /* bandwidth measured, MB/s (10^6 B/s); negative:
                            none */
    double lat_us;       /* latency measured (median of small reads),
                            microseconds; negative: none */
} kvt_doctor_check_t;

/* Bits of kvt_doctor_params_t.field_mask: a field is read only when set. */
enum {
    KVT_DOCTOR_PARAM_PEER = 1u << 0,
    KVT_DOCTOR_PARAM_METADATA_URI = 1u << 1,
    KVT_DOCTOR_PARAM_LOCAL_HOST = 1u << 2,
    KVT_DOCTOR_PARAM_TRANSPORTS = 1u << 3,
    KVT_DOCTOR_PARAM_AUTH_TOKEN = 1u << 4,
    KVT_DOCTOR_PARAM_MEM_KINDS = 1u << 5,
    KVT_DOCTOR_PARAM_TIMEOUT = 1u << 6,
    KVT_DOCTOR_PARAM_PROBE_BYTES = 1u << 7,
    KVT_DOCTOR_PARAM_PEERS_EXPECTED = 1u << 8,
};

/*
 * What to check. Zero-initialise, set the fields you need and their bits;
 * the rest take their defaults. Strings are read during the call only.
 */
typedef struct {
    uint64_t field_mask;
    /* The peer to check: its segment name ("host:port" in p2p mode), or
     * its key in the metadata server of @metadata_uri. Default: none (the
     * host checks only). */
    const char *peer;
    /* A metadata server to check (reachable, authenticated) and to look
     * the peer up in ("http://host:port/metadata", "etcd://...",
     * "redis://..."). Default: none (p2p). */
    const char *metadata_uri;
    /* The host an engine here would listen on and advertise (an
     * engine's local_host). Default "127.0.0.1", an engine's default. */
    const char *local_host;
    /* The transports to check (KVT_TRANSPORT_*), as an engine's
     * `transports`: one named here but not built in fails its check.
     * Default KVT_TRANSPORT_ALL (those built in, ucx only when named). */
    uint32_t transports;
    /* The auth token, as an engine's auth_token (NULL or "": none).
     * Default: KVT_AUTH_TOKEN from the environment. */
    const char *auth_token;
    /* Memory kinds to check, 1 << kvt_mem_kind_t: device memory named
     * here fails when it cannot be registered. Default: host memory, and
     * device memory when a driver is found. */
    uint32_t mem_kinds;
    /* Bound on each network step, in milliseconds. Default 3000. */
    uint64_t timeout_ms;
    /* Bytes moved per transport to measure bandwidth. Default 64 MiB;
     * 0: verify only. */
    uint64_t probe_bytes;
    /* Peers an engine here will open, for the descriptor limit. Default
     * 64. */
    uint32_t peers_expected;
} kvt_doctor_params_t;

typedef struct kvt_doctor_report *kvt_doctor_report_h;

/*
 * kvt_doctor_run() - run the checks @params asks for and return their
 * report in *report_p (free it with kvt_doctor_free()).
 *
 * Starts engines of its own (on @local_host, port 0; p2p, so nothing is
 * published to a metadata server) and stops them before returning. The
 * peer checks run in a child process forked at the start (before the
 * host checks may initialise a device driver) that streams each result
 * back: a transport stuck in the network cannot hold the caller, and a
 * step with no word for twice the timeout plus a second is killed and
 * named. The child keeps no descriptor of the caller's open and dies
 * with it; a process that used the CUDA driver before the call gets its
 * device pairs skipped, saying why. Each network step is bounded by the
 * timeout, so the whole run takes at most a few timeouts. What kvt logs
 * on the calling thread during the checks is captured into their
 * details instead of written (its engines' own threads still log).
 * Blocking; runs may be made from several threads at once. Returns
 * KVT_OK (whatever the checks found: see kvt_doctor_worst()),
 * KVT_ERR_INVALID_PARAM (NULL @report_p; an unknown field bit;
 * transports 0; mem_kinds 0 or with unknown bits; a timeout of 0 or over
 * 600000 ms; probe_bytes over 2^40), KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_doctor_run(const kvt_doctor_params_t *params,
                                    kvt_doctor_report_h *report_p);

/* The number of checks in @report (0 for NULL). Thread-safe. */
KVT_API size_t kvt_doctor_count(kvt_doctor_report_h report);

/* Check @index of @report, in the order run; NULL past the end. The
 * pointer lives as long as the report. Thread-safe. */
KVT_API const kvt_doctor_check_t *kvt_doctor_check(kvt_doctor_report_h report,
                                                   size_t index);

/* The worst level of any check (KVT_DOCTOR_SKIP counts as OK);
 * KVT_DOCTOR_OK for NULL. Thread-safe. */
KVT_API kvt_doctor_level_t kvt_doctor_worst(kvt_doctor_report_h report);

/*
 * kvt_doctor_json() - the report as one JSON object ({"ok": bool,
 * "worst": "ok|warn|fail", "checks": [{"id", "level", "status",
 * "detail", "fix", "ms", "mbps", "lat_us"}, ...]}; numbers that were not
 * measured are null), into a malloc'd NUL-terminated string *json_p that
 * the caller frees with free(). Returns KVT_OK, KVT_ERR_INVALID_PARAM,
 * KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_doctor_json(kvt_doctor_report_h report, char **json_p);

/* Free a report; NULL does nothing. */
KVT_API void kvt_doctor_free(kvt_doctor_report_h report);

/*
 * kvt_doctor_scratch() - allocate and register on @engine a scratch
 * region of @length bytes (at least 64 KiB; 0: 8 MiB) that the doctors
 * of peers may write into and read back (marked as such in its first
 * 4 KiB, which they leave alone). *addr_p, when not NULL, is set to it.
 * Free it with kvt_mem_free(), or let kvt_engine_destroy() do it.
 * Returns what kvt_mem_alloc() returns, or KVT_ERR_INVALID_PARAM for a
 * length under 64 KiB.
 */
KVT_API kvt_status_t kvt_doctor_scratch(kvt_engine_h engine, size_t length,
                                        void **addr_p);

#ifdef __cplusplus
}
#endif
#endif
