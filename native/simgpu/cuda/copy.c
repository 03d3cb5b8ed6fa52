/*
 * Copies and memsets.  Device pointers are host addresses (memory.c), so a copy is a memcpy after
 * a range check against the live allocations and VMM mappings.  Copies run on the calling thread:
 * synchronous ones after all work of the current context completes, asynchronous ones after their
 * stream's work completes (so they return when done; still stream-ordered).  With unified
 * addressing, cuMemcpy and cuMemcpyAsync take any pair of device or host pointers, as a driver
 * does; page-locked host memory (hostmem.c) is ordinary host memory here, never charged to a GPU.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

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

/* Fills n elements of elem (1, 2 or 4) bytes; async memsets follow their stream's work. */
static CUresult memset_n(CUdeviceptr dst, uint32_t v, unsigned elem, size_t n, CUstream h, int async)
{
    CUresult r = copy_prologue(h, async);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if ((dst & (elem - 1u)) || n > SIZE_MAX / elem || cu_mem_range_ok((uintptr_t)dst, n * elem) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (elem == 1) {
        memset((void *)(uintptr_t)dst, (int)(v & 0xffu), n);
    } else if (elem == 2) {
        uint16_t *p = (uint16_t *)(uintptr_t)dst;
        for (size_t k = 0; k < n; k++)
            p[k] = (uint16_t)v;
    } else {
        uint32_t *p = (uint32_t *)(uintptr_t)dst;
        for (size_t k = 0; k < n; k++)
            p[k] = v;
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset_n(dst, value, 1, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset_n(dst, value, 1, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n)
{
    return memset_n(dst, value, 4, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n)
{
    return memset_n(dst, value, 4, n, NULL, 0);
}

SIM_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t n)
{
    return memset_n(dst, value, 2, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short value, size_t n)
{
    return memset_n(dst, value, 2, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)
{
    return memset_n(dst, value, 1, n, s, 1);
}
SIM_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)
{
    return memset_n(dst, value, 1, n, s, 1);
}
SIM_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream s)
{
    return memset_n(dst, value, 2, n, s, 1);
}
SIM_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short value, size_t n, CUstream s)
{
    return memset_n(dst, value, 2, n, s, 1);
}
SIM_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s)
{
    return memset_n(dst, value, 4, n, s, 1);
}
SIM_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n, CUstream s)
{
    return memset_n(dst, value, 4, n, s, 1);
}

/* ---- unified addressing ---------------------------------------------------------------------- */

/* Either side may be device memory or host memory: only device ranges are checked. */
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, int async)
{
    CUresult r = copy_prologue(h, async);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    /* A pointer inside a device range must fit in it; any other pointer is host memory. */
    int dst_dev = cu_mem_range_ok((uintptr_t)dst, 1) == 0;
    int src_dev = cu_mem_range_ok((uintptr_t)src, 1) == 0;
    if ((dst_dev && cu_mem_range_ok((uintptr_t)dst, n) < 0) ||
        (src_dev && cu_mem_range_ok((uintptr_t)src, n) < 0))
        return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy_any(dst, src, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy_any(dst, src, n, NULL, 0);
}
SIM_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy_any(dst, src, n, s, 1);
}
SIM_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy_any(dst, src, n, s, 1);
}

SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    uintptr_t base;
    size_t size;
    if (cu_mem_range_of((uintptr_t)dptr, &base, &size) < 0)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}
