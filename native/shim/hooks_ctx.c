/*
 * Context and stream teardown.
 *
 * The driver frees a context's memory with the context: at cuCtxDestroy, and for a primary
 * context at cuDevicePrimaryCtxReset (cudaDeviceReset) or at the cuDevicePrimaryCtxRelease
 * that drops its last reference.  The ledger credits the allocations made in it then, or the
 * cap would stay charged for memory that no longer exists (a spurious out-of-memory after
 * cudaDeviceReset).  Only device pointers are credited this way (see sg_alloc_end): VMM handles
 * outlive contexts and arrays stay charged until destroyed.
 *
 * Any destroyed stream or context also ends the arbiter's cached stream -> GPU lookups: its
 * handle may come back as another GPU's stream.  The epoch moves before and after the call, so
 * a handle reused while the call runs is never matched either.
 */
#include "shim.h"

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

/* A stream or a context goes: the epoch moves around the real call; `then` runs when it
 * succeeded (a context's memory goes with it). */
#define DESTROY(name, type, then)                                                                  \
    SG_EXPORT CUresult name(type handle)                                                           \
    {                                                                                              \
        REAL(name);                                                                                \
        sg_stream_handles_died();                                                                  \
        CUresult res = real_(handle);                                                              \
        sg_stream_handles_died();                                                                  \
        if (res == CUDA_SUCCESS)                                                                   \
            then;                                                                                  \
        return res;                                                                                \
    }

static void context_gone(CUcontext ctx)
{
    if (!sg_in_hook && sg_configured()) {
        sg_credit_context(ctx);
        sg_graph_mem_settle_all(); /* whatever graph memory the driver freed with it */
    }
}

DESTROY(cuStreamDestroy, CUstream, (void)handle)
DESTROY(cuStreamDestroy_v2, CUstream, (void)handle)
DESTROY(cuCtxDestroy, CUcontext, context_gone(handle))
DESTROY(cuCtxDestroy_v2, CUcontext, context_gone(handle))

/* The primary context of dev if it is active (looked up without changing its state), or NULL. */
static CUcontext active_primary(CUdevice dev)
{
    unsigned flags;
    int active = 0;
    CUcontext ctx = NULL;
    if (!SG_REAL(cuDevicePrimaryCtxGetState) || !SG_REAL(cuDevicePrimaryCtxRetain) ||
        !SG_REAL(cuDevicePrimaryCtxRelease_v2) ||
        SG_REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) != CUDA_SUCCESS || !active)
        return NULL;
    if (SG_REAL(cuDevicePrimaryCtxRetain)(&ctx, dev) != CUDA_SUCCESS)
        return NULL;
    SG_REAL(cuDevicePrimaryCtxRelease_v2)(dev); /* the reference we just took */
    return ctx;
}

static bool primary_gone(CUdevice dev)
{
    unsigned flags;
    int active = 1;
    return SG_REAL(cuDevicePrimaryCtxGetState) &&
           SG_REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

#define PRIMARY_END(name)                                                                          \
    SG_EXPORT CUresult name(CUdevice dev)                                                          \
    {                                                                                              \
        REAL(name);                                                                                \
        if (sg_in_hook || !sg_configured())                                                        \
            return real_(dev);                                                                     \
        sg_in_hook++;                                                                              \
        CUcontext ctx = active_primary(dev);                                                       \
        sg_stream_handles_died();                                                                  \
        CUresult res = real_(dev);                                                                 \
        sg_stream_handles_died();                                                                  \
        if (res == CUDA_SUCCESS && ctx && primary_gone(dev))                                       \
            sg_credit_context(ctx);                                                                \
        sg_in_hook--;                                                                              \
        if (res == CUDA_SUCCESS && ctx)                                                            \
            sg_graph_mem_settle_all();                                                             \
        return res;                                                                                \
    }
PRIMARY_END(cuDevicePrimaryCtxRelease)
PRIMARY_END(cuDevicePrimaryCtxRelease_v2)
PRIMARY_END(cuDevicePrimaryCtxReset)
PRIMARY_END(cuDevicePrimaryCtxReset_v2)
