/*
 * hip_init.c — HIP's implicit initialization, the current device of each
 * thread and its primary context, and the visibility variables.
 *
 * Every HIP call initializes the runtime if needed (the engine's cuInit,
 * reading the environment once, tests/fakecuda/init.c).  A thread's current
 * device starts at 0 and is changed by hipSetDevice; work is submitted in
 * the device's primary context, retained the first time any thread needs it
 * and kept for the life of the process (HIP has no context API here).
 *
 * Visible GPUs, as ROCm reads them: ROCR_VISIBLE_DEVICES (the ROCr layer)
 * picks from the simulated GPUs, then HIP_VISIBLE_DEVICES (or, when it is
 * unset, CUDA_VISIBLE_DEVICES, which HIP honours too) picks from those;
 * entries are indices or UUIDs, up to the first invalid one.
 */
#include "fakehip.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

static const char *const rocr_visible[] = {"ROCR_VISIBLE_DEVICES", NULL};
static const char *const hip_visible[] = {"HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", NULL};

/* Runs when the library is loaded, before any thread can call it (the
 * loader's completion of dlopen or program start orders it before them). */
__attribute__((constructor)) static void fh_load(void)
{
    fc.vis_env[0] = rocr_visible;
    fc.vis_env[1] = hip_visible;
    fc.rocr_uuids = true; /* ROCm names GPUs "GPU-<16 hex digits>", as krexd does */
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result; /* written once under init_once */

static void init_runtime(void)
{
    init_result = cuInit(0);
}

hipError_t fh_init(void)
{
    /* pthread_once orders init_result's write before every reader. */
    pthread_once(&init_once, init_runtime);
    if (init_result != CUDA_SUCCESS)
        return fh_from_cu(init_result);
    /* A forked child of an initialized process, or a fatal fault (sticky). */
    return fh_from_cu(fc_check_init());
}

static _Thread_local int tls_device;      /* hipSetDevice's ordinal */
static _Thread_local int tls_bound = -1;  /* the device whose context is current */

static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[FC_MAX_GPUS];    /* retained once each; guarded by primary_mu */

int fh_device(void)
{
    return tls_device;
}

void fh_set_device(int dev)
{
    tls_device = dev;
}

hipError_t fh_begin(void)
{
    hipError_t e = fh_init();
    if (e != hipSuccess)
        return e;
    int dev = tls_device;
    if (tls_bound == dev)
        return hipSuccess;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&primary_mu);
    if (primary[dev] == NULL)
        r = cuDevicePrimaryCtxRetain(&primary[dev], dev);
    CUcontext ctx = primary[dev];
    pthread_mutex_unlock(&primary_mu);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS)
        return fh_from_cu(r);
    tls_bound = dev;
    return hipSuccess;
}

CUresult fh_stream(hipStream_t h, struct CUstream_st **out)
{
    /* NULL is the null stream (the engine's legacy stream of the current
     * context) and hipStreamPerThread is 0x2, the engine's
     * CU_STREAM_PER_THREAD: the legacy family's resolution fits both. */
    return fc_stream_resolve((CUstream)(void *)h, false, out);
}

/* ---- entry points ---- */

FH_API hipError_t hipInit(unsigned int flags)
{
    FC_ENTRY();
    if (flags != 0)
        return fh_ret(hipErrorInvalidValue);
    return fh_ret(fh_init());
}

/* FH_RUNTIME_VERSION, or KREX_FAKE_HIP_VERSION (a positive integer in
 * HIP_VERSION's form, major * 10000000 + minor * 100000 + patch): a test
 * plays another runtime release with it (the shim refuses one newer than its
 * table).  Read at every call: no initialization needed. */
static int runtime_version(void)
{
    const char *s = getenv("KREX_FAKE_HIP_VERSION");
    if (s && *s) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v > 0 && v <= INT32_MAX)
            return (int)v;
    }
    return FH_RUNTIME_VERSION;
}

FH_API hipError_t hipDriverGetVersion(int *driverVersion)
{
    FC_ENTRY();
    if (driverVersion == NULL)
        return fh_ret(hipErrorInvalidValue);
    *driverVersion = runtime_version();
    return fh_ret(hipSuccess);
}

FH_API hipError_t hipRuntimeGetVersion(int *runtimeVersion)
{
    FC_ENTRY();
    if (runtimeVersion == NULL)
        return fh_ret(hipErrorInvalidValue);
    *runtimeVersion = runtime_version();
    return fh_ret(hipSuccess);
}

FH_API hipError_t hipGetDeviceCount(int *count)
{
    FC_ENTRY();
    if (count == NULL)
        return fh_ret(hipErrorInvalidValue);
    *count = 0;
    hipError_t e = fh_init();
    if (e == hipSuccess)
        *count = fc.ndev;
    return fh_ret(e);
}

FH_API hipError_t hipGetDevice(int *deviceId)
{
    FC_ENTRY();
    if (deviceId == NULL)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_init();
    if (e == hipSuccess)
        *deviceId = tls_device;
    return fh_ret(e);
}

FH_API hipError_t hipSetDevice(int deviceId)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e == hipSuccess && (deviceId < 0 || deviceId >= fc.ndev))
        e = hipErrorInvalidDevice;
    if (e == hipSuccess)
        tls_device = deviceId;
    return fh_ret(e);
}

FH_API hipError_t hipDeviceGet(hipDevice_t *device, int ordinal)
{
    FC_ENTRY();
    if (device == NULL)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_init();
    if (e == hipSuccess && (ordinal < 0 || ordinal >= fc.ndev))
        e = hipErrorInvalidDevice;
    if (e == hipSuccess)
        *device = ordinal;
    return fh_ret(e);
}

FH_API hipError_t hipDeviceSynchronize(void)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuCtxSynchronize());
    if (e == hipSuccess)
        fh_hostfn_drain();
    return fh_ret(e);
}
