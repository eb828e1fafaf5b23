/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The KVT_* settings of the environment, one rule for all: a setting that
 * is set but not valid is refused, naming the variable, the value and what
 * it takes, and kvt_engine_create() fails with KVT_ERR_INVALID_PARAM; an
 * unset or empty one takes its default. Checked at every engine creation,
 * before anything is built, so that a typo is found at start-up rather
 * than by its effect later (KVT_LOG, read by the logger before any call
 * can fail, falls back to warn meanwhile).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/engine_int.h"
#include "util/log.h"

kvt_status_t kvt__env_seconds_ms(const char *name, double lo_s, double hi_s,
                                 uint64_t *ms_p)
{
    const char *v = getenv(name);
    char *end;
    double s;

    *ms_p = 0;
    if (v == NULL || *v == '\0')
        return KVT_OK;
    errno = 0;
    s = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(s >= lo_s && s <= hi_s)) {
        KVT_LOG_E("%s='%s' is not a number of seconds in [%g, %g]: unset it "
                  "or give one",
                  name, v, lo_s, hi_s);
        return KVT_ERR_INVALID_PARAM;
    }
    *ms_p = (uint64_t)(s * 1000.0);
    return KVT_OK;
}

/* Whether @name is unset, empty or one of the |-separated @words
 * (case-insensitive); logs the refusal otherwise. */
static int one_of(const char *name, const char *words)
{
    const char *v = getenv(name), *w = words;

    if (v == NULL || *v == '\0')
        return 1;
    while (*w != '\0') {
        size_t n = strcspn(w, "|");
        if (strlen(v) == n && strncasecmp(v, w, n) == 0)
            return 1;
        w += n + (w[n] == '|');
    }
    {
        char shown[128];
        size_t k = 0;
        for (w = words; *w != '\0' && k + 3 < sizeof(shown); w++) {
            if (*w == '|') {
                shown[k++] = ',';
                shown[k++] = ' ';
            } else {
                shown[k++] = *w;
            }
        }
        shown[k] = '\0';
        KVT_LOG_E("%s='%s' is not one of %s: unset it or give one of those",
                  name, v, shown);
    }
    return 0;
}

static int port_number(const char *name)
{
    const char *v = getenv(name);
    char *end;
    unsigned long p;

    if (v == NULL || *v == '\0')
        return 1;
    errno = 0;
    p = strtoul(v, &end, 10);
    if (errno == 0 && end != v && *end == '\0' && v[0] != '-' && p <= 65535)
        return 1;
    KVT_LOG_E("%s='%s' is not a port (0..65535; 0 picks a free one): unset "
              "it or give one",
              name, v);
    return 0;
}

kvt_status_t kvt__env_check(void)
{
    uint64_t ms;
    int ok = 1;

    ok &= one_of("KVT_LOG", "error|warn|info|debug|trace|off|none");
    ok &=
        kvt__env_seconds_ms("KVT_TRANSFER_TIMEOUT", 0.001, 1e7, &ms) == KVT_OK;
    ok &= kvt__env_seconds_ms("MC_TRANSFER_TIMEOUT", 0.001, 1e7, &ms) == KVT_OK;
    ok &= kvt__env_seconds_ms("KVT_METADATA_TTL", 2, 3600, &ms) == KVT_OK;
    ok &= one_of("KVT_METRICS", "on|off|1|0");
    ok &= port_number("KVT_METRICS_PORT");
    ok &= one_of("KVT_SHM_PTRACER_ANY", "0|1");
    return ok ? KVT_OK : KVT_ERR_INVALID_PARAM;
}
