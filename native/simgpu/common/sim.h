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
/* How a synchronising call waits, from its context's scheduling flag (cu.h, cu_wait_how). */
enum sim_wait_how {
    SIM_WAIT_SLEEP, /* CU_CTX_SCHED_BLOCKING_SYNC, and AUTO here: sim_sleep_until */
    SIM_WAIT_SPIN,  /* CU_CTX_SCHED_SPIN: reads the clock until the instant, never sleeps */
    SIM_WAIT_YIELD, /* CU_CTX_SCHED_YIELD: the same, giving the CPU up between reads */
};
SIM_HIDDEN void sim_wait_until(uint64_t t_ns, enum sim_wait_how how);

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
    uint32_t timeslice_us; /* engine time slice (µs) when several contexts have work */
    char name[SIM_NAME_LEN];
    char driver_version[SIM_DRV_LEN];
    /* Device memory a process's first context on a GPU takes (driver state, kernels, local
     * memory), charged to the process's slot like an allocation, freed with its last context
     * there: NVML shows it, a CUDA allocator never sees it.  0 by default (state version 3). */
    uint64_t context_overhead_bytes;
    /* cuMemAllocPitch rounds a row up to this many bytes (a power of two, 32..4096; state
     * version 4). */
    uint32_t pitch_alignment;
    /* Engine time lost when the engine passes from one context straight to another (state
     * version 6; README "Execution"): ctxsw_us when the running one ran out of work, preempt_us
     * when its slice ended with its kernel unfinished (compute preemption: that kernel's state
     * is saved, and restored when it resumes).  Nothing runs meanwhile. */
    uint32_t ctxsw_us;
    uint32_t preempt_us;
    /* 0: no MPS server, contexts time-slice.  N: an MPS server runs (README "MPS"): every
     * client shares one context, so passing between them costs nothing, and the engine serves
     * the client of the highest priority with work first; a lower one's kernel yields at its
     * next block boundary, every N µs of its run.  (Was reserved0, always 0: older states read
     * as "no MPS".) */
    uint32_t mps_block_us;
    /* GPU 0's UUID when uuid0_set (config "uuid0", state version 7): a node whose GPU another
     * API also names (a Vulkan driver's deviceUUID in the layer's tests); else derived. */
    uint32_t uuid0_set;
    unsigned char uuid0[16];
};

#define SIM_TIMESLICE_US_DEFAULT 2000u
#define SIM_TIMESLICE_US_MIN 100u
#define SIM_TIMESLICE_US_MAX 100000u
#define SIM_CTXSW_US_DEFAULT 10u
#define SIM_PREEMPT_US_DEFAULT 50u
#define SIM_SWITCH_US_MAX 10000u
#define SIM_MPS_BLOCK_US_MAX 100000u

SIM_HIDDEN void sim_config_defaults(struct sim_config *c);
/* Parses the flat JSON object in text (keys in native/README.md) over the defaults. */
SIM_HIDDEN int sim_config_parse(struct sim_err *e, const char *text, struct sim_config *c);
/* Defaults, then SIMGPU_CONFIG if set, then SIMGPU_TIMESLICE_US, SIMGPU_CTXSW_US,
 * SIMGPU_MPS_BLOCK_US and SIMGPU_PREEMPT_US if set (ENGINE_ENV in sharegpu/simgpu.py). */
SIM_HIDDEN int sim_config_load(struct sim_err *e, struct sim_config *c);

/* ---- identity ---------------------------------------------------------------------------- */
SIM_HIDDEN void sim_uuid_bytes(const struct sim_config *c, unsigned idx, unsigned char out[16]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (41 bytes with the NUL). */
#define SIM_UUID_STR_LEN 41
SIM_HIDDEN void sim_uuid_string(const struct sim_config *c, unsigned idx, char out[SIM_UUID_STR_LEN]);
/* "00000000:1A:00.0" (17 bytes with the NUL). */
#define SIM_PCI_STR_LEN 17
SIM_HIDDEN void sim_pci_bus_id(unsigned idx, char out[SIM_PCI_STR_LEN]);
SIM_HIDDEN unsigned sim_pci_bus(unsigned idx);

/* ---- shared state ----------------------------------------------------------------------
 * One file, mapped MAP_SHARED by every process.  Notation: W writer, R reader,
 * [lock] guarded by st->lock (robust, process-shared), [const] written before the file is
 * published by rename, never again.  The file is sparse: only the channels in use are touched.
 *
 * Invariants (under the lock), for each GPU g and channel c = gpu[g].chan[c]:
 *   gpu[g].used == sum over slots of slot[i].bytes[g]          (repaired on EOWNERDEAD)
 *   gpu[g].used <= cfg.memory_bytes
 *   c.done <= c.n,  c.n - c.done <= SIM_CHQ,  c.exec_ns <= c.sub_ns
 *   c.active == (c.exec_ns < c.runnable end: sub_ns, or gate_at while c's gate is closed);
 *   kernel k of c is done <=> k < c.done;  a gated channel's kernels from gate_k on are pending
 *   gpu[g].gates == number of channels c with c.gate.seq1 != 0
 *   the active channels form one circular list (next/prev) of length gpu[g].nactive
 *   ring entries are appended in engine-time order; entry k lives at ring[k % SIM_RING]
 * EOWNERDEAD repair rebuilds what a dead holder may have left half-written (engine.c).
 */
#define SIM_STATE_MAGIC 0x314d495355504753ULL /* "SGPUSIM1" little-endian */
#define SIM_STATE_VERSION 10u /* 3: cfg.context_overhead_bytes; 4: slot.proc_dev, cfg.pitch_alignment;
                              * 5: slot.pidns, slot.host_pid; 6: context-switch costs
                              * (cfg.ctxsw_us, cfg.preempt_us, gpu.switch_end); 7: cfg.uuid0;
                              * 8: interprocess events (ipc_event, chan.gate, gpu.gates);
                              * 9: stream memory operations (mem_write, chan.gate_word);
                              * 10: chan.gate_live (a word gate that follows a write) */
#define SIM_MAX_SLOTS 512
#define SIM_RING 16384 /* run segments kept per GPU (NVML history) */
#define SIM_CHQ 4096   /* pending kernels per channel before a launch blocks */
#define SIM_IPC_EVENTS 1024 /* interprocess events exported at once, all processes together */
#define SIM_MEM_WRITES 1024 /* stream memory writes pending at once, all processes together */
#define SIM_GATE_WORD (-2)  /* chan.gate.chan of a gate on a memory word (memop.c) */

struct sim_ticket {        /* "kernel seq1 - 1 of channel chan"; seq1 == 0: nothing */
    uint64_t seq1;
    int32_t chan;
    int32_t reserved;
};

struct sim_busy {          /* one run segment on the engine: one channel ran [start, end) */
    uint64_t start_ns;     /* CLOCK_MONOTONIC */
    uint64_t end_ns;
    int32_t pid;
    uint32_t slot;         /* the channel's slot + 1: pids repeat across pid namespaces (two
                              containers' pid 1), a slot does not while its process lives */
};

/* A memory word as every process names it: the exported memfd's inode and the offset into it,
 * or, for memory never exported, its process's own address (ino 0, owner its slot + 1). */
struct sim_word {
    uint64_t ino;
    uint64_t off;
    int32_t owner;
    uint32_t size;         /* 4 or 8 bytes */
};

/* A channel: the kernels of one process (slot) on one GPU, the unit of time-slicing. */
struct sim_chan {
    uint64_t sub_ns;       /* [lock] W submit: kernel time ever submitted */
    uint64_t exec_ns;      /* [lock] W advance/drop: kernel time ever executed */
    uint64_t n;            /* [lock] W submit: kernels ever submitted (the next one's number) */
    uint64_t done;         /* [lock] W advance/drop: kernels completed (in number order) */
    int32_t next, prev;    /* [lock] active list links, meaningful while active */
    uint32_t active;       /* [lock] 1 while in the active list */
    uint32_t reserved;
    /* [lock] A gate (cuStreamWaitEvent on another process's interprocess event, engine.c):
     * while gate.seq1 != 0 the kernels from number gate_k on (exec_ns from gate_at on) wait
     * until gate, a kernel of another channel on this GPU, completes.  Cleared when it does.
     * A gate on a memory word (cuStreamWaitValue*, memop.c) has gate.chan SIM_GATE_WORD and
     * waits until a write makes gate_word meet (gate_op, gate_value); once a write that meets
     * it is queued behind a kernel, gate is that kernel and gate_live 1: it opens when that
     * kernel completes, or earlier when another write that meets the word lands first. */
    struct sim_ticket gate;
    uint64_t gate_k;
    uint64_t gate_at;
    struct sim_word gate_word;
    uint64_t gate_value;
    uint32_t gate_op;      /* CU_STREAM_WAIT_VALUE_GEQ, EQ, AND or NOR */
    uint32_t gate_live;    /* 1: a word gate following a queued write's kernel (above) */
    /* [lock] kernel k at q[k % SIM_CHQ]: while pending (k >= done) the value exec_ns must reach
     * for it to complete (sub_ns just after it was submitted); once done its completion instant
     * (CLOCK_MONOTONIC).  W submit (pending), advance/drop (done); R waiters, event resolution. */
    uint64_t q[SIM_CHQ];
};

struct sim_gpu {
    uint64_t used;         /* [lock] W charge/uncharge/reap R all: bytes allocated on the card */
    /* The engine (common/engine.c), advanced lazily to "now" by whoever takes the lock. */
    uint64_t clock;        /* [lock] W advance: the engine's history is final up to this instant */
    uint64_t slice_end;    /* [lock] W advance: cur keeps the engine until then if others wait */
    uint64_t seg_start;    /* [lock] W advance: start of cur's open run segment */
    int32_t cur;           /* [lock] W advance: the running channel, valid while nactive > 0 */
    uint32_t nactive;      /* [lock] W submit/advance/drop: channels with pending work */
    uint64_t ring_count;   /* [lock] W advance: run segments ever closed */
    uint64_t switch_end;   /* [lock] W advance: a context switch to cur runs until then (nothing
                            * executes); cur's slice starts when it ends */
    uint64_t switches;     /* [lock] W advance: switches between contexts with work */
    uint64_t preemptions;  /* [lock] W advance: of them, kernels preempted at a slice's end */
    uint32_t gates;        /* [lock] channels with a gate set (chan[c].gate.seq1 != 0) */
    uint32_t gates_pad;
    struct sim_busy ring[SIM_RING];       /* [lock] W advance R NVML utilization */
    struct sim_chan chan[SIM_MAX_SLOTS];  /* [lock] channel i belongs to slot i */
};

struct sim_slot {          /* one process using the CUDA side; pid == 0 means free */
    int32_t pid;           /* [lock] W owner R reaper/NVML */
    uint32_t ctx_mask;     /* [lock] bit g: the process has a context on GPU g */
    uint64_t start_time;   /* [lock] /proc/<pid>/stat field 22, tells a reused pid apart */
    uint64_t proc_dev;     /* [lock] which /proc `pid` is a pid of (slots.c): only a process
                            * looking through the same /proc may judge the owner dead */
    uint64_t pidns;        /* [lock] inode of the owner's pid namespace (/proc/self/ns/pid) */
    int32_t host_pid;      /* [lock] the owner's pid in the initial namespace, once a process
                            * there has resolved it (sim_slots_resolve); 0 until then */
    int32_t mps_priority;  /* [lock] W owner at acquire: CUDA_MPS_CLIENT_PRIORITY (0 normal,
                            * 1 below normal); the engine reads it only under MPS */
    uint64_t bytes[SIM_MAX_GPUS];   /* [lock] bytes charged on each GPU */
    uint64_t busy_ns[SIM_MAX_GPUS]; /* [lock] W advance: engine time its kernels ran on each GPU */
};

/* An event exported with cuIpcGetEventHandle: what every process that opened it sees.  A record
 * in any of them publishes its ticket here; a wait, query or synchronize reads it. */
struct sim_ipc_event {
    uint64_t gen;          /* [lock] W alloc: bumped at each allocation, so a stale handle misses */
    int32_t owner;         /* [lock] W alloc/free: exporter's slot + 1; 0: free */
    int32_t dev;           /* [lock] W record: the GPU of the last record */
    struct sim_ticket last;/* [lock] W record: the kernel the last record follows (0: none) */
};

/* A stream memory write (cuStreamWriteValue*) whose stream still had work: it lands when
 * `after` completes.  Until its writer applies it to the memory, the GPU's view of the word is
 * this entry's value from then on (memop.c). */
struct sim_mem_write {
    struct sim_word word;  /* [lock] W write */
    uint64_t value;        /* [lock] W write */
    uint64_t seq;          /* [lock] W write: state.mem_write_seq at submission (write order) */
    int32_t owner;         /* [lock] W write/apply/drop: writer's slot + 1; 0: free */
    int32_t dev;           /* [lock] W write: the GPU of `after` */
    struct sim_ticket after; /* [lock] W write: the kernel the write follows on its stream */
};

struct sim_state {
    uint64_t magic;        /* [const] SIM_STATE_MAGIC */
    uint32_t version;      /* [const] SIM_STATE_VERSION */
    uint32_t size;         /* [const] sizeof(struct sim_state) */
    struct sim_config cfg; /* [const] */
    uint64_t created_ns;   /* [const] CLOCK_MONOTONIC at creation */
    uint64_t last_reap_ns; /* [lock] last sweep for dead slots */
    uint64_t repairs;      /* [lock] EOWNERDEAD recoveries, for debugging */
    uint64_t mem_write_seq; /* [lock] stream memory writes ever queued (memop.c) */
    uint64_t reserved[4];
    pthread_mutex_t lock;  /* robust, process-shared */
    char lock_pad[64 - sizeof(pthread_mutex_t) % 64];
    struct sim_gpu gpu[SIM_MAX_GPUS];
    struct sim_slot slot[SIM_MAX_SLOTS];
    struct sim_ipc_event ipc_event[SIM_IPC_EVENTS];
    struct sim_mem_write mem_write[SIM_MEM_WRITES];
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
/* The launch path's variant: no system call when the slot is known (a forked child forgets its
 * parent's slot in libcuda's atfork handler, so the pid is not re-checked); -1 on error. */
SIM_HIDDEN int sim_slot_acquire_fast(struct sim_err *e, struct sim_state *st);
/* Under lock: slot s is still this process's (not reaped by someone who judged it dead). */
SIM_HIDDEN int sim_slot_mine_locked(const struct sim_state *st, int s);
/* Index or -1; after fork the child has none. */
SIM_HIDDEN int sim_slot_self(void);
/* The launch path's entry: this process's slot (acquired if needed), returned with the state
 * lock held; a slot reaped meanwhile by someone who judged us dead is replaced.  -1 on error
 * (no lock held). */
SIM_HIDDEN int sim_lock_own_slot(struct sim_err *e, struct sim_state *st);
SIM_HIDDEN void sim_slot_forget(void); /* atfork child */
SIM_HIDDEN void sim_slot_release(struct sim_state *st); /* normal exit */
SIM_HIDDEN int sim_charge(struct sim_err *e, struct sim_state *st, int dev, uint64_t bytes);
SIM_HIDDEN void sim_uncharge(struct sim_state *st, int dev, uint64_t bytes);
SIM_HIDDEN int sim_set_ctx(struct sim_err *e, struct sim_state *st, int dev, int on);
/* Frees the slots of dead processes, unless a sweep ran less than max_age_ns ago (0: always).
 * Call WITHOUT the lock: it judges each owner by its /proc entry outside the lock (a read costs
 * up to a few hundred µs on a VM, and under the lock it stalled every other process's launches
 * as long) and frees, under the lock, the slots whose owner was dead and is unchanged.
 * Returns the number freed, or -1 (e set) when the lock cannot be taken. */
SIM_HIDDEN int sim_reap(struct sim_err *e, struct sim_state *st, uint64_t max_age_ns);
#define SIM_REAP_NS 100000000ull
/* NVML queries see exits within this (a driver drops an exited process at once; reaping at every
 * query read /proc for every slot, milliseconds per query). */
#define SIM_NVML_REAP_NS 10000000ull
/* This process's pid as its /proc sees it, and which /proc that is (slots.c). */
SIM_HIDDEN int sim_proc_pid(void);
SIM_HIDDEN uint64_t sim_proc_dev(void);
/* A driver knows every process by its pid in the initial pid namespace, whichever namespace
 * it runs in; the model learns that pid for slots written from other namespaces (containers).
 * sim_host_view: this process sees every process (initial namespace, its own /proc).
 * sim_slots_resolve: for a process with the host view, resolve (or, when their process is gone,
 * free) the slots of other namespaces; takes and drops the lock, scans /proc outside it.
 * sim_slot_pid: the pid the caller's NVML reports for a slot. */
SIM_HIDDEN int sim_host_view(void);
SIM_HIDDEN int sim_slots_resolve(struct sim_err *e, struct sim_state *st);
SIM_HIDDEN unsigned sim_slot_pid(const struct sim_slot *s);
/* Start time (field 22) of pid from /proc, 0 if unknown.  *zombie set if it is a zombie. */
SIM_HIDDEN uint64_t sim_proc_start_time(int pid, int *gone);
/* Recomputes gpu[].used from the slots (EOWNERDEAD repair).  Call under lock. */
SIM_HIDDEN void sim_repair_locked(struct sim_state *st);

/* ---- execution engine (engine.c) ---------------------------------------------------------
 * One engine per GPU, shared by all processes, time-slicing channels (one per process and GPU)
 * round-robin; the model is described at the top of engine.c.  The types below are
 * process-local bookkeeping (never in the shared state), guarded by the state lock.
 */
#define SIM_QDEPTH 1024 /* pending kernels per stream before a launch blocks */

struct sim_queue {         /* one stream */
    struct sim_ticket last;    /* [state lock] its last submitted kernel */
    uint64_t n;                /* [state lock] kernels ever submitted on the stream */
    uint64_t seqs[SIM_QDEPTH]; /* [state lock] channel number of stream kernel k at [k % QDEPTH] */
};

struct sim_watch {         /* one event: the completion instant of a ticket */
    uint64_t at;           /* atomic (release/acquire): the instant once resolved, else 0 */
    struct sim_ticket t;   /* [state lock] the awaited kernel while linked */
    int32_t dev;           /* [state lock] */
    int32_t linked;        /* [state lock] 1 while waiting in this process's list for dev */
    struct sim_watch *next, *prev; /* [state lock] that list, in ticket order */
};

/* Submits count kernels of dur_ns[i] each (count small, e.g. a graph) on GPU dev from stream q;
 * *ctx_last (optional) is set to the last one.  Cost: one lock, a clock read and a few stores
 * per kernel; blocks only when q (SIM_QDEPTH) or the channel (SIM_CHQ) is full. */
SIM_HIDDEN int sim_engine_submit(struct sim_err *e, struct sim_state *st, int dev,
                                 struct sim_queue *q, struct sim_ticket *ctx_last,
                                 const uint64_t *dur_ns, size_t count);
/* Waits (as `how` says) until the kernel *t names (read under the lock when called) has
 * completed. */
SIM_HIDDEN int sim_engine_wait(struct sim_err *e, struct sim_state *st, int dev,
                               const struct sim_ticket *t, enum sim_wait_how how);
/* 1 when that kernel has completed, 0 if not yet, -1 on error. */
SIM_HIDDEN int sim_engine_query(struct sim_err *e, struct sim_state *st, int dev,
                                const struct sim_ticket *t);
/* Events: w completes with the last kernel submitted on q so far (now if q is idle). */
SIM_HIDDEN int sim_engine_record(struct sim_err *e, struct sim_state *st, int dev,
                                 const struct sim_queue *q, struct sim_watch *w);
/* 1 when w is resolved (w->at set) or was never recorded, 0 if pending; wait=1 waits (how). */
SIM_HIDDEN int sim_engine_watch(struct sim_err *e, struct sim_state *st, struct sim_watch *w,
                                int wait, enum sim_wait_how how);
SIM_HIDDEN void sim_engine_unwatch(struct sim_state *st, struct sim_watch *w);
SIM_HIDDEN void sim_engine_fork_child(void); /* the parent's pending events are not ours */
/* The calling process's later work on GPU dev waits, on the GPU, until kernel *on completes (a
 * kernel of another process: cuStreamWaitEvent on an interprocess event).  Work already queued
 * is not held.  A second gate on another channel while the first is closed waits on the host.
 * 1: a gate is closed (the caller then queues a 0 µs marker behind it on the waiting stream,
 * which its later records, queries and syncs follow); 0: nothing to wait for; -1: error. */
SIM_HIDDEN int sim_engine_gate(struct sim_err *e, struct sim_state *st, int dev,
                               const struct sim_ticket *on);

/* ---- interprocess events (ipcevent.c); all take the lock themselves -------------------- */
/* A new entry owned by this process: *index and *gen name it in a handle. */
SIM_HIDDEN int sim_ipc_event_alloc(struct sim_err *e, struct sim_state *st, uint32_t *index,
                                   uint64_t *gen);
/* The exporter's cuEventDestroy (only the process that allocated the entry frees it). */
SIM_HIDDEN void sim_ipc_event_free(struct sim_state *st, uint32_t index, uint64_t gen);
/* 1 when (index, gen) names a live entry (an open may proceed), 0 if not, -1 on error. */
SIM_HIDDEN int sim_ipc_event_live(struct sim_err *e, struct sim_state *st, uint32_t index,
                                  uint64_t gen);
/* A record of the event on GPU dev after kernel *t (a done ticket: nothing to wait for). */
SIM_HIDDEN int sim_ipc_event_publish(struct sim_err *e, struct sim_state *st, uint32_t index,
                                     uint64_t gen, int dev, const struct sim_ticket *t);
/* Its last record: *dev and *t (t->seq1 0 when never recorded, freed, or nothing pending). */
SIM_HIDDEN int sim_ipc_event_read(struct sim_err *e, struct sim_state *st, uint32_t index,
                                  uint64_t gen, int *dev, struct sim_ticket *t);
/* Under lock: frees slot s's entries (its process is gone). */
SIM_HIDDEN void sim_ipc_event_drop_locked(struct sim_state *st, int s);
/* ---- engine internals for the gates of stream memory operations (memop.c); under lock --- */
/* 1 when kernel *t of GPU dev has completed (a ticket of nothing has). */
SIM_HIDDEN int sim_engine_done_locked(const struct sim_state *st, int dev, const struct sim_ticket *t);
/* Channel c's later work waits for kernel *on (sim_engine_gate's rule): 1 gated, 0 nothing to
 * wait for, -2 the channel already has a gate (the caller waits on the host). */
SIM_HIDDEN int sim_engine_gate_locked(struct sim_state *st, int dev, int c, const struct sim_ticket *on);
/* Channel c's later work waits until a write makes *w meet (op, value): 1 gated, 0 nothing to
 * wait for, -2 the channel already has a gate.  With `follow` (a kernel of this GPU behind which
 * a write that meets it is queued), the gate opens when that kernel completes, or when another
 * write that meets the word lands first. */
SIM_HIDDEN int sim_engine_gate_word_locked(struct sim_state *st, int dev, int c,
                                           const struct sim_word *w, uint32_t op, uint64_t value,
                                           const struct sim_ticket *follow);
/* A write of `value` to *w follows kernel *after on GPU wdev (a done ticket: it has landed):
 * the word gates it meets open, or on wdev wait for `after` instead. */
SIM_HIDDEN void sim_engine_word_written_locked(struct sim_state *st, int wdev,
                                               const struct sim_ticket *after,
                                               const struct sim_word *w, uint64_t value);
/* 1 when `cur` meets a wait's condition (op, value) on a word of `size` bytes (memop.c). */
SIM_HIDDEN int sim_word_met(uint64_t cur, uint32_t op, uint64_t value, uint32_t size);
/* Whether two names are of one word (memop.c). */
SIM_HIDDEN int sim_same_word(const struct sim_word *a, const struct sim_word *b);
/* How often a waiter behind a word nobody has met looks again: nothing predicts when the word
 * will be written (from the host, or by a write queued later). */
#define SIM_WORD_POLL_NS 50000ull

/* ---- stream memory operations (memop.c); all take the lock themselves ------------------- */
/* cuStreamWaitValue*: the calling process's later work on GPU dev waits until *w meets (op,
 * value); `mem` is where this process sees the word.  1: a gate is closed (the caller queues a
 * 0 µs marker behind it, as for sim_engine_gate); 0: met already (after a wait on the host when
 * the write that meets it is another GPU's, or the channel had a gate); -1: error. */
SIM_HIDDEN int sim_mem_wait(struct sim_err *e, struct sim_state *st, int dev,
                            const struct sim_word *w, const void *mem, uint32_t op, uint64_t value);
/* cuStreamWriteValue*: writes `value` to *w (at `mem` in this process) after kernel *after of
 * GPU dev.  0: written now; k > 0: pending as entry k - 1 with *seq, which this process
 * applies with sim_mem_apply once `after` completes; -1: error. */
SIM_HIDDEN int sim_mem_write(struct sim_err *e, struct sim_state *st, int dev,
                             const struct sim_word *w, void *mem, uint64_t value,
                             const struct sim_ticket *after, uint64_t *seq);
/* Applies pending entry `index` (sim_mem_write's k - 1, with seq) at `mem` if its kernel has
 * completed: 1 applied or gone, 0 still pending, -1 error. */
SIM_HIDDEN int sim_mem_apply(struct sim_err *e, struct sim_state *st, int index, uint64_t seq,
                             void *mem);
/* Under lock: frees slot s's pending writes (its process is gone: they never land). */
SIM_HIDDEN void sim_mem_write_drop_locked(struct sim_state *st, int s);
/* Under lock: commits GPU dev's engine up to t (no-op for t <= clock). */
SIM_HIDDEN void sim_engine_advance_locked(struct sim_state *st, int dev, uint64_t t);
/* Under lock: drops slot s's pending work on every GPU (its process is gone). */
SIM_HIDDEN void sim_engine_drop_locked(struct sim_state *st, int s);
/* Under lock, on EOWNERDEAD: rebuilds every engine from the channels (see engine.c). */
SIM_HIDDEN void sim_engine_repair_locked(struct sim_state *st);
/* Busy ns of GPU dev inside [from,to] of the process in slot `slot` (-1: all processes).  Under lock, after advancing to
 * `to`.  *covered_from is the earliest instant the ring still describes (>= from when history
 * was overwritten). */
SIM_HIDDEN uint64_t sim_busy_locked(const struct sim_state *st, int dev, int slot, uint64_t from,
                                    uint64_t to, uint64_t *covered_from);

#endif /* SIMGPU_SIM_H */
