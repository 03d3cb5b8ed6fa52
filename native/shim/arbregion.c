/*
 * The arbiter region's lock and its repair (arbregion.h).
 */
#include "arbregion.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "arbsched.h"

struct sg_identity sg_arb_self;
int sg_arb_agent_live_fd = -1;
uint64_t sg_arb_last_reap_ns;
static int lock_logged, broken_logged;

bool sg_arb_client_is_mine(const struct sg_arb_client *cl)
{
    return cl->pid != 0 && sg_identity_is(&sg_arb_self, cl->pidns, cl->pid, cl->start_time);
}

/* The region file's descriptor for liveness locks: the GPU's, or the agent's while it reaps. */
static int live_fd_of(const struct sg_arbiter *a)
{
    for (int i = 0; i < SG_MAX_DEVICES; i++)
        if (sg_gpus[i].a == a)
            return sg_gpus[i].live_fd;
    return sg_arb_agent_live_fd;
}

/* The records are ours to touch only in a mapping made for them: a process's own GPU entry
 * knows (the agent maps none: its grants leave them alone). */
struct sg_arb_handoff *sg_arb_handoffs(const struct sg_arbiter *a)
{
    for (int i = 0; i < SG_MAX_DEVICES; i++)
        if (__atomic_load_n(&sg_gpus[i].a, __ATOMIC_RELAXED) == a)
            return sg_gpus[i].handoffs;
    return NULL;
}

void sg_arb_free_client_locked(struct sg_arbiter *a, int c)
{
    struct sg_arb_client *cl = &a->clients[c];
    if (cl->pid == 0)
        return;
    if (sg_arb_client_is_mine(cl))
        sg_live_drop(live_fd_of(a), (uint32_t)c);
    if (SG_ARB_TOKEN_HOLDER(a->token) == c) {
        __atomic_store_n(&a->token, SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1), __ATOMIC_RELEASE);
        a->last_release_ns = sg_mono_ns();
    }
    if (cl->state == SG_ARB_WAITING && a->waiting > 0)
        __atomic_store_n(&a->waiting, a->waiting - 1, __ATOMIC_RELAXED);
    if (cl->tenant < SG_ARB_MAX_TENANTS && a->tenants[cl->tenant].clients > 0)
        a->tenants[cl->tenant].clients--;
    __atomic_store_n(&cl->state, SG_ARB_FREE, __ATOMIC_RELAXED);
    __atomic_store_n(&cl->yield, 0, __ATOMIC_RELAXED);
    if (a->queued_by == (uint32_t)c + 1)
        a->queued_by = 0; /* its work died with it: nobody waits for its word */
    struct sg_arb_handoff *h = sg_arb_handoffs(a);
    if (h) { /* the next owner of the entry starts with none of these */
        h[c].behind = 0;
        h[c].offer = 0;
        h[c].taken = 0;
        h[c].flags = 0;
    }
    cl->start_time = 0;
    cl->flags = 0;
    cl->pidns = 0;
    cl->pid = 0;
}

/* Free the entries of dead processes (the token of a dead holder goes back). */
static void reap_locked(struct sg_arbiter *a)
{
    int fd = live_fd_of(a);
    if (!sg_arb_self.pid)
        sg_identity_read(&sg_arb_self);
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
        struct sg_arb_client *cl = &a->clients[c];
        if (cl->pid == 0 || sg_arb_client_is_mine(cl))
            continue;
        if (!sg_entry_alive(fd, (uint32_t)c, cl->flags, cl->pidns, cl->pid, cl->start_time,
                            &sg_arb_self)) {
            if (SG_ARB_TOKEN_HOLDER(a->token) == c)
                a->reclaims++;
            sg_arb_free_client_locked(a, c);
        }
    }
    sg_arb_last_reap_ns = sg_mono_ns();
}

/* The holder kept the token SG_ARB_STALL_NS past its quantum: it is stopped (SIGSTOP, docker
 * pause, a debugger) or stuck in one very long kernel.  Charge it what it held, take the token
 * back and hand it on; when it runs again it finds the token gone and asks anew. */
void sg_arb_take_back_locked(struct sg_arbiter *a, int holder, uint64_t now)
{
    struct sg_arb_client *h = &a->clients[holder];
    /* Its own process knows its idle time; from here the whole time held is charged. */
    if (sg_arb_pay_locked(a, holder, now > h->grant_ns ? now - h->grant_ns : 0, now))
        a->tenants[h->tenant].last_active_ns = now;
    h->grant_ns = now;
    __atomic_store_n(&h->state, SG_ARB_IDLE, __ATOMIC_RELAXED);
    __atomic_store_n(&h->yield, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->token, SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1), __ATOMIC_RELEASE);
    a->last_release_ns = now;
    a->stall_reclaims++;
    int best = sg_arb_pick_locked(a, now);
    if (best >= 0)
        sg_arb_grant_locked(a, best, now);
}

/* Reap, and hand a token freed by a dead holder to the best waiter. */
void sg_arb_reap_and_pick_locked(struct sg_arbiter *a)
{
    reap_locked(a);
    if (SG_ARB_TOKEN_HOLDER(a->token) < 0 && a->waiting) {
        uint64_t now = sg_mono_ns();
        int best = sg_arb_pick_locked(a, now);
        if (best >= 0)
            sg_arb_grant_locked(a, best, now);
    }
}

/* EOWNERDEAD: a process died holding the lock, maybe half-way through an update.  The client
 * entries are the truth: rebuild the counts and the holder/state pair from them. */
static void repair_locked(struct sg_arbiter *a)
{
    reap_locked(a);
    int holder = SG_ARB_TOKEN_HOLDER(a->token);
    if (holder >= SG_ARB_MAX_CLIENTS || (holder >= 0 && a->clients[holder].pid == 0)) {
        __atomic_store_n(&a->token, SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1), __ATOMIC_RELEASE);
        holder = -1;
    }
    uint32_t waiting = 0;
    for (int t = 0; t < SG_ARB_MAX_TENANTS; t++)
        a->tenants[t].clients = 0;
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
        struct sg_arb_client *cl = &a->clients[c];
        if (cl->pid == 0)
            continue;
        if (cl->tenant >= SG_ARB_MAX_TENANTS) {
            cl->pid = 0;
            cl->state = SG_ARB_FREE;
            continue;
        }
        a->tenants[cl->tenant].clients++;
        if (c == holder)
            cl->state = SG_ARB_HOLDING;
        else if (cl->state == SG_ARB_HOLDING || cl->state > SG_ARB_HOLDING)
            cl->state = SG_ARB_IDLE; /* its waiter loop asks again */
        if (cl->state == SG_ARB_WAITING)
            waiting++;
    }
    __atomic_store_n(&a->waiting, waiting, __ATOMIC_RELAXED);
    a->recoveries++;
}

int sg_arb_region_problem(const struct sg_arbiter *a, uint64_t file_size, const uint8_t uuid[16],
                          const char *path, struct sg_err *e)
{
    if (file_size < sizeof(struct sg_region_header))
        return sg_fail(e, SG_E_CONFIG, "%s: truncated (%llu bytes)", path,
                       (unsigned long long)file_size);
    if (a->hdr.magic != SG_MAGIC_ARBITER)
        return sg_fail(e, SG_E_CONFIG, "%s: not a sharegpu arbiter region (bad magic 0x%x)", path,
                       a->hdr.magic);
    if (a->hdr.abi_major != SG_ABI_MAJOR) {
        sg_fail(e, SG_E_CONFIG, "%s: ABI %u.%u, this is %d.x", path, a->hdr.abi_major,
                a->hdr.abi_minor, SG_ABI_MAJOR);
        return 1;
    }
    if (file_size < sizeof *a || a->hdr.total_size < sizeof *a)
        return sg_fail(e, SG_E_CONFIG, "%s: truncated (%llu of %zu bytes)", path,
                       (unsigned long long)file_size, sizeof *a);
    if (a->tenant_slots != SG_ARB_MAX_TENANTS || a->client_slots != SG_ARB_MAX_CLIENTS)
        return sg_fail(e, SG_E_CONFIG, "%s: %u tenant / %u client slots, expected %d / %d", path,
                       a->tenant_slots, a->client_slots, SG_ARB_MAX_TENANTS, SG_ARB_MAX_CLIENTS);
    if (memcmp(a->uuid, uuid, 16) != 0)
        return sg_fail(e, SG_E_CONFIG, "%s: the region belongs to another GPU", path);
    uint64_t q = __atomic_load_n(&a->quantum_ns, __ATOMIC_RELAXED);
    if (q < SG_ARB_MIN_QUANTUM_NS || q > SG_ARB_MAX_QUANTUM_NS)
        return sg_fail(e, SG_E_CONFIG, "%s: quantum %llu ns out of range", path,
                       (unsigned long long)q);
#ifdef __GLIBC__
    if ((__atomic_load_n(&a->lock.mutex.__data.__kind, __ATOMIC_RELAXED) & (16 | 128)) !=
        (16 | 128))
        return sg_fail(e, SG_E_CONFIG,
                       "%s: the arbiter mutex is not initialised as robust and process-shared",
                       path);
#endif
    return 0;
}

bool sg_arb_region_broken(const struct sg_arbiter *a)
{
    return __atomic_load_n(&a->broken_since_ns, __ATOMIC_ACQUIRE) != 0;
}

/* The lock was held past SG_ARB_LOCK_DEADLINE_NS: no critical section lasts near that long, so
 * its holder is stopped, asleep or hostile.  Mark the region broken (abi.h, 1.7): nobody waits
 * on its lock again, every client launches unarbitrated, and the agent replaces the file. */
static void mark_broken(struct sg_arbiter *a)
{
    __atomic_fetch_add(&a->lock_timeouts, 1, __ATOMIC_RELAXED);
    uint64_t healthy = 0, now = sg_mono_ns();
    __atomic_compare_exchange_n(&a->broken_since_ns, &healthy, now ? now : 1, false,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    sg_log_once(&broken_logged,
                "another process held the GPU arbiter's lock past %llu ms: the GPU runs "
                "unarbitrated until the agent replaces its region",
                (unsigned long long)(SG_ARB_LOCK_DEADLINE_NS / 1000000));
}

/* The region lock, waited for at most SG_ARB_LOCK_DEADLINE_NS, never on a broken region: no
 * tenant holds up another's launches for longer than that.  A waiter asleep for the token comes
 * back at least every LIVENESS_POLL_NS, finds the lock refused and launches unarbitrated. */
int sg_arb_lock(struct sg_arbiter *a)
{
    if (sg_arb_region_broken(a))
        return -1; /* abandoned: whoever holds its lock, nothing of it is ours to change */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + SG_ARB_LOCK_DEADLINE_NS;
    until.tv_sec += (time_t)(ns / 1000000000ull);
    until.tv_nsec = (long)(ns % 1000000000ull);
    int rc = pthread_mutex_clocklock(&a->lock.mutex, CLOCK_MONOTONIC, &until);
    if (rc == ETIMEDOUT) {
        mark_broken(a);
        return -1;
    }
    if (rc == EOWNERDEAD) {
        repair_locked(a);
        pthread_mutex_consistent(&a->lock.mutex);
        return 0;
    }
    if (rc != 0)
        sg_log_once(&lock_logged, "cannot lock the GPU arbiter mutex: %s", strerror(rc));
    return rc == 0 ? 0 : -1;
}

void sg_arb_unlock(struct sg_arbiter *a)
{
    pthread_mutex_unlock(&a->lock.mutex);
}
