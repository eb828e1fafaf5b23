/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for the metadata clients' decoding of server answers: the
 * first byte picks the answer (etcd range for a value, etcd keys-only
 * range, kvt metad's key listing, a redis GET or SCAN reply), the rest is
 * what the server sent. None may crash, leak, or hand back a value or a
 * list the client's contract does not allow.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "meta/json_parse.h"
#include "meta/meta_answer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { ETCD_VALUE, ETCD_KEYS, HTTP_KEYS, REDIS_GET, REDIS_SCAN, NKINDS };

static void check_keys(kvt__meta_keys_t *kl, kvt_status_t st)
{
    if (kl->n > KVT_META_LIST_MAX)
        abort();
    if (st != KVT_OK && st != KVT_ERR_PROTOCOL && st != KVT_ERR_OVERFLOW)
        abort();
    kvt__meta_list_free(kl->keys, kl->n);
}

static void check_value(kvt_status_t st, uint8_t *val, size_t len)
{
    if (st == KVT_OK) {
        if (len > KVT_META_VALUE_MAX || val[len] != '\0')
            abort();
        free(val);
    } else if (st != KVT_ERR_NOT_FOUND && st != KVT_ERR_PROTOCOL &&
               st != KVT_ERR_OVERFLOW) {
        abort();
    }
}

#ifdef KVT_WITH_REDIS
/* The first complete reply in @data, as the redis backend's bounded reader
 * reads it off the socket. */
static redisReply *redis_reply(const uint8_t *data, size_t size)
{
    redisReader *r = redisReaderCreate();
    kvt__redis_bound_t bound;
    void *rep = NULL;

    if (r == NULL)
        return NULL;
    kvt__redis_reader_bound(r, &bound);
    if (redisReaderFeed(r, (const char *)data, size) != REDIS_OK ||
        redisReaderGetReply(r, &rep) != REDIS_OK)
        rep = NULL;
    if (bound.refused != 0 && rep != NULL)
        abort();
    redisReaderFree(r);
    return rep;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__meta_keys_t kl = {0};
    uint8_t *val = NULL;
    size_t len = 0;
    kvt_status_t st;

    fuzz_quiet();
    if (size < 1)
        return 0;
    switch (data[0] % NKINDS) {
#ifdef KVT_WITH_JSON
    case ETCD_VALUE:
    case ETCD_KEYS: {
        json_object *resp = kvt__json_parse((const char *)data + 1, size - 1);
        if (resp == NULL)
            break;
        if (data[0] % NKINDS == ETCD_VALUE) {
            st = kvt__etcd_range_value(resp, "k", &val, &len);
            check_value(st, val, len);
        } else {
            check_keys(&kl, kvt__etcd_range_keys(resp, &kl));
        }
        json_object_put(resp);
        break;
    }
    case HTTP_KEYS:
        check_keys(&kl, kvt__http_keys_parse(data + 1, size - 1, &kl));
        break;
#endif
#ifdef KVT_WITH_REDIS
    case REDIS_GET:
    case REDIS_SCAN: {
        redisReply *rep = redis_reply(data + 1, size - 1);
        char cursor[32];
        if (rep == NULL)
            break;
        if (data[0] % NKINDS == REDIS_GET) {
            st = kvt__redis_get_reply(rep, "k", &val, &len);
            check_value(st, val, len);
        } else {
            st = kvt__redis_scan_reply(rep, cursor, sizeof(cursor), &kl);
            if (st == KVT_OK &&
                strnlen(cursor, sizeof(cursor)) >= sizeof(cursor))
                abort();
            check_keys(&kl, st);
        }
        freeReplyObject(rep);
        break;
    }
#endif
    default:
        break;
    }
    return 0;
}
