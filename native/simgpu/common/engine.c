/*
 * The execution engine: one per GPU, shared by every process, time-slicing contexts as a GPU does.
 *
 * Model.
 *  - Channels.  The unit of time-slicing is a channel: the kernels of one process on one GPU
 *    (gpu.chan[slot]; all contexts and streams of a process on a GPU share it).  Within a channel
 *    kernels run one at a time in launch order, so each stream keeps its order; kernels of
 *    different streams of one process are serialized in launch order too (a real GPU may overlap
 *    them).  A channel is only counters plus a ring of its pending kernels: kernel k completes
 *    when the channel's executed time exec_ns reaches q[k] (its sub_ns just after submission).
 *  - Round-robin.  At any instant at most one channel runs.  When several channels have pending
 *    work, the running one keeps the engine for up to one time slice (cfg.timeslice_us, default
 *    2000 µs; SIMGPU_TIMESLICE_US overrides it when the state is created), running its kernels back
 *    to back, then the next channel with work gets it; a channel whose work runs out yields at
 *    once.  A lone channel runs uninterrupted (its slice is renewed; a newcomer waits at most the
 *    rest of the current slice).  A kernel longer than a slice is preempted and resumed later with
 *    its remaining time.  A newly busy channel joins the end of the round.
 *  - Switch costs.  Passing from one channel straight to another costs engine time during which
 *    nothing runs: cfg.preempt_us when the slice ended with the running kernel unfinished
 *    (compute preemption: its state is saved and later restored), cfg.ctxsw_us when the running
 *    channel ran out of work while another waited.  The next channel's slice starts after it.
 *    Starting an idle engine costs nothing, and neither does a lone channel (never preempted).
 *  - MPS (cfg.mps_block_us = B > 0, README "MPS").  An MPS server makes every client one
 *    context, so passing between channels costs nothing and no kernel's state is saved.  The
 *    engine serves the channel of the highest MPS client priority with work (slot.mps_priority,
 *    0 before 1); channels of equal priority take turns by slices as above.  When a channel of
 *    higher priority has work, the running one keeps the engine only to its next block
 *    boundary: the end of its current kernel or of its current B µs of run, whichever is first
 *    (a GPU does not preempt the running blocks of a lower-priority stream; it schedules the
 *    higher one's blocks as they retire).  One channel runs at a time here, where a real GPU
 *    would run the higher one's blocks next to the rest of the lower one's: the model is
 *    pessimistic for both.
 *  - Gates (interprocess events).  A process's cuStreamWaitEvent on another process's event
 *    (cuIpcOpenEventHandle) gates its channel: the kernels it submits after the wait do not run
 *    until the other channel's awaited kernel completes, as a GPU holds a channel at a semaphore
 *    acquire.  A channel that reaches its gate leaves the round like one out of work (the GPU
 *    switches away) and rejoins it, at the end of the round, the instant the awaited kernel
 *    completes: a run is cut at that kernel's end so the instant is exact.  The whole channel is
 *    gated, not only the waiting stream (its streams share one queue anyway).  A gate on a
 *    memory word (cuStreamWaitValue*, memop.c) has no kernel to follow until a write that meets
 *    it is queued: then it becomes a gate on that write's kernel (same GPU) that another write
 *    meeting the word and landing first still opens (gate_live), or opens when the write lands.
 *    Until then a waiter on the gated work looks again every SIM_WORD_POLL_NS.  (A stream's
 *    wait on an event that only writes follow gates nothing here: cuda/ipcevent.c, held streams.)
 *  - Laziness.  Nothing runs in the background.  Whoever takes the state lock to launch, query,
 *    synchronize, record or read an event, or ask NVML, first commits the engine up to "now"
 *    (sim_engine_advance_locked: O(run segments + kernels completed since the last advance)).
 *    Waiting = predicting when the awaited kernel completes if nothing new arrives (predict():
 *    round-robin on the channels' remaining totals, without committing), sleeping until then
 *    (clock_nanosleep on an absolute CLOCK_MONOTONIC instant), then advancing and checking again,
 *    since new arrivals may have pushed it later.  While other channels compete, a waiter wakes at
 *    least every SIM_REAP_NS, and one with at least REAP_SLACK_NS to sleep sweeps for dead
 *    processes (outside the lock, sim_reap), whose pending work is dropped (a killed process
 *    never keeps taking slices).
 *  - History.  Each run segment (start, end, pid) goes to the GPU's ring (adjacent segments of
 *    one pid merged); NVML utilization and per-process utilization read it, and slot.busy_ns sums
 *    it per process.  Events resolve to completion instants stored in the channel ring; a
 *    process resolves its pending events before its own launches overwrite their entries.
 *
 * Cost of a launch: one uncontended robust mutex, one vDSO clock read, an advance that has
 * usually nothing or one segment to commit, ~10 stores.  No allocation, no system call.  A stream
 * may hold SIM_QDEPTH pending kernels and a channel SIM_CHQ; one more blocks until the oldest
 * completes.
 *
 * Robustness.  A holder killed inside the lock leaves EOWNERDEAD; sim_engine_repair_locked then
 * rebuilds each engine from the channels: inconsistent channels are reset (their pending work
 * dropped, completing at the repair instant), entries already reached by exec_ns are completed,
 * and the active list, the running channel and its slice are rebuilt.  Writes are ordered so that
 * any prefix of an update is repairable this way.
 */
#include "sim.h"

#include <string.h>

static uint64_t slice_ns(const struct sim_state *st)
{
    uint32_t us = st->cfg.timeslice_us;
    if (us < SIM_TIMESLICE_US_MIN || us > SIM_TIMESLICE_US_MAX)
        us = SIM_TIMESLICE_US_DEFAULT;
    return (uint64_t)us * 1000u;
}

static int mps(const struct sim_state *st)
{
    return st->cfg.mps_block_us != 0;
}

/* Channel c's MPS client priority: 0 (normal) is served before 1 (below normal). */
static int32_t prio(const struct sim_state *st, int c)
{
    return mps(st) && st->slot[c].mps_priority == 1;
}

/* The cost of passing straight to another channel: preempted (its kernel unfinished) or not.
 * Nothing under MPS: one context. */
static uint64_t switch_ns(const struct sim_state *st, int preempted)
{
    if (mps(st))
        return 0;
    uint32_t us = preempted ? st->cfg.preempt_us : st->cfg.ctxsw_us;
    return (uint64_t)(us > SIM_SWITCH_US_MAX ? SIM_SWITCH_US_MAX : us) * 1000u;
}

/* cur is switched to at g->clock: nothing runs until the switch ends, then its slice starts. */
static void switch_to(const struct sim_state *st, struct sim_gpu *g, int next, int preempted,
                      uint64_t ts)
{
    g->cur = next;
    g->switch_end = g->clock + switch_ns(st, preempted);
    g->seg_start = g->switch_end; /* the switch is nobody's run time */
    g->slice_end = g->switch_end + ts;
    g->switches++;
    if (preempted)
        g->preemptions++;
}

static int ticket_done(const struct sim_gpu *g, const struct sim_ticket *t)
{
    if (!t->seq1 || t->chan < 0 || t->chan >= SIM_MAX_SLOTS)
        return 1;
    const struct sim_chan *ch = &g->chan[t->chan];
    return ch->done >= t->seq1 || t->seq1 > ch->n; /* a ticket from the future: stale, done */
}

/* How far the channel may run now: all it has, or up to its gate while the gate is closed. */
static uint64_t runnable_end(const struct sim_chan *ch)
{
    return ch->gate.seq1 ? ch->gate_at : ch->sub_ns;
}

/* ---- commit ------------------------------------------------------------------------------ */

/* Closes cur's open run segment at t (merging with the previous one of the same process). */
static void seg_close(struct sim_state *st, struct sim_gpu *g, uint64_t t)
{
    if (t > g->seg_start) {
        int32_t pid = st->slot[g->cur].pid;
        struct sim_busy *last = g->ring_count ? &g->ring[(g->ring_count - 1) % SIM_RING] : NULL;
        uint32_t slot = (uint32_t)g->cur + 1;
        if (last && last->pid == pid && last->slot == slot && last->end_ns == g->seg_start) {
            last->end_ns = t;
        } else {
            struct sim_busy *b = &g->ring[g->ring_count % SIM_RING];
            b->start_ns = g->seg_start;
            b->end_ns = t;
            b->pid = pid;
            b->slot = slot;
            g->ring_count++;
        }
    }
    g->seg_start = t;
}

static void list_insert(struct sim_gpu *g, int c, uint64_t now, uint64_t ts)
{
    struct sim_chan *ch = &g->chan[c];
    if (g->nactive == 0) { /* an idle engine starts at once */
        ch->next = ch->prev = c;
        g->cur = c;
        g->seg_start = now;
        g->slice_end = now + ts;
        g->switch_end = 0;
    } else { /* before cur: the end of the round */
        int cur = g->cur, p = g->chan[cur].prev;
        ch->next = cur;
        ch->prev = p;
        g->chan[p].next = c;
        g->chan[cur].prev = c;
    }
    ch->active = 1;
    g->nactive++;
}

static void list_remove(struct sim_gpu *g, int c)
{
    struct sim_chan *ch = &g->chan[c];
    if (g->nactive > 1) {
        g->chan[ch->prev].next = ch->next;
        g->chan[ch->next].prev = ch->prev;
    }
    ch->active = 0;
    g->nactive--;
}

/* The channel to run after `from`'s turn, starting the round at `from` (which must be active):
 * the next one in the round, or under MPS the first of the highest priority. */
static int pick_next(const struct sim_state *st, const struct sim_gpu *g, int from)
{
    if (!mps(st))
        return from;
    int best = from, k = from;
    for (unsigned i = 0; i < g->nactive; i++, k = g->chan[k].next) {
        if (k < 0 || k >= SIM_MAX_SLOTS)
            break; /* a corrupted list: the next advance repairs it */
        if (prio(st, k) < prio(st, best))
            best = k;
    }
    return best;
}

/* Until when the running channel c keeps the engine (UINT64_MAX: for as long as it has work).
 * Under MPS: a channel of higher priority with work takes over at c's next block boundary;
 * one of equal priority at the end of c's slice; lower ones never. */
static uint64_t turn_end(const struct sim_state *st, const struct sim_gpu *g, int c)
{
    if (g->nactive <= 1)
        return UINT64_MAX;
    if (!mps(st))
        return g->slice_end;
    int higher = 0, equal = 0, k = g->chan[c].next;
    for (unsigned i = 1; i < g->nactive && k != c; i++, k = g->chan[k].next) {
        if (k < 0 || k >= SIM_MAX_SLOTS)
            break;
        higher |= prio(st, k) < prio(st, c);
        equal |= prio(st, k) == prio(st, c);
    }
    if (!higher)
        return equal ? g->slice_end : UINT64_MAX;
    const struct sim_chan *ch = &g->chan[c];
    const uint64_t b = (uint64_t)st->cfg.mps_block_us * 1000u, r = ch->exec_ns % b;
    uint64_t end = ch->exec_ns + (r ? b - r : 0);
    if (ch->done < ch->n && ch->q[ch->done % SIM_CHQ] < end)
        end = ch->q[ch->done % SIM_CHQ]; /* its kernel ends first */
    return g->clock + (end - ch->exec_ns);
}

/* Completes the pending kernels exec_ns has reached; the run began at t0 with exec_ns == x0.
 * Those behind a closed gate stay pending (a 0 µs kernel there has reached exec_ns already). */
static void complete(struct sim_chan *ch, uint64_t t0, uint64_t x0)
{
    while (ch->done < ch->n && !(ch->gate.seq1 && ch->done >= ch->gate_k)) {
        uint64_t *q = &ch->q[ch->done % SIM_CHQ];
        if (*q > ch->exec_ns)
            break;
        *q = *q > x0 ? t0 + (*q - x0) : t0;
        ch->done++;
    }
}

/* Where channel c's run must stop so that a gate waiting on it opens at the right instant: the
 * exec_ns at which its first kernel that some other channel waits for completes (none: MAX). */
static uint64_t gate_stop(const struct sim_gpu *g, int c)
{
    uint64_t stop = UINT64_MAX;
    if (!g->gates)
        return stop;
    const struct sim_chan *ch = &g->chan[c];
    for (int k = 0; k < SIM_MAX_SLOTS; k++) {
        const struct sim_ticket *t = &g->chan[k].gate;
        if (t->seq1 && t->chan == c && t->seq1 > ch->done && t->seq1 <= ch->n &&
            ch->q[(t->seq1 - 1) % SIM_CHQ] < stop)
            stop = ch->q[(t->seq1 - 1) % SIM_CHQ];
    }
    return stop;
}

static void open_gates(struct sim_state *st, struct sim_gpu *g, int from, uint64_t ts, int depth);

/* Channel k's gate is open at g->clock: what it may run joins the round (at its end, as a newly
 * busy channel does).  A 0 µs kernel just behind the gate (an event recorded after the wait)
 * completes when the channel runs again, after the switch to it, as a GPU executes a channel's
 * commands after a semaphore acquire only once its context is back on the engine: the switch is
 * not the channel's work, and an event after the wait must not say so.  With nothing else to run
 * it completes now. */
static void open_gate(struct sim_state *st, struct sim_gpu *g, int k, uint64_t ts, int depth)
{
    struct sim_chan *ch = &g->chan[k];
    ch->gate = (struct sim_ticket){0};
    ch->gate_live = 0;
    g->gates--;
    uint64_t done = ch->done;
    if (ch->exec_ns >= ch->sub_ns)
        complete(ch, g->clock, ch->exec_ns);
    else if (!ch->active)
        list_insert(g, k, g->clock, ts);
    if (ch->done != done && depth < 8)
        open_gates(st, g, k, ts, depth + 1); /* a gate on what just completed */
}

/* Opens the gates that wait for a kernel of channel `from` that has completed. */
static void open_gates(struct sim_state *st, struct sim_gpu *g, int from, uint64_t ts, int depth)
{
    for (int k = 0; g->gates && k < SIM_MAX_SLOTS; k++) {
        const struct sim_ticket *t = &g->chan[k].gate;
        if (t->seq1 && t->chan == from && ticket_done(g, t))
            open_gate(st, g, k, ts, depth);
    }
}

void sim_engine_advance_locked(struct sim_state *st, int dev, uint64_t t)
{
    struct sim_gpu *g = &st->gpu[dev];
    const uint64_t ts = slice_ns(st);
    while (g->clock < t) {
        if (g->nactive == 0) {
            g->clock = t;
            break;
        }
        if (g->switch_end > g->clock) { /* a context switch: nothing runs */
            g->clock = g->switch_end < t ? g->switch_end : t;
            continue;
        }
        const int c = g->cur;
        if (c < 0 || c >= SIM_MAX_SLOTS) { /* only a corrupted state: rebuild it */
            sim_engine_repair_locked(st);
            continue;
        }
        struct sim_chan *ch = &g->chan[c];
        const uint64_t end = turn_end(st, g, c);
        uint64_t limit = end < t ? end : t;
        uint64_t run = limit > g->clock ? limit - g->clock : 0;
        uint64_t stop = runnable_end(ch);
        const uint64_t gate = gate_stop(g, c);
        uint64_t left = stop > ch->exec_ns ? stop - ch->exec_ns : 0;
        if (gate > ch->exec_ns && gate - ch->exec_ns < left)
            left = gate - ch->exec_ns; /* someone's gate opens there: stop at that instant */
        if (run > left)
            run = left;
        const uint64_t t0 = g->clock, x0 = ch->exec_ns;
        ch->exec_ns = x0 + run; /* first: a repair completes what exec_ns reached */
        complete(ch, t0, x0);
        st->slot[c].busy_ns[dev] += run;
        g->clock = t0 + run;
        if (g->gates) {
            open_gates(st, g, c, ts, 0); /* before c leaves: the switch to them is paid */
            stop = runnable_end(ch);      /* c's own, if a chain of 0 µs kernels opened it */
        }
        if (ch->exec_ns >= stop) { /* out of work, or at its gate: yield at once */
            for (; !ch->gate.seq1 && ch->done < ch->n; ch->done++) /* only after a repair */
                ch->q[ch->done % SIM_CHQ] = g->clock;
            seg_close(st, g, g->clock);
            int next = ch->next;
            list_remove(g, c);
            if (g->nactive)
                switch_to(st, g, pick_next(st, g, next), 0, ts);
        } else if (g->clock >= end) { /* turn over: preempted, or under MPS between blocks */
            seg_close(st, g, g->clock);
            switch_to(st, g, pick_next(st, g, ch->next), !mps(st), ts);
        } else if (end == UINT64_MAX && g->slice_end <= g->clock) { /* unopposed: renew */
            g->slice_end += ((g->clock - g->slice_end) / ts + 1) * ts;
        }
    }
}

/* Takes nothing, returns "now" for the caller holding the lock, the engine advanced to it. */
static uint64_t advance_now(struct sim_state *st, int dev)
{
    uint64_t now = sim_now_ns(); /* read under the lock: instants are ordered across processes */
    sim_engine_advance_locked(st, dev, now);
    return st->gpu[dev].clock > now ? st->gpu[dev].clock : now;
}

static void drop_chan(struct sim_state *st, struct sim_gpu *g, int c, uint64_t at, uint64_t ts)
{
    struct sim_chan *ch = &g->chan[c];
    if (ch->active) {
        if (g->cur == c) {
            seg_close(st, g, g->clock);
            int next = ch->next;
            list_remove(g, c);
            if (g->nactive) { /* a torn-down context has nothing to save: no switch cost */
                g->cur = pick_next(st, g, next);
                g->switch_end = 0;
                g->seg_start = g->clock;
                g->slice_end = g->clock + ts;
            }
        } else {
            list_remove(g, c);
        }
    }
    if (ch->gate.seq1) {
        ch->gate = (struct sim_ticket){0};
        g->gates--;
    }
    ch->gate_live = 0;
    ch->exec_ns = ch->sub_ns;
    for (; ch->done < ch->n; ch->done++)
        ch->q[ch->done % SIM_CHQ] = at;
    if (g->gates)
        open_gates(st, g, c, ts, 0); /* those waiting on its work: it is done now */
}

void sim_engine_drop_locked(struct sim_state *st, int s)
{
    const uint64_t ts = slice_ns(st), now = sim_now_ns();
    for (unsigned d = 0; d < st->cfg.gpus && d < SIM_MAX_GPUS; d++) {
        struct sim_gpu *g = &st->gpu[d];
        if (g->chan[s].done == g->chan[s].n && !g->chan[s].active)
            continue;
        sim_engine_advance_locked(st, (int)d, now);
        drop_chan(st, g, s, g->clock, ts);
    }
}

void sim_engine_repair_locked(struct sim_state *st)
{
    const uint64_t ts = slice_ns(st), now = sim_now_ns();
    for (unsigned d = 0; d < SIM_MAX_GPUS; d++) {
        struct sim_gpu *g = &st->gpu[d];
        if (g->clock > now)
            g->clock = now;
        int old = (g->nactive && g->cur >= 0 && g->cur < SIM_MAX_SLOTS) ? g->cur : 0;
        g->nactive = 0;
        g->switch_end = 0;
        for (int c = 0; c < SIM_MAX_SLOTS; c++) {
            struct sim_chan *ch = &g->chan[c];
            ch->active = 0;
            int bad = ch->done > ch->n || ch->n - ch->done > SIM_CHQ || ch->exec_ns > ch->sub_ns;
            for (uint64_t k = ch->done, prev = 0; !bad && k < ch->n; k++) {
                uint64_t cum = ch->q[k % SIM_CHQ]; /* pending: non-decreasing, within sub_ns */
                bad = cum < prev || cum > ch->sub_ns;
                prev = cum;
            }
            if (bad) {
                if (ch->done > ch->n)
                    ch->done = ch->n;
                ch->exec_ns = ch->sub_ns;
                for (; ch->done < ch->n; ch->done++)
                    ch->q[ch->done % SIM_CHQ] = g->clock;
                continue;
            }
            complete(ch, g->clock, ch->exec_ns);
            if (ch->done == ch->n)
                ch->exec_ns = ch->sub_ns; /* work without a kernel: half a submission */
        }
        /* Gates: kept only while consistent and still closed, once every channel is repaired. */
        g->gates = 0;
        for (int c = 0; c < SIM_MAX_SLOTS; c++) {
            struct sim_chan *ch = &g->chan[c];
            if (!ch->gate.seq1) {
                ch->gate_live = 0;
                continue;
            }
            const int word = ch->gate.chan == SIM_GATE_WORD;
            if (ch->gate.chan == c || ch->gate_k < ch->done || ch->gate_k > ch->n ||
                ch->gate_at < ch->exec_ns || ch->gate_at > ch->sub_ns ||
                (!word && ticket_done(g, &ch->gate))) {
                ch->gate = (struct sim_ticket){0};
                ch->gate_live = 0;
                complete(ch, g->clock, ch->exec_ns);
            } else {
                g->gates++;
            }
        }
        /* The active list, in channel order starting from the channel that was running. */
        for (int k = 0; k < SIM_MAX_SLOTS; k++) {
            int c = (old + k) % SIM_MAX_SLOTS;
            if (g->chan[c].exec_ns < runnable_end(&g->chan[c]))
                list_insert(g, c, g->clock, ts);
        }
    }
}

/* ---- prediction -------------------------------------------------------------------------- */

/* Under MPS, a lower bound (a waiter wakes, advances and asks again, so early is only a wasted
 * wake-up; late would be latency the model does not have): the running channel's turn, the
 * remaining work of every higher-priority channel, then c's own; equal ones are left out. */
static uint64_t predict_mps(const struct sim_state *st, const struct sim_gpu *g, int c, uint64_t cum)
{
    uint64_t t = g->clock + (cum - g->chan[c].exec_ns);
    int k = g->cur;
    for (unsigned i = 0; i < g->nactive; i++, k = g->chan[k].next) {
        if (k < 0 || k >= SIM_MAX_SLOTS)
            break;
        if (k == c)
            continue;
        if (prio(st, k) < prio(st, c))
            t += g->chan[k].sub_ns - g->chan[k].exec_ns;
        else if (k == g->cur) {
            uint64_t end = turn_end(st, g, k);
            if (end != UINT64_MAX && end > g->clock && prio(st, k) > prio(st, c))
                t += end - g->clock;
        }
    }
    return t;
}

/* When channel c's exec_ns reaches `cum` if nothing new arrives: the commit rules replayed on
 * the remaining totals (kernel boundaries inside a channel do not matter).  Full rounds in which
 * no channel runs out are skipped in one step, so the cost is O(active channels²). */
static uint64_t predict(const struct sim_state *st, int dev, int c, uint64_t cum, int depth)
{
    const struct sim_gpu *g = &st->gpu[dev];
    const struct sim_chan *tc = &g->chan[c];
    if (tc->exec_ns >= cum)
        return g->clock;
    const struct sim_ticket *gt = &tc->gate;
    if (gt->seq1 && cum > tc->gate_at && gt->chan == SIM_GATE_WORD)
        return g->clock + SIM_WORD_POLL_NS; /* behind a word nobody has written yet: look again */
    if (gt->seq1 && cum > tc->gate_at && gt->chan >= 0 && gt->chan < SIM_MAX_SLOTS && depth < 4) {
        /* Behind its gate: when the awaited kernel ends, then a switch and its own work (a lower
         * bound: the waiter looks again when it wakes). */
        const struct sim_chan *gc = &g->chan[gt->chan];
        uint64_t open = predict(st, dev, gt->chan, gc->q[(gt->seq1 - 1) % SIM_CHQ], depth + 1);
        return open + switch_ns(st, 0) + (cum - tc->gate_at);
    }
    const uint64_t from = g->switch_end > g->clock ? g->switch_end : g->clock;
    if (g->nactive <= 1 || !tc->active)
        return from + (cum - tc->exec_ns);
    if (mps(st))
        return predict_mps(st, g, c, cum);
    const uint64_t ts = slice_ns(st);
    uint64_t w[SIM_MAX_SLOTS];
    unsigned m = 0, target = SIM_MAX_SLOTS;
    int k = g->cur;
    do {
        const struct sim_chan *ch = &g->chan[k];
        if (k == c) {
            target = m;
            w[m++] = cum - ch->exec_ns; /* its work after the target does not matter */
        } else {
            w[m++] = ch->sub_ns - ch->exec_ns;
        }
        k = ch->next;
    } while (k != g->cur && m < SIM_MAX_SLOTS && k >= 0 && k < SIM_MAX_SLOTS);
    if (target == SIM_MAX_SLOTS)
        return g->clock + (cum - tc->exec_ns); /* not in the list: cannot happen */
    const uint64_t sw = switch_ns(st, 0), pre = switch_ns(st, 1);
    uint64_t t = from; /* after a switch under way */
    uint64_t turn = g->slice_end > t ? g->slice_end - t : 0; /* the rest of cur's slice */
    unsigned p = 0;
    for (;;) {
        if (m == 1)
            return t + w[0]; /* alone: runs uninterrupted */
        if (turn == ts) {
            /* r full rounds in which every channel runs exactly one slice, none runs out, and
             * each slice ends in a preemption. */
            uint64_t r = UINT64_MAX;
            for (unsigned i = 0; i < m; i++) {
                uint64_t ri = (w[i] - 1) / ts;
                if (ri < r)
                    r = ri;
            }
            if (r > 0) {
                for (unsigned i = 0; i < m; i++)
                    w[i] -= r * ts;
                t += r * m * (ts + pre);
            }
        }
        if (p == target && w[p] <= turn)
            return t + w[p];
        uint64_t run = w[p] < turn ? w[p] : turn;
        t += run;
        w[p] -= run;
        if (w[p] == 0) {
            memmove(&w[p], &w[p + 1], (m - p - 1) * sizeof(w[0]));
            if (target > p)
                target--;
            m--;
            if (p == m)
                p = 0;
            t += sw;
        } else {
            p = (p + 1) % m;
            t += pre;
        }
        turn = ts;
    }
}

/* ---- waiting ----------------------------------------------------------------------------- */

/* A waiter sweeps for dead competitors only when it has at least this long to sleep. */
#define REAP_SLACK_NS 1000000ull

/* Under lock, engine at now: 0 when t is done, else the instant to sleep until; *reap: whether
 * a competitor may have died and a sweep is due. */
static uint64_t wait_step_locked(struct sim_state *st, int dev, const struct sim_ticket *t,
                                 uint64_t now, int *reap)
{
    struct sim_gpu *g = &st->gpu[dev];
    if (ticket_done(g, t))
        return 0;
    const int others = g->nactive > 1 || g->gates; /* someone who may die ahead of t */
    *reap = others && now - st->last_reap_ns >= SIM_REAP_NS;
    const struct sim_chan *ch = &g->chan[t->chan];
    uint64_t at = predict(st, dev, t->chan, ch->q[(t->seq1 - 1) % SIM_CHQ], 0);
    if (others && at > now + SIM_REAP_NS)
        at = now + SIM_REAP_NS;
    return at > now ? at : now + 1000u; /* never a hot loop, even on a broken state */
}

/* Without the lock: sleep until wake, or sweep for dead competitors first when one is due.  The
 * sweep reads /proc, up to a few hundred µs on a VM: done in time this waiter would sleep
 * anyway, and left to a later wait when this one is shorter, so that it delays neither this
 * waiter nor (outside the lock) anyone else.  A dead competitor's work is dropped and ours may
 * then complete sooner: after a sweep that freed a slot, return without sleeping (the caller
 * looks again).  -1: the lock failed (e set). */
static int sleep_or_reap(struct sim_err *e, struct sim_state *st, uint64_t now, uint64_t wake, int reap,
                         enum sim_wait_how how)
{
    if (reap && wake > now + REAP_SLACK_NS) {
        int freed = sim_reap(e, st, SIM_REAP_NS);
        if (freed != 0)
            return freed < 0 ? -1 : 0;
    }
    sim_wait_until(wake, how);
    return 0;
}

int sim_engine_wait(struct sim_err *e, struct sim_state *st, int dev, const struct sim_ticket *t,
                    enum sim_wait_how how)
{
    struct sim_ticket w = {0};
    for (int first = 1;; first = 0) {
        if (sim_lock(e, st) < 0)
            return -1;
        uint64_t now = advance_now(st, dev);
        if (first)
            w = *t;
        int reap = 0;
        uint64_t wake = wait_step_locked(st, dev, &w, now, &reap);
        sim_unlock(st);
        if (!wake)
            return 0;
        if (sleep_or_reap(e, st, now, wake, reap, how) < 0)
            return -1;
    }
}

int sim_engine_query(struct sim_err *e, struct sim_state *st, int dev, const struct sim_ticket *t)
{
    if (sim_lock(e, st) < 0)
        return -1;
    advance_now(st, dev);
    int done = ticket_done(&st->gpu[dev], t);
    sim_unlock(st);
    return done;
}

/* ---- events ------------------------------------------------------------------------------ */

/* [state lock] this process's pending events per GPU, in ticket order. */
static struct sim_watch *watch_head[SIM_MAX_GPUS], *watch_tail[SIM_MAX_GPUS];

static void watch_unlink(struct sim_watch *w)
{
    if (!w->linked)
        return;
    int d = w->dev;
    if (w->prev)
        w->prev->next = w->next;
    else
        watch_head[d] = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        watch_tail[d] = w->prev;
    w->next = w->prev = NULL;
    w->linked = 0;
}

static void watch_link(struct sim_watch *w, int dev, const struct sim_ticket *t)
{
    w->dev = dev;
    w->t = *t;
    struct sim_watch *p = watch_tail[dev];
    while (p && p->t.seq1 > t->seq1) /* records come in channel order, but streams differ */
        p = p->prev;
    w->prev = p;
    w->next = p ? p->next : watch_head[dev];
    if (w->next)
        w->next->prev = w;
    else
        watch_tail[dev] = w;
    if (p)
        p->next = w;
    else
        watch_head[dev] = w;
    w->linked = 1;
}

/* Under lock, w's kernel done: its completion instant, still in the channel ring. */
static void watch_resolve(struct sim_state *st, struct sim_watch *w)
{
    const struct sim_gpu *g = &st->gpu[w->dev];
    uint64_t at = g->clock;
    if (w->t.seq1 && w->t.chan >= 0 && w->t.chan < SIM_MAX_SLOTS) {
        const struct sim_chan *ch = &g->chan[w->t.chan];
        uint64_t seq = w->t.seq1 - 1;
        if (seq < ch->done && ch->n - seq <= SIM_CHQ && ch->q[seq % SIM_CHQ])
            at = ch->q[seq % SIM_CHQ];
    }
    watch_unlink(w);
    __atomic_store_n(&w->at, at ? at : 1, __ATOMIC_RELEASE);
}

int sim_engine_record(struct sim_err *e, struct sim_state *st, int dev, const struct sim_queue *q,
                      struct sim_watch *w)
{
    if (sim_lock(e, st) < 0)
        return -1;
    uint64_t now = advance_now(st, dev);
    watch_unlink(w);
    if (ticket_done(&st->gpu[dev], &q->last)) {
        w->dev = dev;
        __atomic_store_n(&w->at, now, __ATOMIC_RELEASE); /* idle stream: the record instant */
    } else {
        __atomic_store_n(&w->at, 0, __ATOMIC_RELEASE);
        watch_link(w, dev, &q->last);
    }
    sim_unlock(st);
    return 0;
}

int sim_engine_watch(struct sim_err *e, struct sim_state *st, struct sim_watch *w, int wait,
                     enum sim_wait_how how)
{
    for (;;) {
        if (__atomic_load_n(&w->at, __ATOMIC_ACQUIRE))
            return 1;
        if (sim_lock(e, st) < 0)
            return -1;
        if (!w->linked) { /* never recorded, or resolved by another thread meanwhile */
            sim_unlock(st);
            return 1;
        }
        const int dev = w->dev;
        uint64_t now = advance_now(st, dev), wake = 0;
        int reap = 0;
        if (ticket_done(&st->gpu[dev], &w->t) ||
            (wait && (wake = wait_step_locked(st, dev, &w->t, now, &reap)) == 0)) {
            watch_resolve(st, w);
            sim_unlock(st);
            return 1;
        }
        sim_unlock(st);
        if (!wait)
            return 0;
        if (sleep_or_reap(e, st, now, wake, reap, how) < 0)
            return -1;
    }
}

void sim_engine_unwatch(struct sim_state *st, struct sim_watch *w)
{
    if (sim_lock(NULL, st) < 0)
        return;
    watch_unlink(w);
    sim_unlock(st);
}

int sim_engine_done_locked(const struct sim_state *st, int dev, const struct sim_ticket *t)
{
    return ticket_done(&st->gpu[dev], t);
}

int sim_engine_gate_locked(struct sim_state *st, int dev, int c, const struct sim_ticket *on)
{
    struct sim_gpu *g = &st->gpu[dev];
    struct sim_chan *ch = &g->chan[c];
    if (ticket_done(g, on) || on->chan == c)
        return 0; /* done, or our own kernel: our channel runs in order anyway */
    if (!ch->gate.seq1) {
        ch->gate = (struct sim_ticket){.seq1 = on->seq1, .chan = on->chan};
        ch->gate_k = ch->n;
        ch->gate_at = ch->sub_ns;
        g->gates++;
        return 1;
    }
    if (ch->gate.chan == on->chan) {
        if (on->seq1 > ch->gate.seq1) /* a later kernel of the same channel: wait for it */
            ch->gate.seq1 = on->seq1;
        ch->gate_live = 0; /* a word met early no longer opens it: the kernel is awaited too */
        return 1;
    }
    return -2; /* one gate per channel: a second one is kept on the host */
}

int sim_engine_gate(struct sim_err *e, struct sim_state *st, int dev, const struct sim_ticket *on)
{
    int c = sim_lock_own_slot(e, st);
    if (c < 0)
        return -1;
    advance_now(st, dev);
    int gated = sim_engine_gate_locked(st, dev, c, on);
    sim_unlock(st);
    return gated == -2 ? sim_engine_wait(e, st, dev, on, SIM_WAIT_SLEEP) : gated;
}

int sim_engine_gate_word_locked(struct sim_state *st, int dev, int c, const struct sim_word *w,
                                uint32_t op, uint64_t value, const struct sim_ticket *follow)
{
    struct sim_gpu *g = &st->gpu[dev];
    struct sim_chan *ch = &g->chan[c];
    if (follow && (ticket_done(g, follow) || follow->chan == c))
        return 0; /* landed, or behind our own work: our channel runs in order anyway */
    if (ch->gate.seq1)
        return follow && ch->gate.chan == follow->chan ? sim_engine_gate_locked(st, dev, c, follow) : -2;
    ch->gate_word = *w;
    ch->gate_value = value;
    ch->gate_op = op;
    ch->gate_k = ch->n;
    ch->gate_at = ch->sub_ns;
    ch->gate_live = follow != NULL;
    /* last: repair reads it */
    ch->gate = follow ? *follow : (struct sim_ticket){.seq1 = 1, .chan = SIM_GATE_WORD};
    g->gates++;
    return 1;
}

void sim_engine_word_written_locked(struct sim_state *st, int wdev, const struct sim_ticket *after,
                                    const struct sim_word *w, uint64_t value)
{
    const uint64_t ts = slice_ns(st);
    for (unsigned d = 0; d < st->cfg.gpus && d < SIM_MAX_GPUS; d++) {
        struct sim_gpu *g = &st->gpu[d];
        for (int k = 0; g->gates && k < SIM_MAX_SLOTS; k++) {
            struct sim_chan *ch = &g->chan[k];
            const int word = ch->gate.chan == SIM_GATE_WORD || ch->gate_live;
            if (!word || !ch->gate.seq1 || !sim_same_word(&ch->gate_word, w) ||
                !sim_word_met(value, ch->gate_op, ch->gate_value, ch->gate_word.size))
                continue;
            /* Landed (or queued in this very channel, whose later streams a GPU would run beside
             * the wait): it opens now. */
            const int landed = ticket_done(&st->gpu[wdev], after) || after->chan == k;
            if (landed) {
                open_gate(st, g, k, ts, 0);
            } else if ((int)d == wdev && !ch->gate_live) {
                ch->gate_live = 1; /* the write's kernel ends first: then it opens */
                ch->gate = *after;
            } /* already following an earlier write, or another GPU's write still pending: it
               * opens when its writer applies it */
        }
    }
}

void sim_engine_fork_child(void)
{
    for (int d = 0; d < SIM_MAX_GPUS; d++) {
        for (struct sim_watch *w = watch_head[d], *n; w; w = n) {
            n = w->next;
            w->next = w->prev = NULL;
            w->linked = 0;
        }
        watch_head[d] = watch_tail[d] = NULL;
    }
}

/* ---- submission -------------------------------------------------------------------------- */

int sim_engine_submit(struct sim_err *e, struct sim_state *st, int dev, struct sim_queue *q,
                      struct sim_ticket *ctx_last, const uint64_t *dur_ns, size_t count)
{
    const uint64_t ts = slice_ns(st);
    size_t i = 0;
    while (i < count) {
        int c = sim_lock_own_slot(e, st);
        if (c < 0)
            return -1;
        struct sim_gpu *g = &st->gpu[dev];
        struct sim_chan *ch = &g->chan[c];
        uint64_t now = advance_now(st, dev);
        if (q->last.seq1 && q->last.chan != c) { /* our old channel was dropped */
            q->last.seq1 = 0;
            q->n = 0;
        }
        struct sim_ticket wait = {0};
        for (; i < count; i++) {
            if (q->n >= SIM_QDEPTH) {
                uint64_t oldest = q->seqs[q->n % SIM_QDEPTH];
                if (ch->done <= oldest) {
                    wait = (struct sim_ticket){.seq1 = oldest + 1, .chan = c};
                    break;
                }
            }
            const uint64_t seq = ch->n;
            if (seq - ch->done >= SIM_CHQ) {
                wait = (struct sim_ticket){.seq1 = seq - SIM_CHQ + 1, .chan = c};
                break;
            }
            /* Kernel seq - SIM_CHQ (done) is overwritten now: resolve its events first. */
            struct sim_watch *w;
            while ((w = watch_head[dev]) && w->t.seq1 + SIM_CHQ <= seq + 1)
                watch_resolve(st, w);
            const uint64_t d = dur_ns[i];
            ch->q[seq % SIM_CHQ] = ch->sub_ns + d; /* order: entry, sub_ns, n (see repair) */
            ch->sub_ns += d;
            ch->n = seq + 1;
            if (!ch->active && ch->exec_ns < runnable_end(ch))
                list_insert(g, c, now, ts);
            else if (!ch->active)
                complete(ch, now, ch->exec_ns); /* nothing ahead of a 0 µs kernel: done now */
            q->seqs[q->n % SIM_QDEPTH] = seq;
            q->n++;
            q->last = (struct sim_ticket){.seq1 = seq + 1, .chan = c};
            if (ctx_last)
                *ctx_last = q->last;
        }
        int reap = 0;
        uint64_t wake = wait.seq1 ? wait_step_locked(st, dev, &wait, now, &reap) : 0;
        sim_unlock(st);
        /* A full queue: the loop re-checks.  (A driver's launch into a full queue waits as its
         * context says too; the launch path here sleeps whatever the context.) */
        if (wake && sleep_or_reap(e, st, now, wake, reap, SIM_WAIT_SLEEP) < 0)
            return -1;
    }
    return 0;
}

/* ---- history ----------------------------------------------------------------------------- */

uint64_t sim_busy_locked(const struct sim_state *st, int dev, int slot, uint64_t from, uint64_t to,
                         uint64_t *covered_from)
{
    /* A process is its slot and its pid: the slot tells two pid 1s of two pid namespaces
     * apart, the pid a slot's earlier owner (NVML's samples span a second). */
    int32_t pid = slot >= 0 ? st->slot[slot].pid : 0;
    const struct sim_gpu *g = &st->gpu[dev];
    uint64_t n = g->ring_count < SIM_RING ? g->ring_count : SIM_RING;
    uint64_t busy = 0, earliest = from;
    if (g->ring_count > SIM_RING) {
        /* History was overwritten: the ring only describes time from its oldest entry on. */
        const struct sim_busy *oldest = &g->ring[g->ring_count % SIM_RING];
        if (oldest->start_ns > earliest)
            earliest = oldest->start_ns;
    }
    if (g->nactive && g->clock > g->seg_start && (slot < 0 || g->cur == slot)) {
        uint64_t s = g->seg_start > earliest ? g->seg_start : earliest;
        uint64_t t = g->clock < to ? g->clock : to;
        if (t > s)
            busy += t - s; /* the open segment of the running channel */
    }
    for (uint64_t k = 0; k < n; k++) {
        const struct sim_busy *b = &g->ring[(g->ring_count - 1 - k) % SIM_RING];
        if (b->end_ns <= earliest)
            break; /* segments are in engine-time order: everything older ends earlier */
        if (slot >= 0 && (b->slot != (uint32_t)slot + 1 || b->pid != pid))
            continue;
        uint64_t s = b->start_ns > earliest ? b->start_ns : earliest;
        uint64_t t = b->end_ns < to ? b->end_ns : to;
        if (t > s)
            busy += t - s;
    }
    if (covered_from)
        *covered_from = earliest;
    return busy;
}
