/*
 * Interprocess events: the table of exported events in the shared state.
 *
 * A CUDA event exported with cuIpcGetEventHandle is one event for every process that opens it:
 * a record in any of them replaces what a later wait, query or synchronize in any of them sees.
 * So the last record lives here, as a ticket (a kernel of one channel on one GPU), and each
 * process's CUevent for it only names an entry: its index and the generation it was allocated
 * at, so that a handle kept after the exporter destroyed the event (undefined in CUDA) finds a
 * later user's entry stale and sees a completed event instead.  An exporter that dies frees
 * its entries (sim_ipc_event_drop_locked, from slot teardown).
 */
#include "sim.h"

int sim_ipc_event_alloc(struct sim_err *e, struct sim_state *st, uint32_t *index, uint64_t *gen)
{
    int s = sim_slot_acquire(e, st);
    if (s < 0)
        return -1;
    if (sim_lock(e, st) < 0)
        return -1;
    for (uint32_t i = 0; i < SIM_IPC_EVENTS; i++) {
        struct sim_ipc_event *ev = &st->ipc_event[i];
        if (ev->owner)
            continue;
        ev->gen++;
        ev->owner = s + 1;
        ev->dev = 0;
        ev->last = (struct sim_ticket){0};
        *index = i;
        *gen = ev->gen;
        sim_unlock(st);
        return 0;
    }
    sim_unlock(st);
    return sim_fail(e, SIM_ENOMEM, "all %d interprocess events of the simulated GPU are exported",
                    SIM_IPC_EVENTS);
}

/* Under lock: the entry (index, gen) names, or NULL when freed or reused since. */
static struct sim_ipc_event *entry_locked(struct sim_state *st, uint32_t index, uint64_t gen)
{
    if (index >= SIM_IPC_EVENTS)
        return NULL;
    struct sim_ipc_event *ev = &st->ipc_event[index];
    return ev->owner && ev->gen == gen ? ev : NULL;
}

void sim_ipc_event_free(struct sim_state *st, uint32_t index, uint64_t gen)
{
    int s = sim_slot_self(); /* a forked child (no slot) never frees its parent's entries */
    if (s < 0 || sim_lock(NULL, st) < 0)
        return;
    struct sim_ipc_event *ev = entry_locked(st, index, gen);
    if (ev && ev->owner == s + 1)
        ev->owner = 0;
    sim_unlock(st);
}

int sim_ipc_event_live(struct sim_err *e, struct sim_state *st, uint32_t index, uint64_t gen)
{
    if (sim_lock(e, st) < 0)
        return -1;
    int live = entry_locked(st, index, gen) != NULL;
    sim_unlock(st);
    return live;
}

int sim_ipc_event_publish(struct sim_err *e, struct sim_state *st, uint32_t index, uint64_t gen,
                          int dev, const struct sim_ticket *t)
{
    if (sim_lock(e, st) < 0)
        return -1;
    struct sim_ipc_event *ev = entry_locked(st, index, gen);
    if (ev) {
        ev->dev = dev;
        ev->last = *t; /* a done ticket reads as done: nothing to wait for */
    }
    sim_unlock(st);
    return 0;
}

int sim_ipc_event_read(struct sim_err *e, struct sim_state *st, uint32_t index, uint64_t gen,
                       int *dev, struct sim_ticket *t)
{
    if (sim_lock(e, st) < 0)
        return -1;
    const struct sim_ipc_event *ev = entry_locked(st, index, gen);
    *dev = ev ? ev->dev : 0;
    *t = ev ? ev->last : (struct sim_ticket){0};
    sim_unlock(st);
    return 0;
}

void sim_ipc_event_drop_locked(struct sim_state *st, int s)
{
    for (uint32_t i = 0; i < SIM_IPC_EVENTS; i++)
        if (st->ipc_event[i].owner == s + 1)
            st->ipc_event[i].owner = 0;
}
