/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TEST_H
#define KVT_TEST_H

/*
 * A small test harness. A test program defines its cases with
 * KVT_TEST(name) and lists them in a KVT_TEST_MAIN(...) table. Each case
 * runs in a forked child with a time limit, so a crash or a hang fails that
 * case only. Exit status: 0 all passed, 1 a case failed, 77 all skipped.
 * Arguments: case names to run (default all); --list.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvt/kvt.h>

#define KVT_TEST_SKIP 77

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_ST(expr, want)                                                   \
    do {                                                                       \
        kvt_status_t st_ = (expr);                                             \
        kvt_status_t want_ = (want);                                           \
        if (st_ != want_) {                                                    \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__,  \
                    __LINE__, #expr, kvt_status_name(st_),                     \
                    kvt_status_name(want_));                                   \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_OK(expr) CHECK_ST(expr, KVT_OK)

#define SKIP(why)                                                              \
    do {                                                                       \
        fprintf(stderr, "skipped: %s\n", why);                                 \
        exit(KVT_TEST_SKIP);                                                   \
    } while (0)

typedef struct {
    const char *name;
    void (*fn)(void);
    int timeout_s;
} kvt_test_case_t;

#define KVT_TEST(name) static void test_##name(void)
#define KVT_CASE(name, timeout)                                                \
    {                                                                          \
#name, test_##name, timeout                                            \
    }

static inline double kvt_test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The median of @n timings (sorted in place). */
static inline int kvt_test_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static inline double kvt_test_median(double *v, size_t n)
{
    qsort(v, n, sizeof(v[0]), kvt_test_cmp_double);
    return v[n / 2];
}

/* Lines of the file @path that contain @what. */
static inline int kvt_test_count_in_file(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;

    CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

/* This process's stderr (its log, and that of the children it forks from
 * now on) into a fresh file made from the mkstemp() template @path;
 * returns a descriptor of the old stderr for kvt_test_log_back(). */
static inline int kvt_test_log_to(char *path)
{
    int fd = mkstemp(path), old = dup(2);

    CHECK(fd >= 0 && old >= 0);
    CHECK(dup2(fd, 2) == 2);
    close(fd);
    return old;
}

static inline void kvt_test_log_back(int old)
{
    CHECK(dup2(old, 2) == 2);
    close(old);
}

/* Scale time limits under sanitizers, which run several times slower. */
static inline double kvt_test_slowdown(void)
{
    const char *s = getenv("KVT_SANITIZED");
    return (s && *s == '1') ? 4.0 : 1.0;
}

static inline int kvt_test_run(const kvt_test_case_t *tc)
{
    double t0 = kvt_test_now(), limit = tc->timeout_s * kvt_test_slowdown();
    int status = 0;
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        tc->fn();
        exit(0); /* not _exit: LeakSanitizer checks at exit */
    }
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (kvt_test_now() - t0 > limit) {
            fprintf(stderr, "case %s: timed out after %.0f s\n", tc->name,
                    limit);
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 1;
        }
        usleep(2000);
    }
    /* Reap anything the case left in its process group. */
    kill(-pid, SIGKILL);
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    fprintf(stderr, "case %s: killed by signal %d\n", tc->name,
            WTERMSIG(status));
    return 1;
}

static inline int kvt_test_main(const kvt_test_case_t *cases, size_t n,
                                int argc, char **argv)
{
    int failed = 0, passed = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        int want = argc <= 1, rc;
        double t0;
        for (int a = 1; a < argc; a++) {
            if (strcmp(argv[a], "--list") == 0) {
                printf("%s\n", cases[i].name);
                want = 0;
                break;
            }
            if (strcmp(argv[a], cases[i].name) == 0)
                want = 1;
        }
        if (!want)
            continue;
        t0 = kvt_test_now();
        rc = kvt_test_run(&cases[i]);
        if (rc == 0)
            passed++;
        else if (rc == KVT_TEST_SKIP)
            skipped++;
        else
            failed++;
        printf("%s %s (%.2f s)\n",
               rc == 0               ? "ok  "
               : rc == KVT_TEST_SKIP ? "skip"
                                     : "FAIL",
               cases[i].name, kvt_test_now() - t0);
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed)
        return 1;
    return (passed == 0 && skipped > 0) ? KVT_TEST_SKIP : 0;
}

#define KVT_TEST_MAIN(...)                                                     \
    int main(int argc, char **argv)                                            \
    {                                                                          \
        static const kvt_test_case_t cases_[] = {__VA_ARGS__};                 \
        return kvt_test_main(cases_, sizeof(cases_) / sizeof(cases_[0]), argc, \
                             argv);                                            \
    }

#endif
