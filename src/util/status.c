/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The messages and names of the statuses (the X-macro table of
 * <kvt/status.h>): in util, as every layer reports them, log.c too.
 */
#include <kvt/status.h>

const char *kvt_status_str(kvt_status_t status)
{
    switch (status) {
#define KVT__STATUS_STR(name, value, msg)                                      \
    case KVT_##name:                                                           \
        return msg;
        KVT_STATUS_MAP(KVT__STATUS_STR)
#undef KVT__STATUS_STR
    }
    return "unknown status";
}

const char *kvt_status_name(kvt_status_t status)
{
    switch (status) {
#define KVT__STATUS_NAME(name, value, msg)                                     \
    case KVT_##name:                                                           \
        return "KVT_" #name;
        KVT_STATUS_MAP(KVT__STATUS_NAME)
#undef KVT__STATUS_NAME
    }
    return "KVT_UNKNOWN";
}
