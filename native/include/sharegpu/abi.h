/*
 * sharegpu shared-memory ABI: the one source of truth for every layout that crosses a process
 * boundary.  Mirrored field for field in src/sharegpu/abi.py; tests/test_abi.py compiles a
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
#define SG_ABI_MINOR 0

#define SG_MAGIC_LIMITS 0x4d4c4753u  /* "SGLM" little-endian */
#define SG_MAGIC_USAGE 0x53554753u   /* "SGUS" */
#define SG_MAGIC_ARBITER 0x52414753u /* "SGAR" (compute arbitration, ABI 1.1+) */

#define SG_MAX_DEVICES 16
#define SG_MAX_PROCS 256
#define SG_TENANT_ID_LEN 64

/* File names inside a tenant directory. */
#define SG_LIMITS_FILE "limits"
#define SG_USAGE_FILE "usage"

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
    uint8_t reserved[48];
    struct sg_limits_device devices[SG_MAX_DEVICES];
};
_Static_assert(offsetof(struct sg_limits, generation) == 64, "generation");
_Static_assert(offsetof(struct sg_limits, tenant_id) == 72, "tenant_id");
_Static_assert(offsetof(struct sg_limits, device_count) == 136, "device_count");
_Static_assert(offsetof(struct sg_limits, flags) == 140, "limits flags");
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
 * the totals from the slots before marking the mutex consistent. */

/* Per process and device counters (64 bytes). */
struct sg_usage_proc_dev {
    uint64_t mem_bytes;     /* [lock] bytes this process holds on this device */
    uint64_t gpu_time_ns;   /* [atomic relaxed] W: own shim.  GPU time charged (ABI 1.1) */
    uint64_t wait_ns;       /* [atomic relaxed] time waiting for the GPU token (ABI 1.1) */
    uint64_t throttled_ns;  /* [atomic relaxed] time held back by a ceiling (ABI 1.1) */
    uint64_t preemptions;   /* [atomic relaxed] yields to an online request (ABI 1.1) */
    uint64_t oom_events;    /* [atomic relaxed] allocations refused by the cap */
    uint64_t alloc_count;   /* [atomic relaxed] live allocations */
    uint64_t reserved;
};
_Static_assert(sizeof(struct sg_usage_proc_dev) == 64, "usage proc dev size");

/* One process slot (64 + 64 * SG_MAX_DEVICES bytes). */
struct sg_usage_proc {
    int32_t pid;           /* [lock] pid in the tenant's pid namespace; 0 = free slot */
    int32_t host_pid;      /* [atomic relaxed] W: agent.  pid in the host namespace, 0 unknown */
    uint64_t start_time;   /* [lock] starttime of /proc/<pid>/stat (clock ticks after boot);
                              liveness is pid AND start_time, never pid alone */
    uint64_t attached_ns;  /* [lock] CLOCK_REALTIME when the slot was claimed */
    uint8_t reserved[40];
    struct sg_usage_proc_dev dev[SG_MAX_DEVICES];
};
_Static_assert(offsetof(struct sg_usage_proc, pid) == 0, "proc pid");
_Static_assert(offsetof(struct sg_usage_proc, host_pid) == 4, "proc host_pid");
_Static_assert(offsetof(struct sg_usage_proc, start_time) == 8, "proc start_time");
_Static_assert(offsetof(struct sg_usage_proc, attached_ns) == 16, "proc attached_ns");
_Static_assert(offsetof(struct sg_usage_proc, dev) == 64, "proc dev");
_Static_assert(sizeof(struct sg_usage_proc) == 64 + 64 * SG_MAX_DEVICES, "usage proc size");

/* Per device totals of the tenant (64 bytes). */
struct sg_usage_device {
    uint64_t mem_used_bytes; /* [lock] sum of slot mem_bytes (invariant above) */
    uint64_t overhead_bytes; /* [atomic relaxed] W: agent.  Contexts and workspaces measured by
                                NVML but not allocated through the shim; counted against the cap */
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

#endif /* SHAREGPU_ABI_H */
