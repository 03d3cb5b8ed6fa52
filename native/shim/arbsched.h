/*
 * The arbiter's scheduling decisions: who gets the token next, for how long, and what a hold
 * costs its tenant.  Pure functions of the arbiter region and the time `now`, called under
 * the region's lock (arbregion.h); no process state, so the shim and the agent's library run
 * the same code, and native/shim/tests/sched_test.c tests it without processes.
 *
 * Among WAITING clients whose tenant is not over its ceiling (bucket >= half a quantum), the
 * highest priority class wins, then the smallest weighted virtual time of the tenant, then the
 * longest waiting.  A hold costs its tenant the GPU time it used: vtime += used * 1000 /
 * effective weight; ceiling buckets (cap, burst) -= used.  Effective weight: a cap/burst
 * tenant's guarantee in permille; a share tenant's share * weight, scaled so that the active
 * share tenants together get what the active guarantees leave.  docs/design/arbitration.md
 * explains the rules and the measurements behind them.
 */
#ifndef SHAREGPU_ARBSCHED_H
#define SHAREGPU_ARBSCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "sharegpu/abi.h"

#pragma GCC visibility push(hidden)

/* A cap or burst tenant below 100%: it has a ceiling bucket. */
bool sg_arb_has_ceiling(const struct sg_arb_tenant *t);
/* The region's quantum, within the ABI's bounds. */
uint64_t sg_arb_quantum(const struct sg_arbiter *a);
/* The least ceiling credit a grant needs: half a quantum. */
int64_t sg_arb_min_grant_ns(const struct sg_arbiter *a);
/* May tenant t be granted the token now (its ceiling bucket, brought up to now, allows it)? */
bool sg_arb_eligible_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t now);
/* Would tenant t's ceiling bucket, brought up to now, fall below the least grant once `pending`
 * ns of its work not yet charged were paid?  False for a tenant with no ceiling. */
bool sg_arb_runs_dry_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t pending,
                            uint64_t now);
/* active[t]: tenant t has a client waiting or holding, or asked, held or released within
 * four quanta. */
void sg_arb_active_tenants_locked(struct sg_arbiter *a, uint64_t now, bool active[]);
/* Client c's tenant pays `used` ns of GPU time: its and c's GPU time, its virtual time, its
 * ceiling bucket.  False (nothing paid) when c names no tenant. */
bool sg_arb_pay_locked(struct sg_arbiter *a, int c, uint64_t used, uint64_t now);
/* Is waiter w a better candidate than client c?  Against the holder (c_holds) a tie goes to
 * the waiter, so processes of one tenant alternate. */
bool sg_arb_better_locked(struct sg_arbiter *a, int w, int c, bool c_holds);
/* sg_arb_better_locked against holder c, each tenant's virtual time counted as if its client's
 * work not yet charged (`*_pending` ns, a queued hand-over's work in flight) were paid. */
bool sg_arb_better_pending_locked(struct sg_arbiter *a, int w, uint64_t w_pending, int c,
                                  uint64_t c_pending, uint64_t now);
/* May holder c lend the card for its host gap to waiter w, which is behind it in virtual time?
 * Only within a class other than online, and while w's tenant is ahead by less than a quarter
 * quantum of its GPU time, so that what loans give it stays bounded (arbdecide.c, "Loans"). */
bool sg_arb_may_lend_locked(struct sg_arbiter *a, int c, int w, uint64_t now);
/* The best eligible waiter, or -1. */
int sg_arb_pick_locked(struct sg_arbiter *a, uint64_t now);
/* The quantum client c would be granted now: shortened so a ceiling bucket does not run dry. */
uint64_t sg_arb_quantum_len_locked(struct sg_arbiter *a, int c, uint64_t now);
/* The hand-over records of region a (1.12), where this process mapped them with it; NULL
 * otherwise (arbregion.c). */
struct sg_arb_handoff *sg_arb_handoffs(const struct sg_arbiter *a);
/* Grant the token to client c (and wake it): its record names the holder whose work it queues
 * behind (queued_by). */
void sg_arb_grant_locked(struct sg_arbiter *a, int c, uint64_t now);
/* Client c asked for, holds or was granted the token: an online one keeps offline work out of
 * the online window from now. */
void sg_arb_note_online_locked(struct sg_arbiter *a, int c, uint64_t now);

#pragma GCC visibility pop

#endif
