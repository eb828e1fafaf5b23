/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the connector's control-message decoders: whatever a
 * peer sends as a notification goes through kvtc__cm_parse() and then the
 * decoder of its type; none may read out of bounds, leak or accept an
 * inconsistent message.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "connector/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvtc__cm_t m;
    char why[256];

    if (kvtc__cm_parse(data, size, &m) != KVT_OK)
        return 0;
    switch (m.type) {
    case KVTC__CM_HELLO: {
        kvtc__hello_t h;
        kvtc__layout_t l;
        if (kvtc__cm_hello_decode(&m, &h, &l, why, sizeof(why)) == KVT_OK)
            kvtc__layout_clear(&l);
        break;
    }
    case KVTC__CM_ROOM: {
        kvtc__room_msg_t r;
        if (kvtc__cm_room_decode(&m, &r) == KVT_OK) {
            for (uint64_t i = 0; i < r.nblocks; i++)
                if (r.ids[i] == 0xdeadbeef)
                    break;
            kvtc__room_msg_clear(&r);
        }
        break;
    }
    case KVTC__CM_FRAG: {
        kvtc__frag_t f;
        if (kvtc__cm_frag_decode(&m, &f) == KVT_OK &&
            (uint64_t)f.offset + f.len > f.total)
            abort();
        break;
    }
    default: {
        kvtc__status_msg_t s;
        kvtc__cm_status_decode(&m, &s);
        break;
    }
    }
    return 0;
}
