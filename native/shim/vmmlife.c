/*
 * VMM lifetime: physical memory of cuMemCreate lives until its handle is released AND its last
 * mapping is unmapped, as the driver frees it.  The documented idiom (create, map, release at
 * once, unmap much later) must therefore stay charged while mapped: cuMemRelease of a handle that
 * still has mappings keeps its charge here, and the cuMemUnmap that removes its last mapping
 * credits it.
 *
 * Process-local tables, guarded by one mutex (VMM programs keep few, large objects; linear
 * scans).  A forked child maps nothing of its parent's and starts empty.
 */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>

struct mapping {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle handle;
};

struct held { /* a released handle that is still mapped: its charge waits for the last unmap */
    CUmemGenericAllocationHandle handle;
    struct sg_charge charge;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct mapping *maps; /* [mu] */
static size_t nmaps, capmaps;
static struct held *helds; /* [mu] */
static size_t nhelds, caphelds;

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(maps);
    free(helds);
    maps = NULL;
    helds = NULL;
    nmaps = capmaps = nhelds = caphelds = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void setup(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

int sg_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, c * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

static size_t maps_of_locked(CUmemGenericAllocationHandle h)
{
    size_t n = 0;
    for (size_t i = 0; i < nmaps; i++)
        n += maps[i].handle == h;
    return n;
}

SG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!SG_REAL(cuMemMap))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (res != CUDA_SUCCESS || sg_in_hook || !sg_configured())
        return res;
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (sg_grow((void **)&maps, &capmaps, nmaps, sizeof(*maps)) == 0)
        maps[nmaps++] = (struct mapping){.va = ptr, .size = size, .handle = handle};
    /* Out of host memory: the mapping goes unrecorded, and a later release credits at once
     * (the old behaviour), which the agent's audit still bounds. */
    pthread_mutex_unlock(&mu);
    return res;
}

SG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!SG_REAL(cuMemUnmap))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemUnmap)(ptr, size);
    if (res != CUDA_SUCCESS || sg_in_hook || !sg_configured())
        return res;
    struct sg_charge due[16];
    size_t ndue = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nmaps;) {
        if (maps[i].va >= ptr && maps[i].va + maps[i].size <= ptr + size) {
            CUmemGenericAllocationHandle h = maps[i].handle;
            maps[i] = maps[--nmaps];
            for (size_t k = 0; k < nhelds && maps_of_locked(h) == 0; k++) {
                if (helds[k].handle != h)
                    continue;
                if (ndue < sizeof due / sizeof due[0]) {
                    due[ndue++] = helds[k].charge;
                    helds[k] = helds[--nhelds];
                }
                break;
            }
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < ndue; i++)
        sg_credit(&due[i]); /* outside the lock: the ledger takes its own */
    return res;
}

bool sg_vmm_hold_if_mapped(CUmemGenericAllocationHandle handle, const struct sg_charge *c)
{
    bool kept = false;
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (maps_of_locked(handle) > 0 && sg_grow((void **)&helds, &caphelds, nhelds, sizeof(*helds)) == 0) {
        helds[nhelds++] = (struct held){.handle = handle, .charge = *c};
        kept = true;
    }
    pthread_mutex_unlock(&mu);
    return kept;
}
