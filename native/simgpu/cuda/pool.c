/*
 * Stream-ordered allocation and memory pools, kept as a driver keeps them.
 *
 * Every device has a default pool, and programs may create more.  A pool holds `reserved` bytes
 * charged to the process on its GPU: its live allocations (`used`) and the freed memory it keeps
 * cached for reuse.  So:
 *   - cuMemAllocAsync / cuMemAllocFromPoolAsync reuse cached memory first and charge only what
 *     the pool must grow by (CUDA_ERROR_OUT_OF_MEMORY when the card has no more);
 *   - cuMemFreeAsync takes effect when its stream reaches it, not when it is queued: until the
 *     kernels queued before it are done, the memory is still used;
 *   - freed memory stays cached, and charged, until a synchronisation (stream, event or context
 *     synchronize) finds the pool above its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
 *     default 0), or cuMemPoolTrimTo trims it; the end of the device's last context empties it.
 * The charge is by bytes, not by blocks: a real pool may keep more (fragmentation, rounding).
 *
 * Locks: pool_mu is taken after cu_g.mu and mem_mu, never before them; it may be held while the
 * state lock is taken (charging).
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    ATTR_RELEASE_THRESHOLD,
    ATTR_RESERVED_MEM_CURRENT,
    ATTR_RESERVED_MEM_HIGH,
    ATTR_USED_MEM_CURRENT,
    ATTR_USED_MEM_HIGH,
};

/* A cuMemFreeAsync its stream has not reached yet. */
struct pending_free {
    CUdeviceptr ptr;
    int phys;
    struct sim_ticket after; /* the stream's last kernel when the free was queued */
    struct pending_free *next;
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUmemPoolHandle_st *created; /* [pool_mu] */
static struct pending_free *pending;       /* [pool_mu] in queue order */

void cu_pool_fork_child(void)
{
    pthread_mutex_init(&pool_mu, NULL);
    created = NULL; /* the parent's pools, charges and queued frees are not the child's */
    pending = NULL;
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        cu_g.pool[i].magic = 0;
        cu_g.current[i] = NULL;
    }
}

static CUresult pool_check(CUmemoryPool pool)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (pool && pool->magic == POOL_MAGIC && !pool->dead) ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_VALUE;
}

/* Under pool_mu: gives back what pool caches above keep bytes of reserved memory. */
static void trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    if (p->reserved > floor) {
        sim_uncharge(cu_g.st, p->phys, p->reserved - floor);
        p->reserved = floor;
    }
}

void cu_pool_returned(struct CUmemPoolHandle_st *pool, uint64_t bytes)
{
    pthread_mutex_lock(&pool_mu);
    pool->used -= bytes < pool->used ? bytes : pool->used;
    if (pool->dead) /* destroyed earlier: nothing is cached any more */
        trim_locked(pool, 0);
    pthread_mutex_unlock(&pool_mu);
}

/* Takes the queued frees whose stream has reached them, oldest first (frees of one stream come
 * in order); the caller frees them outside pool_mu. */
static struct pending_free *take_reached(void)
{
    struct pending_free *done = NULL, **tail = &done;
    pthread_mutex_lock(&pool_mu);
    for (struct pending_free **pp = &pending; *pp;) {
        struct sim_err e = {0};
        struct pending_free *f = *pp;
        if (sim_engine_query(&e, cu_g.st, f->phys, &f->after) != 0) { /* done, or unknowable */
            *pp = f->next;
            f->next = NULL;
            *tail = f;
            tail = &f->next;
        } else {
            pp = &f->next;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    return done;
}

static void apply_reached(void)
{
    for (struct pending_free *f = take_reached(); f;) {
        struct pending_free *next = f->next;
        (void)cu_mem_free(f->ptr); /* a pool allocation goes back to its pool's cache */
        free(f);
        f = next;
    }
}

static void for_each_pool_locked(void (*fn)(struct CUmemPoolHandle_st *, int), int arg)
{
    for (int i = 0; i < cu_g.nvis; i++)
        if (cu_g.pool[i].magic == POOL_MAGIC)
            fn(&cu_g.pool[i], arg);
    for (struct CUmemPoolHandle_st *p = created; p; p = p->next)
        fn(p, arg);
}

static void trim_to_threshold(struct CUmemPoolHandle_st *p, int unused)
{
    (void)unused;
    trim_locked(p, p->release_threshold);
}

static void trim_device(struct CUmemPoolHandle_st *p, int phys)
{
    if (p->phys == phys)
        trim_locked(p, 0);
}

void cu_pool_drop_pending(CUdeviceptr ptr)
{
    pthread_mutex_lock(&pool_mu);
    for (struct pending_free **pp = &pending; *pp;) {
        struct pending_free *f = *pp;
        if (f->ptr == ptr) {
            *pp = f->next;
            free(f);
        } else {
            pp = &f->next;
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

void cu_pools_sync(void)
{
    apply_reached();
    pthread_mutex_lock(&pool_mu);
    for_each_pool_locked(trim_to_threshold, 0);
    pthread_mutex_unlock(&pool_mu);
}

void cu_pools_trim_device(int phys)
{
    pthread_mutex_lock(&pool_mu);
    for_each_pool_locked(trim_device, phys);
    pthread_mutex_unlock(&pool_mu);
}

/* ---- allocation and free -------------------------------------------------------------------- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream h)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (pool && (pool_check(pool) || pool->imported))
        return CUDA_ERROR_INVALID_VALUE; /* an imported pool allocates nothing */
    if (!pool) { /* the stream's device's current pool */
        pool = cu_g.current[s->ctx->ordinal] ? cu_g.current[s->ctx->ordinal]
                                             : &cu_g.pool[s->ctx->ordinal];
    }
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture) /* recorded as a graph memory node: allocated when the graph runs */
        return cu_graph_capture_alloc(s->capture, s->ctx, pool->phys, bytesize, dptr);
    apply_reached(); /* memory freed by now is reusable */
    pthread_mutex_lock(&pool_mu);
    uint64_t cached = pool->reserved - pool->used;
    uint64_t grow = bytesize > cached ? bytesize - cached : 0;
    if (grow) {
        struct sim_err e = {0};
        if (sim_charge(&e, cu_g.st, pool->phys, grow) < 0) {
            pthread_mutex_unlock(&pool_mu);
            return cu_result(&e);
        }
        pool->reserved += grow;
    }
    pool->used += bytesize;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    pthread_mutex_unlock(&pool_mu);
    r = cu_mem_place_pooled(s->ctx, pool->phys, bytesize, pool, dptr);
    if (r) {
        pthread_mutex_lock(&pool_mu);
        pool->used -= bytesize;
        pthread_mutex_unlock(&pool_mu);
    }
    return r;
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
    return pool ? alloc_async(dptr, bytesize, pool, stream) : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream stream)
{
    return pool ? alloc_async(dptr, bytesize, pool, stream) : CUDA_ERROR_INVALID_VALUE;
}

/* Queued behind the stream's work: the free happens when the stream gets there. */
static CUresult free_async(CUdeviceptr dptr, CUstream h)
{
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    struct CUmemPoolHandle_st *pool;
    uint64_t bytes;
    int phys;
    if (!cu_mem_lookup(dptr, &pool, &bytes, &phys))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return cu_graph_capture_free(s->capture, dptr);
    if ((r = cu_stream_settle(s)))
        return r;
    struct pending_free *f = calloc(1, sizeof(*f));
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->ptr = dptr;
    f->phys = s->ctx->phys;
    pthread_mutex_lock(&pool_mu);
    struct sim_err e = {0};
    if (sim_lock(&e, cu_g.st) < 0) {
        pthread_mutex_unlock(&pool_mu);
        free(f);
        return cu_result(&e);
    }
    f->after = s->q.last; /* read under the state lock, as the engine writes it */
    sim_unlock(cu_g.st);
    struct pending_free **tail = &pending;
    while (*tail)
        tail = &(*tail)->next;
    *tail = f;
    pthread_mutex_unlock(&pool_mu);
    apply_reached(); /* an idle stream has reached it already */
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream);
}

SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream);
}

/* ---- pools ---------------------------------------------------------------------------------- */

SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready_device(dev, NULL);
    if (!r)
        *pool = &cu_g.pool[dev];
    return r;
}

SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready_device(dev, NULL);
    if (!r)
        *pool = cu_g.current[dev] ? cu_g.current[dev] : &cu_g.pool[dev];
    return r;
}

SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = cu_ready_device(dev, NULL);
    if (r)
        return r;
    if (pool_check(pool) || pool->imported)
        return CUDA_ERROR_INVALID_VALUE;
    if (pool->ordinal != dev)
        return CUDA_ERROR_INVALID_DEVICE; /* a pool must be local to the device it serves */
    cu_g.current[dev] = pool->is_default ? NULL : pool;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!pool || !props)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (props->handleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    int phys = cu_phys(props->location.id);
    if (phys < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->ordinal = props->location.id;
    p->phys = phys;
    p->handle_types = props->handleTypes;
    for (int k = 0; k < 3; k++)
        p->reuse[k] = 1;
    p->magic = POOL_MAGIC;
    pthread_mutex_lock(&pool_mu);
    p->next = created;
    created = p;
    pthread_mutex_unlock(&pool_mu);
    *pool = p;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = pool_check(pool);
    if (r)
        return r;
    if (pool->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < SIM_MAX_GPUS; i++)
        if (cu_g.current[i] == pool)
            cu_g.current[i] = NULL; /* the device goes back to its default pool */
    pthread_mutex_lock(&pool_mu);
    /* Live allocations keep their memory until freed; the cache goes now.  The handle stays
     * allocated (marked dead) for the allocations that still name it. */
    pool->dead = 1;
    trim_locked(pool, 0);
    if (pool->share_fd) { /* its exported descriptors stay valid; no new pointer is exported */
        close(pool->share_fd - 1);
        pool->share_fd = 0;
    }
    for (struct CUmemPoolHandle_st **pp = &created; *pp; pp = &(*pp)->next) {
        if (*pp == pool) {
            *pp = pool->next;
            break;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult r = pool_check(pool);
    if (r)
        return r;
    apply_reached();
    pthread_mutex_lock(&pool_mu);
    trim_locked(pool, minBytesToKeep);
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = pool_check(pool);
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    switch ((int)attr) {
    case ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - 1] = *(int *)value != 0;
        break;
    case ATTR_RELEASE_THRESHOLD: pool->release_threshold = *(cuuint64_t *)value; break;
    case ATTR_RESERVED_MEM_HIGH: /* only resetting to 0 is allowed: back to the current value */
    case ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else if ((int)attr == ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
        break;
    default: r = CUDA_ERROR_INVALID_VALUE; /* read-only or unknown */
    }
    pthread_mutex_unlock(&pool_mu);
    return r;
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = pool_check(pool);
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    apply_reached();
    pthread_mutex_lock(&pool_mu);
    switch ((int)attr) {
    case ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = pool->reuse[attr - 1]; break;
    case ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
    case ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
    case ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
    case ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
    case ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pool_mu);
    return r;
}
