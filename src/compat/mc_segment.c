/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Segments of Mooncake's C API: the table from Mooncake's segment ids
 * (int32, stable per name, LOCAL_SEGMENT for the engine itself) to kvt
 * segment handles, and the calls that open, refresh, close and list them.
 */
#include "mc_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvt_status_t kvtmc__segment(kvtmc_engine_t *e, int64_t id, kvt_segment_t *seg_p)
{
    kvt_segment_t seg = 0, self;
    kvt_status_t st = KVT_ERR_NOT_FOUND;

    char name[512];

    name[0] = '\0';
    pthread_rwlock_rdlock(&e->seg_lock);
    if (id == LOCAL_SEGMENT && e->self != 0) {
        seg = e->self;
        st = KVT_OK;
    } else if (id >= 1 && (size_t)id <= e->nsegs && e->segs[id - 1].open) {
        seg = e->segs[id - 1].seg;
        snprintf(name, sizeof(name), "%s", e->segs[id - 1].name);
        st = KVT_OK;
    }
    pthread_rwlock_unlock(&e->seg_lock);
    if (st == KVT_OK && name[0] != '\0') {
        /* kvt drops a segment whose session failed; Mooncake's ids stay
         * valid across reconnections. kvt's open is a lookup by name while
         * the segment lives, and a new handshake once it was dropped. */
        kvt_segment_t now;
        st = kvt_segment_open(e->kvt, name, &now);
        if (st != KVT_OK) {
            KVTMC__LOG_E("segment %lld (%s): cannot reopen it: %s",
                         (long long)id, name, kvt_status_name(st));
            goto out;
        }
        if (now != seg) {
            pthread_rwlock_wrlock(&e->seg_lock);
            if (e->segs[id - 1].open)
                e->segs[id - 1].seg = now;
            pthread_rwlock_unlock(&e->seg_lock);
            seg = now;
        }
    }
    if (st == KVT_OK || id != LOCAL_SEGMENT)
        goto out;
    /* The engine's own segment: kvt reaches it as any peer (shm or tcp
     * over loopback); opening it twice gives the same handle. */
    st = kvt_segment_open(e->kvt, e->name, &self);
    if (st != KVT_OK) {
        KVTMC__LOG_E("LOCAL_SEGMENT: cannot open this engine's own segment "
                     "%s: %s",
                     e->name, kvt_status_name(st));
        goto out;
    }
    pthread_rwlock_wrlock(&e->seg_lock);
    e->self = self;
    pthread_rwlock_unlock(&e->seg_lock);
    seg = self;
out:
    if (st == KVT_OK)
        *seg_p = seg;
    return st;
}

void kvtmc__segments_free(kvtmc_engine_t *e)
{
    for (size_t i = 0; i < e->nsegs; i++)
        free(e->segs[i].name);
    free(e->segs);
    e->segs = NULL;
    e->nsegs = e->segcap = 0;
}

/* The open entry named @name (seg_lock held), or -1. */
static int64_t find_name(kvtmc_engine_t *e, const char *name)
{
    for (size_t i = 0; i < e->nsegs; i++)
        if (e->segs[i].open && strcmp(e->segs[i].name, name) == 0)
            return (int64_t)i + 1;
    return -1;
}

/*
 * Open @name and give its id: kvt_segment_open() first (at once when kvt
 * has the session cached, a new handshake when it had failed), then the
 * table, where the name keeps the id it had.
 */
static segment_id_t open_segment(const char *call, transfer_engine_t engine,
                                 const char *segment_name, int refresh)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, call);
    const char *name = segment_name;
    kvt_segment_t seg;
    kvt_status_t st;
    int64_t id;
    size_t n;

    if (e == NULL || name == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    while (*name == '/')
        name++;
    if (*name == '\0') {
        KVTMC__LOG_E("%s: empty segment name", call);
        return MC_ERR_INVALID_ARGUMENT;
    }
    if (strcmp(name, e->name) == 0)
        return LOCAL_SEGMENT;
    pthread_rwlock_rdlock(&e->seg_lock);
    id = find_name(e, name);
    seg = id > 0 ? e->segs[id - 1].seg : 0;
    pthread_rwlock_unlock(&e->seg_lock);
    if (id > 0 && refresh) {
        st = kvt_segment_regions(e->kvt, seg, 1, NULL, 0, &n);
        if (st != KVT_OK && st != KVT_ERR_NOT_FOUND) {
            KVTMC__LOG_E("%s(%s): refreshing the descriptor: %s (%s)", call,
                         name, kvt_status_name(st), kvt_status_str(st));
            return kvtmc__err(st);
        }
    }
    st = kvt_segment_open(e->kvt, name, &seg);
    if (st != KVT_OK) {
        KVTMC__LOG_E("%s(%s): %s (%s)", call, name, kvt_status_name(st),
                     kvt_status_str(st));
        return -1;
    }
    pthread_rwlock_wrlock(&e->seg_lock);
    id = find_name(e, name);
    if (id > 0) {
        e->segs[id - 1].seg = seg;
        goto out;
    }
    if (e->nsegs == (size_t)INT32_MAX) {
        id = MC_ERR_TOO_MANY_REQUESTS;
        goto out;
    }
    if (e->nsegs == e->segcap) {
        size_t cap = e->segcap ? e->segcap * 2 : 16;
        kvtmc_seg_t *s = realloc(e->segs, cap * sizeof(*s));
        if (s == NULL) {
            id = MC_ERR_MEMORY;
            goto out;
        }
        e->segs = s;
        e->segcap = cap;
    }
    e->segs[e->nsegs].name = strdup(name);
    if (e->segs[e->nsegs].name == NULL) {
        id = MC_ERR_MEMORY;
        goto out;
    }
    e->segs[e->nsegs].seg = seg;
    e->segs[e->nsegs].open = 1;
    id = (int64_t)++e->nsegs;
out:
    pthread_rwlock_unlock(&e->seg_lock);
    return (segment_id_t)id;
}

KVTMC_API segment_id_t openSegment(transfer_engine_t engine,
                                   const char *segment_name)
{
    return open_segment("openSegment", engine, segment_name, 0);
}

KVTMC_API segment_id_t openSegmentNoCache(transfer_engine_t engine,
                                          const char *segment_name)
{
    return open_segment("openSegmentNoCache", engine, segment_name, 1);
}

KVTMC_API int closeSegment(transfer_engine_t engine, segment_id_t segment_id)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "closeSegment");
    kvt_segment_t seg = 0;
    char *name = NULL;

    if (e == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    if (segment_id == LOCAL_SEGMENT)
        return 0;
    pthread_rwlock_wrlock(&e->seg_lock);
    if (segment_id >= 1 && (size_t)segment_id <= e->nsegs &&
        e->segs[segment_id - 1].open) {
        seg = e->segs[segment_id - 1].seg;
        name = e->segs[segment_id - 1].name;
        e->segs[segment_id - 1].name = NULL;
        e->segs[segment_id - 1].open = 0;
    }
    pthread_rwlock_unlock(&e->seg_lock);
    if (name == NULL) {
        KVTMC__LOG_E("closeSegment: unknown segment id %d", (int)segment_id);
        return MC_ERR_INVALID_ARGUMENT;
    }
    /* NOT_FOUND: kvt had evicted it already (its session failed). */
    (void)kvt_segment_close(e->kvt, seg);
    free(name);
    return 0;
}

KVTMC_API int syncSegmentCache(transfer_engine_t engine)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "syncSegmentCache");
    kvt_segment_t *segs = NULL;
    size_t n = 0, nr;
    kvt_status_t st;
    int rc = 0;

    if (e == NULL)
        return MC_ERR_INVALID_ARGUMENT;
    pthread_rwlock_rdlock(&e->seg_lock);
    if (e->nsegs > 0)
        segs = malloc(e->nsegs * sizeof(*segs));
    for (size_t i = 0; segs != NULL && i < e->nsegs; i++)
        if (e->segs[i].open)
            segs[n++] = e->segs[i].seg;
    pthread_rwlock_unlock(&e->seg_lock);
    for (size_t i = 0; i < n; i++) {
        st = kvt_segment_regions(e->kvt, segs[i], 1, NULL, 0, &nr);
        if (st != KVT_OK && rc == 0) {
            KVTMC__LOG_E("syncSegmentCache: %s (%s)", kvt_status_name(st),
                         kvt_status_str(st));
            rc = kvtmc__err(st);
        }
    }
    free(segs);
    return rc;
}

/* Append to @buf at *off, cut at the end. */
static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*off >= len - 1)
        return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
    if (n > 0)
        *off += (size_t)n < len - *off ? (size_t)n : len - 1 - *off;
}

KVTMC_API int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len,
                        int json)
{
    kvtmc_engine_t *e = kvtmc__engine(engine, "showLinks");
    const char *tl;
    size_t off = 0;
    int first = 1;

    if (e == NULL || buf_out == NULL || buf_len == 0)
        return -1;
    buf_out[0] = '\0';
    put(buf_out, buf_len, &off, "%s", json ? "{\"links\":[" : "");
    pthread_rwlock_rdlock(&e->seg_lock);
    for (size_t i = 0; i < e->nsegs; i++) {
        if (!e->segs[i].open)
            continue;
        if (kvt_segment_transport(e->kvt, e->segs[i].seg, KVT_MEM_HOST,
                                  KVT_MEM_HOST, &tl) != KVT_OK)
            tl = "none";
        if (json)
            put(buf_out, buf_len, &off,
                "%s{\"segment_id\":%zu,\"segment\":\"%s\",\"transport\":"
                "\"%s\"}",
                first ? "" : ",", i + 1, e->segs[i].name, tl);
        else
            put(buf_out, buf_len, &off, "%zu %s %s\n", i + 1, e->segs[i].name,
                tl);
        first = 0;
    }
    pthread_rwlock_unlock(&e->seg_lock);
    put(buf_out, buf_len, &off, "%s", json ? "]}" : "");
    return 0;
}
