/*
 * Device memory.  Every allocation is charged to the shared state first (so all processes share
 * the card's capacity), then placed in this process's address space: device pointers are real
 * host addresses, so copies and memsets really move data.
 *
 * Placement: a few large MAP_NORESERVE anonymous regions (64 GiB each, added as needed) carved by
 * a first-fit allocator (arena.c).  One mapping per region, never one per allocation, so
 * vm.max_map_count is no concern; freed ranges are reused and their pages returned with
 * MADV_DONTNEED.  Live allocations are a sorted array (binary search for free and for the range
 * checks of copies).  Charged size = requested size (pitch*height for pitched allocations).
 *
 * Asynchronous allocation (cuMemAllocAsync, pools) is modelled as immediate allocation, and
 * cuMemFreeAsync as an immediate free: the simulated kernels never touch memory, so stream order
 * cannot be observed.  Copies and memsets are done on the calling thread: synchronous ones after
 * all work of the current context completes, asynchronous ones after their stream's work
 * completes (so they return when done; still stream-ordered).
 *
 * Locks: mem_mu (process-local) may be held while taking the state lock, never the reverse.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define REGION_BYTES (64ull << 30)
#define MAX_REGIONS 256
#define SMALL_ALIGN 512u
#define MADVISE_MIN (64u * 1024u)

struct alloc {
    uintptr_t base;
    size_t size;       /* placed bytes (rounded) */
    uint64_t charged;  /* bytes charged to the device */
    int phys;
    struct CUctx_st *ctx;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs; /* [mem_mu] sorted by base */
static size_t nallocs, capallocs;
static struct arena va;      /* [mem_mu] free address ranges inside the regions */
static size_t nregions;      /* [mem_mu] */

void cu_mem_fork_child(void)
{
    /* The parent's allocations are not the child's: forget them (their ranges stay taken). */
    pthread_mutex_init(&mem_mu, NULL);
    nallocs = 0;
}

static size_t find(uintptr_t p) /* first index with base >= p */
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].base < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int grow(size_t need)
{
    if (nregions >= MAX_REGIONS)
        return -1;
    size_t want = REGION_BYTES > need + CU_GRANULARITY ? REGION_BYTES : need + CU_GRANULARITY;
    for (size_t sz = want; sz >= need + CU_GRANULARITY; sz /= 2) {
        void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            continue;
        if (arena_give(&va, (uintptr_t)p, sz) < 0) {
            munmap(p, sz);
            return -1;
        }
        nregions++;
        return 0;
    }
    return -1;
}

static void release_pages(uintptr_t base, size_t size)
{
    if (size < MADVISE_MIN)
        return; /* small ranges are reused soon; a syscall per free would cost more */
    const uintptr_t page = 4096;
    uintptr_t a = (base + page - 1) & ~(page - 1), b = (base + size) & ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Places size bytes charged as `charge` on phys for ctx. */
static CUresult dev_alloc(struct CUctx_st *ctx, int phys, size_t size, uint64_t charge,
                          CUdeviceptr *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > (1ull << 46))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_err e = {0};
    if (sim_charge(&e, cu_g.st, phys, charge) < 0)
        return cu_result(&e);
    size_t align = size >= CU_GRANULARITY ? CU_GRANULARITY : SMALL_ALIGN;
    size_t rounded = (size + SMALL_ALIGN - 1) & ~(size_t)(SMALL_ALIGN - 1);
    uintptr_t p = 0;
    int ok = 0;
    pthread_mutex_lock(&mem_mu);
    if (arena_take(&va, rounded, align, &p) == 0 ||
        (grow(rounded + align) == 0 && arena_take(&va, rounded, align, &p) == 0)) {
        if (nallocs == capallocs) {
            size_t cap = capallocs ? capallocs * 2 : 256;
            struct alloc *n = realloc(allocs, cap * sizeof(*n));
            if (n) {
                allocs = n;
                capallocs = cap;
            }
        }
        if (nallocs < capallocs) {
            size_t i = find(p);
            memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof(*allocs));
            allocs[i] = (struct alloc){
                .base = p, .size = rounded, .charged = charge, .phys = phys, .ctx = ctx};
            nallocs++;
            ok = 1;
        } else {
            arena_give(&va, p, rounded);
        }
    }
    pthread_mutex_unlock(&mem_mu);
    if (!ok) {
        sim_uncharge(cu_g.st, phys, charge);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

/* Under mem_mu: removes allocs[i], returns its pages and range. */
static void drop_locked(size_t i, int *phys, uint64_t *charged)
{
    struct alloc a = allocs[i];
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof(*allocs));
    nallocs--;
    release_pages(a.base, a.size);
    arena_give(&va, a.base, a.size);
    *phys = a.phys;
    *charged = a.charged;
}

static CUresult dev_free(CUdeviceptr dptr)
{
    int phys = -1;
    uint64_t charged = 0;
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)dptr);
    int found = i < nallocs && allocs[i].base == (uintptr_t)dptr;
    if (found)
        drop_locked(i, &phys, &charged);
    pthread_mutex_unlock(&mem_mu);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    sim_uncharge(cu_g.st, phys, charged);
    return CUDA_SUCCESS;
}

void cu_mem_free_ctx(struct CUctx_st *c)
{
    pthread_mutex_lock(&mem_mu);
    for (size_t i = nallocs; i-- > 0;) {
        if (allocs[i].ctx == c) {
            int phys;
            uint64_t charged;
            drop_locked(i, &phys, &charged);
            sim_uncharge(cu_g.st, phys, charged);
        }
    }
    pthread_mutex_unlock(&mem_mu);
}

int cu_mem_range_ok(uintptr_t p, size_t len)
{
    if (len == 0)
        return 0;
    if (p + len < p)
        return -1;
    pthread_mutex_lock(&mem_mu);
    size_t i = find(p + 1); /* first base > p */
    int ok = i > 0 && p + len <= allocs[i - 1].base + allocs[i - 1].size;
    pthread_mutex_unlock(&mem_mu);
    return ok ? 0 : cu_vmm_range_ok(p, len);
}

CUresult cu_mem_reserve(struct CUctx_st *ctx, size_t size, CUdeviceptr *out)
{
    return dev_alloc(ctx, ctx->phys, size, size, out);
}

CUresult cu_mem_release(CUdeviceptr p)
{
    return dev_free(p);
}

/* ---- allocation entry points -------------------------------------------------------------- */

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    return dev_alloc(c, c->phys, bytesize, bytesize, dptr);
}

SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                       size_t height, unsigned int elementSizeBytes)
{
    if (!dptr || !pitch || !widthInBytes || !height ||
        (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    size_t p = (widthInBytes + 511) & ~(size_t)511;
    if (height > (1ull << 46) / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = dev_alloc(c, c->phys, p * height, p * height, dptr);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    /* Managed memory is charged to the device as if it were resident there. */
    return dev_alloc(c, c->phys, bytesize, bytesize, dptr);
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS; /* like free(NULL) */
    return dev_free(dptr);
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct sim_err e = {0};
    struct sim_state *st = cu_g.st;
    if (sim_lock(&e, st) < 0)
        return cu_result(&e);
    sim_reap_locked(st, 1); /* a query: show what dead processes held as free */
    uint64_t used = st->gpu[c->phys].used, cap = st->cfg.memory_bytes;
    sim_unlock(st);
    *total = (size_t)cap;
    *free_bytes = (size_t)(cap > used ? cap - used : 0);
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    int phys = s->ctx->phys;
    if (pool) {
        if (pool->magic != POOL_MAGIC || cu_phys(pool->ordinal) < 0)
            return CUDA_ERROR_INVALID_VALUE;
        phys = cu_phys(pool->ordinal);
    }
    return dev_alloc(s->ctx, phys, bytesize, bytesize, dptr);
}

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    return alloc_async(dptr, bytesize, NULL, stream);
}

SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    return alloc_async(dptr, bytesize, NULL, stream);
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream stream)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, stream);
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream stream)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, stream);
}

static CUresult free_async(CUdeviceptr dptr, CUstream h)
{
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    return dev_free(dptr);
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream);
}

SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream);
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!pool || pool->magic != POOL_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS; /* the pool caches nothing: freed memory is returned at once */
}

/* ---- copies and memsets --------------------------------------------------------------------- */

/* Waits for what a copy must follow: the stream's work, or (h == NULL: synchronous API) all
 * work of the current context. */
static CUresult copy_prologue(CUstream h, int async)
{
    if (!async) {
        struct CUctx_st *c;
        CUresult r = cu_ctx_current(&c);
        if (r)
            return r;
        return cu_ctx_wait(c);
    }
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    return cu_stream_wait(s); /* a capturing stream: its pre-capture work; copied now */
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n, CUstream h, int async)
{
    CUresult r = copy_prologue(h, async);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!src || cu_mem_range_ok((uintptr_t)dst, n) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, CUstream h, int async)
{
    CUresult r = copy_prologue(h, async);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || cu_mem_range_ok((uintptr_t)src, n) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, int async)
{
    CUresult r = copy_prologue(h, async);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (cu_mem_range_ok((uintptr_t)dst, n) < 0 || cu_mem_range_ok((uintptr_t)src, n) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    return htod(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t bytes)
{
    return htod(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return dtoh(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes)
{
    return dtoh(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return dtod(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return dtod(dst, src, bytes, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes,
                                         CUstream stream)
{
    return htod(dst, src, bytes, stream, 1);
}
SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes,
                                              CUstream stream)
{
    return htod(dst, src, bytes, stream, 1);
}
SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    return dtoh(dst, src, bytes, stream, 1);
}
SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes,
                                              CUstream stream)
{
    return dtoh(dst, src, bytes, stream, 1);
}
SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                         CUstream stream)
{
    return dtod(dst, src, bytes, stream, 1);
}
SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                              CUstream stream)
{
    return dtod(dst, src, bytes, stream, 1);
}

static CUresult memset8(CUdeviceptr dst, unsigned char v, size_t n)
{
    CUresult r = copy_prologue(NULL, 0);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (cu_mem_range_ok((uintptr_t)dst, n) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

static CUresult memset32(CUdeviceptr dst, unsigned v, size_t n)
{
    CUresult r = copy_prologue(NULL, 0);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if ((dst & 3u) || n > SIZE_MAX / 4 || cu_mem_range_ok((uintptr_t)dst, n * 4) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t *p = (uint32_t *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset8(dst, value, n);
}
SIM_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset8(dst, value, n);
}
SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n)
{
    return memset32(dst, value, n);
}
SIM_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n)
{
    return memset32(dst, value, n);
}

/* ---- CUDA arrays: charged, never addressable -------------------------------------------------- */

static unsigned format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    }
    return 0;
}

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    if (!handle || !desc || !desc->Width)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned elem = format_bytes(desc->Format);
    unsigned ch = desc->NumChannels;
    if (!elem || (ch != 1 && ch != 2 && ch != 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    size_t h = desc->Height ? desc->Height : 1;
    if (desc->Width > (1ull << 40) / h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t bytes = (uint64_t)desc->Width * h * elem * ch;
    struct CUarray_st *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_err e = {0};
    if (sim_charge(&e, cu_g.st, c->phys, bytes) < 0) {
        free(a);
        return cu_result(&e);
    }
    a->phys = c->phys;
    a->charged = bytes;
    a->magic = ARRAY_MAGIC;
    *handle = a;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuArrayDestroy(CUarray handle)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!handle || handle->magic != ARRAY_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    handle->magic = 0;
    sim_uncharge(cu_g.st, handle->phys, handle->charged);
    free(handle);
    return CUDA_SUCCESS;
}
