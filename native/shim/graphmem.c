/*
 * Graph memory (CUDA Programming Guide, "Graph Memory Nodes").  An allocation node takes its
 * bytes from its device's graph memory pool when the graph is launched or uploaded, not when the
 * node is made; the pool grows only when what it caches does not suffice, and keeps what it took
 * (freed allocations included) until cuDeviceGraphMemTrim.  No allocation call shows that
 * memory, so unhooked a graph is device memory past the cap.
 *
 * The charge: one per device, kept equal to the driver's own figure for the process
 * (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) after every launch, upload and trim.
 * The admission: at instantiation the graph's allocation nodes are summed per device (child
 * graphs included); before a launch or upload the pool may grow by at most
 * used + that sum - reserved, which is admitted against the cap first (refused:
 * CUDA_ERROR_OUT_OF_MEMORY, nothing launched).  The bound assumes the graph's allocations share
 * no memory among themselves, so near its cap a tenant can be refused a graph whose allocations
 * would have reused each other's; the charge comes back to the driver's figure right after.
 *
 * Stream-ordered allocations on a capturing stream are nodes of the captured graph: charged here
 * when it runs, never at capture (hooks_cuda.c).
 *
 * Locks: mu serialises the graph-memory launches of the process (admission, launch, settling), so
 * two launches never admit against the same room.  It is held across the arbiter's wait, which
 * takes no lock of this file.  An executable without memory nodes costs one relaxed load.
 */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define MAX_CHILD_DEPTH 8

/* What one executable's allocation nodes take, per device ordinal. */
struct exec_need {
    CUgraphExec exec;
    uint64_t bytes[SG_MAX_DEVICES];
    bool unplaceable; /* a node on no device of ours: the launch is refused, as the cap is 0 */
    bool unknown;     /* the graph could not be read: settled after each launch instead */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct exec_need *needs;                  /* [mu] */
static size_t nneeds, capneeds;                  /* [mu] */
static size_t nneeds_hint;                       /* atomic: nneeds, read without mu */
static struct sg_charge charge[SG_MAX_DEVICES];  /* [mu] each device's graph pool */
static int settle_logged, read_logged;

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(needs); /* the parent's executables and pool charges are not the child's */
    needs = NULL;
    nneeds = capneeds = 0;
    memset(charge, 0, sizeof charge);
    __atomic_store_n(&nneeds_hint, 0, __ATOMIC_RELAXED);
}

static void setup(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}
SG_FAST_ONCE(ensure_setup, setup)

static bool has_need(const struct exec_need *n)
{
    if (n->unplaceable || n->unknown)
        return true;
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        if (n->bytes[d])
            return true;
    return false;
}

/* Adds the allocation nodes of g (and of its child graphs) to n; -1 when it cannot be read. */
static int sum_graph(CUgraph g, struct exec_need *n, int depth)
{
    size_t count = 0;
    if (!SG_REAL(cuGraphGetNodes) || !SG_REAL(cuGraphNodeGetType) ||
        !SG_REAL(cuGraphMemAllocNodeGetParams) ||
        SG_REAL(cuGraphGetNodes)(g, NULL, &count) != CUDA_SUCCESS)
        return -1;
    if (count == 0)
        return 0;
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (!nodes)
        return -1;
    int rc = SG_REAL(cuGraphGetNodes)(g, nodes, &count) == CUDA_SUCCESS ? 0 : -1;
    for (size_t i = 0; i < count && rc == 0; i++) {
        CUgraphNodeType type;
        if (SG_REAL(cuGraphNodeGetType)(nodes[i], &type) != CUDA_SUCCESS) {
            rc = -1;
        } else if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            int dev = -1;
            if (SG_REAL(cuGraphMemAllocNodeGetParams)(nodes[i], &p) != CUDA_SUCCESS)
                rc = -1;
            else if (p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
                dev = p.poolProps.location.id;
            if (rc == 0 && (dev < 0 || dev >= SG_MAX_DEVICES))
                n->unplaceable = true;
            else if (rc == 0 && __builtin_add_overflow(n->bytes[dev], p.bytesize, &n->bytes[dev]))
                n->bytes[dev] = UINT64_MAX;
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraph child;
            rc = (depth < MAX_CHILD_DEPTH && SG_REAL(cuGraphChildGraphNodeGetGraph) &&
                  SG_REAL(cuGraphChildGraphNodeGetGraph)(nodes[i], &child) == CUDA_SUCCESS)
                     ? sum_graph(child, n, depth + 1)
                     : -1;
        }
    }
    free(nodes);
    return rc;
}

static struct exec_need *find_locked(CUgraphExec exec)
{
    for (size_t i = 0; i < nneeds; i++)
        if (needs[i].exec == exec)
            return &needs[i];
    return NULL;
}

static void forget_locked(CUgraphExec exec)
{
    struct exec_need *n = find_locked(exec);
    if (n) {
        *n = needs[--nneeds];
        __atomic_store_n(&nneeds_hint, nneeds, __ATOMIC_RELAXED);
    }
}

/* The device's graph pool as the driver counts it for this process. */
static bool pool_figures(CUdevice dev, uint64_t *used, uint64_t *reserved)
{
    cuuint64_t u = 0, v = 0;
    if (!SG_REAL(cuDeviceGetGraphMemAttribute) ||
        SG_REAL(cuDeviceGetGraphMemAttribute)(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &u) !=
            CUDA_SUCCESS ||
        SG_REAL(cuDeviceGetGraphMemAttribute)(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v) !=
            CUDA_SUCCESS)
        return false;
    *used = u;
    *reserved = v;
    return true;
}

/* Sets device d's pool charge to `bytes`: a growth is checked against the cap. */
static int charge_to_locked(int d, uint64_t bytes, struct sg_err *e)
{
    if (charge[d].active)
        return sg_adjust(&charge[d], bytes, e);
    return bytes ? sg_reserve(d, bytes, &charge[d], e) : 0;
}

/* After the driver acted: the charge of d becomes the pool's reserved bytes. */
static void settle_locked(int d)
{
    uint64_t used, reserved;
    if (!pool_figures(d, &used, &reserved))
        return; /* cannot read it now: the charge stays as admitted */
    struct sg_err e;
    sg_err_clear(&e);
    if (charge_to_locked(d, reserved, &e) < 0)
        sg_log_once(&settle_logged, "graph memory pool of device %d past what was admitted: %s", d,
                    e.msg);
}

static void settle_all_locked(void)
{
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        if (charge[d].active)
            settle_locked(d);
}

/* Before a launch or upload of n: room for the pool to grow by what n may take. */
static CUresult admit_locked(const struct exec_need *n)
{
    if (n->unplaceable)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < SG_MAX_DEVICES; d++) {
        if (!n->bytes[d])
            continue;
        uint64_t used = 0, reserved = 0, target;
        pool_figures(d, &used, &reserved); /* unreadable: all of it is a growth */
        if (__builtin_add_overflow(used, n->bytes[d], &target))
            target = UINT64_MAX;
        if (target < reserved)
            target = reserved;
        struct sg_err e;
        sg_err_clear(&e);
        if (charge_to_locked(d, target, &e) < 0) {
            for (int k = 0; k < d; k++) /* give back what the devices before took */
                if (n->bytes[k])
                    settle_locked(k);
            return sg_cu_result(e.code ? e.code : SG_E_OVERCAP);
        }
    }
    return CUDA_SUCCESS;
}

static void settle_need_locked(const struct exec_need *n)
{
    if (n->unknown) {
        settle_all_locked();
        return;
    }
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        if (n->bytes[d])
            settle_locked(d);
}

static bool accounting(void)
{
    return !sg_in_hook && sg_configured() && sg_mode() == SG_MODE_ACTIVE;
}

/* ---- the launch protocol (hooks_launch.c) and the hooks of this file -------------------- */

CUresult sg_graph_mem_begin(CUgraphExec exec, struct sg_graph_mem *gm)
{
    gm->held = false;
    if (__atomic_load_n(&nneeds_hint, __ATOMIC_RELAXED) == 0 || !accounting())
        return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    struct exec_need *n = find_locked(exec);
    CUresult res = n ? admit_locked(n) : CUDA_SUCCESS;
    if (!n || res != CUDA_SUCCESS) {
        pthread_mutex_unlock(&mu);
        return res;
    }
    gm->held = true;
    gm->exec = exec;
    return CUDA_SUCCESS;
}

void sg_graph_mem_end(struct sg_graph_mem *gm)
{
    if (!gm->held)
        return;
    struct exec_need *n = find_locked(gm->exec);
    if (n)
        settle_need_locked(n);
    gm->held = false;
    pthread_mutex_unlock(&mu);
}

/* One instantiation: read the graph first (an upload at instantiation is admitted like a
 * launch), then record what the new executable's nodes take. */
struct instantiation {
    struct exec_need need;
    bool active, locked;
};

static CUresult instantiate_begin(CUgraph graph, bool upload, struct instantiation *in)
{
    memset(in, 0, sizeof *in);
    if (!accounting())
        return CUDA_SUCCESS;
    ensure_setup();
    in->active = true;
    if (sum_graph(graph, &in->need, 0) < 0) {
        sg_log_once(&read_logged, "cannot list a graph's memory nodes: its pool is charged "
                                  "after each launch");
        in->need.unknown = true;
    }
    if (!upload || !has_need(&in->need))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    CUresult res = admit_locked(&in->need);
    if (res != CUDA_SUCCESS) {
        pthread_mutex_unlock(&mu);
        return res;
    }
    in->locked = true;
    return CUDA_SUCCESS;
}

static CUresult instantiate_end(CUresult res, CUgraphExec *exec, struct instantiation *in)
{
    if (!in->active)
        return res;
    if (!in->locked)
        pthread_mutex_lock(&mu);
    if (in->locked)
        settle_need_locked(&in->need);
    if (res == CUDA_SUCCESS && exec && *exec) {
        forget_locked(*exec); /* a reused handle: what it held before is gone */
        in->need.exec = *exec;
        if (has_need(&in->need) && sg_grow((void **)&needs, &capneeds, nneeds, sizeof *needs) < 0) {
            pthread_mutex_unlock(&mu); /* cannot remember it: it must not run unaccounted */
            SG_REAL(cuGraphExecDestroy)(*exec);
            *exec = NULL;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (has_need(&in->need)) {
            needs[nneeds++] = in->need;
            __atomic_store_n(&nneeds_hint, nneeds, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&mu);
    return res;
}

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

#define INSTANTIATE_LEGACY(name)                                                                   \
    SG_EXPORT CUresult name(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,              \
                            char *logBuffer, size_t bufferSize)                                    \
    {                                                                                              \
        REAL(name);                                                                                \
        struct instantiation in;                                                                   \
        CUresult res = instantiate_begin(graph, false, &in);                                       \
        if (res == CUDA_SUCCESS)                                                                   \
            res = instantiate_end(real_(exec, graph, errorNode, logBuffer, bufferSize), exec,      \
                                  &in);                                                            \
        return res;                                                                                \
    }
INSTANTIATE_LEGACY(cuGraphInstantiate)
INSTANTIATE_LEGACY(cuGraphInstantiate_v2)

SG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                               unsigned long long flags)
{
    REAL(cuGraphInstantiateWithFlags);
    struct instantiation in;
    CUresult res = instantiate_begin(graph, false, &in);
    if (res == CUDA_SUCCESS)
        res = instantiate_end(real_(exec, graph, flags), exec, &in);
    return res;
}

#define INSTANTIATE_PARAMS(name)                                                                   \
    SG_EXPORT CUresult name(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *p)    \
    {                                                                                              \
        REAL(name);                                                                                \
        struct instantiation in;                                                                   \
        bool upload = p && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);                        \
        CUresult res = instantiate_begin(graph, upload, &in);                                      \
        if (res == CUDA_SUCCESS)                                                                   \
            res = instantiate_end(real_(exec, graph, p), exec, &in);                               \
        else if (p)                                                                                \
            p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;                                          \
        return res;                                                                                \
    }
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams)
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams_ptsz)

/* An upload maps the executable's graph memory ahead of its launch: admitted like one. */
#define UPLOAD(name)                                                                               \
    SG_EXPORT CUresult name(CUgraphExec exec, CUstream stream)                                     \
    {                                                                                              \
        REAL(name);                                                                                \
        struct sg_graph_mem gm;                                                                    \
        CUresult res = sg_graph_mem_begin(exec, &gm);                                              \
        if (res == CUDA_SUCCESS) {                                                                 \
            res = real_(exec, stream);                                                             \
            sg_graph_mem_end(&gm);                                                                 \
        }                                                                                          \
        return res;                                                                                \
    }
UPLOAD(cuGraphUpload)
UPLOAD(cuGraphUpload_ptsz)

SG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    REAL(cuGraphExecDestroy);
    CUresult res = real_(exec);
    if (res == CUDA_SUCCESS && __atomic_load_n(&nneeds_hint, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&mu);
        forget_locked(exec);
        pthread_mutex_unlock(&mu);
    }
    return res;
}

SG_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    REAL(cuDeviceGraphMemTrim);
    CUresult res = real_(device);
    if (res == CUDA_SUCCESS)
        sg_graph_mem_settle_all();
    return res;
}

void sg_graph_mem_settle_all(void)
{
    if (!accounting())
        return;
    pthread_mutex_lock(&mu);
    settle_all_locked();
    pthread_mutex_unlock(&mu);
}

bool sg_stream_capturing(CUstream stream, bool per_thread)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUstream s = (!stream && per_thread) ? CU_STREAM_PER_THREAD : stream;
    return SG_REAL(cuStreamIsCapturing) &&
           SG_REAL(cuStreamIsCapturing)(s, &status) == CUDA_SUCCESS &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}
