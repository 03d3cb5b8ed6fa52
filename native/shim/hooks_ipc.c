/*
 * Memory another process allocated, opened here: a legacy IPC handle (cuIpcOpenMemHandle), or a
 * pointer of a pool exported by another process (cuMemPoolImportPointer).
 *
 * The importer is charged the allocation's size until its last cuIpcCloseMemHandle (or its
 * context's end).  The exporter stays charged too: while both hold it the tenant counts it twice,
 * which only errs towards the cap.  Charging the importer is what keeps the cap: the reference
 * calls an exporter's cuMemFree before the importer's close undefined, and a driver may keep the
 * memory alive for the importer, so "export, let another process open it, free, allocate again"
 * would otherwise grow a tenant past its cap without bound.
 *
 * A second open of the same handle by the same context returns the same pointer with one more
 * reference (as documented): charged once, credited at the last close.  The size is asked of the
 * driver after the open (cuMemGetAddressRange): a refused charge closes the mapping again and
 * the open fails with CUDA_ERROR_OUT_OF_MEMORY.
 *
 * A pool pointer import is an allocation of this process like cuMemAlloc's (its own pointer,
 * freed with cuMemFree or cuMemFreeAsync, whose hooks credit it): charged the same way after the
 * real import, and freed again if refused.
 */
#include <pthread.h>
#include <stdlib.h>

#include "shim.h"

struct opened {
    CUdeviceptr ptr;
    unsigned refs;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* serialises opens and closes */
static struct opened *opened;                         /* [mu] */
static size_t nopened, capopened;

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(opened);
    opened = NULL;
    nopened = capopened = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void setup(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

/* Under mu: the entry of ptr, or NULL.  An entry whose charge the ledger no longer holds (its
 * context ended) is forgotten here. */
static struct opened *find_locked(CUdeviceptr ptr)
{
    for (size_t i = 0; i < nopened; i++) {
        if (opened[i].ptr != ptr)
            continue;
        if (sg_tracked(SG_KIND_IPC, ptr))
            return &opened[i];
        opened[i] = opened[--nopened];
        return NULL;
    }
    return NULL;
}

static int add_locked(CUdeviceptr ptr)
{
    if (nopened == capopened) {
        size_t cap = capopened ? capopened * 2 : 16;
        struct opened *n = realloc(opened, cap * sizeof(*n));
        if (!n)
            return -1;
        opened = n;
        capopened = cap;
    }
    opened[nopened++] = (struct opened){.ptr = ptr, .refs = 1};
    return 0;
}

static void close_real(CUdeviceptr ptr)
{
    if (SG_REAL(cuIpcCloseMemHandle))
        SG_REAL(cuIpcCloseMemHandle)(ptr);
}

static void free_real(CUdeviceptr ptr)
{
    if (SG_REAL(cuMemFree_v2))
        SG_REAL(cuMemFree_v2)(ptr);
}

/* Charges the memory mapped at ptr (just imported) to the current context's device as kind;
 * refused or unsizable, it is closed or freed again. */
static CUresult charge_import(CUdeviceptr ptr, enum sg_kind kind, struct sg_charge *c)
{
    void (*undo)(CUdeviceptr) = kind == SG_KIND_IPC ? close_real : free_real;
    CUdeviceptr base = 0;
    size_t size = 0;
    __typeof__(&cuMemGetAddressRange_v2) range = SG_REAL(cuMemGetAddressRange_v2);
    if (!range || range(&base, &size, ptr) != CUDA_SUCCESS || size == 0) {
        undo(ptr); /* memory we cannot size is memory we cannot charge */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult res = sg_alloc_begin(false, 0, size, c);
    if (res == CUDA_SUCCESS)
        return sg_alloc_end(CUDA_SUCCESS, kind, ptr, c); /* a refusal undoes it */
    undo(ptr);
    return res;
}

/* After a successful real open of *pdptr: one more reference, or a new charge. */
static CUresult charge_open(CUdeviceptr ptr)
{
    struct opened *o = find_locked(ptr);
    if (o) {
        o->refs++;
        return CUDA_SUCCESS;
    }
    struct sg_charge c;
    CUresult res = charge_import(ptr, SG_KIND_IPC, &c);
    if (res == CUDA_SUCCESS && c.active && add_locked(ptr) < 0) {
        struct sg_charge held;
        if (sg_untrack(SG_KIND_IPC, ptr, &held))
            sg_credit(&held);
        close_real(ptr);
        res = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return res;
}

static CUresult open_hooked(__typeof__(&cuIpcOpenMemHandle_v2) real_, CUdeviceptr *pdptr,
                            CUipcMemHandle handle, unsigned int flags)
{
    if (!real_)
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return real_(pdptr, handle, flags);
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&once, setup);
    sg_in_hook++;
    pthread_mutex_lock(&mu);
    CUresult res = real_(pdptr, handle, flags);
    if (res == CUDA_SUCCESS)
        res = charge_open(*pdptr);
    pthread_mutex_unlock(&mu);
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return open_hooked(SG_REAL(cuIpcOpenMemHandle), pdptr, handle, Flags);
}

SG_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                         unsigned int Flags)
{
    return open_hooked(SG_REAL(cuIpcOpenMemHandle_v2), pdptr, handle, Flags);
}

SG_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    __typeof__(&cuIpcCloseMemHandle) real_ = SG_REAL(cuIpcCloseMemHandle);
    if (!real_)
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return real_(dptr);
    pthread_once(&once, setup);
    sg_in_hook++;
    pthread_mutex_lock(&mu);
    struct opened *o = find_locked(dptr);
    CUresult res;
    if (o && o->refs > 1) {
        res = real_(dptr);
        if (res == CUDA_SUCCESS)
            o->refs--;
    } else {
        struct sg_charge c;
        bool tracked = sg_untrack(SG_KIND_IPC, dptr, &c);
        res = sg_free_end(real_(dptr), tracked, SG_KIND_IPC, dptr, &c);
        if (o && res == CUDA_SUCCESS)
            *o = opened[--nopened];
    }
    pthread_mutex_unlock(&mu);
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                          CUmemPoolPtrExportData *shareData)
{
    __typeof__(&cuMemPoolImportPointer) real_ = SG_REAL(cuMemPoolImportPointer);
    if (!real_)
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return real_(ptr_out, pool, shareData);
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!ptr_out)
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    CUresult res = real_(ptr_out, pool, shareData);
    if (res == CUDA_SUCCESS) {
        struct sg_charge c;
        res = charge_import(*ptr_out, SG_KIND_PTR, &c);
    }
    sg_in_hook--;
    return res;
}
