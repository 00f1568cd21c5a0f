/*
 * hipinterpose.h — how the shim reaches the real HIP runtime
 * (hipinterpose.c): libamdhip64's handle, loaded only by a process that
 * calls a HIP hook, each real function bound lazily, the refusal of a
 * runtime the table cannot gate, and the dlsym decision for HIP names.
 * Needs no HIP header: the functions are the table's ABI prototypes
 * (hip_entrypoints.gen.h).  Internal, hidden.
 */
#ifndef KREX_HIPINTERPOSE_H
#define KREX_HIPINTERPOSE_H

#include "base.h"
#include "hip_entrypoints.gen.h"

/* HIP's values the shim uses (hip_runtime_api.h; the same numbers in every
 * ROCm release). */
#define KREX_HIP_SUCCESS 0
#define KREX_HIP_ERROR_OUT_OF_MEMORY 2    /* hipErrorOutOfMemory */
#define KREX_HIP_ERROR_NOT_FOUND 500      /* hipErrorNotFound */
#define KREX_HIP_ERROR_NOT_SUPPORTED 801  /* hipErrorNotSupported */
#define KREX_HIP_STREAM_PER_THREAD ((void *)(uintptr_t)2) /* hipStreamPerThread */
#define KREX_HIP_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 19 /* hipDeviceAttributeL2CacheSize */

extern _Atomic(void *) krex_hip_real_fns[KREX_HIP_EP_COUNT];
void *krex_hip_bind(int idx);
/* The hook's return when the real function cannot be had: the runtime was
 * refused (hipErrorNotSupported; the refusal's line is logged once), or it
 * lacks the name (hipErrorNotFound, logged once per name). */
int krex_hip_missing(int idx);

/* The runtime's handle if this process has called a HIP hook (never loads
 * it): a drain synchronizes HIP only then. */
void *krex_hip_loaded(void);

/* Load the runtime, once per process (hipcall.h calls it with the gate
 * entered): dlopen, the version check, and under krex (gating) hipInit.
 * Returns hipInit's result when this load initialized the runtime, else -1
 * (not under krex, refused, not loaded, or called from inside the load).
 * In a process whose GPU work is refused it loads nothing. */
int krex_hip_load(void);
/* 1 when the load found this process's GPU work refused (nothing loaded). */
int krex_hip_refused_process(void);

/* The real function for entry `idx`, bound on first use (acquire pairs
 * with the release store in krex_hip_bind(), so the pointer's target is
 * fully resolved when we call it). */
static inline void *krex_hip_real(int idx)
{
    void *p = atomic_load_explicit(&krex_hip_real_fns[idx], memory_order_acquire);
    return KREX_LIKELY(p) ? p : krex_hip_bind(idx);
}

/* In a hook: `krex_real_fn`, typed as the table's ABI prototype; `fail`
 * returned when there is none. */
#define KREX_HIP_BIND(name, fail)                                              \
    krex_hip_abi_##name *krex_real_fn =                                       \
        (krex_hip_abi_##name *)krex_hip_real(KREX_HIP_EP_##name);              \
    if (KREX_UNLIKELY(krex_real_fn == NULL))                                   \
    return fail

/* A real function by name (the runtime loaded by then), or NULL. */
#define KREX_HIP_REAL(name) ((krex_hip_abi_##name *)krex_hip_real(KREX_HIP_EP_##name))

/* The runtime keeps a failed call's error as the thread's last error until
 * hipGetLastError reads it, whatever succeeds in between.  The shim's own
 * calls (the L2 flush) and a failed attempt the shim retried are calls the
 * program never made or never saw fail: their error must not reach its
 * next hipGetLastError.  krex_hip_peek_error() is the thread's last error
 * now (the real hipPeekAtLastError; success when unknown);
 * krex_hip_forget_own_error(before) clears a last error the shim's call
 * left when the thread had none `before` (the real hipGetLastError). */
uint32_t krex_hip_peek_error(void);
void krex_hip_forget_own_error(uint32_t before);

/* dlsym(handle, name) for a HIP name: our hook when `handle` is the
 * runtime's (and it has the name), RTLD_DEFAULT or RTLD_NEXT; NULL to
 * forward the lookup unchanged. */
void *krex_hip_dlsym_decide(void *handle, const char *name);

#endif /* KREX_HIPINTERPOSE_H */
