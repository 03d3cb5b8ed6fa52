/*
 * THE list of libcuda.so.1 entry points: cuGetProcAddress reads it, and tests/test_simgpu.py
 * checks that `nm -D libcuda.so.1` exports exactly the symbols named here (the version script
 * simgpu/cuda.map must agree).
 *
 *   P(request name, first CUDA version, exported symbol)
 *   T(request name, first CUDA version, exported symbol, per-thread-default-stream symbol)
 *
 * Several rows may share a request name: cuGetProcAddress picks the row with the highest first
 * version <= the caller's cudaVersion (the public CUDA versioning of each API).
 */
#define SIMGPU_PROCS(P, T)                                                                         \
    P("cuInit", 2000, cuInit)                                                                      \
    P("cuDriverGetVersion", 2020, cuDriverGetVersion)                                              \
    P("cuGetProcAddress", 11030, cuGetProcAddress)                                                 \
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2)                                              \
    P("cuGetErrorName", 6000, cuGetErrorName)                                                      \
    P("cuGetErrorString", 6000, cuGetErrorString)                                                  \
    P("cuDeviceGet", 2000, cuDeviceGet)                                                            \
    P("cuDeviceGetCount", 2000, cuDeviceGetCount)                                                  \
    P("cuDeviceGetName", 2000, cuDeviceGetName)                                                    \
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid)                                                    \
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2)                                                \
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2)                                               \
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute)                                          \
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId)                                            \
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool)                               \
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool)                                             \
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain)                                  \
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease)                                \
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2)                            \
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState)                              \
    P("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags)                              \
    P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2)                          \
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset)                                    \
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2)                                \
    P("cuCtxCreate", 3020, cuCtxCreate_v2)                                                         \
    P("cuCtxCreate", 11040, cuCtxCreate_v3)                                                        \
    P("cuCtxCreate", 12050, cuCtxCreate_v4)                                                        \
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2)                                                       \
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent)                                                    \
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent)                                                    \
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2)                                               \
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2)                                                 \
    P("cuCtxGetDevice", 2000, cuCtxGetDevice)                                                      \
    P("cuCtxSynchronize", 2000, cuCtxSynchronize)                                                  \
    P("cuMemAlloc", 3020, cuMemAlloc_v2)                                                           \
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2)                                                 \
    P("cuMemAllocManaged", 6000, cuMemAllocManaged)                                                \
    P("cuMemFree", 3020, cuMemFree_v2)                                                             \
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2)                                                       \
    T("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz)                             \
    T("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)     \
    T("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz)                                \
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo)                                                   \
    T("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)                                 \
    T("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)                                 \
    T("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)                                 \
    T("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)                  \
    T("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)                  \
    T("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)                  \
    T("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)                                       \
    T("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds)                                    \
    P("cuMemCreate", 10020, cuMemCreate)                                                           \
    P("cuMemRelease", 10020, cuMemRelease)                                                         \
    P("cuMemAddressReserve", 10020, cuMemAddressReserve)                                           \
    P("cuMemAddressFree", 10020, cuMemAddressFree)                                                 \
    P("cuMemMap", 10020, cuMemMap)                                                                 \
    P("cuMemUnmap", 10020, cuMemUnmap)                                                             \
    P("cuMemSetAccess", 10020, cuMemSetAccess)                                                     \
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity)                       \
    P("cuArrayCreate", 3020, cuArrayCreate_v2)                                                     \
    P("cuArrayDestroy", 2000, cuArrayDestroy)                                                      \
    P("cuModuleLoadData", 2000, cuModuleLoadData)                                                  \
    P("cuModuleLoadFatBinary", 2000, cuModuleLoadFatBinary)                                        \
    P("cuModuleGetFunction", 2000, cuModuleGetFunction)                                            \
    P("cuModuleUnload", 2000, cuModuleUnload)                                                      \
    T("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz)                                 \
    T("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz)                          \
    T("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz) \
    P("cuGraphCreate", 10000, cuGraphCreate)                                                       \
    P("cuGraphDestroy", 10000, cuGraphDestroy)                                                     \
    P("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode)                                         \
    P("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2)                                      \
    P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2)                                          \
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags)                                    \
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags)                           \
    T("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz)                                   \
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy)                                             \
    P("cuStreamCreate", 2000, cuStreamCreate)                                                      \
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2)                                                 \
    T("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)                  \
    T("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz)                                    \
    T("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)        \
    T("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz)                    \
    T("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz)                 \
    P("cuEventCreate", 2000, cuEventCreate)                                                        \
    T("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz)                                    \
    P("cuEventQuery", 2000, cuEventQuery)                                                          \
    P("cuEventSynchronize", 2000, cuEventSynchronize)                                              \
    P("cuEventElapsedTime", 2000, cuEventElapsedTime)                                              \
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2)                                          \
    P("cuEventDestroy", 4000, cuEventDestroy_v2)
