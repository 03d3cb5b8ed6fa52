/*
 * Function and kernel attributes, occupancy.  No code is compiled, so a function reports what a
 * small kernel built for the card (sm_90) reports: 32 registers, no static shared, constant or
 * local memory, up to 1024 threads per block, and 48 KiB of dynamic shared memory unless raised
 * (up to the card's 227 KiB per block).  Occupancy follows from threads and shared memory per SM.
 */
#include "cu.h"

#include <string.h>

enum {
    ATTR_MAX_THREADS_PER_BLOCK = 0,
    ATTR_SHARED_SIZE_BYTES,
    ATTR_CONST_SIZE_BYTES,
    ATTR_LOCAL_SIZE_BYTES,
    ATTR_NUM_REGS,
    ATTR_PTX_VERSION,
    ATTR_BINARY_VERSION,
    ATTR_CACHE_MODE_CA,
    ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    ATTR_PREFERRED_SHARED_MEMORY_CARVEOUT,
    ATTR_CLUSTER_SIZE_MUST_BE_SET,
    ATTR_REQUIRED_CLUSTER_WIDTH,
    ATTR_REQUIRED_CLUSTER_HEIGHT,
    ATTR_REQUIRED_CLUSTER_DEPTH,
    ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
    ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    ATTR_MAX
};

#define DEFAULT_DYN_SMEM 49152
#define MAX_DYN_SMEM_PER_BLOCK 232448 /* 227 KiB */
#define SMEM_PER_SM 233472            /* 228 KiB */
#define THREADS_PER_SM 2048
#define BLOCKS_PER_SM 32

static CUresult get_attr(int *pi, CUfunction_attribute a, const struct CUfunc_st *f)
{
    if (!pi || a < 0 || a >= ATTR_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case ATTR_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case ATTR_NUM_REGS: *pi = 32; break;
    case ATTR_PTX_VERSION:
    case ATTR_BINARY_VERSION: *pi = 90; break;
    case ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        *pi = f && f->max_dyn_smem ? f->max_dyn_smem : DEFAULT_DYN_SMEM;
        break;
    case ATTR_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = f && f->carveout ? f->carveout : -1; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

static CUresult set_attr(struct CUfunc_st *f, CUfunction_attribute a, int v)
{
    switch (a) {
    case ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (v < 0 || v > MAX_DYN_SMEM_PER_BLOCK)
            return CUDA_ERROR_INVALID_VALUE;
        f->max_dyn_smem = v;
        return CUDA_SUCCESS;
    case ATTR_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (v < -1 || v > 100)
            return CUDA_ERROR_INVALID_VALUE;
        f->carveout = v;
        return CUDA_SUCCESS;
    case ATTR_REQUIRED_CLUSTER_WIDTH:
    case ATTR_REQUIRED_CLUSTER_HEIGHT:
    case ATTR_REQUIRED_CLUSTER_DEPTH:
    case ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE: return CUDA_SUCCESS; /* accepted, not modelled */
    default: return CUDA_ERROR_INVALID_VALUE;                          /* read-only attributes */
    }
}

/* The function f names in the current context (a CUkernel cast to a CUfunction included). */
static CUresult resolve(CUfunction f, struct CUfunc_st **out)
{
    CUresult r = cu_func_check(f);
    if (r)
        return r;
    if (f->magic == FUNC_MAGIC) {
        *out = f;
        return CUDA_SUCCESS;
    }
    struct CUctx_st *c;
    r = cu_ctx_current(&c);
    return r ? r : cu_func_in(f, c, out);
}

SIM_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    struct CUfunc_st *f;
    CUresult r = resolve(hfunc, &f);
    return r ? r : get_attr(pi, attrib, f);
}

SIM_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    struct CUfunc_st *f;
    CUresult r = resolve(hfunc, &f);
    return r ? r : set_attr(f, attrib, value);
}

SIM_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config)
{
    struct CUfunc_st *f;
    CUresult r = resolve(hfunc, &f);
    return r ? r : (config < 0 || config > 3) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    struct CUfunc_st *f;
    CUresult r = name ? resolve(hfunc, &f) : CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *name = f->name;
    return r;
}

SIM_EXPORT CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    struct CUfunc_st *f;
    CUresult r = hmod ? resolve(hfunc, &f) : CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *hmod = f->mod;
    return r;
}

/* Kernel attributes are per device; every device here is the same card. */
SIM_EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                         CUdevice dev)
{
    CUresult r = cu_ready_device(dev, NULL);
    if (!r)
        r = cu_func_check((CUfunction)(void *)kernel);
    if (!r && kernel->magic != KERNEL_MAGIC)
        r = CUDA_ERROR_INVALID_HANDLE;
    return r ? r : get_attr(pi, attrib, NULL);
}

SIM_EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                         CUdevice dev)
{
    CUresult r = cu_ready_device(dev, NULL);
    if (!r)
        r = cu_func_check((CUfunction)(void *)kernel);
    if (!r && kernel->magic != KERNEL_MAGIC)
        r = CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st scratch = {0};
    return r ? r : set_attr(&scratch, attrib, val); /* validated, not kept per device */
}

/* ---- occupancy ------------------------------------------------------------------------------ */

static int blocks_per_sm(int block, size_t smem)
{
    if (block <= 0 || block > 1024 || smem > MAX_DYN_SMEM_PER_BLOCK)
        return 0;
    int by_threads = THREADS_PER_SM / block;
    int by_smem = smem ? (int)(SMEM_PER_SM / smem) : BLOCKS_PER_SM;
    int n = by_threads < by_smem ? by_threads : by_smem;
    return n < BLOCKS_PER_SM ? n : BLOCKS_PER_SM;
}

static CUresult max_active(int *numBlocks, CUfunction func, int blockSize, size_t smem, unsigned flags)
{
    struct CUfunc_st *f;
    CUresult r = numBlocks ? resolve(func, &f) : CUDA_ERROR_INVALID_VALUE;
    if (r)
        return r;
    if (flags & ~1u) /* CU_OCCUPANCY_DEFAULT, CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE */
        return CUDA_ERROR_INVALID_VALUE;
    *numBlocks = blocks_per_sm(blockSize, smem);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                                int blockSize, size_t dynamicSMemSize)
{
    return max_active(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

SIM_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks,
                                                                         CUfunction func,
                                                                         int blockSize,
                                                                         size_t dynamicSMemSize,
                                                                         unsigned int flags)
{
    return max_active(numBlocks, func, blockSize, dynamicSMemSize, flags);
}

/* The block size with the most resident threads per SM (largest on ties), as the driver does. */
SIM_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                                     size_t (*smemFor)(int), size_t dynamicSMemSize,
                                                     int blockSizeLimit)
{
    struct CUfunc_st *f;
    CUresult r = (minGridSize && blockSize) ? resolve(func, &f) : CUDA_ERROR_INVALID_VALUE;
    if (r)
        return r;
    int limit = blockSizeLimit > 0 && blockSizeLimit < 1024 ? blockSizeLimit : 1024;
    int best = 0, best_threads = 0, best_blocks = 0;
    for (int b = 32; b <= limit; b += 32) {
        int n = blocks_per_sm(b, smemFor ? smemFor(b) : dynamicSMemSize);
        if (n * b >= best_threads && n > 0) {
            best = b;
            best_threads = n * b;
            best_blocks = n;
        }
    }
    *blockSize = best;
    *minGridSize = best_blocks * (int)cu_g.st->cfg.sm_count;
    return CUDA_SUCCESS;
}
