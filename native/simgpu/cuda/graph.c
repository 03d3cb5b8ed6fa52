/*
 * CUDA graphs, kernel nodes only.  A node's duration is fixed when it is added (the real driver
 * copies kernel parameters then too).  Dependencies may only name earlier nodes of the same
 * graph, so insertion order is a topological order; an instantiated graph runs its nodes in that
 * order, one engine interval each.  Stream capture records launches on the capturing stream as a
 * chain of nodes instead of running them.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

struct CUgraphNode_st {
    uint32_t magic;
    struct CUgraph_st *graph;
    uint64_t dur_ns;
};

struct CUgraph_st {
    uint32_t magic;
    size_t n, cap;
    struct CUgraphNode_st **nodes; /* pointers: a node handle survives the array growing */
};

struct CUgraphExec_st {
    uint32_t magic;
    size_t n;
    uint64_t dur[];
};

#define GRAPH_INSTANTIATE_FLAGS_VALID 0xfull

void cu_graph_free(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) {
        g->nodes[i]->magic = 0;
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->magic = 0;
    free(g);
}

static CUresult graph_check(CUgraph g)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (g && g->magic == GRAPH_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult add_node(struct CUgraph_st *g, uint64_t dur, struct CUgraphNode_st **out)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct CUgraphNode_st **n = realloc(g->nodes, cap * sizeof(*n));
        if (!n)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = n;
        g->cap = cap;
    }
    struct CUgraphNode_st *node = malloc(sizeof(*node));
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->graph = g;
    node->dur_ns = dur;
    node->magic = NODE_MAGIC;
    g->nodes[g->n++] = node;
    if (out)
        *out = node;
    return CUDA_SUCCESS;
}

CUresult cu_graph_capture_add(struct CUgraph_st *g, const struct CUfunc_st *f, uint64_t dur_ns)
{
    (void)f;
    return add_node(g, dur_ns, NULL); /* depends on the previous node: a chain */
}

SIM_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    if (!graph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    *graph = g;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    CUresult r = graph_check(graph);
    if (r)
        return r;
    cu_graph_free(graph);
    return CUDA_SUCCESS;
}

static CUresult add_kernel(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                           size_t ndeps, CUfunction f, void **params, void **extra)
{
    if (!node || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = graph_check(graph);
    if (r)
        return r;
    if (cu_func_check(f) != CUDA_SUCCESS || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!deps[i] || deps[i]->magic != NODE_MAGIC || deps[i]->graph != graph)
            return CUDA_ERROR_INVALID_VALUE;
    /* A CUkernel's duration comes from its name, which every context's function shares. */
    uint64_t ns = f->magic == FUNC_MAGIC
                      ? cu_kernel_ns(f, params, extra)
                      : cu_kernel_ns(&(struct CUfunc_st){
                                         .spin = strncmp(((struct CUkern_st *)(void *)f)->name,
                                                         "spin", 4) == 0},
                                     params, extra);
    return add_node(graph, ns, node);
}

SIM_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                         size_t numDeps, const CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    if (!params)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel(node, graph, deps, numDeps, params->func, params->kernelParams,
                      params->extra);
}

SIM_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph,
                                            const CUgraphNode *deps, size_t numDeps,
                                            const CUDA_KERNEL_NODE_PARAMS_v2 *params)
{
    if (!params || (!params->func && params->kern))
        return CUDA_ERROR_INVALID_VALUE; /* CUkernel (library) handles are not modelled */
    return add_kernel(node, graph, deps, numDeps, params->func, params->kernelParams,
                      params->extra);
}

static CUresult instantiate(CUgraphExec *exec, CUgraph graph)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = graph_check(graph);
    if (r)
        return r;
    struct CUgraphExec_st *x = malloc(sizeof(*x) + graph->n * sizeof(uint64_t));
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->n = graph->n;
    for (size_t i = 0; i < graph->n; i++)
        x->dur[i] = graph->nodes[i]->dur_ns;
    x->magic = EXEC_MAGIC;
    *exec = x;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                unsigned long long flags)
{
    if (flags & ~GRAPH_INSTANTIATE_FLAGS_VALID)
        return CUDA_ERROR_INVALID_VALUE;
    return instantiate(exec, graph);
}

SIM_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,
                                          char *logBuffer, size_t bufferSize)
{
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    if (errorNode)
        *errorNode = NULL;
    return instantiate(exec, graph);
}

static CUresult graph_launch(CUgraphExec exec, CUstream h)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!exec || exec->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    r = cu_stream(h, &s);
    if (r)
        return r;
    return exec->n ? cu_submit(s, exec->dur, exec->n, NULL) : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!exec || exec->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    exec->magic = 0;
    free(exec);
    return CUDA_SUCCESS;
}

/* ---- stream capture ------------------------------------------------------------------------ */

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode)
{
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (s == &s->ctx->defstream)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the default stream cannot capture */
    if (s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    s->capture = g;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode)
{
    return begin_capture(stream, mode);
}

SIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode)
{
    return begin_capture(stream, mode);
}

static CUresult end_capture(CUstream h, CUgraph *graph)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (!s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    *graph = s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    return end_capture(stream, graph);
}

SIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph)
{
    return end_capture(stream, graph);
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    *status = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status)
{
    return is_capturing(stream, status);
}

SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus *status)
{
    return is_capturing(stream, status);
}
