/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device's own copy rates, the ceilings bench/gpu-check sets kvt's
 * device-memory figures beside: the same blocks, the same batch, copied
 * by the driver alone (cuMemcpyAsync on one stream, a synchronisation per
 * batch, as kvt bench waits for each batch).
 *   kvt_gpu_copy dtod SECONDS BLOCK BATCH SRCDEV DSTDEV
 *                   device to device (peer copies when the devices differ)
 *   kvt_gpu_copy htod SECONDS BLOCK BATCH DEV
 *                   pageable host memory (as kvt bench's) to the device
 * Prints one line of JSON: {"mode":..,"gbps":..}. Exits 77 without a
 * driver or a device. The driver is $KVT_CUDA_LIBRARY or libcuda.so.1.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
} cu;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int load(void)
{
    const char *lib = getenv("KVT_CUDA_LIBRARY");
    void *h = dlopen(lib && lib[0] ? lib : "libcuda.so.1", RTLD_NOW);
    int n = 0;

    if (h == NULL)
        return -1;
#define S(f, name)                                                             \
    if ((*(void **)&cu.f = dlsym(h, name)) == NULL)                            \
        return -1;
    S(Init, "cuInit")
    S(DeviceGetCount, "cuDeviceGetCount")
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
    S(CtxSetCurrent, "cuCtxSetCurrent")
    S(MemAlloc, "cuMemAlloc_v2")
    S(MemcpyAsync, "cuMemcpyAsync")
    S(StreamCreate, "cuStreamCreate")
    S(StreamSynchronize, "cuStreamSynchronize")
#undef S
    if (cu.Init(0) != CUDA_SUCCESS || cu.DeviceGetCount(&n) != CUDA_SUCCESS ||
        n <= 0)
        return -1;
    return n;
}

static CUdeviceptr dev_alloc(int dev, size_t len)
{
    CUcontext c;
    CUdeviceptr p = 0;

    if (cu.DevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS ||
        cu.CtxSetCurrent(c) != CUDA_SUCCESS ||
        cu.MemAlloc(&p, len) != CUDA_SUCCESS) {
        fprintf(stderr, "kvt_gpu_copy: cannot allocate %zu bytes on %d\n", len,
                dev);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    double secs, t0, t;
    size_t block, batch, span;
    uint64_t bytes = 0;
    CUdeviceptr src, dst;
    CUstream st;
    int ndev, htod;

    if (argc < 6 || (strcmp(argv[1], "dtod") && strcmp(argv[1], "htod")) ||
        (strcmp(argv[1], "dtod") == 0 && argc < 7)) {
        fprintf(stderr, "usage: kvt_gpu_copy dtod SECONDS BLOCK BATCH SRC DST"
                        "\n       kvt_gpu_copy htod SECONDS BLOCK BATCH DEV\n");
        return 2;
    }
    ndev = load();
    if (ndev < 0) {
        fprintf(stderr, "kvt_gpu_copy: no CUDA driver or no device\n");
        return 77;
    }
    htod = strcmp(argv[1], "htod") == 0;
    secs = atof(argv[2]);
    block = strtoull(argv[3], NULL, 0);
    batch = strtoull(argv[4], NULL, 0);
    span = block * batch;
    if (htod) {
        int dev = atoi(argv[5]);
        void *h = malloc(span);
        if (h == NULL || dev >= ndev)
            return 1;
        memset(h, 1, span);
        src = (CUdeviceptr)(uintptr_t)h;
        dst = dev_alloc(dev, span);
    } else {
        int sd = atoi(argv[5]), dd = atoi(argv[6]);
        if (sd >= ndev || dd >= ndev)
            return 77;
        src = dev_alloc(sd, span);
        dst = dev_alloc(dd, span);
    }
    if (cu.StreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return 1;
    t0 = now_s();
    do {
        for (size_t i = 0; i < batch; i++)
            if (cu.MemcpyAsync(dst + i * block, src + i * block, block, st) !=
                CUDA_SUCCESS)
                return 1;
        if (cu.StreamSynchronize(st) != CUDA_SUCCESS)
            return 1;
        bytes += span;
        t = now_s();
    } while (t - t0 < secs);
    printf("{\"mode\":\"%s\",\"block\":%zu,\"batch\":%zu,\"seconds\":%.3f,"
           "\"gbps\":%.4f}\n",
           argv[1], block, batch, t - t0, (double)bytes / (t - t0) / 1e9);
    return 0;
}
