/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host memory domain: what the process can read and write itself.
 * It detects nothing (it is what no other domain claims) and takes any
 * device number for host memory ("cpu:0" in Mooncake's locations) as
 * none.
 */
#include "mem/md.h"

KVT_MEM_DOMAIN_REGISTER(host, {
                                  .name = "host",
                                  .kind = KVT_MEM_HOST,
                              });
