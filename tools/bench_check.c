/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt bench's walks, its --verify pattern, and the target's side of the
 * initiator's requests.
 *
 * Requests and answers are notifications of text, "kvt-bench/1 " and
 * then:
 *   cpu                                  -> cpu SECONDS
 *   fill SEED                            -> filled | error WHY
 *   verify SEED BASE N BLOCK MUL COUNT   -> verified CHECKED BAD | error WHY
 * "verify" checks one initiator thread's walk: N slots of BLOCK bytes from
 * BASE (an offset into the target's buffer) visited with multiplier MUL,
 * COUNT descriptors in all. A slot's last writer is the last descriptor k
 * < COUNT whose slot it is; what it wrote is the pattern of its offset in
 * pass k / N. Slots never written are not checked.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"

#define PREFIX "kvt-bench/1 "

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The inverse of @a mod @n (gcd(a, n) == 1), by extended Euclid. */
static uint64_t inverse(uint64_t a, uint64_t n)
{
    __int128 t = 0, nt = 1, r = n, nr = a;

    while (nr != 0) {
        __int128 q = r / nr, x;
        x = t - q * nt;
        t = nt;
        nt = x;
        x = r - q * nr;
        r = nr;
        nr = x;
    }
    if (t < 0)
        t += n;
    return (uint64_t)t;
}

int bench_walk_init(bench_walk_t *w, uint64_t n, int scatter, double frac)
{
    uint64_t m;

    w->n = n;
    w->mul = w->inv = 1;
    if (!scatter)
        return 0;
    if (n < 4)
        return -1;
    /* A stride far from 1 and n-1 (a fraction of the way round), moved
     * to the next value coprime to n. */
    m = (uint64_t)((double)n * frac);
    for (uint64_t tries = 0;; tries++, m++) {
        if (tries == n)
            return -1; /* n = 4 or 6: no such stride */
        if (m >= n)
            m %= n;
        if (m > 1 && m != n - 1 && gcd(m, n) == 1)
            break;
    }
    w->mul = m;
    w->inv = inverse(m, n);
    return 0;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t word(uint64_t idx, uint64_t pass, uint64_t seed)
{
    return mix(idx ^ (pass << 40) ^ (seed << 56) ^ seed);
}

/*
 * Walk the pattern of bytes [off, off+len) in pass @pass: @buf is filled
 * with it (@check 0), or compared with it (@check 1: returns 1 at the
 * first byte that differs). Word by word, with partial words at either
 * end, so any offset and length work.
 */
static int pattern(unsigned char *buf, uint64_t off, uint64_t len,
                   uint64_t pass, uint64_t seed, int check)
{
    uint64_t end = off + len;

    while (off < end) {
        uint64_t w = word(off >> 3, pass, seed);
        unsigned skip = (unsigned)(off & 7);
        uint64_t n = 8 - skip;

        if (n > end - off)
            n = end - off;
        if (!check)
            memcpy(buf, (unsigned char *)&w + skip, n);
        else if (memcmp(buf, (unsigned char *)&w + skip, n) != 0)
            return 1;
        buf += n;
        off += n;
    }
    return 0;
}

void bench_fill(void *dst, uint64_t off, uint64_t len, uint64_t pass,
                uint64_t seed)
{
    pattern(dst, off, len, pass, seed, 0);
}

int bench_differs(const void *src, uint64_t off, uint64_t len, uint64_t pass,
                  uint64_t seed)
{
    /* Only read when checking. */
    return pattern((unsigned char *)(uintptr_t)src, off, len, pass, seed, 1);
}

double bench_cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The answer to one request (without the prefix) into @out. */
static void answer(const char *req, void *buf, uint64_t len, char *out,
                   size_t outsz)
{
    uint64_t seed, base, n, block, mul, count, checked = 0, bad = 0;
    bench_walk_t w;

    if (strcmp(req, "cpu") == 0) {
        snprintf(out, outsz, "cpu %.6f", bench_cpu_s());
    } else if (sscanf(req, "fill %" SCNu64, &seed) == 1) {
        if (buf == NULL) {
            snprintf(out, outsz, "error the buffer is not host memory");
            return;
        }
        bench_fill(buf, 0, len, 0, seed);
        snprintf(out, outsz, "filled");
    } else if (sscanf(req,
                      "verify %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                      " %" SCNu64 " %" SCNu64,
                      &seed, &base, &n, &block, &mul, &count) == 6) {
        if (buf == NULL) {
            snprintf(out, outsz, "error the buffer is not host memory");
            return;
        }
        if (n == 0 || block == 0 || mul == 0 || (n > 1 && mul >= n) ||
            gcd(mul, n) != 1 || block > len || base > len - block ||
            (n - 1) > (len - block - base) / block) {
            snprintf(out, outsz, "error walk outside the buffer");
            return;
        }
        w.n = n;
        w.mul = mul;
        w.inv = inverse(mul, n);
        for (uint64_t s = 0; s < n; s++) {
            uint64_t j = s * w.inv % n, k;
            if (j >= count)
                continue; /* never written */
            k = j + (count - 1 - j) / n * n;
            checked++;
            bad +=
                (uint64_t)bench_differs((char *)buf + base + s * block,
                                        base + s * block, block, k / n, seed);
        }
        snprintf(out, outsz, "verified %" PRIu64 " %" PRIu64, checked, bad);
    } else {
        snprintf(out, outsz, "error unknown request");
    }
}

void bench_target_serve(kvt_engine_h e, void *buf, uint64_t len,
                        const sigset_t *set)
{
    const struct timespec zero = {0, 0};
    kvt_notify_t *in = malloc(sizeof(*in));
    char out[256];

    for (;;) {
        size_t got = 0;
        kvt_segment_t seg;

        if (sigtimedwait(set, NULL, &zero) >= 0)
            break;
        if (in == NULL) { /* no requests then: wait for the signal */
            sigwaitinfo(set, NULL);
            break;
        }
        if (kvt_notify_recv(e, in, 1, &got, 100) != KVT_OK || got == 0)
            continue;
        if (in->length <= strlen(PREFIX) ||
            memcmp(in->data, PREFIX, strlen(PREFIX)) != 0)
            continue;
        in->data[in->length < KVT_NOTIFY_MAX ? in->length
                                             : KVT_NOTIFY_MAX - 1] = '\0';
        memcpy(out, PREFIX, strlen(PREFIX));
        answer(in->data + strlen(PREFIX), buf, len, out + strlen(PREFIX),
               sizeof(out) - strlen(PREFIX));
        if (kvt_segment_open(e, in->from, &seg) != KVT_OK ||
            kvt_notify_send(e, seg, out, strlen(out)) != KVT_OK)
            fprintf(stderr, "kvt bench: cannot answer %s\n", in->from);
    }
    free(in);
}

int bench_ask(kvt_engine_h e, kvt_segment_t seg, const char *req, char *reply,
              size_t replysz, int timeout_ms)
{
    kvt_notify_t *in = malloc(sizeof(*in));
    char msg[256];
    struct timespec t0, t;
    int n = snprintf(msg, sizeof(msg), PREFIX "%s", req);
    kvt_status_t st;

    if (in == NULL || n < 0 || (size_t)n >= sizeof(msg)) {
        free(in);
        return -1;
    }
    st = kvt_notify_send(e, seg, msg, (size_t)n);
    if (st != KVT_OK) {
        fprintf(stderr, "kvt bench: cannot ask the target: %s\n",
                kvt_status_str(st));
        free(in);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        size_t got = 0;
        int64_t left;

        clock_gettime(CLOCK_MONOTONIC, &t);
        left = timeout_ms - ((int64_t)(t.tv_sec - t0.tv_sec) * 1000 +
                             (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0)
            break;
        if (kvt_notify_recv(e, in, 1, &got, left) != KVT_OK || got == 0)
            continue;
        if (in->length > strlen(PREFIX) &&
            memcmp(in->data, PREFIX, strlen(PREFIX)) == 0) {
            size_t l = in->length - strlen(PREFIX);
            if (l >= replysz)
                l = replysz - 1;
            memcpy(reply, in->data + strlen(PREFIX), l);
            reply[l] = '\0';
            free(in);
            return 0;
        }
    }
    fprintf(stderr, "kvt bench: the target did not answer '%s'\n", req);
    free(in);
    return -1;
}
