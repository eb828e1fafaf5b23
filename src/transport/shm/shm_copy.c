/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Copies into a peer's mapped memory, and the shared futex operations on
 * channel words.
 *
 * A write into a same-host peer's mapping is not read again by this
 * process, so large ones bypass the cache with non-temporal stores: the
 * destination lines are neither read for ownership nor left to evict this
 * thread's working set, which roughly doubles the bandwidth of a plain
 * memcpy into a shared mapping on the machines kvt runs on. Small copies
 * and reads use memcpy.
 */
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h> /* IWYU pragma: keep */
#include <unistd.h>

#include "transport/shm/shm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Below this, a non-temporal copy is not worth its setup and fence. */
#define NT_MIN (64u * 1024u)
/* Scattered pieces are streamed from this size (whole 64-byte lines
 * dominate; below it the partial lines at either end do). */
#define NT_PIECE_MIN 256u
/* Pieces contiguous in the destination are streamed from this size (a
 * head-major block of some heads); smaller ones were measured slower
 * streamed (below). */
#define NT_RUN_MIN (4u * 1024u)

#if defined(__x86_64__)
/* 128 bytes from @s (any alignment) to @d (32-byte aligned) with
 * streaming stores. */
__attribute__((target("avx2"), always_inline)) static inline void
stream128(uint8_t *d, const uint8_t *s)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)s);
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
    __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_stream_si256((__m256i *)d, a);
    _mm256_stream_si256((__m256i *)(d + 32), b);
    _mm256_stream_si256((__m256i *)(d + 64), c);
    _mm256_stream_si256((__m256i *)(d + 96), e);
}

/* Each of @count pieces of @n bytes, the k-th from s + k * ss to
 * d + k * ds, with streaming stores from the first 32-byte boundary of
 * the destination (plain ones for the bytes before it and the tail). */
__attribute__((target("avx2"))) static void copy_nt_avx2(uint8_t *d, size_t ds,
                                                         const uint8_t *s,
                                                         size_t ss, size_t n,
                                                         size_t count)
{
    for (size_t k = 0; k < count; k++, d += ds, s += ss) {
        uint8_t *dd = d;
        const uint8_t *sp = s;
        size_t m = n, head = (32 - ((uintptr_t)dd & 31)) & 31;

        if (head > m)
            head = m;
        if (head > 0) {
            memcpy(dd, sp, head);
            dd += head;
            sp += head;
            m -= head;
        }
        for (; m >= 128; m -= 128, dd += 128, sp += 128)
            stream128(dd, sp);
        for (; m >= 32; m -= 32, dd += 32, sp += 32)
            _mm256_stream_si256((__m256i *)dd,
                                _mm256_loadu_si256((const __m256i *)sp));
        if (m > 0)
            memcpy(dd, sp, m);
    }
}

#endif

/* Pieces as for copy_nt_avx2(), streamed, without the fence. */
static void copy_nt(uint8_t *d, size_t ds, const uint8_t *s, size_t ss,
                    size_t n, size_t count)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        copy_nt_avx2(d, ds, s, ss, n, count);
        return;
    }
#endif
    /* Without AVX2 (x86 CPUs from before 2013, other architectures):
     * plain stores. */
    for (size_t k = 0; k < count; k++, d += ds, s += ss)
        memcpy(d, s, n);
}

static void nt_fence(void)
{
#if defined(__x86_64__)
    /* Non-temporal stores are weakly ordered: fence them before the
     * release that reports the copy done. */
    _mm_sfence();
#endif
}

void kvt__shm_copy(void *dst, const void *src, size_t len, int nt)
{
    if (nt && len >= NT_MIN) {
        copy_nt(dst, len, src, len, len, 1);
        nt_fence();
        return;
    }
    memcpy(dst, src, len);
}

int kvt__shm_copy_piece(void *dst, const void *src, size_t len)
{
    /* As a contiguous destination run in kvt__shm_copy_strided(). */
    if (len >= NT_RUN_MIN) {
        copy_nt(dst, len, src, len, len, 1);
        return 1;
    }
    memcpy(dst, src, len);
    return 0;
}

void kvt__shm_copy_fence(void)
{
    nt_fence();
}

void kvt__shm_copy_strided(void *dst, size_t dstride, const void *src,
                           size_t sstride, size_t len, size_t count, int nt)
{
    uint8_t *d = dst;
    const uint8_t *s = src;

    if (count == 0)
        return;
    if (dstride == len && sstride == len) {
        kvt__shm_copy(d, s, len * count, nt);
        return;
    }
    /* Pieces scattered in the destination: each piece's lines are
     * written whole, so streaming them saves the read for ownership.
     * Medians of six runs each, alternating, of build/bin/
     * kvt_connector_bench --mode=tp --rounds=9 --layout=token: 4:2 into a
     * mapping (--memory=managed) 16.8 GB/s streamed, 13.6 with memcpy;
     * 2:1 staged into plain memory 9.9 and 8.4. Small pieces contiguous
     * in the destination are not streamed: that was measured slower (1:2
     * into a mapping: 14 GB/s streamed, 17 to 19 with memcpy); a head-
     * major block's heads (16 KiB, --layout=head, 1:2) are, at 16.0
     * against 15.4 GB/s. */
    if (nt && (dstride != len ? len >= NT_PIECE_MIN : len >= NT_RUN_MIN)) {
        copy_nt(d, dstride, s, sstride, len, count);
        nt_fence();
        return;
    }
    for (size_t k = 0; k < count; k++, d += dstride, s += sstride)
        memcpy(d, s, len);
}

#if defined(__x86_64__)
/* kvt__shm_copy_pair() with whole 128-byte steps into 32-byte aligned
 * destinations: no head or tail per piece. Four alternating runs each of
 * build/bin/kvt_connector_bench --mode=tp --protocol=auto --rounds=9
 * --memory=managed --layout=token: 1:2 20.4 to 21.5 GB/s against 16.6 to
 * 21.0 with copy_nt_avx2() per piece, 2:4 13.2 to 18.9 against 14.1 to
 * 15.4. */
__attribute__((target("avx2"))) static void
copy_pair_avx2(uint8_t *a, size_t ds0, const uint8_t *sa, uint8_t *b,
               size_t ds1, const uint8_t *sb, size_t ss, size_t len,
               size_t count)
{
    for (size_t k = 0; k < count; k++) {
        const uint8_t *p = sa + k * ss, *q = sb + k * ss;
        uint8_t *x = a + k * ds0, *y = b + k * ds1;
        for (size_t m = 0; m < len; m += 128)
            stream128(x + m, p + m);
        for (size_t m = 0; m < len; m += 128)
            stream128(y + m, q + m);
    }
}
#endif

void kvt__shm_copy_pair(void *d0, size_t ds0, const void *s0, void *d1,
                        size_t ds1, const void *s1, size_t sstride, size_t len,
                        size_t count)
{
    uint8_t *a = d0, *b = d1;
    const uint8_t *sa = s0, *sb = s1;

#if defined(__x86_64__)
    if (len % 128 == 0 && ((uintptr_t)a | ds0 | (uintptr_t)b | ds1) % 32 == 0 &&
        __builtin_cpu_supports("avx2")) {
        copy_pair_avx2(a, ds0, sa, b, ds1, sb, sstride, len, count);
        nt_fence();
        return;
    }
#endif
    if (len < NT_PIECE_MIN) {
        for (size_t k = 0; k < count; k++) {
            memcpy(a + k * ds0, sa + k * sstride, len);
            memcpy(b + k * ds1, sb + k * sstride, len);
        }
        return;
    }
    for (size_t k = 0; k < count; k++) {
        copy_nt(a + k * ds0, 0, sa + k * sstride, 0, len, 1);
        copy_nt(b + k * ds1, 0, sb + k * sstride, 0, len, 1);
    }
    nt_fence();
}

int kvt__shm_run_check(const kvt__shm_run_t *r, uint64_t *span_p)
{
    uint64_t len = r->len, cnt = r->count, stride = r->rstride, span;

    if (cnt == 0 || len == 0 || stride < len || r->off > KVT_SHM_STAGE_BYTES ||
        cnt > (KVT_SHM_STAGE_BYTES - r->off) / len)
        return 0;
    /* (cnt - 1) * stride + len without overflow. */
    if (cnt > 1 && stride > (UINT64_MAX - len) / (cnt - 1))
        return 0;
    span = (cnt - 1) * stride + len;
    if (r->raddr > UINT64_MAX - span)
        return 0;
    *span_p = span;
    return 1;
}

void kvt__shm_futex_wait(_Atomic uint32_t *word, uint32_t expected,
                         int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;

    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tsp = &ts;
    }
    /* Not FUTEX_PRIVATE: the word is in memory shared with a peer. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp, NULL, 0);
}

void kvt__shm_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
