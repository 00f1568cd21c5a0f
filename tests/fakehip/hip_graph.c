/*
 * hip_graph.c — stream capture and graphs through HIP, on the engine's
 * (tests/fakecuda/capture.c, graph.c): work on a capturing stream is
 * recorded, not run or written to the timeline; hipGraphLaunch runs the
 * captured operations back to back on the launch stream (timeline kind G
 * for kernels, captured = 1).  The capture modes and the calls a capture
 * forbids follow the engine's rules, whose codes HIP shares (900-908).
 */
#include "fakehip.h"

FH_API hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamBeginCapture_v2((CUstream)(void *)stream, (CUstreamCaptureMode)mode));
    return fh_ret(e);
}

FH_API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *pGraph)
{
    FC_ENTRY();
    hipError_t e = pGraph ? fh_begin() : hipErrorInvalidValue;
    CUgraph g = NULL;
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamEndCapture((CUstream)(void *)stream, &g));
    if (pGraph)
        *pGraph = (hipGraph_t)(void *)g;
    return fh_ret(e);
}

FH_API hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus *pCaptureStatus)
{
    FC_ENTRY();
    hipError_t e = pCaptureStatus ? fh_begin() : hipErrorInvalidValue;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamIsCapturing((CUstream)(void *)stream, &st));
    if (e == hipSuccess)
        *pCaptureStatus = (hipStreamCaptureStatus)st; /* the same three values */
    return fh_ret(e);
}

FH_API hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode *mode)
{
    FC_ENTRY();
    hipError_t e = mode ? fh_init() : hipErrorInvalidValue;
    if (e == hipSuccess)
        e = fh_from_cu(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
    return fh_ret(e);
}

FH_API hipError_t hipGraphDestroy(hipGraph_t graph)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e == hipSuccess)
        e = fh_from_cu(cuGraphDestroy((CUgraph)(void *)graph));
    return fh_ret(e);
}

static hipError_t instantiate(hipGraphExec_t *pGraphExec, hipGraph_t graph)
{
    hipError_t e = pGraphExec ? fh_begin() : hipErrorInvalidValue;
    CUgraphExec x = NULL;
    if (e == hipSuccess)
        e = fh_from_cu(cuGraphInstantiateWithFlags(&x, (CUgraph)(void *)graph, 0));
    if (e == hipSuccess)
        *pGraphExec = (hipGraphExec_t)(void *)x;
    return e;
}

FH_API hipError_t hipGraphInstantiate(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                                      hipGraphNode_t *pErrorNode, char *pLogBuffer,
                                      size_t bufferSize)
{
    FC_ENTRY();
    hipError_t e = instantiate(pGraphExec, graph);
    if (pErrorNode)
        *pErrorNode = NULL;
    if (pLogBuffer && bufferSize > 0)
        pLogBuffer[0] = '\0';
    return fh_ret(e);
}

FH_API hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                                               unsigned long long flags)
{
    FC_ENTRY();
    (void)flags; /* auto-free / upload / priority flags change nothing here */
    return fh_ret(instantiate(pGraphExec, graph));
}

FH_API hipError_t hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuGraphLaunch((CUgraphExec)(void *)graphExec, (CUstream)(void *)stream));
    return fh_ret(e);
}

FH_API hipError_t hipGraphExecDestroy(hipGraphExec_t graphExec)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e == hipSuccess)
        e = fh_from_cu(cuGraphExecDestroy((CUgraphExec)(void *)graphExec));
    return fh_ret(e);
}
