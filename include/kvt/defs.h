/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_DEFS_H
#define KVT_DEFS_H

#if defined(__GNUC__) && !defined(KVT_STATIC_ONLY)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 2
#define KVT_VERSION_PATCH 0

#endif
