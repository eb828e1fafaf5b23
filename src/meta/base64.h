/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_BASE64_H
#define KVT_META_BASE64_H

/*
 * Standard base64 (RFC 4648, with padding), as etcd's JSON gateway encodes
 * keys and values. Pure functions.
 */
#include <stddef.h>
#include <stdint.h>

/* Characters needed for @n input bytes, without a NUL. */
static inline size_t kvt__b64_enc_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Encode @n bytes into @out (kvt__b64_enc_len(n) + 1 bytes; NUL-terminated).
 * Returns the encoded length. */
size_t kvt__b64_encode(const void *in, size_t n, char *out);

/*
 * Decode @n characters into @out, which has room for n / 4 * 3 bytes.
 * Returns the decoded length, or -1 when @n is not a multiple of 4, a
 * character is outside the alphabet, or padding is misplaced.
 */
long kvt__b64_decode(const char *in, size_t n, uint8_t *out);

#endif
