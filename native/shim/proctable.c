/*
 * The cuGetProcAddress fallback: which exported variant the public CUDA versioning gives a base
 * name for a requested cudaVersion and stream flags.  Used only when the pointer the real
 * cuGetProcAddress returned is not one we can identify (real.c), so that an allocation path can
 * never escape the ledger, nor a launch the GPU arbiter, through an unrecognised pointer.
 *
 * Source: NVIDIA's public CUDA headers, where cudaTypedefs.h names every variant by the version
 * that introduced it (PFN_cuMemAlloc_v3020, PFN_cuCtxSynchronize_v13000, and
 * PFN_cuLaunchKernel_v7000_ptsz for the per-thread-default-stream variants).  A base lists every
 * variant the header has, so a newer variant is never answered with an older one's hook (the
 * next row is each row's upper bound); tests/integration/test_shim.py checks the table against the headers.
 * Rows of one base are ordered newest first; the first row whose version is <= the requested one
 * and whose stream mode matches wins.
 *
 * Pure function, no state: tests/integration/test_shim.py compiles this file alone into a small program
 * and checks every hooked base against it.
 */
#include <string.h>

#include "shim.h"

enum stream_mode { ANY, LEGACY, PTDS };

struct proc_row {
    const char *base;
    int min_version;
    unsigned char mode;
    int target; /* enum sg_hook_id or SG_PROC_PASS */
};

static bool ends_with(const char *s, size_t len, const char *suffix)
{
    size_t k = strlen(suffix);
    return len >= k && memcmp(s + len - k, suffix, k) == 0;
}

size_t sg_base_len(const char *name)
{
    size_t len = strlen(name);
    if (ends_with(name, len, "_ptsz") || ends_with(name, len, "_ptds"))
        len -= 5;
    size_t i = len;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        i--;
    if (i < len && i >= 2 && name[i - 1] == 'v' && name[i - 2] == '_')
        len = i - 2;
    return len;
}

#define H(name) SG_H_##name

static const struct proc_row rows[] = {
    {"cuInit", 2000, ANY, H(cuInit)},
    {"cuGetProcAddress", 12000, ANY, H(cuGetProcAddress_v2)},
    {"cuGetProcAddress", 11030, ANY, H(cuGetProcAddress)},

    {"cuMemAlloc", 3020, ANY, H(cuMemAlloc_v2)},
    {"cuMemAlloc", 2000, ANY, H(cuMemAlloc)},
    {"cuMemAllocPitch", 3020, ANY, H(cuMemAllocPitch_v2)},
    {"cuMemAllocPitch", 2000, ANY, H(cuMemAllocPitch)},
    {"cuMemAllocManaged", 6000, ANY, H(cuMemAllocManaged)},
    {"cuMemAllocAsync", 11020, PTDS, H(cuMemAllocAsync_ptsz)},
    {"cuMemAllocAsync", 11020, ANY, H(cuMemAllocAsync)},
    {"cuMemAllocFromPoolAsync", 11020, PTDS, H(cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, ANY, H(cuMemAllocFromPoolAsync)},
    {"cuMemCreate", 10020, ANY, H(cuMemCreate)},
    {"cuMemPoolCreate", 11020, ANY, H(cuMemPoolCreate)},
    {"cuDeviceGetDefaultMemPool", 11020, ANY, H(cuDeviceGetDefaultMemPool)},
    {"cuDeviceGetMemPool", 11020, ANY, H(cuDeviceGetMemPool)},
    {"cuArrayCreate", 3020, ANY, H(cuArrayCreate_v2)},
    {"cuArrayCreate", 2000, ANY, H(cuArrayCreate)},

    {"cuMemFree", 3020, ANY, H(cuMemFree_v2)},
    {"cuMemFree", 2000, ANY, SG_PROC_PASS}, /* 32-bit pointers: nothing of ours to free */
    {"cuMemFreeAsync", 11020, PTDS, H(cuMemFreeAsync_ptsz)},
    {"cuMemFreeAsync", 11020, ANY, H(cuMemFreeAsync)},
    {"cuMemRelease", 10020, ANY, H(cuMemRelease)},
    {"cuMemMap", 10020, ANY, H(cuMemMap)},
    {"cuMemExportToShareableHandle", 10020, ANY, H(cuMemExportToShareableHandle)},
    {"cuMemImportFromShareableHandle", 10020, ANY, H(cuMemImportFromShareableHandle)},
    {"cuMemUnmap", 10020, ANY, H(cuMemUnmap)},
    {"cuMemRetainAllocationHandle", 11000, ANY, H(cuMemRetainAllocationHandle)},
    {"cuIpcOpenMemHandle", 11000, ANY, H(cuIpcOpenMemHandle_v2)},
    {"cuIpcOpenMemHandle", 4010, ANY, H(cuIpcOpenMemHandle)},
    {"cuIpcCloseMemHandle", 4010, ANY, H(cuIpcCloseMemHandle)},
    {"cuMemPoolImportPointer", 11020, ANY, H(cuMemPoolImportPointer)},
    {"cuArrayDestroy", 2000, ANY, H(cuArrayDestroy)},
    {"cuArray3DCreate", 3020, ANY, H(cuArray3DCreate_v2)},
    {"cuArray3DCreate", 2000, ANY, SG_PROC_NONE}, /* 32-bit descriptor: an allocation we cannot account */
    {"cuMipmappedArrayCreate", 5000, ANY, H(cuMipmappedArrayCreate)},
    {"cuMipmappedArrayDestroy", 5000, ANY, H(cuMipmappedArrayDestroy)},

    {"cuMemGetInfo", 3020, ANY, H(cuMemGetInfo_v2)},
    {"cuMemGetInfo", 2000, ANY, H(cuMemGetInfo)},
    {"cuDeviceTotalMem", 3020, ANY, H(cuDeviceTotalMem_v2)},
    {"cuDeviceTotalMem", 2000, ANY, H(cuDeviceTotalMem)},

    /* contexts: their own memory is admitted at creation */
    {"cuCtxCreate", 12050, ANY, H(cuCtxCreate_v4)},
    {"cuCtxCreate", 11040, ANY, H(cuCtxCreate_v3)},
    {"cuCtxCreate", 3020, ANY, H(cuCtxCreate_v2)},
    {"cuCtxCreate", 2000, ANY, H(cuCtxCreate)},
    {"cuDevicePrimaryCtxRetain", 7000, ANY, H(cuDevicePrimaryCtxRetain)},

    /* teardown: a context's memory is credited, cached stream lookups end */
    {"cuCtxDestroy", 4000, ANY, H(cuCtxDestroy_v2)},
    {"cuCtxDestroy", 2000, ANY, H(cuCtxDestroy)},
    {"cuCtxAttach", 2000, ANY, H(cuCtxAttach)},
    {"cuCtxDetach", 2000, ANY, H(cuCtxDetach)},
    {"cuDevicePrimaryCtxRelease", 11000, ANY, H(cuDevicePrimaryCtxRelease_v2)},
    {"cuDevicePrimaryCtxRelease", 7000, ANY, H(cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxReset", 11000, ANY, H(cuDevicePrimaryCtxReset_v2)},
    {"cuDevicePrimaryCtxReset", 7000, ANY, H(cuDevicePrimaryCtxReset)},
    {"cuStreamDestroy", 4000, ANY, H(cuStreamDestroy_v2)},
    {"cuStreamDestroy", 2000, ANY, H(cuStreamDestroy)},
    {"cuCtxSetLimit", 3010, ANY, H(cuCtxSetLimit)},
    {"cuModuleLoad", 2000, ANY, H(cuModuleLoad)},
    {"cuModuleLoadData", 2000, ANY, H(cuModuleLoadData)},
    {"cuModuleLoadDataEx", 2010, ANY, H(cuModuleLoadDataEx)},
    {"cuModuleLoadFatBinary", 2000, ANY, H(cuModuleLoadFatBinary)},
    {"cuLibraryLoadData", 12000, ANY, H(cuLibraryLoadData)},
    {"cuLibraryLoadFromFile", 12000, ANY, H(cuLibraryLoadFromFile)},
    {"cuLibraryUnload", 12000, ANY, H(cuLibraryUnload)},
    {"cuModuleUnload", 2000, ANY, H(cuModuleUnload)},

    /* graph memory: instantiation reads the allocation nodes, launch and upload admit them */
    {"cuGraphInstantiate", 11000, ANY, H(cuGraphInstantiate_v2)},
    {"cuGraphInstantiate", 10000, ANY, H(cuGraphInstantiate)},
    {"cuGraphInstantiateWithFlags", 11040, ANY, H(cuGraphInstantiateWithFlags)},
    {"cuGraphInstantiateWithParams", 12000, PTDS, H(cuGraphInstantiateWithParams_ptsz)},
    {"cuGraphInstantiateWithParams", 12000, ANY, H(cuGraphInstantiateWithParams)},
    {"cuGraphUpload", 11010, PTDS, H(cuGraphUpload_ptsz)},
    {"cuGraphUpload", 11010, ANY, H(cuGraphUpload)},
    {"cuGraphExecDestroy", 10000, ANY, H(cuGraphExecDestroy)},
    {"cuDeviceGraphMemTrim", 11040, ANY, H(cuDeviceGraphMemTrim)},

    /* compute arbitration: launches (gated) and the sync calls that end a burst */
    {"cuLaunchKernel", 7000, PTDS, H(cuLaunchKernel_ptsz)},
    {"cuLaunchKernel", 4000, ANY, H(cuLaunchKernel)},
    {"cuLaunchKernelEx", 11060, PTDS, H(cuLaunchKernelEx_ptsz)},
    {"cuLaunchKernelEx", 11060, ANY, H(cuLaunchKernelEx)},
    {"cuLaunchCooperativeKernel", 9000, PTDS, H(cuLaunchCooperativeKernel_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, ANY, H(cuLaunchCooperativeKernel)},
    {"cuLaunchCooperativeKernelMultiDevice", 9000, ANY, H(cuLaunchCooperativeKernelMultiDevice)},
    {"cuGraphLaunch", 10000, PTDS, H(cuGraphLaunch_ptsz)},
    {"cuGraphLaunch", 10000, ANY, H(cuGraphLaunch)},
    {"cuLaunch", 2000, ANY, H(cuLaunch)},
    {"cuLaunchGrid", 2000, ANY, H(cuLaunchGrid)},
    {"cuLaunchGridAsync", 2000, ANY, H(cuLaunchGridAsync)},
    {"cuCtxSynchronize", 13000, ANY, H(cuCtxSynchronize_v2)},
    {"cuCtxSynchronize", 2000, ANY, H(cuCtxSynchronize)},
    {"cuStreamSynchronize", 7000, PTDS, H(cuStreamSynchronize_ptsz)},
    {"cuStreamSynchronize", 2000, ANY, H(cuStreamSynchronize)},
    {"cuEventSynchronize", 2000, ANY, H(cuEventSynchronize)},
    {"cuMemcpyHtoD", 7000, PTDS, H(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyHtoD", 3020, ANY, H(cuMemcpyHtoD_v2)},
    {"cuMemcpyHtoD", 2000, ANY, SG_PROC_PASS}, /* 32-bit pointers: a copy, never a launch */
    {"cuMemcpyDtoH", 7000, PTDS, H(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoH", 3020, ANY, H(cuMemcpyDtoH_v2)},
    {"cuMemcpyDtoH", 2000, ANY, SG_PROC_PASS},
    {"cuMemcpyDtoD", 7000, PTDS, H(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyDtoD", 3020, ANY, H(cuMemcpyDtoD_v2)},
    {"cuMemcpyDtoD", 2000, ANY, SG_PROC_PASS},
};

int sg_proc_table_lookup(const char *symbol, int cuda_version, cuuint64_t flags)
{
    unsigned char want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? PTDS : LEGACY;
    bool known = false;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (strcmp(rows[i].base, symbol) != 0)
            continue;
        known = true;
        if (rows[i].min_version > cuda_version)
            continue;
        if (rows[i].mode != ANY && rows[i].mode != want)
            continue;
        return rows[i].target;
    }
    return known ? SG_PROC_NONE : SG_PROC_UNHOOKED;
}
