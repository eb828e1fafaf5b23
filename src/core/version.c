/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_version(): the library's version and the wire protocol's.
 */
#include <kvt/version.h>

#include "proto/wire.h"

#define STR_(x) #x
#define STR(x) STR_(x)

const kvt_version_t *kvt_version(void)
{
    static const kvt_version_t v = {
        KVT_VERSION_MAJOR,
        KVT_VERSION_MINOR,
        KVT_VERSION_PATCH,
        KVT_WIRE_VERSION_MAJOR,
        KVT_WIRE_VERSION_MINOR,
        STR(KVT_VERSION_MAJOR) "." STR(KVT_VERSION_MINOR) "." STR(
            KVT_VERSION_PATCH)};
    return &v;
}
