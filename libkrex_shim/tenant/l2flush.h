/*
 * l2flush.h — the holder's L2 flush buffers and the runtime that fills them
 * (l2flush.c; docs/design/shim.md "Holder side (region.c)"): one buffer per
 * context (CUDA) or device (HIP), the flush's memset and the clock
 * warm-up's.  Internal, hidden; region.c is its one user.
 */
#ifndef KREX_L2FLUSH_H
#define KREX_L2FLUSH_H

#include "state.h"

/* What the flush and the warm-up need of the process's runtime: the CUDA
 * driver where libcuda is loaded, else the HIP runtime where a HIP hook
 * loaded it (hipinterpose.c).  Each operation calls the runtime's real
 * functions, never its hooks (the shim's own work must not count as the
 * tenant's: launches, device memory, gated calls).  Results are the
 * runtime's codes, CUresult or hipError_t, which share the values tested
 * here: */
#define L2_OK 0
#define L2_OUT_OF_MEMORY 2
#define L2_NOT_FOUND 500 /* a real function missing */

struct l2buf;

struct l2_runtime {
    const char *name;
    /* The owner of the calling thread's flush buffer: its current context
     * (CUDA) or its current device (HIP).  0 when it has none. */
    int (*owner)(uintptr_t *key);
    /* The owner's device (current on this thread) and its L2 size in bytes. */
    int (*l2_size)(uintptr_t key, int *dev, int *bytes);
    int (*alloc)(uint64_t *ptr, size_t size);
    void (*release)(uint64_t ptr);
    /* 0 when the runtime says the buffer is no longer its owner's (NULL:
     * nothing to ask, the observations keep the list). */
    int (*valid)(const struct l2buf *b);
    /* The flush: a memset of `value` on the null (legacy) stream, then the
     * owner's work waited for (context or device). */
    int (*memset)(uint64_t ptr, unsigned char value, size_t size);
    int (*sync)(void);
    /* The warm-up: memsets queued on the null stream, then that stream
     * waited for. */
    int (*memset_async)(uint64_t ptr, size_t size);
    int (*stream_sync)(void);
};

/* The runtime this process's flush and warm-up use; NULL when it loaded
 * neither (no device work of it can need one). */
const struct l2_runtime *krex_l2_runtime(void);
/* The flush buffer of `key` (rt->owner's, on this thread), allocated at the
 * first use; *size 0 when the device reports no L2.  L2_OUT_OF_MEMORY when
 * the GPU is full. */
int krex_l2_buffer(const struct l2_runtime *rt, uintptr_t key, uint64_t *ptr, size_t *size);
/* The clock warm-up's memsets over buffer `p` for about budget_ns (l2flush.c
 * says how they are batched); 0 or the runtime's error, *spent_ns taken. */
int krex_l2_warm(const struct l2_runtime *rt, uint64_t p, size_t size, uint64_t budget_ns,
                 uint64_t *spent_ns);

/* A context is gone: its buffer with it. */
void krex_l2_forget_ctx(CUcontext ctx);
/* [observe.post] of cuDevicePrimaryCtxReset* (classes.toml): the device's
 * buffers went with its memory. */
void krex_note_primary_reset(CUresult r, CUdevice dev);
/* [observe.post] of hipDeviceReset (dev < 0: the calling thread's current
 * device) and hipDevicePrimaryCtxReset (hip_classes.toml): the device's L2
 * flush buffer went with its memory. */
void krex_hip_note_reset(uint32_t r, int32_t dev);

/* Fork (called by region.c's handlers): the buffers' lock; the child forgets them. */
void krex_l2_atfork_prepare(void);
void krex_l2_atfork_parent(void);
void krex_l2_atfork_child(void);

#endif /* KREX_L2FLUSH_H */
