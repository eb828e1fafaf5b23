/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cross-memory attach: process_vm_writev/readv with as few calls as the
 * vector limit allows, neighbouring pieces merged on each side; a fault
 * fails only the segment that holds it.
 */
#include <errno.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <sys/uio.h>
#include <unistd.h> /* IWYU pragma: keep */

#include "transport/shm/shm_sess.h"
#include "util/log.h"

#ifdef KVT_TSAN
/*
 * process_vm_writev/readv move bytes on behalf of another process; issue
 * them directly, as tcp.c does its payload calls, so that ThreadSanitizer
 * does not model them. Every other access stays checked. syscall() is
 * variadic: every argument is widened to a long, or the kernel reads
 * stack garbage above a 32-bit one (the flags, 7th, go on the stack).
 */
#define cma_writev(p, l, nl, r, nr)                                            \
    syscall(SYS_process_vm_writev, (long)(p), (l), (unsigned long)(nl), (r),   \
            (unsigned long)(nr), 0ul)
#define cma_readv(p, l, nl, r, nr)                                             \
    syscall(SYS_process_vm_readv, (long)(p), (l), (unsigned long)(nl), (r),    \
            (unsigned long)(nr), 0ul)
#else
#define cma_writev(p, l, nl, r, nr)                                            \
    process_vm_writev((p), (l), (nl), (r), (nr), 0)
#define cma_readv(p, l, nl, r, nr)                                             \
    process_vm_readv((p), (l), (nl), (r), (nr), 0)
#endif

/*
 * Copy the pieces of the segments of @j marked HOW_CMA with as few calls
 * as the vector limit allows, neighbouring pieces merged on each side. A
 * short count stops at a fault: the segment holding the fault fails and
 * the next call resumes after it. Returns a status for the whole session
 * on ESRCH/EPERM.
 */
kvt_status_t kvt__shm_cma_run(shm_session_t *s, job_t *j, const uint8_t *how)
{
    struct iovec liov[CMA_IOV], riov[CMA_IOV];
    uint32_t i = 0, p = 0; /* cursor: segment, piece */

    while (i < j->nsegs) {
        uint32_t fi, fp, k, q;
        int nl = 0, nr = 0;
        uint64_t want = 0;
        ssize_t got;

        if (how[i] != HOW_CMA || j->segs[i].st != KVT_OK) {
            i++;
            p = 0;
            continue;
        }
        fi = i;
        fp = p;
        while (i < j->nsegs && how[i] == HOW_CMA && j->segs[i].st == KVT_OK) {
            const seg_t *g = &j->segs[i];
            uint64_t la = g->laddr + p * g->lstride;
            uint64_t ra = g->raddr + p * g->rstride;
            int lm = nl > 0 && (uint64_t)(uintptr_t)liov[nl - 1].iov_base +
                                       liov[nl - 1].iov_len ==
                                   la;
            int rm = nr > 0 && (uint64_t)(uintptr_t)riov[nr - 1].iov_base +
                                       riov[nr - 1].iov_len ==
                                   ra;
            if ((!lm && nl == CMA_IOV) || (!rm && nr == CMA_IOV))
                break;
            if (lm)
                liov[nl - 1].iov_len += g->len;
            else
                liov[nl++] = (struct iovec){(void *)(uintptr_t)la, g->len};
            if (rm)
                riov[nr - 1].iov_len += g->len;
            else
                riov[nr++] = (struct iovec){(void *)(uintptr_t)ra, g->len};
            want += g->len;
            if (++p == g->count) {
                i++;
                p = 0;
            }
        }
        if (j->op == KVT_OP_WRITE)
            got = cma_writev(s->pid, liov, (unsigned long)nl, riov,
                             (unsigned long)nr);
        else
            got = cma_readv(s->pid, liov, (unsigned long)nl, riov,
                            (unsigned long)nr);
        if (got == (ssize_t)want)
            continue;
        if (got < 0 && (errno == ESRCH || errno == EPERM)) {
            kvt_status_t st = errno == ESRCH ? KVT_ERR_CONN_LOST : KVT_ERR_IO;
            if (errno == EPERM)
                KVT_LOG_E("shm: %s no longer lets this process attach "
                          "(process_vm: permission denied)",
                          s->base.name);
            kvt__shm_segs_fail(j, fi, j->nsegs, st);
            return st;
        }
        /* The piece where the copy stopped fails its segment; resume
         * after that segment. */
        if (got < 0)
            got = 0;
        for (k = fi, q = fp; (uint64_t)got >= j->segs[k].len;) {
            got -= (ssize_t)j->segs[k].len;
            if (++q == j->segs[k].count) {
                k++;
                q = 0;
            }
        }
        j->segs[k].st = KVT_ERR_ACCESS;
        i = k + 1;
        p = 0;
    }
    return KVT_OK;
}
