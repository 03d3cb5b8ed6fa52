/*
 * The CUDA driver hooks: every device-memory allocation path is charged to the tenant's ledger
 * before the real call and given back if it fails; every free credits after the real free
 * succeeds; the memory views show the vGPU.
 *
 * Each hook has the same shape:
 *   - the real function missing: CUDA_ERROR_NOT_FOUND (never call a NULL pointer);
 *   - inert (no tenant), or re-entered from inside the driver: forward untouched;
 *   - broken configuration: CUDA_ERROR_NOT_PERMITTED for cuInit, allocations and views
 *     (frees still work);
 *   - otherwise the ledger protocol of ledger.c.
 */
#include <limits.h>
#include <stdint.h>

#include "shim.h"

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

#define FORWARD_IF_PASSIVE(...)                                                                    \
    if (sg_in_hook || !sg_configured())                                                            \
    return real_(__VA_ARGS__)

/* ---- allocation protocol ---------------------------------------------------------------- */

/* Reserve bytes on device dev (the current context's device when !have_dev, and then the
 * allocation belongs to the current context: its teardown frees it). */
CUresult sg_alloc_begin(bool have_dev, CUdevice dev, uint64_t bytes, struct sg_charge *c)
{
    c->active = false;
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    sg_async_free_settle(); /* frees the streams have reached by now give their memory back */
    CUcontext ctx = NULL;
    if (!have_dev) {
        CUresult res = (CUresult)sg_current_place(&ctx, &dev);
        if (res != CUDA_SUCCESS)
            return res; /* no context: the driver would refuse the allocation the same way */
    }
    struct sg_err e;
    sg_err_clear(&e);
    CUresult res = sg_cu_result(sg_reserve(dev, bytes, c, &e));
    if (res == CUDA_SUCCESS)
        c->ctx = ctx;
    return res;
}

static void undo_alloc(enum sg_kind kind, uint64_t key)
{
    if (kind == SG_KIND_PTR && SG_REAL(cuMemFree_v2))
        SG_REAL(cuMemFree_v2)((CUdeviceptr)key);
    else if (kind == SG_KIND_VMM && SG_REAL(cuMemRelease))
        SG_REAL(cuMemRelease)((CUmemGenericAllocationHandle)key);
    else if (kind == SG_KIND_ARRAY && SG_REAL(cuArrayDestroy))
        SG_REAL(cuArrayDestroy)((CUarray)(uintptr_t)key);
    else if (kind == SG_KIND_MIPMAP && SG_REAL(cuMipmappedArrayDestroy))
        SG_REAL(cuMipmappedArrayDestroy)((CUmipmappedArray)(uintptr_t)key);
    else if (kind == SG_KIND_IPC && SG_REAL(cuIpcCloseMemHandle))
        SG_REAL(cuIpcCloseMemHandle)((CUdeviceptr)key);
}

/* After the real call: record the allocation, or give the reservation back. */
CUresult sg_alloc_end(CUresult res, enum sg_kind kind, uint64_t key, struct sg_charge *c)
{
    if (res != CUDA_SUCCESS) {
        sg_unreserve(c);
        return res;
    }
    if (kind != SG_KIND_PTR && kind != SG_KIND_IPC)
        c->ctx = NULL; /* VMM handles outlive contexts; arrays stay charged until destroyed */
    struct sg_err e;
    sg_err_clear(&e);
    if (sg_track(kind, key, c, &e) < 0) {
        undo_alloc(kind, key);
        sg_unreserve(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Remove before the real free (so a concurrent allocation that gets the same address back from
 * the driver cannot be confused with it), credit after it succeeded, restore if it failed. */
CUresult sg_free_end(CUresult res, bool tracked, enum sg_kind kind, uint64_t key,
                     const struct sg_charge *c)
{
    if (tracked) {
        if (res == CUDA_SUCCESS)
            sg_credit(c);
        else
            sg_retrack(kind, key, c);
    }
    return res;
}

/* ---- cuInit ------------------------------------------------------------------------------- */

SG_EXPORT CUresult cuInit(unsigned int flags)
{
    REAL(cuInit);
    FORWARD_IF_PASSIVE(flags);
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    return real_(flags);
}

/* ---- allocations ---------------------------------------------------------------------------- */

SG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL(cuMemAlloc_v2);
    FORWARD_IF_PASSIVE(dptr, bytesize);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, bytesize, &c);
    if (res == CUDA_SUCCESS) {
        res = real_(dptr, bytesize);
        res = sg_alloc_end(res, SG_KIND_PTR, res == CUDA_SUCCESS ? *dptr : 0, &c);
    }
    sg_in_hook--;
    return res;
}

/* Pitch is only known after the call: reserve width rounded up to 512 bytes (the usual pitch
 * alignment) times height first, then adjust to pitch * height, refusing (and freeing) if the
 * growth no longer fits.  Racing processes therefore never exceed the cap. */
SG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                      size_t height, unsigned int elementSizeBytes)
{
    REAL(cuMemAllocPitch_v2);
    FORWARD_IF_PASSIVE(dptr, pitch, widthInBytes, height, elementSizeBytes);
    if (!dptr || !pitch)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t row = ((uint64_t)widthInBytes + 511u) & ~(uint64_t)511u, guess;
    if (row < widthInBytes || __builtin_mul_overflow(row, (uint64_t)height, &guess))
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, guess, &c);
    if (res == CUDA_SUCCESS) {
        res = real_(dptr, pitch, widthInBytes, height, elementSizeBytes);
        if (res == CUDA_SUCCESS) {
            uint64_t actual;
            if (__builtin_mul_overflow((uint64_t)*pitch, (uint64_t)height, &actual))
                actual = UINT64_MAX;
            struct sg_err e = {0};
            int rc = sg_adjust(&c, actual, &e);
            if (rc < 0) {
                undo_alloc(SG_KIND_PTR, *dptr);
                sg_unreserve(&c);
                sg_in_hook--;
                return sg_cu_result(rc);
            }
        }
        res = sg_alloc_end(res, SG_KIND_PTR, res == CUDA_SUCCESS ? *dptr : 0, &c);
    }
    sg_in_hook--;
    return res;
}

/* Managed memory is charged in full to the current context's device. */
SG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL(cuMemAllocManaged);
    FORWARD_IF_PASSIVE(dptr, bytesize, flags);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, bytesize, &c);
    if (res == CUDA_SUCCESS) {
        res = real_(dptr, bytesize, flags);
        res = sg_alloc_end(res, SG_KIND_PTR, res == CUDA_SUCCESS ? *dptr : 0, &c);
    }
    sg_in_hook--;
    return res;
}

/* Stream-ordered allocations are charged to their stream's device (devof.c); on a capturing
 * stream they are nodes of the graph, charged when it runs (graphmem.c). */
#define ALLOC_ASYNC(name, per_thread)                                                              \
    SG_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)                  \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dptr, bytesize, hStream);                                               \
        if (!dptr)                                                                                 \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        if (sg_stream_capturing(hStream, per_thread))                                              \
            return real_(dptr, bytesize, hStream);                                                 \
        sg_in_hook++;                                                                              \
        struct sg_charge c;                                                                        \
        CUdevice dev_;                                                                             \
        CUresult res = (CUresult)sg_stream_ordinal(hStream, &dev_);                                \
        if (res == CUDA_SUCCESS)                                                                   \
            res = sg_alloc_begin(true, dev_, bytesize, &c);                                        \
        if (res == CUDA_SUCCESS) {                                                                 \
            c.ctx = sg_stream_ctx(hStream);                                                        \
            res = real_(dptr, bytesize, hStream);                                                  \
            res = sg_alloc_end(res, SG_KIND_PTR, res == CUDA_SUCCESS ? *dptr : 0, &c);             \
        }                                                                                          \
        sg_in_hook--;                                                                              \
        return res;                                                                                \
    }
ALLOC_ASYNC(cuMemAllocAsync, false)
ALLOC_ASYNC(cuMemAllocAsync_ptsz, true)

#define ALLOC_POOL(name, per_thread)                                                               \
    SG_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,               \
                            CUstream hStream)                                                      \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dptr, bytesize, pool, hStream);                                         \
        if (!dptr)                                                                                 \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        if (sg_stream_capturing(hStream, per_thread))                                              \
            return real_(dptr, bytesize, pool, hStream);                                           \
        sg_in_hook++;                                                                              \
        struct sg_charge c;                                                                        \
        CUdevice dev_;                                                                             \
        CUresult res = (CUresult)sg_pool_ordinal(pool, hStream, &dev_);                            \
        if (res == CUDA_SUCCESS)                                                                   \
            res = sg_alloc_begin(true, dev_, bytesize, &c);                                        \
        if (res == CUDA_SUCCESS) {                                                                 \
            c.ctx = sg_stream_ctx(hStream);                                                        \
            res = real_(dptr, bytesize, pool, hStream);                                            \
            res = sg_alloc_end(res, SG_KIND_PTR, res == CUDA_SUCCESS ? *dptr : 0, &c);             \
        }                                                                                          \
        sg_in_hook--;                                                                              \
        return res;                                                                                \
    }
ALLOC_POOL(cuMemAllocFromPoolAsync, false)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz, true)

/* VMM: physical memory is charged when it is created (on prop->location's device), credited at
 * cuMemRelease.  Host locations (pinned host memory) are not GPU memory and pass untouched;
 * any location type we do not know is charged to the current device. */
#define SG_MEM_LOCATION_TYPE_HOST 2
#define SG_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
SG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL(cuMemCreate);
    FORWARD_IF_PASSIVE(handle, size, prop, flags);
    if (!handle || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    int type = (int)prop->location.type;
    if (type >= SG_MEM_LOCATION_TYPE_HOST && type <= SG_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        return real_(handle, size, prop, flags);
    sg_in_hook++;
    struct sg_charge c;
    bool on_device = type == CU_MEM_LOCATION_TYPE_DEVICE;
    CUresult res = sg_alloc_begin(on_device, on_device ? prop->location.id : 0, size, &c);
    if (res == CUDA_SUCCESS) {
        res = real_(handle, size, prop, flags);
        res = sg_alloc_end(res, SG_KIND_VMM, res == CUDA_SUCCESS ? *handle : 0, &c);
        if (res == CUDA_SUCCESS)
            sg_vmm_created(*handle);
    }
    sg_in_hook--;
    return res;
}

/* Bytes per element of an array format; formats we do not know count 4 bytes per channel. */
uint64_t sg_format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
    default:
        return 4;
    }
}

SG_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    REAL(cuArrayCreate_v2);
    FORWARD_IF_PASSIVE(pHandle, desc);
    if (!pHandle || !desc)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes, h = desc->Height ? desc->Height : 1;
    if (__builtin_mul_overflow((uint64_t)desc->Width, h, &bytes) ||
        __builtin_mul_overflow(bytes, sg_format_bytes(desc->Format), &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)desc->NumChannels, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, bytes, &c);
    if (res == CUDA_SUCCESS) {
        res = real_(pHandle, desc);
        res = sg_alloc_end(res, SG_KIND_ARRAY, res == CUDA_SUCCESS ? (uintptr_t)*pHandle : 0, &c);
    }
    sg_in_hook--;
    return res;
}

/* ---- frees ------------------------------------------------------------------------------------ */

SG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL(cuMemFree_v2);
    FORWARD_IF_PASSIVE(dptr);
    sg_in_hook++;
    struct sg_charge c;
    bool tracked = sg_untrack(SG_KIND_PTR, dptr, &c);
    CUresult res = sg_free_end(real_(dptr), tracked, SG_KIND_PTR, dptr, &c);
    sg_in_hook--;
    return res;
}

/* The charge goes back when the stream reaches the free (asyncfree.c), not when it is queued;
 * a pool may keep the memory cached (the agent's NVML reconciliation counts what it keeps). */
#define FREE_ASYNC(name, per_thread)                                                               \
    SG_EXPORT CUresult name(CUdeviceptr dptr, CUstream hStream)                                    \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(dptr, hStream);                                                         \
        sg_in_hook++;                                                                              \
        struct sg_charge c;                                                                        \
        bool tracked = sg_untrack(SG_KIND_PTR, dptr, &c);                                          \
        CUresult res = real_(dptr, hStream);                                                       \
        if (tracked && res == CUDA_SUCCESS)                                                        \
            sg_async_free_queue(hStream, per_thread, &c);                                          \
        else                                                                                       \
            res = sg_free_end(res, tracked, SG_KIND_PTR, dptr, &c);                                \
        sg_in_hook--;                                                                              \
        return res;                                                                                \
    }
FREE_ASYNC(cuMemFreeAsync, false)
FREE_ASYNC(cuMemFreeAsync_ptsz, true)

SG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL(cuMemRelease);
    FORWARD_IF_PASSIVE(handle);
    sg_in_hook++;
    struct sg_charge c;
    bool tracked = sg_untrack(SG_KIND_VMM, handle, &c);
    CUresult res = real_(handle);
    /* Still mapped, or another handle of it alive: the memory lives on (vmmlife.c), and so does
     * the charge. */
    if (res == CUDA_SUCCESS && !sg_vmm_release(handle, tracked ? &c : NULL))
        tracked = false;
    res = sg_free_end(res, tracked, SG_KIND_VMM, handle, &c);
    sg_in_hook--;
    return res;
}

/* A POSIX descriptor of a VMM allocation: remembered, so that importing it again in this
 * process is known as a second handle of the same memory (vmmlife.c).  Other handle types
 * (Win32, fabric) are not known there: their import is another process's memory. */
SG_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType,
                                                unsigned long long flags)
{
    REAL(cuMemExportToShareableHandle);
    FORWARD_IF_PASSIVE(shareableHandle, handle, handleType, flags);
    CUresult res = real_(shareableHandle, handle, handleType, flags);
    if (res == CUDA_SUCCESS && handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        sg_vmm_exported(handle, *(int *)shareableHandle);
    return res;
}

SG_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *osHandle,
                                                  CUmemAllocationHandleType shHandleType)
{
    REAL(cuMemImportFromShareableHandle);
    FORWARD_IF_PASSIVE(handle, osHandle, shHandleType);
    CUresult res = real_(handle, osHandle, shHandleType);
    /* The driver takes a descriptor cast to the pointer, not a pointer to it. */
    if (res == CUDA_SUCCESS && shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        sg_vmm_imported(*handle, (int)(intptr_t)osHandle);
    return res;
}

SG_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    REAL(cuArrayDestroy);
    FORWARD_IF_PASSIVE(hArray);
    sg_in_hook++;
    struct sg_charge c;
    uint64_t key = (uintptr_t)hArray;
    bool tracked = sg_untrack(SG_KIND_ARRAY, key, &c);
    CUresult res = sg_free_end(real_(hArray), tracked, SG_KIND_ARRAY, key, &c);
    sg_in_hook--;
    return res;
}

/* ---- views ------------------------------------------------------------------------------------ */

/* free = min(cap - used - overhead (at least 0), the card's real free); total = cap.  A device
 * that is not the tenant's shows 0 / 0. */
static CUresult mem_info(uint64_t *free_out, uint64_t *total_out)
{
    if (!SG_REAL(cuMemGetInfo_v2))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    size_t rf = 0, rt = 0;
    CUresult res = SG_REAL(cuMemGetInfo_v2)(&rf, &rt);
    if (res != CUDA_SUCCESS)
        return res;
    CUdevice dev;
    res = (CUresult)sg_current_ordinal(&dev);
    if (res != CUDA_SUCCESS)
        return res;
    struct sg_view v;
    struct sg_err e = {0};
    int rc = sg_view_device(dev, NULL, &v, &e);
    if (rc < 0)
        return sg_cu_result(rc);
    uint64_t avail = v.cap > v.used ? v.cap - v.used : 0;
    *free_out = avail < rf ? avail : rf;
    *total_out = v.cap;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL(cuMemGetInfo_v2);
    FORWARD_IF_PASSIVE(free, total);
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    sg_async_free_settle();
    uint64_t f, t;
    CUresult res = mem_info(&f, &t);
    if (res == CUDA_SUCCESS) {
        *free = (size_t)f;
        *total = (size_t)t;
    }
    sg_in_hook--;
    return res;
}

static CUresult total_mem(CUdevice dev, uint64_t *bytes)
{
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    struct sg_view v;
    struct sg_err e = {0};
    int rc = sg_view_device(dev, NULL, &v, &e);
    if (rc < 0)
        return sg_cu_result(rc);
    *bytes = v.cap;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL(cuDeviceTotalMem_v2);
    FORWARD_IF_PASSIVE(bytes, dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    size_t real_total = 0;
    CUresult res = real_(&real_total, dev); /* validates dev */
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    uint64_t cap;
    res = total_mem(dev, &cap);
    if (res == CUDA_SUCCESS)
        *bytes = (size_t)cap;
    sg_in_hook--;
    return res;
}

/* ---- legacy 32-bit entry points --------------------------------------------------------------
 * Their 32-bit device pointers cannot address modern GPU memory; under a tenant the allocating
 * ones are refused (CUDA_ERROR_NOT_SUPPORTED) so that no allocation escapes the ledger, and the
 * views are answered from the vGPU, clamped to 32 bits. */

static CUresult legacy_refused(void)
{
    return sg_mode() == SG_MODE_ACTIVE ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_PERMITTED;
}

SG_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    REAL(cuMemAlloc);
    FORWARD_IF_PASSIVE(dptr, bytesize);
    return legacy_refused();
}

SG_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch,
                                   unsigned int widthInBytes, unsigned int height,
                                   unsigned int elementSizeBytes)
{
    REAL(cuMemAllocPitch);
    FORWARD_IF_PASSIVE(dptr, pitch, widthInBytes, height, elementSizeBytes);
    return legacy_refused();
}

SG_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
    REAL(cuArrayCreate);
    FORWARD_IF_PASSIVE(pHandle, desc);
    return legacy_refused();
}

static unsigned int clamp32(uint64_t v)
{
    return v > UINT_MAX ? UINT_MAX : (unsigned int)v;
}

SG_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    REAL(cuMemGetInfo);
    FORWARD_IF_PASSIVE(free, total);
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    sg_async_free_settle();
    uint64_t f, t;
    CUresult res = mem_info(&f, &t);
    if (res == CUDA_SUCCESS) {
        *free = clamp32(f);
        *total = clamp32(t);
    }
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    REAL(cuDeviceTotalMem);
    FORWARD_IF_PASSIVE(bytes, dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned int real_total = 0;
    CUresult res = real_(&real_total, dev);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    uint64_t cap;
    res = total_mem(dev, &cap);
    if (res == CUDA_SUCCESS)
        *bytes = clamp32(cap);
    sg_in_hook--;
    return res;
}
