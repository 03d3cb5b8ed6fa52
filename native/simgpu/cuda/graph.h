/* The graph objects shared by graph.c and graph_mem.c. */
#ifndef SIMGPU_GRAPH_H
#define SIMGPU_GRAPH_H

#include "cu.h"

enum node_kind { NODE_KERNEL, NODE_EMPTY, NODE_MEM_ALLOC, NODE_MEM_FREE };

/* A graph allocation: the address range of one allocation node, for the graph's lifetime. */
struct graph_alloc {
    CUdeviceptr dptr;
    uint64_t bytes;
    int phys;
    int live;            /* [gm_mu] launched and not yet freed */
    int refs;            /* graphs and executables that name it */
    struct graph_alloc *next;
};

struct CUgraphNode_st {
    uint32_t magic;
    struct CUgraph_st *graph;
    enum node_kind kind;
    uint64_t dur_ns;             /* kernel */
    struct graph_alloc *ga;      /* memory nodes */
};

struct CUgraph_st {
    uint32_t magic;
    size_t n, cap;
    struct CUgraphNode_st **nodes; /* pointers: a node handle survives the array growing */
};

struct exec_step {
    const struct CUgraphNode_st *node; /* for cuGraphExecKernelNodeSetParams */
    enum node_kind kind;
    struct graph_alloc *ga;
};

struct CUgraphExec_st {
    uint32_t magic;
    size_t n, nkernels;
    struct exec_step *steps;
    uint64_t *dur; /* the kernels' durations, in order: one submission per launch */
};

CUresult cu_graph_check(CUgraph g) SIM_HIDDEN;
CUresult cu_graph_deps_check(CUgraph graph, const CUgraphNode *deps, size_t ndeps) SIM_HIDDEN;
CUresult cu_graph_add_node(struct CUgraph_st *g, enum node_kind kind, uint64_t dur,
                           struct graph_alloc *ga, struct CUgraphNode_st **out) SIM_HIDDEN;

/* graph_mem.c: memory nodes, graph allocations and the device graph memory pools. */
CUresult cu_gmem_add_alloc(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                           CUDA_MEM_ALLOC_NODE_PARAMS *p) SIM_HIDDEN;
CUresult cu_gmem_add_free(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                          CUdeviceptr dptr) SIM_HIDDEN;
void cu_gmem_ref(struct graph_alloc *ga) SIM_HIDDEN;
void cu_gmem_put(struct graph_alloc *ga) SIM_HIDDEN; /* the last reference frees the range */
/* A launch's memory nodes; reserve_only: an upload, which only grows the pool for them. */
CUresult cu_gmem_run(struct CUgraphExec_st *x, int reserve_only) SIM_HIDDEN;

#endif /* SIMGPU_GRAPH_H */
