/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Driver for fuzz targets when libFuzzer is not available: runs every file
 * named on the command line (or found in directories named there), then a
 * number of pseudo-random inputs, through LLVMFuzzerTestOneInput.
 *   replay [N] [FILE|DIR ...]
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (f == NULL)
        return;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n)
        LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    fclose(f);
}

static void run_path(const char *path)
{
    struct stat st;
    DIR *d;
    struct dirent *de;
    char sub[4096];

    if (stat(path, &st) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    d = opendir(path);
    while (d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
        run_path(sub);
    }
    if (d)
        closedir(d);
}

int main(int argc, char **argv)
{
    unsigned long n = 100000, x = 88172645463325252ul;
    int first = 1;
    uint8_t buf[4096];

    if (argc > 1 && strspn(argv[1], "0123456789") == strlen(argv[1])) {
        n = strtoul(argv[1], NULL, 10);
        first = 2;
    }
    for (int i = first; i < argc; i++)
        run_path(argv[i]);
    for (unsigned long i = 0; i < n; i++) {
        size_t len = (size_t)(x % sizeof(buf));
        for (size_t k = 0; k < len; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[k] = (uint8_t)x;
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("replayed %lu random inputs\n", n);
    return 0;
}
