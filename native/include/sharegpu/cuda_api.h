/*
 * The subset of the CUDA driver API that sharegpu implements (simgpu) or hooks (shim).
 *
 * Written from NVIDIA's public CUDA Driver API reference; no CUDA toolkit is needed to build.
 * Only what we use is declared.  Numeric values and struct layouts follow the reference exactly,
 * because unmodified clients (cuda-python, C programs built against the real cuda.h) pass them
 * to us.
 */
#ifndef SHAREGPU_CUDA_API_H
#define SHAREGPU_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* Special stream handles. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_UNMAP_FAILED = 206,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_ALREADY_ACQUIRED = 210,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT = 14,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD = 84,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92,
    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 = 93,
    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1 = 94,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR = 123,
    CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED = 125,
    CU_DEVICE_ATTRIBUTE_MAX = 150
} CUdevice_attribute;

/* cuGetProcAddress flags and query results. */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM (1ULL << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1ULL << 1)

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* Array descriptors. */
typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04
#define CUDA_ARRAY3D_SPARSE 0x40
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80

/* Virtual memory management. */
typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1
} CUmemLocationType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} CUmemAccess_flags;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* Managed memory attach flags. */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

/* Launches. */
typedef int CUlaunchAttributeID;
typedef union CUlaunchAttributeValue_union {
    char pad[64];
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* `extra` launch parameter markers (cuLaunchKernel). */
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* Graphs. */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

/* Context creation parameters (cuCtxCreate_v3 / _v4); we accept and ignore their contents. */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* ---- Prototypes of every entry point sharegpu implements or hooks. ---- */
#define SG_CUAPI CUresult

SG_CUAPI cuInit(unsigned int flags);
SG_CUAPI cuDriverGetVersion(int *version);
SG_CUAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
SG_CUAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
SG_CUAPI cuGetErrorName(CUresult error, const char **str);
SG_CUAPI cuGetErrorString(CUresult error, const char **str);

SG_CUAPI cuDeviceGet(CUdevice *device, int ordinal);
SG_CUAPI cuDeviceGetCount(int *count);
SG_CUAPI cuDeviceGetName(char *name, int len, CUdevice dev);
SG_CUAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
SG_CUAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
SG_CUAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SG_CUAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
SG_CUAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
SG_CUAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
SG_CUAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);

SG_CUAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SG_CUAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev);
SG_CUAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
SG_CUAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
SG_CUAPI cuDevicePrimaryCtxReset_v2(CUdevice dev);

SG_CUAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SG_CUAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int numParams,
                        unsigned int flags, CUdevice dev);
SG_CUAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev);
SG_CUAPI cuCtxDestroy_v2(CUcontext ctx);
SG_CUAPI cuCtxGetCurrent(CUcontext *pctx);
SG_CUAPI cuCtxSetCurrent(CUcontext ctx);
SG_CUAPI cuCtxPushCurrent_v2(CUcontext ctx);
SG_CUAPI cuCtxPopCurrent_v2(CUcontext *pctx);
SG_CUAPI cuCtxGetDevice(CUdevice *device);
SG_CUAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx); /* CUDA 13: NULL = current */
SG_CUAPI cuCtxSynchronize(void);
SG_CUAPI cuCtxSynchronize_v2(CUcontext ctx); /* CUDA 13: NULL = current */

SG_CUAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
SG_CUAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes, size_t height,
                            unsigned int elementSizeBytes);
SG_CUAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
SG_CUAPI cuMemFree_v2(CUdeviceptr dptr);
SG_CUAPI cuMemGetInfo_v2(size_t *free, size_t *total);
SG_CUAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
SG_CUAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream);
SG_CUAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
SG_CUAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);

SG_CUAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
SG_CUAPI cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
SG_CUAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
SG_CUAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
SG_CUAPI cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
SG_CUAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
SG_CUAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
SG_CUAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n);

SG_CUAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
SG_CUAPI cuMemRelease(CUmemGenericAllocationHandle handle);
SG_CUAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
SG_CUAPI cuMemAddressFree(CUdeviceptr ptr, size_t size);
SG_CUAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
SG_CUAPI cuMemUnmap(CUdeviceptr ptr, size_t size);
SG_CUAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
SG_CUAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                CUmemGenericAllocationHandle handle);
SG_CUAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
SG_CUAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);

SG_CUAPI cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc);
SG_CUAPI cuArrayDestroy(CUarray handle);
SG_CUAPI cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc);
SG_CUAPI cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int numMipmapLevels);
SG_CUAPI cuMipmappedArrayDestroy(CUmipmappedArray handle);

SG_CUAPI cuModuleLoadData(CUmodule *module, const void *image);
SG_CUAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin);
SG_CUAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
SG_CUAPI cuModuleUnload(CUmodule hmod);

SG_CUAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);
SG_CUAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra);
SG_CUAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);

SG_CUAPI cuGraphCreate(CUgraph *graph, unsigned int flags);
SG_CUAPI cuGraphDestroy(CUgraph graph);
SG_CUAPI cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                              size_t numDeps, const CUDA_KERNEL_NODE_PARAMS_v1 *params);
SG_CUAPI cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                 size_t numDeps, const CUDA_KERNEL_NODE_PARAMS_v2 *params);
SG_CUAPI cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
SG_CUAPI cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,
                               char *logBuffer, size_t bufferSize);
SG_CUAPI cuGraphLaunch(CUgraphExec exec, CUstream stream);
SG_CUAPI cuGraphExecDestroy(CUgraphExec exec);

SG_CUAPI cuStreamCreate(CUstream *stream, unsigned int flags);
/* Page-locked host memory (cuMemHostRegister flags: PORTABLE 0x1, DEVICEMAP 0x2). */
SG_CUAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
SG_CUAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags);
SG_CUAPI cuStreamDestroy_v2(CUstream stream);
SG_CUAPI cuStreamSynchronize(CUstream stream);
SG_CUAPI cuStreamQuery(CUstream stream);
SG_CUAPI cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode);
SG_CUAPI cuStreamEndCapture(CUstream stream, CUgraph *graph);
SG_CUAPI cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status);

SG_CUAPI cuEventCreate(CUevent *event, unsigned int flags);
SG_CUAPI cuEventRecord(CUevent event, CUstream stream);
SG_CUAPI cuEventQuery(CUevent event);
SG_CUAPI cuEventSynchronize(CUevent event);
SG_CUAPI cuEventElapsedTime(float *ms, CUevent start, CUevent end);
SG_CUAPI cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end);
SG_CUAPI cuEventDestroy_v2(CUevent event);

/* Legacy unversioned forms and the per-thread-default-stream variants (cuda.h maps the plain
 * names to the _ptsz/_ptds ones under CUDA_API_PER_THREAD_DEFAULT_STREAM, and cuGetProcAddress
 * returns them for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM); same signatures as their base
 * functions.  Declared once here for both the simulated driver and the shim. */
CUresult cuCtxDestroy(CUcontext ctx);
/* Deprecated since CUDA 4, still in the driver (pycuda uses them): a created context's usage
 * count, which the detach that drops it to zero ends like cuCtxDestroy. */
CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags);
CUresult cuCtxDetach(CUcontext ctx);
CUresult cuStreamDestroy(CUstream stream);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream);
CUresult cuStreamSynchronize_ptsz(CUstream stream);
CUresult cuStreamQuery_ptsz(CUstream stream);
CUresult cuEventRecord_ptsz(CUevent event, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                   CUstream stream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph);
CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus *status);

/* ---- modelled by simgpu, not hooked by the shim -------------------------------------------- */
typedef struct CUlib_st *CUlibrary;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUlinkState_st *CUlinkState;
typedef void (*CUhostFn)(void *userData);
typedef enum CUlimit_enum {
    CU_LIMIT_STACK_SIZE = 0x00,
    CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
    CU_LIMIT_MALLOC_HEAP_SIZE = 0x02,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 0x03,
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 0x04,
    CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 0x05,
    CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06,
    CU_LIMIT_SHMEM_SIZE = 0x07,
    CU_LIMIT_CIG_ENABLED = 0x08,
    CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED = 0x09,
    CU_LIMIT_MAX
} CUlimit;
typedef int CUjit_option;
typedef int CUjitInputType;
typedef int CUlibraryOption;
typedef int CUfunction_attribute;

SG_CUAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
SG_CUAPI cuCtxGetFlags(unsigned int *flags);
SG_CUAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version);
SG_CUAPI cuCtxGetId(CUcontext ctx, unsigned long long *ctxId);
SG_CUAPI cuCtxSetLimit(CUlimit limit, size_t value);
SG_CUAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit);
SG_CUAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
SG_CUAPI cuStreamGetPriority(CUstream hStream, int *priority);
SG_CUAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags);
SG_CUAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId);
SG_CUAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx);
SG_CUAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
SG_CUAPI cuStreamGetDevice(CUstream hStream, CUdevice *device);
SG_CUAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
SG_CUAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData);
SG_CUAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
/* Stream memory operations (cuda.h's cuStreamWaitValue32 and friends are these _v2 names). */
SG_CUAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
SG_CUAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority);
CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags);
CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long *streamId);
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx);
CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData);
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);

SG_CUAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions);
SG_CUAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions);
SG_CUAPI cuLibraryUnload(CUlibrary library);
SG_CUAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
SG_CUAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library);
SG_CUAPI cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
SG_CUAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);
SG_CUAPI cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel);
SG_CUAPI cuKernelGetName(const char **name, CUkernel hfunc);
SG_CUAPI cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev);
SG_CUAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev);
SG_CUAPI cuModuleLoad(CUmodule *module, const char *fname);
SG_CUAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues);
SG_CUAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
SG_CUAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
SG_CUAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
SG_CUAPI cuFuncGetName(const char **name, CUfunction hfunc);
SG_CUAPI cuFuncGetModule(CUmodule *hmod, CUfunction hfunc);
SG_CUAPI cuFuncSetCacheConfig(CUfunction hfunc, int config);
SG_CUAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                     int blockSize, size_t dynamicSMemSize);
SG_CUAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func,
                                                              int blockSize,
                                                              size_t dynamicSMemSize,
                                                              unsigned int flags);
SG_CUAPI cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                          size_t (*blockSizeToDynamicSMemSize)(int),
                                          size_t dynamicSMemSize, int blockSizeLimit);
SG_CUAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                         CUlinkState *stateOut);
SG_CUAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                          const char *name, unsigned int numOptions, CUjit_option *options,
                          void **optionValues);
SG_CUAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                          unsigned int numOptions, CUjit_option *options, void **optionValues);
SG_CUAPI cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut);
SG_CUAPI cuLinkDestroy(CUlinkState state);

typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH
} CUmemPool_attribute;
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
SG_CUAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
SG_CUAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags);
SG_CUAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType);
SG_CUAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);

/* Legacy IPC: a cuMemAlloc allocation opened by another process (passed by value: 64 bytes). */
#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
SG_CUAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
SG_CUAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
SG_CUAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
SG_CUAPI cuIpcCloseMemHandle(CUdeviceptr dptr);
/* Interprocess events: an event made with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING. */
typedef struct CUipcEventHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcEventHandle;
SG_CUAPI cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event);
SG_CUAPI cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle);
SG_CUAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);

/* Pool IPC: a pool exported by descriptor, and its allocations exported one by one. */
typedef struct CUmemPoolPtrExportData_st {
    unsigned char reserved[64];
} CUmemPoolPtrExportData;
SG_CUAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                          CUmemAllocationHandleType handleType,
                                          unsigned long long flags);
SG_CUAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                            CUmemAllocationHandleType handleType,
                                            unsigned long long flags);
SG_CUAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr);
SG_CUAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                CUmemPoolPtrExportData *shareData);
SG_CUAPI cuMemPoolDestroy(CUmemoryPool pool);
SG_CUAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
SG_CUAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);

typedef enum CUgraphNodeType_enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11
} CUgraphNodeType;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct CUgraphNodeParams_st {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel; /* the v3 layout is v2's */
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
        struct {
            CUdeviceptr dptr;
        } free;
    };
    long long reserved2;
} CUgraphNodeParams;
typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2
} CUgraphInstantiateResult;
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2ull
typedef enum CUgraphMem_attribute_enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3
} CUgraphMem_attribute;
SG_CUAPI cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *numNodes);
SG_CUAPI cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type);
SG_CUAPI cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph);
SG_CUAPI cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params);
SG_CUAPI cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *params);
SG_CUAPI cuGraphUpload(CUgraphExec exec, CUstream stream);
SG_CUAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value);
SG_CUAPI cuDeviceGraphMemTrim(CUdevice device);
#ifndef __cplusplus
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is 256 bytes in cuda.h");
#endif
typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;
SG_CUAPI cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                              unsigned int numDevices, unsigned int flags);

#ifdef __cplusplus
}
#endif
#endif /* SHAREGPU_CUDA_API_H */
