/*
 * The ledger and the arbiter for the process's other API layer: the Vulkan layer
 * (libsharegpu_vk.so, native/vklayer) finds these with dlsym, so a process that uses both CUDA
 * and Vulkan is one client of the tenant, with one ledger slot and one arbiter client.  Exported
 * beside the hooks (exports.map); the declarations and the version are in
 * sharegpu/layer_api.h, and a layer that finds another version refuses to run against it.
 *
 * Devices are named by their 16-byte UUID: a Vulkan physical device's deviceUUID is the GPU's
 * UUID (NVIDIA's driver gives the same bytes to CUDA, NVML and Vulkan).
 */
#include "sharegpu/layer_api.h"
#include "shim.h"

SG_EXPORT int sharegpu_layer_api_version(void)
{
    return SHAREGPU_LAYER_API_VERSION;
}

/* 0: no tenant here (pass everything through); 1: a tenant's limits apply; -1: the tenant's
 * configuration is broken (refuse what would be charged). */
SG_EXPORT int sharegpu_ledger_state(void)
{
    if (!sg_configured())
        return 0;
    return sg_mode() == SG_MODE_ACTIVE ? 1 : -1;
}

/* 1 with the device's cap and the tenant's use of it when it is one of the tenant's GPUs, 0 when
 * it is not (hide it), -1 when no answer can be given (see sharegpu_ledger_state). */
SG_EXPORT int sharegpu_ledger_device(const uint8_t uuid[16], uint64_t *cap, uint64_t *used)
{
    if (!uuid || !cap || !used || sharegpu_ledger_state() != 1)
        return -1;
    struct sg_view v;
    struct sg_err e;
    sg_err_clear(&e);
    if (sg_view_device(-1, uuid, &v, &e) < 0)
        return -1;
    *cap = v.cap;
    *used = v.used;
    return v.cap > 0 ? 1 : 0;
}

/* Charges bytes on the device of uuid for the object key, owned by owner (its end credits what
 * it still holds): 0 charged (or no tenant), 1 refused (over the cap, or not the tenant's GPU),
 * -1 broken. */
SG_EXPORT int sharegpu_ledger_charge(const uint8_t uuid[16], uint64_t bytes, uint64_t key,
                                     const void *owner)
{
    if (!uuid)
        return -1;
    struct sg_charge c;
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_reserve_uuid(uuid, bytes, &c, &e);
    if (rc == SG_E_OVERCAP || rc == SG_E_BUSY || rc == SG_E_NOSLOT)
        return 1;
    if (rc < 0)
        return -1;
    c.ctx = (CUcontext)(uintptr_t)owner;
    if (sg_track(SG_KIND_VK, key, &c, &e) < 0) {
        sg_unreserve(&c);
        return 1;
    }
    return 0;
}

/* The charge of old_key moves to new_key (the object's own name, known after the driver's call):
 * 0, or -1 when old_key holds nothing or the move failed (then nothing stays charged). */
SG_EXPORT int sharegpu_ledger_rekey(uint64_t old_key, uint64_t new_key)
{
    struct sg_charge c;
    struct sg_err e;
    sg_err_clear(&e);
    if (!sg_untrack(SG_KIND_VK, old_key, &c))
        return -1;
    if (sg_track(SG_KIND_VK, new_key, &c, &e) < 0) {
        sg_credit(&c);
        return -1;
    }
    return 0;
}

/* The object key ended: what it was charged goes back. */
SG_EXPORT void sharegpu_ledger_credit(uint64_t key)
{
    struct sg_charge c;
    if (sg_untrack(SG_KIND_VK, key, &c))
        sg_credit(&c);
}

/* The owner ended: everything still charged to its objects goes back. */
SG_EXPORT void sharegpu_ledger_credit_owner(const void *owner)
{
    if (owner)
        sg_credit_context((CUcontext)(uintptr_t)owner);
}

/* Before Vulkan work goes to the GPU of uuid: the GPU's token, as for a kernel launch. */
SG_EXPORT int sharegpu_arb_enter(const uint8_t uuid[16], sharegpu_drain_fn drain, void *arg,
                                 struct sharegpu_arb_slot *slot, void **gate)
{
    if (!gate)
        return -1;
    *gate = NULL;
    if (!uuid || !drain || !slot)
        return -1;
    if (!sg_configured())
        return 0;
    struct sg_gpu *g = NULL;
    int rc = sg_arb_ext_enter(uuid, drain, arg, &slot->hold, (struct sg_gpu **)&slot->gpu, &slot->gen, &g);
    *gate = g;
    return rc;
}

/* After the submission: a release may proceed (and drain it). */
SG_EXPORT void sharegpu_arb_exit(void *gate)
{
    struct sg_gpu *g = gate;
    if (g)
        __atomic_fetch_sub(&g->launching, 1, __ATOMIC_RELEASE);
}

/* The device object is going: the current hold no longer drains it. */
SG_EXPORT void sharegpu_arb_forget(struct sharegpu_arb_slot *slot, sharegpu_drain_fn drain, void *arg)
{
    struct sg_gpu *g = slot ? __atomic_load_n((struct sg_gpu **)&slot->gpu, __ATOMIC_ACQUIRE) : NULL;
    if (g)
        sg_arb_ext_forget(g, drain, arg);
}

/* The program waits for its Vulkan work: not idle meanwhile (the watcher's test). */
SG_EXPORT void sharegpu_arb_wait_begin(struct sharegpu_arb_slot *slot, struct sharegpu_arb_wait *w)
{
    struct sg_gpu *g = slot ? __atomic_load_n((struct sg_gpu **)&slot->gpu, __ATOMIC_ACQUIRE) : NULL;
    w->gpu = NULL;
    w->begin = sg_mono_ns();
    if (g && __atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_ARB) {
        __atomic_fetch_add(&g->syncing, 1, __ATOMIC_RELAXED);
        w->gpu = g;
    }
}

SG_EXPORT void sharegpu_arb_wait_end(struct sharegpu_arb_wait *w, int covered, sharegpu_drain_fn drain, void *arg)
{
    struct sg_gpu *g = w ? w->gpu : NULL;
    if (!g)
        return;
    __atomic_fetch_sub(&g->syncing, 1, __ATOMIC_RELAXED);
    if (covered && __atomic_load_n(&g->token, __ATOMIC_RELAXED))
        sg_arb_ext_drained(g, w->begin, drain, arg);
    w->gpu = NULL;
}
