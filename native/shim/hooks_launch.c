/*
 * Compute arbitration hooks (ABI 1.1): every launch path takes the GPU token first
 * (sg_arb_enter: the fast path in shim.h, the slow path in arbiter.c), and every sync call is the
 * end of a kernel burst where the token is handed on if a better waiter exists.
 *
 * Launch hooks:
 *   - the real function missing: CUDA_ERROR_NOT_FOUND;
 *   - inert or re-entered from inside the driver: forward untouched;
 *   - broken configuration (including a missing or corrupt arbiter region):
 *     CUDA_ERROR_NOT_PERMITTED;
 *   - a device whose policy is native, or a tenant without a context: forward;
 *   - otherwise: wait for the token, launch, let a release proceed.
 * Graphs (cuGraphLaunch) and stream capture go through the same gate, so a tenant cannot
 * escape its share by launching through graphs.
 *
 * Sync hooks: the real call, then sg_arb_burst_end (nothing unless this thread's GPU token is
 * held and someone waits).  They never fail because of the arbiter.
 */
#include "shim.h"

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

#define FORWARD_IF_PASSIVE(...)                                                                    \
    if (sg_in_hook || !sg_configured())                                                            \
    return real_(__VA_ARGS__)

/* The work goes to `stream`'s GPU (a default stream: the current context's). */
#define GATED(stream, ...)                                                                         \
    struct sg_gate gt_;                                                                            \
    CUresult res_ = sg_arb_enter(&gt_, stream);                                                    \
    if (res_ != CUDA_SUCCESS)                                                                      \
        return res_;                                                                               \
    res_ = real_(__VA_ARGS__);                                                                     \
    sg_arb_exit(&gt_);                                                                             \
    return res_

#define LAUNCH_KERNEL(name)                                                                        \
    SG_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,            \
                            unsigned int gridDimZ, unsigned int blockDimX,                         \
                            unsigned int blockDimY, unsigned int blockDimZ,                        \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,    \
                            void **extra)                                                          \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,       \
                           sharedMemBytes, hStream, kernelParams, extra);                          \
        GATED(hStream, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,           \
              sharedMemBytes, hStream, kernelParams, extra);                                       \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name)                                                                            \
    SG_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **kernelParams,       \
                            void **extra)                                                          \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(config, f, kernelParams, extra);                                        \
        GATED(config ? config->hStream : NULL, config, f, kernelParams, extra);                    \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name)                                                                          \
    SG_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,            \
                            unsigned int gridDimZ, unsigned int blockDimX,                         \
                            unsigned int blockDimY, unsigned int blockDimZ,                        \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)    \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,       \
                           sharedMemBytes, hStream, kernelParams);                                 \
        GATED(hStream, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,           \
              sharedMemBytes, hStream, kernelParams);                                              \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

/* Deprecated (CUDA 9-12): one cooperative launch per GPU, each on its own stream.  Every GPU's
 * token is taken, in device order (two processes doing this never wait for each other in a
 * cycle), before any kernel is launched. */
SG_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                        unsigned int numDevices, unsigned int flags)
{
    REAL(cuLaunchCooperativeKernelMultiDevice);
    FORWARD_IF_PASSIVE(list, numDevices, flags);
    if (!list || numDevices == 0 || numDevices > SG_MAX_DEVICES)
        return real_(list, numDevices, flags); /* the driver refuses these itself */
    unsigned order[SG_MAX_DEVICES];
    CUdevice dev[SG_MAX_DEVICES];
    sg_in_hook++;
    for (unsigned i = 0; i < numDevices; i++) {
        order[i] = i;
        if (sg_stream_ordinal(list[i].hStream, &dev[i]) != CUDA_SUCCESS)
            dev[i] = -1;
    }
    sg_in_hook--;
    for (unsigned i = 1; i < numDevices; i++) /* insertion sort by device */
        for (unsigned j = i; j > 0 && dev[order[j]] < dev[order[j - 1]]; j--) {
            unsigned k = order[j];
            order[j] = order[j - 1];
            order[j - 1] = k;
        }
    struct sg_gate gates[SG_MAX_DEVICES];
    unsigned held = 0;
    CUresult res = CUDA_SUCCESS;
    while (held < numDevices && res == CUDA_SUCCESS) {
        res = sg_arb_enter(&gates[held], list[order[held]].hStream);
        held += res == CUDA_SUCCESS;
    }
    if (res == CUDA_SUCCESS)
        res = real_(list, numDevices, flags);
    while (held > 0)
        sg_arb_exit(&gates[--held]);
    return res;
}

/* A graph's allocation nodes are admitted before it waits for the token (graphmem.c). */
#define GRAPH_LAUNCH(name)                                                                         \
    SG_EXPORT CUresult name(CUgraphExec exec, CUstream stream)                                     \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(exec, stream);                                                          \
        struct sg_graph_mem gm_;                                                                   \
        CUresult res_ = sg_graph_mem_begin(exec, &gm_);                                            \
        if (res_ != CUDA_SUCCESS)                                                                  \
            return res_;                                                                           \
        struct sg_gate gt_;                                                                        \
        res_ = sg_arb_enter(&gt_, stream);                                                         \
        if (res_ == CUDA_SUCCESS) {                                                                \
            res_ = real_(exec, stream);                                                            \
            sg_arb_exit(&gt_);                                                                     \
        }                                                                                          \
        sg_graph_mem_end(&gm_);                                                                    \
        return res_;                                                                               \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* The deprecated launches: gated too, so that no launch path escapes. */
SG_EXPORT CUresult cuLaunch(CUfunction f)
{
    REAL(cuLaunch);
    FORWARD_IF_PASSIVE(f);
    GATED(NULL, f);
}

SG_EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    REAL(cuLaunchGrid);
    FORWARD_IF_PASSIVE(f, grid_width, grid_height);
    GATED(NULL, f, grid_width, grid_height);
}

SG_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    REAL(cuLaunchGridAsync);
    FORWARD_IF_PASSIVE(f, grid_width, grid_height, hStream);
    GATED(hStream, f, grid_width, grid_height, hStream);
}

/* ---- sync calls: the end of a burst -------------------------------------------------------- */

/* kind/what: what the call waited for (sg_arb_sync_end: a sync that covered the hold's work). */
#define BURST_END(kind, what, ...)                                                                 \
    struct sg_sync s_;                                                                             \
    sg_arb_sync_begin(&s_, kind, what);                                                            \
    CUresult res_ = real_(__VA_ARGS__);                                                            \
    sg_arb_sync_end(&s_, res_, kind, what);                                                        \
    sg_async_free_settle(); /* what the sync waited for includes queued frees */                   \
    return res_

SG_EXPORT CUresult cuCtxSynchronize(void)
{
    REAL(cuCtxSynchronize);
    FORWARD_IF_PASSIVE();
    BURST_END(SG_SYNC_CTX, NULL);
}

/* CUDA 13: the context to synchronise is named (NULL: the current one). */
SG_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    REAL(cuCtxSynchronize_v2);
    FORWARD_IF_PASSIVE(ctx);
    BURST_END(SG_SYNC_CTX, ctx, ctx);
}

#define STREAM_SYNC(name)                                                                          \
    SG_EXPORT CUresult name(CUstream stream)                                                       \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(stream);                                                                \
        BURST_END(SG_SYNC_STREAM, stream, stream);                                                 \
    }
STREAM_SYNC(cuStreamSynchronize)
STREAM_SYNC(cuStreamSynchronize_ptsz)

SG_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    REAL(cuEventSynchronize);
    FORWARD_IF_PASSIVE(event);
    BURST_END(SG_SYNC_OTHER, NULL, event);
}

#define COPY_HTOD(name)                                                                            \
    SG_EXPORT CUresult name(CUdeviceptr dst, const void *src, size_t bytes)                        \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dst, src, bytes);                                                       \
        BURST_END(SG_SYNC_OTHER, NULL, dst, src, bytes);                                           \
    }
COPY_HTOD(cuMemcpyHtoD_v2)
COPY_HTOD(cuMemcpyHtoD_v2_ptds)

#define COPY_DTOH(name)                                                                            \
    SG_EXPORT CUresult name(void *dst, CUdeviceptr src, size_t bytes)                              \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dst, src, bytes);                                                       \
        BURST_END(SG_SYNC_OTHER, NULL, dst, src, bytes);                                           \
    }
COPY_DTOH(cuMemcpyDtoH_v2)
COPY_DTOH(cuMemcpyDtoH_v2_ptds)

#define COPY_DTOD(name)                                                                            \
    SG_EXPORT CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t bytes)                        \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dst, src, bytes);                                                       \
        BURST_END(SG_SYNC_OTHER, NULL, dst, src, bytes);                                           \
    }
COPY_DTOD(cuMemcpyDtoD_v2)
COPY_DTOD(cuMemcpyDtoD_v2_ptds)
