/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>

#include <kvt/kvt.h>

#include "cli.h"
#include "core/wire.h"
#include "meta/meta.h"

int kvt_cmd_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kvt %d.%d.%d\n", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
           KVT_VERSION_PATCH);
    printf("wire protocol: %d.%d\n", KVT_WIRE_VERSION_MAJOR,
           KVT_WIRE_VERSION_MINOR);
    printf("transports: tcp, shm (same host: cross-memory attach and "
           "mapped kvt_mem_alloc memory)\n");
    printf("metadata backends: %s\n", kvt__meta_backends_built());
    printf("metadata server (kvt metad): %s\n",
           kvt__meta_server_built() ? "yes" : "no");
    return 0;
}
