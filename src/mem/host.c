/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host memory domain: what the process can read and write itself,
 * detected after the device domains (which answer at no cost in a
 * process their driver is not loaded in, and in microseconds otherwise);
 * any device number for host memory
 * ("cpu:0" in Mooncake's locations) is taken as none.
 *
 * A range is host memory only when the process has it mapped, readable,
 * from end to end (/proc/self/maps). Device memory of a driver kvt does
 * not know (a CUDA pointer on a host whose kvt found no driver) is not:
 * the driver reserves its addresses without access, and taking it for
 * host memory would make every later transfer on it fail far from the
 * cause. The map is read again only when a range is not found in the
 * copy read last, so a batch of regions in one allocation reads it once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/md.h"
#include "util/log.h"

typedef struct {
    uintptr_t lo, hi; /* readable, merged with readable neighbours */
} span_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static span_t *spans;
static size_t nspans;

/* A child of fork() gets the lock free and the copy of the map as it
 * was: a thread of the parent in the middle of a reload at the fork would
 * otherwise leave the lock held in the child for good (kvt_doctor_run()
 * forks while the caller's threads register memory). The copy is still
 * right: the child has the same mappings. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void fork_after(void)
{
    pthread_mutex_unlock(&lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_after, fork_after);
}

/* Read the readable mappings, merging adjacent ones. -1 when the map
 * cannot be read (then nothing is refused: logged once). */
static int reload(void)
{
    FILE *f = fopen("/proc/self/maps", "re");
    span_t *v = NULL;
    size_t n = 0, cap = 0;
    char line[512];

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        size_t ll = strlen(line);
        /* A line longer than the buffer: skip the rest of it. */
        while (ll > 0 && line[ll - 1] != '\n') {
            if (fgets(line, sizeof(line), f) == NULL)
                break;
            ll = strlen(line);
        }
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 ||
            perms[0] != 'r')
            continue;
        if (n > 0 && v[n - 1].hi == lo) {
            v[n - 1].hi = hi;
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            span_t *nv = realloc(v, nc * sizeof(*nv));
            if (nv == NULL) {
                free(v);
                fclose(f);
                return -1;
            }
            v = nv;
            cap = nc;
        }
        v[n].lo = lo;
        v[n].hi = hi;
        n++;
    }
    fclose(f);
    free(spans);
    spans = v;
    nspans = n;
    return 0;
}

static int covered(uintptr_t lo, uintptr_t hi)
{
    size_t a = 0, b = nspans;

    while (a < b) { /* the first span ending above lo */
        size_t m = a + (b - a) / 2;
        if (spans[m].hi <= lo)
            a = m + 1;
        else
            b = m;
    }
    return a < nspans && spans[a].lo <= lo && hi <= spans[a].hi;
}

/* Whether [addr, +len) is mapped readable from end to end (1), quietly. */
int kvt__host_readable(const void *addr, size_t len)
{
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    static int said;
    int ok;

    pthread_once(&fork_once, fork_handlers);
    pthread_mutex_lock(&lock);
    ok = covered(lo, hi);
    if (!ok) {
        if (reload() != 0) {
            if (!said)
                KVT_LOG_W("register: cannot read /proc/self/maps (%s); "
                          "host memory is not checked",
                          strerror(errno));
            said = 1;
            ok = 1;
        } else {
            ok = covered(lo, hi);
        }
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

/* Host memory is what the process can read (device memory is never
 * readable: drivers reserve its addresses without access). */
static int host_detect(const void *addr, size_t len, int32_t *device_p)
{
    *device_p = -1;
    return kvt__host_readable(addr, len);
}

static kvt_status_t host_check(const void *addr, size_t len, int32_t device)
{
    (void)device;
    if (!kvt__host_readable(addr, len)) {
        KVT_LOG_E("register: [%p, +%zu) is not host memory this process can "
                  "read (device memory of a driver this kvt did not find, "
                  "or unmapped)",
                  addr, len);
        return KVT_ERR_NOT_SUPPORTED;
    }
    return KVT_OK;
}

KVT_MEM_DOMAIN_REGISTER(host, {
                                  .name = "host",
                                  .kind = KVT_MEM_HOST,
                                  .detect = host_detect,
                                  .check = host_check,
                              });
