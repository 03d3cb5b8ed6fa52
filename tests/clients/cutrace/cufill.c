/*
 * cufill: minimal stand-ins for driver entry points a simulator lacks, used with cutrace
 * (CUTRACE_FILL=cufill.so) only to follow a client scenario past a missing function and learn
 * what it calls next.  NOT a model: values are fixed, plausible for an H100, and each stand-in
 * maps onto a function the simulator has (through libcuda, so those calls show in the trace).
 *
 *   gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o cufill.so cufill.c -ldl
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

static void *real(const char *name)
{
    static void *lib;
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_LAZY);
    return lib ? dlsym(lib, name) : NULL;
}
#define REAL(name, ...) ((CUresult(*)(__VA_ARGS__))real(name))

#define EXPORT __attribute__((visibility("default")))

/* ---- contexts and streams ---- */
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority)
{
    return REAL("cuStreamCreate", CUstream *, unsigned int)(s, flags);
}

EXPORT CUresult cuStreamGetPriority(CUstream s, int *priority)
{
    *priority = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int *flags)
{
    *flags = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx)
{
    return REAL("cuCtxGetCurrent", CUcontext *)(ctx);
}

EXPORT CUresult cuStreamGetCtx_v2(CUstream s, CUcontext *ctx, CUgreenCtx *g)
{
    if (g)
        *g = NULL;
    return REAL("cuCtxGetCurrent", CUcontext *)(ctx);
}

EXPORT CUresult cuStreamGetId(CUstream s, unsigned long long *id)
{
    *id = (unsigned long long)(uintptr_t)s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *dev)
{
    *dev = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    return REAL("cuEventSynchronize", CUevent)(e);
}

EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    *id = (unsigned long long)(uintptr_t)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    *flags = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit limit)
{
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: *v = 1024; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *v = 1 << 20; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *v = 8 << 20; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t v) { return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCacheConfig(CUfunc_cache *c) { *c = CU_FUNC_CACHE_PREFER_NONE; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCacheConfig(CUfunc_cache c) { return CUDA_SUCCESS; }

/* ---- memory pools ---- */
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) { return CUDA_SUCCESS; }

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    switch (a) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)v = 1;
        break;
    default:
        *(cuuint64_t *)v = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: return REAL("cuCtxGetCurrent", CUcontext *)((CUcontext *)data);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- libraries and kernels: a library is a module, a kernel a function ---- */
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
                                  CUlibraryOption *lo, void **lv, unsigned int nl)
{
    return REAL("cuModuleLoadData", CUmodule *, const void *)((CUmodule *)lib, code);
}

EXPORT CUresult cuLibraryUnload(CUlibrary lib) { return REAL("cuModuleUnload", CUmodule)((CUmodule)lib); }

EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name)
{
    return REAL("cuModuleGetFunction", CUfunction *, CUmodule, const char *)((CUfunction *)k, (CUmodule)lib, name);
}

EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib)
{
    *m = (CUmodule)lib;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    *f = (CUfunction)k;
    return CUDA_SUCCESS;
}

static int func_attr(CUfunction_attribute a)
{
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return 16;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: return 90;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: return 90;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: return 48 * 1024;
    default: return 0;
    }
}

EXPORT CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { *v = func_attr(a); return CUDA_SUCCESS; }
EXPORT CUresult cuKernelGetAttribute(int *v, CUfunction_attribute a, CUkernel k, CUdevice d) { *v = func_attr(a); return CUDA_SUCCESS; }
EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { return CUDA_SUCCESS; }
EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice d) { return CUDA_SUCCESS; }
EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { return CUDA_SUCCESS; }

EXPORT CUresult cuFuncGetName(const char **name, CUfunction f)
{
    *name = "?";
    return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t smem)
{
    *n = block > 0 ? 2048 / block : 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, CUfunction f, int block, size_t smem,
                                                                     unsigned flags)
{
    *n = block > 0 ? 2048 / block : 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *grid, int *block, CUfunction f, CUoccupancyB2DSize fn,
                                                 size_t smem, int limit)
{
    *block = limit > 0 && limit < 1024 ? limit : 1024;
    *grid = 132 * 2;
    return CUDA_SUCCESS;
}

/* ---- modules, linker (numba, pycuda) ---- */
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v)
{
    return REAL("cuModuleLoadData", CUmodule *, const void *)(m, image);
}

EXPORT CUresult cuModuleGetGlobal(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name)
{
    return CUDA_ERROR_NOT_FOUND;
}

/* ---- memory ---- */
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    if (base)
        *base = p;
    if (size)
        *size = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return REAL("cuMemsetD8", CUdeviceptr, unsigned char, size_t)(d, v, n);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    return REAL("cuMemsetD32", CUdeviceptr, unsigned int, size_t)(d, v, n);
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice d)
{
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice a, CUdevice b)
{
    *can = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext c, unsigned flags) { return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED; }

/* NVRTC 13 (nvrtcCompileProgram) dlopens libcuda.so.1, calls cuInit and dlsyms cuGetExportTable;
 * it crashes when the symbol is missing.  An error return is enough for it to carry on. */
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- legacy API pycuda still uses (declared in CUDA 13's cuda.h, exported by its driver) ---- */
EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) { return CUDA_SUCCESS; }
EXPORT CUresult cuFuncSetSharedSize(CUfunction f, unsigned int bytes) { return CUDA_SUCCESS; }

EXPORT CUresult cuCtxDetach(CUcontext ctx) { return REAL("cuCtxDestroy_v2", CUcontext)(ctx); }

EXPORT CUresult cuCtxAttach(CUcontext *ctx, unsigned int flags)
{
    return REAL("cuCtxGetCurrent", CUcontext *)(ctx);
}
