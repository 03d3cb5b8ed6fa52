/*
 * Process slots: which process holds how much memory on which GPU.  A slot is freed by its owner
 * at normal exit, or by any other process once the owner is dead (pid gone, a zombie, or the pid
 * reused by a process with another start time).  Liveness is judged by pid + start time.
 *
 * Pid namespaces: a slot's pid is the process's pid as its /proc sees it (the first NSpid field
 * of /proc/self/status), which is the host pid under `unshare --pid` with the host's /proc, and
 * the slot also records which /proc that is (its device).  Only a process looking through the
 * same /proc judges a slot; to any other the owner's pid means nothing, so it is never judged
 * dead (and never kill()ed) from there: a driver knows every process by one pid, and so does
 * this model wherever processes share a /proc.
 *
 * A real driver knows every process by its pid in the initial namespace: NVML on the host lists
 * a container's processes by their host pids.  The slot records its owner's pid namespace too,
 * and a process of the initial namespace (the host's agent, nvidia-smi) resolves the host pid of
 * another namespace's slot once, by scanning its /proc for the process with that namespace, that
 * innermost pid and that start time (sim_slots_resolve); from then on it reports and judges the
 * slot by that pid.  A slot whose process it cannot find is gone (the host sees every process).
 */
#include "sim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* This process's slot: written under the state lock, read lock-free (atomics, relaxed is enough:
 * the slot contents themselves are only touched under the lock).  A forked child forgets it
 * (an atfork handler, registered with the first slot), as a real driver's child has no
 * context; so an API call makes no getpid() system call, as a real driver's makes none. */
static int own_slot = -1;
static int own_pid;    /* the pid the slot records (see the top of this file) */

static pthread_once_t forget_once = PTHREAD_ONCE_INIT;

static void forget_in_children(void)
{
    pthread_atfork(NULL, NULL, sim_slot_forget);
}

static int self_pid(void)
{
    return __atomic_load_n(&own_pid, __ATOMIC_RELAXED);
}

int sim_slot_self(void)
{
    return __atomic_load_n(&own_slot, __ATOMIC_RELAXED);
}

void sim_slot_forget(void)
{
    __atomic_store_n(&own_slot, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&own_pid, 0, __ATOMIC_RELAXED);
}

/* Which /proc this process sees: its device number (0 if /proc is not mounted). */
uint64_t sim_proc_dev(void)
{
    struct stat sb;
    return stat("/proc/self/stat", &sb) == 0 ? (uint64_t)sb.st_dev + 1 : 0;
}

/* A pid from the NSpid line of a /proc/<pid>/status: the first (in the namespace of the /proc
 * read) or the last (in the process's own namespace); the Pid line on kernels without NSpid.
 * 0 if unknown. */
static int nspid(const char *status, int last)
{
    char buf[4096];
    int fd = open(status, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = strstr(buf, "\nNSpid:");
    if (!p)
        p = strstr(buf, "\nPid:");
    if (!p)
        return 0;
    const char *end = strchr(p + 1, '\n');
    long found = 0;
    for (char *q = strchr(p, ':') + 1; !end || q < end;) {
        char *next;
        long v = strtol(q, &next, 10);
        if (next == q)
            break;
        found = v;
        if (!last)
            break;
        q = next;
    }
    return found > 0 ? (int)found : 0;
}

/* This process's pid as its /proc sees it: the first NSpid field, getpid() without /proc. */
int sim_proc_pid(void)
{
    int pid = nspid("/proc/self/status", 0);
    return pid > 0 ? pid : getpid();
}

uint64_t sim_proc_start_time(int pid, int *gone)
{
    char path[64], buf[1024];
    *gone = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            *gone = 1;
        else if (kill(pid, 0) < 0 && errno == ESRCH)
            *gone = 1; /* /proc unusable: fall back to the pid alone */
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* comm may contain spaces and parentheses: fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    char state = 0;
    unsigned long long start = 0;
    for (int field = 3; field <= 22 && *p; field++) {
        while (*p == ' ')
            p++;
        if (field == 3)
            state = *p;
        if (field == 22)
            start = strtoull(p, NULL, 10);
        while (*p && *p != ' ')
            p++;
    }
    if (state == 'Z' || state == 'X')
        *gone = 1; /* killed but not yet waited for: its memory is already gone on a real GPU */
    return start;
}

/* The kernel's inode of the initial pid namespace (PROC_PID_INIT_INO, include/linux/proc_ns.h). */
#define SIM_INIT_PIDNS 0xEFFFFFFCull

static uint64_t pidns_of(const char *link)
{
    struct stat sb;
    return stat(link, &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

int sim_host_view(void)
{
    static int view = -1; /* [racy but idempotent] */
    if (view < 0)
        view = pidns_of("/proc/self/ns/pid") == SIM_INIT_PIDNS && sim_proc_pid() == getpid();
    return view;
}

static uint64_t own_proc_dev(void)
{
    static uint64_t mine;
    if (!mine)
        mine = sim_proc_dev();
    return mine;
}

unsigned sim_slot_pid(const struct sim_slot *s)
{
    if (s->proc_dev != own_proc_dev() && s->host_pid > 0 && sim_host_view())
        return (unsigned)s->host_pid;
    return (unsigned)s->pid;
}

static int slot_dead(const struct sim_slot *s)
{
    int pid = s->pid;
    if (s->proc_dev != own_proc_dev()) {
        if (s->host_pid <= 0 || !sim_host_view())
            return 0; /* another /proc's pid: not ours to judge (see the top of this file) */
        pid = s->host_pid;
    }
    int gone;
    uint64_t start = sim_proc_start_time(pid, &gone);
    if (gone)
        return 1;
    return start != 0 && s->start_time != 0 && start != s->start_time;
}

static void slot_clear_locked(struct sim_state *st, struct sim_slot *s)
{
    /* The driver tears the dead context down: its pending kernels no longer take slices. */
    sim_engine_drop_locked(st, (int)(s - st->slot));
    sim_ipc_event_drop_locked(st, (int)(s - st->slot));
    sim_mem_write_drop_locked(st, (int)(s - st->slot));
    for (unsigned g = 0; g < SIM_MAX_GPUS; g++) {
        uint64_t b = s->bytes[g];
        st->gpu[g].used = st->gpu[g].used >= b ? st->gpu[g].used - b : 0;
    }
    memset(s, 0, sizeof(*s));
}

/* The innermost pid (last NSpid field) of host process h, 0 if unknown. */
static int innermost_pid(int h)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", h);
    return nspid(path, 1);
}

struct wanted {
    int index;
    int32_t pid;
    uint64_t pidns, start;
    int32_t host_pid; /* found: > 0; its namespace seen but not it: -1; nothing seen: 0 */
};

int sim_slots_resolve(struct sim_err *e, struct sim_state *st)
{
    if (!sim_host_view())
        return 0;
    /* On the heap, not in thread-local storage: glibc carves a library's TLS out of every
     * thread's stack, and the tables of the lists here would not fit a small-stacked thread
     * (the shim's watcher has 64 KiB). */
    struct wanted *want = malloc(sizeof(*want) * SIM_MAX_SLOTS);
    if (!want)
        return sim_fail(e, SIM_ENOMEM, "no memory to resolve host pids");
    int n = 0;
    if (sim_lock(e, st) < 0) {
        free(want);
        return -1;
    }
    for (int i = 0; i < SIM_MAX_SLOTS; i++) {
        const struct sim_slot *s = &st->slot[i];
        if (s->pid != 0 && s->host_pid == 0 && s->proc_dev != own_proc_dev() && s->pidns)
            want[n++] = (struct wanted){i, s->pid, s->pidns, s->start_time, 0};
    }
    sim_unlock(st);
    DIR *proc = n ? opendir("/proc") : NULL;
    if (!proc) {
        free(want);
        return 0;
    }
    struct dirent *d;
    while ((d = readdir(proc)) != NULL) {
        char *end;
        long h = strtol(d->d_name, &end, 10);
        if (*end || h <= 0)
            continue;
        char link[64];
        snprintf(link, sizeof(link), "/proc/%ld/ns/pid", h);
        uint64_t ns = pidns_of(link);
        int inner = -1;
        for (int k = 0; k < n; k++) {
            if (want[k].pidns != ns || want[k].host_pid > 0)
                continue;
            if (inner < 0)
                inner = innermost_pid((int)h);
            int gone;
            if (inner == want[k].pid && sim_proc_start_time((int)h, &gone) == want[k].start && !gone)
                want[k].host_pid = (int32_t)h;
            else if (want[k].host_pid == 0)
                want[k].host_pid = -1;
        }
    }
    closedir(proc);
    if (sim_lock(e, st) < 0) {
        free(want);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        struct sim_slot *s = &st->slot[want[k].index];
        if (s->pid != want[k].pid || s->pidns != want[k].pidns || s->start_time != want[k].start)
            continue; /* freed or taken again meanwhile */
        if (want[k].host_pid > 0)
            s->host_pid = want[k].host_pid;
        else
            slot_clear_locked(st, s); /* the host sees every process: this one is gone */
    }
    sim_unlock(st);
    free(want);
    return 0;
}

/* A slot's owner as the reaper saw it, to judge outside the lock and free only if unchanged. */
struct suspect {
    int index;
    struct sim_slot owner; /* the identity fields only */
};

int sim_reap(struct sim_err *e, struct sim_state *st, uint64_t max_age_ns)
{
    /* A sweep not yet due is the common case: seen without the lock (a stale read only delays
     * or repeats a sweep), before anything is allocated. */
    if (max_age_ns && sim_now_ns() - __atomic_load_n(&st->last_reap_ns, __ATOMIC_RELAXED) < max_age_ns)
        return 0;
    struct suspect *seen = malloc(sizeof(*seen) * SIM_MAX_SLOTS); /* not TLS: see resolve */
    if (!seen)
        return sim_fail(e, SIM_ENOMEM, "no memory to sweep for dead processes");
    if (sim_lock(e, st) < 0) {
        free(seen);
        return -1;
    }
    uint64_t now = sim_now_ns();
    if (max_age_ns && now - st->last_reap_ns < max_age_ns) {
        sim_unlock(st);
        free(seen);
        return 0;
    }
    __atomic_store_n(&st->last_reap_ns, now, __ATOMIC_RELAXED); /* claimed: the others skip it */
    int self = sim_slot_self(), n = 0;
    for (int i = 0; i < SIM_MAX_SLOTS; i++) {
        const struct sim_slot *s = &st->slot[i];
        if (s->pid == 0 || i == self)
            continue;
        seen[n].index = i;
        seen[n].owner = (struct sim_slot){.pid = s->pid,
                                          .start_time = s->start_time,
                                          .proc_dev = s->proc_dev,
                                          .pidns = s->pidns,
                                          .host_pid = s->host_pid};
        n++;
    }
    sim_unlock(st);
    int dead = 0;
    for (int k = 0; k < n; k++)
        if (slot_dead(&seen[k].owner))
            seen[dead++] = seen[k];
    int freed = 0;
    if (dead == 0 || sim_lock(e, st) < 0) {
        free(seen);
        return dead == 0 ? 0 : -1;
    }
    for (int k = 0; k < dead; k++) {
        struct sim_slot *s = &st->slot[seen[k].index];
        const struct sim_slot *o = &seen[k].owner;
        if (s->pid == o->pid && s->pidns == o->pidns && s->start_time == o->start_time) {
            slot_clear_locked(st, s); /* still the dead owner's, not a new process's */
            freed++;
        }
    }
    sim_unlock(st);
    free(seen);
    return freed;
}

void sim_repair_locked(struct sim_state *st)
{
    for (unsigned g = 0; g < SIM_MAX_GPUS; g++) {
        uint64_t sum = 0;
        for (int i = 0; i < SIM_MAX_SLOTS; i++)
            if (st->slot[i].pid != 0)
                sum += st->slot[i].bytes[g];
        st->gpu[g].used = sum;
    }
    sim_engine_repair_locked(st);
}

int sim_slot_acquire(struct sim_err *e, struct sim_state *st)
{
    int s = sim_slot_self();
    if (s >= 0)
        return s;
    int pid = sim_proc_pid(), gone; /* file reads, before the lock */
    uint64_t proc_dev = sim_proc_dev();
    uint64_t pidns = pidns_of("/proc/self/ns/pid");
    uint64_t start = sim_proc_start_time(pid, &gone);
    /* An MPS client reads its priority when it connects, as this does: 1 is BELOW_NORMAL. */
    const char *prio = getenv("CUDA_MPS_CLIENT_PRIORITY");
    int32_t mps_priority = prio && strcmp(prio, "1") == 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            int freed = sim_reap(e, st, 0);
            if (freed < 0)
                return -1;
            if (freed == 0)
                break; /* every slot is taken and no owner died */
        }
        if (sim_lock(e, st) < 0)
            return -1;
        s = sim_slot_self();
        for (int i = 0; s < 0 && i < SIM_MAX_SLOTS; i++) {
            if (st->slot[i].pid == 0) {
                memset(&st->slot[i], 0, sizeof(st->slot[i]));
                st->slot[i].pid = pid;
                st->slot[i].start_time = start;
                st->slot[i].proc_dev = proc_dev;
                st->slot[i].pidns = pidns;
                st->slot[i].mps_priority = mps_priority;
                if (pidns == SIM_INIT_PIDNS && proc_dev == own_proc_dev() && pid == getpid())
                    st->slot[i].host_pid = pid;
                __atomic_store_n(&own_pid, pid, __ATOMIC_RELAXED);
                pthread_once(&forget_once, forget_in_children);
                __atomic_store_n(&own_slot, i, __ATOMIC_RELAXED);
                s = i;
            }
        }
        sim_unlock(st);
        if (s >= 0)
            break;
    }
    if (s < 0)
        return sim_fail(e, SIM_ENOSLOT, "all %d process slots of the simulated GPU are in use",
                        SIM_MAX_SLOTS);
    return s;
}

int sim_slot_acquire_fast(struct sim_err *e, struct sim_state *st)
{
    int s = __atomic_load_n(&own_slot, __ATOMIC_RELAXED);
    return s >= 0 ? s : sim_slot_acquire(e, st);
}

int sim_slot_mine_locked(const struct sim_state *st, int s)
{
    return s >= 0 && s < SIM_MAX_SLOTS && st->slot[s].pid != 0 && st->slot[s].pid == self_pid();
}

int sim_lock_own_slot(struct sim_err *e, struct sim_state *st)
{
    for (;;) {
        int c = sim_slot_acquire_fast(e, st);
        if (c < 0 || sim_lock(e, st) < 0)
            return -1;
        if (sim_slot_mine_locked(st, c))
            return c;
        /* Reaped by someone who judged us dead (another pid namespace?): take a new slot. */
        sim_unlock(st);
        sim_slot_forget();
    }
}

void sim_slot_release(struct sim_state *st)
{
    int s = sim_slot_self();
    if (s < 0 || !st)
        return;
    if (sim_lock(NULL, st) < 0)
        return;
    if (st->slot[s].pid == self_pid())
        slot_clear_locked(st, &st->slot[s]);
    sim_unlock(st);
    sim_slot_forget();
}

int sim_charge(struct sim_err *e, struct sim_state *st, int dev, uint64_t bytes)
{
    int reaped = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        int s = sim_slot_acquire(e, st);
        if (s < 0)
            return -1;
        if (sim_lock(e, st) < 0)
            return -1;
        if (st->slot[s].pid != self_pid()) {
            /* Reaped by someone who judged us dead (another pid namespace?): take a new slot. */
            sim_unlock(st);
            sim_slot_forget();
            continue;
        }
        struct sim_gpu *g = &st->gpu[dev];
        const uint64_t cap = st->cfg.memory_bytes;
        if (bytes > cap - g->used && !reaped) {
            sim_unlock(st);
            reaped = 1;
            if (sim_reap(e, st, 0) < 0) /* maybe a dead process still holds what we need */
                return -1;
            continue;
        }
        int rc = 0;
        if (bytes > cap - g->used) {
            rc = sim_fail(e, SIM_ENODEV_MEM, "out of device memory");
        } else {
            g->used += bytes;
            st->slot[s].bytes[dev] += bytes;
        }
        sim_unlock(st);
        return rc;
    }
    return sim_fail(e, SIM_ENOSLOT, "process slot lost twice");
}

void sim_uncharge(struct sim_state *st, int dev, uint64_t bytes)
{
    int s = sim_slot_self();
    if (s < 0 || sim_lock(NULL, st) < 0)
        return;
    struct sim_slot *sl = &st->slot[s];
    if (sl->pid == self_pid()) {
        uint64_t b = bytes <= sl->bytes[dev] ? bytes : sl->bytes[dev];
        sl->bytes[dev] -= b;
        st->gpu[dev].used = st->gpu[dev].used >= b ? st->gpu[dev].used - b : 0;
    }
    sim_unlock(st);
}

int sim_set_ctx(struct sim_err *e, struct sim_state *st, int dev, int on)
{
    int s = sim_slot_acquire(e, st);
    if (s < 0)
        return -1;
    for (int pass = 0;; pass++) {
        if (sim_lock(e, st) < 0)
            return -1;
        struct sim_slot *sl = &st->slot[s];
        struct sim_gpu *g = &st->gpu[dev];
        const uint32_t bit = 1u << dev;
        const uint64_t ovh = st->cfg.context_overhead_bytes, cap = st->cfg.memory_bytes;
        int rc = 0;
        if (sl->pid != self_pid()) {
            rc = sim_fail(e, SIM_ENOSLOT, "process slot lost"); /* reaped as dead: nothing to do */
        } else if (on && !(sl->ctx_mask & bit)) {
            /* The context's own memory: charged like an allocation, refused past the capacity as
             * a real context creation fails with CUDA_ERROR_OUT_OF_MEMORY. */
            if (ovh > cap - g->used && pass == 0) {
                sim_unlock(st);
                if (sim_reap(e, st, 0) < 0) /* maybe a dead process still holds what we need */
                    return -1;
                continue;
            }
            if (ovh > cap - g->used) {
                rc = sim_fail(e, SIM_ENODEV_MEM, "out of device memory for a context");
            } else {
                g->used += ovh;
                sl->bytes[dev] += ovh;
                sl->ctx_mask |= bit;
            }
        } else if (!on && (sl->ctx_mask & bit)) {
            uint64_t b = ovh <= sl->bytes[dev] ? ovh : sl->bytes[dev];
            sl->bytes[dev] -= b;
            g->used = g->used >= b ? g->used - b : 0;
            sl->ctx_mask &= ~bit;
        }
        sim_unlock(st);
        return rc;
    }
}
