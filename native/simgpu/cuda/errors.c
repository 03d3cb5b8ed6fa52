/* cuGetErrorName / cuGetErrorString: one row per CUresult in sharegpu/cuda_api.h. */
#include "cu.h"

#define CU_ERRORS(X)                                                                              \
    X(CUDA_SUCCESS, "no error")                                                                   \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                               \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                  \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                         \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                           \
    X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                                   \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")         \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                 \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                        \
    X(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license")                   \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                 \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                       \
    X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                                   \
    X(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                               \
    X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                       \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")  \
    X(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired")                                   \
    X(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                               \
    X(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture")               \
    X(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")                                     \
    X(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid")                                \
    X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                                \
    X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")        \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                       \
    X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")         \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                             \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                                   \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                     \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")              \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                       \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")                                \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                    \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                                  \
      "part or all of the requested memory range is already mapped")                             \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,                                                      \
      "pointer does not correspond to a registered memory region")                               \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                     \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch")           \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                        \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                        \
    X(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                                  \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")  \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                      \
      "operation failed due to a previous error during capture")                                  \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "operation would make the legacy stream depend on a "  \
                                           "capturing blocking stream")                           \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work")                   \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                                         \
      "operation would make the legacy stream depend on a capturing blocking stream")             \
    X(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a "        \
                                 "capturing stream")                                              \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **str)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        *str = #code;                                                                              \
        return CUDA_SUCCESS;
        CU_ERRORS(X)
#undef X
    }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **str)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        *str = text;                                                                               \
        return CUDA_SUCCESS;
        CU_ERRORS(X)
#undef X
    }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
