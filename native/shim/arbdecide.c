/*
 * A holder's decisions (arbhold.h): at the end of a quantum or of a burst, keep the card, hand it
 * on, or lend it for the host gap before the next burst; how long a holder that went idle keeps
 * it (the graces); and the program's own gaps between bursts that those decisions read.  Who is
 * granted next and what a hold costs are the region's rules (arbsched.h); the queued forms of
 * the hand-over and the loan, arbqueue.c.  docs/design/arbitration.md, "Turns" and "Loans",
 * gives the reasoning and the measurements.  Caller holds g->mu.
 */
#include "arbentry.h"
#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "futex.h"
#include "predict.h"
#include "shim.h"

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
void sg_arb_lend_locked(struct sg_arbiter *a, const struct sg_gpu *g, int c, int next, uint64_t now)
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
    bool throttled = sg_arb_runs_dry_locked(a, t, 0, now);
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
