/*
 * graph.c — graphs made by stream capture, and their launch.
 *
 * A graph is the list of operations captured, in capture order.
 * cuGraphLaunch runs them one after the other on the launch stream as one
 * queue entry (a graph launch is one submission), each written to the
 * timeline with captured = 1 (kernels as kind G).  A memset or copy node
 * repeats its data effect.  Launching a graph into a capturing stream
 * appends its nodes to that capture.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

struct CUgraph_st *fc_graph_new(void)
{
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (g)
        g->magic = FC_MAGIC_GRAPH;
    return g;
}

void fc_graph_free(struct CUgraph_st *g)
{
    g->magic = 0;
    free(g->nodes);
    free(g);
}

CUresult fc_graph_append(struct CUgraph_st *g, const struct fc_node *node)
{
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct fc_node *n = realloc(g->nodes, cap * sizeof *n);
        if (n == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = n;
        g->cap = cap;
    }
    g->nodes[g->count++] = *node;
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphDestroy(CUgraph hGraph)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    if (hGraph && hGraph->magic == FC_MAGIC_GRAPH)
        fc_graph_free(hGraph);
    else
        r = CUDA_ERROR_INVALID_VALUE;
    fc_unlock();
    return r;
}

/* Called directly, never through the exported name: a preloaded shim
 * would otherwise see the driver call itself. */
static CUresult graph_instantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                  unsigned long long flags)
{
    (void)flags; /* upload / auto-free / priority flags change nothing here */
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    if (hGraph == NULL || hGraph->magic != FC_MAGIC_GRAPH) {
        fc_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* An executable graph keeps device memory (its launch resources). */
    r = fc_mem_working(fc_current_gpu());
    if (r != CUDA_SUCCESS) {
        fc_unlock();
        return r;
    }
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (e && hGraph->count) {
        e->nodes = malloc(hGraph->count * sizeof *e->nodes);
        if (e->nodes == NULL) {
            free(e);
            e = NULL;
        } else {
            memcpy(e->nodes, hGraph->nodes, hGraph->count * sizeof *e->nodes);
        }
    }
    if (e) {
        e->magic = FC_MAGIC_EXEC;
        e->count = hGraph->count;
        *phGraphExec = e;
    }
    fc_unlock();
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FC_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                            unsigned long long flags)
{
    FC_ENTRY();
    return graph_instantiate(phGraphExec, hGraph, flags);
}

FC_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    if (hGraphExec && hGraphExec->magic == FC_MAGIC_EXEC) {
        hGraphExec->magic = 0;
        free(hGraphExec->nodes);
        free(hGraphExec);
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    fc_unlock();
    return r;
}

static bool node_valid(const struct fc_node *n)
{
    const struct fc_dataop *op = &n->op;
    size_t bytes = op->count * op->elem;
    return op->kind == FC_OP_NONE ||
           ((!op->dst_device || fc_mem_valid(op->dst, bytes)) &&
            (!op->src_device || fc_mem_valid(op->src, bytes)));
}

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = hGraphExec && hGraphExec->magic == FC_MAGIC_EXEC ? fc_stream_resolve(hStream, per_thread, &s)
                                                        : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < hGraphExec->count; i++)
        if (!node_valid(&hGraphExec->nodes[i]))
            r = CUDA_ERROR_ILLEGAL_ADDRESS; /* memory freed since capture */
    if (r == CUDA_SUCCESS && s->capture) {
        /* Launched into a capture: the graph's nodes join it. */
        r = s->capture->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
        for (size_t i = 0; r == CUDA_SUCCESS && i < hGraphExec->count; i++)
            r = fc_graph_append(s->capture->graph, &hGraphExec->nodes[i]);
        fc_unlock();
        return r;
    }
    if (r == CUDA_SUCCESS && s->kind == FC_STREAM_LEGACY)
        r = fc_capture_check_legacy(s->ctx);
    if (r == CUDA_SUCCESS)
        r = fc_mem_working(fc.phys[s->ctx->device]); /* a first launch uploads the graph */
    /* One queue entry for the whole graph, its nodes back to back. */
    uint64_t total = 0, start = 0, end = 0;
    for (size_t i = 0; i < hGraphExec->count; i++)
        total += hGraphExec->nodes[i].duration_ns;
    if (r == CUDA_SUCCESS)
        r = fc_enqueue(s, total, &start, &end);
    if (r == CUDA_SUCCESS && hGraphExec->count > 0)
        fc_activity_note(fc.phys[s->ctx->device], start, end); /* the whole launch */
    for (size_t i = 0; r == CUDA_SUCCESS && i < hGraphExec->count; i++) {
        const struct fc_node *n = &hGraphExec->nodes[i];
        if (n->op.kind != FC_OP_NONE)
            fc_dataop_apply(&n->op);
        fc_timeline_write(s->id, n->kind, start, start + n->duration_ns, true);
        start += n->duration_ns;
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_ENTRY();
    return graph_launch(hGraphExec, hStream, false);
}

FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_ENTRY();
    return graph_launch(hGraphExec, hStream, true);
}

/* cuGraphInstantiateWithParams: cuGraphInstantiateWithFlags with the
 * result reported in the parameters (an upload stream changes nothing:
 * uploads put no modelled work on the device). */
static CUresult instantiate_with_params(CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (params == NULL)
        return fc_check_init() == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE
                                               : CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = graph_instantiate(phGraphExec, hGraph, params->flags);
    params->hErrNode_out = NULL;
    params->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                           : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}

FC_API CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FC_ENTRY();
    return instantiate_with_params(phGraphExec, hGraph, params);
}

FC_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FC_ENTRY();
    return instantiate_with_params(phGraphExec, hGraph, params);
}

/* cuGraphUpload: the graph's resources go to the device (memory needed);
 * no modelled device time. */
static CUresult graph_upload(CUgraphExec hGraphExec, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = hGraphExec && hGraphExec->magic == FC_MAGIC_EXEC ? fc_stream_resolve(hStream, per_thread, &s)
                                                        : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = fc_mem_working(fc.phys[s->ctx->device]);
    fc_unlock();
    return r;
}

FC_API CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_ENTRY();
    return graph_upload(hGraphExec, hStream, false);
}

FC_API CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_ENTRY();
    return graph_upload(hGraphExec, hStream, true);
}
