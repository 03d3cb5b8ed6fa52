/* cuGetProcAddress(_v2): resolves a base API name for a CUDA version from the generated table. */
#include "cu.h"
#include "api_table.h"

#include <string.h>

/* The rows of `symbol` are contiguous in the sorted table: binary search for the first one. */
static size_t first_row(const char *symbol)
{
    size_t lo = 0, hi = sim_api_nrows;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(sim_api_rows[mid].name, symbol) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The newest row at or below cudaVersion; a per-thread request prefers a per-thread row of the
 * same or a newer version over a plain one (the per-thread variant of the ABI in force). */
static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct sim_api_row *best = NULL;
    int known = 0;
    for (size_t i = first_row(symbol); i < sim_api_nrows && strcmp(sim_api_rows[i].name, symbol) == 0;
         i++) {
        const struct sim_api_row *r = &sim_api_rows[i];
        known = 1;
        if (r->version > cudaVersion || (r->per_thread && !ptds))
            continue;
        if (!best || r->version > best->version || (r->version == best->version && r->per_thread))
            best = r;
    }
    *pfn = NULL;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
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
