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
 * This file is a process's side: its holds and what they are charged (the GPU time its work
 * used: the wall time held less the idle time after syncs that drained it).  Its entries in the
 * region, the limits it follows and the region it maps are arbentry.h; who is granted next, for
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
/* How much longer than our usual kernel our work in flight may take to end and still count as
 * having run straight through (the sync's return, a late wake-up): less than a preemption's two
 * switches and the preempting holder's kernel (ran_straight). */
#define RAN_STRAIGHT_SLACK_NS 50000ull
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

static void count_preemption(struct sg_gpu *g)
{
    struct sg_arbiter *a = g->a;
    __atomic_fetch_add(&a->clients[g->client].preemptions, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&a->tenants[g->tenant].preemptions, 1, __ATOMIC_RELAXED);
    if (g->usage)
        __atomic_fetch_add(&g->usage->preemptions, 1, __ATOMIC_RELAXED);
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
static void lend_locked(struct sg_arbiter *a, const struct sg_gpu *g, int c, int next, uint64_t now);

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
        lend_locked(a, g, c, next, now);
    return a->token;
}

void sg_arb_forget_token(struct sg_gpu *g)
{
    __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g->since_sync, 0, __ATOMIC_RELAXED);
    sg_arb_hold_reset(g);
    __atomic_store_n(&g->revoked, 0, __ATOMIC_SEQ_CST);
}

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
         * kept it waiting ~1 ms per handover on a 2-core VM, a third of the card). */
        if (handed)
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

/* How long a holder that ended a burst may stay idle before a lower class gets the card. */
uint64_t sg_arb_idle_grace(uint64_t q)
{
    return q / 20;
}

/* How long a holder that drained its work may stay idle before a waiter of its own class gets
 * the card: twice its usual idle time between bursts and 50 µs, at most the idle grace.  A loop
 * that syncs and launches again keeps the card through its host time; a service that waits for
 * its next request gives it up (at once when it usually idles longer than the grace), where it
 * used to keep it until its quantum ended and it had been idle for half a quantum. */
#define SAME_CLASS_GRACE_MIN_NS 50000ull
static uint64_t same_class_grace(const struct sg_gpu *g, uint64_t q)
{
    uint64_t grace = 2 * __atomic_load_n(&g->gap_ns, __ATOMIC_RELAXED) + SAME_CLASS_GRACE_MIN_NS;
    return grace < sg_arb_idle_grace(q) ? grace : sg_arb_idle_grace(q);
}

/* Two readings of our idle times after a drained sync (note_gap), one per kind of waiter the
 * card may go to at once instead of after a grace.  Handing on within our class risks little
 * (virtual time gives us our turn back), so the moving average will do: we usually idle longer
 * than any grace.  Handing on to a lower class risks our next burst waiting behind an offline
 * kernel, so every one of our last LONG_GAPS_AT_ONCE idle times must have lasted the grace: a
 * request of several bursts with short host time between them never qualifies. */
#define LONG_GAPS_AT_ONCE 4
static bool usually_idles_long(const struct sg_gpu *g, uint64_t grace)
{
    return __atomic_load_n(&g->gap_ns, __ATOMIC_RELAXED) >= grace;
}

static bool always_idles_long(const struct sg_gpu *g)
{
    return __atomic_load_n(&g->long_gaps, __ATOMIC_RELAXED) >= LONG_GAPS_AT_ONCE;
}

/* Loans of a holder's host gap.  A holder that drained its work and keeps the card by virtual
 * time (its next burst follows its own) leaves the card idle through its host time between the
 * bursts, where the GPU's time-slicing would have run a waiter's work: with 200 µs of host time
 * between bursts of 4 x 0.5 ms at 30/70, four points of the card, and no arbiter that hands the
 * card on only at a burst's end can get them back ("turns", docs/design/arbitration.md).  So
 * the holder lends the card to the best waiter of its class for the gap: the waiter keeps one
 * kernel in flight and hands the card back as that kernel ends once the holder asked again (at
 * its bound sync's return, or its watcher, woken by the request, while it is in its host code).
 * The waiter pays for what it ran and
 * the holder for nothing, so the split stays virtual time's; the holder waits up to one of the
 * waiter's kernels, which costs the card nothing.
 *
 * Only for gaps of at least LEND_MIN_GAP_NS, LEND_GAPS_IN_A_ROW of them in a row: a loan costs
 * two hand-overs (10-45 µs each on the simulated GPU's VM), which a gap of 20 µs does not repay,
 * and a single long gap is a hiccup, not host time (lending at every hiccup, a borrower's
 * spinning syncs made the next gaps long too on a 2-core VM).  Never by an online holder (its
 * next burst would wait for the borrower's kernel).  And only while the waiter is ahead of the
 * holder in virtual time by less than a quarter quantum of its own GPU time
 * (sg_arb_may_lend_locked): a waiter whose kernels outlast the holder's bursts would otherwise
 * take the card at every one of them. */
#define LEND_MIN_GAP_NS 100000ull
#define LEND_GAPS_IN_A_ROW 4

/* A queued loan (arbqueue.c) costs the GPU's two switches and no wake-up: gaps of 20 µs and
 * more repay it on the simulated GPU (10 µs a switch). */
#define LEND_QUEUED_MIN_GAP_NS 20000ull

bool sg_arb_lends_queued(const struct sg_gpu *g)
{
    return __atomic_load_n(&g->qlend_gaps, __ATOMIC_RELAXED) >= LEND_GAPS_IN_A_ROW;
}

static bool lends_its_gap_locked(struct sg_arbiter *a, const struct sg_gpu *g, int c, int best,
                                 uint64_t now)
{
    return __atomic_load_n(&g->lend_gaps, __ATOMIC_RELAXED) >= LEND_GAPS_IN_A_ROW &&
           sg_arb_may_lend_locked(a, c, best, now);
}

/* Under the region lock, in our release: the grant to `next` is a loan (a waiter of our class
 * behind us in virtual time), until our grace after the drain at most. */
static void lend_locked(struct sg_arbiter *a, const struct sg_gpu *g, int c, int next, uint64_t now)
{
    if (a->clients[next].priority != a->clients[c].priority ||
        sg_arb_better_locked(a, next, c, false))
        return; /* the pick moved meanwhile: an ordinary hand-over */
    __atomic_store_n(&a->clients[next].yield, SG_ARB_YIELD_LOAN, __ATOMIC_RELAXED);
    a->quantum_end_ns = now + same_class_grace(g, sg_arb_quantum(a));
    a->loans++;
}

/* Under the region lock, at a sync that drained our work with a lower class waiting: is our
 * request over, so that the card may go to the lower class now rather than after the idle
 * grace?  Yes when every request is one burst (always_idles_long: the card would idle through
 * the whole grace for nothing, 0.5 ms a request, and a service of 170 requests a second beside
 * an offline job kept the card 80% busy) and the predicted next request is further than the
 * grace away (the hold-back keeps the card free for it).  Requests that come at random (no
 * trusted prediction) keep the grace. */
static bool between_requests_locked(struct sg_arbiter *a, const struct sg_gpu *g, uint64_t now)
{
    if (!always_idles_long(g))
        return false;
    uint64_t late = 0, launch_by = 0;
    return sg_predict_next(a, now, sg_arb_idle_grace(sg_arb_quantum(a)), &late, &launch_by) == 0 &&
           launch_by != 0;
}

/* Under the region lock: watch our burst's end, handing the card on if no launch follows
 * within `grace` (the watcher, watch_one).  Within our class (`lazy`) the watcher is woken only
 * when it would not look on its own (it polls while others wait, sg_arb_watch_poll_ns) by the
 * grace's end and one poll: a loop that syncs and launches again keeps the card every time,
 * and waking the watcher at each of its bursts put a futex wake (an IPI to the other CPU of a
 * VM) into its own gap between bursts, 8-9 µs of card idle per burst on the simulated GPU
 * (docs/design/arbitration.md, "Turns").  A holder that does go idle hands on at most one poll
 * later; toward a lower class (an online request's end) the watcher is woken at once. */
static void watch_burst_end_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t now,
                                   uint64_t grace, bool lazy)
{
    __atomic_store_n(&g->grace_ns, grace, __ATOMIC_RELAXED);
    __atomic_store_n(&g->burst_end_ns, now, __ATOMIC_SEQ_CST);
    if (lazy && sg_arb_watcher_due() <= now + grace + sg_arb_watch_poll_ns(sg_arb_quantum(a)))
        return;
    __atomic_fetch_add(&a->clients[c].watch, 1, __ATOMIC_RELEASE);
    sg_futex_wake(&a->clients[c].watch, true);
}

/* At the end of a quantum or of a burst: keep the token (renewing the quantum when it is over)
 * or hand it on.  Charges the time held so far. */
enum sg_arb_decision sg_arb_decide(struct sg_gpu *g, uint64_t now, bool burst_end)
{
    struct sg_arbiter *a = g->a;
    int c = g->client;
    uint32_t yield = __atomic_load_n(&a->clients[c].yield, __ATOMIC_RELAXED);
    if (yield == SG_ARB_YIELD_CLASS)
        return SG_ARB_PREEMPT;
    bool quantum_over = now >= __atomic_load_n(&g->qend, __ATOMIC_RELAXED);
    if (burst_end && !yield && !__atomic_load_n(&a->waiting, __ATOMIC_RELAXED))
        return SG_ARB_KEEP;
    /* Follow a resize here too: a holder whose launches all take the fast path (the watcher
     * renews its quantum) would otherwise keep its old share, policy and ceiling. */
    struct sg_limits_device lim;
    uint64_t gen;
    sg_arb_device_limits(g, true, &lim, &gen);
    bool native = __atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_NATIVE;
    if (native)
        return SG_ARB_RELEASE; /* resized to native: the card is no longer arbitrated for us */
    sg_ho_settle(g, now);
    if (sg_arb_lock(a) < 0)
        return SG_ARB_KEEP;
    enum sg_arb_decision d = SG_ARB_KEEP;
    if (!sg_arb_holding(g)) {
        sg_arb_unlock(a);
        return SG_ARB_RELEASE; /* lost (taken back): just forget it */
    }
    /* Where our work ended, if a sync drained it: read before the charge restarts the period. */
    uint64_t work_end = burst_end ? __atomic_load_n(&g->drained_at, __ATOMIC_SEQ_CST) : 0;
    sg_arb_charge_locked(a, g, c, now);
    sg_arb_tenant_sync_locked(a, g->tenant, &lim, gen); /* a resize applies from the next quantum */
    struct sg_arb_tenant *t = &a->tenants[g->tenant];
    int best = sg_arb_pick_locked(a, now);
    bool throttled = sg_arb_has_ceiling(t) && t->bucket_ns < sg_arb_min_grant_ns(a);
    /* A sync that drained our work is where handing on costs nothing but the wake-up; one that
     * left work queued (a pipeline's event sync) is no better a place than the quantum's end.
     * At a drained sync the token goes to a better waiter of our class whatever we held: the
     * hand-over's idle (our release, its wake-up and launch: ~10 µs on the simulated GPU) is
     * less than our own gap before our next burst (host code and launch), which keeping the
     * card would leave idle, and virtual time still decides who runs next, so the split holds.
     * (Until issue 33 a holder kept the card a quarter quantum first: every one of its bursts
     * in that time left its own gap idle, 0.5-7 points of the card with bursts under 2 ms.) */
    bool drained = burst_end && __atomic_load_n(&g->drained_at, __ATOMIC_SEQ_CST);
    if (drained && work_end && a->clients[c].priority == SG_PRIORITY_ONLINE)
        sg_predict_note_end(a, work_end); /* a closed-loop service's host time starts here */
    if (yield == SG_ARB_YIELD_TURN) {
        /* A returning waiter of our class is behind: our turn ends a quarter quantum after
         * our grant (now, if that has passed). */
        __atomic_store_n(&a->clients[c].yield, 0, __ATOMIC_RELAXED);
        uint64_t turn_end = a->grant_ns + sg_arb_quantum(a) / 4;
        if (turn_end < a->quantum_end_ns) {
            a->quantum_end_ns = turn_end > now ? turn_end : now;
            __atomic_store_n(&g->qend, a->quantum_end_ns, __ATOMIC_RELAXED);
        }
        quantum_over = now >= a->quantum_end_ns;
    }
    if (best >= 0 && a->clients[best].priority > a->clients[c].priority)
        d = SG_ARB_RELEASE; /* a higher class waits */
    else if (yield == SG_ARB_YIELD_LOAN) {
        /* Lent the card: hand it back as soon as a waiter is ahead of us (the lender came
         * back); once the lender's grace is over it is ours like any hold. */
        if (best >= 0 && sg_arb_better_locked(a, best, c, true))
            d = SG_ARB_RELEASE;
        else if (quantum_over)
            __atomic_store_n(&a->clients[c].yield, 0, __ATOMIC_RELAXED);
    } else if (best >= 0 && burst_end && a->clients[best].priority < a->clients[c].priority) {
        /* Our burst may be over: if no launch follows within the idle grace, the watcher hands
         * the card to the lower class (a loop that syncs and launches again keeps it), at once
         * when our request is surely over (between_requests_locked). */
        if (drained && between_requests_locked(a, g, now))
            d = SG_ARB_RELEASE;
        else
            watch_burst_end_locked(a, g, c, now, sg_arb_idle_grace(sg_arb_quantum(a)), false);
    } else if ((quantum_over || burst_end) && throttled)
        d = SG_ARB_RELEASE;
    else if (best >= 0 && (quantum_over || drained) && sg_arb_better_locked(a, best, c, true))
        d = SG_ARB_RELEASE; /* same class, further behind in virtual time */
    else if (best >= 0 && drained) {
        /* Same class, and we keep the card by virtual time, but none of our work is on it. */
        if (usually_idles_long(g, sg_arb_idle_grace(sg_arb_quantum(a))))
            d = SG_ARB_RELEASE; /* hand on now rather than idle through a grace */
        else if (lends_its_gap_locked(a, g, c, best, now))
            d = SG_ARB_LEND;
        else
            watch_burst_end_locked(a, g, c, now, same_class_grace(g, sg_arb_quantum(a)), true);
    }
    if (d == SG_ARB_KEEP && quantum_over) {
        a->quantum_end_ns = now + sg_arb_quantum_len_locked(a, c, now);
        if (a->quantum_end_ns <= now)
            d = SG_ARB_RELEASE;
        __atomic_store_n(&g->qend, a->quantum_end_ns, __ATOMIC_RELAXED);
    }
    bool renewed = d == SG_ARB_KEEP && quantum_over;
    sg_arb_note_online_locked(a, c, now);
    sg_arb_unlock(a);
    if (renewed)
        sg_bc_renew(g); /* a driver call: outside the region lock (the caller holds g->mu) */
    return d;
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
        bool throttled = sg_arb_has_ceiling(t) && !sg_arb_eligible_locked(a, t, now);
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

/* Our usual idle time between bursts: from the end of the work a drained sync waited for to
 * our next launch, held or not (a holder that hands on at once must still see its gaps shrink).
 * One sample counts at most four idle graces: a host hiccup moves it, but not for long. */
void sg_arb_note_gap(struct sg_gpu *g, uint64_t now)
{
    uint64_t from = __atomic_exchange_n(&g->idle_from, 0, __ATOMIC_RELAXED);
    if (!from || now <= from || !g->a)
        return;
    uint64_t sample = now - from, grace = sg_arb_idle_grace(sg_arb_quantum(g->a)), most = 4 * grace;
    uint32_t longs = __atomic_load_n(&g->long_gaps, __ATOMIC_RELAXED);
    __atomic_store_n(&g->long_gaps, sample < grace ? 0 : longs < UINT32_MAX ? longs + 1 : longs,
                     __ATOMIC_RELAXED);
    uint32_t lends = __atomic_load_n(&g->lend_gaps, __ATOMIC_RELAXED);
    __atomic_store_n(&g->lend_gaps,
                     sample < LEND_MIN_GAP_NS ? 0 : lends < UINT32_MAX ? lends + 1 : lends,
                     __ATOMIC_RELAXED);
    uint32_t qlends = __atomic_load_n(&g->qlend_gaps, __ATOMIC_RELAXED);
    __atomic_store_n(&g->qlend_gaps,
                     sample < LEND_QUEUED_MIN_GAP_NS ? 0 : qlends < UINT32_MAX ? qlends + 1 : qlends,
                     __ATOMIC_RELAXED);
    if (sample > most)
        sample = most;
    uint64_t avg = __atomic_load_n(&g->gap_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&g->gap_ns, avg ? (avg * 3 + sample) / 4 : sample, __ATOMIC_RELAXED);
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
