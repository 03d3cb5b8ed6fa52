/*
 * Queued hand-overs: when the token moves before the holder's work has ended (ABI 1.12;
 * docs/design/arbitration.md, "Queued hand-overs"; the driver calls of both sides: handoff.c).
 *
 * A holder whose sync is about to wait for all of its hold's work offers the token: its stream
 * raises its done word after that work, its charge is closed, and its record marked
 * (`offer`).  A waiter of its class that the drained sync would hand the token to takes it at
 * once, queued: the holder itself when that waiter already waits, else the waiter when it comes
 * during the sync (a program that syncs right after its launches, as most do, is inside its sync
 * by the time the one it alternates with asks again).  The new holder's work waits on the GPU
 * for the word; the old holder pays for its work from the offer to its end, read from the GPU's
 * clock when its sync returns.  Launches of the holder's other threads during the offer take the
 * slow path (g->revoked), which ends the offer first: work launched after the word's write is not
 * behind it.
 *
 * A decision made during the sync does not know the holder's work still in flight (charged when
 * its sync returns), nor the in-flight work of a waiter that was itself taken queued: it errs by
 * as much.  So a hold is offered only while its work at a sync (its last `tail`) is at most a
 * quarter quantum, and not handed to a waiter whose own work is still uncharged and longer.
 * (Every hand-over of 16 x 5 ms bursts queued split them 32/68 at 30/70.)
 */
#include <string.h>

#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "shim.h"

/* The most work in flight a queued decision may leave uncharged. */
static uint64_t tail_bound(const struct sg_arbiter *a)
{
    return sg_arb_quantum(a) / 4;
}

void sg_arb_note_tail(struct sg_gpu *g, uint64_t ns)
{
    g->ho.tail_ns = ns;
    g->ho.tail_known = true;
    /* Published only where it is read (a region that drains has no queued decisions): no store
     * to a line every tenant shares at each drained sync. */
    if (g->handoffs && g->client >= 0 && g->client < SG_ARB_MAX_CLIENTS &&
        __atomic_load_n(&g->a->handoff, __ATOMIC_RELAXED) == SG_ARB_HANDOFF_QUEUED)
        __atomic_store_n(&g->handoffs[g->client].tail_ns, ns, __ATOMIC_RELAXED);
}

/* Under the region lock: may holder h's offer go to waiter w at all?  w waits for a grant it
 * can wait for on the GPU (SG_ARB_HO_WAITS); h was not asked to yield other than to hand a loan
 * back (its own decision handles that); and h's work at its sync, not yet charged, is within
 * the bound that keeps the error of counting it at its last measured length small. */
static bool may_queue_to_locked(const struct sg_arbiter *a, const struct sg_arb_handoff *rec,
                                int h, int w)
{
    const struct sg_arb_client *hc = &a->clients[h];
    uint32_t yield = __atomic_load_n(&hc->yield, __ATOMIC_RELAXED);
    return w >= 0 && w != h && (rec[w].flags & SG_ARB_HO_WAITS) &&
           (!yield || yield == SG_ARB_YIELD_LOAN) && hc->tenant < SG_ARB_MAX_TENANTS &&
           __atomic_load_n(&rec[h].tail_ns, __ATOMIC_RELAXED) <= tail_bound(a);
}

/* Under the region lock: would the drained sync of holder h (offering) hand the token to w?
 * The rule of sg_arb_decide at a drained sync, within a class: the quantum is over, h's
 * ceiling bucket runs dry once its work in flight is paid, or w is further behind in virtual
 * time.  (A borrower hands back by the same rule: the lender is ahead of it.) */
static bool hand_to_locked(struct sg_arbiter *a, const struct sg_arb_handoff *rec, int h, int w,
                           uint64_t now)
{
    if (!may_queue_to_locked(a, rec, h, w) || a->clients[w].priority != a->clients[h].priority)
        return false;
    /* The holder's work at its sync is not yet charged, nor a queued waiter's still in flight:
     * each is counted at its last measured length (its tail). */
    uint64_t h_tail = __atomic_load_n(&rec[h].tail_ns, __ATOMIC_RELAXED);
    uint64_t w_tail = a->queued_by == (uint32_t)w + 1 ? __atomic_load_n(&rec[w].tail_ns, __ATOMIC_RELAXED) : 0;
    if (w_tail > tail_bound(a))
        return false;
    return now >= a->quantum_end_ns ||
           sg_arb_runs_dry_locked(a, &a->tenants[a->clients[h].tenant], h_tail, now) ||
           sg_arb_better_pending_locked(a, w, w_tail, h, h_tail, now);
}

/* Under the region lock: holder h's offer goes to waiter w.  h's charge was closed at its
 * offer; the rest of its work is its to pay when its sync returns (sg_arb_offer_end). */
static void queue_to_locked(struct sg_arbiter *a, struct sg_arb_handoff *rec, int h, int w,
                            uint64_t now)
{
    struct sg_arb_client *hc = &a->clients[h];
    __atomic_store_n(&hc->state, SG_ARB_IDLE, __ATOMIC_RELAXED);
    __atomic_store_n(&hc->yield, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->token, SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1), __ATOMIC_RELEASE);
    a->last_release_ns = now;
    sg_arb_note_online_locked(a, h, now);
    a->queued_by = (uint32_t)h + 1; /* the grant below waits for h's word */
    a->queued_seq = rec[h].offer;
    rec[h].taken = rec[h].offer;
    rec[h].offer = 0;
    __atomic_fetch_add(&rec[h].queued, 1, __ATOMIC_RELAXED);
    sg_arb_grant_locked(a, w, now);
}

/* Under the region lock: may holder h, offering and keeping the card by virtual time, lend it
 * to w for its gap instead?  Its offer said its gaps repay it (SG_ARB_HO_LENDS); w's bursts are
 * of several kernels (SG_ARB_HO_SEVERAL: a burst of one lent is a turn, which only the split
 * decides, so the loan buys nothing and costs both sides host work); the rules of a loan hold
 * (sg_arb_may_lend_locked: same class, not online, w ahead of h by less than a quarter quantum
 * of its GPU time); h is not itself a borrower; and w's own work is not still in flight
 * uncharged. */
static bool lend_to_locked(struct sg_arbiter *a, const struct sg_arb_handoff *rec, int h, int w,
                           uint64_t now)
{
    return may_queue_to_locked(a, rec, h, w) && (rec[h].flags & SG_ARB_HO_LENDS) &&
           (rec[w].flags & SG_ARB_HO_SEVERAL) &&
           !__atomic_load_n(&a->clients[h].yield, __ATOMIC_RELAXED) &&
           a->queued_by != (uint32_t)w + 1 && sg_arb_may_lend_locked(a, h, w, now);
}

/* Under the region lock: h's offer goes to w as a loan.  w keeps one kernel in flight and
 * offers the card back after each (sg_arb_loan_bound); h, back from its gap, takes it queued
 * behind that kernel.  A lender that does not come back within its work's tail and an idle
 * grace leaves w an ordinary hold. */
static void lend_queued_locked(struct sg_arbiter *a, struct sg_arb_handoff *rec, int h, int w,
                               uint64_t now)
{
    uint64_t tail = __atomic_load_n(&rec[h].tail_ns, __ATOMIC_RELAXED);
    queue_to_locked(a, rec, h, w, now);
    __atomic_store_n(&a->clients[w].yield, SG_ARB_YIELD_LOAN, __ATOMIC_RELAXED);
    a->quantum_end_ns = now + tail + sg_arb_idle_grace(sg_arb_quantum(a));
    a->loans++;
}

/* Under the region lock: hand h's offer to w, as a hand-over or a loan.  True when it went. */
static bool give_offer_locked(struct sg_arbiter *a, struct sg_arb_handoff *rec, int h, int w,
                              uint64_t now)
{
    if (hand_to_locked(a, rec, h, w, now))
        queue_to_locked(a, rec, h, w, now);
    else if (lend_to_locked(a, rec, h, w, now))
        lend_queued_locked(a, rec, h, w, now);
    else
        return false;
    return true;
}

bool sg_arb_take_offer_locked(struct sg_arbiter *a, struct sg_arb_handoff *rec, int h, int w,
                              uint64_t now)
{
    return rec[h].offer && __atomic_load_n(&a->handoff, __ATOMIC_RELAXED) == SG_ARB_HANDOFF_QUEUED &&
           sg_arb_pick_locked(a, now) == w && give_offer_locked(a, rec, h, w, now);
}

void sg_arb_offer_queued(struct sg_gpu *g, uint64_t last)
{
    struct sg_arbiter *a = g->a;
    CUstream s;
    if (!g->handoffs || g->client < 0 || g->next_ext || g->nctx != 1 || g->ho.offered ||
        !g->ho.contended || !g->ho.tail_known || g->ho.tail_ns > tail_bound(a) ||
        __atomic_load_n(&a->handoff, __ATOMIC_RELAXED) != SG_ARB_HANDOFF_QUEUED ||
        __atomic_load_n(&g->state, __ATOMIC_ACQUIRE) != SG_GPU_ARB || !sg_bc_end_stream(g, &s))
        return;
    sg_arb_stop_launches(g);
    /* A launch of another thread since the sync began is not behind its end event (the launch
     * clock is not CLOCK_MONOTONIC: compared with the last launch seen before it). */
    uint32_t seq = g->ho.seq + 1 ? g->ho.seq + 1 : 1; /* 0 means none */
    if (__atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST) != last ||
        !sg_ho_words(g, g->ctxs[0]) || !sg_ho_record(g, s, seq)) {
        __atomic_store_n(&g->revoked, 0, __ATOMIC_SEQ_CST);
        return;
    }
    g->ho.seq = seq; /* our word reaches it after this work, offered or not */
    uint64_t now = sg_mono_ns();
    sg_ho_settle(g, now);
    int c = g->client;
    bool offered = false, handed = false;
    if (sg_arb_lock(a) == 0) {
        if (sg_arb_holding(g)) {
            struct sg_arb_handoff *rec = g->handoffs;
            sg_arb_charge_locked(a, g, c, now); /* the rest is our work, paid at the return */
            rec[c].seq = seq;
            rec[c].offer = seq;
            rec[c].taken = 0;
            rec[c].flags &= ~(SG_ARB_HO_LENDS | SG_ARB_HO_SEVERAL);
            if (sg_arb_lends_queued(g))
                rec[c].flags |= SG_ARB_HO_LENDS;
            if (__atomic_load_n(&g->ho.several, __ATOMIC_RELAXED))
                rec[c].flags |= SG_ARB_HO_SEVERAL;
            g->ho.offered = seq;
            g->ho.offer_at = now;
            g->ho.offer_end_seq = g->bc.end_seq;
            offered = true;
            handed = give_offer_locked(a, rec, c, sg_arb_pick_locked(a, now), now);
        }
        sg_arb_unlock(a);
    }
    if (!offered) {
        __atomic_store_n(&g->revoked, 0, __ATOMIC_SEQ_CST);
        return;
    }
    /* g->revoked stays set until the offer ends: our other threads' launches take the slow
     * path, which ends it first. */
    if (handed)
        sched_yield(); /* as a release: let the next holder run if it was woken onto our CPU */
}

bool sg_arb_offer_end(struct sg_gpu *g)
{
    uint32_t offered = g->ho.offered;
    if (!offered)
        return false;
    g->ho.offered = 0;
    struct sg_arbiter *a = g->a;
    int c = g->client;
    uint64_t from = g->ho.offer_at;
    uint64_t end = sg_bc_end(g, g->ho.offer_end_seq, sg_mono_ns());
    /* Our own gate may have opened after the offer (we were taken queued and offered at once):
     * that wait is not our work.  The offer's charge emptied idle_ns; what settles now is it. */
    sg_ho_settle(g, end);
    uint64_t waited = __atomic_exchange_n(&g->idle_ns, 0, __ATOMIC_RELAXED);
    uint64_t ran = end > from ? end - from : 0;
    ran = waited < ran ? ran - waited : 0;
    bool taken = false;
    if (g->handoffs && c >= 0 && sg_arb_lock(a) == 0) {
        struct sg_arb_handoff *r = &g->handoffs[c];
        if (r->taken == offered) {
            taken = true;
            r->taken = 0;
            /* Our work ran on from the offer to its end: ours to pay, as a drain's. */
            if (ran)
                sg_arb_charge_drain_locked(a, g, c, ran, end);
            if (a->queued_by == (uint32_t)c + 1 && a->queued_seq == offered)
                a->queued_by = 0; /* done: later grants need not wait for it */
        } else if (r->offer == offered) {
            r->offer = 0; /* nobody took it: the hold goes on */
        }
        sg_arb_unlock(a);
    }
    if (!taken) {
        __atomic_fetch_add(&g->idle_ns, waited, __ATOMIC_RELAXED); /* the hold's next charge */
        __atomic_store_n(&g->revoked, 0, __ATOMIC_SEQ_CST);
        return false;
    }
    sg_arb_note_tail(g, ran);
    __atomic_store_n(&g->idle_from, end, __ATOMIC_RELAXED); /* the program's own gap begins */
    sg_arb_forget_token(g);
    return true;
}
