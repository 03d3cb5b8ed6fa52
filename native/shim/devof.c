/*
 * Which GPU an allocation lands on, when it is not the current context's: a stream-ordered
 * allocation goes to its stream's device, a pool allocation to its pool's.  The ledger charges
 * that device's cap (a tenant's caps are per GPU), so an allocation can never be charged to a
 * GPU other than the one whose memory it takes.
 *
 * A pool's device is learned where the pool comes from (cuMemPoolCreate's location,
 * cuDeviceGetDefaultMemPool / cuDeviceGetMemPool's device) in a small table; a pool the shim
 * never saw is taken to be on its stream's device.
 */
#include "shim.h"

#include <pthread.h>

int sg_stream_ordinal(CUstream s, CUdevice *dev)
{
    if (sg_default_stream(s))
        return sg_current_ordinal(dev); /* the current context's default streams */
    if (SG_REAL(cuStreamGetDevice) && SG_REAL(cuStreamGetDevice)(s, dev) == CUDA_SUCCESS)
        return CUDA_SUCCESS; /* CUDA 12.8 and later */
    CUcontext ctx;
    if (SG_REAL(cuStreamGetCtx) && SG_REAL(cuStreamGetCtx)(s, &ctx) == CUDA_SUCCESS &&
        SG_REAL(cuCtxPushCurrent_v2) && SG_REAL(cuCtxPopCurrent_v2) &&
        SG_REAL(cuCtxPushCurrent_v2)(ctx) == CUDA_SUCCESS) {
        int res = sg_current_ordinal(dev);
        CUcontext popped;
        SG_REAL(cuCtxPopCurrent_v2)(&popped);
        return res;
    }
    return sg_current_ordinal(dev);
}

CUcontext sg_stream_ctx(CUstream s)
{
    CUcontext ctx = NULL;
    if (sg_default_stream(s)) {
        if (SG_REAL(cuCtxGetCurrent))
            SG_REAL(cuCtxGetCurrent)(&ctx);
    } else if (!SG_REAL(cuStreamGetCtx) || SG_REAL(cuStreamGetCtx)(s, &ctx) != CUDA_SUCCESS) {
        ctx = NULL;
    }
    return ctx;
}

#define POOLS 256

static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUmemoryPool pool;
    CUdevice dev;
} pools[POOLS];   /* [pools_mu] most recent first wins on reuse of a handle */
static int npools; /* [pools_mu] ring position once full */

void sg_pool_seen(CUmemoryPool pool, CUdevice dev)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pools_mu);
    int i = 0;
    while (i < POOLS && pools[i].pool && pools[i].pool != pool)
        i++;
    if (i == POOLS)
        i = npools++ % POOLS; /* full: overwrite the oldest */
    pools[i].pool = pool;
    pools[i].dev = dev;
    pthread_mutex_unlock(&pools_mu);
}

int sg_pool_ordinal(CUmemoryPool pool, CUstream s, CUdevice *dev)
{
    pthread_mutex_lock(&pools_mu);
    int found = 0;
    for (int i = 0; i < POOLS && pools[i].pool && !found; i++)
        if (pools[i].pool == pool) {
            *dev = pools[i].dev;
            found = 1;
        }
    pthread_mutex_unlock(&pools_mu);
    return found ? CUDA_SUCCESS : sg_stream_ordinal(s, dev);
}

/* ---- where pools come from ------------------------------------------------------------------ */

SG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!SG_REAL(cuMemPoolCreate))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemPoolCreate)(pool, props);
    if (res == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        sg_pool_seen(*pool, props->location.id);
    return res;
}

/* A device's pool (default or current) is that device's. */
#define POOL_OF_DEVICE(name)                                                                       \
    SG_EXPORT CUresult name(CUmemoryPool *pool, CUdevice dev)                                      \
    {                                                                                              \
        if (!SG_REAL(name))                                                                        \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        CUresult res = SG_REAL(name)(pool, dev);                                                   \
        if (res == CUDA_SUCCESS && pool)                                                           \
            sg_pool_seen(*pool, dev);                                                              \
        return res;                                                                                \
    }
POOL_OF_DEVICE(cuDeviceGetDefaultMemPool)
POOL_OF_DEVICE(cuDeviceGetMemPool)
