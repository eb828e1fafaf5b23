/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_UTIL_HASH_H
#define KVT_UTIL_HASH_H

/*
 * FNV-1a (64-bit): a fast, non-cryptographic hash for table buckets and
 * identities that only need to differ, never to resist an adversary.
 * Chain calls from KVT_FNV1A_SEED to hash several pieces as one.
 */
#include <stddef.h>
#include <stdint.h>

#define KVT_FNV1A_SEED 1469598103934665603ull

static inline uint64_t kvt__fnv1a(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;

    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

#endif
