/*
 * 3D, layered, cubemap and mipmapped arrays: charged like cuArrayCreate_v2 (hooks_cuda.c), to the
 * current context's device, before the real call.  Size: Width x max(Height,1) x max(Depth,1) x
 * element bytes x channels, summed over the levels of a mipmapped array (each level halves every
 * dimension down to 1; layers and cubemap faces are not halved).  Sparse and deferred-mapping
 * arrays hold no memory until mapped, so they are not charged (their mapping goes through
 * cuMemMapArrayAsync, which is not hooked: a known gap).
 */
#include "shim.h"

#include <stdint.h>

/* One level's bytes, 0 for sparse/deferred arrays; false on overflow. */
static bool level_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, uint64_t *out)
{
    if (d->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) {
        *out = 0;
        return true;
    }
    uint64_t h = d->Height ? d->Height : 1, dep = d->Depth ? d->Depth : 1, n;
    return !__builtin_mul_overflow((uint64_t)d->Width, h, &n) &&
           !__builtin_mul_overflow(n, dep, &n) &&
           !__builtin_mul_overflow(n, sg_format_bytes(d->Format), &n) &&
           !__builtin_mul_overflow(n, (uint64_t)d->NumChannels, out);
}

static size_t halve(size_t v, unsigned times)
{
    if (!v)
        return 0;
    v >>= times;
    return v ? v : 1;
}

SG_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    if (!SG_REAL(cuArray3DCreate_v2))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return SG_REAL(cuArray3DCreate_v2)(pHandle, desc);
    uint64_t bytes;
    if (!pHandle || !desc || !level_bytes(desc, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, bytes, &c);
    if (res == CUDA_SUCCESS) {
        res = SG_REAL(cuArray3DCreate_v2)(pHandle, desc);
        res = sg_alloc_end(res, SG_KIND_ARRAY, res == CUDA_SUCCESS ? (uintptr_t)*pHandle : 0, &c);
    }
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                          const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int numMipmapLevels)
{
    if (!SG_REAL(cuMipmappedArrayCreate))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return SG_REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels);
    if (!pHandle || !desc || numMipmapLevels == 0 || numMipmapLevels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned i = 0; i < numMipmapLevels; i++) {
        CUDA_ARRAY3D_DESCRIPTOR d = *desc;
        d.Width = halve(desc->Width, i);
        d.Height = halve(desc->Height, i);
        if (!(desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)))
            d.Depth = halve(desc->Depth, i);
        uint64_t b;
        if (!level_bytes(&d, &b) || __builtin_add_overflow(total, b, &total))
            return CUDA_ERROR_INVALID_VALUE;
    }
    sg_in_hook++;
    struct sg_charge c;
    CUresult res = sg_alloc_begin(false, 0, total, &c);
    if (res == CUDA_SUCCESS) {
        res = SG_REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels);
        res = sg_alloc_end(res, SG_KIND_MIPMAP, res == CUDA_SUCCESS ? (uintptr_t)*pHandle : 0, &c);
    }
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    if (!SG_REAL(cuMipmappedArrayDestroy))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return SG_REAL(cuMipmappedArrayDestroy)(hMipmappedArray);
    sg_in_hook++;
    struct sg_charge c;
    uint64_t key = (uintptr_t)hMipmappedArray;
    bool tracked = sg_untrack(SG_KIND_MIPMAP, key, &c);
    CUresult res = sg_free_end(SG_REAL(cuMipmappedArrayDestroy)(hMipmappedArray), tracked,
                               SG_KIND_MIPMAP, key, &c);
    sg_in_hook--;
    return res;
}
