/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One rule for the KVT_* settings of the environment (src/core/env.c): a
 * setting that is set but not valid makes kvt_engine_create() fail with
 * KVT_ERR_INVALID_PARAM and a line naming the variable, its value and what
 * it takes; a valid one, an empty one or none creates the engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvt/kvt.h>
#include <kvt/log.h>

#include "kvt_test.h"

static char said[1024];

static void keep(void *arg, kvt_log_level_t level, const char *file, int line,
                 const char *msg)
{
    (void)arg;
    (void)file;
    (void)line;
    if (level == KVT_LOG_LEVEL_ERROR)
        snprintf(said, sizeof(said), "%s", msg);
}

static kvt_status_t create_with(const char *name, const char *value)
{
    kvt_engine_params_t p = {0};
    kvt_engine_h e = NULL;
    kvt_status_t st;

    said[0] = '\0';
    setenv(name, value, 1);
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP;
    st = kvt_engine_create(&p, &e);
    if (st == KVT_OK)
        kvt_engine_destroy(e);
    unsetenv(name);
    return st;
}

KVT_TEST(bad_settings_refused)
{
    static const struct {
        const char *name, *bad, *good, *takes;
    } cases[] = {
        {"KVT_LOG", "bogus", "info", "error, warn, info"},
        {"KVT_TRANSFER_TIMEOUT", "abc", "2.5", "seconds"},
        {"KVT_TRANSFER_TIMEOUT", "-1", "30", "seconds"},
        {"MC_TRANSFER_TIMEOUT", "10s", "10", "seconds"},
        {"KVT_METADATA_TTL", "1", "2", "[2, 3600]"},
        {"KVT_METADATA_TTL", "3601", "3600", "[2, 3600]"},
        {"KVT_METRICS", "maybe", "off", "on, off"},
        {"KVT_METRICS_PORT", "99999", "0", "port"},
        {"KVT_METRICS_PORT", "http", "", "port"},
        {"KVT_SHM_PTRACER_ANY", "yes", "0", "0, 1"},
    };

    kvt_log_set_handler(keep, NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char want[128];
        printf("%s='%s': ", cases[i].name, cases[i].bad);
        CHECK_ST(create_with(cases[i].name, cases[i].bad),
                 KVT_ERR_INVALID_PARAM);
        printf("%s\n", said);
        snprintf(want, sizeof(want), "%s='%s'", cases[i].name, cases[i].bad);
        CHECK(strstr(said, want) != NULL);
        CHECK(strstr(said, cases[i].takes) != NULL);
        CHECK_OK(create_with(cases[i].name, cases[i].good));
    }
    kvt_log_set_handler(NULL, NULL);
}

KVT_TEST_MAIN(KVT_CASE(bad_settings_refused, 60))
