/*
 * interpose.h — how the shim reaches the real driver (interpose.c): the
 * driver's handle, each real function bound lazily, the dlsym decision and
 * cuGetProcAddress routing.  Internal, hidden.
 */
#ifndef KREX_INTERPOSE_H
#define KREX_INTERPOSE_H

#include "base.h"
#include "entrypoints.gen.h"

extern _Atomic(void *) krex_real_fns[KREX_EP_COUNT];
void *krex_bind(int idx);
CUresult krex_missing(int idx);
void *krex_libcuda(void);
/* The driver's handle if a CUDA hook (or the shim) loaded it, else NULL:
 * no load, no lookup, no loader lock. */
void *krex_libcuda_bound(void);
/* The driver's handle if this process has loaded it, else NULL (no load). */
void *krex_libcuda_if_loaded(void);
void *krex_dlsym_real(void *handle, const char *name);
int krex_ep_lookup(const char *name);

/* The real function for entry `idx`, bound on first use (acquire pairs
 * with the release store in krex_bind(), so the pointer's target is
 * fully resolved when we call it). */
static inline void *krex_real(int idx)
{
    void *p = atomic_load_explicit(&krex_real_fns[idx], memory_order_acquire);
    return KREX_LIKELY(p) ? p : krex_bind(idx);
}

/* In a hook: `krex_real_fn`, typed like the driver's own declaration. */
#define KREX_BIND(name)                                                        \
    __typeof__(&name) krex_real_fn = (__typeof__(&name))krex_real(KREX_EP_##name); \
    if (KREX_UNLIKELY(krex_real_fn == NULL))                                   \
        return krex_missing(KREX_EP_##name)

/* A real function by name, or NULL when the driver lacks it. */
#define KREX_REAL(name) ((__typeof__(&name))krex_real(KREX_EP_##name))

/* Maps the resolver's pointer to our hook; refuses (CUDA_ERROR_NOT_FOUND)
 * a pointer to no export cuda.h declares, under krex.  Returns the result. */
CUresult krex_route_proc_address(CUresult r, const char *symbol, void **pfn, int cudaVersion,
                                 CUdriverProcAddressQueryResult *symbolStatus, int arity);

/* The exported dlsym (dl_x86_64.S): our answer, or NULL to forward to the
 * real dlsym, whose pointer is set before it returns. */
__attribute__((visibility("hidden"))) extern void *_Atomic krex_real_dlsym_ptr;
__attribute__((visibility("hidden"))) void *krex_dlsym_decide(void *handle, const char *name);

/* Is ``handle`` a dlopen handle of the library whose file name starts with
 * ``prefix`` (``libcuda.so``, ``libamdhip64.so``)?  ``known``: the handle the
 * shim opened; ``seen``: the cache of the last other handle found to be it
 * (by its link map's name). */
__attribute__((visibility("hidden"))) int krex_handle_is_lib(void *handle, void *known,
                                                             void *_Atomic *seen,
                                                             const char *prefix);

#endif /* KREX_INTERPOSE_H */
