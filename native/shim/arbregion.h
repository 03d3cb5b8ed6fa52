/*
 * The arbiter region's lock and its repair, and the client entries' life: what every process
 * that writes the region does the same way, the shim's processes and the agent's reaper alike
 * (native/agentlib links this file).  Layout and invariants: sharegpu/abi.h.
 *
 * The region mutex is robust: a process that died holding it leaves EOWNERDEAD, and the next
 * locker rebuilds the counts and the holder from the client entries (the truth).  It is waited
 * for at most SG_ARB_LOCK_DEADLINE_NS: a lock held past that marks the region broken (ABI 1.7),
 * nobody takes it again, and the agent replaces the file.  Dead clients are reaped by their
 * liveness locks (live.c), whatever their pid namespace, and a token they held goes to the
 * best waiter (arbsched.h).
 */
#ifndef SHAREGPU_ARBREGION_H
#define SHAREGPU_ARBREGION_H

#include <stdbool.h>
#include <stdint.h>

#include "shim.h"

#pragma GCC visibility push(hidden)

/* This process, as client entries name it (read at the first reap or claim). */
extern struct sg_identity sg_arb_self;
/* The region file's descriptor for liveness tests while the agent reaps (-1 otherwise; a
 * shim's process uses its GPU's). */
extern int sg_arb_agent_live_fd;
/* CLOCK_MONOTONIC of the last reap (of any region) by this process. */
extern uint64_t sg_arb_last_reap_ns;

/* Lock the region: 0, or -1 when it is broken or its lock could not be taken in time (then it
 * is marked broken).  Repairs it after a dead holder (EOWNERDEAD). */
int sg_arb_lock(struct sg_arbiter *a);
void sg_arb_unlock(struct sg_arbiter *a);
/* Why a process refuses the arbiter region `a` (file_size bytes of its file mapped or read) of
 * GPU uuid: 0 usable; 1 written by another ABI major (a newer sharegpu: not damage); < 0
 * damaged.  Either refusal fills e.  The shim's processes and the agent (sga_arbiter_check)
 * judge a region by this one rule. */
int sg_arb_region_problem(const struct sg_arbiter *a, uint64_t file_size, const uint8_t uuid[16],
                          const char *path, struct sg_err *e);
/* The region was marked broken: nothing of it is to be changed any more. */
bool sg_arb_region_broken(const struct sg_arbiter *a);
/* Is client entry cl this process's own? */
bool sg_arb_client_is_mine(const struct sg_arb_client *cl);
/* Free client entry c (its token, if it holds it, goes back: no holder). */
void sg_arb_free_client_locked(struct sg_arbiter *a, int c);
/* Free the entries of dead processes and hand a token freed by a dead holder to the best
 * waiter. */
void sg_arb_reap_and_pick_locked(struct sg_arbiter *a);
/* The holder kept the token SG_ARB_STALL_NS past its quantum (stopped, or stuck in one very
 * long kernel): charge it what it held, take the token back and hand it on. */
void sg_arb_take_back_locked(struct sg_arbiter *a, int holder, uint64_t now);

#pragma GCC visibility pop

#endif
