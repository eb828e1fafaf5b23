/* SPDX-License-Identifier: Apache-2.0 */
/* kvt doctor: what is wrong before the first transfer (docs/doctor.md). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvt/kvt.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvt doctor [PEER] [options]     check this host (and a "
            "peer)\n"
            "       kvt doctor --serve [options]    be a peer to check: an "
            "engine with a scratch region\n"
            "\n"
            "PEER is a segment name (host:port in p2p mode) or, with "
            "--metadata, its key there.\n"
            "\n"
            "options:\n"
            "  --metadata URI      check this metadata server and look PEER "
            "up in it\n"
            "  --host H            the address an engine here listens on and "
            "advertises\n"
            "                      (default 127.0.0.1, an engine's "
            "default)\n"
            "  --transports LIST   tcp,shm,ucx (default: those built in; "
            "ucx only when named)\n"
            "  --auth-token T      the shared secret (default: "
            "KVT_AUTH_TOKEN)\n"
            "  --mem KINDS         host,cuda: memory kinds to check "
            "(default: host, and cuda\n"
            "                      when a driver is found)\n"
            "  --timeout S         bound on each network step, seconds "
            "(default 3)\n"
            "  --probe SIZE        bytes moved per transport for bandwidth "
            "(default 64M; 0: none)\n"
            "  --peers N           peers an engine will open, for the "
            "descriptor limit (default 64)\n"
            "  --json              one JSON object instead of lines\n"
            "with --serve: --host, --port P, --transports, --auth-token, "
            "--metadata,\n"
            "  --scratch SIZE (default 8M); it runs until interrupted.\n"
            "\n"
            "Exit status: 0 when no check failed (warnings allowed), 1 when "
            "one did, 2 for bad usage.\n");
}

/* Be a peer to check until SIGINT or SIGTERM. */
static int serve(kvt_engine_params_t *ep, uint64_t scratch)
{
    kvt_engine_h e;
    kvt_status_t st;
    sigset_t set;
    void *addr = NULL;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    st = kvt_engine_create(ep, &e);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt doctor --serve: cannot create the engine: %s\n",
                kvt_status_str(st));
        return 1;
    }
    st = kvt_doctor_scratch(e, (size_t)scratch, &addr);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt doctor --serve: no scratch region: %s\n",
                kvt_status_str(st));
        kvt_engine_destroy(e);
        return 1;
    }
    printf("serving %s (scratch region of %llu bytes at %p); "
           "`kvt doctor %s` checks it; Ctrl-C ends\n",
           kvt_engine_segment_name(e), (unsigned long long)scratch, addr,
           kvt_engine_segment_name(e));
    fflush(stdout);
    sigwait(&set, &sig);
    kvt_engine_destroy(e);
    return 0;
}

static void print_plain(kvt_doctor_report_h r)
{
    static const char *const lv[] = {"ok", "WARN", "FAIL", "skip"};
    size_t n = kvt_doctor_count(r), cnt[4] = {0};

    for (size_t i = 0; i < n; i++) {
        const kvt_doctor_check_t *c = kvt_doctor_check(r, i);
        cnt[c->level]++;
        printf("%-5s %-24s %s", lv[c->level], c->id, c->detail);
        if (c->mbps >= 0 || c->lat_us >= 0) {
            printf(" [");
            if (c->mbps >= 0)
                printf("%.0f MB/s writing", c->mbps);
            if (c->lat_us >= 0)
                printf("%s%.1f us per 64-byte read", c->mbps >= 0 ? ", " : "",
                       c->lat_us);
            printf("]");
        } else if (c->ms >= 0) {
            printf(" [%.1f ms]", c->ms);
        }
        printf("\n");
        if (c->fix != NULL && c->level != KVT_DOCTOR_OK)
            printf("%-5s %-24s fix: %s\n", "", "", c->fix);
    }
    printf("%zu checks: %zu ok, %zu warnings, %zu failed, %zu skipped\n", n,
           cnt[0], cnt[1], cnt[2], cnt[3]);
}

int kvt_cmd_doctor(int argc, char **argv)
{
    kvt_doctor_params_t p = {0};
    kvt_engine_params_t ep = {0};
    kvt_doctor_report_h r;
    kvt_status_t st;
    uint64_t scratch = 8u << 20;
    int json = 0, srv = 0, rc;

    for (int i = 1; i < argc; i++) {
        const char *v;
        char *end;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (cli_flag(argv[i], "json")) {
            json = 1;
        } else if (cli_flag(argv[i], "serve")) {
            srv = 1;
        } else if ((v = cli_opt(argc, argv, &i, "metadata")) != NULL) {
            p.field_mask |= KVT_DOCTOR_PARAM_METADATA_URI;
            p.metadata_uri = v;
            ep.field_mask |= KVT_ENGINE_PARAM_METADATA_URI;
            ep.metadata_uri = v;
        } else if ((v = cli_opt(argc, argv, &i, "host")) != NULL) {
            p.field_mask |= KVT_DOCTOR_PARAM_LOCAL_HOST;
            p.local_host = v;
            ep.field_mask |= KVT_ENGINE_PARAM_LOCAL_HOST;
            ep.local_host = v;
        } else if ((v = cli_opt(argc, argv, &i, "port")) != NULL) {
            unsigned long port = strtoul(v, &end, 10);
            if (*end != '\0' || port > 65535) {
                fprintf(stderr, "kvt doctor: bad --port '%s'\n", v);
                return 2;
            }
            ep.field_mask |= KVT_ENGINE_PARAM_PORT;
            ep.port = (uint16_t)port;
        } else if ((v = cli_opt(argc, argv, &i, "transports")) != NULL) {
            if (kvt_transport_bits(v, &p.transports) != KVT_OK) {
                fprintf(stderr,
                        "kvt doctor: bad --transports '%s' (a list of tcp, "
                        "shm, ucx, all)\n",
                        v);
                return 2;
            }
            p.field_mask |= KVT_DOCTOR_PARAM_TRANSPORTS;
            ep.field_mask |= KVT_ENGINE_PARAM_TRANSPORTS;
            ep.transports = p.transports;
        } else if ((v = cli_opt(argc, argv, &i, "auth-token")) != NULL) {
            p.field_mask |= KVT_DOCTOR_PARAM_AUTH_TOKEN;
            p.auth_token = v;
            ep.field_mask |= KVT_ENGINE_PARAM_AUTH_TOKEN;
            ep.auth_token = v;
        } else if ((v = cli_opt(argc, argv, &i, "mem")) != NULL) {
            if (kvt_mem_kind_bits(v, &p.mem_kinds) != KVT_OK) {
                fprintf(stderr,
                        "kvt doctor: bad --mem '%s' (a list of host, "
                        "cuda)\n",
                        v);
                return 2;
            }
            p.field_mask |= KVT_DOCTOR_PARAM_MEM_KINDS;
        } else if ((v = cli_opt(argc, argv, &i, "timeout")) != NULL) {
            double s = strtod(v, &end);
            if (*end != '\0' || !(s > 0) || s > 600) {
                fprintf(stderr,
                        "kvt doctor: bad --timeout '%s' (seconds, "
                        "up to 600)\n",
                        v);
                return 2;
            }
            p.field_mask |= KVT_DOCTOR_PARAM_TIMEOUT;
            p.timeout_ms = (uint64_t)(s * 1000 + 0.5);
            if (p.timeout_ms == 0)
                p.timeout_ms = 1;
        } else if ((v = cli_opt(argc, argv, &i, "probe")) != NULL) {
            if (cli_parse_size(v, &p.probe_bytes) != 0) {
                fprintf(stderr, "kvt doctor: bad --probe '%s'\n", v);
                return 2;
            }
            p.field_mask |= KVT_DOCTOR_PARAM_PROBE_BYTES;
        } else if ((v = cli_opt(argc, argv, &i, "scratch")) != NULL) {
            if (cli_parse_size(v, &scratch) != 0 || scratch < (64u << 10)) {
                fprintf(stderr,
                        "kvt doctor: bad --scratch '%s' (at least "
                        "64K)\n",
                        v);
                return 2;
            }
        } else if ((v = cli_opt(argc, argv, &i, "peers")) != NULL) {
            unsigned long n = strtoul(v, &end, 10);
            if (*end != '\0' || n == 0 || n > 1000000) {
                fprintf(stderr, "kvt doctor: bad --peers '%s'\n", v);
                return 2;
            }
            p.field_mask |= KVT_DOCTOR_PARAM_PEERS_EXPECTED;
            p.peers_expected = (uint32_t)n;
        } else if (argv[i][0] != '-' && p.peer == NULL) {
            p.field_mask |= KVT_DOCTOR_PARAM_PEER;
            p.peer = argv[i];
        } else {
            fprintf(stderr,
                    "kvt doctor: unknown argument '%s' (kvt doctor "
                    "--help)\n",
                    argv[i]);
            return 2;
        }
    }
    if (srv)
        return serve(&ep, scratch);
    st = kvt_doctor_run(&p, &r);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt doctor: %s\n", kvt_status_str(st));
        return 2;
    }
    if (json) {
        char *s = NULL;
        if (kvt_doctor_json(r, &s) != KVT_OK) {
            kvt_doctor_free(r);
            fprintf(stderr, "kvt doctor: out of memory\n");
            return 2;
        }
        printf("%s\n", s);
        free(s);
    } else {
        print_plain(r);
    }
    rc = kvt_doctor_worst(r) == KVT_DOCTOR_FAIL ? 1 : 0;
    kvt_doctor_free(r);
    return rc;
}
