/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_WIRE_TEST_H
#define KVT_TESTS_WIRE_TEST_H

/* Frames as a peer writing the wire by hand (hostile tests, fuzz
 * harnesses) builds them. Needs the internal headers (kvt_internal). */
#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

/* A frame header of this build's version, no flags, into @out; returns
 * its length (KVT_WIRE_HDR_LEN). */
static inline size_t kvt_test_hdr(uint8_t *out, uint8_t type, uint32_t body,
                                  uint64_t payload, uint64_t req_id)
{
    kvt__wire_hdr_t h = {.ver_major = KVT_WIRE_VERSION_MAJOR,
                         .ver_minor = KVT_WIRE_VERSION_MINOR,
                         .type = type,
                         .body_len = body,
                         .payload_len = payload,
                         .req_id = req_id};
    kvt__wire_hdr_encode(&h, out);
    return KVT_WIRE_HDR_LEN;
}

#endif
