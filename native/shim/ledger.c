/*
 * The memory ledger: process slots and per-device totals in the tenant's usage region (shared
 * by every process of the tenant, guarded by its robust mutex).  What each live allocation was
 * charged (pointer or handle -> device and bytes) is the process-local table of alloctable.c.
 *
 * Admission (sg_reserve), atomic across processes:
 *     lock usage mutex; follow a limits resize (one acquire load when there is none);
 *     if used + overhead + size <= cap: charge slot and device total; unlock;
 *     then the real allocation; on failure sg_unreserve gives the bytes back.
 * Because the bytes are charged before the real call, racing processes can never together
 * exceed the cap; exact bytes are charged, so a cap of N bytes admits exactly N.
 *
 * The spare (ABI 1.4): a process keeps some bytes it has charged but is not using, in its own
 * slot's spare_bytes (part of its mem_bytes, so of the device total).  A free puts its bytes
 * there, an allocation that fits takes them back with one compare-and-swap on the process's
 * own slot: an alloc/free pair of a running program takes no shared lock at all.  The spare is
 * bounded (spare_limit: min(64 MiB, cap / 16); a free that would pass it gives back down to
 * half, under the lock), an allocation under the lock tops it up from free headroom only, and it
 * never hides memory:
 *   - an admission that would be refused first takes every process's spare back (steal_spares:
 *     an exchange with 0 under the lock), so the cap still admits exactly N bytes;
 *   - views (cuMemGetInfo, the process list, `sharegpu tenants`) count spares as free;
 *   - a resize (new limits generation) empties the spare of each process as it follows it,
 *     and the fast path is only taken under the generation it was set up in;
 *   - the usage file is writable by the tenant's processes, so the fast path never admits on
 *     the slot's spare_bytes alone: it spends only what our own count in process memory
 *     (own_spare) also holds, and a slot's spare above SPARE_MAX (no process keeps that much)
 *     is written by someone else: neither given back by a steal nor counted free by a view.
 *
 * Cost per alloc+free pair (goal: < 200 ns added, bench/overhead.py): with the spare, a CAS
 * each on our own count and on our own slot, a thread-local context -> device cache in front
 * of cuCtxGetDevice, and the process-local allocation table (an open-addressing insert and
 * delete under a private futex lock).  Without it (the first allocation, a big one, near the cap):
 * one uncontended robust-mutex lock/unlock, a 16-device UUID compare, a vDSO clock read.
 *
 * Dead processes: a slot is live while its owner holds the slot's liveness lock (live.c: an OFD
 * lock on the usage file, dropped by the kernel at exit, in whatever pid namespace); a slot of an
 * older shim without one is judged by pid + start time, and only from its own pid namespace.
 * Dead slots are reclaimed (their bytes taken off
 * the device totals) under the mutex: whenever an allocation would otherwise be refused, and at
 * most every 100 ms otherwise, and at every EOWNERDEAD recovery.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

#define SCAN_INTERVAL_NS 100000000ull /* 100 ms */
#define ADMISSION_LOCK_WAIT_NS 2000000000ull /* an admission or a view waits this long for the lock; a
                                               free waits as long as it takes (its credit must
                                               not be lost) */
#define MAX_ORDINALS 64
#define SPARE_MAX (64ull << 20) /* the most a process keeps spare per device (see the top) */

/* ---- process identity ------------------------------------------------------------------- */

/* All guarded by the usage mutex, reset in the child after fork.  The identity is read on
 * first need, under the mutex: by mine() and slot_alive() (an occupied slot to recognise or
 * judge) and by the claim.  A process that only looks (cuMemGetInfo on a tenant whose slots
 * are free: every process at start-up) never reads it, which saves it six system calls on
 * /proc (sg_identity_read). */
static struct sg_identity self;
static int self_slot = -1; /* written under the usage mutex; read relaxed by the spare paths */
/* 1 in the process that set it up; the kernel zeroes the page in a child of fork or of a raw
 * clone (MADV_WIPEONFORK), so one load tells a child that inherited our slot and spare, before
 * the lock-free path spends the parent's spare (sg_reserve).  NULL: not available. */
static volatile uint32_t *born_here;
/* Our spare per limits index by our own count, in process memory: the usage file is writable
 * by every process of the tenant, so its spare_bytes alone never admits anything.  The fast
 * path spends what both say; a free puts bytes into both; only a steal (another process, under
 * the lock) lowers the slot's alone, and we follow it at our next locked call (own_follow). */
static uint64_t own_spare[SG_MAX_DEVICES]; /* [atomic relaxed] */
static int live_fd = -1; /* the usage file, for liveness locks (our slot's, and tests of others') */
static uint64_t last_scan_ns;
static int slot_logged, lock_logged, busy_logged;

static void ensure_identity(void)
{
    if (!self.pid)
        sg_identity_read(&self);
}

static bool mine(const struct sg_usage_proc *p)
{
    if (p->pid == 0)
        return false;
    ensure_identity();
    return sg_identity_is(&self, p->pidns, p->pid, p->start_time);
}

static bool slot_alive(uint32_t s, const struct sg_usage_proc *p, int32_t pid, uint64_t pidns)
{
    ensure_identity();
    return sg_entry_alive(live_fd, s, p->flags, pidns, pid, p->start_time, &self);
}

/* ---- the usage mutex -------------------------------------------------------------------- */

static void recompute_totals_locked(void)
{
    struct sg_usage *u = sg_usage_map;
    for (int d = 0; d < SG_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (uint32_t s = 0; s < u->slot_count && s < SG_MAX_PROCS; s++)
            if (u->procs[s].pid != 0)
                sum += u->procs[s].dev[d].mem_bytes;
        u->devices[d].mem_used_bytes = sum;
    }
}

/* Take bytes off overhead_bytes (never below 0: the agent may have replaced the estimate by a
 * smaller measurement). */
static void overhead_credit_locked(int idx, uint64_t bytes)
{
    uint64_t *o = &sg_usage_map->devices[idx].overhead_bytes;
    uint64_t old = __atomic_load_n(o, __ATOMIC_RELAXED), now;
    do
        now = old >= bytes ? old - bytes : 0;
    while (!__atomic_compare_exchange_n(o, &old, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* A slot's record of its contexts' memory (abi.h ctx_mib): delta MiB on device idx.  A device
 * with no entry and none free is not recorded (the reconciler counts it). */
static void slot_ctx_note_locked(struct sg_usage_proc *p, int idx, int64_t delta_mib)
{
    uint32_t *free_entry = NULL;
    for (int i = 0; i < SG_SLOT_CTX_ENTRIES; i++) {
        uint32_t e = p->ctx_mib[i];
        if (!e) {
            if (!free_entry)
                free_entry = &p->ctx_mib[i];
            continue;
        }
        if ((int)(e >> 24) != idx)
            continue;
        int64_t mib = (int64_t)(e & SG_SLOT_CTX_MIB_MAX) + delta_mib;
        if (mib > SG_SLOT_CTX_MIB_MAX)
            mib = SG_SLOT_CTX_MIB_MAX;
        p->ctx_mib[i] = mib > 0 ? (uint32_t)idx << 24 | (uint32_t)mib : 0;
        return;
    }
    if (free_entry && delta_mib > 0)
        *free_entry = (uint32_t)idx << 24 |
                      (uint32_t)(delta_mib < SG_SLOT_CTX_MIB_MAX ? delta_mib : SG_SLOT_CTX_MIB_MAX);
}

static void release_slot_locked(uint32_t s)
{
    struct sg_usage *u = sg_usage_map;
    struct sg_usage_proc *p = &u->procs[s];
    /* Contexts still recorded are a killed process's (an exit credits its own first): the
     * driver freed them with the process. */
    for (int i = 0; i < SG_SLOT_CTX_ENTRIES; i++) {
        uint32_t e = p->ctx_mib[i];
        if (e && (e >> 24) < SG_MAX_DEVICES)
            overhead_credit_locked((int)(e >> 24), (uint64_t)(e & SG_SLOT_CTX_MIB_MAX) << 20);
        p->ctx_mib[i] = 0;
    }
    for (int d = 0; d < SG_MAX_DEVICES; d++) {
        uint64_t b = p->dev[d].mem_bytes, used = u->devices[d].mem_used_bytes;
        u->devices[d].mem_used_bytes = used >= b ? used - b : 0;
        p->dev[d].mem_bytes = 0;
        __atomic_store_n(&p->dev[d].spare_bytes, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->dev[d].alloc_count, 0, __ATOMIC_RELAXED);
    }
    if (mine(p)) {
        sg_live_drop(live_fd, s);
        for (int d = 0; d < SG_MAX_DEVICES; d++)
            __atomic_store_n(&own_spare[d], 0, __ATOMIC_RELAXED);
    }
    p->start_time = 0;
    p->attached_ns = 0;
    p->flags = 0;
    p->pidns = 0;
    __atomic_store_n(&p->host_pid, 0, __ATOMIC_RELAXED);
    p->pid = 0;
}

static void reap_locked(void)
{
    struct sg_usage *u = sg_usage_map;
    for (uint32_t s = 0; s < u->slot_count && s < SG_MAX_PROCS; s++) {
        struct sg_usage_proc *p = &u->procs[s];
        if (p->pid == 0 || mine(p))
            continue;
        if (!slot_alive(s, p, p->pid, p->pidns))
            release_slot_locked(s);
    }
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void scan_locked(void)
{
    reap_locked();
    last_scan_ns = mono_ns();
}

static void maybe_scan_locked(void)
{
    if (mono_ns() - last_scan_ns >= SCAN_INTERVAL_NS)
        scan_locked();
}

/* Lock the usage mutex; wait at most timeout_ns when nonzero (then SG_E_BUSY on expiry: a
 * process of the tenant stopped inside the critical section must not hang the others'
 * admissions for ever). */
static int usage_lock_within(struct sg_err *e, uint64_t timeout_ns)
{
    pthread_mutex_t *m = &sg_usage_map->lock.mutex;
    int rc;
    if (timeout_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        rc = pthread_mutex_timedlock(m, &ts);
        if (rc == ETIMEDOUT)
            return sg_fail(e, SG_E_BUSY,
                           "%s/%s: the usage lock was held for %llu ms (a process of this tenant "
                           "stopped inside it?)",
                           sg_tenant_dir, SG_USAGE_FILE,
                           (unsigned long long)(timeout_ns / 1000000u));
    } else {
        rc = pthread_mutex_lock(m);
    }
    if (rc == EOWNERDEAD) {
        /* The previous owner died holding the lock, possibly half-way through an update: the
         * slots are the truth (abi.h invariant); rebuild the totals from them and drop the
         * slots of dead processes. */
        recompute_totals_locked();
        sg_usage_map->recoveries++;
        scan_locked();
        pthread_mutex_consistent(m);
        return 0;
    }
    if (rc != 0) {
        sg_fail(e, SG_E_CONFIG, "%s/%s: cannot lock the usage mutex: %s", sg_tenant_dir,
                SG_USAGE_FILE, strerror(rc));
        return SG_E_CONFIG;
    }
    return 0;
}

static int usage_lock(struct sg_err *e)
{
    return usage_lock_within(e, 0);
}

static void usage_unlock(void)
{
    pthread_mutex_unlock(&sg_usage_map->lock.mutex);
}

static void forget_parent_slot(void);
static void raw_clone_child(void);

/* Our slot, claimed on first use.  -1 when every slot is taken by a live process. */
static int ensure_slot_locked(void)
{
    struct sg_usage *u = sg_usage_map;
    /* A child of a raw clone system call ran no atfork handler: it still has its parent's
     * identity and slot, and would charge the parent, whose exit would then credit memory the
     * child still holds.  sg_reserve tells it first (born_here); where that page is missing,
     * or on a path that reached here first (a context's admission), one getpid() does. */
    if (self.pid && self.pid != (int32_t)getpid())
        forget_parent_slot(); /* only what names the parent: the caller may hold our locks */
    uint32_t n = u->slot_count < SG_MAX_PROCS ? u->slot_count : SG_MAX_PROCS;
    if (self_slot >= 0 && (uint32_t)self_slot < n && mine(&u->procs[self_slot]))
        return self_slot;
    __atomic_store_n(&self_slot, -1, __ATOMIC_RELAXED);
    ensure_identity(); /* the claim writes it, even when no slot is occupied to call mine() */
    /* A slot with our identity that is not ours is what this process held before an exec:
     * the driver released that memory with the old address space. */
    for (uint32_t s = 0; s < n; s++)
        if (mine(&u->procs[s]))
            release_slot_locked(s);
    if (live_fd < 0) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/%s", sg_tenant_dir, SG_USAGE_FILE);
        live_fd = sg_live_open(path);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t s = 0; s < n; s++) {
            struct sg_usage_proc *p = &u->procs[s];
            if (p->pid != 0)
                continue;
            /* The lock is taken before the slot is published: nobody sees a slot whose lock
             * is not held yet.  A byte still locked belongs to a live process that lost its
             * slot by mistake: leave it. */
            bool locked = sg_live_hold(live_fd, s);
            if (!locked && live_fd >= 0)
                continue;
            memset(p->dev, 0, sizeof p->dev);
            memset(p->ctx_mib, 0, sizeof p->ctx_mib);
            p->start_time = self.start;
            p->pidns = self.pidns;
            p->flags = locked ? SG_ENTRY_LIVE_LOCK : 0;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            p->attached_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
            __atomic_store_n(&p->host_pid, 0, __ATOMIC_RELAXED);
            p->pid = self.pid;
            __atomic_store_n(&self_slot, (int)s, __ATOMIC_RELAXED);
            return self_slot;
        }
        if (pass == 0)
            scan_locked();
    }
    return -1;
}

int sg_usage_slot(void)
{
    if (sg_mode() != SG_MODE_ACTIVE)
        return -1;
    struct sg_err e;
    if (usage_lock(&e) < 0)
        return -1;
    int s = ensure_slot_locked();
    usage_unlock();
    return s;
}

/* ---- devices --------------------------------------------------------------------------- */

static struct {
    int state; /* [atomic acquire/release] 0 unknown, 1 uuid valid */
    uint8_t uuid[16];
} ordinals[MAX_ORDINALS];
static pthread_mutex_t ordinal_lock = PTHREAD_MUTEX_INITIALIZER;

int sg_ordinal_uuid(CUdevice dev, uint8_t uuid[16])
{
    if (dev < 0 || dev >= MAX_ORDINALS)
        return -1;
    if (__atomic_load_n(&ordinals[dev].state, __ATOMIC_ACQUIRE) == 1) {
        memcpy(uuid, ordinals[dev].uuid, 16);
        return 0;
    }
    CUuuid u;
    CUresult res = CUDA_ERROR_NOT_FOUND;
    if (SG_REAL(cuDeviceGetUuid_v2))
        res = SG_REAL(cuDeviceGetUuid_v2)(&u, dev);
    if (res != CUDA_SUCCESS && SG_REAL(cuDeviceGetUuid))
        res = SG_REAL(cuDeviceGetUuid)(&u, dev);
    if (res != CUDA_SUCCESS)
        return -1; /* not cached: may succeed after cuInit */
    pthread_mutex_lock(&ordinal_lock);
    memcpy(ordinals[dev].uuid, u.bytes, 16);
    __atomic_store_n(&ordinals[dev].state, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ordinal_lock);
    memcpy(uuid, u.bytes, 16);
    return 0;
}

int sg_current_ordinal(CUdevice *dev)
{
    if (!SG_REAL(cuCtxGetDevice))
        return CUDA_ERROR_NOT_FOUND;
    return SG_REAL(cuCtxGetDevice)(dev);
}

/* The current context and its device: one driver call when this thread asked about the same
 * context before (a context's device never changes; a destroyed one may come back under the
 * same handle, which moves the stream epoch). */
static __thread struct {
    CUcontext ctx;
    CUdevice dev;
    uint32_t epoch;
} last_ctx __attribute__((tls_model("initial-exec")));

int sg_current_place(CUcontext *ctx, CUdevice *dev)
{
    *ctx = NULL;
    if (!SG_REAL(cuCtxGetCurrent) || SG_REAL(cuCtxGetCurrent)(ctx) != CUDA_SUCCESS || !*ctx) {
        *ctx = NULL;
        return sg_current_ordinal(dev); /* the driver's own answer to no context */
    }
    uint32_t epoch = __atomic_load_n(&sg_stream_epoch, __ATOMIC_ACQUIRE);
    if (last_ctx.ctx == *ctx && last_ctx.epoch == epoch) {
        *dev = last_ctx.dev;
        return CUDA_SUCCESS;
    }
    int res = sg_current_ordinal(dev);
    if (res == CUDA_SUCCESS) {
        last_ctx.ctx = *ctx;
        last_ctx.dev = *dev;
        last_ctx.epoch = epoch;
    }
    return res;
}

static int match_locked(const uint8_t *uuid)
{
    if (!uuid)
        return -1;
    for (uint32_t i = 0; i < sg_lim.device_count; i++)
        if (memcmp(sg_lim.devices[i].uuid, uuid, 16) == 0)
            return (int)i;
    return -1;
}

/* ---- admission ------------------------------------------------------------------------- */

static bool fits_locked(int idx, uint64_t bytes)
{
    const struct sg_usage_device *d = &sg_usage_map->devices[idx];
    uint64_t used = d->mem_used_bytes;
    uint64_t ovh = __atomic_load_n(&d->overhead_bytes, __ATOMIC_RELAXED);
    uint64_t total;
    if (__builtin_add_overflow(used, ovh, &total) || __builtin_add_overflow(total, bytes, &total))
        return false;
    return total <= sg_lim.devices[idx].mem_cap_bytes;
}

static void charge_locked(int slot, int idx, uint64_t bytes)
{
    struct sg_usage *u = sg_usage_map;
    u->procs[slot].dev[idx].mem_bytes += bytes;
    u->devices[idx].mem_used_bytes += bytes;
    if (u->devices[idx].mem_used_bytes > u->devices[idx].mem_peak_bytes)
        u->devices[idx].mem_peak_bytes = u->devices[idx].mem_used_bytes;
}

static void uncharge_locked(int idx, uint64_t bytes)
{
    struct sg_usage *u = sg_usage_map;
    int s = self_slot;
    if (s < 0 || !mine(&u->procs[s]))
        return; /* our slot was released (exit hook ran): its bytes went with it */
    struct sg_usage_proc_dev *pd = &u->procs[s].dev[idx];
    uint64_t amt = bytes < pd->mem_bytes ? bytes : pd->mem_bytes;
    pd->mem_bytes -= amt;
    uint64_t used = u->devices[idx].mem_used_bytes;
    u->devices[idx].mem_used_bytes = used >= amt ? used - amt : 0;
}

static void count_oom_locked(int slot, int idx)
{
    struct sg_usage *u = sg_usage_map;
    if (slot >= 0)
        __atomic_fetch_add(&u->procs[slot].dev[idx].oom_events, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&u->devices[idx].oom_events, 1, __ATOMIC_RELAXED);
}

/* ---- the spare (see the top) ------------------------------------------------------------ */

/* Per ordinal: (limits generation << 8) | (limits index + 1), set under the lock when an
 * admission matched the ordinal; 0 unknown.  The fast path trusts it only while the limits
 * generation is the same. */
static uint64_t fast_idx[MAX_ORDINALS];     /* [atomic acquire/release] */
static uint64_t spare_limit[SG_MAX_DEVICES]; /* [atomic relaxed] per limits index */
static uint64_t spare_gen = UINT64_MAX;      /* [usage mutex] the generation spare_limit is of */
#define GEN_BITS(g) ((g) & (UINT64_MAX >> 8))
/* What a slot's spare on idx can hold: a process keeps at most the spare limit (SPARE_MAX when
 * the limits changed since).  More was written by a process of the tenant, not by a shim; the
 * excess is neither given back by a steal nor counted free by a view. */
static uint64_t plausible_spare(int idx, uint64_t spare)
{
    static int forged_logged;
    uint64_t limit = spare_gen == sg_lim.generation
                         ? __atomic_load_n(&spare_limit[idx], __ATOMIC_RELAXED)
                         : SPARE_MAX;
    if (spare <= limit)
        return spare;
    if (spare > SPARE_MAX)
        sg_log_once(&forged_logged, "%s/%s: a process slot claims a spare of %llu bytes, more than "
                    "any process keeps: the usage region was written outside sharegpu",
                    sg_tenant_dir, SG_USAGE_FILE, (unsigned long long)spare);
    return limit;
}

/* Our count follows the slot's down (a steal); never up: more in the slot than we put there
 * was written by someone else. */
static void own_follow(int idx, const uint64_t *slot_spare)
{
    uint64_t own = __atomic_load_n(&own_spare[idx], __ATOMIC_RELAXED), slot;
    do {
        slot = __atomic_load_n(slot_spare, __ATOMIC_RELAXED);
        if (slot >= own)
            return;
    } while (!__atomic_compare_exchange_n(&own_spare[idx], &own, slot, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
}

/* Give slot s's spare on device idx above `keep` back to the free headroom; the bytes given. */
static uint64_t take_spare_locked(uint32_t s, int idx, uint64_t keep)
{
    struct sg_usage *u = sg_usage_map;
    struct sg_usage_proc_dev *pd = &u->procs[s].dev[idx];
    uint64_t spare = __atomic_load_n(&pd->spare_bytes, __ATOMIC_RELAXED), give;
    do {
        if (spare <= keep)
            return 0;
        give = spare - keep;
    } while (!__atomic_compare_exchange_n(&pd->spare_bytes, &spare, keep, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    if ((int)s == self_slot) { /* ours: what we know we kept, whatever the slot says */
        uint64_t own = __atomic_load_n(&own_spare[idx], __ATOMIC_RELAXED);
        uint64_t ours = own > keep ? own - keep : 0;
        give = give < ours ? give : ours;
        own_follow(idx, &pd->spare_bytes);
    } else {
        give = plausible_spare(idx, give);
    }
    give = give < pd->mem_bytes ? give : pd->mem_bytes;
    pd->mem_bytes -= give;
    uint64_t used = u->devices[idx].mem_used_bytes;
    u->devices[idx].mem_used_bytes = used >= give ? used - give : 0;
    return give;
}

/* Before refusing: every live process's spare on idx goes back to the headroom. */
static void steal_spares_locked(int idx)
{
    struct sg_usage *u = sg_usage_map;
    for (uint32_t s = 0; s < u->slot_count && s < SG_MAX_PROCS; s++)
        if (u->procs[s].pid != 0)
            take_spare_locked(s, idx, 0);
}

/* Follow a resize: a new generation empties our spares (charged under the old caps). */
static int refresh_locked(struct sg_err *e)
{
    int rc = sg_limits_refresh_locked(e);
    if (rc < 0 || sg_lim.generation == spare_gen)
        return rc;
    spare_gen = sg_lim.generation;
    int s = self_slot;
    for (uint32_t i = 0; i < SG_MAX_DEVICES; i++) {
        if (s >= 0 && mine(&sg_usage_map->procs[s]))
            take_spare_locked((uint32_t)s, (int)i, 0);
        uint64_t cap = i < sg_lim.device_count ? sg_lim.devices[i].mem_cap_bytes : 0;
        __atomic_store_n(&spare_limit[i], cap / 16 < SPARE_MAX ? cap / 16 : SPARE_MAX,
                         __ATOMIC_RELAXED);
    }
    return 0;
}

/* The fast path of an admission: bytes out of our own spare, without the lock. */
static bool spend_spare(CUdevice dev, uint64_t bytes, struct sg_charge *c)
{
    int s = __atomic_load_n(&self_slot, __ATOMIC_RELAXED);
    if (s < 0 || dev < 0 || dev >= MAX_ORDINALS)
        return false;
    uint64_t k = __atomic_load_n(&fast_idx[dev], __ATOMIC_ACQUIRE);
    uint64_t g = __atomic_load_n(&sg_limits_map->generation, __ATOMIC_ACQUIRE);
    if (!k || k >> 8 != GEN_BITS(g))
        return false;
    int idx = (int)(k & 0xff) - 1;
    struct sg_usage_proc_dev *pd = &sg_usage_map->procs[s].dev[idx];
    uint64_t own = __atomic_load_n(&own_spare[idx], __ATOMIC_RELAXED);
    do {
        if (own < bytes)
            return false;
    } while (!__atomic_compare_exchange_n(&own_spare[idx], &own, own - bytes, true,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    uint64_t spare = __atomic_load_n(&pd->spare_bytes, __ATOMIC_RELAXED);
    do {
        if (spare < bytes) { /* taken by a steal: the locked path follows it */
            __atomic_fetch_add(&own_spare[idx], bytes, __ATOMIC_RELAXED);
            return false;
        }
    } while (!__atomic_compare_exchange_n(&pd->spare_bytes, &spare, spare - bytes, true,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_fetch_add(&pd->alloc_count, 1, __ATOMIC_RELAXED);
    c->active = true;
    c->idx = idx;
    c->bytes = bytes;
    return true;
}

/* Free headroom on idx after `bytes` more: what a top-up of the spare may take. */
static uint64_t headroom_locked(int idx, uint64_t bytes)
{
    const struct sg_usage_device *d = &sg_usage_map->devices[idx];
    uint64_t used = d->mem_used_bytes + __atomic_load_n(&d->overhead_bytes, __ATOMIC_RELAXED);
    uint64_t cap = sg_lim.devices[idx].mem_cap_bytes;
    return used < cap && cap - used > bytes ? cap - used - bytes : 0;
}

/* The spare bytes of every live process on idx (a view counts them as free); atomic loads, so
 * a view that could not take the lock reads them too. */
static uint64_t spares_of(int idx)
{
    uint64_t sum = 0;
    for (uint32_t s = 0; s < sg_usage_map->slot_count && s < SG_MAX_PROCS; s++)
        if (sg_usage_map->procs[s].pid != 0)
            sum += plausible_spare(
                idx, __atomic_load_n(&sg_usage_map->procs[s].dev[idx].spare_bytes, __ATOMIC_RELAXED));
    return sum;
}

static int config_error(struct sg_err *e)
{
    return sg_fail(e, SG_E_CONFIG, "sharegpu configuration of %s is broken", sg_tenant_dir);
}

/* Room for `bytes` more on idx, under the lock: our slot (claimed on first use), then the cap,
 * with dead slots reaped and every spare taken back before a refusal (`refused` says why).
 * The slot, or SG_E_NOSLOT / SG_E_OVERCAP. */
static int room_locked(int idx, uint64_t bytes, const char *refused, struct sg_err *e)
{
    int slot = ensure_slot_locked();
    if (slot < 0) {
        sg_log_once(&slot_logged, "%s/%s: all %u process slots are in use by live processes",
                    sg_tenant_dir, SG_USAGE_FILE, sg_usage_map->slot_count);
        return sg_fail(e, SG_E_NOSLOT, "no free process slot");
    }
    maybe_scan_locked();
    if (!fits_locked(idx, bytes)) {
        scan_locked();
        steal_spares_locked(idx);
        if (!fits_locked(idx, bytes)) {
            count_oom_locked(slot, idx);
            return sg_fail(e, SG_E_OVERCAP, "%s", refused);
        }
    }
    return slot;
}

static int reserve_locked(CUdevice dev, const uint8_t *uuid, uint64_t bytes, struct sg_charge *c,
                          struct sg_err *e);

/* What every reservation does first: nothing charged yet; 1 go on, 0 inert (done), < 0 broken. */
static int reserve_start(struct sg_charge *c, struct sg_err *e)
{
    c->active = false;
    c->idx = -1;
    c->bytes = 0;
    c->ctx = NULL;
    if (!sg_configured())
        return 0;
    if (sg_mode() != SG_MODE_ACTIVE)
        return config_error(e);
    if (__builtin_expect(born_here && *born_here == 0, 0))
        raw_clone_child();
    return 1;
}

int sg_reserve(CUdevice dev, uint64_t bytes, struct sg_charge *c, struct sg_err *e)
{
    int go = reserve_start(c, e);
    if (go <= 0)
        return go;
    if (spend_spare(dev, bytes, c))
        return 0;
    uint8_t uuid[16];
    bool have_uuid = sg_ordinal_uuid(dev, uuid) == 0;
    return reserve_locked(dev, have_uuid ? uuid : NULL, bytes, c, e);
}

int sg_reserve_uuid(const uint8_t uuid[16], uint64_t bytes, struct sg_charge *c, struct sg_err *e)
{
    int go = reserve_start(c, e);
    return go <= 0 ? go : reserve_locked(-1, uuid, bytes, c, e);
}

/* The slow path of a reservation on the device of uuid (NULL: unknown, refused); dev is its
 * CUDA ordinal for the fast path's cache, or -1. Takes and drops the usage lock. */
static int reserve_locked(CUdevice dev, const uint8_t *uuid, uint64_t bytes, struct sg_charge *c,
                          struct sg_err *e)
{
    bool have_uuid = uuid != NULL;
    int rc = usage_lock_within(e, ADMISSION_LOCK_WAIT_NS);
    if (rc == SG_E_BUSY) {
        sg_log_once(&busy_logged, "%s; allocation refused", e->msg);
        return rc; /* refused, not broken: the next allocation tries again */
    }
    if (rc < 0) {
        sg_break("%s", e->msg);
        return rc;
    }
    rc = refresh_locked(e);
    if (rc < 0)
        goto out;
    int idx = have_uuid ? match_locked(uuid) : -1;
    if (idx < 0) {
        /* Not one of the tenant's GPUs: its cap is 0. */
        rc = dev >= 0 ? sg_fail(e, SG_E_OVERCAP, "device %d is not assigned to this tenant", (int)dev)
                      : sg_fail(e, SG_E_OVERCAP, "the device is not assigned to this tenant");
        goto out;
    }
    int slot = room_locked(idx, bytes, "over the memory cap", e);
    if (slot < 0) {
        rc = slot;
        goto out;
    }
    /* A small allocation tops the spare up to half its limit from free headroom, so the next
     * ones take the fast path. */
    struct sg_usage_proc_dev *pd = &sg_usage_map->procs[slot].dev[idx];
    own_follow(idx, &pd->spare_bytes);
    uint64_t limit = __atomic_load_n(&spare_limit[idx], __ATOMIC_RELAXED), topup = 0;
    uint64_t spare = __atomic_load_n(&own_spare[idx], __ATOMIC_RELAXED);
    if (bytes < limit && spare < limit / 2) {
        topup = limit / 2 - spare;
        uint64_t room = headroom_locked(idx, bytes);
        topup = topup < room ? topup : room;
    }
    charge_locked(slot, idx, bytes + topup);
    if (topup) {
        __atomic_fetch_add(&own_spare[idx], topup, __ATOMIC_RELAXED);
        __atomic_fetch_add(&pd->spare_bytes, topup, __ATOMIC_RELAXED);
    }
    __atomic_fetch_add(&pd->alloc_count, 1, __ATOMIC_RELAXED);
    if (dev >= 0 && dev < MAX_ORDINALS)
        __atomic_store_n(&fast_idx[dev], (GEN_BITS(sg_lim.generation) << 8) | (uint64_t)(idx + 1),
                         __ATOMIC_RELEASE);
    c->active = true;
    c->idx = idx;
    c->bytes = bytes;
out:
    usage_unlock();
    return rc;
}

static void give_back(int idx, uint64_t bytes, bool one_alloc)
{
    struct sg_err e;
    int s = __atomic_load_n(&self_slot, __ATOMIC_RELAXED);
    if (s >= 0) {
        /* Into our spare: no lock, unless it grew past its limit (then back down to half). */
        struct sg_usage_proc_dev *pd = &sg_usage_map->procs[s].dev[idx];
        if (one_alloc && __atomic_load_n(&pd->alloc_count, __ATOMIC_RELAXED) > 0)
            __atomic_fetch_sub(&pd->alloc_count, 1, __ATOMIC_RELAXED);
        uint64_t limit = __atomic_load_n(&spare_limit[idx], __ATOMIC_RELAXED);
        uint64_t own = __atomic_load_n(&own_spare[idx], __ATOMIC_RELAXED);
        bool kept = false;
        while (own + bytes >= own && own + bytes <= limit && !kept)
            kept = __atomic_compare_exchange_n(&own_spare[idx], &own, own + bytes, true,
                                               __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        if (kept) {
            __atomic_fetch_add(&pd->spare_bytes, bytes, __ATOMIC_RELAXED);
            return;
        }
        /* Past the spare's limit: under the lock, the spare goes back down to half of it. */
        if (usage_lock(&e) < 0) {
            sg_log_once(&lock_logged, "%s", e.msg);
            return;
        }
        if (self_slot == s && mine(&sg_usage_map->procs[s])) {
            __atomic_fetch_add(&own_spare[idx], bytes, __ATOMIC_RELAXED);
            __atomic_fetch_add(&pd->spare_bytes, bytes, __ATOMIC_RELAXED);
            take_spare_locked((uint32_t)s, idx, limit / 2);
        } else {
            uncharge_locked(idx, bytes);
        }
        usage_unlock();
        return;
    }
    if (usage_lock(&e) < 0) {
        sg_log_once(&lock_logged, "%s", e.msg);
        return;
    }
    uncharge_locked(idx, bytes);
    s = self_slot;
    if (one_alloc && s >= 0 && mine(&sg_usage_map->procs[s])) {
        uint64_t *cnt = &sg_usage_map->procs[s].dev[idx].alloc_count;
        if (__atomic_load_n(cnt, __ATOMIC_RELAXED) > 0)
            __atomic_fetch_sub(cnt, 1, __ATOMIC_RELAXED);
    }
    usage_unlock();
}

void sg_unreserve(const struct sg_charge *c)
{
    if (c->active)
        give_back(c->idx, c->bytes, true);
}

void sg_credit(const struct sg_charge *c)
{
    if (c->active)
        give_back(c->idx, c->bytes, true);
}

int sg_adjust(struct sg_charge *c, uint64_t new_bytes, struct sg_err *e)
{
    if (!c->active || new_bytes == c->bytes)
        return 0;
    if (new_bytes < c->bytes) {
        give_back(c->idx, c->bytes - new_bytes, false);
        c->bytes = new_bytes;
        return 0;
    }
    uint64_t delta = new_bytes - c->bytes;
    int rc = usage_lock(e);
    if (rc < 0)
        return rc;
    int slot = refresh_locked(e) < 0 ? -2 : ensure_slot_locked();
    if (slot == -2) {
        rc = SG_E_CONFIG;
    } else if (slot < 0) {
        rc = sg_fail(e, SG_E_NOSLOT, "no free process slot");
    } else if (!fits_locked(c->idx, delta) && (scan_locked(), !fits_locked(c->idx, delta))) {
        count_oom_locked(slot, c->idx);
        rc = sg_fail(e, SG_E_OVERCAP, "over the memory cap");
    } else {
        charge_locked(slot, c->idx, delta);
        c->bytes = new_bytes;
    }
    usage_unlock();
    return rc;
}

/* ---- context memory (hooks_ctx.c) --------------------------------------------------------- */

/* The estimate is one quantity with the reconciler's figure (NVML's bytes of the process
 * beyond its ledger): it goes into overhead_bytes, which the agent's next pass replaces by
 * its measurement (a compare-and-swap against the value it read before NVML, so a context
 * admitted or given back while it measured is never overwritten by a stale figure). */
int sg_ctx_admit(CUdevice dev, uint64_t bytes, int *idx_out, struct sg_err *e)
{
    *idx_out = -1;
    if (!sg_configured())
        return 0;
    if (sg_mode() != SG_MODE_ACTIVE)
        return config_error(e);
    uint8_t uuid[16];
    bool have_uuid = sg_ordinal_uuid(dev, uuid) == 0;
    int rc = usage_lock_within(e, ADMISSION_LOCK_WAIT_NS);
    if (rc == SG_E_BUSY) {
        sg_log_once(&busy_logged, "%s; context refused", e->msg);
        return rc;
    }
    if (rc < 0) {
        sg_break("%s", e->msg);
        return rc;
    }
    rc = refresh_locked(e);
    if (rc < 0)
        goto out;
    int idx = have_uuid ? match_locked(uuid) : -1;
    if (idx < 0)
        goto out; /* not one of the tenant's GPUs: nothing of it is counted (allocations there
                     are refused; the arbiter refuses launches) */
    /* The slot makes the process one of the ledger's, so the reconciler measures it: a
     * process that only holds a context is then counted, and its estimate replaced. */
    int slot = room_locked(idx, bytes, "a context's memory is over the memory cap", e);
    if (slot < 0) {
        rc = slot;
        goto out;
    }
    __atomic_fetch_add(&sg_usage_map->devices[idx].overhead_bytes, bytes, __ATOMIC_RELAXED);
    slot_ctx_note_locked(&sg_usage_map->procs[slot], idx, (int64_t)(bytes >> 20));
    *idx_out = idx;
out:
    usage_unlock();
    return rc;
}

/* One of our contexts ended: its estimate leaves the overhead and our slot's record. */
static void ctx_credit_locked(int idx, uint64_t bytes)
{
    overhead_credit_locked(idx, bytes);
    int s = self_slot;
    if (s >= 0 && (uint32_t)s < SG_MAX_PROCS && mine(&sg_usage_map->procs[s]))
        slot_ctx_note_locked(&sg_usage_map->procs[s], idx, -(int64_t)(bytes >> 20));
}

void sg_ctx_credit(int idx, uint64_t bytes)
{
    struct sg_err e;
    if (idx < 0 || idx >= SG_MAX_DEVICES || !bytes || !sg_usage_map)
        return;
    if (usage_lock(&e) < 0) { /* a credit waits as long as it takes, as a free does */
        sg_log_once(&lock_logged, "%s", e.msg);
        return;
    }
    ctx_credit_locked(idx, bytes);
    usage_unlock();
}

/* ---- views ------------------------------------------------------------------------------- */

int sg_view_device(CUdevice dev, const uint8_t *uuid_in, struct sg_view *v, struct sg_err *e)
{
    v->cap = 0;
    v->used = 0;
    if (sg_mode() != SG_MODE_ACTIVE)
        return config_error(e);
    uint8_t uuid[16];
    const uint8_t *uuid_p = uuid_in;
    if (!uuid_p && sg_ordinal_uuid(dev, uuid) == 0)
        uuid_p = uuid;
    int rc = usage_lock_within(e, ADMISSION_LOCK_WAIT_NS);
    bool locked = rc == 0;
    if (rc == SG_E_BUSY) {
        /* Another process is stopped inside the lock (none of ours can be in there now): answer
         * from the limits we have and the totals as they stand, a view, not a decision. */
        sg_log_once(&busy_logged, "%s; memory views read without it", e->msg);
        rc = sg_lim.device_count ? 0 : rc;
    }
    if (rc < 0)
        return rc;
    if (locked)
        rc = refresh_locked(e);
    if (rc == 0) {
        int idx = match_locked(uuid_p);
        if (idx >= 0) {
            if (locked)
                maybe_scan_locked();
            const struct sg_usage_device *d = &sg_usage_map->devices[idx];
            uint64_t ovh = __atomic_load_n(&d->overhead_bytes, __ATOMIC_RELAXED);
            uint64_t spares = spares_of(idx), used = d->mem_used_bytes;
            used = used > spares ? used - spares : 0; /* spares are free to whoever needs them */
            v->cap = sg_lim.devices[idx].mem_cap_bytes;
            v->used = used + ovh;
            if (v->used < used)
                v->used = UINT64_MAX;
        }
    }
    if (locked)
        usage_unlock();
    return rc;
}

int sg_list_procs(const uint8_t uuid[16], struct sg_proc_info *out, unsigned cap, unsigned *n,
                  struct sg_err *e)
{
    *n = 0;
    if (sg_mode() != SG_MODE_ACTIVE)
        return config_error(e);
    int rc = usage_lock(e);
    if (rc < 0)
        return rc;
    rc = refresh_locked(e);
    int idx = rc == 0 ? match_locked(uuid) : -1;
    if (idx >= 0) {
        scan_locked();
        struct sg_usage *u = sg_usage_map;
        for (uint32_t s = 0; s < u->slot_count && s < SG_MAX_PROCS; s++) {
            const struct sg_usage_proc *p = &u->procs[s];
            if (p->pid == 0)
                continue;
            uint64_t b = p->dev[idx].mem_bytes,
                     spare = plausible_spare(
                         idx, __atomic_load_n(&p->dev[idx].spare_bytes, __ATOMIC_RELAXED));
            b = b > spare ? b - spare : 0;
            if (b == 0 && __atomic_load_n(&p->dev[idx].alloc_count, __ATOMIC_RELAXED) == 0)
                continue;
            if (*n < cap) {
                out[*n].pid = p->pid;
                out[*n].bytes = b;
            }
            (*n)++;
        }
    }
    usage_unlock();
    return rc;
}

/* ---- fork and exit ---------------------------------------------------------------------- */

static void atfork_prepare(void)
{
    sg_alloc_table_lock();
}

static void atfork_parent(void)
{
    sg_alloc_table_unlock();
}

/* The child holds none of the parent's device memory and claims its own slot on its first
 * allocation.  Run single-threaded: by fork's atfork handler, or by the first admission of a
 * raw clone's child. */
/* What names the parent: its identity, slot, spare and liveness lock. */
static void forget_parent_slot(void)
{
    memset(&self, 0, sizeof self);
    self_slot = -1;
    memset(own_spare, 0, sizeof own_spare);
    last_scan_ns = 0;
    if (live_fd >= 0)
        close(live_fd); /* the parent's liveness lock stays the parent's */
    live_fd = -1;
}

/* All of the parent's state, in a child that runs alone (a fork child, or a raw clone child
 * at its first admission, before any lock of ours is taken). */
static void forget_parent(void)
{
    sg_alloc_table_forget();
    forget_parent_slot();
    sg_ctx_fork_child();
}

static void atfork_child(void)
{
    pthread_mutex_init(&ordinal_lock, NULL);
    forget_parent();
    if (born_here)
        *born_here = 1;
}

/* A child of a raw clone system call (no atfork handler ran) at its first admission: it is
 * single-threaded then unless it started threads of its own before allocating; the locks it
 * inherited may be held by threads it does not have, so they start again as in a fork child. */
static void raw_clone_child(void)
{
    pthread_mutex_init(&ordinal_lock, NULL);
    forget_parent();
    *born_here = 1;
}

void sg_ledger_setup(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return;
    if (madvise(page, 4096, MADV_WIPEONFORK) != 0) { /* before Linux 4.14: getpid() per slow path */
        munmap(page, 4096);
        return;
    }
    *(uint32_t *)page = 1;
    born_here = page;
}

/* Normal exit: give the slot back (the driver frees the process's memory as it exits). */
__attribute__((destructor)) static void sg_ledger_exit(void)
{
    if (!sg_usage_map || self_slot < 0 || self.pid != (int32_t)getpid())
        return;
    /* Our contexts' estimates go with us (the driver frees the contexts at exit); taken before
     * the usage lock (hooks_ctx.c's lock comes first in the order). */
    uint64_t ctx_bytes[SG_MAX_DEVICES];
    sg_ctx_forget_all(ctx_bytes);
    struct sg_err e;
    if (usage_lock(&e) < 0)
        return;
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        if (ctx_bytes[d])
            ctx_credit_locked(d, ctx_bytes[d]);
    int s = self_slot;
    if (s >= 0 && mine(&sg_usage_map->procs[s]))
        release_slot_locked((uint32_t)s);
    __atomic_store_n(&self_slot, -1, __ATOMIC_RELAXED);
    usage_unlock();
}
