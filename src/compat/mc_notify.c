/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Notifications of Mooncake's C API. Mooncake's carry two strings chosen
 * by the sender, a name and a message; a kvt notification carries one
 * payload and the sender's segment name. The pair travels packed as the
 * Python binding packs it, so the two interoperate:
 *
 *     "\0MCN" | name length (u16, little endian) | name | msg
 *
 * A payload without that marker (from kvt's own API or connector) is
 * handed over as name = the sender's segment name, msg = the payload.
 */
#include "mc_int.h"

#include <stdlib.h>
#include <string.h>

#define MAGIC "\0MCN"
#define MAGIC_LEN 4
#define HDR_LEN (MAGIC_LEN + 2)

/* Notifications taken from kvt's queue per call of kvt_notify_recv(). */
#define RECV_CHUNK 16

size_t kvtmc__notify_pack(const notify_msg_t *m, char *buf)
{
    const char *name = m->name ? m->name : "";
    const char *msg = m->msg ? m->msg : "";
    size_t nlen = strlen(name), mlen = strlen(msg);

    if (nlen > 0xffff || nlen + mlen > KVT_NOTIFY_MAX - HDR_LEN)
        return 0;
    memcpy(buf, MAGIC, MAGIC_LEN);
    buf[4] = (char)(nlen & 0xff);
    buf[5] = (char)(nlen >> 8);
    memcpy(buf + HDR_LEN, name, nlen);
    memcpy(buf + HDR_LEN + nlen, msg, mlen);
    return HDR_LEN + nlen + mlen;
}

static char *dup_bytes(const char *p, size_t n)
{
    char *s = malloc(n + 1);

    if (s != NULL) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* One received notification as Mooncake's pair; -1 without memory. */
static int unpack(const kvt_notify_t *n, notify_msg_t *out)
{
    size_t len = n->length > KVT_NOTIFY_MAX ? KVT_NOTIFY_MAX : n->length;
    size_t nlen;

    if (len >= HDR_LEN && memcmp(n->data, MAGIC, MAGIC_LEN) == 0 &&
        (nlen = (size_t)(unsigned char)n->data[4] |
                (size_t)(unsigned char)n->data[5] << 8) <= len - HDR_LEN) {
        out->name = dup_bytes(n->data + HDR_LEN, nlen);
        out->msg = dup_bytes(n->data + HDR_LEN + nlen, len - HDR_LEN - nlen);
    } else {
        out->name = dup_bytes(n->from, strnlen(n->from, sizeof(n->from)));
        out->msg = dup_bytes(n->data, len);
    }
    return out->name != NULL && out->msg != NULL ? 0 : -1;
}

KVTMC_API int freeNotifsMsgBuf(notify_msg_t *msg, int size)
{
    if (msg == NULL)
        return 0;
    for (int i = 0; i < size; i++) {
        free(msg[i].name);
        free(msg[i].msg);
    }
    free(msg);
    return 0;
}

/*
 * Drain kvt's queue into one malloc()ed array. On running out of memory
 * what was taken is lost (logged), as Mooncake's does.
 */
KVTMC_API notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "getNotifsFromEngine");
    notify_msg_t *out = NULL, *grown;
    kvt_notify_t *chunk = NULL;
    size_t n = 0, cap = 0, got;
    kvt_status_t st;

    if (size == NULL)
        return NULL;
    *size = 0;
    if (e == NULL)
        return NULL;
    chunk = malloc(RECV_CHUNK * sizeof(*chunk));
    if (chunk == NULL)
        goto err_nomem;
    do {
        st = kvt_notify_recv(e->kvt, chunk, RECV_CHUNK, &got, 0);
        if (st != KVT_OK || got == 0)
            break;
        if (n + got > cap) {
            cap = (n + got) * 2;
            grown = realloc(out, cap * sizeof(*out));
            if (grown == NULL)
                goto err_nomem;
            out = grown;
        }
        for (size_t i = 0; i < got; i++) {
            if (unpack(&chunk[i], &out[n]) < 0) {
                n++;
                goto err_nomem;
            }
            n++;
        }
    } while (got == RECV_CHUNK && n < (size_t)INT32_MAX - RECV_CHUNK);
    free(chunk);
    if (n == 0) {
        free(out);
        return NULL;
    }
    *size = (int)n;
    return out;

err_nomem:
    KVTMC__LOG_E("getNotifsFromEngine: out of memory; %zu notifications "
                 "lost",
                 n);
    freeNotifsMsgBuf(out, (int)n);
    free(chunk);
    return NULL;
}

KVTMC_API int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id,
                                notify_msg_t notify_msg)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "genNotifyInEngine");
    kvt_segment_t seg;
    kvt_status_t st;
    size_t len;
    char *buf;
    int rc;

    if (e == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    if (target_id > INT32_MAX ||
        kvtmc__segment(e, (int64_t)target_id, &seg) != KVT_OK) {
        KVTMC__LOG_E("genNotifyInEngine: invalid segment id %llu",
                     (unsigned long long)target_id);
        return MC_ERR_METADATA;
    }
    buf = malloc(KVT_NOTIFY_MAX);
    if (buf == NULL)
        return MC_ERR_MEMORY;
    len = kvtmc__notify_pack(&notify_msg, buf);
    if (len == 0) {
        KVTMC__LOG_E("genNotifyInEngine: name and msg exceed %d bytes",
                     KVT_NOTIFY_MAX - HDR_LEN);
        rc = MC_ERR_INVALID_ARGUMENT;
        goto out;
    }
    st = kvt_notify_send(e->kvt, seg, buf, len);
    if (st != KVT_OK)
        KVTMC__LOG_E("genNotifyInEngine(%llu): %s (%s)",
                     (unsigned long long)target_id, kvt_status_name(st),
                     kvt_status_str(st));
    rc = kvtmc__err(st);
out:
    free(buf);
    return rc;
}
