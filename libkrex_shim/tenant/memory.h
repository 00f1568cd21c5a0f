/*
 * memory.h — device-memory accounting and co-tenant out-of-memory handling
 * in libkrex_shim (memory.c; docs/design/memory.md).  Internal, hidden.
 * The generated hooks of every call that can fail because the device is
 * full (tools/classes.toml [oom_retry]) run the real call in a loop:
 *
 *     struct krex_oom krex_o = KREX_OOM_INIT;
 *     do { gate enter; r = real(...); observe; gate leave; }
 *     while ((r == CUDA_ERROR_OUT_OF_MEMORY || krex_o.waiting) &&
 *            krex_oom_retry(&krex_o, r, requested_bytes));
 *
 * so a wait for co-tenants' memory never holds the in-flight count; the HIP
 * hooks run the same loop on hipErrorOutOfMemory with krex_hip_oom_retry().
 */
#ifndef KREX_MEMORY_H
#define KREX_MEMORY_H

#include "state.h"

/* One allocation's out-of-memory state, on the hook's stack. */
struct krex_oom {
    int waiting;          /* waiting for co-tenants (the slot's WAITING bit is set) */
    uint32_t seq;         /* gate mem_seq read before the latest attempt */
    uint64_t start_ns;    /* first CUDA_ERROR_OUT_OF_MEMORY (CLOCK_MONOTONIC) */
    uint64_t deadline_ns; /* start_ns + oom_wait_s */
    uint64_t sleep_ns;    /* next wait between attempts (backs off) */
};
#define KREX_OOM_INIT {0, 0, 0, 0, 0}

/* After an attempt that returned `r` for `bytes` of device memory (0 when
 * the call's own need is unknown or not device memory):
 * 1 = try again (after waiting when needed), 0 = return `r` to the caller.
 * Decides whether an out-of-memory error is the tenant's own or its
 * co-tenants', records that in the slot (krex_gate.h KREX_OOM_*), and
 * waits at most oom_wait_s (env KREX_OOM_WAIT_S) for co-tenants' memory,
 * never inside the tenant's own region. */
int krex_oom_retry(struct krex_oom *o, CUresult r, uint64_t bytes);
/* The same for a HIP call that returned the hipError_t `r`
 * (hipErrorOutOfMemory is the out-of-memory error; the card's size comes
 * from hipMemGetInfo). */
int krex_hip_oom_retry(struct krex_oom *o, uint32_t r, uint64_t bytes);

/* Accounting of the process's device memory, published to its slot.
 * Frees take the size out before the call (`take`) and put it back if the
 * call failed, so a concurrent allocation at the same address is never
 * confused with the freed one. */
void krex_mem_alloced(CUresult r, CUdeviceptr ptr, uint64_t bytes);
uint64_t krex_mem_take(CUdeviceptr ptr);
void krex_mem_freed(CUresult r, CUdeviceptr ptr, uint64_t bytes);
void krex_mem_created(CUresult r, CUmemGenericAllocationHandle handle, uint64_t bytes);
uint64_t krex_mem_take_handle(CUmemGenericAllocationHandle handle);
void krex_mem_released(CUresult r, CUmemGenericAllocationHandle handle, uint64_t bytes);

/* The same for HIP's allocations and frees (hip_hooks.gen.c; r is the
 * hipError_t, 0 for success as CUDA's; `pptr` the void ** the allocation
 * wrote its pointer to). */
void krex_hip_mem_alloced(uint32_t r, void *pptr, uint64_t bytes);
uint64_t krex_hip_mem_take(void *ptr);
void krex_hip_mem_freed(uint32_t r, void *ptr, uint64_t bytes);
/* hipMalloc3D: `pitched` the hipPitchedPtr it filled in, its pointer
 * holding pitch x height x depth bytes. */
void krex_hip_mem_alloced_pitched(uint32_t r, const void *pitched, uint64_t height,
                                  uint64_t depth);
/* hipMemCreate / hipMemRelease: by handle (`phandle` the
 * hipMemGenericAllocationHandle_t * the creation wrote to), as cuMemCreate's. */
void krex_hip_mem_created(uint32_t r, const void *phandle, uint64_t bytes);
uint64_t krex_hip_mem_take_handle(void *handle);
void krex_hip_mem_released(uint32_t r, void *handle, uint64_t bytes);
/* Arrays, by their hipArray * (`parray` the hipArray ** the creation wrote
 * to); their size from the descriptor, element size x width x height x
 * depth (a height or depth of 0 counting as 1): the runtime's row padding
 * and tiling are not seen. */
void krex_hip_array_created(uint32_t r, const void *parray, uint64_t bytes);
uint64_t krex_hip_array_take(void *array);
void krex_hip_array_freed(uint32_t r, void *array, uint64_t bytes);
/* An array's bytes: of hipChannelFormatDesc `desc` elements (hipMallocArray,
 * hipMalloc3DArray), of a HIP_ARRAY_DESCRIPTOR (hipArrayCreate) or of a
 * HIP_ARRAY3D_DESCRIPTOR (hipArray3DCreate); 0 for a NULL or unknown one. */
uint64_t krex_hip_array_bytes(const void *desc, uint64_t width, uint64_t height, uint64_t depth);
uint64_t krex_hip_array_desc_bytes(const void *desc);
uint64_t krex_hip_array3d_desc_bytes(const void *desc);

/* Bytes of device memory a cuMemCreate(size, prop) asks for (0 for host
 * or host-NUMA locations: not device memory). */
uint64_t krex_mem_device_bytes(size_t size, const CUmemAllocationProp *prop);

/* Fork (shim.c's handlers): the accounting lock; the child owns no device
 * memory. */
void krex_memory_atfork_prepare(void);
void krex_memory_atfork_parent(void);
void krex_memory_atfork_child(void);

#endif /* KREX_MEMORY_H */
