/*
 * Contexts: their own memory at creation, and context and stream teardown.
 *
 * Every context takes device memory of its own (hundreds of MiB on a large GPU), which no
 * allocation call returns.  It is admitted at once: the hook measures what the real creation
 * took (this process's memory as NVML lists it, or the device's free memory, just before and
 * just after), then admits that figure
 * into the device's overhead_bytes under the usage lock (used + overhead + bytes <= cap), so the
 * next allocation already counts it; a context that does not fit is destroyed again and
 * refused with CUDA_ERROR_OUT_OF_MEMORY.  Its estimate is taken back out when it ends
 * (cuCtxDestroy, or the release that leaves a primary context inactive, or its reset) or when
 * the process exits normally.  It is the same quantity as the agent's reconciler writes (NVML's
 * bytes of the process beyond its ledger), so the reconciler's next pass replaces the estimate
 * by its measurement rather than adding to it (reconcile.py; it also drops the estimates of a
 * killed process).  A primary context is created by the retain that finds it inactive (its
 * state is asked first) and destroyed by the release that leaves it inactive.
 *
 * Which figure: NVML's per-process list when it lists our pid after the creation (a process on
 * the host): exact, whatever other processes do meanwhile (a device-wide figure took the
 * allocations of the tenant's other processes for the context and refused contexts of a tenant
 * filling its cap), but never more than the card lost (in a pid namespace the pid NVML lists
 * may be another process's).  Where NVML does not list us, the device's free memory around the
 * call is used: it needs neither a context (the first context of a process
 * has none to ask cuMemGetInfo with) nor a pid.  Its race: another process allocating meanwhile
 * makes the figure too large (refused near the cap, corrected by the reconciler within a
 * second), another freeing makes it too small.  Against the latter, the
 * smallest figure this process measured on the device before is a floor (a context's memory
 * does not shrink between two creations); the process's own creations and teardowns are
 * serialised by ctx_mu so they never measure each other.  Without NVML (or a failed query) the
 * floor alone is charged, 0 before any measurement (the reconciler's pass then counts it).
 *
 * The driver frees a context's memory with the context: at cuCtxDestroy, and for a primary
 * context at cuDevicePrimaryCtxReset (cudaDeviceReset) or at the cuDevicePrimaryCtxRelease
 * that drops its last reference.  The ledger credits the allocations made in it then, or the
 * cap would stay charged for memory that no longer exists (a spurious out-of-memory after
 * cudaDeviceReset).  Only device pointers are credited this way (see sg_alloc_end): VMM handles
 * outlive contexts and arrays stay charged until destroyed.
 *
 * Any destroyed stream or context also ends the arbiter's cached stream -> GPU lookups: its
 * handle may come back as another GPU's stream.  The epoch moves before and after the call, so
 * a handle reused while the call runs is never matched either.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

/* A stream or a context goes: the epoch moves around the real call; `then` runs when it
 * succeeded (a context's memory goes with it). */
#define DESTROY(name, type, then)                                                                  \
    SG_EXPORT CUresult name(type handle)                                                           \
    {                                                                                              \
        REAL(name);                                                                                \
        sg_stream_handles_died();                                                                  \
        CUresult res = real_(handle);                                                              \
        sg_stream_handles_died();                                                                  \
        if (res == CUDA_SUCCESS)                                                                   \
            then;                                                                                  \
        return res;                                                                                \
    }

DESTROY(cuStreamDestroy, CUstream, (void)handle)
DESTROY(cuStreamDestroy_v2, CUstream, (void)handle)

/* ---- context memory ------------------------------------------------------------------------ */

#define MAX_ORDINALS 64

/* Serialises this process's context creations and teardowns (so that none measures another)
 * and guards everything below.  Taken before the usage mutex, never after it. */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;

struct ctx_charge {
    CUcontext ctx;
    int idx;        /* limits index */
    uint64_t bytes; /* in overhead_bytes[idx] */
};
static struct ctx_charge *created; /* [ctx_mu] the created contexts with an estimate */
static size_t ncreated, capcreated;
static struct ctx_charge primary[MAX_ORDINALS]; /* [ctx_mu] the active primary contexts' (ctx
                                                    unused; bytes 0: none) */
static uint64_t floor_bytes[MAX_ORDINALS];      /* [ctx_mu] smallest figure measured, 0: none */

static int nvml_state; /* [ctx_mu] 0 not tried, 1 initialised, -1 unavailable */
static struct {
    bool known;
    nvmlDevice_t handle;
} nvml_dev[MAX_ORDINALS]; /* [ctx_mu] */

/* The device's NVML handle, or false. */
static bool nvml_handle(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORDINALS)
        return false;
    if (nvml_state == 0)
        nvml_state = SG_REAL(nvmlInit_v2) && SG_REAL(nvmlInit_v2)() == NVML_SUCCESS ? 1 : -1;
    if (nvml_state < 0 || !SG_REAL(nvmlDeviceGetHandleByUUID) || !SG_REAL(nvmlDeviceGetMemoryInfo))
        return false;
    if (!nvml_dev[dev].known) {
        uint8_t u[16];
        char name[48];
        if (sg_ordinal_uuid(dev, u) < 0)
            return false;
        snprintf(name, sizeof name,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                 u[14], u[15]);
        if (SG_REAL(nvmlDeviceGetHandleByUUID)(name, &nvml_dev[dev].handle) != NVML_SUCCESS)
            return false;
        nvml_dev[dev].known = true;
    }
    return true;
}

/* The device's free memory as NVML sees it (all processes), or false. */
static bool device_free(CUdevice dev, uint64_t *free_bytes)
{
    nvmlMemory_t m;
    if (!nvml_handle(dev) ||
        SG_REAL(nvmlDeviceGetMemoryInfo)(nvml_dev[dev].handle, &m) != NVML_SUCCESS)
        return false;
    *free_bytes = m.free;
    return true;
}

/* This process's device memory as NVML lists it: false when NVML does not answer, *listed
 * false when our pid is not in its list (no context yet, or a pid namespace: NVML names host
 * pids). */
static bool own_used(CUdevice dev, uint64_t *bytes, bool *listed)
{
    nvmlProcessInfo_t infos[128];
    unsigned int count = sizeof infos / sizeof infos[0];
    *bytes = 0;
    *listed = false;
    if (!nvml_handle(dev) || !SG_REAL(nvmlDeviceGetComputeRunningProcesses_v3) ||
        SG_REAL(nvmlDeviceGetComputeRunningProcesses_v3)(nvml_dev[dev].handle, &count, infos) !=
            NVML_SUCCESS)
        return false;
    unsigned int me = (unsigned int)getpid();
    for (unsigned int i = 0; i < count && i < sizeof infos / sizeof infos[0]; i++)
        if (infos[i].pid == me) {
            *bytes = infos[i].usedGpuMemory;
            *listed = true;
        }
    return true;
}

/* What a context just created on dev took: the drop of the device's free memory, at least the
 * smallest drop measured on dev before (see the top). */
static uint64_t estimate(CUdevice dev, bool measured, uint64_t before, uint64_t after)
{
    uint64_t m = measured && before > after ? before - after : 0;
    if (dev < 0 || dev >= MAX_ORDINALS)
        return m;
    if (m && (!floor_bytes[dev] || m < floor_bytes[dev]))
        floor_bytes[dev] = m;
    return m > floor_bytes[dev] ? m : floor_bytes[dev];
}

/* The measurement around a creation: begin before the real call, admit after it succeeded.
 * admit returns CUDA_SUCCESS, or the error to refuse the context with (then the caller
 * destroys it again); *idx and *bytes say what was admitted (bytes 0: nothing). */
struct measure {
    bool ok, own_ok;
    uint64_t before, own_before; /* own_before: 0 while NVML does not list us */
};

static void measure_begin(CUdevice dev, struct measure *m)
{
    bool listed;
    m->own_ok = own_used(dev, &m->own_before, &listed);
    m->ok = device_free(dev, &m->before);
}

/* What the creation took: the growth of this process's own NVML figure when NVML lists us
 * (other processes allocating meanwhile do not count: a device-wide figure took their memory
 * for the context's, and refused contexts of a tenant whose other processes were filling its
 * cap); else the drop of the device's free memory. */
static CUresult measure_admit(CUdevice dev, const struct measure *m, int *idx, uint64_t *bytes)
{
    uint64_t after = 0, own_after = 0;
    bool listed = false, own = m->own_ok && own_used(dev, &own_after, &listed) && listed;
    bool device = m->ok && device_free(dev, &after);
    uint64_t grown = own && own_after > m->own_before ? own_after - m->own_before : 0;
    uint64_t dropped = device && m->before > after ? m->before - after : 0;
    if (own && device && dropped < grown)
        grown = dropped; /* the pid listed was not ours (a pid namespace): more than the card lost */
    *bytes = own ? estimate(dev, true, grown, 0) : estimate(dev, device, m->before, after);
    *bytes = (*bytes + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1); /* whole MiB, as the
                                                                          slot records it */
    *idx = -1;
    if (!*bytes)
        return CUDA_SUCCESS; /* nothing to admit: no lock taken */
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_ctx_admit(dev, *bytes, idx, &e);
    if (rc < 0) {
        *bytes = 0;
        return sg_cu_result(rc);
    }
    if (*idx < 0)
        *bytes = 0;
    return CUDA_SUCCESS;
}

static void remember_created(CUcontext ctx, int idx, uint64_t bytes)
{
    if (!bytes)
        return;
    if (sg_grow((void **)&created, &capcreated, ncreated, sizeof *created) < 0) {
        sg_ctx_credit(idx, bytes); /* cannot remember it: stop counting it (the reconciler's
                                      pass counts it again) rather than keep it for ever */
        return;
    }
    created[ncreated++] = (struct ctx_charge){.ctx = ctx, .idx = idx, .bytes = bytes};
}

/* The created context ctx ended: its estimate leaves the overhead. */
static void forget_created(CUcontext ctx)
{
    for (size_t i = 0; i < ncreated; i++) {
        if (created[i].ctx == ctx) {
            struct ctx_charge c = created[i];
            created[i] = created[--ncreated];
            sg_ctx_credit(c.idx, c.bytes);
            return;
        }
    }
}

static void forget_primary(CUdevice dev)
{
    if (dev >= 0 && dev < MAX_ORDINALS && primary[dev].bytes) {
        sg_ctx_credit(primary[dev].idx, primary[dev].bytes);
        primary[dev].bytes = 0;
    }
}

void sg_ctx_forget_all(uint64_t out[SG_MAX_DEVICES])
{
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        out[d] = 0;
    pthread_mutex_lock(&ctx_mu);
    for (size_t i = 0; i < ncreated; i++)
        if (created[i].idx >= 0 && created[i].idx < SG_MAX_DEVICES)
            out[created[i].idx] += created[i].bytes;
    ncreated = 0;
    for (int d = 0; d < MAX_ORDINALS; d++) {
        if (primary[d].bytes && primary[d].idx >= 0 && primary[d].idx < SG_MAX_DEVICES)
            out[primary[d].idx] += primary[d].bytes;
        primary[d].bytes = 0;
    }
    pthread_mutex_unlock(&ctx_mu);
}

void sg_ctx_fork_child(void)
{
    pthread_mutex_init(&ctx_mu, NULL);
    ncreated = 0;
    memset(primary, 0, sizeof primary);
    nvml_state = 0;
    memset(nvml_dev, 0, sizeof nvml_dev);
}

/* cuCtxCreate in all its versions: measured, created, admitted (or destroyed and refused). */
#define CREATE(name, params, args)                                                                 \
    SG_EXPORT CUresult name params                                                                 \
    {                                                                                              \
        REAL(name);                                                                                \
        if (sg_in_hook || !sg_configured())                                                        \
            return real_ args;                                                                     \
        if (sg_mode() != SG_MODE_ACTIVE)                                                           \
            return CUDA_ERROR_NOT_PERMITTED; /* fail closed */                                     \
        if (!pctx)                                                                                 \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        pthread_mutex_lock(&ctx_mu);                                                               \
        sg_in_hook++;                                                                              \
        struct measure m;                                                                          \
        measure_begin(dev, &m);                                                                    \
        CUresult res = real_ args;                                                                 \
        if (res == CUDA_SUCCESS) {                                                                 \
            int idx;                                                                               \
            uint64_t bytes;                                                                        \
            res = measure_admit(dev, &m, &idx, &bytes);                                            \
            if (res == CUDA_SUCCESS) {                                                             \
                remember_created(*pctx, idx, bytes);                                               \
            } else {                                                                               \
                if (SG_REAL(cuCtxDestroy_v2))                                                      \
                    SG_REAL(cuCtxDestroy_v2)(*pctx);                                               \
                sg_stream_handles_died();                                                          \
                *pctx = NULL;                                                                      \
            }                                                                                      \
        }                                                                                          \
        sg_in_hook--;                                                                              \
        pthread_mutex_unlock(&ctx_mu);                                                             \
        return res;                                                                                \
    }
CREATE(cuCtxCreate, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
CREATE(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
CREATE(cuCtxCreate_v3,
       (CUcontext * pctx, CUexecAffinityParam *params, int numParams, unsigned int flags,
        CUdevice dev),
       (pctx, params, numParams, flags, dev))
CREATE(cuCtxCreate_v4, (CUcontext * pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
       (pctx, params, flags, dev))

/* Extra uses of created contexts (cuCtxAttach), beyond the one its creation gives [ctx_mu]: the
 * driver destroys a created context at the cuCtxDetach that drops its usage count to zero, and
 * at cuCtxDestroy whatever its count.  `uses_lost`: an attach could not be recorded (host
 * memory), so no detach is taken for a destruction any more (an over-statement until exit). */
struct ctx_use {
    CUcontext ctx;
    unsigned extra;
};
static struct ctx_use *uses;
static size_t nuses, capuses;
static bool uses_lost;

static void use_add(CUcontext ctx)
{
    for (size_t i = 0; i < nuses; i++) {
        if (uses[i].ctx == ctx) {
            uses[i].extra++;
            return;
        }
    }
    if (sg_grow((void **)&uses, &capuses, nuses, sizeof *uses) < 0) {
        uses_lost = true;
        return;
    }
    uses[nuses++] = (struct ctx_use){.ctx = ctx, .extra = 1};
}

/* A detach of ctx: true when it dropped an extra use (the context lives on). */
static bool use_drop(CUcontext ctx)
{
    for (size_t i = 0; i < nuses; i++) {
        if (uses[i].ctx == ctx) {
            if (--uses[i].extra == 0)
                uses[i] = uses[--nuses];
            return true;
        }
    }
    return uses_lost;
}

static void use_forget(CUcontext ctx)
{
    for (size_t i = 0; i < nuses; i++) {
        if (uses[i].ctx == ctx) {
            uses[i] = uses[--nuses];
            return;
        }
    }
}

/* A created context ended (destroyed, or detached to a usage count of zero), under ctx_mu: its
 * estimate leaves the overhead. */
static void ended_locked(CUcontext ctx)
{
    forget_created(ctx);
    use_forget(ctx);
}

/* ... and after ctx_mu: its allocations are credited, and whatever graph memory the driver
 * freed with it. */
static void ended(CUcontext ctx)
{
    sg_credit_context(ctx);
    sg_graph_mem_settle_all();
}

/* A created context goes: the epoch moves around the real call; on success its allocations are
 * credited and its own memory leaves the overhead. */
#define CTX_DESTROY(name)                                                                          \
    SG_EXPORT CUresult name(CUcontext ctx)                                                         \
    {                                                                                              \
        REAL(name);                                                                                \
        if (sg_in_hook || !sg_configured()) {                                                      \
            sg_stream_handles_died();                                                              \
            CUresult r = real_(ctx);                                                               \
            sg_stream_handles_died();                                                              \
            return r;                                                                              \
        }                                                                                          \
        pthread_mutex_lock(&ctx_mu);                                                               \
        sg_stream_handles_died();                                                                  \
        CUresult res = real_(ctx);                                                                 \
        sg_stream_handles_died();                                                                  \
        if (res == CUDA_SUCCESS)                                                                   \
            ended_locked(ctx);                                                                     \
        pthread_mutex_unlock(&ctx_mu);                                                             \
        if (res == CUDA_SUCCESS)                                                                   \
            ended(ctx);                                                                            \
        return res;                                                                                \
    }
CTX_DESTROY(cuCtxDestroy)
CTX_DESTROY(cuCtxDestroy_v2)

/* One more use of the current context (deprecated API). */
SG_EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    REAL(cuCtxAttach);
    if (sg_in_hook || !sg_configured())
        return real_(pctx, flags);
    pthread_mutex_lock(&ctx_mu);
    CUresult res = real_(pctx, flags);
    if (res == CUDA_SUCCESS && pctx)
        use_add(*pctx);
    pthread_mutex_unlock(&ctx_mu);
    return res;
}

/* One use fewer: at zero the driver destroyed the context, which ends here as at cuCtxDestroy. */
SG_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    REAL(cuCtxDetach);
    if (sg_in_hook || !sg_configured()) {
        sg_stream_handles_died();
        CUresult r = real_(ctx);
        sg_stream_handles_died();
        return r;
    }
    pthread_mutex_lock(&ctx_mu);
    sg_stream_handles_died();
    CUresult res = real_(ctx);
    sg_stream_handles_died();
    bool gone = res == CUDA_SUCCESS && !use_drop(ctx);
    if (gone)
        ended_locked(ctx);
    pthread_mutex_unlock(&ctx_mu);
    if (gone)
        ended(ctx);
    return res;
}

/* The primary context of dev if it is active (looked up without changing its state), or NULL. */
static CUcontext active_primary(CUdevice dev)
{
    unsigned flags;
    int active = 0;
    CUcontext ctx = NULL;
    if (!SG_REAL(cuDevicePrimaryCtxGetState) || !SG_REAL(cuDevicePrimaryCtxRetain) ||
        !SG_REAL(cuDevicePrimaryCtxRelease_v2) ||
        SG_REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) != CUDA_SUCCESS || !active)
        return NULL;
    if (SG_REAL(cuDevicePrimaryCtxRetain)(&ctx, dev) != CUDA_SUCCESS)
        return NULL;
    SG_REAL(cuDevicePrimaryCtxRelease_v2)(dev); /* the reference we just took */
    return ctx;
}

static bool primary_gone(CUdevice dev)
{
    unsigned flags;
    int active = 1;
    return SG_REAL(cuDevicePrimaryCtxGetState) &&
           SG_REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

/* The retain that finds the primary context inactive creates it: measured and admitted as
 * cuCtxCreate is (refused: released again, which destroys it). */
SG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REAL(cuDevicePrimaryCtxRetain);
    if (sg_in_hook || !sg_configured())
        return real_(pctx, dev);
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED; /* fail closed */
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&ctx_mu);
    sg_in_hook++;
    unsigned flags;
    int active = 0;
    bool creates = dev >= 0 && dev < MAX_ORDINALS && SG_REAL(cuDevicePrimaryCtxGetState) &&
                   SG_REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS &&
                   !active;
    struct measure m;
    if (creates)
        measure_begin(dev, &m);
    CUresult res = real_(pctx, dev);
    if (res == CUDA_SUCCESS && creates) {
        int idx;
        uint64_t bytes;
        res = measure_admit(dev, &m, &idx, &bytes);
        if (res == CUDA_SUCCESS) {
            forget_primary(dev); /* a stale figure (a teardown we did not see) */
            primary[dev] = (struct ctx_charge){.ctx = *pctx, .idx = idx, .bytes = bytes};
        } else {
            if (SG_REAL(cuDevicePrimaryCtxRelease_v2))
                SG_REAL(cuDevicePrimaryCtxRelease_v2)(dev);
            sg_stream_handles_died();
            *pctx = NULL;
        }
    }
    sg_in_hook--;
    pthread_mutex_unlock(&ctx_mu);
    return res;
}

#define PRIMARY_END(name)                                                                          \
    SG_EXPORT CUresult name(CUdevice dev)                                                          \
    {                                                                                              \
        REAL(name);                                                                                \
        if (sg_in_hook || !sg_configured())                                                        \
            return real_(dev);                                                                     \
        pthread_mutex_lock(&ctx_mu);                                                               \
        sg_in_hook++;                                                                              \
        CUcontext ctx = active_primary(dev);                                                       \
        sg_stream_handles_died();                                                                  \
        CUresult res = real_(dev);                                                                 \
        sg_stream_handles_died();                                                                  \
        bool gone = res == CUDA_SUCCESS && primary_gone(dev);                                      \
        if (gone && ctx)                                                                           \
            sg_credit_context(ctx);                                                                \
        if (gone)                                                                                  \
            forget_primary(dev);                                                                   \
        sg_in_hook--;                                                                              \
        pthread_mutex_unlock(&ctx_mu);                                                             \
        if (res == CUDA_SUCCESS && ctx)                                                            \
            sg_graph_mem_settle_all();                                                             \
        return res;                                                                                \
    }
PRIMARY_END(cuDevicePrimaryCtxRelease)
PRIMARY_END(cuDevicePrimaryCtxRelease_v2)
PRIMARY_END(cuDevicePrimaryCtxReset)
PRIMARY_END(cuDevicePrimaryCtxReset_v2)
