/* SPDX-License-Identifier: Apache-2.0 */
/* The kvt command: one binary, several sub-commands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"bench", kvt_cmd_bench, "measure transfers (target and initiator)"},
    {"info", kvt_cmd_info, "print version and build options"},
    {"doctor", kvt_cmd_doctor, "check this host and a peer before the first "
                               "transfer"},
    {"demo", kvt_cmd_demo, "run a prefill/decode demo on this machine"},
    {"metad", kvt_cmd_metad, "metadata and PD bootstrap HTTP server"},
    {"stats", kvt_cmd_stats, "live view of processes' /metrics"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvt <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n'kvt <command> --help' describes a command's options.\n");
}

const char *cli_opt(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    size_t n = strlen(name);

    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0)
        return NULL;
    if (a[2 + n] == '=')
        return a + 3 + n;
    if (a[2 + n] == '\0' && *i + 1 < argc) {
        (*i)++;
        return argv[*i];
    }
    return NULL;
}

int cli_flag(const char *arg, const char *name)
{
    return strncmp(arg, "--", 2) == 0 && strcmp(arg + 2, name) == 0;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        v *= 1048576.0;
        end++;
        break;
    case 'g':
    case 'G':
        v *= 1073741824.0;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || cli_flag(argv[1], "help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (strcmp(argv[1], cmds[i].name) == 0)
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvt: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
