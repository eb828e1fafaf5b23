/* SPDX-License-Identifier: Apache-2.0 */
/* Decoding of the redis replies the redis backend reads. */
#include <stdlib.h>
#include <string.h>

#include "meta/meta_answer.h"
#include "util/log.h"

static void *bounded_array(const redisReadTask *task, kvt__redis_nelem_t n)
{
    kvt__redis_bound_t *b = task->privdata;

    if ((unsigned long long)n > KVT_REDIS_ARRAY_MAX) {
        KVT_LOG_W("redis metadata: reply array of %lld elements refused "
                  "(limit %u)",
                  (long long)n, KVT_REDIS_ARRAY_MAX);
        b->refused = (long long)n;
        return NULL;
    }
    return b->create_array(task, n);
}

void kvt__redis_reader_bound(redisReader *r, kvt__redis_bound_t *b)
{
    b->fn = *r->fn;
    b->create_array = r->fn->createArray;
    b->fn.createArray = bounded_array;
    b->refused = 0;
    r->fn = &b->fn;
    r->privdata = b;
#if HIREDIS_MAJOR >= 1
    r->maxelements = KVT_REDIS_ARRAY_MAX;
#endif
}

kvt_status_t kvt__redis_get_reply(const redisReply *rep, const char *key,
                                  uint8_t **val_p, size_t *len_p)
{
    uint8_t *copy;

    if (rep->type == REDIS_REPLY_NIL)
        return KVT_ERR_NOT_FOUND;
    if (rep->type != REDIS_REPLY_STRING) {
        KVT_LOG_W("redis metadata: GET '%s' answered type %d", key, rep->type);
        return KVT_ERR_PROTOCOL;
    }
    if (rep->len > KVT_META_VALUE_MAX) {
        KVT_LOG_W("redis metadata: value of '%s' is %zu bytes (limit %u)", key,
                  rep->len, KVT_META_VALUE_MAX);
        return KVT_ERR_OVERFLOW;
    }
    copy = malloc(rep->len + 1);
    if (copy == NULL)
        return KVT_ERR_NO_MEMORY;
    memcpy(copy, rep->str, rep->len);
    copy[rep->len] = '\0';
    *val_p = copy;
    *len_p = rep->len;
    return KVT_OK;
}

kvt_status_t kvt__redis_scan_reply(const redisReply *rep, char *cursor,
                                   size_t cap, kvt__meta_keys_t *out)
{
    const redisReply *keys;
    kvt_status_t st = KVT_OK;

    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[0]->len >= cap ||
        rep->element[1]->type != REDIS_REPLY_ARRAY) {
        KVT_LOG_W("redis metadata: unexpected SCAN answer");
        return KVT_ERR_PROTOCOL;
    }
    memcpy(cursor, rep->element[0]->str, rep->element[0]->len);
    cursor[rep->element[0]->len] = '\0';
    keys = rep->element[1];
    for (size_t i = 0; i < keys->elements && st == KVT_OK; i++)
        if (keys->element[i]->type == REDIS_REPLY_STRING)
            st = kvt__meta_keys_add(out, keys->element[i]->str,
                                    keys->element[i]->len);
    return st;
}
