/*
 * fakedeep — a process with two copies of the driver, as when a plugin
 * loads its own libcuda with RTLD_DEEPBIND: the copy it is linked against
 * (initialized, with a context) and a second copy opened from LIB (a path to
 * a copy of libcuda.so.1 under another name, so the loader maps it again).
 * Every launch goes through the second copy: duration kernels of KERNEL_NS,
 * each followed by cuStreamSynchronize, for SECONDS.
 *
 * usage: fakedeep LIB SECONDS KERNEL_NS
 * Prints {"distinct": true|false, "launches": N, "result": "CUDA_SUCCESS"}
 * ("distinct": the second copy's cuInit is not the linked one's).
 * Exit status: 0, 1 on a CUDA error, 2 on bad usage or a failed dlopen.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct copy {
    PFN_cuInit_v2000 Init;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDevicePrimaryCtxRetain_v7000 Retain;
    PFN_cuCtxSetCurrent_v4000 SetCurrent;
    PFN_cuModuleLoadData_v2000 LoadData;
    PFN_cuModuleGetFunction_v2000 GetFunction;
    PFN_cuLaunchKernel_v4000 Launch;
    PFN_cuStreamSynchronize_v2000 Sync;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int load(void *h, struct copy *c)
{
    /* POSIX: a dlsym result converts to a function pointer through memcpy. */
#define SYM(field, name)                                                                     \
    do {                                                                                      \
        void *p = dlsym(h, name);                                                             \
        if (p == NULL)                                                                        \
            return -1;                                                                        \
        memcpy(&c->field, &p, sizeof p);                                                      \
    } while (0)
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(Retain, "cuDevicePrimaryCtxRetain");
    SYM(SetCurrent, "cuCtxSetCurrent");
    SYM(LoadData, "cuModuleLoadData");
    SYM(GetFunction, "cuModuleGetFunction");
    SYM(Launch, "cuLaunchKernel");
    SYM(Sync, "cuStreamSynchronize");
#undef SYM
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: fakedeep LIB SECONDS KERNEL_NS\n");
        return 2;
    }
    double seconds = atof(argv[2]);
    uint64_t kernel_ns = strtoull(argv[3], NULL, 10);
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev))
        return 1;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    struct copy c;
    if (h == NULL || load(h, &c) != 0) {
        fprintf(stderr, "fakedeep: %s: %s\n", argv[1], dlerror());
        return 2;
    }
    CUmodule mod;
    CUfunction fn;
    CUresult r = c.Init(0);
    if (!r) r = c.DeviceGet(&dev, 0);
    if (!r) r = c.Retain(&ctx, dev);
    if (!r) r = c.SetCurrent(ctx);
    if (!r) r = c.LoadData(&mod, "image");
    if (!r) r = c.GetFunction(&fn, mod, "duration");
    long launches = 0;
    void *params[] = {&kernel_ns};
    for (double end = now_s() + seconds; !r && now_s() < end; launches++) {
        r = c.Launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        if (!r)
            r = c.Sync(NULL);
    }
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("{\"distinct\": %s, \"launches\": %ld, \"result\": \"%s\"}\n",
           (void *)c.Init != (void *)cuInit ? "true" : "false", launches, name);
    return r ? 1 : 0;
}
