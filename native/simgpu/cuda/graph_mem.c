/*
 * Graph memory, as a driver keeps it: a memory node's address is fixed when the node is made,
 * but no memory is charged until the graph is launched; then each allocation node takes its
 * bytes from the device's graph memory pool (growing it, and charging the process, only when
 * what the pool caches does not suffice) and each free node gives them back to the pool, which
 * keeps them charged until cuDeviceGraphMemTrim.  An allocation that the graph does not free
 * stays live until cuMemFree / cuMemFreeAsync of its address; relaunching the graph while it is
 * live is CUDA_ERROR_INVALID_VALUE, as on a GPU.  The memory operations take effect when the
 * launch is submitted, not when the stream reaches them.
 *
 * Locks: gm_mu may be held while taking mem_mu (memory.c) and the state lock, never the reverse.
 */
#include "cu.h"
#include "graph.h"

#include <stdlib.h>
#include <string.h>

/* The device graph memory pools, process-wide like the driver's. */
static pthread_mutex_t gm_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t reserved, used, reserved_high, used_high;
} gpool[SIM_MAX_GPUS];                /* [gm_mu] */
static struct graph_alloc *galloc;    /* [gm_mu] every graph allocation of the process */

static void put_locked(struct graph_alloc *ga)
{
    if (--ga->refs > 0)
        return;
    if (ga->live) /* still in use: its memory goes back to the pool with the address */
        gpool[ga->phys].used -= ga->bytes;
    for (struct graph_alloc **pp = &galloc; *pp; pp = &(*pp)->next)
        if (*pp == ga) {
            *pp = ga->next;
            break;
        }
    cu_mem_unplace_graph(ga->dptr);
    free(ga);
}

void cu_gmem_ref(struct graph_alloc *ga)
{
    pthread_mutex_lock(&gm_mu);
    ga->refs++;
    pthread_mutex_unlock(&gm_mu);
}

void cu_gmem_put(struct graph_alloc *ga)
{
    pthread_mutex_lock(&gm_mu);
    put_locked(ga);
    pthread_mutex_unlock(&gm_mu);
}

/* ---- memory nodes ------------------------------------------------------------------------ */

static CUresult new_alloc(struct CUctx_st *ctx, int phys, size_t bytes, struct graph_alloc **out)
{
    struct graph_alloc *ga = calloc(1, sizeof(*ga));
    if (!ga)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = cu_mem_place_graph(ctx, phys, bytes, &ga->dptr);
    if (r) {
        free(ga);
        return r;
    }
    ga->bytes = bytes;
    ga->phys = phys;
    ga->refs = 1;
    pthread_mutex_lock(&gm_mu);
    ga->next = galloc;
    galloc = ga;
    pthread_mutex_unlock(&gm_mu);
    *out = ga;
    return CUDA_SUCCESS;
}

static struct graph_alloc *find_alloc_locked(CUdeviceptr p)
{
    struct graph_alloc *ga = galloc;
    while (ga && ga->dptr != p)
        ga = ga->next;
    return ga;
}

CUresult cu_gmem_add_alloc(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                           CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (!node || !p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_graph_check(graph);
    if (r || (r = cu_graph_deps_check(graph, deps, ndeps)))
        return r;
    if (!p->bytesize || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = cu_phys(p->poolProps.location.id);
    if (phys < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (p->bytesize > cu_g.st->cfg.memory_bytes)
        return CUDA_ERROR_OUT_OF_MEMORY; /* can never be satisfied */
    struct CUctx_st *c;
    if ((r = cu_ctx_current(&c)))
        return r;
    struct graph_alloc *ga;
    if ((r = new_alloc(c, phys, p->bytesize, &ga)))
        return r;
    if ((r = cu_graph_add_node(graph, NODE_MEM_ALLOC, 0, ga, node))) {
        pthread_mutex_lock(&gm_mu);
        put_locked(ga);
        pthread_mutex_unlock(&gm_mu);
        return r;
    }
    p->dptr = ga->dptr;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph,
                                           const CUgraphNode *deps, size_t numDeps,
                                           CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    return cu_gmem_add_alloc(node, graph, deps, numDeps, nodeParams);
}

CUresult cu_gmem_add_free(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                          CUdeviceptr dptr)
{
    if (!node)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_graph_check(graph);
    if (r || (r = cu_graph_deps_check(graph, deps, ndeps)))
        return r;
    pthread_mutex_lock(&gm_mu);
    struct graph_alloc *ga = find_alloc_locked(dptr);
    if (ga)
        ga->refs++;
    pthread_mutex_unlock(&gm_mu);
    if (!ga)
        return CUDA_ERROR_INVALID_VALUE; /* only graph allocations are freed by a free node */
    /* The free node holds a reference too: kept in the alloc field, released with the graph. */
    r = cu_graph_add_node(graph, NODE_MEM_FREE, 0, ga, node);
    if (r) {
        pthread_mutex_lock(&gm_mu);
        put_locked(ga);
        pthread_mutex_unlock(&gm_mu);
    }
    return r;
}

SIM_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                          size_t numDeps, CUdeviceptr dptr)
{
    return cu_gmem_add_free(node, graph, deps, numDeps, dptr);
}

SIM_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *out)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!out || !node || node->magic != NODE_MAGIC || node->kind != NODE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(out, 0, sizeof(*out));
    out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    for (int i = 0; i < cu_g.nvis; i++)
        if (cu_g.vis[i] == node->ga->phys)
            out->poolProps.location.id = i;
    out->bytesize = node->ga->bytes;
    out->dptr = node->ga->dptr;
    return CUDA_SUCCESS;
}

CUresult cu_graph_capture_alloc(struct CUgraph_st *g, struct CUctx_st *ctx, int phys, size_t bytes,
                                CUdeviceptr *out)
{
    if (bytes > cu_g.st->cfg.memory_bytes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct graph_alloc *ga;
    CUresult r = new_alloc(ctx, phys, bytes, &ga);
    if (r)
        return r;
    if ((r = cu_graph_add_node(g, NODE_MEM_ALLOC, 0, ga, NULL))) {
        pthread_mutex_lock(&gm_mu);
        put_locked(ga);
        pthread_mutex_unlock(&gm_mu);
        return r;
    }
    *out = ga->dptr;
    return CUDA_SUCCESS;
}

CUresult cu_graph_capture_free(struct CUgraph_st *g, CUdeviceptr p)
{
    pthread_mutex_lock(&gm_mu);
    struct graph_alloc *ga = find_alloc_locked(p);
    if (ga)
        ga->refs++;
    pthread_mutex_unlock(&gm_mu);
    if (!ga) /* freeing ordinary memory inside a capture is not modelled */
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return cu_graph_add_node(g, NODE_MEM_FREE, 0, ga, NULL);
}

CUresult cu_graph_mem_free(CUdeviceptr p)
{
    pthread_mutex_lock(&gm_mu);
    struct graph_alloc *ga = find_alloc_locked(p);
    CUresult r = CUDA_ERROR_INVALID_VALUE; /* not launched yet, or already freed */
    if (ga && ga->live) {
        ga->live = 0;
        gpool[ga->phys].used -= ga->bytes;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&gm_mu);
    return r;
}

/* ---- the graph memory pool of a device -------------------------------------------------- */

SIM_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    int phys;
    CUresult r = cu_ready_device(device, &phys);
    if (r)
        return r;
    pthread_mutex_lock(&gm_mu);
    uint64_t excess = gpool[phys].reserved - gpool[phys].used;
    gpool[phys].reserved = gpool[phys].used;
    pthread_mutex_unlock(&gm_mu);
    if (excess)
        sim_uncharge(cu_g.st, phys, excess);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void *value)
{
    int phys;
    CUresult r = cu_ready_device(device, &phys);
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&gm_mu);
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = gpool[phys].used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = gpool[phys].used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = gpool[phys].reserved; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = gpool[phys].reserved_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&gm_mu);
    return r;
}

SIM_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device, int attr, void *value)
{
    int phys;
    CUresult r = cu_ready_device(device, &phys);
    if (r)
        return r;
    if (!value || *(cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE; /* only the high watermarks, only reset to 0 */
    pthread_mutex_lock(&gm_mu);
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        gpool[phys].used_high = gpool[phys].used;
    else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        gpool[phys].reserved_high = gpool[phys].reserved;
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&gm_mu);
    return r;
}

/* Applies the memory nodes of one launch (or only reserves what they need in the pool, for an
 * upload): all or nothing. */
CUresult cu_gmem_run(struct CUgraphExec_st *x, int reserve_only)
{
    uint64_t want[SIM_MAX_GPUS] = {0};
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&gm_mu);
    for (size_t i = 0; i < x->n && !r; i++)
        if (x->steps[i].kind == NODE_MEM_ALLOC) {
            if (x->steps[i].ga->live && !reserve_only)
                r = CUDA_ERROR_INVALID_VALUE; /* an allocation of the last launch is still live */
            want[x->steps[i].ga->phys] += x->steps[i].ga->bytes;
        }
    uint64_t charged[SIM_MAX_GPUS] = {0};
    for (int g = 0; g < SIM_MAX_GPUS && !r; g++) {
        uint64_t cached = gpool[g].reserved - gpool[g].used;
        if (want[g] > cached) {
            struct sim_err e = {0};
            if (sim_charge(&e, cu_g.st, g, want[g] - cached) < 0)
                r = cu_result(&e);
            else
                charged[g] = want[g] - cached;
        }
    }
    if (r) { /* undo what this launch charged */
        for (int g = 0; g < SIM_MAX_GPUS; g++)
            if (charged[g])
                sim_uncharge(cu_g.st, g, charged[g]);
    } else {
        for (int g = 0; g < SIM_MAX_GPUS; g++)
            gpool[g].reserved += charged[g];
    }
    if (!r && !reserve_only) {
        for (size_t i = 0; i < x->n; i++) {
            struct graph_alloc *ga = x->steps[i].ga;
            if (x->steps[i].kind == NODE_MEM_ALLOC) {
                ga->live = 1;
                gpool[ga->phys].used += ga->bytes;
            } else if (x->steps[i].kind == NODE_MEM_FREE && ga->live) {
                ga->live = 0;
                gpool[ga->phys].used -= ga->bytes;
            }
            if (ga && gpool[ga->phys].used > gpool[ga->phys].used_high)
                gpool[ga->phys].used_high = gpool[ga->phys].used;
        }
    }
    for (int g = 0; g < SIM_MAX_GPUS && !r; g++)
        if (gpool[g].reserved > gpool[g].reserved_high)
            gpool[g].reserved_high = gpool[g].reserved;
    pthread_mutex_unlock(&gm_mu);
    return r;
}

