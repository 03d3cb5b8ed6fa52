/*
 * CUDA graphs: kernel, empty and memory nodes (listed by cuGraphGetNodes and cuGraphNodeGetType).  A kernel node's duration is fixed when it is added
 * (the real driver copies kernel parameters then too) and can be changed in an instantiated graph
 * (cuGraphExecKernelNodeSetParams).  Dependencies may only name earlier nodes of the same graph,
 * so insertion order is a topological order; an instantiated graph runs its kernels in that
 * order, one engine interval each.  Stream capture records launches on the capturing stream as a
 * chain of nodes instead of running them, and stream-ordered allocations as memory nodes.
 *
 * Memory nodes and the graph memory pool: graph_mem.c.
 */
#include "cu.h"
#include "graph.h"

#include <stdlib.h>
#include <string.h>

#define GRAPH_INSTANTIATE_FLAGS_VALID 0xfull

void cu_graph_free(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i]->ga) /* allocation and free nodes each hold a reference */
            cu_gmem_put(g->nodes[i]->ga);
        g->nodes[i]->magic = 0;
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->magic = 0;
    free(g);
}

CUresult cu_graph_check(CUgraph g)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (g && g->magic == GRAPH_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cu_graph_deps_check(CUgraph graph, const CUgraphNode *deps, size_t ndeps)
{
    if (ndeps && !deps)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!deps[i] || deps[i]->magic != NODE_MAGIC || deps[i]->graph != graph)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cu_graph_add_node(struct CUgraph_st *g, enum node_kind kind, uint64_t dur,
                           struct graph_alloc *ga, struct CUgraphNode_st **out)
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
    *node = (struct CUgraphNode_st){
        .magic = NODE_MAGIC, .graph = g, .kind = kind, .dur_ns = dur, .ga = ga};
    g->nodes[g->n++] = node;
    if (out)
        *out = node;
    return CUDA_SUCCESS;
}

CUresult cu_graph_capture_add(struct CUgraph_st *g, const struct CUfunc_st *f, uint64_t dur_ns)
{
    (void)f;
    return cu_graph_add_node(g, NODE_KERNEL, dur_ns, NULL, NULL); /* after the previous node: a chain */
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
    CUresult r = cu_graph_check(graph);
    if (r)
        return r;
    cu_graph_free(graph);
    return CUDA_SUCCESS;
}

/* ---- kernel and empty nodes ------------------------------------------------------------ */

/* A kernel's duration; a CUkernel's comes from its name, which every context's function shares. */
static CUresult kernel_ns(CUfunction f, void **params, void **extra, uint64_t *ns)
{
    if (cu_func_check(f) != CUDA_SUCCESS || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    if (f->magic == FUNC_MAGIC) {
        *ns = cu_kernel_ns(f, params, extra);
    } else {
        const struct CUkern_st *k = (const struct CUkern_st *)(void *)f;
        struct CUfunc_st named = {.spin = strncmp(k->name, "spin", 4) == 0};
        *ns = cu_kernel_ns(&named, params, extra);
    }
    return CUDA_SUCCESS;
}

static CUresult add_kernel(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                           size_t ndeps, CUfunction f, void **params, void **extra)
{
    if (!node)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_graph_check(graph);
    if (r || (r = cu_graph_deps_check(graph, deps, ndeps)))
        return r;
    uint64_t ns;
    if ((r = kernel_ns(f, params, extra, &ns)))
        return r;
    return cu_graph_add_node(graph, NODE_KERNEL, ns, NULL, node);
}

/* The function of v2/v3 kernel parameters: func, else the library kernel `kern`. */
static CUfunction v2_func(CUfunction func, CUkernel kern)
{
    return func ? func : (CUfunction)(void *)kern;
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
    if (!params)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel(node, graph, deps, numDeps, v2_func(params->func, params->kern),
                      params->kernelParams, params->extra);
}

SIM_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                        size_t numDeps)
{
    if (!node)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_graph_check(graph);
    if (r || (r = cu_graph_deps_check(graph, deps, numDeps)))
        return r;
    return cu_graph_add_node(graph, NODE_EMPTY, 0, NULL, node);
}

/* ---- the generic node API --------------------------------------------------------------- */

static CUresult add_generic(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                            CUgraphNodeParams *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return add_kernel(node, graph, deps, n, v2_func(p->kernel.func, p->kernel.kern),
                          p->kernel.kernelParams, p->kernel.extra);
    case CU_GRAPH_NODE_TYPE_EMPTY: return cuGraphAddEmptyNode(node, graph, deps, n);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return cu_gmem_add_alloc(node, graph, deps, n, &p->alloc);
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return cu_gmem_add_free(node, graph, deps, n, p->free.dptr);
    default: return CUDA_ERROR_NOT_SUPPORTED; /* copies, memsets, host, events... not modelled */
    }
}

SIM_EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                   size_t numDeps, CUgraphNodeParams *nodeParams)
{
    return add_generic(node, graph, deps, numDeps, nodeParams);
}

SIM_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                      const void *edgeData, size_t numDeps,
                                      CUgraphNodeParams *nodeParams)
{
    (void)edgeData; /* edge types (programmatic ports) order nothing more here */
    return add_generic(node, graph, deps, numDeps, nodeParams);
}

/* ---- what a graph holds --------------------------------------------------------------- */

SIM_EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *numNodes)
{
    CUresult r = cu_graph_check(graph);
    if (r)
        return r;
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes) { /* the first *numNodes handles, NULL past the last node */
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < graph->n ? graph->nodes[i] : NULL;
        if (*numNodes > graph->n)
            *numNodes = graph->n;
    } else {
        *numNodes = graph->n;
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!node || node->magic != NODE_MAGIC || !type)
        return CUDA_ERROR_INVALID_VALUE;
    static const CUgraphNodeType types[] = {
        [NODE_KERNEL] = CU_GRAPH_NODE_TYPE_KERNEL,
        [NODE_EMPTY] = CU_GRAPH_NODE_TYPE_EMPTY,
        [NODE_MEM_ALLOC] = CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        [NODE_MEM_FREE] = CU_GRAPH_NODE_TYPE_MEM_FREE,
    };
    *type = types[node->kind];
    return CUDA_SUCCESS;
}

/* ---- instantiation and launch ----------------------------------------------------------- */

static CUresult instantiate(CUgraphExec *exec, CUgraph graph)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_graph_check(graph);
    if (r)
        return r;
    struct CUgraphExec_st *x = calloc(1, sizeof(*x));
    struct exec_step *steps = calloc(graph->n ? graph->n : 1, sizeof(*steps));
    uint64_t *dur = calloc(graph->n ? graph->n : 1, sizeof(*dur));
    if (!x || !steps || !dur) {
        free(x);
        free(steps);
        free(dur);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < graph->n; i++) {
        const struct CUgraphNode_st *nd = graph->nodes[i];
        steps[i] = (struct exec_step){.node = nd, .kind = nd->kind, .ga = nd->ga};
        if (nd->ga)
            cu_gmem_ref(nd->ga); /* the executable may outlive its graph */
        if (nd->kind == NODE_KERNEL)
            dur[x->nkernels++] = nd->dur_ns;
    }
    x->n = graph->n;
    x->steps = steps;
    x->dur = dur;
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

static CUresult graph_upload(CUgraphExec exec, CUstream h);

static CUresult instantiate_with_params(CUgraphExec *exec, CUgraph graph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    p->hErrNode_out = NULL;
    if (p->flags & ~GRAPH_INSTANTIATE_FLAGS_VALID) {
        p->result_out = CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE;
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = instantiate(exec, graph);
    if (!r && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) &&
        (r = graph_upload(*exec, p->hUploadStream))) {
        cuGraphExecDestroy(*exec);
        *exec = NULL;
    }
    p->result_out = r ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return r;
}

SIM_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                                 CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return instantiate_with_params(exec, graph, params);
}

SIM_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return instantiate_with_params(exec, graph, params);
}

/* The executable and the stream a launch or upload names, both checked. */
static CUresult exec_stream(CUgraphExec exec, CUstream h, struct CUstream_st **s)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!exec || exec->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    return cu_stream(h, s);
}

static CUresult graph_launch(CUgraphExec exec, CUstream h)
{
    struct CUstream_st *s;
    CUresult r = exec_stream(exec, h, &s);
    if (r)
        return r;
    if (exec->n != exec->nkernels && (r = cu_gmem_run(exec, 0)))
        return r;
    return exec->nkernels ? cu_submit(s, exec->dur, exec->nkernels, NULL) : CUDA_SUCCESS;
}

/* An upload maps the executable's graph memory ahead of its launch: the pool grows now. */
static CUresult graph_upload(CUgraphExec exec, CUstream h)
{
    struct CUstream_st *s;
    CUresult r = exec_stream(exec, h, &s);
    if (r)
        return r;
    return exec->n != exec->nkernels ? cu_gmem_run(exec, 1) : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
    return graph_upload(exec, stream);
}

SIM_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream)
{
    return graph_upload(exec, stream);
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

static CUresult exec_set_kernel(CUgraphExec exec, CUgraphNode node, CUfunction f, void **params,
                                void **extra)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!exec || exec->magic != EXEC_MAGIC || !node || node->magic != NODE_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t ns;
    if ((r = kernel_ns(f, params, extra, &ns)))
        return r;
    for (size_t i = 0, k = 0; i < exec->n; i++) {
        if (exec->steps[i].node == node) {
            if (exec->steps[i].kind != NODE_KERNEL)
                return CUDA_ERROR_INVALID_VALUE;
            exec->dur[k] = ns;
            return CUDA_SUCCESS;
        }
        k += exec->steps[i].kind == NODE_KERNEL;
    }
    return CUDA_ERROR_INVALID_VALUE; /* not a node of the graph this was instantiated from */
}

SIM_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                   const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return exec_set_kernel(exec, node, p->func, p->kernelParams, p->extra);
}

SIM_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                      const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return exec_set_kernel(exec, node, v2_func(p->func, p->kern), p->kernelParams, p->extra);
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!exec || exec->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    exec->magic = 0;
    for (size_t i = 0; i < exec->n; i++)
        if (exec->steps[i].ga)
            cu_gmem_put(exec->steps[i].ga);
    free(exec->steps);
    free(exec->dur);
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
