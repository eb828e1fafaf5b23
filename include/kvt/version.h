/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_VERSION_H
#define KVT_VERSION_H

#include <kvt/defs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version and the wire protocol it speaks. */
typedef struct {
    unsigned major, minor, patch; /* of the library */
    unsigned wire_major;          /* peers of another major are refused */
    unsigned wire_minor;
    const char *string; /* "0.2.0", static */
} kvt_version_t;

/*
 * kvt_version() - the version of the library actually loaded (which may
 * differ from the KVT_VERSION_* macros a program was compiled with) and of
 * its wire protocol. Returns a static object; never NULL. Thread-safe,
 * does not block.
 */
KVT_API const kvt_version_t *kvt_version(void);

#ifdef __cplusplus
}
#endif
#endif
