/*
 * launch.c — kernel launches.  Every function is a "duration kernel": its
 * first parameter is a uint64_t giving how long it runs, in ns
 * (`*(uint64_t *)kernelParams[0]`, or the first 8 bytes of the
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer when arguments come through
 * `extra`).  A kernel with neither runs for 0 ns.  A function named
 * "krex_fault..." faults (an illegal address, fault.c).
 */
#include "fakecuda.h"

#include <stdio.h>
#include <string.h>

static CUresult kernel_duration(void **kernelParams, void **extra, uint64_t *out)
{
    *out = 0;
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams) {
        if (kernelParams[0])
            memcpy(out, kernelParams[0], sizeof *out);
    } else if (extra) {
        const void *buf = NULL;
        size_t size = 0;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                memcpy(&size, extra[i + 1], sizeof size);
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (buf && size >= sizeof *out)
            memcpy(out, buf, sizeof *out);
    }
    if (*out > FC_MAX_KERNEL_NS) {
        fprintf(stderr,
                "fakecuda: kernel duration %llu ns is over the %llu ns limit; a fake kernel's "
                "first argument is its duration in ns\n",
                (unsigned long long)*out, (unsigned long long)FC_MAX_KERNEL_NS);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* A CUfunction, or a CUkernel passed in its place (allowed since CUDA 12). */
static bool valid_function(CUfunction f)
{
    if (f == NULL)
        return false;
    /* Both structures start with their uint32_t tag (C11 6.7.2.1p15). */
    uint32_t tag;
    memcpy(&tag, (const void *)f, sizeof tag);
    return tag == FC_MAGIC_FUNC || tag == FC_MAGIC_KERNEL;
}

static const char *function_name(CUfunction f)
{
    uint32_t tag;
    memcpy(&tag, (const void *)f, sizeof tag);
    return tag == FC_MAGIC_KERNEL ? ((struct CUkern_st *)(void *)f)->func.name
                                  : ((struct CUfunc_st *)(void *)f)->name;
}

static CUresult launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                       unsigned int bx, unsigned int by, unsigned int bz, CUstream hStream,
                       void **kernelParams, void **extra, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (!valid_function(f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 ||
        (uint64_t)bx * by * bz > 1024 || bz > 64)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t duration = 0;
    r = kernel_duration(kernelParams, extra, &duration);
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *s = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS)
        r = fc_stream_resolve(hStream, per_thread, &s);
    /* A launch that grows the context's local memory needs device memory. */
    if (r == CUDA_SUCCESS && s->capture == NULL)
        r = fc_mem_working(fc.phys[s->ctx->device]);
    if (r == CUDA_SUCCESS)
        r = fc_submit(s, FC_KIND_KERNEL, duration, NULL);
    if (r == CUDA_SUCCESS && fc_fault_kernel(function_name(f)))
        fc_fault_raise(fc.phys[ctx->device]); /* fault.c: sticky from the next call */
    fc_unlock();
    return r;
}

FC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra)
{
    FC_ENTRY();
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, false);
}

FC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra)
{
    FC_ENTRY();
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, true);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra, bool per_thread)
{
    if (config == NULL || (config->numAttrs && config->attrs == NULL))
        return fc_check_init() == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE
                                               : CUDA_ERROR_NOT_INITIALIZED;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, kernelParams, extra,
                  per_thread);
}

FC_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra)
{
    FC_ENTRY();
    return launch_ex(config, f, kernelParams, extra, false);
}

FC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra)
{
    FC_ENTRY();
    return launch_ex(config, f, kernelParams, extra, true);
}
