/*
 * fault.c — fatal ("sticky") CUDA errors seen by this process, published in
 * its gate slot for krexd (docs/design/faults.md "Signals (most reliable
 * first)"): the first fatal code, whether the process had launched kernels
 * before it (one that never launched cannot be the culprit), and whether
 * the shim's own synchronization (a drain, the exit) found it.  Not on the
 * fast path: only a result other than CUDA_SUCCESS reaches
 * krex_fault_result() (KREX_RESULT in fault.h), only a HIP result other
 * than hipSuccess krex_hip_fault_note() (krex_hip_after in hipdrain.h).
 */
#include "fault.h"
#include "state.h"

/* The results after which the context (or, under MPS, the server's
 * clients) cannot go on: cuda.h "This indicates that ... the process must
 * be terminated and relaunched" and the MPS client errors, among them the
 * server refusing a new client while it handles a fault.  On the H200
 * (driver 580) that refusal reached a command as
 * CUDA_ERROR_DEVICE_UNAVAILABLE at its first context, not as
 * CUDA_ERROR_MPS_SERVER_NOT_READY (docs/bench/mps-faults-h200.md, round
 * 3): without it in this list the command failed with no record and
 * krexd could not tell it was a casualty.  Without MPS krexd reads no
 * record, so a device unavailable for another reason changes nothing.
 * The server's client limits (MPS_MAX_CLIENTS/CONNECTIONS_REACHED) are not
 * listed: the server is healthy then, and an incident would drain the GPU
 * and restart it for nothing; the command fails with its own error. */
static int fatal(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_MPS_CONNECTION_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_MPS_RPC_FAILURE:
    case CUDA_ERROR_MPS_SERVER_NOT_READY:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
        return 1;
    default:
        return 0;
    }
}

void krex_fault_note(CUresult r, int at_sync)
{
    if (KREX_LIKELY(!fatal(r)))
        return;
    struct krex_slot *s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
    if (s == NULL)
        return;
    /* Only the first one is kept.  Relaxed: the word is a self-contained
     * record that publishes nothing else, the owner is its only writer
     * (two threads racing here both store a valid record), and krexd reads
     * it after the process ended or as a hint that its next read refreshes. */
    if (atomic_load_explicit(&s->fault, memory_order_relaxed) != 0)
        return;
    uint32_t word = ((uint32_t)r & KREX_FAULT_CODE_MASK) | (at_sync ? KREX_FAULT_AT_SYNC : 0u);
    if (atomic_load_explicit(&krex_launches, memory_order_relaxed) != 0)
        word |= KREX_FAULT_LAUNCHED;
    atomic_store_explicit(&s->fault, word, memory_order_relaxed);
    krex_log(KREX_LOG_INFO, "fatal GPU error %d: recorded for krexd", (int)r);
}

/* HIP's fatal results: the codes of the CUDA list above that HIP defines,
 * with CUDA's numbers (hip_runtime_api.h): hipErrorECCNotCorrectable (214),
 * hipErrorIllegalAddress (700), hipErrorLaunchTimeOut (702),
 * hipErrorLaunchFailure (719).  HIP has no MPS and none of CUDA's 714-718. */
void krex_hip_fault_note(uint32_t r, int at_sync)
{
    if (r == 214 || r == 700 || r == 702 || r == 719)
        krex_fault_note((CUresult)r, at_sync);
}

CUresult krex_fault_result(CUresult r)
{
    krex_fault_note(r, 0);
    return r;
}
