/*
 * A process's place in its GPUs' arbiter regions (arbentry.c): the limits it follows, the GPU of
 * a device, the region it maps, its tenant's and its client entry.  arbiter.c, which holds the
 * token, stands on it.
 */
#ifndef SHAREGPU_ARBENTRY_H
#define SHAREGPU_ARBENTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "shim.h"

#pragma GCC visibility push(hidden)

/* The tenant's GPU of this UUID (NULL: none known): *out set, or NULL when it is not one of the
 * tenant's; *arbitrated: whether any of the tenant's GPUs is arbitrated.  Follows a resize. */
int sg_arb_gpu_of_uuid(const uint8_t *uuid, struct sg_gpu **out, uint64_t *gen, bool *arbitrated,
                       struct sg_err *e);
/* The GPU of device ordinal dev, by its UUID: *out, or NULL when it is not the tenant's (refused
 * when the tenant's GPUs are arbitrated). */
int sg_arb_gpu_of_ordinal(CUdevice dev, struct sg_gpu **out, uint64_t *gen, struct sg_err *e);
/* The limits of g's device and their generation, following a resize first when `refresh`. */
void sg_arb_device_limits(const struct sg_gpu *g, bool refresh, struct sg_limits_device *d,
                          uint64_t *gen);
/* Claim our client entry (and our tenant's) in g's region, mapping it first; start the watcher.
 * Caller holds g->mu. */
int sg_arb_ensure_client(struct sg_gpu *g, struct sg_err *e);
/* A broken region was replaced by the agent: map the new one (true) or launch unarbitrated
 * (false, looked for again later).  Caller holds g->mu. */
bool sg_arb_reattach(struct sg_gpu *g);
/* Forget our hold on a region we leave: nothing charged, nothing handed on. */
void sg_arb_forget_hold(struct sg_gpu *g);
/* Copy the tenant's limits into its entry when they differ.  Under the region lock. */
void sg_arb_tenant_sync_locked(struct sg_arbiter *a, int ti, const struct sg_limits_device *d,
                               uint64_t gen);
/* Once, at set-up: our tenant's name and incarnation, from the limits. */
void sg_arb_entries_setup(void);
/* In a forked child: the lock made anew, no watcher. */
void sg_arb_entries_fork_child(void);

#pragma GCC visibility pop

#endif
