/*
 * A process's holds of a GPU's token (arbiter.c), as its watcher thread (arbwatch.c), its sync
 * hooks (arbsync.c) and the Vulkan layer's submissions (arbext.c) see them.  Every call is made
 * with the GPU's per-process mutex `g->mu` held, unless its comment says otherwise.
 */
#ifndef SHAREGPU_ARBHOLD_H
#define SHAREGPU_ARBHOLD_H

#include <stdbool.h>
#include <stdint.h>

#include "shim.h"

#pragma GCC visibility push(hidden)

/* A process waiting (for the token, or for a client entry) looks again at least this often,
 * checking that the holder is alive. */
#define LIVENESS_POLL_NS 50000000ull

enum sg_arb_decision {
    SG_ARB_KEEP,    /* keep the token (its quantum renewed if it was over) */
    SG_ARB_RELEASE, /* hand it on after our work drains */
    SG_ARB_PREEMPT, /* a higher class asks: hand it on, maybe before our drain */
    SG_ARB_LEND,    /* our work drained and we keep the card by virtual time: lend it to the
                       best waiter of our class for our host gap (a loan, SG_ARB_YIELD_LOAN) */
};

/* Do we hold the GPU's token? */
bool sg_arb_holding(const struct sg_gpu *g);
/* At the end of a quantum or of a burst: keep the token or hand it on.  Charges the time held
 * so far. */
enum sg_arb_decision sg_arb_decide(struct sg_gpu *g, uint64_t now, bool burst_end);
/* Hand the token on: drain our work (or, preempted early, let it run on into the next hold and
 * pay for it), charge the hold, grant the best waiter. */
void sg_arb_release(struct sg_gpu *g, bool preempted);
/* Act on a decision other than SG_ARB_KEEP: release, preempted or lent. */
void sg_arb_hand_on(struct sg_gpu *g, enum sg_arb_decision d);
/* A grant to this process: the watcher, asleep with nothing held, looks again. */
void sg_arb_kick_watcher(void);
/* When the watcher looks at its GPUs next without being woken (CLOCK_MONOTONIC); UINT64_MAX
 * while it is awake or asleep with nothing held: wake it to be sure (arbwatch.c). */
uint64_t sg_arb_watcher_due(void);
/* While a GPU is held and one of the holder's class waits, the watcher looks at least this
 * often: a burst's end within a class need not wake it (arbdecide.c, watch_burst_end_locked). */
uint64_t sg_arb_watch_poll_ns(uint64_t quantum);
/* No hold in progress: its marks (quantum end, drains, idle time) cleared. */
void sg_arb_hold_reset(struct sg_gpu *g);
/* Under g->mu: hold g's token for a launch now (acquire it, be held back before a predicted
 * online request, hand it on at the quantum's end as the policies decide).  0 held; 1
 * unarbitrated (the region broke on the way); < 0 an error. */
int sg_arb_hold_for_launch_locked(struct sg_gpu *g, struct sg_err *e);
/* Waits for all the work of ctx (none left if it was destroyed); without g->mu. */
void sg_arb_sync_context(CUcontext ctx);
/* Our work would still run when the next online request is due: give the token up and let no
 * offline client start before `until` (or the request).  Takes g->mu itself. */
void sg_arb_hold_back(struct sg_gpu *g, uint64_t until);
/* The first launch after a drained sync: learn the program's own gap between bursts. */
void sg_arb_note_gap(struct sg_gpu *g, uint64_t now);
/* Queued hand-overs (arbqueue.c; ABI 1.12). */
/* A sync that covers our hold began (our last launch then at `last`) and its end event is
 * recorded: offer the token, queued behind our done word raised after our work; hand
 * it on at once if a waiter of our class is the one the drained sync would hand to. */
void sg_arb_offer_queued(struct sg_gpu *g, uint64_t last);
/* Do our gaps repay a queued loan of the card for them (arbdecide.c, "Loans")? */
bool sg_arb_lends_queued(const struct sg_gpu *g);
/* Our offer ends (the sync returned, or another of our threads launches): withdrawn if nobody
 * took it; taken, our work is charged from the offer to its end and our hold forgotten.  True
 * when it was taken. */
bool sg_arb_offer_end(struct sg_gpu *g);
/* Under the region lock, waiter w finds holder h offering (acquire): take the token queued
 * behind h's work if the drained sync would hand it to w.  True when taken. */
bool sg_arb_take_offer_locked(struct sg_arbiter *a, struct sg_arb_handoff *rec, int h, int w,
                              uint64_t now);
/* Our work at a covering sync ran `ns` from the sync's begin to its end (the bound on what a
 * queued decision leaves uncharged). */
void sg_arb_note_tail(struct sg_gpu *g, uint64_t ns);
/* Shared with arbqueue.c (arbiter.c, arbrelease.c). */
void sg_arb_stop_launches(struct sg_gpu *g);
void sg_arb_forget_token(struct sg_gpu *g);
void sg_arb_charge_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t now);
void sg_arb_charge_drain_locked(struct sg_arbiter *a, struct sg_gpu *g, int c, uint64_t held,
                                uint64_t now);
/* Under the region lock, in our release (arbrelease.c): the grant to `next` is a loan for our
 * host gap (arbdecide.c), unless the pick moved meanwhile. */
void sg_arb_lend_locked(struct sg_arbiter *a, const struct sg_gpu *g, int c, int next, uint64_t now);
/* How long a holder may idle before a lower class or an online request's end hands it on. */
uint64_t sg_arb_idle_grace(uint64_t quantum);

#pragma GCC visibility pop

#endif
