/*
 * fakehip.h — internals of the fake libamdhip64 used by krex's tests.
 *
 * The fake HIP runtime is a front end on the fake CUDA driver's simulated
 * GPU (tests/fakecuda): the same objects (simgpu.o, stream.o, memshare.o,
 * ...) are linked into libamdhip64.so.6, whose version script exports only
 * the hip* names.  Each HIP call resolves what HIP adds (the calling
 * thread's current device and its implicit primary context, HIP's handle
 * values and flags) and then calls the engine: its internal functions or
 * its cu* entry points, which bind inside the library (they are not
 * exported from it, so an interposer on libcuda never sees them).  So
 * every rule of tests/fakecuda/README.md "The simulated GPU" holds here:
 * per-stream tails, legacy (null) stream ordering, sleeping synchronizes,
 * intervals fixed at enqueue, the timeline file, the shared memory state,
 * faults and MPS.  What differs is in tests/fakehip/README.md.
 *
 * Handles: a hipStream_t is the engine's CUstream (NULL: the null stream,
 * HIP's legacy default stream; hipStreamPerThread: the thread's per-thread
 * stream), a hipEvent_t its CUevent, hipModule_t / hipFunction_t its
 * CUmodule / CUfunction, hipGraph_t / hipGraphExec_t its CUgraph /
 * CUgraphExec.  They are never dereferenced as HIP types.
 */
#ifndef FAKEHIP_H
#define FAKEHIP_H

#include "hip_api.h"

#include "fakecuda.h"

/* Marks the functions exported from libamdhip64 (the version script also
 * keeps everything but hip* local).  Each starts with the engine's
 * FC_ENTRY(); (fakecuda.h): a HIP call counts as one driver call in
 * progress and blocks while its process is checkpoint-locked. */
#define FH_API __attribute__((visibility("default")))

/* hipRuntimeGetVersion / hipDriverGetVersion: a HIP_VERSION (major * 10000000
 * + minor * 100000 + patch) of HIP 6.2, the ABI the library's name
 * (libamdhip64.so.6) promises; patch 0 says it is no real build. */
#define FH_RUNTIME_VERSION 60200000

/* The calls' result, remembered for hipGetLastError (hip_error.c): an error
 * other than hipErrorNotReady becomes the thread's last error, as ROCm 6.2
 * and later do.  Every exported function returns through it. */
hipError_t fh_ret(hipError_t e);
/* The HIP code for a result of the engine. */
hipError_t fh_from_cu(CUresult r);

/* hip_init.c: the implicit initialization every HIP call makes (fh_init),
 * and with it the calling thread's current device made current as the
 * engine's primary context of that device (fh_begin).  hipSuccess or the
 * error to return. */
hipError_t fh_init(void);
hipError_t fh_begin(void);
/* The calling thread's current device (visible ordinal). */
int fh_device(void);
void fh_set_device(int dev);
/* Resolve a HIP stream handle to the engine's stream (fc.mu held). */
CUresult fh_stream(hipStream_t h, struct CUstream_st **out);

/* hip_stream.c: host functions already due (their stream reached them by
 * `now`) have run when this returns; synchronizing calls end with it. */
void fh_hostfn_drain(void);

#endif /* FAKEHIP_H */
