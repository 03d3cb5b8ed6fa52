/*
 * CUDA arrays: 1D/2D (cuArrayCreate), 3D, layered and cubemap (cuArray3DCreate) and mipmapped
 * arrays.  No texture hardware is modelled, so an array is its size: it is charged to the process
 * on the context's GPU as Width x max(Height,1) x max(Depth,1) x element size x channels (every
 * level of a mipmapped array, each level halving each dimension down to 1).  A sparse or
 * deferred-mapping array holds no memory until mapped (which is not modelled), so it is charged
 * nothing.  A real driver also pads rows and tiles; that is not modelled either.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define LAYERED CUDA_ARRAY3D_LAYERED
#define CUBEMAP CUDA_ARRAY3D_CUBEMAP
#define SPARSE CUDA_ARRAY3D_SPARSE
#define DEFERRED_MAPPING CUDA_ARRAY3D_DEFERRED_MAPPING
#define FLAGS_VALID 0x1ffu
/* Far beyond a real card's texture limits (131072 wide in 1D), which the model does not
 * enforce: tests size 1D arrays in bytes. */
#define MAX_DIM (1ull << 40)

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

/* Checks a 3D descriptor; *bytes is one level's size (0 for sparse and deferred arrays). */
static CUresult check(const CUDA_ARRAY3D_DESCRIPTOR *d, uint64_t *bytes)
{
    unsigned elem = format_bytes(d->Format);
    unsigned ch = d->NumChannels;
    if (!d->Width || !elem || (ch != 1 && ch != 2 && ch != 4) || (d->Flags & ~FLAGS_VALID))
        return CUDA_ERROR_INVALID_VALUE;
    if (d->Width > MAX_DIM || d->Height > MAX_DIM || d->Depth > MAX_DIM)
        return CUDA_ERROR_INVALID_VALUE;
    if (d->Height == 0 && d->Depth) /* a 1D array has no depth, unless layered */
        if (!(d->Flags & LAYERED))
            return CUDA_ERROR_INVALID_VALUE;
    if (d->Flags & CUBEMAP) {
        size_t faces = d->Depth;
        if (d->Width != d->Height || !faces || faces % 6 || (!(d->Flags & LAYERED) && faces != 6))
            return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t h = d->Height ? d->Height : 1, dep = d->Depth ? d->Depth : 1, n;
    if (__builtin_mul_overflow((uint64_t)d->Width, h, &n) || __builtin_mul_overflow(n, dep, &n) ||
        __builtin_mul_overflow(n, (uint64_t)elem * ch, &n) || n > (1ull << 46))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *bytes = (d->Flags & (SPARSE | DEFERRED_MAPPING)) ? 0 : n;
    return CUDA_SUCCESS;
}

static void describe(struct CUarray_st *a, const CUDA_ARRAY3D_DESCRIPTOR *d, int phys)
{
    a->phys = phys;
    a->width = d->Width;
    a->height = d->Height;
    a->depth = d->Depth;
    a->format = d->Format;
    a->channels = d->NumChannels;
    a->flags = d->Flags;
}

static CUresult create(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!handle || !d)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes;
    CUresult r = check(d, &bytes);
    if (r)
        return r;
    struct CUctx_st *c;
    if ((r = cu_ctx_current(&c)))
        return r;
    struct CUarray_st *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_err e = {0};
    if (bytes && sim_charge(&e, cu_g.st, c->phys, bytes) < 0) {
        free(a);
        return cu_result(&e);
    }
    describe(a, d, c->phys);
    a->charged = bytes;
    a->charged_own = 1;
    a->magic = ARRAY_MAGIC;
    *handle = a;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    if (!desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = desc->Width,
                                 .Height = desc->Height,
                                 .Format = desc->Format,
                                 .NumChannels = desc->NumChannels};
    return create(handle, &d);
}

SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    return create(handle, desc);
}

SIM_EXPORT CUresult cuArrayDestroy(CUarray handle)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!handle || handle->magic != ARRAY_MAGIC || !handle->charged_own)
        return CUDA_ERROR_INVALID_HANDLE; /* a mipmap level goes with its mipmapped array */
    handle->magic = 0;
    if (handle->charged)
        sim_uncharge(cu_g.st, handle->phys, handle->charged);
    free(handle);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *desc, CUarray handle)
{
    if (!desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!handle || handle->magic != ARRAY_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    *desc = (CUDA_ARRAY3D_DESCRIPTOR){.Width = handle->width,
                                      .Height = handle->height,
                                      .Depth = handle->depth,
                                      .Format = (CUarray_format)handle->format,
                                      .NumChannels = handle->channels,
                                      .Flags = handle->flags};
    return CUDA_SUCCESS;
}

/* ---- mipmapped arrays ---------------------------------------------------------------------- */

static size_t halve(size_t v, unsigned times)
{
    if (!v)
        return 0; /* an absent dimension stays absent */
    v >>= times;
    return v ? v : 1;
}

SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle,
                                           const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                           unsigned int numMipmapLevels)
{
    if (!handle || !desc || !numMipmapLevels || numMipmapLevels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0, bytes;
    CUresult r = check(desc, &bytes);
    if (r)
        return r;
    size_t largest = desc->Width > desc->Height ? desc->Width : desc->Height;
    if (!(desc->Flags & LAYERED) && desc->Depth > largest)
        largest = desc->Depth;
    if ((1ull << (numMipmapLevels - 1)) > largest)
        return CUDA_ERROR_INVALID_VALUE; /* more levels than halvings down to 1 */
    struct CUctx_st *c;
    if ((r = cu_ctx_current(&c)))
        return r;
    struct CUmipmappedArray_st *m = calloc(1, sizeof(*m));
    struct CUarray_st *levels = calloc(numMipmapLevels, sizeof(*levels));
    if (!m || !levels) {
        free(m);
        free(levels);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (unsigned i = 0; i < numMipmapLevels; i++) {
        CUDA_ARRAY3D_DESCRIPTOR d = *desc;
        d.Width = halve(desc->Width, i);
        d.Height = halve(desc->Height, i);
        if (!(desc->Flags & (LAYERED | CUBEMAP))) /* layers and faces are not halved */
            d.Depth = halve(desc->Depth, i);
        (void)check(&d, &bytes);
        total += bytes;
        describe(&levels[i], &d, c->phys);
        levels[i].magic = ARRAY_MAGIC;
    }
    struct sim_err e = {0};
    if (total && sim_charge(&e, cu_g.st, c->phys, total) < 0) {
        free(levels);
        free(m);
        return cu_result(&e);
    }
    m->phys = c->phys;
    m->charged = total;
    m->nlevels = numMipmapLevels;
    m->levels = levels;
    m->magic = MIPMAP_MAGIC;
    *handle = m;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMipmappedArrayGetLevel(CUarray *pLevelArray, CUmipmappedArray m,
                                             unsigned int level)
{
    if (!pLevelArray)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!m || m->magic != MIPMAP_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (level >= m->nlevels)
        return CUDA_ERROR_INVALID_VALUE;
    *pLevelArray = &m->levels[level];
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!m || m->magic != MIPMAP_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    m->magic = 0;
    for (unsigned i = 0; i < m->nlevels; i++)
        m->levels[i].magic = 0;
    if (m->charged)
        sim_uncharge(cu_g.st, m->phys, m->charged);
    free(m->levels);
    free(m);
    return CUDA_SUCCESS;
}
