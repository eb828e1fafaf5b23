/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target for kvt metad's request parsing and the client's URI and
 * base64 parsers: none may crash, read out of bounds, or accept what
 * breaks the invariants the server relies on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/base64.h"
#include "meta/http_parse.h"
#include "meta/meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvt__http_req_t req;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    char *enc;
    uint8_t *dec;
    kvt__meta_uri_t u;
    uint64_t v;
    long n;
    int code;

    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    code = kvt__http_parse_target((const char *)data, size, &req);
    if (code != 0 && code != 400 && code != 414)
        abort();
    if (code == 0) {
        if ((unsigned)req.route >= KVT__ROUTE_COUNT)
            abort();
        if (req.has_key &&
            (req.key_len > KVT_META_KEY_MAX || strlen(req.key) != req.key_len))
            abort();
        if (req.has_prefix && (req.prefix_len > KVT_META_KEY_MAX ||
                               strlen(req.prefix) != req.prefix_len))
            abort();
        /* Keys are valid UTF-8, stripped of surrounding spaces. */
        if (req.has_key &&
            (!kvt__utf8_valid(req.key, req.key_len) ||
             (req.key_len > 0 &&
              (req.key[0] == ' ' || req.key[req.key_len - 1] == ' '))))
            abort();
        if (req.has_prefix && !kvt__utf8_valid(req.prefix, req.prefix_len))
            abort();
        if (req.has_ttl && req.ttl_s > KVT_HTTP_TTL_MAX)
            abort();
    }
    if (kvt__http_parse_length(s, &v) == 0 && strlen(s) > 19)
        abort();
    (void)kvt__http_method(s);

    if (kvt__meta_uri_parse(s, &u) == KVT_OK) {
        if (u.nendpoints > KVT_META_MAX_ENDPOINTS)
            abort();
        for (unsigned i = 0; i < u.nendpoints; i++)
            if (u.ep[i].port == 0 || u.ep[i].host[0] == '\0')
                abort();
        if (u.kind == KVT__META_HTTP && u.path[0] != '/')
            abort();
    }

    /* base64: whatever decodes has room; encode then decode is identity. */
    dec = malloc(size / 4 * 3 + 1);
    enc = malloc(kvt__b64_enc_len(size) + 1);
    if (dec != NULL && enc != NULL) {
        n = kvt__b64_decode(s, size, dec);
        if (n > (long)(size / 4 * 3))
            abort();
        n = (long)kvt__b64_encode(data, size, enc);
        free(dec);
        dec = malloc(size + 3);
        if (dec != NULL &&
            (kvt__b64_decode(enc, (size_t)n, dec) != (long)size ||
             memcmp(dec, data, size) != 0))
            abort();
    }
    free(dec);
    free(enc);
    free(s);
    return 0;
}
