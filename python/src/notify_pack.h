/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_PYTHON_NOTIFY_PACK_H
#define KVT_PYTHON_NOTIFY_PACK_H

/*
 * How a (name, msg) pair travels in one kvt notification (notify.c says
 * why): "\0MCN" | name length (u16, little endian) | name | msg. Pure C,
 * without Python, so that a fuzz target reaches the decoding of what any
 * peer may send.
 */
#include <stddef.h>
#include <string.h>

#include <kvt/transfer.h>

#define KVTPY_NOTIFY_MAGIC "\0MCN"
#define KVTPY_NOTIFY_MAGIC_LEN 4
#define KVTPY_NOTIFY_HDR_LEN (KVTPY_NOTIFY_MAGIC_LEN + 2)

/* Where name and msg lie in a received payload of @len bytes (more than
 * KVT_NOTIFY_MAX counts as KVT_NOTIFY_MAX). Returns 1 for a packed pair;
 * 0 for a payload without the marker (or with a name longer than what
 * follows): then the payload is the msg, and the name is the sender's. */
static inline int kvtpy_notify_unpack(const char *data, size_t len,
                                      size_t *name_off, size_t *name_len,
                                      size_t *msg_off, size_t *msg_len)
{
    size_t nlen;

    if (len > KVT_NOTIFY_MAX)
        len = KVT_NOTIFY_MAX;
    if (len >= KVTPY_NOTIFY_HDR_LEN &&
        memcmp(data, KVTPY_NOTIFY_MAGIC, KVTPY_NOTIFY_MAGIC_LEN) == 0) {
        nlen = (size_t)(unsigned char)data[4] | (size_t)(unsigned char)data[5]
                                                    << 8;
        if (nlen <= len - KVTPY_NOTIFY_HDR_LEN) {
            *name_off = KVTPY_NOTIFY_HDR_LEN;
            *name_len = nlen;
            *msg_off = KVTPY_NOTIFY_HDR_LEN + nlen;
            *msg_len = len - KVTPY_NOTIFY_HDR_LEN - nlen;
            return 1;
        }
    }
    *name_off = *name_len = 0;
    *msg_off = 0;
    *msg_len = len;
    return 0;
}

#endif
