/*
 * fault.h — fatal ("sticky") CUDA errors, recorded in this process's gate
 * slot for krexd (fault.c; docs/design/faults.md).  Internal, hidden.
 */
#ifndef KREX_FAULT_H
#define KREX_FAULT_H

#include "base.h"

/* Record a fatal (sticky) result in this process's gate slot (the first
 * one only); `at_sync`: found by the shim's own synchronization. */
void krex_fault_note(CUresult r, int at_sync);
CUresult krex_fault_result(CUresult r);
/* The same for a HIP result (a hipError_t; HIP's fatal codes have CUDA's
 * numbers, so the record reads alike). */
void krex_hip_fault_note(uint32_t r, int at_sync);
/* Every hook returns through this: one compare on the fast path. */
#define KREX_RESULT(r) (KREX_LIKELY((r) == CUDA_SUCCESS) ? (r) : krex_fault_result(r))

#endif /* KREX_FAULT_H */
