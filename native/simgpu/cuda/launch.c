/*
 * Kernel launches.  Time contract: a kernel whose name starts with "spin" runs for the 64-bit
 * unsigned number of microseconds in its first parameter; any other kernel for SIMGPU_KERNEL_US.
 * A launch reads that parameter, then queues the kernel on its process's channel of the engine
 * (common/engine.c): no allocation and no system call on this path.
 */
#include "cu.h"

#include <string.h>

#define MAX_KERNEL_US (3600ull * 1000000ull) /* one hour: keeps end times far from overflow */

uint64_t cu_kernel_ns(const struct CUfunc_st *f, void **params, void **extra)
{
    if (!f->spin)
        return cu_g.kernel_ns;
    uint64_t us = 0;
    if (params && params[0]) {
        memcpy(&us, params[0], sizeof(us));
    } else if (extra) {
        const void *buf = NULL;
        size_t size = sizeof(us);
        for (int i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                memcpy(&size, extra[i + 1], sizeof(size));
            else
                break; /* unknown key: stop rather than read past the array */
        }
        if (buf && size >= sizeof(us))
            memcpy(&us, buf, sizeof(us));
    }
    if (us > MAX_KERNEL_US)
        us = MAX_KERNEL_US;
    return us * 1000ull;
}

CUresult cu_submit(struct CUstream_st *s, const uint64_t *dur, size_t n, const struct CUfunc_st *f)
{
    if (s->capture) {
        for (size_t i = 0; i < n; i++) {
            CUresult r = cu_graph_capture_add(s->capture, f, dur[i]);
            if (r)
                return r;
        }
        return CUDA_SUCCESS;
    }
    CUresult r = cu_stream_settle(s);
    if (r)
        return r;
    struct sim_err e = {0};
    if (sim_engine_submit(&e, cu_g.st, s->ctx->phys, &s->q, &s->ctx->last, dur, n) < 0)
        return cu_result(&e);
    return CUDA_SUCCESS;
}

CUresult cu_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, CUstream h, void **params, void **extra, int cooperative)
{
    CUresult r = cu_func_check(f);
    if (r)
        return r;
    /* The stream names the context: a launch on a created stream needs no current context (a
     * CUkernel of a library is launched that way); the NULL stream is the current context's. */
    if (!gx || !gy || !gz || !bx || !by || !bz || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    if ((uint64_t)bx * by * bz > 1024 || bz > 64 || gy > 65535 || gz > 65535)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    r = cu_stream(h, &s);
    if (r)
        return r;
    if (cooperative && (uint64_t)gx * gy * gz > (uint64_t)cu_g.st->cfg.sm_count * 32u)
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    struct CUfunc_st *fn;
    r = cu_func_in(f, s->ctx, &fn); /* a CUkernel becomes its function in the stream's context */
    if (r)
        return r;
    uint64_t dur = cu_kernel_ns(fn, params, extra);
    return cu_submit(s, &dur, 1, fn);
}

SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra)
{
    return cu_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, 0);
}

SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams, void **extra)
{
    return cu_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, 0);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs && !config->attrs)
        return CUDA_ERROR_INVALID_VALUE;
    return cu_launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, params, extra, 0);
}

SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                     void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra);
}

SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                          void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra);
}

SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                              unsigned int gridDimY, unsigned int gridDimZ,
                                              unsigned int blockDimX, unsigned int blockDimY,
                                              unsigned int blockDimZ, unsigned int sharedMemBytes,
                                              CUstream hStream, void **kernelParams)
{
    return cu_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, NULL, 1);
}

SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                   unsigned int gridDimY, unsigned int gridDimZ,
                                                   unsigned int blockDimX, unsigned int blockDimY,
                                                   unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void **kernelParams)
{
    return cu_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, NULL, 1);
}

/* Deprecated, still in cuda.h: one cooperative launch per device, each on its own stream, which
 * must be of distinct devices.  The kernels of different GPUs run on different engines, so they
 * overlap as on a GPU; the pre/post launch synchronisation flags are accepted (a stream already
 * orders each launch after its earlier work here). */
SIM_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                         unsigned int numDevices, unsigned int flags)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!list || !numDevices || numDevices > (unsigned)cu_g.nvis || (flags & ~3u))
        return CUDA_ERROR_INVALID_VALUE;
    int seen[SIM_MAX_GPUS] = {0};
    for (unsigned i = 0; i < numDevices; i++) { /* validate everything before launching anything */
        struct CUstream_st *s;
        if (!list[i].hStream || (r = cu_stream(list[i].hStream, &s)))
            return r ? r : CUDA_ERROR_INVALID_VALUE; /* needs explicit streams */
        if (seen[s->ctx->phys]++)
            return CUDA_ERROR_INVALID_DEVICE; /* two launches on one device */
        if ((r = cu_func_check(list[i].function)))
            return r;
    }
    for (unsigned i = 0; i < numDevices; i++) {
        const CUDA_LAUNCH_PARAMS *p = &list[i];
        r = cu_launch(p->function, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY,
                      p->blockDimZ, p->hStream, p->kernelParams, NULL, 1);
        if (r)
            return r;
    }
    return CUDA_SUCCESS;
}
