/*
 * Context limits (cuCtxSetLimit / cuCtxGetLimit) and the device memory they reserve.
 *
 * A real driver backs three limits with device memory of the context: the per-thread stack (for
 * every thread the GPU can hold resident: SMs x 2048), the printf FIFO and the device malloc
 * heap.  The memory of the defaults is part of the context's own overhead (context_overhead_mib);
 * raising a limit above its default charges the difference to the process at once, as device
 * memory no allocation call ever returns (NVML and cuMemGetInfo see it, an interposer's ledger
 * does not).  Lowering it gives the memory back; so does the end of the context.
 */
#include "cu.h"

#define THREADS_PER_SM 2048u

static const size_t defaults[CU_LIMIT_MAX] = {
    [CU_LIMIT_STACK_SIZE] = 1024,
    [CU_LIMIT_PRINTF_FIFO_SIZE] = 1u << 20,
    [CU_LIMIT_MALLOC_HEAP_SIZE] = 8u << 20,
    [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
    [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
    [CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64,
    [CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0,
};

static uint64_t above(const size_t *limit, CUlimit l)
{
    return limit[l] > defaults[l] ? (uint64_t)(limit[l] - defaults[l]) : 0;
}

/* The bytes a set of limits reserves beyond what the context's overhead already holds. */
static uint64_t reservation(const size_t *limit)
{
    uint64_t threads = (uint64_t)cu_g.st->cfg.sm_count * THREADS_PER_SM;
    return above(limit, CU_LIMIT_STACK_SIZE) * threads + above(limit, CU_LIMIT_PRINTF_FIFO_SIZE) +
           above(limit, CU_LIMIT_MALLOC_HEAP_SIZE);
}

void cu_limits_init(struct CUctx_st *c)
{
    for (int i = 0; i < CU_LIMIT_MAX; i++)
        c->limit[i] = defaults[i];
    c->limit_charged = 0;
    c->id = cu_next_id();
}

void cu_limits_release(struct CUctx_st *c)
{
    if (c->limit_charged)
        sim_uncharge(cu_g.st, c->phys, c->limit_charged);
    c->limit_charged = 0;
}

static int supported(CUlimit l)
{
    return (int)l >= 0 && l <= CU_LIMIT_PERSISTING_L2_CACHE_SIZE;
}

/* The preamble of both calls: the current context, and a limit that exists here. */
static CUresult limit_ctx(CUlimit limit, struct CUctx_st **c)
{
    CUresult r = cu_ctx_current(c);
    if (r)
        return r;
    if ((int)limit < 0 || limit >= CU_LIMIT_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    return supported(limit) ? CUDA_SUCCESS : CUDA_ERROR_UNSUPPORTED_LIMIT;
}

SIM_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct CUctx_st *c;
    CUresult r = limit_ctx(limit, &c);
    if (r)
        return r;
    if (limit == CU_LIMIT_MAX_L2_FETCH_GRANULARITY && (value < 32 || value > 128))
        return CUDA_ERROR_INVALID_VALUE;
    size_t next[CU_LIMIT_MAX];
    pthread_mutex_lock(&cu_g.mu);
    for (int i = 0; i < CU_LIMIT_MAX; i++)
        next[i] = c->limit[i];
    next[limit] = value;
    if (limit == CU_LIMIT_STACK_SIZE)
        next[limit] = (value + 15) & ~(size_t)15; /* the driver rounds the stack up to 16 bytes */
    uint64_t want = reservation(next);
    if (want > c->limit_charged) {
        struct sim_err e = {0};
        if (sim_charge(&e, cu_g.st, c->phys, want - c->limit_charged) < 0) {
            pthread_mutex_unlock(&cu_g.mu);
            return e.code == SIM_ENODEV_MEM ? CUDA_ERROR_OUT_OF_MEMORY : cu_result(&e);
        }
    } else if (want < c->limit_charged) {
        sim_uncharge(cu_g.st, c->phys, c->limit_charged - want);
    }
    c->limit_charged = want;
    c->limit[limit] = next[limit];
    pthread_mutex_unlock(&cu_g.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    if (!pvalue)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = limit_ctx(limit, &c);
    if (r)
        return r;
    *pvalue = c->limit[limit];
    return CUDA_SUCCESS;
}
