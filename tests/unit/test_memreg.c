/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/memreg.h"
#include "kvt_test.h"
#include "mem/md.h"
#include "util/sock.h"

static kvt__region_t R(uint64_t a, uint64_t len, uint32_t acc)
{
    kvt__region_t r = {.start = a,
                       .end = a + len,
                       .access = acc,
                       .kind = KVT_MEM_HOST,
                       .device = -1};
    return r;
}

KVT_TEST(add_lookup_remove)
{
    kvt__memreg_t reg;
    kvt__region_t r[3] = {R(0x3000, 0x1000, KVT_ACCESS_REMOTE_RW),
                          R(0x1000, 0x1000, KVT_ACCESS_REMOTE_READ),
                          R(0x8000, 0x100, KVT_ACCESS_REMOTE_WRITE)};
    kvt__region_t out;
    CHECK_OK(kvt__memreg_init(&reg));
    CHECK_OK(kvt__memreg_add(&reg, r, 3));
    CHECK(kvt__memreg_contains(&reg, 0x3000, 0x1000, KVT_ACCESS_REMOTE_RW));
    CHECK(kvt__memreg_contains(&reg, 0x3800, 0x10, KVT_ACCESS_REMOTE_WRITE));
    CHECK(!kvt__memreg_contains(&reg, 0x3800, 0x801, 0));  /* crosses end */
    CHECK(!kvt__memreg_contains(&reg, 0x2fff, 2, 0));      /* crosses start */
    CHECK(!kvt__memreg_contains(&reg, 0x2000, 0x1000, 0)); /* gap */
    CHECK(kvt__memreg_contains(&reg, 0x1000, 1, KVT_ACCESS_REMOTE_READ));
    CHECK(!kvt__memreg_contains(&reg, 0x1000, 1, KVT_ACCESS_REMOTE_WRITE));
    CHECK(!kvt__memreg_contains(&reg, 0x8000, 1, KVT_ACCESS_REMOTE_READ));
    CHECK(!kvt__memreg_contains(&reg, 0x1000, 0, 0));
    CHECK(!kvt__memreg_contains(&reg, UINT64_MAX, 2, 0));
    kvt__memreg_rdlock(&reg);
    CHECK(kvt__memreg_count_locked(&reg) == 3 &&
          kvt__memreg_at_locked(&reg, 0)->start == 0x1000 &&
          kvt__memreg_at_locked(&reg, 1)->start == 0x3000 &&
          kvt__memreg_at_locked(&reg, 2)->start == 0x8000);
    CHECK(kvt__memreg_find_locked(&reg, 0x3800, 0x800) ==
          kvt__memreg_at_locked(&reg, 1));
    CHECK(kvt__memreg_find_locked(&reg, 0x3800, 0x801) == NULL);
    CHECK(kvt__memreg_overlaps_locked(&reg, 0x2fff, 0x3001));
    CHECK(!kvt__memreg_overlaps_locked(&reg, 0x2000, 0x3000));
    kvt__memreg_unlock(&reg);
    CHECK(kvt__memreg_gen(&reg) == 0);
    CHECK_ST(kvt__memreg_remove(&reg, 0x3001, &out), KVT_ERR_NOT_FOUND);
    CHECK_OK(kvt__memreg_remove(&reg, 0x3000, &out));
    CHECK(out.start == 0x3000 && out.end == 0x4000 &&
          out.access == KVT_ACCESS_REMOTE_RW);
    CHECK(kvt__memreg_gen(&reg) == 1);
    CHECK(!kvt__memreg_contains(&reg, 0x3000, 1, 0));
    CHECK_ST(kvt__memreg_remove(&reg, 0x3000, &out), KVT_ERR_NOT_FOUND);
    kvt__memreg_fini(&reg);
}

KVT_TEST(overlaps_refused)
{
    kvt__memreg_t reg;
    kvt__region_t a = R(0x10000, 0x1000, 1);
    kvt__region_t bad[] = {R(0x10000, 0x1000, 1), R(0xff00, 0x200, 1),
                           R(0x10fff, 1, 1), R(0xf000, 0x3000, 1)};
    kvt__region_t pair[2] = {R(0x20000, 0x100, 1), R(0x200f0, 0x100, 1)};
    CHECK_OK(kvt__memreg_init(&reg));
    CHECK_OK(kvt__memreg_add(&reg, &a, 1));
    for (size_t i = 0; i < 4; i++)
        CHECK_ST(kvt__memreg_add(&reg, &bad[i], 1), KVT_ERR_EXISTS);
    /* Overlap inside one batch: nothing of it is registered. */
    CHECK_ST(kvt__memreg_add(&reg, pair, 2), KVT_ERR_EXISTS);
    CHECK(!kvt__memreg_contains(&reg, 0x20000, 1, 0));
    /* Adjacent is fine. */
    a = R(0x11000, 0x1000, 1);
    CHECK_OK(kvt__memreg_add(&reg, &a, 1));
    a = R(0, 10, 1);
    CHECK_ST(kvt__memreg_add(&reg, &a, 1), KVT_ERR_INVALID_PARAM);
    a = R(0x50000, 0, 1);
    CHECK_ST(kvt__memreg_add(&reg, &a, 1), KVT_ERR_INVALID_PARAM);
    a = R(0x50000, 10, 0x80);
    CHECK_ST(kvt__memreg_add(&reg, &a, 1), KVT_ERR_INVALID_PARAM);
    kvt__memreg_fini(&reg);
}

KVT_TEST(many_regions)
{
    kvt__memreg_t reg;
    CHECK_OK(kvt__memreg_init(&reg));
    /* Insert in a scrambled order; the array must stay sorted. */
    for (uint64_t i = 0; i < 5000; i++) {
        uint64_t k = (i * 7919) % 5000;
        kvt__region_t r = R(0x100000 + k * 0x2000, 0x1000, 3);
        CHECK_OK(kvt__memreg_add(&reg, &r, 1));
    }
    for (uint64_t k = 0; k < 5000; k++) {
        CHECK(kvt__memreg_contains(&reg, 0x100000 + k * 0x2000 + 5, 0x100, 3));
        CHECK(
            !kvt__memreg_contains(&reg, 0x100000 + k * 0x2000 + 0x1000, 1, 0));
    }
    kvt__memreg_fini(&reg);
}

KVT_TEST(hostport)
{
    char host[64];
    uint16_t port;
    CHECK_OK(
        kvt__sock_split_hostport("127.0.0.1:80", host, sizeof(host), &port));
    CHECK(strcmp(host, "127.0.0.1") == 0 && port == 80);
    CHECK_OK(kvt__sock_split_hostport("[::1]:9000", host, sizeof(host), &port));
    CHECK(strcmp(host, "::1") == 0 && port == 9000);
    CHECK_OK(kvt__sock_split_hostport("node-3.local:65535", host, sizeof(host),
                                      &port));
    const char *bad[] = {
        "",           "host",     "host:",   ":80",    "host:0",
        "host:65536", "host:12x", "[::1]80", "[::1:80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_ST(kvt__sock_split_hostport(bad[i], host, sizeof(host), &port),
                 KVT_ERR_INVALID_PARAM);
    CHECK_ST(
        kvt__sock_split_hostport("averyveryverylonghostname:1", host, 8, &port),
        KVT_ERR_INVALID_PARAM);
}

/* ---- The host map's lock across fork() --------------------------------- */

static atomic_int stop_reload;

static void *reloader(void *arg)
{
    (void)arg;
    /* Nothing is mapped at 4 KiB: every call reads /proc/self/maps again,
     * holding the map's lock meanwhile. */
    while (!atomic_load(&stop_reload))
        (void)kvt__host_readable((void *)(uintptr_t)0x1000, 4096);
    return NULL;
}

/* A fork() while another thread reads the map under its lock: the child's
 * own check must not wait for a lock that no thread of it will free
 * (kvt_doctor_run() forks while the caller's threads register memory).
 * Without the fork handlers a child hung within the first few forks. */
KVT_TEST(host_map_lock_at_fork)
{
    pthread_t th;
    int hung = 0, i;

    atomic_store(&stop_reload, 0);
    CHECK(pthread_create(&th, NULL, reloader, NULL) == 0);
    for (i = 0; i < 20 && !hung; i++) {
        int status = 0;
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            alarm(5);
            _exit(kvt__host_readable(&status, sizeof(status)) == 1 ? 0 : 1);
        }
        CHECK(waitpid(pid, &status, 0) == pid);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            hung = 1;
        else
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    atomic_store(&stop_reload, 1);
    CHECK(pthread_join(th, NULL) == 0);
    if (hung)
        fprintf(stderr, "fork %d: the child's check hung\n", i);
    CHECK(!hung);
}

KVT_TEST_MAIN(KVT_CASE(add_lookup_remove, 10), KVT_CASE(overlaps_refused, 10),
              KVT_CASE(many_regions, 30), KVT_CASE(hostport, 10),
              KVT_CASE(host_map_lock_at_fork, 40))
