/*
 * libsharegpu.so internals.  Nothing here is exported: the build uses -fvisibility=hidden and
 * exports.map lists exactly the hooks of hooks.def plus dlsym.
 *
 * Error contract (one for the whole shim): internal functions return 0 or a negative
 * enum sg_errc and fill a struct sg_err; only an exported hook turns that into a CUresult
 * (sg_cu_result) or an nvmlReturn_t (sg_nvml_result).  The shim never exits, aborts or
 * dereferences a pointer it has not checked, and writes at most a few stderr lines, all
 * starting with "sharegpu: ".
 */
#ifndef SHAREGPU_SHIM_H
#define SHAREGPU_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "sharegpu/abi.h"
#include "sharegpu/cuda_api.h"
#include "sharegpu/nvml_api.h"

#define SG_EXPORT __attribute__((visibility("default")))
#define SG_PREFIX "sharegpu: "
/* The MPS client priority the driver reads at cuInit: an offline tenant's processes get 1
 * (BELOW_NORMAL) from the shim (config.c). */
#define SG_MPS_PRIORITY_ENV "CUDA_MPS_CLIENT_PRIORITY"

/* ---- prototypes the public headers do not carry ---------------------------------------- */

/* Deprecated launches (parameters set beforehand with cuParamSet*); still exported by drivers. */
CUresult cuLaunch(CUfunction f);
CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height);
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream);

/* Legacy 32-bit entry points (CUDA < 3.2; still exported by the driver). */
typedef unsigned int CUdeviceptr_v1;
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int widthInBytes,
                         unsigned int height, unsigned int elementSizeBytes);
CUresult cuArrayCreate(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);

/* The CUDA 2.0 context creation (cudaTypedefs.h PFN_cuCtxCreate_v2000), still exported. */
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);

/* The CUDA 10/11 instantiation (cudaTypedefs.h PFN_cuGraphInstantiate_v10000 and _v11000). */
CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,
                            char *logBuffer, size_t bufferSize);

/* Everything below is internal: hidden even where only declared, so references bind locally
 * (no GOT indirection, and the TLS flag gets the initial-exec model without a GOT load). */
#pragma GCC visibility push(hidden)

/* ---- the hook list --------------------------------------------------------------------- */

enum sg_lib { SG_LIB_CU, SG_LIB_NVML };

enum sg_hook_id {
#define SG_HOOK(lib, name) SG_H_##name,
#include "hooks.def"
#undef SG_HOOK
    SG_H_COUNT
};

/* The real functions, hooks and helpers alike, resolved one by one on first use: a process
 * reaches a handful of the hundred entry points it could (cuInit, a context, cuMemGetInfo at
 * start-up), and a dlsym costs ~0.5 us, most of it the first touch of the driver's symbol
 * table.  SG_REAL(name) is the typed real `name` (the compiler checks every forwarded call),
 * NULL where the library or the symbol is missing; every caller checks it. */
enum sg_real_id {
#define SG_HOOK(lib, name) SG_R_##name,
#define SG_HELPER(lib, name) SG_R_##name,
#include "hooks.def"
#undef SG_HOOK
#undef SG_HELPER
    SG_R_COUNT
};

extern void *sg_real_ptr[SG_R_COUNT];           /* [atomic relaxed] once sg_real_done is set */
extern unsigned char sg_real_done[SG_R_COUNT];  /* [atomic acquire/release] looked up */
void *sg_real_lookup(enum sg_real_id id);       /* the slow side: dlopen (once), dlsym */

static inline void *sg_real_get(enum sg_real_id id)
{
    if (__builtin_expect(__atomic_load_n(&sg_real_done[id], __ATOMIC_ACQUIRE), 1))
        return __atomic_load_n(&sg_real_ptr[id], __ATOMIC_RELAXED);
    return sg_real_lookup(id);
}

#define SG_REAL(name) ((__typeof__(&name))sg_real_get(SG_R_##name))

extern const char *const sg_hook_names[SG_H_COUNT];
extern const unsigned char sg_hook_lib[SG_H_COUNT];

/* Resolve every real function of libcuda (cuGetProcAddress must name any pointer the driver
 * returns: proc_resolve compares it with all of them). */
void sg_real_cu_all(void);

/* The address of our hook for id. */
void *sg_hook_addr(enum sg_hook_id id);
/* Hook id for an exact exported name, or -1. */
int sg_hook_find(const char *name);
/* Dynamic symbol tables (elfsym.c).  sg_libc_sym: glibc's function `name` at exactly `version`,
 * from the objects after the shim.  sg_elf_sym: the function `name` that the object with that
 * .dynamic and load address defines itself, at `version` or (NULL) its default one; NULL if none. */
void *sg_libc_sym(const char *name, const char *version);
void *sg_elf_sym(const void *dynamic, uintptr_t base, const char *name, const char *version);
/* Length of the base of an entry-point name: without a trailing _ptsz/_ptds and then without a
 * trailing _v<digits> ("cuMemAllocAsync_ptsz" -> "cuMemAllocAsync", "cuMemAlloc_v2" ->
 * "cuMemAlloc"). */
size_t sg_base_len(const char *name);

/* ---- cuGetProcAddress fallback table (proctable.c) ------------------------------------- */

#define SG_PROC_NONE (-1) /* a hooked base with no variant for this version: refuse */
#define SG_PROC_PASS (-2) /* a variant we do not need to hook: return the driver's pointer */
#define SG_PROC_UNHOOKED (-3) /* not a base we hook: return the driver's pointer */
/* Which hook (enum sg_hook_id), or SG_PROC_*, the public CUDA versioning assigns to `symbol`
 * (a base name, as cuGetProcAddress takes it) for cudaVersion and flags. */
int sg_proc_table_lookup(const char *symbol, int cuda_version, cuuint64_t flags);

/* ---- errors ----------------------------------------------------------------------------- */

enum sg_errc {
    SG_OK = 0,
    SG_E_CONFIG = -1,  /* broken configuration: fail closed */
    SG_E_OVERCAP = -2, /* the allocation does not fit under the cap */
    SG_E_NOSLOT = -3,  /* no free process slot in the usage region */
    SG_E_NOMEM = -4,   /* the shim could not allocate its own bookkeeping */
    SG_E_INVAL = -5,   /* invalid argument (NULL output pointer, size overflow) */
    SG_E_NOTFOUND = -6, /* the real function is missing */
    SG_E_BUSY = -7      /* a lock stayed held past its bound (its holder is stopped) */
};

struct sg_err {
    int code;
    char msg[256];
};

/* `name()` runs fn once, as pthread_once does; once it has run, a call costs one acquire load
 * instead of a call into libc (the hooks ask on every call). */
#define SG_FAST_ONCE(name, fn)                                                                     \
    static pthread_once_t name##_once_ = PTHREAD_ONCE_INIT;                                        \
    static int name##_done_; /* [atomic acquire/release] */                                        \
    static void name##_run_(void)                                                                  \
    {                                                                                              \
        fn();                                                                                      \
        __atomic_store_n(&name##_done_, 1, __ATOMIC_RELEASE);                                      \
    }                                                                                              \
    static inline void name(void)                                                                  \
    {                                                                                              \
        if (!__atomic_load_n(&name##_done_, __ATOMIC_ACQUIRE))                                     \
            pthread_once(&name##_once_, name##_run_);                                              \
    }

/* An empty error without zeroing its whole buffer: hot paths make one per call. */
static inline void sg_err_clear(struct sg_err *e)
{
    e->code = 0;
    e->msg[0] = '\0';
}
int sg_fail(struct sg_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
CUresult sg_cu_result(int code);
nvmlReturn_t sg_nvml_result(int code);

/* Print one "sharegpu: ..." line at most once per process for `once` (a static flag). */
void sg_log_once(int *once, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- configuration (config.c) ----------------------------------------------------------- */

enum sg_mode { SG_MODE_INERT = 0, SG_MODE_ACTIVE = 1, SG_MODE_BROKEN = 2 };

/* Whether a tenant directory is configured at all (cheap: a stat and a getenv, done once; no
 * file is opened).  INERT means pure pass-through. */
bool sg_configured(void);
/* Open and validate the tenant's limits and usage (once).  ACTIVE or BROKEN when configured,
 * INERT otherwise.  On BROKEN, the one stderr line has been printed. */
enum sg_mode sg_mode(void);
/* Turn an ACTIVE shim BROKEN after a resize made the limits invalid (prints the line once). */
void sg_break(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The mapped regions (valid when sg_mode() != INERT and the files opened). */
extern const struct sg_limits *sg_limits_map;
extern struct sg_usage *sg_usage_map;
extern char sg_tenant_dir[];

/* Process-local copy of the limits, refreshed with the seqlock protocol; guarded by the usage
 * mutex (read and written only while holding it). */
struct sg_limits_copy {
    uint64_t generation;
    uint32_t device_count;
    struct sg_limits_device devices[SG_MAX_DEVICES];
};
extern struct sg_limits_copy sg_lim;
/* Refresh sg_lim if the generation moved (one acquire load when it did not).  Caller holds the
 * usage mutex. */
int sg_limits_refresh_locked(struct sg_err *e);
/* Seqlock read of a limits region into out, validated. */
int sg_limits_read(const struct sg_limits *l, struct sg_limits_copy *out, struct sg_err *e);

/* ---- ledger (ledger.c) ------------------------------------------------------------------ */

enum sg_kind {
    SG_KIND_NONE = 0,
    SG_KIND_PTR = 1,
    SG_KIND_VMM = 2,
    SG_KIND_ARRAY = 3,
    SG_KIND_MIPMAP = 4,
    SG_KIND_LIMIT = 5, /* a context limit's reservation (hooks_limits.c), credited with the context */
    SG_KIND_MODULE = 6, /* a loaded module's globals (hooks_module.c), credited with the context */
    SG_KIND_IPC = 7,    /* an opened IPC handle (hooks_ipc.c), credited at close or with the context */
    SG_KIND_VK = 8,     /* a Vulkan device memory object (layer_api.c), credited at its free or its device's end */
};

/* A reservation made by sg_reserve: which limits index and how many bytes. */
struct sg_charge {
    bool active; /* false: inert, nothing charged */
    int idx;
    uint64_t bytes;
    CUcontext ctx; /* the context whose teardown frees it; NULL: none (VMM, arrays) */
};

/* The limits index of the current context's device (via cuCtxGetDevice), of a device ordinal,
 * or of a 16-byte UUID; -1 when the device is not one of the tenant's (cap 0) or unknown.
 * The ordinal and current-context forms call the driver outside the usage lock. */
int sg_ordinal_uuid(CUdevice dev, uint8_t uuid[16]);
int sg_current_ordinal(CUdevice *dev);
/* The current context and its device (cached per thread); ctx NULL when there is none. */
int sg_current_place(CUcontext *ctx, CUdevice *dev);
/* devof.c: the device of a stream's work, of a pool's memory (else its stream's device). */
int sg_stream_ordinal(CUstream s, CUdevice *dev);
CUcontext sg_stream_ctx(CUstream s); /* NULL when unknown */
/* Room for n + 1 elements of `elem` bytes in *arr (capacity *cap, doubled as needed): 0, or -1
 * when memory ran out (the array is unchanged). */
int sg_grow(void **arr, size_t *cap, size_t n, size_t elem);
int sg_pool_ordinal(CUmemoryPool pool, CUstream s, CUdevice *dev);
void sg_pool_seen(CUmemoryPool pool, CUdevice dev);
/* The allocation protocol of hooks_cuda.c, shared with hooks_array.c: reserve on a device (the
 * current context's when !have_dev), then record the allocation or give the reservation back;
 * a free credits after the real free succeeded, or restores the entry if it failed. */
CUresult sg_alloc_begin(bool have_dev, CUdevice dev, uint64_t bytes, struct sg_charge *c);
CUresult sg_alloc_end(CUresult res, enum sg_kind kind, uint64_t key, struct sg_charge *c);
CUresult sg_free_end(CUresult res, bool tracked, enum sg_kind kind, uint64_t key,
                     const struct sg_charge *c);
uint64_t sg_format_bytes(CUarray_format f); /* bytes per channel of an array element */

/* graphmem.c: a device's graph memory pool is charged as the driver counts it; a launch or
 * upload of an executable with allocation nodes is admitted first (begin), then settled (end).
 * begin may hold the file's lock until end. */
struct sg_graph_mem {
    bool held;
    CUgraphExec exec;
};
CUresult sg_graph_mem_begin(CUgraphExec exec, struct sg_graph_mem *gm);
void sg_graph_mem_end(struct sg_graph_mem *gm);
void sg_graph_mem_settle_all(void); /* after a trim or a context's teardown */
/* Whether a stream-ordered call on stream is recorded into a graph instead of run. */
bool sg_stream_capturing(CUstream stream, bool per_thread);

/* asyncfree.c: a stream-ordered free's charge is credited once its stream has reached it. */
void sg_async_free_queue(CUstream stream, bool per_thread, const struct sg_charge *c);
void sg_async_free_settle(void);

/* vmmlife.c: a VMM allocation's charge lasts until its last handle is released and its last
 * mapping unmapped (cuMemMap, cuMemUnmap and cuMemRetainAllocationHandle are its hooks; a map of
 * a handle that names no charged allocation is charged there).  created: a new charged handle;
 * exported/imported: a POSIX descriptor of it left or came back (an import of our own live
 * export is a second handle of the same allocation);
 * release: handle released after the real call succeeded, c its charge if it was the charged
 * one (else NULL); true when the caller must credit c now (nothing else keeps the memory). */
void sg_vmm_created(CUmemGenericAllocationHandle handle);
void sg_vmm_exported(CUmemGenericAllocationHandle handle, int fd);
void sg_vmm_imported(CUmemGenericAllocationHandle handle, int fd);
bool sg_vmm_release(CUmemGenericAllocationHandle handle, const struct sg_charge *c);

/* Reserve bytes on device ordinal `dev` (or uuid when dev < 0 and uuid != NULL) against the
 * cap, atomically across the tenant's processes.  Inert: returns 0 with c->active = false. */
int sg_reserve(CUdevice dev, uint64_t bytes, struct sg_charge *c, struct sg_err *e);
/* The same by the device's 16-byte UUID, for callers that know no CUDA ordinal (layer_api.c). */
int sg_reserve_uuid(const uint8_t uuid[16], uint64_t bytes, struct sg_charge *c, struct sg_err *e);
/* Give back a reservation whose real allocation failed. */
void sg_unreserve(const struct sg_charge *c);
/* Grow (checked against the cap) or shrink a reservation to new_bytes. */
int sg_adjust(struct sg_charge *c, uint64_t new_bytes, struct sg_err *e);
/* Record a successful allocation under (kind, key).  On failure (no memory for the table) the
 * caller frees the real allocation and unreserves. */
int sg_track(enum sg_kind kind, uint64_t key, const struct sg_charge *c, struct sg_err *e);
/* The context ctx was destroyed: credit every allocation the driver freed with it. */
void sg_credit_context(CUcontext ctx);
/* Remove (kind, key) from the table before the real free; returns true if it was tracked. */
bool sg_untrack(enum sg_kind kind, uint64_t key, struct sg_charge *out);
/* Put an entry back after the real free failed. */
void sg_retrack(enum sg_kind kind, uint64_t key, const struct sg_charge *c);
/* Whether the ledger holds a charge for (kind, key). */
bool sg_tracked(enum sg_kind kind, uint64_t key);
/* Credit the bytes of an entry whose real free succeeded. */
void sg_credit(const struct sg_charge *c);
/* The allocation table across fork (alloctable.c): held over the fork, so that the child's copy
 * is whole; the child's (or a raw clone child's) forgets the parent's entries and lock. */
void sg_alloc_table_lock(void);
void sg_alloc_table_unlock(void);
void sg_alloc_table_forget(void);

/* Context memory (hooks_ctx.c): a new context's measured memory is admitted into the device's
 * overhead_bytes at once (used + overhead + bytes <= cap, else SG_E_OVERCAP), *idx_out = the
 * limits index, -1 when the device is not the tenant's (nothing counted); credited when the
 * context ends.  Lock order: hooks_ctx.c's context lock before the usage mutex. */
int sg_ctx_admit(CUdevice dev, uint64_t bytes, int *idx_out, struct sg_err *e);
void sg_ctx_credit(int idx, uint64_t bytes);
/* Empty the process's table of context estimates; out[idx] = the bytes it held per index. */
void sg_ctx_forget_all(uint64_t out[SG_MAX_DEVICES]);
void sg_ctx_fork_child(void); /* a child holds none of its parent's contexts */

/* Views: cap, tenant usage (used + overhead) of limits index idx; -1 idx gives zeros. */
struct sg_view {
    uint64_t cap;
    uint64_t used; /* ledger bytes + agent-measured overhead */
};
int sg_view_device(CUdevice dev, const uint8_t *uuid, struct sg_view *v, struct sg_err *e);

/* Live processes of the tenant holding memory on the device given by uuid. */
struct sg_proc_info {
    int32_t pid;
    uint64_t bytes;
};
int sg_list_procs(const uint8_t uuid[16], struct sg_proc_info *out, unsigned cap, unsigned *n,
                  struct sg_err *e);

/* Register fork handlers and the exit hook (called once, from sg_mode). */
void sg_ledger_setup(void);

/* Liveness and identity (pid + start time, never pid alone), shared with the arbiter. */
/* Process identity and liveness across pid namespaces (live.c). */
struct sg_identity {
    uint64_t pidns;     /* inode of /proc/self/ns/pid; 0 unknown */
    int32_t pid;        /* getpid(): the pid in our own namespace */
    uint64_t start;     /* start time, ticks after boot */
    bool proc_is_ours;  /* /proc is our namespace's: pids of our namespace can be judged */
};
int sg_read_stat(int32_t pid, char *state, uint64_t *start);
void sg_identity_read(struct sg_identity *id);
bool sg_identity_is(const struct sg_identity *self, uint64_t pidns, int32_t pid, uint64_t start);
int sg_live_open(const char *path);
bool sg_live_hold(int fd, uint32_t index);
void sg_live_drop(int fd, uint32_t index);
bool sg_entry_alive(int fd, uint32_t index, uint32_t flags, uint64_t pidns, int32_t pid,
                    uint64_t start, const struct sg_identity *self);
/* This process's slot in the usage region (claimed if needed), or -1. */
int sg_usage_slot(void);

/* ---- compute arbitration (arbiter.c) ------------------------------------------------------ */

/* Process-local state of one arbitrated GPU (one per limits index).  The launch fast path reads
 * only the atomics at the top; everything else is guarded by `mu`, which serialises this
 * process's slow path, its releases and its watcher thread for the GPU. */
enum sg_gpu_state { SG_GPU_UNSET = 0, SG_GPU_NATIVE = 1, SG_GPU_ARB = 2 };
#define SG_MAX_EXT_DRAINS 16 /* Vulkan devices of one process on one GPU, drained at a release */
/* The streams a hold launched to, which say what a sync covers: a context's sync covers them
 * all; the sync of SG_HOLD_ONE's stream covers it; an event on the legacy stream follows all
 * the work of the blocking streams (the legacy and per-thread default streams), SG_HOLD_DEFAULT. */
enum sg_hold_streams { SG_HOLD_NONE, SG_HOLD_ONE, SG_HOLD_DEFAULT, SG_HOLD_MIXED };
/* The GPU-side clock of a hold's bursts (burstclock.c): events of one context. */
struct sg_burst_clock {
    CUcontext ctx;     /* the context the events and the stream belong to; NULL: none */
    CUevent ref, end;
    CUevent start;     /* a queued hold's gate opened (handoff.c): recorded after its wait */
    bool start_set;    /* `start` recorded in this hold, not yet read */
    CUstream stream;   /* private, non-blocking: `ref` completes as soon as it is recorded */
    uint32_t epoch;    /* sg_stream_epoch when made */
    uint32_t end_seq;  /* bumped by each record of `end` (and at each hold's start) */
    uint32_t end_read_seq; /* the record of `end` last read complete (0: none), and what it */
    uint64_t end_read_ns;  /* read: a sync's return reads it once for an offer, once to mark */
    uint64_t ref_host; /* CLOCK_MONOTONIC when `ref` was recorded */
    bool ref_ok;       /* `ref` recorded in this hold */
};
/* Queued hand-overs (handoff.c, arbqueue.c; ABI 1.12).  All [mu]. */
#define SG_HO_GATED_STREAMS 8
struct sg_handoff {
    /* The region's records, page-locked once (cuMemHostRegister) for the GPU to reach. */
    const struct sg_arbiter *words_for; /* the region they were registered for; NULL: not yet */
    bool words_ok;            /* registered: our streams can write and wait for done words */
    CUdeviceptr words_dev;    /* the device's address of the records */
    uint32_t seq;             /* our last offer's seq (the next one is seq + 1, never 0) */
    /* As the holder that offers the token at a covering sync. */
    bool contended;           /* our last grant came after a wait (or a take): offer at syncs */
    bool several;             /* [atomic relaxed] our last burst (the launches between two syncs
                                 of the program's) had several kernels (SG_ARB_HO_SEVERAL) */
    bool tail_known;          /* tail_ns was measured */
    uint64_t tail_ns;         /* our work at our last covering sync, from its begin to its end:
                                 what a hand-over queued there leaves uncharged until it ends */
    uint32_t offered;         /* our record's seq offered at a covering sync; 0: none */
    uint64_t offer_at;        /* when: our charge was closed then */
    uint32_t offer_end_seq;   /* that sync's burst clock end event */
    /* As the next holder: this hold's work waits on the GPU for the last holder's word. */
    bool gate;                /* this hold has a gate (taken from our record at the grant) */
    bool waiting;             /* a stream of ours waits for it */
    bool open;                /* it is open: the word is up (or we wrote it ourselves) */
    uint32_t behind;          /* 1 + the client whose done word it is */
    uint32_t behind_seq;      /* the seq it must reach */
    uint64_t gate_at;         /* when our first stream began to wait (the bound runs from it) */
    uint64_t wait_from;       /* the gate's wait not yet left out of our charge runs from here */
    CUcontext opener_ctx;     /* an idle stream of ours to write a word from (the bound) */
    CUstream opener;
    uint32_t opener_epoch;
    int ngated;
    struct {
        CUcontext ctx;
        CUstream s;
        pid_t tid;            /* the per-thread default stream's thread; 0 otherwise */
    } gated[SG_HO_GATED_STREAMS]; /* streams that wait for the word in this hold */
};

struct sg_gpu {
    uint64_t token;      /* [atomic relaxed] the token word this process holds; 0: none */
    uint64_t qend;       /* [atomic relaxed] end of our quantum (CLOCK_MONOTONIC) */
    uint64_t launch_by;  /* [atomic relaxed] offline: the last instant our next launch may start
                            without meeting the predicted online request (0: none); a launch
                            after it takes the slow path, which holds back.  Checked at the
                            bound sync, a launch descheduled after it ran into the request. */
    uint64_t last_launch; /* [atomic relaxed] last fast-path launch instant (the watcher's
                              idle test) */
    uint64_t burst_end_ns; /* [atomic relaxed] a sync ended a burst while another waited: the
                              watcher hands the card on if no launch follows within grace_ns */
    uint64_t grace_ns;   /* [atomic relaxed] that grace */
    uint64_t gap_ns;     /* [atomic relaxed] moving average of our idle time after a drained sync
                            (the GPU's end of our work to our next launch) */
    uint32_t long_gaps;  /* [atomic relaxed] how many of those idle times in a row lasted the
                            idle grace or longer (a service between its requests) */
    uint32_t lend_gaps;  /* [atomic relaxed] how many of those idle times in a row lasted
                            LEND_MIN_GAP_NS (arbdecide.c, "Loans") */
    uint32_t qlend_gaps; /* [atomic relaxed] ... and LEND_QUEUED_MIN_GAP_NS (a queued loan) */
    uint32_t burst_launches; /* [atomic relaxed] launches since our program's last sync
                            (ho.several) */
    int syncing;         /* [atomic relaxed] threads inside a sync call: waiting for our own
                            work is not idleness */
    uint64_t drained_at; /* [atomic seq_cst] while we hold the token: when our work last ended,
                            as a sync that covered all of it saw (the burst clock's reading, or
                            the sync's return), or the grant before our first launch: nothing of
                            ours is on the GPU since; 0 once a launch followed.  The time until
                            that launch is not ours to pay (sg_arb_idle_end, charge_locked) */
    uint64_t idle_ns;    /* [atomic relaxed] such idle time in this hold not yet charged */
    uint64_t wake_from, wake_to; /* [atomic: wake_to release/acquire] of those, the time from
                            our grant to our first launch, kept apart: a charge starting after
                            it leaves out only what follows its start (sg_arb_idle_end) */
    bool wake_open;      /* [atomic relaxed] drained_at is still our grant: no launch yet */
    uint64_t idle_from;  /* [atomic relaxed] the end of our work at our last drained sync, until
                            our next launch measures the gap (gap_ns), held or not */
    CUstream hold_stream; /* [mu] SG_HOLD_ONE: the stream */
    int hold_streams;    /* [mu] SG_HOLD_*: the streams this hold launched to */
    int revoked;         /* [atomic seq_cst] set while a release is under way */
    int launching;       /* [atomic seq_cst] launches between the gate and the real call */
    int offline;         /* [atomic relaxed] our class is offline (in-flight bound applies) */
    unsigned since_sync; /* [atomic relaxed] launches since the last bound sync */
    uint64_t kernel_ns;  /* [atomic relaxed] offline: decaying maximum of the run time of our
                            work, measured by the bound sync (the hold-back's estimate) */
    int state;           /* [atomic acquire/release] enum sg_gpu_state */
    int client;          /* [mu] our entry in a->clients, -1 before the first launch */
    struct sg_arbiter *a; /* [mu] the region mapped; replaced only when it broke and the agent
                             made a new one (arbiter.c, reattach), the old one staying mapped */
    uint64_t region_dev, region_ino; /* [mu] the file `a` maps */
    uint64_t reattach_at; /* [mu] a broken region: next look for its successor */
    int retired;          /* [mu] regions we moved away from, left mapped (arbiter.c) */
    struct sg_usage_proc_dev *usage; /* [mu] our usage counters on this device, or NULL */
    pthread_mutex_t mu;
    int idx;             /* limits index */
    int live_fd;         /* [mu] the region file, for our liveness lock and tests of others' */
    int tenant;          /* [mu] */
    int nctx;            /* [mu] contexts that launched during this hold (drained at release) */
    int ctx_cap;         /* [mu] room in ctxs, grown as a hold reaches more contexts */
    CUcontext *ctxs;     /* [mu] */
    struct sg_burst_clock bc; /* [mu] */
    struct sg_arb_handoff *handoffs; /* [mu] the region's hand-over records; NULL: none (1.11) */
    struct sg_handoff ho;     /* [mu] */
    /* Work of the process's other API (the Vulkan layer, layer_api.c) in this hold: each
     * registered drain is waited for at release, as the contexts are. */
    uint64_t hold_seq;   /* [atomic relaxed; written under mu] bumped at every hold's end */
    int next_ext;        /* [mu] */
    struct sg_ext_drain {
        void (*fn)(void *);
        void *arg;
    } ext[SG_MAX_EXT_DRAINS]; /* [mu] */
};
extern struct sg_gpu sg_gpus[SG_MAX_DEVICES];

/* Per thread: where it last launched (the stream, or NULL for the current context's default
 * streams), that stream's context and GPU, and the token word it saw granted. */
uint64_t sg_mono_ns(void);

/* The launch clock (clock.c): CLOCK_MONOTONIC read through the CPU's counter from a
 * per-thread anchor; the system clock wherever the counter cannot be trusted. */
struct sg_clock_anchor {
    uint64_t ns; /* CLOCK_MONOTONIC when taken; 0: no anchor (read the system clock) */
    uint64_t ticks;
    uint64_t fresh; /* ticks for which it is trusted (SG_ANCHOR_FRESH_NS); 0: rate unknown */
};
extern uint64_t sg_tick_mult;
/* Take a fresh anchor; returns CLOCK_MONOTONIC. */
uint64_t sg_clock_anchor(struct sg_clock_anchor *a);
/* The rate's baseline at setup: the clocks only, no anchor, no file read. */
void sg_clock_baseline(void);
/* CLOCK_MONOTONIC for an anchor past its freshness (sg_fast_ns's slow side). */
uint64_t sg_clock_stale(struct sg_clock_anchor *a);
void sg_clock_fork_child(void);

static inline uint64_t sg_ticks(void)
{
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return 0;
#endif
}

static inline uint64_t sg_fast_ns(struct sg_clock_anchor *a)
{
    uint64_t d = sg_ticks() - a->ticks;
    if (d < a->fresh) {
        uint64_t mult = __atomic_load_n(&sg_tick_mult, __ATOMIC_RELAXED);
        return a->ns + (uint64_t)(((unsigned __int128)d * mult) >> 32);
    }
    return sg_clock_stale(a);
}

struct sg_arb_tls {
    CUcontext ctx;   /* the context the work went to */
    CUstream stream; /* the explicit stream it went to; NULL: a default stream of ctx */
    uint32_t epoch;  /* sg_stream_epoch when `stream` was looked up */
    struct sg_gpu *g;
    uint64_t token;
    uint64_t gen; /* limits generation when a native GPU was cached */
    struct sg_clock_anchor clk; /* the launch clock's anchor, taken on the slow path */
};
extern __thread struct sg_arb_tls sg_arb_tls __attribute__((tls_model("initial-exec")));

/* Bumped whenever a stream or a context is destroyed: a cached stream -> GPU lookup is only
 * trusted while no handle it names can have been reused for another GPU's stream. */
extern uint32_t sg_stream_epoch;
void sg_stream_handles_died(void);

struct sg_gate {
    struct sg_gpu *g; /* gated: `launching` is held until sg_arb_exit */
    CUcontext ctx;    /* the context the work goes to (the stream's) */
};

static inline bool sg_default_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

CUresult sg_arb_enter_slow(struct sg_gate *gt, CUstream s);
/* Work of another API (the Vulkan layer) about to go to the GPU of uuid: the kernel launch's
 * token, by way of the layer's slot (layer_api.h); drain waits for that work at release.  0 go
 * on (slot->gate: the GPU held, or NULL: not arbitrated), < 0 refused. */
int sg_arb_ext_enter(const uint8_t uuid[16], void (*drain_fn)(void *), void *arg, uint64_t *hold,
                     struct sg_gpu **cache, uint64_t *gen, struct sg_gpu **gate);
/* drain_fn(arg) is no longer waited for (its device object is going). */
void sg_arb_ext_forget(struct sg_gpu *g, void (*drain_fn)(void *), void *arg);
/* The program waited, from `begin`, for work of this drain and it is all done: when the hold has
 * no other work (no context, no other drain), the time until its next submission is idle, not
 * charged, as after a CUDA sync that drained the hold. */
void sg_arb_ext_drained(struct sg_gpu *g, uint64_t begin, void (*drain_fn)(void *), void *arg);
void sg_arb_offline_bound(struct sg_gpu *g, CUcontext ctx);
void sg_arb_loan_bound(struct sg_gpu *g, CUcontext ctx);
void sg_arb_burst_end(void);

/* Around a sync call: the holder is waiting for its own work, not idle.  A sync that returns
 * with all of this hold's work done (a context synchronised that is the only one that launched
 * in the hold, or the one stream it launched to) starts an idle period that ends at the next
 * launch: the hold's charge leaves it out (sg_arb_drained). */
enum sg_sync_kind { SG_SYNC_CTX, SG_SYNC_STREAM, SG_SYNC_OTHER };
struct sg_sync {
    struct sg_gpu *g;
    uint64_t begin;
    uint32_t end_seq; /* the burst clock's end event recorded for this sync; 0: none */
};
uint32_t sg_arb_sync_mark(struct sg_gpu *g, enum sg_sync_kind kind, const void *what);
void sg_arb_drained(struct sg_gpu *g, const struct sg_sync *s, enum sg_sync_kind kind,
                    const void *what);
void sg_arb_idle_end(struct sg_gpu *g, uint64_t now);
bool sg_sync_covers_hold(struct sg_gpu *g, enum sg_sync_kind kind, const void *what);

/* The burst clock (burstclock.c; callers hold g->mu). */
void sg_bc_hold_start(struct sg_gpu *g, CUcontext ctx);
void sg_bc_renew(struct sg_gpu *g);
/* A sync that covers the hold's work (sg_sync_covers_hold) is about to wait: its end event. */
uint32_t sg_bc_sync_begin(struct sg_gpu *g);
/* When the work the end event followed ended (CLOCK_MONOTONIC), at the latest `fallback`. */
uint64_t sg_bc_end(struct sg_gpu *g, uint32_t seq, uint64_t fallback);
/* The stream a sync's end event went to (sg_bc_sync_begin succeeded). */
bool sg_bc_end_stream(const struct sg_gpu *g, CUstream *s);
/* A queued hold's first gated stream s of ctx: record `start` after its wait.  True if set. */
bool sg_bc_gate_start(struct sg_gpu *g, CUcontext ctx, CUstream s);
/* When that gate opened: 1 and *at, 0 not yet, -1 unknown (no start recorded, or unreadable). */
int sg_bc_gate_open(struct sg_gpu *g, uint64_t *at);
/* Has that gate opened (without reading the time)? */
bool sg_bc_gate_passed(struct sg_gpu *g);

/* Queued hand-overs (handoff.c; callers hold g->mu). */
/* Our streams can write and wait for the records' done words (registered once per region, with
 * ctx pushed): false when the region has no records or the driver refused. */
bool sg_ho_words(struct sg_gpu *g, CUcontext ctx);
/* The holder: our done word raised to `seq` on stream s, after the hold's work.  False: not. */
bool sg_ho_record(struct sg_gpu *g, CUstream s, uint32_t seq);
/* The next holder, at the grant, under the region lock: take the gate from our record. */
void sg_ho_granted_locked(struct sg_gpu *g, int c);
/* A launch of this hold to stream s of ctx: make it wait for the gate first. */
void sg_ho_gate_launch(struct sg_gpu *g, CUcontext ctx, CUstream s);
/* Before a charge: move the time our work waited at the gate into idle_ns (not charged). */
void sg_ho_settle(struct sg_gpu *g, uint64_t now);
/* The watcher: open a gate whose awaited work ran past the bound. */
void sg_ho_watch(struct sg_gpu *g, uint64_t now);
/* After fork: nothing of the parent's handles is ours. */
void sg_ho_fork_child(struct sg_gpu *g);

static inline void sg_arb_sync_begin(struct sg_sync *s, enum sg_sync_kind kind, const void *what)
{
    s->g = sg_arb_tls.g;
    s->end_seq = 0;
    if (s->g) {
        __atomic_fetch_add(&s->g->syncing, 1, __ATOMIC_RELAXED);
        s->begin = sg_mono_ns();
        if (kind != SG_SYNC_OTHER && __atomic_load_n(&s->g->token, __ATOMIC_RELAXED))
            s->end_seq = sg_arb_sync_mark(s->g, kind, what);
    }
}

static inline void sg_arb_sync_end(struct sg_sync *s, CUresult res, enum sg_sync_kind kind,
                                   const void *what)
{
    if (s->g) {
        __atomic_fetch_sub(&s->g->syncing, 1, __ATOMIC_RELAXED);
        /* A sync whose end event was recorded may also close a queued hand-over's charge. */
        if (res == CUDA_SUCCESS && kind != SG_SYNC_OTHER &&
            (s->end_seq || __atomic_load_n(&s->g->token, __ATOMIC_RELAXED)))
            sg_arb_drained(s->g, s, kind, what);
    }
    sg_arb_burst_end();
}
void sg_arb_setup(void);
void sg_arb_start_watcher(void);

/*
 * The launch fast path.  With the token held, the quantum not over and no yield request it is,
 * for an explicit stream: a compare of the stream with the thread's cached one and one relaxed
 * load of the stream epoch (the GPU of a launch is its stream's, not the current context's);
 * for a default stream: one driver call that reads the current context (cuCtxGetCurrent, a TLS
 * read in the driver).  Then one uncontended atomic increment and decrement of a
 * process-private counter (so that a release never overlaps a launch), one acquire load of the
 * region's token word, two relaxed loads (our yield flag, the quantum end) and the launch
 * clock (a CPU counter read), and one load of the drained mark (set only between a sync that
 * drained the hold and the next launch): no system call, no lock, no allocation.  Measured by
 * tests/integration/test_arbiter.py (sanity bound) and bench/.
 */
/* The fast path's test, shared by launches and the Vulkan layer's submissions (arbiter.c
 * sg_arb_ext_enter), with g->launching already raised: the token `tok` is still ours, not
 * revoked, no yield asked, the quantum not over and no hold-back due.  True: the launch clock
 * stamped (and the idle gap after a drained sync ended). */
static inline bool sg_arb_may_launch(struct sg_gpu *g, uint64_t tok, struct sg_clock_anchor *clk)
{
    if (!tok || __atomic_load_n(&g->revoked, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&g->a->token, __ATOMIC_ACQUIRE) != tok ||
        __atomic_load_n(&g->a->clients[g->client].yield, __ATOMIC_RELAXED))
        return false;
    uint64_t now = sg_fast_ns(clk);
    uint64_t by = __atomic_load_n(&g->launch_by, __ATOMIC_RELAXED);
    if (now >= __atomic_load_n(&g->qend, __ATOMIC_RELAXED) || (by && now >= by))
        return false;
    __atomic_store_n(&g->last_launch, now, __ATOMIC_RELAXED);
    if (__builtin_expect(__atomic_load_n(&g->drained_at, __ATOMIC_SEQ_CST), 0))
        sg_arb_idle_end(g, now); /* the first launch after a drained sync */
    return true;
}

static inline CUresult sg_arb_enter(struct sg_gate *gt, CUstream s)
{
    gt->g = NULL;
    struct sg_arb_tls *t = &sg_arb_tls;
    struct sg_gpu *g = t->g;
    bool hit = false;
    if (!g) {
    } else if (!sg_default_stream(s)) {
        hit = s == t->stream && t->epoch == __atomic_load_n(&sg_stream_epoch, __ATOMIC_ACQUIRE);
    } else {
        CUcontext ctx;
        hit = !t->stream && SG_REAL(cuCtxGetCurrent) &&
              SG_REAL(cuCtxGetCurrent)(&ctx) == CUDA_SUCCESS && ctx == t->ctx;
    }
    if (hit) {
        if (__atomic_load_n(&g->state, __ATOMIC_ACQUIRE) == SG_GPU_NATIVE) {
            if (__atomic_load_n(&sg_limits_map->generation, __ATOMIC_ACQUIRE) == t->gen)
                return CUDA_SUCCESS;
        } else {
            __atomic_fetch_add(&g->launching, 1, __ATOMIC_SEQ_CST);
            if (sg_arb_may_launch(g, t->token, &t->clk)) {
                gt->g = g;
                gt->ctx = t->ctx;
                return CUDA_SUCCESS;
            }
            __atomic_fetch_sub(&g->launching, 1, __ATOMIC_RELEASE);
        }
    }
    return sg_arb_enter_slow(gt, s);
}

/* After the real launch: let a release proceed; a client lent the card, or an offline one, bounds
 * its in-flight work. */
static inline void sg_arb_exit(struct sg_gate *gt)
{
    struct sg_gpu *g = gt->g;
    if (!g)
        return;
    __atomic_fetch_sub(&g->launching, 1, __ATOMIC_RELEASE);
    /* Only "more than one" is read (ho.several): no locked add per launch. */
    uint32_t n = __atomic_load_n(&g->burst_launches, __ATOMIC_RELAXED);
    if (n < 2)
        __atomic_store_n(&g->burst_launches, n + 1, __ATOMIC_RELAXED);
    int c = __atomic_load_n(&g->client, __ATOMIC_RELAXED);
    if (__builtin_expect(c >= 0 && __atomic_load_n(&g->a->clients[c].yield, __ATOMIC_RELAXED) ==
                                       SG_ARB_YIELD_LOAN, 0))
        sg_arb_loan_bound(g, gt->ctx);
    if (__atomic_load_n(&g->offline, __ATOMIC_RELAXED))
        sg_arb_offline_bound(g, gt->ctx);
}

/* ---- re-entrancy --------------------------------------------------------------------------- */

/* Set while a hook runs on this thread, so that a real function calling one of its own exported
 * entry points (which our export would interpose) is forwarded untouched, never charged twice. */
extern __thread int sg_in_hook __attribute__((tls_model("initial-exec")));

#pragma GCC visibility pop

#endif /* SHAREGPU_SHIM_H */
