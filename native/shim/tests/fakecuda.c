/*
 * A deliberately odd libcuda.so.1 for tests/integration/test_shim.py: its cuGetProcAddress_v2 answers
 * "cuMemAlloc" and "cuMemFree" with pointers to functions it does not export, so the shim
 * cannot identify them and must fall back to its version table.  One device, UUID
 * GPU-11111111-2222-3333-4444-555555555555; allocations return fake addresses, any module image
 * loads.  Not part of
 * libsharegpu.so (the shim's Makefile rule compiles only the .c files directly in shim/).
 */
#include <stdint.h>
#include <string.h>

#include "sharegpu/cuda_api.h"

#define EXPORT __attribute__((visibility("default")))

static int hidden_calls;
static CUdeviceptr next_ptr = 0x100000000ull;

EXPORT int fake_hidden_calls(void) { return hidden_calls; }

EXPORT CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
    static const unsigned char id[16] = {0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33,
                                         0x44, 0x44, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55};
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(u->bytes, id, 16);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    if (!p || !n)
        return CUDA_ERROR_INVALID_VALUE;
    *p = next_ptr;
    next_ptr += (n + 0xfffff) & ~(CUdeviceptr)0xfffff;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return CUDA_SUCCESS; }
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    *f = *t = 8ull << 30;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                               void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)s;
    (void)params, (void)extra;
    return CUDA_SUCCESS;
}

/* Modules: any image loads (nothing is read), so what the shim refuses never reaches here;
 * fake_module_loads() counts the loads that did. */
static int module_loads;
EXPORT int fake_module_loads(void) { return module_loads; }
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    module_loads++;
    *m = (CUmodule)(uintptr_t)module_loads;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name)
{
    (void)p, (void)bytes, (void)m, (void)name;
    return CUDA_ERROR_NOT_FOUND;
}

/* Not exported: what the odd cuGetProcAddress hands out. */
static CUresult hidden_alloc(CUdeviceptr *p, size_t n)
{
    hidden_calls++;
    return cuMemAlloc_v2(p, n);
}
static CUresult hidden_free(CUdeviceptr p)
{
    hidden_calls++;
    return cuMemFree_v2(p);
}
static CUresult hidden_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                              void **extra)
{
    hidden_calls++;
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    (void)flags;
    void *p = NULL;
    if (strcmp(symbol, "cuMemAlloc") == 0 && version >= 3020)
        p = (void *)&hidden_alloc;
    else if (strcmp(symbol, "cuMemFree") == 0 && version >= 3020)
        p = (void *)&hidden_free;
    else if (strcmp(symbol, "cuLaunchKernel") == 0 && version >= 4000)
        p = (void *)&hidden_launch;
    else if (strcmp(symbol, "cuMemGetInfo") == 0 && version >= 3020)
        p = (void *)&cuMemGetInfo_v2;
    if (status)
        *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
