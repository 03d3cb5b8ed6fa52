/*
 * Compute arbitration: one token per GPU in the shared arbiter region
 * (<tenant dir>/gpus/<uuid>/arbiter, layout and invariants in abi.h); only the process holding
 * it may have kernels in flight.  docs/design/arbitration.md explains the algorithm and the
 * measurements behind the quantum.
 *
 *   launch (hooks_launch.c)  fast path in shim.h (token held, quantum not over, no yield
 *                            request); otherwise sg_arb_enter_slow below.
 *   slow path                under the process's per-GPU mutex `mu`: claim our client entry,
 *                            follow limits resizes, at the end of a quantum either renew (we
 *                            are still the best candidate) or release (drain, charge, hand
 *                            on), and when we do not hold the token, ask for it and sleep on
 *                            our futex word until it is granted to us.
 *   sync calls               end a burst: hand the token on if a better waiter exists; a sync
 *                            that covered the hold's work marks it drained (arbsync.c).
 *   Vulkan submissions       take the token as launches do (arbext.c).
 *   watcher thread           one per process, started at the first arbitrated launch
 *                            (arbwatch.c): releases a token held past its quantum without
 *                            launches and yields at once to a higher-class request when the
 *                            holder is not launching.
 *
 * This file is a process's side: its holds, how it waits for the token, and what a hold is
 * charged (the GPU time its work used: the wall time held less the idle time after syncs that
 * drained it).  What a holder decides at a quantum's or a burst's end is arbdecide.c; giving the
 * token up (drain, charge, grant) is arbrelease.c; the queued forms, arbqueue.c.  Its entries in
 * the region, the limits it follows and the region it maps are arbentry.h; who is granted next, for
 * how long and what a hold costs its tenant are the scheduling decisions (arbsched.h); the
 * region's lock, its repair and the reaping of dead clients are arbregion.h; the predicted
 * online requests, predict.h.
 *
 * Robustness: a waiter never sleeps longer than LIVENESS_POLL_NS without checking that the
 * holder is alive (its liveness lock, whatever its pid namespace: live.c) and takes the token
 * back from a dead one; a forked child forgets its parent's token and entries; a normal exit
 * releases and frees ours.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arbentry.h"
#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "futex.h"
#include "predict.h"
#include "shim.h"

#define REAP_INTERVAL_NS 100000000ull
#define MIN_SLEEP_NS 100000ull
struct sg_gpu sg_gpus[SG_MAX_DEVICES];
__thread struct sg_arb_tls sg_arb_tls __attribute__((tls_model("initial-exec")));

/* ---- charging our holds (under the region lock; the rules: arbsched.c) ------------------- */

/* The idle time of our hold since `from` that the charge leaves out: what the launches after
 * drained syncs closed (idle_ns), and, while we are still drained, the time since the drain (or
 * `from`).  The open period is then restarted at `now`, unless a launch has come meanwhile. */
static uint64_t idle_take(struct sg_gpu *g, uint64_t from, uint64_t now)
{
    uint64_t idle = __atomic_exchange_n(&g->idle_ns, 0, __ATOMIC_RELAXED);
    uint64_t woke = __atomic_exchange_n(&g->wake_to, 0, __ATOMIC_ACQUIRE);
    if (woke) {
        uint64_t start = __atomic_load_n(&g->wake_from, __ATOMIC_RELAXED);
        start = start > from ? start : from;
        if (woke > start)
            idle += woke - start;
    }
    uint64_t d = __atomic_exchange_n(&g->drained_at, 0, __ATOMIC_SEQ_CST);
    if (!d)
        return idle;
    uint64_t start = d > from ? d : from;
    if (now > start)
        idle += now - start;
    /* Still idle unless a launch came between the exchange and here (it found no mark). */
    if (!__atomic_load_n(&g->launching, __ATOMIC_SEQ_CST) &&
        __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST) <= d) {
        uint64_t zero = 0;
        __atomic_compare_exchange_n(&g->drained_at, &zero, now, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
    }
    return idle;
}

/* Charge the holder client c for the GPU time its work used since its last charge: the wall
 * time held, less the idle time after its syncs that drained the hold (g: ours; NULL when the
 * holder is another process, which is charged the wall time).  Exclusive holds make this the
 * time the card ran its work, up to the lateness of each sync's return. */
void sg_arb_charge_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t now)
{
    struct sg_arb_client *cl = &a->clients[c];
    uint64_t held = now > cl->grant_ns ? now - cl->grant_ns : 0;
    if (g && g->client == c) {
        uint64_t idle = idle_take(g, cl->grant_ns, now);
        held = idle < held ? held - idle : 0;
    }
    if (sg_arb_pay_locked(a, c, held, now)) {
        if (g && g->usage)
            __atomic_fetch_add(&g->usage->gpu_time_ns, held, __ATOMIC_RELAXED);
        a->tenants[cl->tenant].last_active_ns = now;
    }
    cl->grant_ns = now;
}

/* ---- counters ------------------------------------------------------------------------------ */

static void count_wait(struct sg_gpu *g, uint64_t ns, bool throttled)
{
    struct sg_arbiter *a = g->a;
    struct sg_arb_client *cl = &a->clients[g->client];
    struct sg_arb_tenant *t = &a->tenants[g->tenant];
    if (throttled) {
        __atomic_fetch_add(&cl->throttled_ns, ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&t->throttled_ns, ns, __ATOMIC_RELAXED);
        if (g->usage)
            __atomic_fetch_add(&g->usage->throttled_ns, ns, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(&cl->wait_ns, ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&t->wait_ns, ns, __ATOMIC_RELAXED);
        if (g->usage)
            __atomic_fetch_add(&g->usage->wait_ns, ns, __ATOMIC_RELAXED);
    }
}

/* ---- holding and releasing (caller holds g->mu) ----------------------------------------------- */

bool sg_arb_holding(const struct sg_gpu *g)
{
    uint64_t tok = __atomic_load_n(&g->token, __ATOMIC_RELAXED);
    return tok && __atomic_load_n(&g->a->token, __ATOMIC_ACQUIRE) == tok;
}

/* Where this hold's work went: its contexts (drained at release) and its streams, which say
 * what a sync covers (shim.h, SG_HOLD_*). */
static int register_work(struct sg_gpu *g, CUcontext ctx, CUstream s)
{
    bool known = false;
    for (int i = 0; i < g->nctx; i++)
        known |= g->ctxs[i] == ctx;
    if (!known) {
        /* Every context is remembered: one left out would keep running after the release (a
         * cap tenant launching on a ninth context passed its ceiling with a table of 8). */
        size_t cap = (size_t)g->ctx_cap;
        if (sg_grow((void **)&g->ctxs, &cap, (size_t)g->nctx, sizeof *g->ctxs) < 0)
            return SG_E_NOMEM;
        g->ctx_cap = (int)cap;
        g->ctxs[g->nctx++] = ctx;
    }
    if (sg_default_stream(s)) {
        if (g->hold_streams == SG_HOLD_NONE || g->hold_streams == SG_HOLD_DEFAULT)
            g->hold_streams = SG_HOLD_DEFAULT;
        else
            g->hold_streams = SG_HOLD_MIXED;
    } else if (g->hold_streams == SG_HOLD_NONE) {
        g->hold_stream = s;
        g->hold_streams = SG_HOLD_ONE;
    } else if (g->hold_streams != SG_HOLD_ONE || g->hold_stream != s) {
        g->hold_streams = SG_HOLD_MIXED;
    }
    return 0;
}

/* A new hold, or none: nothing launched, nothing idle yet. */
void sg_arb_hold_reset(struct sg_gpu *g)
{
    g->nctx = 0;
    g->next_ext = 0;
    __atomic_fetch_add(&g->hold_seq, 1, __ATOMIC_RELEASE); /* the Vulkan layer registers anew */
    g->hold_streams = SG_HOLD_NONE;
    __atomic_store_n(&g->drained_at, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g->idle_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g->wake_open, false, __ATOMIC_RELAXED);
    __atomic_store_n(&g->wake_to, 0, __ATOMIC_RELEASE);
}

/* Ask for the token and sleep until it is ours. */
static int acquire(struct sg_gpu *g, struct sg_err *e)
{
    struct sg_arbiter *a = g->a;
    int c = g->client;
    struct sg_arb_client *me = &a->clients[c];
    struct sg_limits_device d;
    uint64_t gen;
    sg_arb_device_limits(g, false, &d, &gen);
    uint64_t now = sg_mono_ns();
    if (sg_arb_lock(a) < 0)
        return sg_fail(e, SG_E_CONFIG, "cannot lock the GPU arbiter");
    if (!sg_arb_client_is_mine(me)) {
        /* Our entry was reaped (judged dead by mistake or the region repaired): claim anew. */
        sg_arb_unlock(a);
        g->client = -1;
        int rc = sg_arb_ensure_client(g, e);
        if (rc < 0)
            return rc;
        c = g->client;
        me = &a->clients[c];
        if (sg_arb_lock(a) < 0)
            return sg_fail(e, SG_E_CONFIG, "cannot lock the GPU arbiter");
    }
    struct sg_arb_tenant *t = &a->tenants[g->tenant];
    sg_arb_tenant_sync_locked(a, g->tenant, &d, gen);
    bool arrived = false;
    if (me->state != SG_ARB_WAITING && me->state != SG_ARB_HOLDING) {
        /* Back after idling longer than a grace (me->grant_ns: our last charge, at our last
         * release), not a loop that released and asks again at once. */
        arrived = now - me->grant_ns >= sg_arb_idle_grace(sg_arb_quantum(a));
        bool active[SG_ARB_MAX_TENANTS];
        sg_arb_active_tenants_locked(a, now, active);
        if (!active[g->tenant]) {
            /* (Re)joining: start at the least virtual time of the active tenants of our class,
             * so time spent away is not credit to hoard. */
            uint64_t minv = UINT64_MAX;
            for (int i = 0; i < SG_ARB_MAX_TENANTS; i++)
                if (active[i] && i != g->tenant && a->tenants[i].priority == t->priority &&
                    a->tenants[i].vtime < minv)
                    minv = a->tenants[i].vtime;
            if (minv != UINT64_MAX && t->vtime < minv)
                t->vtime = minv;
        }
        __atomic_store_n(&me->state, SG_ARB_WAITING, __ATOMIC_RELAXED);
        __atomic_store_n(&a->waiting, a->waiting + 1, __ATOMIC_RELAXED);
        me->wait_since_ns = now;
        me->priority = t->priority;
        if (me->priority == SG_PRIORITY_ONLINE)
            sg_predict_note_arrival(a, now);
    }
    t->last_active_ns = now;
    sg_arb_note_online_locked(a, c, now);
    bool slept = false, handed = false, took = false;
    for (;;) {
        int holder = SG_ARB_TOKEN_HOLDER(a->token);
        if (holder == c) {
            handed = slept || took; /* granted by a releasing holder while we slept, or taken */
            break;
        }
        if (holder < 0) {
            int best = sg_arb_pick_locked(a, now);
            if (best >= 0)
                sg_arb_grant_locked(a, best, now);
            if (best == c)
                break;
        } else if (holder < SG_ARB_MAX_CLIENTS) {
            struct sg_arb_client *h = &a->clients[holder];
            if (g->handoffs && g->ho.words_ok && g->ho.words_for == a &&
                sg_arb_take_offer_locked(a, g->handoffs, holder, c, now)) {
                took = true; /* queued behind the holder's work, in its sync (arbqueue.c) */
                continue;
            }
            if (slept && sg_mono_ns() >= sg_arb_last_reap_ns + REAP_INTERVAL_NS) {
                sg_arb_reap_and_pick_locked(a); /* a dead holder's token comes back */
                continue;
            }
            uint64_t t_now = sg_mono_ns();
            if (slept && t_now > a->quantum_end_ns + SG_ARB_STALL_NS) {
                sg_arb_take_back_locked(a, holder, t_now); /* a stopped holder's token comes back */
                continue;
            }
            if (me->priority > h->priority &&
                __atomic_load_n(&h->yield, __ATOMIC_RELAXED) != SG_ARB_YIELD_CLASS) {
                __atomic_store_n(&h->yield, SG_ARB_YIELD_CLASS, __ATOMIC_RELAXED);
                __atomic_fetch_add(&h->watch, 1, __ATOMIC_RELEASE);
                sg_futex_wake(&h->watch, true);
            } else if (arrived && !slept && me->priority == h->priority &&
                       h->tenant < SG_ARB_MAX_TENANTS && h->tenant != me->tenant &&
                       t->vtime < a->tenants[h->tenant].vtime &&
                       !__atomic_load_n(&h->yield, __ATOMIC_RELAXED)) {
                /* Back from idling (a service's next request) and behind in virtual time: the
                 * holder ends its turn a quarter quantum after its grant, at its next launch or
                 * through its watcher, instead of at the end of its quantum or its next sync. */
                __atomic_store_n(&h->yield, SG_ARB_YIELD_TURN, __ATOMIC_RELAXED);
                __atomic_fetch_add(&h->watch, 1, __ATOMIC_RELEASE);
                sg_futex_wake(&h->watch, true);
            } else if (!slept && __atomic_load_n(&h->yield, __ATOMIC_RELAXED) == SG_ARB_YIELD_LOAN &&
                       sg_arb_better_locked(a, c, holder, true)) {
                /* The card is lent for our gap (or another's, behind us): its watcher hands it
                 * back as soon as its kernel in flight is done. */
                __atomic_fetch_add(&h->watch, 1, __ATOMIC_RELEASE);
                sg_futex_wake(&h->watch, true);
            } else if (!slept && me->priority < h->priority) {
                /* A higher-class holder whose burst ended while nobody waited: its watcher
                 * hands the card to us after the idle grace (sg_arb_burst_end). */
                __atomic_fetch_add(&h->watch, 1, __ATOMIC_RELEASE);
                sg_futex_wake(&h->watch, true);
            }
        }
        bool throttled = !sg_arb_eligible_locked(a, t, now);
        uint64_t sleep = LIVENESS_POLL_NS;
        if (throttled) {
            int64_t need = sg_arb_min_grant_ns(a) - t->bucket_ns;
            uint64_t ns = (uint64_t)(need > 0 ? need : 0) * 1000u / t->ceiling_permille;
            sleep = ns < MIN_SLEEP_NS ? MIN_SLEEP_NS : ns < sleep ? ns : sleep;
        }
        if (me->priority == SG_PRIORITY_OFFLINE && now < a->offline_hold_until_ns &&
            a->offline_hold_until_ns - now < sleep)
            sleep = a->offline_hold_until_ns - now; /* the hold-back ends: ask again */
        if (me->priority == SG_PRIORITY_OFFLINE && now < a->offline_quiet_until_ns &&
            a->offline_quiet_until_ns - now < sleep)
            sleep = a->offline_quiet_until_ns - now; /* the quiet window ends: ask again */
        uint32_t w = __atomic_load_n(&me->wake, __ATOMIC_ACQUIRE);
        sg_arb_unlock(a);
        sg_futex_wait(&me->wake, w, sleep, true);
        uint64_t after = sg_mono_ns();
        count_wait(g, after - now, throttled);
        now = after;
        slept = true;
        if (sg_arb_lock(a) < 0)
            return sg_fail(e, SG_E_CONFIG, "cannot lock the GPU arbiter");
        if (!sg_arb_client_is_mine(me) || me->state == SG_ARB_IDLE) {
            /* Repaired or reaped while we slept: ask again from the top. */
            sg_arb_unlock(a);
            return acquire(g, e);
        }
    }
    if (handed && a->last_release_ns && a->grant_ns >= a->last_release_ns) {
        a->handovers++;
        a->handover_idle_ns += now - a->last_release_ns;
    }
    __atomic_store_n(&g->qend, a->quantum_end_ns, __ATOMIC_RELAXED);
    sg_arb_hold_reset(g);
    sg_ho_granted_locked(g, c); /* queued behind the last holder's work? */
    if (g->handoffs && g->ho.words_ok && g->ho.words_for == a)
        g->handoffs[c].flags |= SG_ARB_HO_WAITS; /* it may be granted queued */
    g->ho.contended = slept || took; /* others hold the card too: offer it at our syncs */
    /* Nothing of ours runs until our first launch: the wake-up is not ours to pay. */
    __atomic_store_n(&g->wake_open, true, __ATOMIC_RELAXED);
    __atomic_store_n(&g->drained_at, me->grant_ns ? me->grant_ns : now, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g->token, a->token, __ATOMIC_RELAXED);
    sg_arb_unlock(a);
    sg_arb_kick_watcher();
    return 0;
}

/* ---- the slow path ------------------------------------------------------------------------- */

uint32_t sg_stream_epoch;

void sg_stream_handles_died(void)
{
    __atomic_fetch_add(&sg_stream_epoch, 1, __ATOMIC_RELEASE);
}

/* The context and device the work of a launch on stream s goes to.  1: none (no current
 * context for a default stream: the driver refuses the launch itself); <0: a CUresult negated,
 * the stream is not one the driver knows. */
static int work_target(CUstream s, CUcontext *ctx, CUdevice *dev)
{
    *ctx = NULL;
    if (sg_default_stream(s)) {
        if (!SG_REAL(cuCtxGetCurrent) || SG_REAL(cuCtxGetCurrent)(ctx) != CUDA_SUCCESS || !*ctx ||
            sg_current_ordinal(dev) != CUDA_SUCCESS)
            return 1;
        return 0;
    }
    CUresult res = SG_REAL(cuStreamGetCtx) ? SG_REAL(cuStreamGetCtx)(s, ctx) : CUDA_ERROR_NOT_FOUND;
    if (res != CUDA_SUCCESS)
        return -(int)res; /* fail closed: never launch ungated on a stream we cannot place */
    res = (CUresult)sg_stream_ordinal(s, dev);
    return res == CUDA_SUCCESS ? 0 : -(int)res;
}

/* Under g->mu.  Our work would still run when the next online request is due: give the token
 * up now and let no offline client start until the request came (or its predicted instant +
 * late). */
static void hold_back_locked(struct sg_gpu *g, uint64_t until)
{
    struct sg_arbiter *a = g->a;
    __atomic_store_n(&g->launch_by, 0, __ATOMIC_RELAXED);
    if (g->client < 0 || !sg_arb_holding(g) || sg_arb_lock(a) != 0)
        return;
    uint64_t now = sg_mono_ns();
    bool hold = sg_predict_holdback_allowed(a, now);
    if (hold && until > a->offline_hold_until_ns) {
        a->offline_hold_until_ns = until;
        a->holdbacks++;
        a->holdback_ns += until > now ? until - now : 0;
    }
    sg_arb_unlock(a);
    if (hold)
        sg_arb_release(g, false);
}

void sg_arb_hold_back(struct sg_gpu *g, uint64_t until)
{
    sg_in_hook++;
    pthread_mutex_lock(&g->mu);
    hold_back_locked(g, until);
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
}

/* Under g->mu: an offline launch after its launch_by (its thread was descheduled, or the
 * program's host code ran long, after the bound sync allowed it): hold back now if the
 * predicted request is still ahead of the work. */
static void hold_back_if_due_locked(struct sg_gpu *g, uint64_t now)
{
    uint64_t late = 0;
    uint64_t est = __atomic_load_n(&g->kernel_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&g->launch_by, 0, __ATOMIC_RELAXED);
    uint64_t next = sg_predict_next(g->a, now, est, &late, NULL);
    if (next)
        hold_back_locked(g, next + late);
}

/* Under g->mu: hold g's token for a launch now: acquire it, be held back before a predicted
 * online request, hand it on at the quantum's end as the policies decide.  0 held; 1
 * unarbitrated (the region broke on the way); < 0 an error. */
int sg_arb_hold_for_launch_locked(struct sg_gpu *g, struct sg_err *e)
{
    if (g->ho.offered)
        sg_arb_offer_end(g); /* a launch after the offer is not behind its word: end it first */
    sg_arb_note_gap(g, sg_mono_ns());
    int rc = sg_arb_ensure_client(g, e);
    while (rc == 0) {
        if (!sg_arb_holding(g)) {
            __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
            rc = acquire(g, e);
            continue;
        }
        uint64_t now = sg_mono_ns();
        uint64_t by = __atomic_load_n(&g->launch_by, __ATOMIC_RELAXED);
        if (by && now >= by) {
            hold_back_if_due_locked(g, now);
            continue; /* held back: ask again (granted after the request) */
        }
        bool over = now >= __atomic_load_n(&g->qend, __ATOMIC_RELAXED);
        bool yield = __atomic_load_n(&g->a->clients[g->client].yield, __ATOMIC_RELAXED);
        if (!over && !yield)
            break;
        enum sg_arb_decision d = sg_arb_decide(g, now, false);
        if (d == SG_ARB_KEEP)
            break;
        sg_arb_hand_on(g, d);
    }
    if (rc < 0 && g->a && sg_arb_region_broken(g->a)) {
        sg_arb_forget_hold(g); /* the lock timed out on the way: this launch goes unarbitrated */
        rc = 1;
    }
    return rc;
}

CUresult sg_arb_enter_slow(struct sg_gate *gt, CUstream s)
{
    gt->g = NULL;
    if (sg_mode() != SG_MODE_ACTIVE)
        return CUDA_ERROR_NOT_PERMITTED;
    uint32_t epoch = __atomic_load_n(&sg_stream_epoch, __ATOMIC_ACQUIRE);
    CUcontext ctx;
    CUdevice dev;
    sg_in_hook++;
    int where = work_target(s, &ctx, &dev);
    if (where != 0) {
        sg_in_hook--;
        return where > 0 ? CUDA_SUCCESS : (CUresult)-where;
    }
    struct sg_err e = {0};
    struct sg_gpu *g;
    uint64_t gen;
    int rc = sg_arb_gpu_of_ordinal(dev, &g, &gen, &e);
    if (rc < 0 || !g) {
        sg_in_hook--;
        return rc < 0 ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;
    }
    struct sg_arb_tls *t = &sg_arb_tls;
    if (__atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_NATIVE) {
        pthread_mutex_lock(&g->mu);
        if (g->a && g->client >= 0 && sg_arb_holding(g))
            sg_arb_release(g, false); /* became native on a resize */
        pthread_mutex_unlock(&g->mu);
        *t = (struct sg_arb_tls){.ctx = ctx, .stream = sg_default_stream(s) ? NULL : s,
                                 .epoch = epoch, .g = g, .gen = gen};
        sg_in_hook--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g->mu);
    if (g->a && sg_arb_region_broken(g->a) && !sg_arb_reattach(g)) {
        sg_arb_forget_hold(g); /* unarbitrated until the region is replaced */
        pthread_mutex_unlock(&g->mu);
        sg_in_hook--;
        return CUDA_SUCCESS;
    }
    if (g->handoffs && g->ho.words_for != g->a &&
        __atomic_load_n(&g->a->handoff, __ATOMIC_RELAXED) == SG_ARB_HANDOFF_QUEUED)
        sg_ho_words(g, ctx); /* once per region: to wait for a holder's word, or write ours */
    rc = sg_arb_hold_for_launch_locked(g, &e);
    if (rc == 0) {
        if (g->nctx == 0)
            sg_bc_hold_start(g, ctx); /* before the hold's first launch, the stream idle */
        sg_ho_gate_launch(g, ctx, s); /* behind a queued hand-over: wait for its work first */
        rc = register_work(g, ctx, s);
    }
    if (rc == 0) {
        *t = (struct sg_arb_tls){.ctx = ctx, .stream = sg_default_stream(s) ? NULL : s,
                                 .epoch = epoch, .g = g,
                                 .token = __atomic_load_n(&g->token, __ATOMIC_RELAXED)};
        gt->ctx = ctx;
        __atomic_fetch_add(&g->launching, 1, __ATOMIC_SEQ_CST);
        uint64_t now = sg_clock_anchor(&t->clk);
        __atomic_store_n(&g->last_launch, now, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g->drained_at, __ATOMIC_SEQ_CST))
            sg_arb_idle_end(g, now);
        gt->g = g;
    }
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
    return rc < 0 ? sg_cu_result(rc) : CUDA_SUCCESS;
}

/* ---- fork and exit ---------------------------------------------------------------------- */

static void atfork_child(void)
{
    /* The child holds no token, has no client entry and no watcher; it claims its own at its
     * first launch. */
    sg_arb_entries_fork_child();
    sg_clock_fork_child();
    memset(&sg_arb_self, 0, sizeof sg_arb_self);
    for (int i = 0; i < SG_MAX_DEVICES; i++) {
        struct sg_gpu *g = &sg_gpus[i];
        pthread_mutex_init(&g->mu, NULL);
        g->client = -1;
        g->token = 0;
        g->revoked = 0;
        g->launch_by = 0;
        g->launching = 0;
        g->syncing = 0;
        g->since_sync = 0;
        sg_arb_hold_reset(g);
        sg_ho_fork_child(g);
        g->usage = NULL;
        if (g->live_fd >= 0)
            close(g->live_fd); /* the parent's liveness locks stay the parent's */
        g->live_fd = -1;
    }
    memset(&sg_arb_tls, 0, sizeof sg_arb_tls);
}

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

static void setup_once_fn(void)
{
    for (int i = 0; i < SG_MAX_DEVICES; i++) {
        pthread_mutex_init(&sg_gpus[i].mu, NULL);
        sg_gpus[i].client = -1;
        sg_gpus[i].idx = i;
        sg_gpus[i].live_fd = -1;
    }
    sg_arb_entries_setup();
    pthread_atfork(NULL, NULL, atfork_child);
    sg_clock_baseline(); /* the launch clock's baseline: its rate is known by the first launch */
}

void sg_arb_setup(void)
{
    pthread_once(&setup_once, setup_once_fn);
}

/* The GPU's lock at exit.  Another thread may hold it for a moment (the watcher looks at the
 * token every few milliseconds), so wait a little rather than leave our entry for the reaper;
 * but never for long, and never forever: the holder may be this very thread, exiting from a hook. */
static int exit_lock(pthread_mutex_t *mu)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 100 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return pthread_mutex_timedlock(mu, &until);
}

/* Normal exit: hand the token on and free our entries, so nobody waits for our death to be
 * noticed.  The driver tears our contexts down, so there is nothing to drain. */
__attribute__((destructor)) static void sg_arb_exit_hook(void)
{
    if (!sg_arb_self.pid || sg_arb_self.pid != (int32_t)getpid())
        return;
    for (int i = 0; i < SG_MAX_DEVICES; i++) {
        struct sg_gpu *g = &sg_gpus[i];
        if (!g->a || g->client < 0 || exit_lock(&g->mu) != 0)
            continue;
        struct sg_arbiter *a = g->a;
        if (g->client >= 0 && sg_arb_lock(a) == 0) {
            struct sg_arb_client *cl = &a->clients[g->client];
            if (sg_arb_client_is_mine(cl)) {
                uint64_t now = sg_mono_ns();
                bool held = SG_ARB_TOKEN_HOLDER(a->token) == g->client;
                if (held)
                    sg_arb_charge_locked(a, g, g->client, now);
                sg_arb_free_client_locked(a, g->client);
                if (held) {
                    int next = sg_arb_pick_locked(a, now);
                    if (next >= 0)
                        sg_arb_grant_locked(a, next, now);
                }
            }
            sg_arb_unlock(a);
        }
        g->client = -1;
        __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&g->mu);
    }
}
