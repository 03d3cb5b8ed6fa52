/*
 * The driver's oldest API, still declared by CUDA 13.0's cuda.h and still used by clients such as
 * pycuda: device properties, the execution-control launch API (block shape and argument buffer
 * set on the function, then cuLaunch / cuLaunchGrid / cuLaunchGridAsync) and the profiler
 * switches.  Launches here go through the same path as cuLaunchKernel, with the argument buffer
 * passed as CU_LAUNCH_PARAM_BUFFER_POINTER, so the kernel time contract is the same.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define CU_PARAM_MAX 4096 /* the driver's limit for kernel arguments */

typedef struct CUdevprop_st {
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int sharedMemPerBlock;
    int totalConstantMemory;
    int SIMDWidth;
    int memPitch;
    int regsPerBlock;
    int clockRate;
    int textureAlign;
} CUdevprop;

SIM_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready_device(dev, NULL);
    if (r)
        return r;
    *major = cu_g.st->cfg.cc_major;
    *minor = cu_g.st->cfg.cc_minor;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetProperties(CUdevprop *prop, CUdevice dev)
{
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready_device(dev, NULL);
    if (r)
        return r;
    *prop = (CUdevprop){.maxThreadsPerBlock = 1024,
                        .maxThreadsDim = {1024, 1024, 64},
                        .maxGridSize = {2147483647, 65535, 65535},
                        .sharedMemPerBlock = 49152,
                        .totalConstantMemory = 65536,
                        .SIMDWidth = 32,
                        .memPitch = 2147483647,
                        .regsPerBlock = 65536,
                        .clockRate = 1980000,
                        .textureAlign = 512};
    return CUDA_SUCCESS;
}

/* ---- execution control ----------------------------------------------------------------- */

static CUresult func(CUfunction f, struct CUfunc_st **out)
{
    CUresult r = cu_func_check(f);
    if (r)
        return r;
    if (f->magic != FUNC_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE; /* a CUkernel has no legacy launch state */
    *out = f;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z)
{
    struct CUfunc_st *f;
    CUresult r = func(hfunc, &f);
    if (r)
        return r;
    if (x <= 0 || y <= 0 || z <= 0 || (long long)x * y * z > 1024 || z > 64)
        return CUDA_ERROR_INVALID_VALUE;
    f->block[0] = (unsigned)x;
    f->block[1] = (unsigned)y;
    f->block[2] = (unsigned)z;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncSetSharedSize(CUfunction hfunc, unsigned int bytes)
{
    struct CUfunc_st *f;
    CUresult r = func(hfunc, &f);
    return r ? r : bytes > 232448 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuParamSetSize(CUfunction hfunc, unsigned int numbytes)
{
    struct CUfunc_st *f;
    CUresult r = func(hfunc, &f);
    if (r)
        return r;
    if (numbytes > CU_PARAM_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    f->param_size = numbytes;
    return CUDA_SUCCESS;
}

static CUresult param_set(CUfunction hfunc, int offset, const void *v, unsigned n)
{
    struct CUfunc_st *f;
    CUresult r = func(hfunc, &f);
    if (r)
        return r;
    if (offset < 0 || !v || (unsigned)offset + n > CU_PARAM_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f->params && !(f->params = calloc(1, CU_PARAM_MAX)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(f->params + offset, v, n);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuParamSeti(CUfunction hfunc, int offset, unsigned int value)
{
    return param_set(hfunc, offset, &value, sizeof(value));
}

SIM_EXPORT CUresult cuParamSetf(CUfunction hfunc, int offset, float value)
{
    return param_set(hfunc, offset, &value, sizeof(value));
}

SIM_EXPORT CUresult cuParamSetv(CUfunction hfunc, int offset, void *ptr, unsigned int numbytes)
{
    return param_set(hfunc, offset, ptr, numbytes);
}

static CUresult legacy_launch(CUfunction hfunc, int gw, int gh, CUstream h)
{
    struct CUfunc_st *f;
    CUresult r = func(hfunc, &f);
    if (r)
        return r;
    if (gw <= 0 || gh <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f->block[0])
        return CUDA_ERROR_INVALID_VALUE; /* no cuFuncSetBlockShape yet */
    static unsigned char none[8];
    size_t size = f->param_size;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, f->params ? f->params : none,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    return cu_launch(hfunc, (unsigned)gw, (unsigned)gh, 1, f->block[0], f->block[1], f->block[2], h,
                     NULL, extra, 0);
}

SIM_EXPORT CUresult cuLaunch(CUfunction f)
{
    return legacy_launch(f, 1, 1, NULL);
}

SIM_EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    return legacy_launch(f, grid_width, grid_height, NULL);
}

SIM_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    return legacy_launch(f, grid_width, grid_height, hStream);
}

/* ---- profiler (cudaProfiler.h): there is no profiler to start -------------------------- */

SIM_EXPORT CUresult cuProfilerStart(void)
{
    return cu_ready();
}

SIM_EXPORT CUresult cuProfilerStop(void)
{
    return cu_ready();
}
