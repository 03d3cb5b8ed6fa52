/*
 * Predicted online requests (ABI 1.2): the period of an online service's requests, learned
 * from the instants its clients ask for the token (or, for a service that waits for each
 * request, its host time after each request's end: ABI 1.11), and the hold-back of offline
 * work ahead of the next one.  Pure functions of the arbiter region and the time, called under the region's
 * lock; unit-tested without processes (native/shim/tests/predict_test.c).
 * docs/design/arbitration.md, "Predicted online requests", explains the rules.
 */
#ifndef SHAREGPU_PREDICT_H
#define SHAREGPU_PREDICT_H

#include <stdbool.h>
#include <stdint.h>

#include "sharegpu/abi.h"

/* The prediction is trusted after this many consistent intervals; a hold-back starts this much
 * (plus twice the jitter) before the predicted instant and waits this long after it. */
#define HOLDBACK_MIN_SAMPLES 2
#define HOLDBACK_EARLY_NS 100000ull
#define HOLDBACK_LATE_NS 300000ull

/* An online client starts a request at `now`: learn from it. */
void sg_predict_note_arrival(struct sg_arbiter *a, uint64_t now);

/* The work of an online holder's request ended at `end` (a sync that drained it): the host
 * time of a closed-loop service runs from here to its next request. */
void sg_predict_note_end(struct sg_arbiter *a, uint64_t end);

/* The next online request's predicted instant if work of `kernel_ns` started now would still
 * run then, else 0 (also when the prediction is not trusted).  *late: how long past that
 * instant a hold-back waits for it.  *launch_by (may be NULL): when 0 is returned for a trusted
 * prediction, the last instant such work may start without a hold-back; else 0. */
uint64_t sg_predict_next(struct sg_arbiter *a, uint64_t now, uint64_t kernel_ns, uint64_t *late,
                         uint64_t *launch_by);

/* May a hold-back start now?  Counts the previous one as missed if its request never came. */
bool sg_predict_holdback_allowed(struct sg_arbiter *a, uint64_t now);

/* An online request was granted the token. */
void sg_predict_served(struct sg_arbiter *a);

/* How long an offline client's next launch is expected to run, from the estimate so far and
 * `measured`: how long the work it had queued at a bound sync took, launch to the sync's return.
 * A pure function of its arguments. */
uint64_t sg_predict_kernel_estimate(uint64_t est, uint64_t measured);

#endif
