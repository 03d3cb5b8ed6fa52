/*
 * The execution engine: one per GPU, shared by every process, running one kernel at a time.
 *
 * Model.  A kernel is an interval on its GPU's engine.  At launch, under the state lock:
 *     start = max(now, stream tail, engine free_at)      end = start + duration
 *     engine free_at = end;  stream tail = end;  ring[k % SIM_RING] = (start, end, pid)
 * so the engine is a FIFO across all streams and processes (the hardware's time-slicing of
 * contexts, coarsened to whole kernels), a stream is in order, and the ring gives NVML its
 * utilization.  Nothing runs in the background: waiting for work = sleeping until its end time.
 *
 * Cost of a launch: one uncontended robust mutex, one vDSO clock read, ~10 stores.  No
 * allocation, no system call.  A stream may hold SIM_QDEPTH pending kernels (the hardware's
 * launch queue); one more blocks until the oldest completes.
 */
#include "sim.h"

#include <unistd.h>

uint64_t sim_queue_tail(const struct sim_queue *q)
{
    return __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
}

int sim_engine_submit(struct sim_err *e, struct sim_state *st, int dev, int slot,
                      struct sim_queue *q, const uint64_t *dur_ns, size_t count)
{
    const int32_t pid = (int32_t)getpid();
    size_t done = 0;
    while (done < count) {
        if (sim_lock(e, st) < 0)
            return -1;
        uint64_t now = sim_now_ns();
        struct sim_gpu *g = &st->gpu[dev];
        uint64_t wait_for = 0;
        for (; done < count; done++) {
            if (q->n >= SIM_QDEPTH) {
                uint64_t oldest = q->ends[q->n % SIM_QDEPTH];
                if (oldest > now) {
                    wait_for = oldest; /* queue full: sleep outside the lock */
                    break;
                }
            }
            uint64_t start = now;
            uint64_t tail = q->tail;
            if (tail > start)
                start = tail;
            if (g->free_at > start)
                start = g->free_at;
            uint64_t end = start + dur_ns[done];
            g->free_at = end;
            __atomic_store_n(&q->tail, end, __ATOMIC_RELEASE);
            q->ends[q->n % SIM_QDEPTH] = end;
            q->n++;
            if (dur_ns[done] > 0) {
                struct sim_busy *b = &g->ring[g->ring_count % SIM_RING];
                b->start_ns = start;
                b->end_ns = end;
                b->pid = pid;
                g->ring_count++;
                if (slot >= 0)
                    st->slot[slot].busy_ns[dev] += dur_ns[done];
            }
        }
        sim_unlock(st);
        if (wait_for)
            sim_sleep_until(wait_for);
    }
    return 0;
}

uint64_t sim_busy_locked(const struct sim_state *st, int dev, int pid, uint64_t from, uint64_t to,
                         uint64_t *covered_from)
{
    const struct sim_gpu *g = &st->gpu[dev];
    uint64_t n = g->ring_count < SIM_RING ? g->ring_count : SIM_RING;
    uint64_t busy = 0, earliest = from;
    if (g->ring_count > SIM_RING) {
        /* History was overwritten: the ring only describes time from its oldest entry on. */
        const struct sim_busy *oldest = &g->ring[g->ring_count % SIM_RING];
        if (oldest->start_ns > earliest)
            earliest = oldest->start_ns;
    }
    for (uint64_t k = 0; k < n; k++) {
        const struct sim_busy *b = &g->ring[(g->ring_count - 1 - k) % SIM_RING];
        if (b->end_ns <= earliest && b->start_ns <= earliest)
            break; /* launch order = engine order: everything older ends earlier */
        if (pid && b->pid != pid)
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
