/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt bench's walks and --verify pattern (tools/bench_check.c): a
 * scattered walk visits every slot once per pass with no two consecutive
 * descriptors neighbours, the target's inverse finds each slot's last
 * writer, and the pattern tells passes and offsets apart.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/bench.h"
#include "kvt_test.h"

KVT_TEST(scatter_visits_each_slot_once_no_neighbours)
{
    for (uint64_t n = 5; n < 2000; n += (n < 100 ? 1 : 97)) {
        bench_walk_t w;
        char *seen = calloc(n, 1);

        if (n == 6) {
            CHECK(bench_walk_init(&w, n, 1, 0.618) == -1);
            free(seen);
            continue;
        }
        CHECK(bench_walk_init(&w, n, 1, 0.618) == 0);
        CHECK(w.mul > 1 && w.mul < n - 1);
        CHECK(w.mul * w.inv % n == 1);
        for (uint64_t k = 0; k < 3 * n; k++) {
            uint64_t a = bench_walk_slot(&w, k), b = bench_walk_slot(&w, k + 1);
            CHECK(a < n);
            CHECK(b != a + 1 && a != b + 1); /* never contiguous */
            if (k < n) {
                CHECK(!seen[a]);
                seen[a] = 1;
            }
        }
        free(seen);
    }
}

KVT_TEST(small_walks)
{
    bench_walk_t w;

    CHECK(bench_walk_init(&w, 3, 1, 0.618) == -1);
    CHECK(bench_walk_init(&w, 4, 1, 0.618) == -1);
    CHECK(bench_walk_init(&w, 1, 0, 0.618) == 0);
    CHECK(bench_walk_slot(&w, 7) == 0);
    CHECK(bench_walk_init(&w, 10, 0, 0.618) == 0);
    for (uint64_t k = 0; k < 30; k++)
        CHECK(bench_walk_slot(&w, k) == k % 10); /* contiguous */
}

/* The target's reckoning: the last descriptor below count that wrote
 * slot s, found through the inverse as tools/bench_check.c does. */
KVT_TEST(last_writer)
{
    bench_walk_t w;
    uint64_t n = 97;

    CHECK(bench_walk_init(&w, n, 1, 0.382) == 0);
    for (uint64_t count = 1; count < 5 * n; count += 13) {
        uint64_t *last = malloc(n * sizeof(*last));
        for (uint64_t s = 0; s < n; s++)
            last[s] = UINT64_MAX;
        for (uint64_t k = 0; k < count; k++)
            last[bench_walk_slot(&w, k)] = k;
        for (uint64_t s = 0; s < n; s++) {
            uint64_t j = s * w.inv % n;
            if (j >= count) {
                CHECK(last[s] == UINT64_MAX);
                continue;
            }
            CHECK(last[s] == j + (count - 1 - j) / n * n);
        }
        free(last);
    }
}

KVT_TEST(pattern)
{
    unsigned char a[4096 + 16], b[4096 + 16];

    /* Any offset and length, including unaligned ones. */
    for (uint64_t off = 0; off < 16; off++) {
        bench_fill(a, 8192 + off, 4096, 3, 42);
        CHECK(!bench_differs(a, 8192 + off, 4096, 3, 42));
        CHECK(bench_differs(a, 8192 + off, 4096, 4, 42)); /* another pass */
        CHECK(bench_differs(a, 8192 + off, 4096, 3, 43)); /* another seed */
        CHECK(bench_differs(a, 8200 + off, 4096, 3, 42)); /* another place */
        memcpy(b, a, sizeof(a));
        b[4095] ^= 1; /* one bit in the last byte */
        CHECK(bench_differs(b, 8192 + off, 4096, 3, 42));
    }
    /* A piece of a filled range matches the same offsets filled alone. */
    bench_fill(a, 100, 1000, 1, 7);
    bench_fill(b, 333, 17, 1, 7);
    CHECK(memcmp(a + 233, b, 17) == 0);
}

KVT_TEST_MAIN(KVT_CASE(scatter_visits_each_slot_once_no_neighbours, 30),
              KVT_CASE(small_walks, 10), KVT_CASE(last_writer, 30),
              KVT_CASE(pattern, 10))
