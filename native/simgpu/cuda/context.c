/*
 * Contexts.  The current context is a per-thread stack (push/pop/set as the real driver).
 * Primary contexts are one static object per device, active while retained; created contexts
 * are heap objects.  Destroying a context (or releasing/resetting a primary one to inactive)
 * frees the device memory allocated in it, as the real driver does.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define CTX_STACK_MAX 64
static _Thread_local struct CUctx_st *stack[CTX_STACK_MAX];
static _Thread_local int depth;

/* [cu_g.mu] contexts alive per physical GPU: the slot's ctx_mask bit is set while > 0. */
static int live_per_gpu[SIM_MAX_GPUS];
/* [cu_g.mu] created (non-primary) contexts, so a forked child can kill them all. */
static struct CUctx_st **created;
static size_t ncreated, capcreated;

int cu_ctx_alive(const struct CUctx_st *c)
{
    return c && c->magic == CTX_MAGIC && (!c->primary || c->active);
}

CUresult cu_ctx_current(struct CUctx_st **out)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (depth == 0 || !cu_ctx_alive(stack[depth - 1]))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = stack[depth - 1];
    return CUDA_SUCCESS;
}

enum sim_wait_how cu_wait_how(const struct CUctx_st *c)
{
    switch (c ? c->flags & CU_CTX_SCHED_MASK : 0) {
    case CU_CTX_SCHED_SPIN:
        return SIM_WAIT_SPIN;
    case CU_CTX_SCHED_YIELD:
        return SIM_WAIT_YIELD;
    default: /* BLOCKING_SYNC; AUTO, whose heuristic would spin wherever contexts <= CPUs */
        return SIM_WAIT_SLEEP;
    }
}

enum sim_wait_how cu_event_wait_how(const struct CUevent_st *ev)
{
    return ev->flags & CU_EVENT_BLOCKING_SYNC ? SIM_WAIT_SLEEP : cu_wait_how(ev->ctx);
}

CUresult cu_ctx_wait(struct CUctx_st *c)
{
    struct sim_err e = {0};
    if (sim_engine_wait(&e, cu_g.st, c->phys, &c->last, cu_wait_how(c)) < 0)
        return cu_result(&e);
    cu_memop_land();
    return CUDA_SUCCESS;
}

/* Called under cu_g.mu when a context on phys starts (on=1) or ends (on=0).  Every context
 * takes the configured context memory, as each of a driver's contexts has its own (the first
 * one of the process on a GPU through sim_set_ctx, which also marks the process as having a
 * context there); when it does not fit, the start fails (CUDA_ERROR_OUT_OF_MEMORY) and nothing
 * changes. */
static CUresult note_live(int phys, int on)
{
    struct sim_err e = {0};
    const uint64_t ovh = cu_g.st->cfg.context_overhead_bytes;
    if (on) {
        if (live_per_gpu[phys] == 0) {
            if (sim_set_ctx(&e, cu_g.st, phys, 1) < 0 && e.code == SIM_ENODEV_MEM)
                return CUDA_ERROR_OUT_OF_MEMORY;
        } else if (ovh && sim_charge(&e, cu_g.st, phys, ovh) < 0 && e.code == SIM_ENODEV_MEM) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        live_per_gpu[phys]++;
    } else if (--live_per_gpu[phys] == 0) {
        cu_pools_trim_device(phys); /* no context left on the GPU: the pools keep nothing */
        sim_set_ctx(NULL, cu_g.st, phys, 0);
    } else if (ovh) {
        sim_uncharge(cu_g.st, phys, ovh);
    }
    return CUDA_SUCCESS;
}

void cu_ctx_fork_child(void)
{
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        cu_g.primary[i].magic = 0;
        live_per_gpu[i] = 0;
    }
    for (size_t i = 0; i < ncreated; i++)
        created[i]->magic = 0; /* the parent's contexts are not the child's */
    ncreated = 0;
}

/* ---- primary contexts -------------------------------------------------------------------- */

static CUresult primary_of(CUdevice dev, struct CUctx_st **out)
{
    CUresult r = cu_ready_device(dev, NULL);
    if (r)
        return r;
    *out = &cu_g.primary[dev];
    return CUDA_SUCCESS;
}

/* Under cu_g.mu: the primary context becomes inactive and loses its memory. */
static void primary_deactivate(struct CUctx_st *c)
{
    (void)cu_ctx_wait(c); /* only fails on an unusable state lock: nothing left to wait for */
    cu_mem_free_ctx(c);
    cu_limits_release(c);
    c->active = 0;
    c->refcount = 0;
    note_live(c->phys, 0);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = primary_of(dev, &c);
    if (r)
        return r;
    struct sim_err e = {0};
    if (sim_slot_acquire(&e, cu_g.st) < 0)
        return cu_result(&e);
    pthread_mutex_lock(&cu_g.mu);
    if (!c->active) {
        r = note_live(c->phys, 1);
        if (r) {
            pthread_mutex_unlock(&cu_g.mu);
            return r;
        }
        cu_limits_init(c);
        c->active = 1;
        c->refcount = 0;
    }
    c->refcount++;
    pthread_mutex_unlock(&cu_g.mu);
    *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    struct CUctx_st *c;
    CUresult r = primary_of(dev, &c);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    if (!c->active || c->refcount <= 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refcount == 0) {
        primary_deactivate(c);
    }
    pthread_mutex_unlock(&cu_g.mu);
    return r;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(dev);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(dev);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = primary_of(dev, &c);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    *flags = c->flags;
    *active = c->active;
    pthread_mutex_unlock(&cu_g.mu);
    return CUDA_SUCCESS;
}

#define CTX_FLAGS_VALID 0x3fu /* scheduling (0..4), MAP_HOST 0x8, LMEM_RESIZE_TO_MAX 0x10, 0x20 */

static CUresult primary_set_flags(CUdevice dev, unsigned flags)
{
    if (flags & ~CTX_FLAGS_VALID)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = primary_of(dev, &c);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    c->flags = flags;
    pthread_mutex_unlock(&cu_g.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

static CUresult primary_reset(CUdevice dev)
{
    struct CUctx_st *c;
    CUresult r = primary_of(dev, &c);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    if (c->active)
        primary_deactivate(c);
    c->flags = 0;
    pthread_mutex_unlock(&cu_g.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(dev);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(dev);
}

/* ---- created contexts -------------------------------------------------------------------- */

static CUresult push(struct CUctx_st *c)
{
    if (depth >= CTX_STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    stack[depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CUresult r = cu_ready_device(dev, &phys);
    if (r)
        return r;
    if (flags & ~CTX_FLAGS_VALID)
        return CUDA_ERROR_INVALID_VALUE;
    if (depth >= CTX_STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_err e = {0};
    if (sim_slot_acquire(&e, cu_g.st) < 0)
        return cu_result(&e);
    struct CUctx_st *c = calloc(1, sizeof(*c));
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->ordinal = dev;
    c->phys = phys;
    c->flags = flags;
    c->refcount = 1;
    cu_limits_init(c);
    cu_stream_init(&c->defstream, c, 0);
    pthread_mutex_lock(&cu_g.mu);
    if (ncreated == capcreated) {
        size_t cap = capcreated ? capcreated * 2 : 16;
        struct CUctx_st **n = realloc(created, cap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&cu_g.mu);
            free(c);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        created = n;
        capcreated = cap;
    }
    r = note_live(phys, 1);
    if (r) {
        pthread_mutex_unlock(&cu_g.mu);
        free(c);
        return r;
    }
    created[ncreated++] = c;
    c->magic = CTX_MAGIC;
    pthread_mutex_unlock(&cu_g.mu);
    push(c);
    *pctx = c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int numParams,
                                   unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev); /* affinity (SM partitioning) is not modelled */
}

SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                   CUdevice dev)
{
    return ctx_create(pctx, flags, dev); /* params (CIG, affinity) accepted and ignored */
}

static CUresult ctx_destroy(struct CUctx_st *c)
{
    (void)cu_ctx_wait(c);
    pthread_mutex_lock(&cu_g.mu);
    for (size_t i = 0; i < ncreated; i++) {
        if (created[i] == c) {
            created[i] = created[--ncreated];
            break;
        }
    }
    cu_mem_free_ctx(c);
    cu_limits_release(c);
    note_live(c->phys, 0);
    c->magic = 0;
    pthread_mutex_unlock(&cu_g.mu);
    /* Remove it from this thread's stack (other threads holding it get INVALID_CONTEXT as long as
     * the memory is not reused, which the real driver does not promise either). */
    int w = 0;
    for (int i = 0; i < depth; i++)
        if (stack[i] != c)
            stack[w++] = stack[i];
    depth = w;
    free(c);
    return CUDA_SUCCESS;
}

/* A live created (not primary) context. */
static CUresult created_ctx(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (ctx && ctx->magic == CTX_MAGIC && !ctx->primary) ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_CONTEXT;
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = created_ctx(ctx);
    return r ? r : ctx_destroy(ctx);
}

/* The deprecated usage count of cuCtxAttach/cuCtxDetach (pycuda still detaches at exit): attach
 * adds a use of the current context, detach drops one and destroys a created context at zero. */
SIM_EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    if (!pctx || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    c->refcount++;
    pthread_mutex_unlock(&cu_g.mu);
    *pctx = c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    CUresult r = created_ctx(ctx);
    if (r)
        return r;
    struct CUctx_st *c = ctx;
    pthread_mutex_lock(&cu_g.mu);
    int last = --c->refcount <= 0;
    pthread_mutex_unlock(&cu_g.mu);
    return last ? ctx_destroy(c) : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    *pctx = depth ? stack[depth - 1] : NULL;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!ctx) {
        if (depth)
            depth--;
        return CUDA_SUCCESS;
    }
    if (!cu_ctx_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == 0)
        return push(ctx);
    stack[depth - 1] = ctx;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!cu_ctx_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push(ctx);
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = stack[--depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

/* The context a CUDA 13 call names, or the current one for NULL. */
static CUresult ctx_or_current(CUcontext ctx, struct CUctx_st **out)
{
    if (!ctx)
        return cu_ctx_current(out);
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!cu_ctx_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = ctx;
    return CUDA_SUCCESS;
}

static CUresult ctx_device(CUdevice *device, CUcontext ctx)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    return ctx_device(device, NULL);
}
SIM_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    return ctx_device(device, ctx);
}

static CUresult ctx_sync(CUcontext ctx)
{
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    r = cu_ctx_wait(c);
    if (!r)
        cu_pools_sync();
    return r;
}
SIM_EXPORT CUresult cuCtxSynchronize(void)
{
    return ctx_sync(NULL);
}
SIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    return ctx_sync(ctx);
}

/* ---- context queries ----------------------------------------------------------------------- */

SIM_EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (!r)
        *flags = c->flags;
    return r;
}

SIM_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (!r)
        *version = 3020; /* every context of the v2 API reports 3020 */
    return r;
}

SIM_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (!r)
        *ctxId = c->id;
    return r;
}
