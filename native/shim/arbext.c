/*
 * Work of another API on an arbitrated GPU: the Vulkan layer (layer_api.c) submits under the
 * same token as CUDA launches.  A submission takes the launch's fast path (shim.h
 * sg_arb_may_launch) or holds the token as a launch does (arbiter.c,
 * sg_arb_hold_for_launch_locked), and registers the device's drain in the hold, which the
 * release waits for (no CUDA sync waits for Vulkan work).
 */
#include "arbentry.h"
#include "arbhold.h"
#include "arbregion.h"
#include "shim.h"

/* The fast path (shim.h sg_arb_may_launch, as a launch's), and this drain registered in the
 * current hold (*hold).  True with launching held. */
static bool ext_fast(struct sg_gpu *g, uint64_t hold)
{
    if (__atomic_load_n(&g->hold_seq, __ATOMIC_ACQUIRE) != hold)
        return false;
    __atomic_fetch_add(&g->launching, 1, __ATOMIC_SEQ_CST);
    uint64_t tok = __atomic_load_n(&g->token, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g->hold_seq, __ATOMIC_ACQUIRE) == hold &&
        sg_arb_may_launch(g, tok, &sg_arb_tls.clk))
        return true;
    __atomic_fetch_sub(&g->launching, 1, __ATOMIC_RELEASE);
    return false;
}

/* Under g->mu, the token held: drain_fn(arg) is waited for at this hold's release. */
static int register_ext_locked(struct sg_gpu *g, void (*drain_fn)(void *), void *arg, struct sg_err *e)
{
    for (int i = 0; i < g->next_ext; i++)
        if (g->ext[i].fn == drain_fn && g->ext[i].arg == arg)
            return 0;
    if (g->next_ext == SG_MAX_EXT_DRAINS)
        return sg_fail(e, SG_E_NOMEM, "more than %d Vulkan devices on one GPU in one process",
                       SG_MAX_EXT_DRAINS);
    g->ext[g->next_ext++] = (struct sg_ext_drain){drain_fn, arg};
    return 0;
}

int sg_arb_ext_enter(const uint8_t uuid[16], void (*drain_fn)(void *), void *arg, uint64_t *hold,
                     struct sg_gpu **cache, uint64_t *gen, struct sg_gpu **gate)
{
    *gate = NULL;
    struct sg_gpu *g = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (g && __atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_NATIVE) {
        if (__atomic_load_n(&sg_limits_map->generation, __ATOMIC_ACQUIRE) == __atomic_load_n(gen, __ATOMIC_RELAXED))
            return 0;
    } else if (g && ext_fast(g, __atomic_load_n(hold, __ATOMIC_RELAXED))) {
        *gate = g;
        return 0;
    }
    if (sg_mode() != SG_MODE_ACTIVE)
        return -1;
    sg_in_hook++;
    struct sg_err e = {0};
    uint64_t now_gen;
    bool arbitrated;
    int rc = sg_arb_gpu_of_uuid(uuid, &g, &now_gen, &arbitrated, &e);
    if (rc < 0 || !g) {
        sg_in_hook--;
        return rc < 0 ? -1 : 0; /* not the tenant's GPU: the layer does not show it */
    }
    __atomic_store_n(cache, g, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g->mu);
    if (__atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_NATIVE) {
        if (g->a && g->client >= 0 && sg_arb_holding(g))
            sg_arb_release(g, false); /* became native on a resize */
        __atomic_store_n(gen, now_gen, __ATOMIC_RELAXED);
        rc = 1;
    } else if (g->a && sg_arb_region_broken(g->a) && !sg_arb_reattach(g)) {
        sg_arb_forget_hold(g); /* unarbitrated until the region is replaced */
        rc = 1;
    } else {
        rc = sg_arb_hold_for_launch_locked(g, &e);
        if (rc == 0)
            rc = register_ext_locked(g, drain_fn, arg, &e);
    }
    if (rc == 0) {
        __atomic_store_n(hold, __atomic_load_n(&g->hold_seq, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_fetch_add(&g->launching, 1, __ATOMIC_SEQ_CST);
        uint64_t now = sg_clock_anchor(&sg_arb_tls.clk);
        __atomic_store_n(&g->last_launch, now, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g->drained_at, __ATOMIC_SEQ_CST))
            sg_arb_idle_end(g, now);
        *gate = g;
    }
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
    if (rc < 0) {
        static int said;
        sg_log_once(&said, "Vulkan work refused: %s", e.msg);
    }
    return rc < 0 ? -1 : 0;
}

void sg_arb_ext_drained(struct sg_gpu *g, uint64_t begin, void (*drain_fn)(void *), void *arg)
{
    sg_in_hook++;
    pthread_mutex_lock(&g->mu);
    uint64_t last = __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST);
    bool alone = g->nctx == 0 && g->next_ext == 1 && g->ext[0].fn == drain_fn && g->ext[0].arg == arg;
    if (g->a && sg_arb_holding(g) && alone && last < begin) {
        uint64_t end = sg_mono_ns(); /* the wait's return: no GPU clock for Vulkan work yet */
        __atomic_store_n(&g->idle_from, end, __ATOMIC_RELAXED);
        __atomic_store_n(&g->drained_at, end, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&g->launching, __ATOMIC_SEQ_CST) ||
            __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST) >= begin)
            __atomic_store_n(&g->drained_at, 0, __ATOMIC_SEQ_CST); /* a submission came meanwhile */
    }
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
}

void sg_arb_ext_forget(struct sg_gpu *g, void (*drain_fn)(void *), void *arg)
{
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->next_ext; i++) {
        if (g->ext[i].fn == drain_fn && g->ext[i].arg == arg) {
            g->ext[i] = g->ext[--g->next_ext];
            break;
        }
    }
    pthread_mutex_unlock(&g->mu);
}
