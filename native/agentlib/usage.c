/*
 * The agent's side of the usage region (ledger).  This file includes the shim's ledger.c, so
 * the lock protocol (robust mutex, EOWNERDEAD: recompute the totals from the slots, free dead
 * slots, mark consistent), the liveness test and the release of a slot are the shim's own code,
 * not a copy that could drift.  The ledger's process-local parts (fork and exit hooks, and the
 * allocation table they hold: alloctable.c) are compiled but unused here: the agent holds no
 * slot, so its exit hook returns at once (sg_usage_map is NULL outside a call).
 */
#include "../shim/ledger.c"

#include "internal.h"

static pthread_mutex_t agent_mu = PTHREAD_MUTEX_INITIALIZER;

int sga_usage_reap(const char *path, struct sga_usage_reaped *out, int cap, int *recovered,
                   char err[SGA_ERR_LEN])
{
    void *m;
    *recovered = 0;
    if (sga_map(path, SG_MAGIC_USAGE, sizeof(struct sg_usage), &m, err) < 0)
        return -1;
    struct sg_usage *u = m;
    pthread_mutex_lock(&agent_mu);
    sg_usage_map = u;
    live_fd = sg_live_open(path);
    uint64_t before = u->recoveries;
    struct sg_err e = {0};
    int n = 0;
    if (usage_lock(&e) < 0) {
        n = sga_error(err, "%s", e.msg);
    } else {
        *recovered = u->recoveries != before;
        for (uint32_t s = 0; s < u->slot_count && s < SG_MAX_PROCS; s++) {
            struct sg_usage_proc *p = &u->procs[s];
            if (p->pid == 0)
                continue;
            int32_t host = __atomic_load_n(&p->host_pid, __ATOMIC_RELAXED);
            /* A host pid the agent learned is judged in the agent's (the host's) namespace. */
            if (slot_alive(s, p, host > 0 ? host : p->pid, host > 0 ? 0 : p->pidns))
                continue;
            if (n < cap) {
                struct sga_usage_reaped *r = &out[n];
                r->pid = p->pid;
                r->host_pid = host;
                r->start_time = p->start_time;
                for (int d = 0; d < SG_MAX_DEVICES; d++)
                    r->mem_bytes[d] = p->dev[d].mem_bytes - p->dev[d].spare_bytes;
            }
            release_slot_locked(s);
            n++;
        }
        usage_unlock();
    }
    sg_usage_map = NULL;
    if (live_fd >= 0)
        close(live_fd);
    live_fd = -1;
    pthread_mutex_unlock(&agent_mu);
    sga_unmap(m, sizeof(struct sg_usage));
    return n;
}

int sga_usage_set_overhead(const char *path, int idx, uint64_t bytes, char err[SGA_ERR_LEN])
{
    if (idx < 0 || idx >= SG_MAX_DEVICES)
        return sga_error(err, "device index %d out of range", idx);
    void *m;
    if (sga_map(path, SG_MAGIC_USAGE, sizeof(struct sg_usage), &m, err) < 0)
        return -1;
    struct sg_usage *u = m;
    __atomic_store_n(&u->devices[idx].overhead_bytes, bytes, __ATOMIC_RELAXED);
    sga_unmap(m, sizeof(struct sg_usage));
    return 0;
}

int sga_usage_swap_overhead(const char *path, int idx, uint64_t expected, uint64_t bytes,
                            char err[SGA_ERR_LEN])
{
    if (idx < 0 || idx >= SG_MAX_DEVICES)
        return sga_error(err, "device index %d out of range", idx);
    void *m;
    if (sga_map(path, SG_MAGIC_USAGE, sizeof(struct sg_usage), &m, err) < 0)
        return -1;
    struct sg_usage *u = m;
    int stored = __atomic_compare_exchange_n(&u->devices[idx].overhead_bytes, &expected, bytes,
                                             false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    sga_unmap(m, sizeof(struct sg_usage));
    return stored;
}
