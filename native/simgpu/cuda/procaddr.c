/* cuGetProcAddress(_v2): resolves a base API name for a CUDA version from the table in procs.h. */
#include "cu.h"
#include "procs.h"

#include <string.h>

struct proc {
    const char *name;
    int version;
    void *fn;
    void *ptds; /* per-thread-default-stream variant, or NULL */
};

/* Typed on the way in: a variant must have exactly its base function's type. */
#define ROW_P(n, v, sym) {n, v, (void *)&sym, NULL},
#define ROW_T(n, v, sym, pt) {n, v, (void *)&sym, (void *)&pt},
static const struct proc procs[] = {SIMGPU_PROCS(ROW_P, ROW_T)};
#undef ROW_P
#undef ROW_T

#define CHECK_P(n, v, sym)
#define CHECK_T(n, v, sym, pt)                                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sym), __typeof__(&pt)),               \
                   #pt " must have the type of " #sym);
SIMGPU_PROCS(CHECK_P, CHECK_T)
#undef CHECK_P
#undef CHECK_T

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        known = 1;
        if (procs[i].version <= cudaVersion && (!best || procs[i].version > best->version))
            best = &procs[i];
    }
    *pfn = NULL;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (ptds && best->ptds) ? best->ptds : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags)
{
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

SIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
