/*
 * sharegpu shared-memory ABI: the one source of truth for every layout that crosses a process
 * boundary.  Mirrored field for field in src/sharegpu/regions/abi.py; tests/integration/test_abi.py compiles a
 * program that prints every offset below and compares it with the mirror.
 *
 * Versioning: every region starts with struct sg_region_header.  A reader accepts a region whose
 * abi_major equals its own and whose total_size is at least the size it needs for the fields it
 * reads; fields are only ever appended (in reserved space or at the end) within one major
 * version, so a newer agent reads an older shim's region and the reverse.  A different major,
 * a wrong magic or a short region is "corrupt": the shim fails closed.
 *
 * Concurrency notation used below:
 *   W: who writes   R: who reads
 *   [lock]  guarded by the region's robust mutex
 *   [seq]   written under the limits seqlock (generation odd while writing)
 *   [atomic relaxed|acquire|release]  a lone atomic with that memory order
 *   [const] written once before the region is published (temp file + rename), never again
 */
#ifndef SHAREGPU_ABI_H
#define SHAREGPU_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SG_ABI_MAJOR 1
#define SG_ABI_MINOR 13 /* 1.1: the GPU arbiter region and the compute counters;
                          1.2: predicted online arrivals (offline hold-back);
                          1.3: liveness locks and pid namespaces of entries, tenant
                               incarnations;
                          1.4: a process's spare bytes (charged, not allocated);
                          1.5: unpredicted online requests (early preemption, quiet
                               window after online requests);
                          1.6: exact charges: holds are exclusive within a class (drained
                               before the token moves), a charge is the GPU time the hold's
                               work used (the idle time after a sync that drained it is left
                               out), and a returning waiter behind in virtual time asks a
                               holder of its class to end its turn (yield SG_ARB_YIELD_TURN);
                          1.7: the arbiter's lock is taken with a deadline: a lock held past
                               it marks the region broken (broken_since_ns, lock_timeouts), the
                               GPU runs unarbitrated until the agent replaces the region;
                          1.8: a stall of an online service is told from a changed pattern:
                               the learned period survives late requests (online_cand_*,
                               online_stalls, online_relearns);
                          1.9: a process slot remembers its contexts' admitted memory
                               (ctx_mib), so releasing the slot of a killed process takes it
                               off overhead_bytes;
                          1.10: a holder that keeps the card by virtual time lends it for its
                               host gap to a waiter of its class (SG_ARB_YIELD_LOAN, loans);
                          1.11: an online service that waits for each request before its host
                               time is predicted from that host time (online_last_end_ns,
                               online_gap_*);
                          1.12: queued hand-overs: at a sync that covers its hold, a holder
                               offers the token before its work ends, and the next holder's
                               work waits on the GPU for a word of the region the holder's
                               stream writes after its work (handoff, queued_by, queued_seq;
                               the records struct sg_arb_handoffs at SG_ARB_HANDOFFS_OFFSET,
                               present when total_size says so);
                          1.13: queued loans: a holder that keeps the card by virtual time
                               offers its gap to a waiter of its class whose bursts have several
                               kernels, one kernel queued behind its work (SG_ARB_HO_LENDS,
                               SG_ARB_HO_SEVERAL in a record's flags) */

#define SG_MAGIC_LIMITS 0x4d4c4753u  /* "SGLM" little-endian */
#define SG_MAGIC_USAGE 0x53554753u   /* "SGUS" */
#define SG_MAGIC_ARBITER 0x52414753u /* "SGAR" (compute arbitration, ABI 1.1+) */

/* Entry flags (ledger slots, arbiter clients), ABI 1.3. */
#define SG_ENTRY_LIVE_LOCK 1u /* the owner holds an OFD write lock on byte SG_LIVE_LOCK_BASE +
                                 the entry's index of the region's file while it lives: the
                                 entry is alive iff that byte is locked (native/shim/live.c) */
#define SG_LIVE_LOCK_BASE (1ull << 40) /* past any region's contents */

#define SG_MAX_DEVICES 16
#define SG_MAX_PROCS 256
#define SG_TENANT_ID_LEN 64

/* File names inside a tenant directory. */
#define SG_LIMITS_FILE "limits"
#define SG_USAGE_FILE "usage"
/* The per-GPU regions: <tenant dir>/gpus (a symlink to <runtime>/gpus, or a mount of
 * <runtime>/gpus/<uuid> in a container) holds <uuid>/arbiter, uuid in NVML form "GPU-...". */
#define SG_GPUS_DIR "gpus"
#define SG_ARBITER_FILE "arbiter"

/* Where a container runtime mounts the tenant directory inside a container.  When it exists the
 * shim uses it and ignores SHAREGPU_TENANT, so a tenant cannot point the shim at limits of its
 * own making by editing its environment. */
#define SG_CONTAINER_TENANT_DIR "/run/sharegpu/tenant"
/* Environment variable naming the tenant directory on a bare host (`sharegpu run`). */
#define SG_TENANT_ENV "SHAREGPU_TENANT"

/* ------------------------------------------------------------------------------------------ */
/* Common header (64 bytes). */
struct sg_region_header {
    uint32_t magic;       /* [const] SG_MAGIC_* */
    uint16_t abi_major;   /* [const] SG_ABI_MAJOR of the writer */
    uint16_t abi_minor;   /* [const] SG_ABI_MINOR of the writer */
    uint32_t header_size; /* [const] sizeof(struct sg_region_header) */
    uint32_t total_size;  /* [const] size of the whole region in bytes, as written */
    uint64_t created_ns;  /* [const] CLOCK_REALTIME at creation */
    uint8_t reserved[40];
};
_Static_assert(sizeof(struct sg_region_header) == 64, "header size");
_Static_assert(offsetof(struct sg_region_header, magic) == 0, "magic");
_Static_assert(offsetof(struct sg_region_header, abi_major) == 4, "abi_major");
_Static_assert(offsetof(struct sg_region_header, abi_minor) == 6, "abi_minor");
_Static_assert(offsetof(struct sg_region_header, header_size) == 8, "header_size");
_Static_assert(offsetof(struct sg_region_header, total_size) == 12, "total_size");
_Static_assert(offsetof(struct sg_region_header, created_ns) == 16, "created_ns");

/* ------------------------------------------------------------------------------------------ */
/* Tenant limits: <runtime>/tenants/<id>/limits.  W: agent / `sharegpu run`.  R: shim.
 * Read-only for the tenant (mounted read-only in containers).  Published by temp + rename on
 * creation; later resizes rewrite it in place under the seqlock, so a read-only bind mount of
 * the file (which pins the inode) sees them. */

enum sg_policy {
    SG_POLICY_SHARE = 0,  /* weighted fair share, work-conserving */
    SG_POLICY_CAP = 1,    /* hard ceiling */
    SG_POLICY_BURST = 2,  /* guarantee, may burst to ceiling */
    SG_POLICY_NATIVE = 3, /* no compute control */
};

enum sg_priority {
    SG_PRIORITY_OFFLINE = 0,
    SG_PRIORITY_NORMAL = 1,
    SG_PRIORITY_ONLINE = 2, /* higher value = higher class */
};

/* One vGPU (64 bytes). */
struct sg_limits_device {
    uint8_t uuid[16];          /* [seq] the physical GPU, as cuDeviceGetUuid returns it */
    uint64_t mem_cap_bytes;    /* [seq] memory cap; allocations over it fail */
    uint32_t policy;           /* [seq] enum sg_policy */
    uint32_t priority;         /* [seq] enum sg_priority */
    uint32_t share_permille;   /* [seq] share (share), ceiling (cap), guarantee (burst); 1..1000 */
    uint32_t ceiling_permille; /* [seq] burst ceiling; equals share_permille otherwise */
    uint32_t weight;           /* [seq] tie-break weight within a class, >= 1 */
    uint32_t flags;            /* [seq] reserved, 0 */
    uint8_t reserved[16];
};
_Static_assert(sizeof(struct sg_limits_device) == 64, "limits device size");
_Static_assert(offsetof(struct sg_limits_device, uuid) == 0, "uuid");
_Static_assert(offsetof(struct sg_limits_device, mem_cap_bytes) == 16, "mem_cap_bytes");
_Static_assert(offsetof(struct sg_limits_device, policy) == 24, "policy");
_Static_assert(offsetof(struct sg_limits_device, priority) == 28, "priority");
_Static_assert(offsetof(struct sg_limits_device, share_permille) == 32, "share_permille");
_Static_assert(offsetof(struct sg_limits_device, ceiling_permille) == 36, "ceiling_permille");
_Static_assert(offsetof(struct sg_limits_device, weight) == 40, "weight");
_Static_assert(offsetof(struct sg_limits_device, flags) == 44, "flags");

struct sg_limits {
    struct sg_region_header hdr;
    /* Seqlock.  Writer: store generation+1 (odd, release), write fields, store generation+2
     * (even, release).  Reader: load (acquire); if odd retry; copy; fence; reload; if changed
     * retry.  The shim polls it to follow live resizes. */
    uint64_t generation;                /* [atomic acquire/release] */
    char tenant_id[SG_TENANT_ID_LEN];   /* [seq] NUL-terminated */
    uint32_t device_count;              /* [seq] entries used in devices[] */
    uint32_t flags;                     /* [seq] reserved, 0 */
    uint64_t incarnation;               /* [const] random, nonzero, fixed at creation (1.3):
                                           a tenant re-created under the same name is another
                                           tenant; 0: written before 1.3 */
    uint8_t reserved[40];
    struct sg_limits_device devices[SG_MAX_DEVICES];
};
_Static_assert(offsetof(struct sg_limits, generation) == 64, "generation");
_Static_assert(offsetof(struct sg_limits, tenant_id) == 72, "tenant_id");
_Static_assert(offsetof(struct sg_limits, device_count) == 136, "device_count");
_Static_assert(offsetof(struct sg_limits, flags) == 140, "limits flags");
_Static_assert(offsetof(struct sg_limits, incarnation) == 144, "limits incarnation");
_Static_assert(offsetof(struct sg_limits, devices) == 192, "devices");
_Static_assert(sizeof(struct sg_limits) == 192 + 64 * SG_MAX_DEVICES, "limits size");

/* ------------------------------------------------------------------------------------------ */
/* Tenant usage: <runtime>/tenants/<id>/usage.  W: every shim of the tenant, the agent
 * (overhead_bytes, host_pid).  R: shims, agent, CLI.  Writable by the tenant, so nothing in it
 * is trusted for limits: a tenant that corrupts it can only hide its usage from its own
 * ledger, which the agent's NVML audit catches (see the threat model).
 *
 * Invariant, whenever `lock` is free:
 *     devices[d].mem_used_bytes == sum over slots with pid != 0 of procs[p].dev[d].mem_bytes
 * An owner that dies holding `lock` may break it; the next locker gets EOWNERDEAD and recomputes
 * the totals from the slots before marking the mutex consistent.
 *
 * Of a slot's mem_bytes, spare_bytes (1.4) are charged but back no allocation: the process
 * keeps them to allocate again without the lock (native/shim/ledger.c, "the spare").  What a
 * process has allocated is mem_bytes - spare_bytes; any shim takes spares back (under the
 * lock) before it refuses an allocation, and views count them as free.  A 1.3 shim never has
 * a spare (the field was reserved, zero). */

/* Per process and device counters (64 bytes). */
struct sg_usage_proc_dev {
    uint64_t mem_bytes;     /* [lock] bytes this process holds on this device */
    uint64_t gpu_time_ns;   /* [atomic relaxed] W: own shim.  GPU time charged (ABI 1.1) */
    uint64_t wait_ns;       /* [atomic relaxed] time waiting for the GPU token (ABI 1.1) */
    uint64_t throttled_ns;  /* [atomic relaxed] time held back by a ceiling (ABI 1.1) */
    uint64_t preemptions;   /* [atomic relaxed] yields to an online request (ABI 1.1) */
    uint64_t oom_events;    /* [atomic relaxed] allocations refused by the cap */
    uint64_t alloc_count;   /* [atomic relaxed] live allocations */
    uint64_t spare_bytes;   /* [atomic relaxed] W: own shim (spends, refills), any shim under
                               the lock (takes back).  Part of mem_bytes not allocated (1.4) */
};
_Static_assert(sizeof(struct sg_usage_proc_dev) == 64, "usage proc dev size");

/* One process slot (64 + 64 * SG_MAX_DEVICES bytes). */
#define SG_SLOT_CTX_ENTRIES 6
#define SG_SLOT_CTX_MIB_MAX ((1u << 24) - 1)
struct sg_usage_proc {
    int32_t pid;           /* [lock] pid in the tenant's pid namespace; 0 = free slot */
    int32_t host_pid;      /* [atomic relaxed] W: agent.  pid in the host namespace, 0 unknown */
    uint64_t start_time;   /* [lock] starttime of /proc/<pid>/stat (clock ticks after boot);
                              with the pid namespace, the owner's identity */
    uint64_t attached_ns;  /* [lock] CLOCK_REALTIME when the slot was claimed */
    uint32_t flags;        /* [lock] SG_ENTRY_* (1.3); 0: judged by pid + start time only */
    uint32_t pad;
    uint64_t pidns;        /* [lock] inode of the owner's pid namespace (1.3); 0 unknown */
    uint32_t ctx_mib[SG_SLOT_CTX_ENTRIES]; /* [lock] (1.9) W: own shim.  What its live contexts
                              were admitted into overhead_bytes, per device: entries
                              index << 24 | MiB, 0 free.  Whoever releases the slot takes them
                              off overhead_bytes (a killed process runs no exit handler).  A
                              process with contexts on more devices leaves the rest to the
                              agent's reconciler */
    struct sg_usage_proc_dev dev[SG_MAX_DEVICES];
};
_Static_assert(offsetof(struct sg_usage_proc, pid) == 0, "proc pid");
_Static_assert(offsetof(struct sg_usage_proc, host_pid) == 4, "proc host_pid");
_Static_assert(offsetof(struct sg_usage_proc, start_time) == 8, "proc start_time");
_Static_assert(offsetof(struct sg_usage_proc, attached_ns) == 16, "proc attached_ns");
_Static_assert(offsetof(struct sg_usage_proc, flags) == 24, "proc flags");
_Static_assert(offsetof(struct sg_usage_proc, pidns) == 32, "proc pidns");
_Static_assert(offsetof(struct sg_usage_proc, ctx_mib) == 40, "proc ctx_mib");
_Static_assert(offsetof(struct sg_usage_proc, dev) == 64, "proc dev");
_Static_assert(sizeof(struct sg_usage_proc) == 64 + 64 * SG_MAX_DEVICES, "usage proc size");

/* Per device totals of the tenant (64 bytes). */
struct sg_usage_device {
    uint64_t mem_used_bytes; /* [lock] sum of slot mem_bytes (invariant above) */
    uint64_t overhead_bytes; /* [atomic relaxed] W: agent (its NVML measurement, by
                                compare-and-swap), shims (a new context's estimate added under the
                                lock, taken out at its end: hooks_ctx.c).  Contexts and workspaces
                                measured by NVML but not allocated through the shim; counted
                                against the cap */
    uint64_t mem_peak_bytes; /* [lock] high-water mark of mem_used_bytes */
    uint64_t oom_events;     /* [atomic relaxed] allocations refused, all processes */
    uint8_t reserved[32];
};
_Static_assert(sizeof(struct sg_usage_device) == 64, "usage device size");

/* The mutex is stored in a 64-byte cell: glibc's pthread_mutex_t is 40 bytes on x86_64 and
 * 48 on aarch64.  Initialised by the region's creator as process-shared and robust. */
union sg_mutex_cell {
    pthread_mutex_t mutex;
    uint8_t bytes[64];
};
_Static_assert(sizeof(union sg_mutex_cell) == 64, "mutex cell");

struct sg_usage {
    struct sg_region_header hdr;
    union sg_mutex_cell lock;   /* robust, process-shared */
    uint32_t slot_count;        /* [const] SG_MAX_PROCS */
    uint32_t device_count;      /* [const] SG_MAX_DEVICES */
    uint64_t recoveries;        /* [lock] times an EOWNERDEAD recovery recomputed the totals */
    uint8_t reserved[48];
    struct sg_usage_device devices[SG_MAX_DEVICES];
    struct sg_usage_proc procs[SG_MAX_PROCS];
};
_Static_assert(offsetof(struct sg_usage, lock) == 64, "usage lock");
_Static_assert(offsetof(struct sg_usage, slot_count) == 128, "slot_count");
_Static_assert(offsetof(struct sg_usage, device_count) == 132, "device_count");
_Static_assert(offsetof(struct sg_usage, recoveries) == 136, "recoveries");
_Static_assert(offsetof(struct sg_usage, devices) == 192, "usage devices");
_Static_assert(offsetof(struct sg_usage, procs) == 192 + 64 * SG_MAX_DEVICES, "usage procs");
_Static_assert(sizeof(struct sg_usage) ==
                   192 + 64 * SG_MAX_DEVICES + (64 + 64 * SG_MAX_DEVICES) * SG_MAX_PROCS,
               "usage size");

/* ------------------------------------------------------------------------------------------ */
/* GPU arbiter (ABI 1.1): <runtime>/gpus/<uuid>/arbiter, one per physical GPU, shared by every
 * tenant on it.  W: creator (sharegpu.arbiter.ensure_arbiter: everything [const], the tunables),
 * the shims of all tenants on the GPU (everything else), the agent (tunables).  R: shims, agent,
 * CLI.  Writable by every tenant on the GPU, so a hostile tenant can corrupt it: the worst it can
 * do is starve the GPU's tenants or grant itself the token, which the agent's NVML audit (per
 * process utilisation against the configured shares) detects; it can never raise anyone's
 * memory cap (those live in the read-only limits).
 *
 * One token per GPU: only the client (process) that holds it may have kernels in flight.  The
 * token word packs the holder and a grant generation so that the launch fast path is one acquire
 * load compared with the word the process was granted:
 *     token == (generation << 16) | (holder client index + 1);   holder + 1 == 0: free.
 * The generation grows by one at every grant, so a stale holder never mistakes a later grant for
 * its own.
 *
 * Invariants, whenever `lock` is free:
 *     waiting == count(c : clients[c].pid != 0 && clients[c].state == SG_ARB_WAITING)
 *     SG_ARB_TOKEN_HOLDER(token) == h >= 0  =>  clients[h].state == SG_ARB_HOLDING, and
 *         no other client is HOLDING;  SG_ARB_TOKEN_HOLDER(token) < 0  =>  no client is HOLDING
 *     tenants[t].clients == count(c : clients[c].pid != 0 && clients[c].tenant == t)
 * The next locker after an owner died holding `lock` (EOWNERDEAD) recomputes `waiting` and the
 * tenants' client counts from the client entries, repairs the holder/state pair, frees the
 * entries of dead processes (pid + start time) and bumps `recoveries`.
 */

#define SG_ARB_MAX_TENANTS 64
#define SG_ARB_MAX_CLIENTS 256
/* Client entries one tenant may hold on a GPU (1.3): a tenant with hundreds of processes never
 * takes the entries of the others; its next process waits for one of its own to be freed. */
#define SG_ARB_TENANT_MAX_CLIENTS 32
/* A holder that keeps the token this long past its quantum end is stopped (SIGSTOP, docker
 * pause, a debugger) or draining a kernel that long: a waiter takes the token back (1.3). */
#define SG_ARB_STALL_NS 1000000000ull
/* The longest any client waits for the region's lock (1.7); past it the region is broken. */
#define SG_ARB_LOCK_DEADLINE_NS 200000000ull
/* Default quantum, chosen by measurement (docs/design/arbitration.md). */
#define SG_ARB_DEFAULT_QUANTUM_NS 10000000ull
/* Accepted quantum range; a region outside it is corrupt (fail closed). */
#define SG_ARB_MIN_QUANTUM_NS 500000ull
#define SG_ARB_MAX_QUANTUM_NS 1000000000ull
/* Default for offline_inflight_max and online_window_ns. */
#define SG_ARB_DEFAULT_OFFLINE_INFLIGHT 1
#define SG_ARB_DEFAULT_ONLINE_WINDOW_NS 5000000000ull
/* Default for holdback_max_ns (docs/design/arbitration.md, "Predicted online requests"). */
#define SG_ARB_DEFAULT_HOLDBACK_MAX_NS 10000000ull
/* online_preempt (1.5): how a higher-class request takes the card from a holder of a lower
 * class (docs/design/arbitration.md, "Random requests").  DRAIN: the holder waits for its work
 * in flight, then grants.  EARLY: it grants at once and leaves its work in flight to the GPU,
 * which preempts it at the end of its time slice.  BY_KERNEL: EARLY when the holder's measured
 * kernel is at least preempt_min_kernel_ns, DRAIN otherwise.  Holders under a ceiling always
 * drain (their bucket is spent exactly by their hold).  EARLY by default since 1.5: never
 * slower by the GPU model and much faster with long offline kernels (arbitration.md). */
#define SG_ARB_PREEMPT_DRAIN 0u
#define SG_ARB_PREEMPT_EARLY 1u
#define SG_ARB_PREEMPT_BY_KERNEL 2u
#define SG_ARB_DEFAULT_ONLINE_PREEMPT SG_ARB_PREEMPT_EARLY
#define SG_ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS 1000000ull
#define SG_ARB_DEFAULT_OFFLINE_QUIET_NS 0ull
/* handoff (1.12): how the token moves between holders of a class at a sync that covers the
 * holder's work (docs/design/arbitration.md, "Queued hand-overs").  DRAIN: the holder waits for
 * its work to end, then grants (every hand-over of <= 1.11).  QUEUED: the token may move while
 * the holder's sync waits; the holder's stream writes a word of the region after its work and
 * the next holder's streams wait on the GPU for it, so the card switches to its work as the
 * holder's ends.  A region without the hand-over records (1.11 and older) drains whatever it
 * says. */
#define SG_ARB_HANDOFF_DRAIN 0u
#define SG_ARB_HANDOFF_QUEUED 1u
/* DRAIN by default: on the simulated GPU the drain's hand-over already costs what the GPU's own
 * switch does, and QUEUED measured within a point of it either way; a real GPU decides. */
#define SG_ARB_DEFAULT_HANDOFF SG_ARB_HANDOFF_DRAIN
/* sg_arb_client.yield: why a waiter asks the holder to give the card up. */
#define SG_ARB_YIELD_CLASS 1u /* a higher class waits: yield now */
#define SG_ARB_YIELD_TURN 2u  /* one of the same class came back behind in virtual time: end the
                                 turn a quarter quantum after the grant (1.6) */
#define SG_ARB_YIELD_LOAN 3u  /* set at the grant, not by a waiter (1.10): the card is lent to
                                 this holder for the host gap of a holder of its class ahead of
                                 it in virtual time.  Its launches take the slow path and keep
                                 one kernel in flight; the loan ends at its first launch (or its
                                 watcher's look) at which a waiter is ahead of it, and becomes
                                 an ordinary hold at the (short) quantum's end */

#define SG_ARB_TOKEN_HOLDER(t) ((int)((t) & 0xffffu) - 1)
#define SG_ARB_TOKEN_GEN(t) ((t) >> 16)
#define SG_ARB_TOKEN(gen, holder) (((uint64_t)(gen) << 16) | (uint64_t)((holder) + 1))

enum sg_arb_state {
    SG_ARB_FREE = 0,    /* entry unused (pid == 0) */
    SG_ARB_IDLE = 1,    /* a live client neither waiting for nor holding the token */
    SG_ARB_WAITING = 2, /* asked for the token, sleeping on `wake` */
    SG_ARB_HOLDING = 3, /* holds the token (exactly the client the token word names) */
};

/* One tenant on this GPU (192 bytes).  Claimed by the first client of the tenant (matched by
 * tenant_id), kept after its clients leave so that its totals and virtual time survive restarts
 * of its processes; an entry with no client is reused when the table is full. */
struct sg_arb_tenant {
    char tenant_id[SG_TENANT_ID_LEN]; /* [lock] NUL-terminated; "" = free entry */
    uint32_t policy;                  /* [lock] enum sg_policy, copied from the tenant's limits */
    uint32_t priority;                /* [lock] enum sg_priority, copied */
    uint32_t share_permille;          /* [lock] share / guarantee (cap, burst), copied */
    uint32_t ceiling_permille;        /* [lock] ceiling (cap: == share), copied */
    uint32_t weight;                  /* [lock] weight within the class, copied */
    uint32_t clients;                 /* [lock] live client entries of this tenant (invariant) */
    uint64_t limits_generation;       /* [lock] limits generation the copies above come from;
                                         a client whose limits moved refreshes them */
    uint64_t vtime;                   /* [lock] weighted virtual time: += charged_ns * 1000 /
                                         effective weight at each charge; a tenant that becomes
                                         active again starts at max(vtime, min active vtime) */
    int64_t bucket_ns;                /* [lock] ceiling token bucket (cap, burst), ns of GPU time:
                                         += elapsed * ceiling / 1000 (at most quantum_ns, the cap
                                         applied once a hold is charged), -= the GPU time charged;
                                         eligible for a grant only while >= quantum_ns / 2 */
    uint64_t bucket_ts_ns;            /* [lock] CLOCK_MONOTONIC of the last refill */
    uint64_t last_active_ns;          /* [lock] last request, grant or release by a client */
    uint64_t gpu_time_ns;             /* [atomic relaxed, written under lock] GPU time charged
                                         (1.6: the GPU time of the holds' work; before, the wall
                                         time held) */
    uint64_t wait_ns;                 /* [atomic relaxed] waiting for the token, eligible */
    uint64_t throttled_ns;            /* [atomic relaxed] waiting, held back by the ceiling */
    uint64_t preemptions;             /* [atomic relaxed] yields to a higher-class request */
    uint64_t grants;                  /* [atomic relaxed, written under lock] tokens granted */
    uint64_t incarnation;             /* [lock] the tenant's limits incarnation (1.3): an entry
                                         of the same name and another incarnation is another
                                         (deleted) tenant's, and nothing of it is inherited */
    uint8_t reserved[16];
};
_Static_assert(sizeof(struct sg_arb_tenant) == 192, "arb tenant size");
_Static_assert(offsetof(struct sg_arb_tenant, tenant_id) == 0, "arb tenant_id");
_Static_assert(offsetof(struct sg_arb_tenant, policy) == 64, "arb policy");
_Static_assert(offsetof(struct sg_arb_tenant, priority) == 68, "arb priority");
_Static_assert(offsetof(struct sg_arb_tenant, share_permille) == 72, "arb share_permille");
_Static_assert(offsetof(struct sg_arb_tenant, ceiling_permille) == 76, "arb ceiling_permille");
_Static_assert(offsetof(struct sg_arb_tenant, weight) == 80, "arb weight");
_Static_assert(offsetof(struct sg_arb_tenant, clients) == 84, "arb clients");
_Static_assert(offsetof(struct sg_arb_tenant, limits_generation) == 88, "arb limits_generation");
_Static_assert(offsetof(struct sg_arb_tenant, vtime) == 96, "arb vtime");
_Static_assert(offsetof(struct sg_arb_tenant, bucket_ns) == 104, "arb bucket_ns");
_Static_assert(offsetof(struct sg_arb_tenant, bucket_ts_ns) == 112, "arb bucket_ts_ns");
_Static_assert(offsetof(struct sg_arb_tenant, last_active_ns) == 120, "arb last_active_ns");
_Static_assert(offsetof(struct sg_arb_tenant, gpu_time_ns) == 128, "arb t gpu_time_ns");
_Static_assert(offsetof(struct sg_arb_tenant, wait_ns) == 136, "arb t wait_ns");
_Static_assert(offsetof(struct sg_arb_tenant, throttled_ns) == 144, "arb t throttled_ns");
_Static_assert(offsetof(struct sg_arb_tenant, preemptions) == 152, "arb t preemptions");
_Static_assert(offsetof(struct sg_arb_tenant, grants) == 160, "arb t grants");
_Static_assert(offsetof(struct sg_arb_tenant, incarnation) == 168, "arb t incarnation");

/* One client: a process using this GPU (128 bytes).  Claimed at the process's first launch on
 * the GPU, freed at its exit, or by anyone who finds it dead (its liveness lock, or pid + start
 * time from the same pid namespace: native/shim/live.c). */
struct sg_arb_client {
    int32_t pid;             /* [lock] 0 = free entry */
    uint32_t tenant;         /* [lock] index in tenants[] */
    uint64_t start_time;     /* [lock] starttime of /proc/<pid>/stat (the owner's identity) */
    uint32_t state;          /* [lock, atomic relaxed reads] enum sg_arb_state */
    uint32_t priority;       /* [lock] the tenant's class, copied for the pick */
    uint32_t wake;           /* [atomic release/acquire] futex word the client waits on: +1 at
                                every grant to it (then FUTEX_WAKE) */
    uint32_t yield;          /* [atomic relaxed] W: a waiter (under lock): SG_ARB_YIELD_CLASS,
                                one of a higher class; SG_ARB_YIELD_TURN (1.6), one of the same
                                class that came back behind in virtual time.  Cleared by the
                                owner when it releases (TURN: when it has shortened its
                                quantum to a quarter).  Nonzero sends launches to the slow path */
    uint32_t watch;          /* [atomic] futex word of the owner's watcher thread: +1 (then
                                FUTEX_WAKE) with every yield request, so an idle holder yields
                                at once */
    uint32_t flags;          /* [lock] SG_ENTRY_* (1.3); 0: judged by pid + start time only */
    uint64_t wait_since_ns;  /* [lock] when it started waiting (FIFO among equals) */
    uint64_t grant_ns;       /* [lock] start of the current charge period while HOLDING */
    uint64_t gpu_time_ns;    /* [atomic relaxed] GPU time charged, this client (1.6: the holds'
                                wall time less their idle time after drained syncs; before,
                                the wall time held) */
    uint64_t wait_ns;        /* [atomic relaxed] */
    uint64_t throttled_ns;   /* [atomic relaxed] */
    uint64_t preemptions;    /* [atomic relaxed] */
    uint64_t pidns;          /* [lock] inode of the owner's pid namespace (1.3); 0 unknown */
    uint8_t reserved[32];
};
_Static_assert(sizeof(struct sg_arb_client) == 128, "arb client size");
_Static_assert(offsetof(struct sg_arb_client, pidns) == 88, "arb c pidns");
_Static_assert(offsetof(struct sg_arb_client, pid) == 0, "arb pid");
_Static_assert(offsetof(struct sg_arb_client, tenant) == 4, "arb tenant");
_Static_assert(offsetof(struct sg_arb_client, start_time) == 8, "arb start_time");
_Static_assert(offsetof(struct sg_arb_client, state) == 16, "arb state");
_Static_assert(offsetof(struct sg_arb_client, priority) == 20, "arb c priority");
_Static_assert(offsetof(struct sg_arb_client, wake) == 24, "arb wake");
_Static_assert(offsetof(struct sg_arb_client, yield) == 28, "arb yield");
_Static_assert(offsetof(struct sg_arb_client, watch) == 32, "arb watch");
_Static_assert(offsetof(struct sg_arb_client, flags) == 36, "arb c flags");
_Static_assert(offsetof(struct sg_arb_client, wait_since_ns) == 40, "arb wait_since_ns");
_Static_assert(offsetof(struct sg_arb_client, grant_ns) == 48, "arb c grant_ns");
_Static_assert(offsetof(struct sg_arb_client, gpu_time_ns) == 56, "arb c gpu_time_ns");
_Static_assert(offsetof(struct sg_arb_client, wait_ns) == 64, "arb c wait_ns");
_Static_assert(offsetof(struct sg_arb_client, throttled_ns) == 72, "arb c throttled_ns");
_Static_assert(offsetof(struct sg_arb_client, preemptions) == 80, "arb c preemptions");

struct sg_arbiter {
    struct sg_region_header hdr;
    union sg_mutex_cell lock;       /* robust, process-shared; initialised by the creator */
    uint8_t uuid[16];               /* [const] the GPU, raw bytes as cuDeviceGetUuid gives them */
    uint64_t quantum_ns;            /* [atomic relaxed] W: creator, agent.  Longest hold before
                                       the token is handed on to a waiter; also the depth of
                                       the ceiling buckets.  Read at every grant */
    uint32_t tenant_slots;          /* [const] SG_ARB_MAX_TENANTS */
    uint32_t client_slots;          /* [const] SG_ARB_MAX_CLIENTS */
    uint64_t token;                 /* [atomic acquire/release; stored only under lock] the
                                       token word (holder + generation, see above) */
    uint64_t quantum_end_ns;        /* [lock, atomic relaxed reads] CLOCK_MONOTONIC end of the
                                       holder's quantum (shortened by a ceiling bucket) */
    uint64_t grant_ns;              /* [lock] when the token was granted to the holder */
    uint32_t waiting;               /* [lock, atomic relaxed reads] clients WAITING (invariant) */
    uint32_t offline_inflight_max;  /* [atomic relaxed] W: creator, agent.  While online
                                       tenants are active, an offline client synchronises after
                                       this many launches (>= 1), so that an online request
                                       waits about one offline kernel */
    uint64_t online_window_ns;      /* [atomic relaxed] W: creator, agent.  Online tenants
                                       count as active this long after their last request */
    uint64_t online_active_until_ns;/* [atomic relaxed] W: online clients (max of now + window) */
    uint64_t last_release_ns;       /* [lock] when the token was last released */
    uint64_t grants;                /* [lock] grants, all clients */
    uint64_t handovers;             /* [lock] grants to a client that was waiting when the token
                                       was released by another */
    uint64_t handover_idle_ns;      /* [lock] sum over handovers of (grant - release) */
    uint64_t reclaims;              /* [lock] tokens taken back from dead holders */
    uint64_t recoveries;            /* [lock] EOWNERDEAD repairs */
    /* ABI 1.2: predicted online requests.  Online requests of a service tend to be periodic;
       while the period is learned with little jitter, an offline client does not start a
       kernel that would still run when the next request is due (it releases the token and no
       offline client is granted until the request came or offline_hold_until_ns passed).  A
       region of ABI 1.1 reads holdback_max_ns == 0: prediction off. */
    uint64_t holdback_max_ns;       /* [atomic relaxed] W: creator, agent.  Longest hold-back
                                       ahead of a predicted request; 0: prediction off */
    uint64_t online_period_ns;      /* [lock, atomic relaxed reads] learned period (EWMA) */
    uint64_t online_jitter_ns;      /* [lock, atomic relaxed reads] EWMA of |interval - period| */
    uint64_t online_last_arrival_ns;/* [lock, atomic relaxed reads] last online request start */
    uint32_t online_samples;        /* [lock, atomic relaxed reads] consistent intervals learned
                                       since the period was last (re)set (<= 1000) */
    uint32_t online_outliers;       /* [lock] intervals in a row off the learned period */
    uint64_t offline_hold_until_ns; /* [lock] no offline grant before this, unless an online
                                       client was granted since (then 0) */
    uint64_t holdbacks;             /* [lock] offline launches held back */
    uint64_t holdback_ns;           /* [lock] sum of the planned hold-back lengths */
    uint64_t holdback_misses;       /* [lock] hold-backs whose request never came */
    uint32_t misses_in_row;         /* [lock] since the last online grant; two in a row
                                       withdraw the prediction until it is learned again */
    uint32_t pad0;
    /* ABI 1.3 */
    uint64_t stall_reclaims;        /* [lock] tokens taken back from live holders that kept them
                                       SG_ARB_STALL_NS past their quantum (stopped: SIGSTOP,
                                       docker pause, a debugger) */
    uint64_t entry_waits;           /* [lock] processes that found no client entry they may take
                                       and waited for one (instead of failing) */
    /* ABI 1.5: unpredicted online requests.  A region of ABI <= 1.4 reads zeros: drain, no
       quiet window (the behaviour of those versions). */
    uint32_t online_preempt;        /* [atomic relaxed] W: creator, agent.  SG_ARB_PREEMPT_* */
    uint32_t pad1;
    uint64_t preempt_min_kernel_ns; /* [atomic relaxed] W: creator, agent.  BY_KERNEL threshold */
    uint64_t offline_quiet_ns;      /* [atomic relaxed] W: creator, agent.  When an online client
                                       hands the token on (its request is over), no offline
                                       client is granted for this long: online requests come in
                                       bursts.  0: off */
    uint64_t offline_quiet_until_ns;/* [lock] no offline grant before this (quiet window) */
    uint64_t early_preemptions;     /* [lock] grants to a higher class made before the lower-class
                                       holder's drain (EARLY, BY_KERNEL) */
    uint64_t quiet_windows;         /* [lock] quiet windows started */
    /* ABI 1.7: a lock held past SG_ARB_LOCK_DEADLINE_NS.  No critical section lasts near it, so
       its holder is stopped, asleep or hostile: the client that gave up marks the region
       broken; from then on nobody waits on its lock, every client launches unarbitrated, and
       the agent replaces the file (each client maps the new one at its next launch). */
    uint64_t lock_timeouts;         /* [atomic] lock attempts that gave up at the deadline */
    uint64_t broken_since_ns;       /* [atomic] CLOCK_MONOTONIC of the first; 0: healthy */
    /* ABI 1.8: requests off the learned beat.  From the second in a row the prediction is
       suspended, the learned period and phase kept, and the off-beat requests learned apart
       (the candidate): a request back on the old beat resumes the prediction at once (a stall),
       two consistent intervals of the candidate replace it (a changed pattern).  A region of
       ABI <= 1.7 reads zeros: no candidate yet.  A 1.7 shim beside 1.8 ones restarts learning
       at a second outlier, as it did; both write only under the lock. */
    uint64_t online_cand_period_ns; /* [lock] the candidate's period; 0: none */
    uint64_t online_cand_last_ns;   /* [lock] the candidate's last request; 0: none */
    uint32_t online_cand_samples;   /* [lock] the candidate's consistent intervals */
    uint32_t pad2;
    uint64_t online_stalls;         /* [lock] runs of off-beat requests that ended on the beat */
    uint64_t online_relearns;       /* [lock] changed patterns adopted from a candidate */
    uint64_t loans;                 /* [lock] grants lent for a holder's host gap (1.10) */
    /* ABI 1.11: a closed-loop service (each request waits for the one before, then the host
       time) keeps no beat while its requests wait behind offline work, but keeps its host
       time: learned from the end of a request's work to the next request.  A region of ABI
       <= 1.10 reads zeros: nothing learned. */
    uint64_t online_last_end_ns;    /* [lock] the end of the last online request's work (its
                                       drained sync, by the burst clock) while the next has not
                                       come; 0 otherwise */
    uint64_t online_gap_ns;         /* [lock] learned time from a request's end to the next */
    uint64_t online_gap_jitter_ns;  /* [lock] its mean deviation */
    uint32_t online_gap_samples;    /* [lock] consistent gaps in a row (<= 1000) */
    uint32_t pad3;
    /* ABI 1.12: queued hand-overs.  A region of ABI <= 1.11 reads zeros: drain. */
    uint32_t handoff;               /* [atomic relaxed] W: creator, agent.  SG_ARB_HANDOFF_* */
    uint32_t queued_by;             /* [lock] 1 + the client whose hold was last handed on
                                       queued, while its work may still run (its done word is what
                                       the next grant waits for); 0: none.  Cleared by that
                                       client when its sync returned, or by a gate opened past
                                       the bound */
    uint32_t queued_seq;            /* [lock] that client's handoffs[].seq at that hand-over */
    uint32_t pad4;
    struct sg_arb_tenant tenants[SG_ARB_MAX_TENANTS];
    struct sg_arb_client clients[SG_ARB_MAX_CLIENTS];
};
_Static_assert(offsetof(struct sg_arbiter, lock) == 64, "arb lock");
_Static_assert(offsetof(struct sg_arbiter, uuid) == 128, "arb uuid");
_Static_assert(offsetof(struct sg_arbiter, quantum_ns) == 144, "arb quantum_ns");
_Static_assert(offsetof(struct sg_arbiter, tenant_slots) == 152, "arb tenant_slots");
_Static_assert(offsetof(struct sg_arbiter, client_slots) == 156, "arb client_slots");
_Static_assert(offsetof(struct sg_arbiter, token) == 160, "arb token");
_Static_assert(offsetof(struct sg_arbiter, quantum_end_ns) == 168, "arb quantum_end_ns");
_Static_assert(offsetof(struct sg_arbiter, grant_ns) == 176, "arb grant_ns");
_Static_assert(offsetof(struct sg_arbiter, waiting) == 184, "arb waiting");
_Static_assert(offsetof(struct sg_arbiter, offline_inflight_max) == 188, "arb offline_inflight_max");
_Static_assert(offsetof(struct sg_arbiter, online_window_ns) == 192, "arb online_window_ns");
_Static_assert(offsetof(struct sg_arbiter, online_active_until_ns) == 200, "arb online_active_until");
_Static_assert(offsetof(struct sg_arbiter, last_release_ns) == 208, "arb last_release_ns");
_Static_assert(offsetof(struct sg_arbiter, grants) == 216, "arb grants");
_Static_assert(offsetof(struct sg_arbiter, handovers) == 224, "arb handovers");
_Static_assert(offsetof(struct sg_arbiter, handover_idle_ns) == 232, "arb handover_idle_ns");
_Static_assert(offsetof(struct sg_arbiter, reclaims) == 240, "arb reclaims");
_Static_assert(offsetof(struct sg_arbiter, recoveries) == 248, "arb recoveries");
_Static_assert(offsetof(struct sg_arbiter, holdback_max_ns) == 256, "arb holdback_max_ns");
_Static_assert(offsetof(struct sg_arbiter, online_samples) == 288, "arb online_samples");
_Static_assert(offsetof(struct sg_arbiter, holdback_ns) == 312, "arb holdback_ns");
_Static_assert(offsetof(struct sg_arbiter, misses_in_row) == 328, "arb misses_in_row");
_Static_assert(offsetof(struct sg_arbiter, online_preempt) == 352, "arb online_preempt");
_Static_assert(offsetof(struct sg_arbiter, quiet_windows) == 392, "arb quiet_windows");
_Static_assert(offsetof(struct sg_arbiter, lock_timeouts) == 400, "arb lock_timeouts");
_Static_assert(offsetof(struct sg_arbiter, broken_since_ns) == 408, "arb broken_since_ns");
_Static_assert(offsetof(struct sg_arbiter, online_cand_period_ns) == 416, "arb online_cand_period_ns");
_Static_assert(offsetof(struct sg_arbiter, online_relearns) == 448, "arb online_relearns");
_Static_assert(offsetof(struct sg_arbiter, loans) == 456, "arb loans");
_Static_assert(offsetof(struct sg_arbiter, online_last_end_ns) == 464, "arb online_last_end_ns");
_Static_assert(offsetof(struct sg_arbiter, online_gap_samples) == 488, "arb online_gap_samples");
_Static_assert(offsetof(struct sg_arbiter, handoff) == 496, "arb handoff");
_Static_assert(offsetof(struct sg_arbiter, tenants) == 512, "arb tenants");
_Static_assert(offsetof(struct sg_arbiter, clients) == 512 + 192 * SG_ARB_MAX_TENANTS, "arb clients");
_Static_assert(sizeof(struct sg_arbiter) ==
                   512 + 192 * SG_ARB_MAX_TENANTS + 128 * SG_ARB_MAX_CLIENTS,
               "arbiter size");


/* The hand-over records (1.12): in the arbiter file from SG_ARB_HANDOFFS_OFFSET (a page
 * boundary: every process page-locks the records' pages, cuMemHostRegister, for the GPU to read
 * and write their `done` words), one per client entry.  A region whose total_size is
 * sizeof(struct sg_arbiter) has none (1.11 and older): its holders drain.  W: the entry's owner
 * unless marked. */
#define SG_ARB_HO_WAITS 1u /* flags: the owner's streams can wait for the done words (its
                              registration of the records succeeded): it may be granted queued */
#define SG_ARB_HO_LENDS 2u /* flags (1.13): the owner's offer, when it keeps the card by virtual
                              time, is a loan of its gap: a waiter of its class may take it, one
                              kernel queued behind the owner's work (arbqueue.c) */
#define SG_ARB_HO_SEVERAL 4u /* flags (1.13): the owner's last burst (its launches between two
                                syncs of its program's that covered its hold) had several
                                kernels: lent one, it fills a lender's gap without taking a turn */
struct sg_arb_handoff {
    uint32_t done;         /* [the GPU] the owner's stream writes its offer's seq here after its
                              offered work; the next holder's streams wait for it (GEQ) */
    uint32_t seq;          /* [lock] +1 at each offer of the owner (never 0) */
    uint32_t behind;       /* [lock] W: the granter.  1 + the client whose done word the owner's
                              next hold waits for (queued_by at the grant); 0: none.  The owner
                              takes it when it wakes holding */
    uint32_t behind_seq;   /* [lock] W: the granter.  The seq that word must reach */
    uint32_t offer;        /* [lock] the owner, holding, is in a sync that covers all its hold's
                              work, and `done` reaches `offer` (its seq) after that work: a
                              waiter of its class may take the token queued behind it; 0: none.
                              Cleared when taken, withdrawn or the hold ends */
    uint32_t taken;        /* [lock] W: the taker.  The offer a waiter took (the owner pays for
                              its work to its end when its sync returns, then clears it) */
    uint32_t flags;        /* [lock] SG_ARB_HO_* */
    uint32_t pad;
    uint64_t queued;       /* [atomic relaxed] hand-overs of the owner's holds made queued */
    uint64_t gated;        /* [atomic relaxed] holds of the owner whose work waited on the GPU
                              for the previous holder's */
    uint64_t gates_opened; /* [atomic relaxed] of those, gates the owner opened itself: the
                              awaited work ran past the bound (quantum + SG_ARB_STALL_NS), or
                              its streams could not wait */
    uint64_t gate_wait_ns; /* [atomic relaxed] time the owner's first work waited at its gates
                              (left out of its charge) */
    uint64_t tail_ns;      /* [atomic relaxed] the owner's work at its last covering sync, from
                              the sync's begin (or its offer) to the work's end: what a queued
                              decision leaves uncharged until the sync returns */
    uint8_t reserved[56];
};
_Static_assert(sizeof(struct sg_arb_handoff) == 128, "arb handoff size");
_Static_assert(offsetof(struct sg_arb_handoff, done) == 0, "arb h done");
_Static_assert(offsetof(struct sg_arb_handoff, flags) == 24, "arb h flags");
_Static_assert(offsetof(struct sg_arb_handoff, queued) == 32, "arb h queued");
_Static_assert(offsetof(struct sg_arb_handoff, tail_ns) == 64, "arb h tail_ns");

struct sg_arb_handoffs {
    struct sg_arb_handoff h[SG_ARB_MAX_CLIENTS];
};
#define SG_ARB_HANDOFFS_OFFSET 49152u
_Static_assert(SG_ARB_HANDOFFS_OFFSET >= sizeof(struct sg_arbiter) &&
                   SG_ARB_HANDOFFS_OFFSET % 4096 == 0,
               "the records start on a page after the region");
/* The whole arbiter file of ABI 1.12 and later. */
#define SG_ARB_FILE_SIZE (SG_ARB_HANDOFFS_OFFSET + sizeof(struct sg_arb_handoffs))

#endif /* SHAREGPU_ABI_H */
