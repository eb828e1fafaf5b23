/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt metad: the metadata and PD bootstrap server in the foreground, until
 * SIGINT or SIGTERM. docs/metadata.md describes the routes.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <kvt/kvt.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvt metad [--port N] [--host H] [--threads N]\n"
            "                 [--max-body SIZE] [--max-bytes SIZE]\n"
            "                 [--max-connections N] [--header-timeout S]\n"
            "                 [--body-timeout S]\n"
            "                 [--auth-token T] [--auth-reads]\n"
            "\n"
            "Serve Mooncake's /metadata?key= routes, SGLang's /route "
            "bootstrap routes,\n"
            "/health and /metrics over HTTP until SIGINT or SIGTERM.\n"
            "\n"
            "  --port N             TCP port (default 8080; 0 picks one)\n"
            "  --host H             address to listen on (default 127.0.0.1;\n"
            "                       0.0.0.0 for every address)\n"
            "  --threads N          server threads (default 2)\n"
            "  --max-body SIZE      largest request body (default 16M)\n"
            "  --max-bytes SIZE     bytes kept at most, bodies being read\n"
            "                       included (default 1G)\n"
            "  --max-connections N  connections kept; one more drops the one\n"
            "                       idle the longest (default 1000)\n"
            "  --header-timeout S   seconds to send a whole request header\n"
            "                       (default 5)\n"
            "  --body-timeout S     seconds to send a whole body, or to read\n"
            "                       an answer (default 30)\n"
            "  --auth-token T       writes (PUT, DELETE) must prove this\n"
            "                       shared secret (default: KVT_AUTH_TOKEN;\n"
            "                       docs/security.md)\n"
            "  --auth-reads         reads must prove it too\n");
}

/* Parse seconds (decimals allowed) into 1..3600000 ms. 0 on success. */
static int parse_ms(const char *s, uint32_t *ms_p)
{
    char *end;
    double v = strtod(s, &end);

    if (*s == '\0' || *end != '\0' || !(v >= 0.001 && v <= 3600.0))
        return -1;
    *ms_p = (uint32_t)(v * 1000.0 + 0.5);
    return 0;
}

/*
 * Each connection takes a descriptor: raise the soft limit towards the
 * hard one so that the cap can be reached, or lower the cap to what the
 * limit allows (with room for the listener, logs and libraries).
 */
static void fit_descriptors(kvt_metad_params_t *p)
{
    unsigned want =
        (p->field_mask & KVT_METAD_PARAM_MAX_CONNS) ? p->max_conns : 1000;
    rlim_t need = (rlim_t)want + 64;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    if (rl.rlim_cur <= 128) {
        fprintf(stderr, "kvt metad: only %lu descriptors allowed\n",
                (unsigned long)rl.rlim_cur);
        return;
    }
    p->max_conns = (unsigned)(rl.rlim_cur - 64);
    p->field_mask |= KVT_METAD_PARAM_MAX_CONNS;
    fprintf(stderr,
            "kvt metad: %u connections at most (RLIMIT_NOFILE is %lu)\n",
            p->max_conns, (unsigned long)rl.rlim_cur);
}

/* Parse a port: 0..65535, digits only. 0 on success. */
static int parse_port(const char *s, uint16_t *port_p)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);

    if (*s == '\0' || *end != '\0' || v > 65535)
        return -1;
    *port_p = (uint16_t)v;
    return 0;
}

int kvt_cmd_metad(int argc, char **argv)
{
    kvt_metad_params_t p = {0};
    const char *host = "127.0.0.1", *v;
    uint16_t port = 8080;
    uint64_t size;
    kvt_metad_h md;
    sigset_t sigs;
    int sig = 0;

    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv[i], "help") || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if ((v = cli_opt(argc, argv, &i, "port")) != NULL) {
            if (parse_port(v, &port) != 0)
                goto bad;
        } else if ((v = cli_opt(argc, argv, &i, "host")) != NULL) {
            host = v;
        } else if ((v = cli_opt(argc, argv, &i, "threads")) != NULL) {
            if (cli_parse_size(v, &size) != 0 || size < 1 || size > 64)
                goto bad;
            p.threads = (unsigned)size;
            p.field_mask |= KVT_METAD_PARAM_THREADS;
        } else if ((v = cli_opt(argc, argv, &i, "max-body")) != NULL) {
            if (cli_parse_size(v, &size) != 0 || size > KVT_METAD_MAX_BODY)
                goto bad;
            p.max_body = (size_t)size;
            p.field_mask |= KVT_METAD_PARAM_MAX_BODY;
        } else if ((v = cli_opt(argc, argv, &i, "auth-token")) != NULL) {
            p.auth_token = v;
            p.field_mask |= KVT_METAD_PARAM_AUTH_TOKEN;
        } else if (cli_flag(argv[i], "auth-reads")) {
            p.auth_reads = 1;
            p.field_mask |= KVT_METAD_PARAM_AUTH_READS;
        } else if ((v = cli_opt(argc, argv, &i, "max-bytes")) != NULL) {
            if (cli_parse_size(v, &size) != 0)
                goto bad;
            p.max_bytes = (size_t)size;
            p.field_mask |= KVT_METAD_PARAM_MAX_BYTES;
        } else if ((v = cli_opt(argc, argv, &i, "max-connections")) != NULL) {
            if (cli_parse_size(v, &size) != 0 || size < 1 || size > 1000000)
                goto bad;
            p.max_conns = (unsigned)size;
            p.field_mask |= KVT_METAD_PARAM_MAX_CONNS;
        } else if ((v = cli_opt(argc, argv, &i, "header-timeout")) != NULL) {
            if (parse_ms(v, &p.header_timeout_ms) != 0)
                goto bad;
            p.field_mask |= KVT_METAD_PARAM_HEADER_TIMEOUT;
        } else if ((v = cli_opt(argc, argv, &i, "body-timeout")) != NULL) {
            if (parse_ms(v, &p.body_timeout_ms) != 0)
                goto bad;
            p.field_mask |= KVT_METAD_PARAM_BODY_TIMEOUT;
        } else {
            fprintf(stderr, "kvt metad: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "kvt metad: bad value for '%s'\n", argv[i]);
        return 2;
    }

    /* Block the signals before the server threads start, so that they
     * inherit the mask and only sigwait() below sees them. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    fit_descriptors(&p);
    p.field_mask |= KVT_METAD_PARAM_HOST | KVT_METAD_PARAM_PORT;
    p.host = host;
    p.port = port;
    if (kvt_metad_start(&p, &md) != KVT_OK) {
        fprintf(stderr,
                "kvt metad: cannot start on %s:%u (see the log "
                "above)\n",
                host, port);
        return 1;
    }
    printf("metad: listening on http://%s:%u\n", host, kvt_metad_port(md));
    {
        const char *env = getenv("KVT_AUTH_TOKEN");
        int token = (p.field_mask & KVT_METAD_PARAM_AUTH_TOKEN)
                        ? p.auth_token != NULL && *p.auth_token
                        : env != NULL && *env;
        printf("metad: %s\n", !token ? "no auth token: anyone may write"
                              : p.auth_reads
                                  ? "reads and writes need the auth token"
                                  : "writes need the auth token");
    }
    fflush(stdout);
    while (sigwait(&sigs, &sig) != 0)
        ;
    kvt_metad_stop(md);
    printf("metad: stopped (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return 0;
}
