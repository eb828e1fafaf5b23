/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_FUZZ_UTIL_H
#define KVT_TESTS_FUZZ_UTIL_H

/* Shared by the fuzz targets: every rejected input would log a line, so
 * logging is off unless KVT_LOG asks for it. */
#include <stdlib.h>

#include "util/log.h"

static inline void fuzz_quiet(void)
{
    static int done;

    if (done)
        return;
    done = 1;
    kvt__log_init();
    if (getenv("KVT_LOG") == NULL)
        kvt__log_level_cur = -1;
}

#endif
