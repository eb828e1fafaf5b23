/* SPDX-License-Identifier: Apache-2.0 */
/* kvt info: what this build of the library has. */
#include <stdio.h>
#include <string.h>

#include <kvt/kvt.h>

#include "cli.h"

static void kinds(uint32_t bits, char *out, size_t cap)
{
    static const char *const names[KVT_MEM_KINDS] = {"host", "cuda"};
    size_t n = 0;

    out[0] = '\0';
    for (unsigned k = 0; k < KVT_MEM_KINDS && n < cap; k++)
        if (bits & (1u << k))
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "+" : "",
                                  names[k]);
}

int kvt_cmd_info(int argc, char **argv)
{
    const kvt_version_t *v = kvt_version();
    kvt_transport_info_t t[16];
    size_t n = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: kvt info\n"
                   "prints the version, the wire protocol, the transports "
                   "and memory kinds built in and usable here\n");
            return 0;
        }
        fprintf(stderr,
                "kvt info: unknown argument '%s' (kvt info takes "
                "none; --help)\n",
                argv[i]);
        return 2;
    }
    printf("kvt %s\n", v->string);
    printf("wire protocol: %u.%u\n", v->wire_major, v->wire_minor);
    if (kvt_transports(t, 16, &n) == KVT_OK) {
        printf("transports:");
        for (size_t i = 0; i < n && i < 16; i++) {
            char l[32], r[32];
            kinds(t[i].local_mem, l, sizeof(l));
            kinds(t[i].remote_mem, r, sizeof(r));
            printf("%s %s (%s%s memory here, %s there, priority %d)",
                   i ? "," : "", t[i].name,
                   (t[i].flags & KVT_TRANSPORT_F_SAME_HOST) ? "same host, "
                                                            : "",
                   l, r, t[i].priority);
        }
        printf("\n");
    }
    {
        kvt_mem_domain_info_t d[8];
        size_t nd = 0;
        if (kvt_mem_domains(d, 8, &nd) == KVT_OK) {
            printf("memory:");
            for (size_t i = 0; i < nd && i < 8; i++) {
                if (d[i].kind == KVT_MEM_HOST)
                    printf("%s %s", i ? "," : "", d[i].name);
                else
                    printf("%s %s (built; %s)", i ? "," : "", d[i].name,
                           d[i].detail);
            }
            printf("\n");
        }
    }
    printf("metadata backends: %s\n", kvt_meta_backends());
    printf("metadata server (kvt metad): %s\n",
           kvt_metad_available() ? "yes" : "no");
    return 0;
}
