/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_META_META_ANSWER_H
#define KVT_META_META_ANSWER_H

/*
 * The metadata clients' decoding of server answers, apart from the I/O so
 * that fuzz targets reach it: etcd's range answers and kvt metad's key
 * listing (answer_json.c, with json-c), redis replies (answer_redis.c,
 * with hiredis). Every answer is untrusted: a malformed one gives
 * KVT_ERR_PROTOCOL (logged), never a crash.
 */
#include <stddef.h>
#include <stdint.h>

#include "meta/meta_int.h"

#ifdef KVT_WITH_JSON
#include <json-c/json.h>

/* The value of an etcd range answer for one key @key (for the log): on
 * KVT_OK *val_p is malloc'd with a NUL after *len_p bytes;
 * KVT_ERR_NOT_FOUND without a key; KVT_ERR_PROTOCOL, KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__etcd_range_value(json_object *resp, const char *key,
                                   uint8_t **val_p, size_t *len_p);
/* The keys of an etcd keys-only range answer, appended to @out (an answer
 * without "kvs" holds none). KVT_ERR_PROTOCOL, KVT_ERR_OVERFLOW,
 * KVT_ERR_NO_MEMORY. */
kvt_status_t kvt__etcd_range_keys(json_object *resp, kvt__meta_keys_t *out);
/* The keys of kvt metad's listing (a JSON array of strings, @len bytes),
 * appended to @out. */
kvt_status_t kvt__http_keys_parse(const uint8_t *body, size_t len,
                                  kvt__meta_keys_t *out);
#endif

#ifdef KVT_WITH_REDIS
#include <hiredis/hiredis.h>

/*
 * Bounds on what a server's reply may make hiredis allocate. hiredis
 * (before 1.0) allocates an array's element table as soon as it reads the
 * "*<count>" header, so one line from a broken or hostile server could ask
 * for gigabytes. kvt__redis_reader_bound() makes @r refuse, before any
 * allocation, an array of more than KVT_REDIS_ARRAY_MAX elements: the
 * reply fails (hiredis reports it as out of memory) and @b->refused is
 * set, so that the caller reports KVT_ERR_PROTOCOL. @b must outlive @r
 * and belongs to that one reader; the caller clears @b->refused before
 * each command. Not thread-safe beyond the reader's own.
 */
#define KVT_REDIS_ARRAY_MAX KVT_META_LIST_MAX
#if HIREDIS_MAJOR >= 1
typedef size_t kvt__redis_nelem_t;
#else
typedef int kvt__redis_nelem_t;
#endif
typedef struct {
    redisReplyObjectFunctions fn; /* hiredis's own, createArray bounded */
    void *(*create_array)(const redisReadTask *, kvt__redis_nelem_t);
    long long refused; /* elements of the last array refused, or 0 */
} kvt__redis_bound_t;
void kvt__redis_reader_bound(redisReader *r, kvt__redis_bound_t *b);

/* A GET reply: a string is the value (*val_p malloc'd with a NUL after
 * *len_p bytes), nil KVT_ERR_NOT_FOUND, anything else KVT_ERR_PROTOCOL;
 * KVT_ERR_OVERFLOW beyond KVT_META_VALUE_MAX. */
kvt_status_t kvt__redis_get_reply(const redisReply *rep, const char *key,
                                  uint8_t **val_p, size_t *len_p);
/* A SCAN reply: the next cursor into @cursor (room for @cap bytes with
 * its NUL) and the string keys appended to @out. */
kvt_status_t kvt__redis_scan_reply(const redisReply *rep, char *cursor,
                                   size_t cap, kvt__meta_keys_t *out);
#endif

#endif
