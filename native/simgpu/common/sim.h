/*
 * simgpu internals shared by libcuda.so.1 and libnvidia-ml.so.1: the error contract, the clock,
 * the configuration and the layout of the shared device state.
 *
 * Both libraries compile this code separately (each has its own statics) and map the same state
 * file, so a process that loads both sees one device.
 *
 * Error contract: an internal function returns 0 or a negative int and fills a struct sim_err;
 * only an exported function turns that into a CUresult or nvmlReturn_t (cu_result(), nvml_result()).
 */
#ifndef SIMGPU_SIM_H
#define SIMGPU_SIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_HIDDEN __attribute__((visibility("hidden")))

/* ---- errors ---------------------------------------------------------------------------- */
enum sim_errc {
    SIM_OK = 0,
    SIM_EINVAL,      /* bad argument */
    SIM_ENODEV_MEM,  /* device memory exhausted (capacity) */
    SIM_ENOMEM,      /* host memory / address space exhausted */
    SIM_ECONFIG,     /* SIMGPU_CONFIG unreadable or invalid */
    SIM_ESTATE,      /* state file corrupt or incompatible */
    SIM_EOS,         /* a system call failed */
    SIM_ENOTFOUND,   /* no such name / entry */
    SIM_ENOSLOT,     /* no free process slot in the state */
    SIM_EDEVICE,     /* bad device ordinal */
};

struct sim_err {
    enum sim_errc code;
    char msg[256];
};

/* Fills *e and returns -1.  The message is kept for the caller to print or drop. */
SIM_HIDDEN int sim_fail(struct sim_err *e, enum sim_errc code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One line on stderr prefixed "simgpu: "; at most SIM_LOG_MAX lines per process. */
SIM_HIDDEN void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define SIM_LOG_MAX 32

/* ---- clock ------------------------------------------------------------------------------ */
SIM_HIDDEN uint64_t sim_now_ns(void);          /* CLOCK_MONOTONIC: comparable across processes */
SIM_HIDDEN uint64_t sim_realtime_us(void);     /* CLOCK_REALTIME in µs (NVML timestamps) */
SIM_HIDDEN void sim_sleep_until(uint64_t t_ns); /* absolute CLOCK_MONOTONIC; spins the last µs */

/* ---- configuration (fixed when the state file is created) ------------------------------ */
#define SIM_MAX_GPUS 8
#define SIM_NAME_LEN 96
#define SIM_DRV_LEN 32

struct sim_config {
    uint32_t gpus;
    uint32_t sm_count;
    uint64_t memory_bytes; /* per GPU */
    int32_t cuda_version;  /* cuDriverGetVersion */
    int32_t cc_major;
    int32_t cc_minor;
    int32_t reserved;
    char name[SIM_NAME_LEN];
    char driver_version[SIM_DRV_LEN];
};

SIM_HIDDEN void sim_config_defaults(struct sim_config *c);
/* Parses the flat JSON object in text (keys in native/README.md) over the defaults. */
SIM_HIDDEN int sim_config_parse(struct sim_err *e, const char *text, struct sim_config *c);
/* Defaults, then SIMGPU_CONFIG if set. */
SIM_HIDDEN int sim_config_load(struct sim_err *e, struct sim_config *c);

/* ---- identity ---------------------------------------------------------------------------- */
SIM_HIDDEN void sim_uuid_bytes(unsigned idx, unsigned char out[16]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (41 bytes with the NUL). */
#define SIM_UUID_STR_LEN 41
SIM_HIDDEN void sim_uuid_string(unsigned idx, char out[SIM_UUID_STR_LEN]);
/* "00000000:1A:00.0" (17 bytes with the NUL). */
#define SIM_PCI_STR_LEN 17
SIM_HIDDEN void sim_pci_bus_id(unsigned idx, char out[SIM_PCI_STR_LEN]);
SIM_HIDDEN unsigned sim_pci_bus(unsigned idx);

/* ---- shared state ----------------------------------------------------------------------
 * One file, mapped MAP_SHARED by every process.  Notation: W writer, R reader,
 * [lock] guarded by st->lock (robust, process-shared), [const] written before the file is
 * published by rename, never again.
 *
 * Invariants (under the lock):
 *   gpu[g].used == sum over slots of slot[i].bytes[g]      (repaired on EOWNERDEAD)
 *   gpu[g].used <= cfg.memory_bytes
 *   ring entries are appended in launch order; entry k lives at ring[k % SIM_RING]
 */
#define SIM_STATE_MAGIC 0x314d495355504753ULL /* "SGPUSIM1" little-endian */
#define SIM_STATE_VERSION 1u
#define SIM_MAX_SLOTS 512
#define SIM_RING 4096

struct sim_busy {          /* one kernel's interval on the engine */
    uint64_t start_ns;     /* CLOCK_MONOTONIC */
    uint64_t end_ns;
    int32_t pid;
    uint32_t reserved;
};

struct sim_gpu {
    uint64_t used;         /* [lock] W charge/uncharge/reap R all: bytes allocated on the card */
    uint64_t free_at;      /* [lock] W launch: the engine is busy until this instant */
    uint64_t ring_count;   /* [lock] W launch: intervals ever recorded */
    uint64_t reserved;
    struct sim_busy ring[SIM_RING]; /* [lock] W launch R NVML utilization */
};

struct sim_slot {          /* one process using the CUDA side; pid == 0 means free */
    int32_t pid;           /* [lock] W owner R reaper/NVML */
    uint32_t ctx_mask;     /* [lock] bit g: the process has a context on GPU g */
    uint64_t start_time;   /* [lock] /proc/<pid>/stat field 22, tells a reused pid apart */
    uint64_t bytes[SIM_MAX_GPUS];   /* [lock] bytes charged on each GPU */
    uint64_t busy_ns[SIM_MAX_GPUS]; /* [lock] kernel time submitted on each GPU */
};

struct sim_state {
    uint64_t magic;        /* [const] SIM_STATE_MAGIC */
    uint32_t version;      /* [const] SIM_STATE_VERSION */
    uint32_t size;         /* [const] sizeof(struct sim_state) */
    struct sim_config cfg; /* [const] */
    uint64_t created_ns;   /* [const] CLOCK_MONOTONIC at creation */
    uint64_t last_reap_ns; /* [lock] last sweep for dead slots */
    uint64_t repairs;      /* [lock] EOWNERDEAD recoveries, for debugging */
    uint64_t reserved[5];
    pthread_mutex_t lock;  /* robust, process-shared */
    char lock_pad[64 - sizeof(pthread_mutex_t) % 64];
    struct sim_gpu gpu[SIM_MAX_GPUS];
    struct sim_slot slot[SIM_MAX_SLOTS];
};

/* Maps (creating if needed) the state; idempotent, thread-safe.  Returns the mapping. */
SIM_HIDDEN int sim_state_open(struct sim_err *e, struct sim_state **out);
/* The mapping if open, else NULL. */
SIM_HIDDEN struct sim_state *sim_state_get(void);
/* Robust lock: on EOWNERDEAD repairs the invariants and marks the mutex consistent. */
SIM_HIDDEN int sim_lock(struct sim_err *e, struct sim_state *st);
SIM_HIDDEN void sim_unlock(struct sim_state *st);

/* ---- slots, memory charge, reaping (slots.c); all take the lock themselves -------------- */
/* This process's slot index, acquiring one if needed. */
SIM_HIDDEN int sim_slot_acquire(struct sim_err *e, struct sim_state *st);
/* Index or -1; after fork the child has none. */
SIM_HIDDEN int sim_slot_self(void);
SIM_HIDDEN void sim_slot_forget(void); /* atfork child */
SIM_HIDDEN void sim_slot_release(struct sim_state *st); /* normal exit */
SIM_HIDDEN int sim_charge(struct sim_err *e, struct sim_state *st, int dev, uint64_t bytes);
SIM_HIDDEN void sim_uncharge(struct sim_state *st, int dev, uint64_t bytes);
SIM_HIDDEN int sim_set_ctx(struct sim_err *e, struct sim_state *st, int dev, int on);
/* Frees the slots of dead processes.  force=0: at most every SIM_REAP_NS.  Call under lock. */
SIM_HIDDEN void sim_reap_locked(struct sim_state *st, int force);
#define SIM_REAP_NS 100000000ull
/* Start time (field 22) of pid from /proc, 0 if unknown.  *zombie set if it is a zombie. */
SIM_HIDDEN uint64_t sim_proc_start_time(int pid, int *gone);
/* Recomputes gpu[].used from the slots (EOWNERDEAD repair).  Call under lock. */
SIM_HIDDEN void sim_repair_locked(struct sim_state *st);

/* ---- execution engine (engine.c) ---------------------------------------------------------
 * One engine per GPU, shared by all processes: kernels run one at a time in submission order.
 * A queue is a process-local stream's bookkeeping (never shared).
 */
#define SIM_QDEPTH 1024 /* pending kernels per stream before a launch blocks */
struct sim_queue {
    uint64_t tail;             /* atomic: end of the last submitted work (CLOCK_MONOTONIC) */
    uint64_t n;                /* [state lock] kernels ever submitted */
    uint64_t ends[SIM_QDEPTH]; /* [state lock] end of kernel k at ends[k % SIM_QDEPTH] */
};
/* Submits count kernels of dur_ns[i] each to GPU dev on queue q (count small, e.g. a graph).
 * Cost: one lock, a clock read and a few stores per kernel; blocks only when q is full. */
SIM_HIDDEN int sim_engine_submit(struct sim_err *e, struct sim_state *st, int dev, int slot,
                                 struct sim_queue *q, const uint64_t *dur_ns, size_t count);
SIM_HIDDEN uint64_t sim_queue_tail(const struct sim_queue *q);
/* Busy ns of GPU dev inside [from,to]; pid 0 = all processes.  Under lock.  *covered_from is
 * the earliest instant the ring still describes (>= from when history was overwritten). */
SIM_HIDDEN uint64_t sim_busy_locked(const struct sim_state *st, int dev, int pid, uint64_t from,
                                    uint64_t to, uint64_t *covered_from);

#endif /* SIMGPU_SIM_H */
