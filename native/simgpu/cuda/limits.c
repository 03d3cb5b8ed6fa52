/*
 * Context limits (cuCtxSetLimit / cuCtxGetLimit) and the device memory they reserve.
 *
 * A real driver backs five limits with device memory of the context: the per-thread stack (for
 * every thread the GPU can hold resident: SMs x 2048), the printf FIFO, the device malloc heap,
 * and the device runtime's two reservations (cuda.h, cuCtxSetLimit: raising either "will require
 * the driver to reserve [larger amounts of] device memory"; when that fails cuCtxSetLimit returns
 * CUDA_ERROR_OUT_OF_MEMORY):
 *
 *   - CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, default 2, at most 24: a backing store of the parent
 *     grids' state for every level at which a device-side cudaDeviceSynchronize may be called.
 *     The CUDA Programming Guide (Dynamic Parallelism, CDP1 "Memory Footprint") states that each
 *     such level "may require up to 860MB of device memory, depending on the device
 *     configuration"; we place SYNC_LEVEL_BYTES = 860 MiB per level, the documented bound.  The
 *     limit exists only below compute capability 9.0: there cuCtxSetLimit and cuCtxGetLimit
 *     return CUDA_ERROR_UNSUPPORTED_LIMIT (cuda.h), as here (config "cc_major", default 9).
 *   - CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, default 2048: a slot per pending device-side
 *     launch holding its configuration and parameter data (Programming Guide, "Pending Kernel
 *     Launches").  No size is published; we place PENDING_LAUNCH_BYTES = 4 KiB a slot, the
 *     4 KB of __global__ parameters the guide documents (our estimate, to be measured on a GPU).
 *
 * The memory of the defaults is part of the context's own overhead (context_overhead_mib);
 * raising a limit above its default charges the difference to the process at once, as device
 * memory no allocation call ever returns (NVML and cuMemGetInfo see it, an interposer's ledger
 * does not).  Lowering it gives the memory back; so does the end of the context.
 */
#include "cu.h"

#define THREADS_PER_SM 2048u
#define SYNC_LEVEL_BYTES (860ull << 20)
#define SYNC_DEPTH_MAX 24u
#define PENDING_LAUNCH_BYTES 4096ull

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

/* a * b + c, saturating: a value the device can never hold stays one. */
static uint64_t mul_add(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r))
        return UINT64_MAX;
    return r;
}

/* The bytes a set of limits reserves beyond what the context's overhead already holds. */
static uint64_t reservation(const size_t *limit)
{
    uint64_t threads = (uint64_t)cu_g.st->cfg.sm_count * THREADS_PER_SM;
    uint64_t r = mul_add(above(limit, CU_LIMIT_STACK_SIZE), threads, 0);
    r = mul_add(above(limit, CU_LIMIT_PRINTF_FIFO_SIZE), 1, r);
    r = mul_add(above(limit, CU_LIMIT_MALLOC_HEAP_SIZE), 1, r);
    r = mul_add(above(limit, CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH), SYNC_LEVEL_BYTES, r);
    return mul_add(above(limit, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT), PENDING_LAUNCH_BYTES, r);
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
    if (l == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
        return cu_g.st->cfg.cc_major < 9; /* removed from compute capability 9.0 on */
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
    if (limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH && value > SYNC_DEPTH_MAX)
        return CUDA_ERROR_INVALID_VALUE; /* "up the maximum launch depth of 24" */
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
