/* SPDX-License-Identifier: Apache-2.0 */
/* Decoding of etcd's range answers and kvt metad's key listing. */
#include <stdlib.h>
#include <string.h>

#include "meta/base64.h"
#include "meta/json_parse.h"
#include "meta/meta_answer.h"
#include "util/log.h"

/* A base64 string value: *out_p malloc'd with a NUL after *n_p bytes.
 * KVT_ERR_PROTOCOL when it is not base64. */
static kvt_status_t b64_value(const char *enc, uint8_t **out_p, size_t *n_p)
{
    size_t elen = strlen(enc);
    uint8_t *out = malloc(elen / 4 * 3 + 1);
    long n;

    if (out == NULL)
        return KVT_ERR_NO_MEMORY;
    n = kvt__b64_decode(enc, elen, out);
    if (n < 0) {
        free(out);
        return KVT_ERR_PROTOCOL;
    }
    out[n] = '\0';
    *out_p = out;
    *n_p = (size_t)n;
    return KVT_OK;
}

/* The "kvs" array of a range answer; NULL when there is none. */
static kvt_status_t range_kvs(json_object *resp, json_object **kvs_p)
{
    json_object *kvs;

    *kvs_p = NULL;
    if (!json_object_is_type(resp, json_type_object))
        return KVT_ERR_PROTOCOL;
    if (!json_object_object_get_ex(resp, "kvs", &kvs) || kvs == NULL)
        return KVT_OK; /* proto3 omits an empty list */
    if (!json_object_is_type(kvs, json_type_array))
        return KVT_ERR_PROTOCOL;
    *kvs_p = kvs;
    return KVT_OK;
}

kvt_status_t kvt__etcd_range_value(json_object *resp, const char *key,
                                   uint8_t **val_p, size_t *len_p)
{
    json_object *kvs, *kv, *v;
    const char *enc = "";
    kvt_status_t st = range_kvs(resp, &kvs);

    if (st != KVT_OK)
        goto err;
    if (kvs == NULL || json_object_array_length(kvs) == 0)
        return KVT_ERR_NOT_FOUND;
    st = KVT_ERR_PROTOCOL;
    kv = json_object_array_get_idx(kvs, 0);
    if (!json_object_is_type(kv, json_type_object))
        goto err;
    /* proto3 omits empty fields: no "value" is an empty value. */
    if (json_object_object_get_ex(kv, "value", &v)) {
        if (!json_object_is_type(v, json_type_string))
            goto err;
        enc = json_object_get_string(v);
    }
    st = b64_value(enc, val_p, len_p);
    if (st == KVT_OK && *len_p > KVT_META_VALUE_MAX) {
        free(*val_p);
        st = KVT_ERR_PROTOCOL;
    }
    if (st != KVT_ERR_PROTOCOL)
        return st;
err:
    KVT_LOG_W("etcd metadata: malformed range answer for '%s'", key);
    return st;
}

kvt_status_t kvt__etcd_range_keys(json_object *resp, kvt__meta_keys_t *out)
{
    json_object *kvs;
    kvt_status_t st = range_kvs(resp, &kvs);
    size_t n = kvs != NULL ? json_object_array_length(kvs) : 0;

    for (size_t i = 0; st == KVT_OK && i < n; i++) {
        json_object *k;
        uint8_t *dec;
        size_t len;

        if (!json_object_object_get_ex(json_object_array_get_idx(kvs, i), "key",
                                       &k) ||
            !json_object_is_type(k, json_type_string)) {
            st = KVT_ERR_PROTOCOL;
            break;
        }
        st = b64_value(json_object_get_string(k), &dec, &len);
        if (st == KVT_OK) {
            st = kvt__meta_keys_add(out, (const char *)dec, len);
            free(dec);
        }
    }
    if (st == KVT_ERR_PROTOCOL)
        KVT_LOG_W("etcd metadata: malformed range answer (key listing)");
    return st;
}

kvt_status_t kvt__http_keys_parse(const uint8_t *body, size_t len,
                                  kvt__meta_keys_t *out)
{
    json_object *a = kvt__json_parse((const char *)body, len);
    kvt_status_t st = KVT_ERR_PROTOCOL;
    size_t n;

    if (a == NULL || !json_object_is_type(a, json_type_array)) {
        KVT_LOG_W("http metadata: key listing is not a JSON array");
        goto err_a;
    }
    n = json_object_array_length(a);
    st = KVT_OK;
    for (size_t i = 0; i < n && st == KVT_OK; i++) {
        json_object *k = json_object_array_get_idx(a, i);
        if (!json_object_is_type(k, json_type_string)) {
            KVT_LOG_W("http metadata: key listing holds a non-string");
            st = KVT_ERR_PROTOCOL;
            break;
        }
        st = kvt__meta_keys_add(out, json_object_get_string(k),
                                (size_t)json_object_get_string_len(k));
    }
err_a:
    json_object_put(a);
    return st;
}
