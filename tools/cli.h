/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TOOLS_CLI_H
#define KVT_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Sub-commands of the kvt tool. Each returns the process exit status. */
int kvt_cmd_bench(int argc, char **argv);
int kvt_cmd_info(int argc, char **argv);
int kvt_cmd_doctor(int argc, char **argv);
int kvt_cmd_demo(int argc, char **argv);
int kvt_cmd_metad(int argc, char **argv);
int kvt_cmd_stats(int argc, char **argv);

/*
 * Option helpers: "--name=value" or "--name value". cli_opt() returns the
 * value when argv[*i] is option @name (advancing *i past a separate
 * value), NULL otherwise.
 */
const char *cli_opt(int argc, char **argv, int *i, const char *name);
int cli_flag(const char *arg, const char *name);
/* Sizes with K/M/G suffixes (powers of 1024). 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);

#endif
