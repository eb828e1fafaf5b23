/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the frame parser: a header, then the body parsed as the
 * header's type says (piece table, failure list, HELLO), exactly as the
 * TCP transport does before it touches memory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

static void fail_cb(void *arg, uint32_t index, kvt_status_t status)
{
    int32_t *st = arg;
    st[index] = status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvt__wire_piece_t pieces[KVT_WIRE_MAX_PIECES];
    static int32_t st[KVT_WIRE_MAX_PIECES];
    kvt__wire_hdr_t h;
    kvt__wire_hello_t hello;
    const uint8_t *body;
    size_t blen;
    uint32_t n, segs;

    if (kvt__wire_hdr_decode(data, size, &h) != KVT_OK)
        return 0;
    body = data + KVT_WIRE_HDR_LEN;
    blen = size - KVT_WIRE_HDR_LEN;
    if (blen > h.body_len)
        blen = h.body_len;
    switch (h.type) {
    case KVT_WIRE_WRITE:
    case KVT_WIRE_READ:
        if (kvt__wire_pieces_decode(body, blen, h.payload_len, pieces,
                                    KVT_WIRE_MAX_PIECES, &n, &segs) == KVT_OK) {
            uint64_t total = 0;
            for (uint32_t i = 0; i < n; i++) {
                /* Invariants the transport relies on. */
                if (pieces[i].len == 0 || pieces[i].count == 0 ||
                    (pieces[i].count > 1 && pieces[i].stride < pieces[i].len))
                    abort();
                total += (uint64_t)pieces[i].len * pieces[i].count;
            }
            if (total != h.payload_len || segs > KVT_WIRE_MAX_SEGS)
                abort();
        }
        break;
    case KVT_WIRE_WRITE_ACK:
    case KVT_WIRE_READ_RESP:
        /* A piece count the failure list is checked against; the array
         * holds the largest one a frame can have. */
        kvt__wire_fails_decode(body, blen,
                               (uint32_t)(h.req_id % (KVT_WIRE_MAX_PIECES + 1)),
                               fail_cb, st);
        break;
    case KVT_WIRE_HELLO:
        if (kvt__wire_hello_decode(body, blen, &hello) == KVT_OK &&
            strlen(hello.name) > KVT_WIRE_NAME_MAX)
            abort();
        break;
    default:
        break;
    }
    return 0;
}
