/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The doctor's transfer check of a peer, on one transport alone: the
 * session, the peer's scratch region (found by its mark, read in one
 * batch), a verified write and read at a random place, then bandwidth and
 * latency, each bounded by the timeout; the step says it lives between
 * batches, so that a slow link is not taken for a hung one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/doctor_int.h"
#include "core/engine_int.h"
#include "util/time.h"

/* The peer's scratch region (kvt_doctor_scratch()) into *addr_p and
 * *len_p (0: none): the first 64 bytes of every read-write host region
 * of 64 KiB or more (the first 1024 such), read in one batch into @buf,
 * and the first that bears the mark. Returns the batch's failure, if
 * any. */
static kvt_status_t find_scratch(kvt_engine_h e, kvt_segment_t seg,
                                 const kvt__segdesc_t *desc, uint8_t *buf,
                                 uint64_t *addr_p, uint64_t *len_p)
{
    enum { MAX = 1024 };
    size_t ml = strlen(KVT__DOC_MAGIC), n = 0;
    kvt_xfer_desc_t *r = calloc(MAX, sizeof(*r));
    uint32_t *idx = calloc(MAX, sizeof(*idx));
    kvt_status_t st = KVT_OK;
    kvt_batch_h b;

    *addr_p = *len_p = 0;
    if (r == NULL || idx == NULL) {
        st = KVT_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t i = 0; i < desc->nregions && n < MAX; i++) {
        const kvt_remote_region_t *x = &desc->regions[i];
        if (x->kind != KVT_MEM_HOST || x->access != KVT_ACCESS_REMOTE_RW ||
            x->length < (64u << 10))
            continue;
        r[n].opcode = KVT_OP_READ;
        r[n].segment = seg;
        r[n].local_addr = buf + n * 64;
        r[n].remote_addr = x->addr;
        r[n].length = 64;
        idx[n++] = i;
    }
    if (n == 0)
        goto out;
    st = kvt_batch_create(e, n, &b);
    if (st != KVT_OK)
        goto out;
    st = kvt_batch_submit_wait(b, r, n, -1);
    kvt_batch_free(b);
    for (size_t k = 0; st == KVT_OK && k < n; k++) {
        const kvt_remote_region_t *x = &desc->regions[idx[k]];
        char *m = (char *)buf + k * 64;
        unsigned long long len;
        m[63] = '\0';
        /* The mark says the length asked for; the region may be longer
         * (kvt_mem_alloc() rounds it up). */
        if (memcmp(m, KVT__DOC_MAGIC, ml) == 0 &&
            sscanf(m + ml, " %llu", &len) == 1 && len >= (64u << 10) &&
            len <= x->length) {
            *addr_p = x->addr;
            *len_p = len;
            break;
        }
    }
out:
    free(r);
    free(idx);
    return st;
}

/* Move @n descriptors of @len bytes between @local and the peer's
 * @raddr, all at once; the batch's status. */
static kvt_status_t move(kvt_engine_h e, kvt_segment_t seg, uint32_t op,
                         void *local, uint64_t raddr, uint64_t len, size_t n)
{
    kvt_xfer_desc_t x[64];
    kvt_batch_h b;
    kvt_status_t st;

    if (n > 64)
        n = 64;
    for (size_t i = 0; i < n; i++) {
        memset(&x[i], 0, sizeof(x[i]));
        x[i].opcode = op;
        x[i].segment = seg;
        x[i].local_addr = local;
        x[i].remote_addr = raddr;
        x[i].length = len;
    }
    st = kvt_batch_create(e, n, &b);
    if (st != KVT_OK)
        return st;
    st = kvt_batch_submit_wait(b, x, n, -1);
    kvt_batch_free(b);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* On transport @id alone: open, find the scratch region, write a pattern
 * and read it back, then bandwidth (writes) and latency (64-byte reads). */
void kvt__doc_transfer(kvt__doc_t *d, uint32_t id, const char *name,
                       const char *addr)
{
    char cid[64];
    kvt_engine_h e = NULL;
    kvt_segment_t seg;
    kvt__segdesc_t desc = {0};
    kvt_doctor_check_t *c;
    kvt_status_t st;
    uint64_t raddr = 0, rlen = 0, chunk, t0;
    uint8_t *buf = NULL, *back = NULL;
    kvt__seg_t *g;

    snprintf(cid, sizeof(cid), "peer.transfer.%s", name);
    kvt__doc_step(d, cid);
    kvt__doc_cause_reset(d);
    st = kvt__doc_engine(d, id, &e);
    if (st == KVT_OK)
        st = kvt_segment_open(e, addr, &seg);
    if (st == KVT_ERR_TIMEDOUT || st == KVT_ERR_CONN_LOST ||
        st == KVT_ERR_UNREACHABLE || st == KVT_ERR_BUSY)
        goto failed; /* the handshake went through: the data path did not */
    if (st != KVT_OK) {
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, st,
                     "see the cause (docs/transports.md)", "%s: no session: %s",
                     name, kvt__doc_cause(d, kvt_status_str(st)));
        goto out;
    }
    chunk = 4u << 20;
    buf = aligned_alloc(4096, chunk);
    back = aligned_alloc(4096, chunk);
    if (buf == NULL || back == NULL ||
        kvt_mem_register(e, buf, chunk, KVT_ACCESS_REMOTE_RW) != KVT_OK ||
        kvt_mem_register(e, back, chunk, KVT_ACCESS_REMOTE_RW) != KVT_OK) {
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, KVT_ERR_NO_MEMORY, NULL,
                     "%s: no memory for the buffers", name);
        goto out;
    }
    g = kvt__seg_get(e, seg);
    if (g != NULL) {
        pthread_mutex_lock(&g->desc_lock);
        desc.nregions = g->desc.nregions;
        desc.regions = malloc(desc.nregions * sizeof(*desc.regions) + 1);
        if (desc.regions != NULL)
            memcpy(desc.regions, g->desc.regions,
                   desc.nregions * sizeof(*desc.regions));
        else
            desc.nregions = 0;
        pthread_mutex_unlock(&g->desc_lock);
        kvt__seg_unref(g);
    }
    kvt__doc_cause_reset(d);
    st = find_scratch(e, seg, &desc, back, &raddr, &rlen);
    free(desc.regions);
    if (st != KVT_OK)
        goto failed;
    if (raddr == 0) {
        kvt__doc_add(d, cid, KVT_DOCTOR_SKIP, KVT_OK,
                     "run `kvt doctor --serve` on the peer's host (or call "
                     "kvt_doctor_scratch() there) to measure transfers",
                     "%s: a session opens, but the peer exposes no scratch "
                     "region; the doctor writes into no other memory",
                     name);
        goto out;
    }
    if (chunk > rlen - KVT__DOC_HEAD)
        chunk = (rlen - KVT__DOC_HEAD) & ~(uint64_t)4095;
    {
        /* Verified: 64 KiB at a random place, of a pattern of this run's
         * own (so that two doctors at one peer rarely meet; a mismatch is
         * tried again elsewhere before it counts). */
        uint64_t v = chunk < (64u << 10) ? chunk : (64u << 10);
        uint64_t slots = (rlen - KVT__DOC_HEAD) / v, tag = 0, off = 0;
        int tries = 0, same = 0;
        if (getrandom(&tag, sizeof(tag), 0) != sizeof(tag))
            tag = kvt__now_ns() ^ (uint64_t)getpid();
        t0 = kvt__now_ns();
        while (st == KVT_OK && !same && tries++ < 3) {
            tag = tag * 6364136223846793005ull + 1442695040888963407ull;
            off = KVT__DOC_HEAD + (tag >> 33) % slots * v;
            for (uint64_t i = 0; i < v; i++)
                buf[i] = (uint8_t)(i * 131 + (tag >> 40) + (i >> 12));
            st = move(e, seg, KVT_OP_WRITE, buf, raddr + off, v, 1);
            if (st == KVT_OK)
                st = move(e, seg, KVT_OP_READ, back, raddr + off, v, 1);
            same = st == KVT_OK && memcmp(buf, back, v) == 0;
        }
        if (st != KVT_OK)
            goto failed;
        if (!same) {
            kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, KVT_ERR_IO,
                         "run it again (another doctor may have written "
                         "there at the same moment); if it stays, report it",
                         "%s: %llu bytes written and read back differ, three "
                         "times at three places",
                         name, (unsigned long long)v);
            goto out;
        }
        c = kvt__doc_add(d, cid, KVT_DOCTOR_OK, KVT_OK, NULL,
                         "%s: %llu bytes written and read back, verified", name,
                         (unsigned long long)v);
        if (c == NULL)
            goto out;
        c->ms = kvt__doc_ms_since(t0);
        kvt__doc_beat(d, cid);
    }
    if (d->probe_bytes > 0) {
        /* Bandwidth: writes of @chunk, 16 at a time, until probe_bytes
         * or the timeout; each batch tells the parent the step lives. */
        uint64_t moved = 0, limit = d->timeout_ms * 1000000ull;
        t0 = kvt__now_ns();
        while (st == KVT_OK && moved < d->probe_bytes &&
               kvt__now_ns() - t0 < limit) {
            uint64_t left = (d->probe_bytes - moved + chunk - 1) / chunk;
            size_t n = left > 16 ? 16 : (size_t)left;
            st = move(e, seg, KVT_OP_WRITE, buf, raddr + KVT__DOC_HEAD, chunk,
                      n);
            moved += n * chunk;
            kvt__doc_beat(d, cid);
        }
        if (st != KVT_OK)
            goto failed;
        c = &d->r->c[d->r->n - 1];
        c->mbps = (double)moved / ((double)(kvt__now_ns() - t0) / 1e9) / 1e6;
    }
    {
        double lat[33];
        for (int i = 0; st == KVT_OK && i < 33; i++) {
            t0 = kvt__now_ns();
            st = move(e, seg, KVT_OP_READ, back, raddr + KVT__DOC_HEAD, 64, 1);
            lat[i] = (double)(kvt__now_ns() - t0) / 1e3;
        }
        if (st != KVT_OK)
            goto failed;
        qsort(lat, 33, sizeof(lat[0]), cmp_double);
        c = &d->r->c[d->r->n - 1];
        c->lat_us = lat[16];
    }
    goto out;

failed:
    if (st == KVT_ERR_TIMEDOUT || st == KVT_ERR_CONN_LOST ||
        st == KVT_ERR_UNREACHABLE)
        kvt__doc_add(
            d, cid, KVT_DOCTOR_FAIL, st,
            id == KVT_TRANSPORT_UCX
                ? "let TCP from this host to the peer's UCX ports through "
                  "the firewall (UCX's tcp transport listens on ports of its "
                  "own, not kvt's), or use tcp"
                : "let the data connections through the firewall",
            "%s: the control port answered, but the data path did not "
            "(%s within %llu ms): a firewall drops the %s data "
            "connections%s",
            name, kvt_status_name(st), (unsigned long long)d->timeout_ms, name,
            id == KVT_TRANSPORT_UCX ? " to the ports UCX listens on" : "");
    else if (st == KVT_ERR_BUSY && id == KVT_TRANSPORT_SHM)
        kvt__doc_add(d, cid, KVT_DOCTOR_WARN, st,
                     "nothing, if that is the peer's own initiator; else set "
                     "kernel.yama.ptrace_scope to 0 where same-host peers "
                     "share a user",
                     "%s: the peer admits one attaching process at a time "
                     "(Yama ptrace_scope 1) and another holds it now: %s",
                     name, kvt__doc_cause(d, kvt_status_str(st)));
    else
        kvt__doc_add(d, cid, KVT_DOCTOR_FAIL, st, "see the cause",
                     "%s: transfer failed: %s", name,
                     kvt__doc_cause(d, kvt_status_str(st)));
out:
    kvt__doc_step(d, NULL);
    kvt__doc_drop_engine(d, e);
    if (d->out_fd < 0) {
        free(buf);
        free(back);
    }
}
