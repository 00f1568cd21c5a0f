/*
 * hip_launch.c — kernel launches and modules through HIP, on the engine's
 * duration kernels (tests/fakecuda/launch.c, module.c): a kernel's first
 * argument is a uint64_t, the time it runs in ns (`*(uint64_t *)args[0]`,
 * or the first 8 bytes of the HIP_LAUNCH_PARAM_BUFFER_POINTER buffer).
 *
 * hipLaunchKernel takes a host function pointer as the kernel: any non-NULL
 * pointer is one.  Each pointer becomes a function of one module the
 * runtime loads for the process, named after the symbol dladdr finds at
 * that address (a hipcc host stub carries the kernel's mangled name), so a
 * function named krex_fault... faults as on the fake CUDA driver; without
 * a symbol the name is "hipkernel@<address>".
 *
 * Any module image is accepted and every name resolves; hipModuleLoad only
 * needs a readable file (else hipErrorFileNotFound).
 * hipExtModuleLaunchKernel's work sizes are in threads: the grid is
 * global / local, rounded up; its events are recorded on the stream just
 * before and after the kernel.
 */
#include "fakehip.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* HIP's extra array (HIP_LAUNCH_PARAM_*) as the engine's (CU_LAUNCH_PARAM_*):
 * the markers differ (HIP ends with 0x03, CUDA with 0x00). */
static hipError_t translate_extra(void **extra, void *out[5])
{
    size_t n = 0;
    for (size_t i = 0; extra[i] != HIP_LAUNCH_PARAM_END; i += 2) {
        if (n >= 4)
            return hipErrorInvalidValue;
        if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER)
            out[n++] = CU_LAUNCH_PARAM_BUFFER_POINTER;
        else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE)
            out[n++] = CU_LAUNCH_PARAM_BUFFER_SIZE;
        else
            return hipErrorInvalidValue;
        out[n++] = extra[i + 1];
    }
    out[n] = CU_LAUNCH_PARAM_END;
    return hipSuccess;
}

static hipError_t launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                         hipStream_t stream, void **params, void **extra)
{
    void *cu_extra[5];
    if (extra) {
        hipError_t e = translate_extra(extra, cu_extra);
        if (e != hipSuccess)
            return e;
    }
    return fh_from_cu(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, (CUstream)(void *)stream,
                                     params, extra ? cu_extra : NULL));
}

/* ---- kernels by host pointer ---- */

struct host_kernel {
    const void *key;
    CUfunction fn;
};

/* Open addressing, grown at half full; guarded by hk_mu. */
static pthread_mutex_t hk_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_kernel *hk;
static size_t hk_cap, hk_count;
static CUmodule hk_module; /* the runtime's module of host-pointer kernels */

static size_t hk_slot(const struct host_kernel *tab, size_t cap, const void *key)
{
    size_t i = ((uintptr_t)key >> 4) * 0x9e3779b97f4a7c15ull & (cap - 1);
    while (tab[i].key && tab[i].key != key)
        i = (i + 1) & (cap - 1);
    return i;
}

static bool hk_grow(void)
{
    size_t cap = hk_cap ? hk_cap * 2 : 256;
    struct host_kernel *tab = calloc(cap, sizeof *tab);
    if (tab == NULL)
        return false;
    for (size_t i = 0; i < hk_cap; i++)
        if (hk[i].key)
            tab[hk_slot(tab, cap, hk[i].key)] = hk[i];
    free(hk);
    hk = tab;
    hk_cap = cap;
    return true;
}

static hipError_t host_kernel(const void *key, CUfunction *out)
{
    static const char image[] = "fake hip code object";
    hipError_t e = hipSuccess;
    pthread_mutex_lock(&hk_mu);
    if (hk_module == NULL)
        e = fh_from_cu(cuModuleLoadData(&hk_module, image));
    if (e == hipSuccess && 2 * (hk_count + 1) > hk_cap && !hk_grow())
        e = hipErrorOutOfMemory;
    size_t i = e == hipSuccess ? hk_slot(hk, hk_cap, key) : 0;
    if (e == hipSuccess && hk[i].key == NULL) {
        char name[128];
        Dl_info info;
        if (dladdr(key, &info) && info.dli_sname && info.dli_saddr == key)
            snprintf(name, sizeof name, "%s", info.dli_sname);
        else
            snprintf(name, sizeof name, "hipkernel@%p", key);
        e = fh_from_cu(cuModuleGetFunction(&hk[i].fn, hk_module, name));
        if (e == hipSuccess) {
            hk[i].key = key;
            hk_count++;
        }
    }
    if (e == hipSuccess)
        *out = hk[i].fn;
    pthread_mutex_unlock(&hk_mu);
    return e;
}

FH_API hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
                                  void **args, size_t sharedMemBytes, hipStream_t stream)
{
    FC_ENTRY();
    if (function_address == NULL)
        return fh_ret(hipErrorInvalidDeviceFunction);
    if (sharedMemBytes > UINT32_MAX)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_begin();
    CUfunction f = NULL;
    if (e == hipSuccess)
        e = host_kernel(function_address, &f);
    if (e == hipSuccess)
        e = launch(f, numBlocks.x, numBlocks.y, numBlocks.z, dimBlocks.x, dimBlocks.y,
                   dimBlocks.z, (unsigned int)sharedMemBytes, stream, args, NULL);
    return fh_ret(e);
}

/* ---- modules ---- */

FH_API hipError_t hipModuleLoadData(hipModule_t *module, const void *image)
{
    FC_ENTRY();
    if (module == NULL || image == NULL)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_begin();
    CUmodule m = NULL;
    if (e == hipSuccess)
        e = fh_from_cu(cuModuleLoadData(&m, image));
    if (e == hipSuccess)
        *module = (hipModule_t)(void *)m;
    return fh_ret(e);
}

FH_API hipError_t hipModuleLoad(hipModule_t *module, const char *fname)
{
    FC_ENTRY();
    if (module == NULL || fname == NULL)
        return fh_ret(hipErrorInvalidValue);
    if (access(fname, R_OK) != 0)
        return fh_ret(hipErrorFileNotFound);
    return hipModuleLoadData(module, fname); /* the file's contents are not looked at */
}

FH_API hipError_t hipModuleUnload(hipModule_t module)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuModuleUnload((CUmodule)(void *)module));
    return fh_ret(e);
}

FH_API hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module,
                                       const char *kname)
{
    FC_ENTRY();
    if (function == NULL || kname == NULL)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_begin();
    CUfunction f = NULL;
    if (e == hipSuccess)
        e = fh_from_cu(cuModuleGetFunction(&f, (CUmodule)(void *)module, kname));
    if (e == hipSuccess)
        *function = (hipFunction_t)(void *)f;
    return fh_ret(e);
}

FH_API hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        hipStream_t stream, void **kernelParams, void **extra)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = launch((CUfunction)(void *)f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                   blockDimZ, sharedMemBytes, stream, kernelParams, extra);
    return fh_ret(e);
}

/* Blocks of `local` threads covering `global` threads (local > 0). */
static unsigned int blocks(uint32_t global, uint32_t local)
{
    return (unsigned int)(((uint64_t)global + local - 1) / local);
}

FH_API hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX,
                                           uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                           uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                           uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                           hipStream_t hStream, void **kernelParams,
                                           void **extra, hipEvent_t startEvent,
                                           hipEvent_t stopEvent, uint32_t flags)
{
    FC_ENTRY();
    (void)flags; /* launch flags (e.g. any-order) change nothing here */
    if (localWorkSizeX == 0 || localWorkSizeY == 0 || localWorkSizeZ == 0 ||
        sharedMemBytes > UINT32_MAX)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_begin();
    CUstream s = (CUstream)(void *)hStream;
    if (e == hipSuccess && startEvent)
        e = fh_from_cu(cuEventRecord((CUevent)(void *)startEvent, s));
    if (e == hipSuccess)
        e = launch((CUfunction)(void *)f, blocks(globalWorkSizeX, localWorkSizeX),
                   blocks(globalWorkSizeY, localWorkSizeY), blocks(globalWorkSizeZ, localWorkSizeZ),
                   localWorkSizeX, localWorkSizeY, localWorkSizeZ, (unsigned int)sharedMemBytes,
                   hStream, kernelParams, extra);
    if (e == hipSuccess && stopEvent)
        e = fh_from_cu(cuEventRecord((CUevent)(void *)stopEvent, s));
    return fh_ret(e);
}
