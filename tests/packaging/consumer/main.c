/* SPDX-License-Identifier: Apache-2.0 */
/* Uses an installed kvt: its version, an engine, its metrics. */
#include <stdio.h>
#include <string.h>

#include <kvt/kvt.h>

int main(void)
{
    const kvt_version_t *v = kvt_version();
    kvt_engine_stats_t s = {.version = KVT_STATS_VERSION};
    kvt_engine_h e = NULL;

    if (v->major != KVT_VERSION_MAJOR || v->minor != KVT_VERSION_MINOR) {
        fprintf(stderr, "headers %d.%d, library %s\n", KVT_VERSION_MAJOR,
                KVT_VERSION_MINOR, v->string);
        return 1;
    }
    if (kvt_engine_create(NULL, &e) != KVT_OK ||
        kvt_engine_stats(e, &s) != KVT_OK || s.ntransports == 0)
        return 1;
    kvt_engine_destroy(e);
    printf("kvt %s\n", v->string);
    return 0;
}
