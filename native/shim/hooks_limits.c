/*
 * Context limits that take device memory: cuCtxSetLimit.
 *
 * The driver backs five limits with memory of the context that no allocation call returns:
 * the device malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE, what in-kernel malloc() draws on), the
 * printf FIFO, the per-thread stack, reserved for every thread the GPU can hold resident
 * (CUDA Programming Guide, "Stack size"; multiprocessors x max threads per multiprocessor), and
 * the device runtime's reservations (cuda.h, cuCtxSetLimit): a backing store of parent-grid state
 * per level of CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH ("up to 860MB" a level, Programming Guide, CDP1
 * "Memory Footprint"; the limit exists below compute capability 9.0 only, above it the driver
 * refuses it) and a slot per CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT (no size published: 4 KiB,
 * the __global__ parameter bytes a slot must hold, our estimate; the agent's reconciliation
 * counts whatever a driver places beyond it).  Unhooked, a raised heap limit is device memory
 * past the cap (in-kernel malloc of any size), and so is a raised sync depth (860 MiB a level).
 *
 * Raising a limit is charged like an allocation, before the real call (refused:
 * CUDA_ERROR_OUT_OF_MEMORY, one of cuCtxSetLimit's documented errors); what the context already
 * had when the shim first saw a limit is its own overhead (the agent's NVML reconciliation
 * measures that), so the charge is the growth above it, per (context, limit).  Lowering gives
 * back down to zero; the context's teardown credits what is left (hooks_ctx.c), as for its
 * allocations.  The value the driver really set (it rounds the stack) is read back after.
 */
#include "shim.h"

#include <pthread.h>

#define SYNC_LEVEL_BYTES (860ull << 20)  /* per CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH level */
#define PENDING_LAUNCH_BYTES 4096ull      /* per CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT slot */

/* The charge of (ctx, limit) lives in the allocation table under this key (limits 0..4 < 8). */
static uint64_t limit_key(CUcontext ctx, CUlimit limit)
{
    return (uint64_t)(uintptr_t)ctx * 8u + (uint64_t)limit;
}

/* Bytes of device memory one unit of the limit costs on dev; 0: the limit takes none. */
static uint64_t unit_bytes(CUlimit limit, CUdevice dev)
{
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE)
        return 1;
    if (limit == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT)
        return PENDING_LAUNCH_BYTES;
    if (limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH) {
        int major = 0;
        if (!SG_REAL(cuDeviceGetAttribute) ||
            SG_REAL(cuDeviceGetAttribute)(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                          dev) != CUDA_SUCCESS ||
            major <= 0)
            return UINT64_MAX; /* cannot tell: any growth is refused rather than let through */
        return major >= 9 ? 0 : SYNC_LEVEL_BYTES; /* 9.0 on: the driver refuses the limit */
    }
    if (limit != CU_LIMIT_STACK_SIZE)
        return 0;
    int sms = 0, threads = 0;
    if (!SG_REAL(cuDeviceGetAttribute) ||
        SG_REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) !=
            CUDA_SUCCESS ||
        SG_REAL(cuDeviceGetAttribute)(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                dev) != CUDA_SUCCESS ||
        sms <= 0 || threads <= 0)
        return UINT64_MAX; /* cannot size it: any growth is refused rather than let through */
    return (uint64_t)sms * (uint64_t)threads;
}

/* (to - from) x unit, saturating; 0 when not a growth. */
static uint64_t growth(size_t from, size_t to, uint64_t unit)
{
    uint64_t bytes;
    if (to <= from)
        return 0;
    return __builtin_mul_overflow((uint64_t)(to - from), unit, &bytes) ? UINT64_MAX : bytes;
}

/* Two threads setting a limit of one context at once would each read the same value before
 * and each replace the other's charge: one call at a time (the call is rare). */
static pthread_mutex_t limit_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t limit_once = PTHREAD_ONCE_INIT;
static void limit_fork_child(void)
{
    pthread_mutex_init(&limit_mu, NULL);
}
static void limit_setup(void)
{
    pthread_atfork(NULL, NULL, limit_fork_child);
}

static CUresult set_limit_locked(CUlimit limit, size_t value, size_t before, uint64_t unit,
                                 CUcontext ctx, CUdevice dev);

SG_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    if (!SG_REAL(cuCtxSetLimit))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured() || !SG_REAL(cuCtxGetLimit))
        return SG_REAL(cuCtxSetLimit)(limit, value);
    CUcontext ctx;
    CUdevice dev;
    size_t before;
    uint64_t unit = 0;
    if (sg_current_place(&ctx, &dev) != CUDA_SUCCESS || !ctx ||
        SG_REAL(cuCtxGetLimit)(&before, limit) != CUDA_SUCCESS ||
        (unit = unit_bytes(limit, dev)) == 0)
        return SG_REAL(cuCtxSetLimit)(limit, value); /* no context, not a limit, or no memory */
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    pthread_once(&limit_once, limit_setup);
    pthread_mutex_lock(&limit_mu);
    sg_in_hook++;
    size_t now_set;
    if (SG_REAL(cuCtxGetLimit)(&now_set, limit) == CUDA_SUCCESS)
        before = now_set; /* read again now that no other thread of ours can change it */
    CUresult res = set_limit_locked(limit, value, before, unit, ctx, dev);
    sg_in_hook--;
    pthread_mutex_unlock(&limit_mu);
    return res;
}

static CUresult set_limit_locked(CUlimit limit, size_t value, size_t before, uint64_t unit,
                                 CUcontext ctx, CUdevice dev)
{
    uint64_t key = limit_key(ctx, limit);
    struct sg_charge held, more = {0};
    sg_untrack(SG_KIND_LIMIT, key, &held); /* what this context's limit is charged now */
    uint64_t was = held.active ? held.bytes : 0, grow = growth(before, value, unit);
    struct sg_err e;
    sg_err_clear(&e);
    CUresult res = grow ? sg_cu_result(sg_reserve(dev, grow, &more, &e)) : CUDA_SUCCESS;
    if (res == CUDA_SUCCESS) {
        res = SG_REAL(cuCtxSetLimit)(limit, value);
        if (res != CUDA_SUCCESS)
            sg_unreserve(&more);
    }
    if (res != CUDA_SUCCESS) {
        if (held.active)
            sg_retrack(SG_KIND_LIMIT, key, &held);
        return res;
    }
    /* From now on one charge for the pair: the old one plus the reservation, set to what the
     * value the driver really set costs above the first value seen (never below zero). */
    size_t after = value;
    SG_REAL(cuCtxGetLimit)(&after, limit);
    struct sg_charge total = held.active ? held : more;
    if (held.active && more.active) {
        total.bytes += more.bytes;
        struct sg_charge counted = {.active = true, .idx = more.idx, .bytes = 0};
        sg_credit(&counted); /* two reservations became one entry: count it once */
    }
    uint64_t want;
    if (after >= before) {
        want = was + growth(before, after, unit);
        if (want < was)
            want = UINT64_MAX;
    } else {
        uint64_t shrink = growth(after, before, unit);
        want = was > shrink ? was - shrink : 0;
    }
    if (total.active) {
        sg_adjust(&total, want, &e); /* a driver that rounded past the cap keeps the reservation */
        total.ctx = ctx;
        if (total.bytes == 0 || sg_track(SG_KIND_LIMIT, key, &total, &e) < 0)
            sg_credit(&total);
    }
    return CUDA_SUCCESS;
}
