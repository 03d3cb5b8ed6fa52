/*
 * Releasing a hold (arbhold.h): a process gives the GPU's token up, at the end of a quantum or a
 * burst as sg_arb_decide (arbdecide.c) says, when a higher class preempts it, or to lend the card
 * for its host gap.  It stops new launches, drains its work (or, preempted early by an online
 * request, lets its kernel in flight run on and pays for what nobody held), charges the hold and
 * grants the best waiter.  docs/design/arbitration.md, "Exact charges" and "Random requests",
 * gives the reasoning and the measurements.  Caller holds g->mu.
 */
#include <sched.h>
#include <time.h>

#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "futex.h"
#include "shim.h"

/* How much longer than our usual kernel our work in flight may take to end and still count as
 * having run straight through (the sync's return, a late wake-up): less than a preemption's two
 * switches and the preempting holder's kernel (ran_straight). */
#define RAN_STRAIGHT_SLACK_NS 50000ull

static void count_preemption(struct sg_gpu *g)
{
    struct sg_arbiter *a = g->a;
    __atomic_fetch_add(&a->clients[g->client].preemptions, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&a->tenants[g->tenant].preemptions, 1, __ATOMIC_RELAXED);
    if (g->usage)
        __atomic_fetch_add(&g->usage->preemptions, 1, __ATOMIC_RELAXED);
}

/* Wait for the work of one context, whichever is current on this thread. */
void sg_arb_sync_context(CUcontext ctx)
{
    if (!SG_REAL(cuCtxPushCurrent_v2) || !SG_REAL(cuCtxPopCurrent_v2) || !SG_REAL(cuCtxSynchronize))
        return;
    if (SG_REAL(cuCtxPushCurrent_v2)(ctx) != CUDA_SUCCESS)
        return; /* destroyed: nothing of it is left to run */
    SG_REAL(cuCtxSynchronize)();
    CUcontext popped;
    SG_REAL(cuCtxPopCurrent_v2)(&popped);
}

/* Wait for every context that launched during this hold, and the other API's work, to finish. */
static void drain(struct sg_gpu *g)
{
    for (int i = 0; i < g->nctx; i++)
        sg_arb_sync_context(g->ctxs[i]);
    for (int i = 0; i < g->next_ext; i++)
        g->ext[i].fn(g->ext[i].arg);
}

/* Our queued work ran `held` ns after we handed the token on: it is ours, so our tenant pays for
 * it (GPU time held, virtual time, ceiling bucket) as if we had still held the card. */
void sg_arb_charge_drain_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t held,
                                uint64_t now)
{
    if (sg_arb_client_is_mine(&a->clients[c]) && sg_arb_pay_locked(a, c, held, now) && g->usage)
        __atomic_fetch_add(&g->usage->gpu_time_ns, held, __ATOMIC_RELAXED);
}

/* Preempted by a higher class: grant it before our drain (the GPU preempts our work in flight
 * at the end of its time slice) rather than after?  online_preempt decides, by our measured
 * kernel length for BY_KERNEL (docs/design/arbitration.md, "Random requests"). */
static bool preempt_early(const struct sg_gpu *g)
{
    uint32_t mode = __atomic_load_n(&g->a->online_preempt, __ATOMIC_RELAXED);
    if (mode == SG_ARB_PREEMPT_EARLY)
        return true;
    return mode == SG_ARB_PREEMPT_BY_KERNEL &&
           __atomic_load_n(&g->kernel_ns, __ATOMIC_RELAXED) >=
               __atomic_load_n(&g->a->preempt_min_kernel_ns, __ATOMIC_RELAXED);
}

/* Our drain ran [from, to] after we released, while others may have held the card (a higher
 * class we handed it to early, or anyone who took the free token meanwhile).  We pay for the part
 * of the drain that nobody held: from the last release (never before ours) to `to`, or to the
 * grant of the current holder; the overlap with a holder is its, unless our kernel ran straight
 * through it (overlap_to_us_locked).  (Charging the whole drain to us as well charged the
 * overlap twice: 7% of the card with 40 ms offline kernels.) */
static uint64_t unheld_locked(const struct sg_arbiter *a, uint64_t handed, uint64_t from,
                              uint64_t to)
{
    if (handed && a->token == handed)
        return 0; /* the preempting holder still holds: the overlap is settled with it */
    if (a->last_release_ns > from)
        from = a->last_release_ns;
    uint64_t end = SG_ARB_TOKEN_HOLDER(a->token) >= 0 && a->grant_ns < to ? a->grant_ns : to;
    return end > from ? end - from : 0;
}

/* Our drain after an early preemption ended at `done` while the higher class we handed to still
 * holds.  When our kernel in flight ran straight through (`through`: it ended within our usual
 * kernel length of its launch, so the GPU did not preempt it to run the new holder's), the card
 * ran our kernel and nothing of the new holder's from its grant to `done`: its work queued
 * behind ours.  That overlap is ours: its charge period now starts at `done` and the overlap is
 * returned, for us to pay.  (Charged to the new holder, a service of 4 x 0.2 ms requests beside
 * 2 ms offline kernels was charged 20-27% of the card where its kernels ran 11-12%.)  When our
 * kernel was preempted, the new holder's work ran inside the overlap, and who ran when is not
 * known here: the new holder keeps it, as before. */
static uint64_t overlap_to_us_locked(struct sg_arbiter *a, uint64_t handed, uint64_t done, bool through)
{
    if (!through || !handed || a->token != handed)
        return 0;
    int h = SG_ARB_TOKEN_HOLDER(handed);
    if (h < 0 || h >= SG_ARB_MAX_CLIENTS || a->clients[h].grant_ns >= done)
        return 0;
    uint64_t overlap = done - a->clients[h].grant_ns;
    a->clients[h].grant_ns = done;
    return overlap;
}

/* Under g->mu, before an early preemption's drain: the burst clock's end event after our work
 * in flight (0: none), so that the drain's end is read from the GPU's clock.  Its return comes
 * later by the sync's wake-up, and an online holder's charge starts at that end
 * (overlap_to_us_locked): read from the return, each request paid a few µs too little and the
 * offline job as much too much. */
static uint32_t end_event(struct sg_gpu *g)
{
    if (g->nctx != 1 || !SG_REAL(cuCtxPushCurrent_v2) || !SG_REAL(cuCtxPopCurrent_v2) ||
        SG_REAL(cuCtxPushCurrent_v2)(g->ctxs[0]) != CUDA_SUCCESS)
        return 0;
    uint32_t seq = sg_bc_sync_begin(g); /* the legacy stream's event wants our context current */
    CUcontext popped;
    SG_REAL(cuCtxPopCurrent_v2)(&popped);
    return seq;
}

/* Did our work in flight end at `done` within our usual kernel length of our last launch (the
 * in-flight bound keeps one kernel on the card, and kernel_ns is its decaying maximum), so that
 * nothing of another context ran between?  Called while we release: no launch can follow. */
static bool ran_straight(const struct sg_gpu *g, uint64_t done)
{
    uint64_t launched = __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST);
    uint64_t k = __atomic_load_n(&g->kernel_ns, __ATOMIC_RELAXED);
    uint64_t slack = k / 8 > RAN_STRAIGHT_SLACK_NS ? k / 8 : RAN_STRAIGHT_SLACK_NS;
    return k && __atomic_load_n(&g->a->offline_inflight_max, __ATOMIC_RELAXED) <= 1 && launched &&
           done <= launched + k + slack;
}

/* An online client hands the token on (its request is over): no offline grant for the quiet
 * window, and the offline waiters are woken to sleep until it ends. */
static void start_quiet_locked(struct sg_arbiter *a, int c, uint64_t now)
{
    uint64_t quiet = __atomic_load_n(&a->offline_quiet_ns, __ATOMIC_RELAXED);
    if (!quiet || a->clients[c].priority != SG_PRIORITY_ONLINE)
        return;
    a->offline_quiet_until_ns = now + quiet;
    a->quiet_windows++;
    for (int i = 0; i < SG_ARB_MAX_CLIENTS; i++) {
        struct sg_arb_client *w = &a->clients[i];
        if (w->pid && w->state == SG_ARB_WAITING && w->priority == SG_PRIORITY_OFFLINE) {
            __atomic_fetch_add(&w->wake, 1, __ATOMIC_RELEASE);
            sg_futex_wake(&w->wake, true);
        }
    }
}

/* Stop new fast-path launches (they take the slow path, which waits for g->mu) and wait for
 * those under way. */
void sg_arb_stop_launches(struct sg_gpu *g)
{
    __atomic_store_n(&g->revoked, 1, __ATOMIC_SEQ_CST);
    for (unsigned spins = 0; __atomic_load_n(&g->launching, __ATOMIC_SEQ_CST); spins++) {
        if (spins < 100)
            sched_yield();
        else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Under the region lock, holding: charge our hold to `now`, free the token and grant the best
 * waiter.  Returns the token word granted, 0 none. */
static uint64_t hand_token_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t now,
                                  enum sg_arb_decision why)
{
    sg_arb_charge_locked(a, g, c, now);
    if (g->ho.offered && g->handoffs) { /* drained now: nothing is left to queue behind */
        g->handoffs[c].offer = 0;
        g->ho.offered = 0;
    }
    __atomic_store_n(&a->clients[c].state, SG_ARB_IDLE, __ATOMIC_RELAXED);
    __atomic_store_n(&a->clients[c].yield, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->token, SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1), __ATOMIC_RELEASE);
    a->last_release_ns = now;
    sg_arb_note_online_locked(a, c, now);
    start_quiet_locked(a, c, now);
    int next = sg_arb_pick_locked(a, now);
    if (next < 0)
        return 0;
    sg_arb_grant_locked(a, next, now);
    if (why == SG_ARB_LEND)
        sg_arb_lend_locked(a, g, c, next, now);
    return a->token;
}

void sg_arb_forget_token(struct sg_gpu *g)
{
    __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g->since_sync, 0, __ATOMIC_RELAXED);
    sg_arb_hold_reset(g);
    __atomic_store_n(&g->revoked, 0, __ATOMIC_SEQ_CST);
}

/* Give the token up: stop new fast-path launches, wait for those under way, drain our work,
 * charge, and hand on to the best waiter.  The hold is exclusive, so the charge is exact: from
 * the grant to the end of the drain the card ran our work and nobody else's, and the next
 * holder's charge starts at its grant, after our drain.
 *
 * (From ABI 1.4 to 1.5 the token was handed on before the drain between share tenants, to save
 * the next holder's wake-up.  The next holder's kernels then queued beside our last ones and
 * the GPU time-sliced the two contexts; our drain was charged to us whole, so whoever took over
 * in the middle of the other's burst got the GPU's slices of it for free.  With tenants that
 * synchronise that took six points from a 70% tenant and gave them to a 30% one, and with bursts
 * longer than the time slice it made any split 50/50: docs/design/arbitration.md, "Exact
 * charges".)
 *
 * The one exception is a higher class's preemption under online_preempt early/by-kernel
 * (early_pre): the request is granted at once and its kernels queue beside our kernel in flight,
 * which the GPU preempts at the end of its time slice.  We pay for the part of the drain nobody
 * held, and for the overlap with the preempting holder when our kernel ran straight through it
 * (its work waited behind ours); when the GPU preempted our kernel the overlap is the holder's. */
static void release_as(struct sg_gpu *g, enum sg_arb_decision why)
{
    bool preempted = why == SG_ARB_PREEMPT;
    sg_arb_stop_launches(g);
    struct sg_arbiter *a = g->a;
    bool ceiling = g->tenant < 0 || g->tenant >= SG_ARB_MAX_TENANTS ||
                   sg_arb_has_ceiling(&a->tenants[g->tenant]);
    bool early_pre = preempted && !ceiling && preempt_early(g);
    if (!early_pre)
        drain(g);
    uint64_t now = sg_mono_ns();
    sg_ho_settle(g, now);
    int c = -1;
    uint64_t handed = 0;
    if (sg_arb_lock(a) == 0) {
        if (sg_arb_holding(g)) {
            c = g->client;
            handed = hand_token_locked(a, g, c, now, why);
            if (handed && early_pre)
                a->early_preemptions++;
        }
        sg_arb_unlock(a);
        /* The card idles until the next holder launches: let it run now if it was woken onto
         * our CPU, rather than after our host code (a program that syncs, hands on and spins
         * kept it waiting ~1 ms per handover on a 2-core VM, a third of the card).  Not an
         * online holder: it releases in its request's last sync, and the yield was its latency
         * (its sync returned only when whatever else ran on its CPU let it: up to 4.9 ms). */
        if (handed && a->clients[c].priority != SG_PRIORITY_ONLINE)
            sched_yield();
    }
    if (early_pre) {
        uint32_t end_seq = end_event(g);
        drain(g);
        uint64_t done = sg_bc_end(g, end_seq, sg_mono_ns());
        if (c >= 0 && done > now && sg_arb_lock(a) == 0) {
            uint64_t owed = unheld_locked(a, handed, now, done) +
                            overlap_to_us_locked(a, handed, done, ran_straight(g, done));
            if (owed)
                sg_arb_charge_drain_locked(a, g, c, owed, done);
            sg_arb_unlock(a);
        }
    }
    if (preempted)
        count_preemption(g);
    sg_arb_forget_token(g);
}

void sg_arb_release(struct sg_gpu *g, bool preempted)
{
    release_as(g, preempted ? SG_ARB_PREEMPT : SG_ARB_RELEASE);
}

void sg_arb_hand_on(struct sg_gpu *g, enum sg_arb_decision d)
{
    if (d != SG_ARB_KEEP)
        release_as(g, d);
}
