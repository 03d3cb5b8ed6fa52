/*
 * libcuda.so.1 internals: the process-local objects behind CUDA handles and the helpers shared by
 * the files of this directory.  Exported functions (SIM_EXPORT) never call each other: they all
 * call internal helpers, so an interposer that hooks one entry point never sees a call twice.
 */
#ifndef SIMGPU_CU_H
#define SIMGPU_CU_H

#include "sharegpu/cuda_api.h"
#include "../common/sim.h"

#include <pthread.h>
#include <stdint.h>

#define SIM_EXPORT __attribute__((visibility("default")))

/* The driver's flags that decide how a synchronising call waits (cuda.h's values). */
#define CU_CTX_SCHED_SPIN 0x1u
#define CU_CTX_SCHED_YIELD 0x2u
#define CU_CTX_SCHED_BLOCKING_SYNC 0x4u
#define CU_CTX_SCHED_MASK 0x7u
#define CU_EVENT_BLOCKING_SYNC 0x1u

/* ---- handles ------------------------------------------------------------------------------
 * Every handle is a pointer to one of these; `magic` is checked before any other field and is
 * cleared when the object dies, so a stale handle yields an error, not a wild access (as long
 * as its memory was not reused: the real driver gives no stronger guarantee). */
#define CTX_MAGIC 0x43545831u
#define STREAM_MAGIC 0x53545231u
#define EVENT_MAGIC 0x45564e31u
#define MODULE_MAGIC 0x4d4f4431u
#define FUNC_MAGIC 0x46554e31u
#define GRAPH_MAGIC 0x47524131u
#define NODE_MAGIC 0x4e4f4431u
#define EXEC_MAGIC 0x45584531u
#define ARRAY_MAGIC 0x41525231u
#define POOL_MAGIC 0x504f4f31u
#define LIB_MAGIC 0x4c494231u
#define KERNEL_MAGIC 0x4b524e31u

struct CUstream_st {
    uint32_t magic;
    unsigned flags;
    int priority;          /* clamped to [CU_STREAM_PRIORITY_GREATEST, CU_STREAM_PRIORITY_LEAST] */
    unsigned long long id; /* cuStreamGetId: unique in the process */
    struct CUctx_st *ctx;
    struct CUgraph_st *capture; /* non-NULL while capturing (owned by the stream until End) */
    struct sim_queue q;
    /* [hold_mu, ipcevent.c] A wait on another process's interprocess event on this GPU that
     * holds only this stream so far (seq1 0: none): put on the channel's gate by the stream's
     * next work that is not a memory write (cu_stream_settle). */
    struct sim_ticket hold;
};

struct CUctx_st {
    uint32_t magic;        /* CTX_MAGIC while alive */
    int ordinal;           /* CUdevice */
    int phys;              /* index in the shared state */
    int primary;
    int active;            /* primary: retained at least once since the last reset */
    int refcount;          /* primary: retain count */
    unsigned flags;
    unsigned long long id;  /* cuCtxGetId: unique in the process, never reused */
    size_t limit[CU_LIMIT_MAX]; /* cuCtxSetLimit values (limits.c) */
    uint64_t limit_charged; /* bytes charged for stack, printf FIFO and malloc heap above defaults */
    struct sim_ticket last; /* [state lock] its last submitted kernel, on any stream */
    struct CUstream_st defstream; /* stream 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    struct CUctx_st *ctx;
    int recorded;          /* atomic: cuEventRecord succeeded at least once */
    struct sim_watch w;    /* its completion instant (common/engine.c) */
    int ipc;               /* 0; EVENT_IPC_EXPORTED or EVENT_IPC_IMPORTED: its records live in
                            * the state's table (ipcevent.c), at ipc_index of generation ipc_gen */
    uint32_t ipc_index;
    uint64_t ipc_gen;
};
#define EVENT_IPC_EXPORTED 1
#define EVENT_IPC_IMPORTED 2

struct CUfunc_st {
    uint32_t magic;
    int spin;              /* name starts with "spin": duration from parameter 0 */
    int max_dyn_smem;      /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (0: the default) */
    int carveout;          /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (0: default -1) */
    unsigned block[3];     /* legacy launch API (legacy.c): cuFuncSetBlockShape */
    unsigned param_size;   /* cuParamSetSize */
    unsigned char *params; /* cuParamSet*: the argument buffer, CU_PARAM_MAX bytes once set */
    struct CUmod_st *mod;
    struct CUfunc_st *next;
    char name[];
};

/* A `.global` or `.const` variable of a PTX image: device memory of the module. */
struct cu_var {
    char *name;            /* malloc'd: PTX names have no length limit */
    uint64_t offset, size;
};

struct CUmod_st {
    uint32_t magic;
    int ptx;               /* image was PTX text: only its .entry names exist */
    struct CUctx_st *ctx;  /* NULL for a library's parsed prototype */
    char *entries;         /* PTX: NUL-separated entry names, then an empty string */
    struct cu_var *vars;   /* PTX: its variables, laid out from `globals` */
    size_t nvars;
    uint64_t var_bytes;    /* charged to the process on ctx's GPU while the module lives */
    CUdeviceptr globals;   /* their storage (0 when var_bytes is 0 or for a prototype) */
    struct CUfunc_st *funcs;
    struct CUlib_st *lib;  /* the library this is the per-context instance of, or NULL */
    struct CUmod_st *next_in_lib;
};

/* A library (cuLibraryLoadData): context-independent, instantiated as a module in each context
 * at its first use there (library.c). */
struct CUlib_st {
    uint32_t magic;
    struct CUmod_st proto;     /* parsed image; ctx NULL, no storage */
    struct CUmod_st *per_ctx;  /* [cu_g.mu] instances */
    struct CUkern_st *kernels; /* [cu_g.mu] */
};

struct CUkern_st {
    uint32_t magic;            /* KERNEL_MAGIC: first, like CUfunc_st, so a cast can be told apart */
    struct CUlib_st *lib;
    struct CUctx_st *last_ctx; /* [cu_g.mu] cache of the last per-context function */
    struct CUfunc_st *last_fn;
    struct CUkern_st *next;
    char name[];
};

struct CUarray_st {
    uint32_t magic;
    int phys;
    uint64_t charged;      /* bytes charged for this array */
    int charged_own;       /* 0 for a level of a mipmapped array: the whole is charged */
    size_t width, height, depth;
    int format;
    unsigned channels, flags;
};

/* A mipmapped array (array.c): its levels are arrays charged as one. */
struct CUmipmappedArray_st {
    uint32_t magic;
    int phys;
    uint64_t charged;
    unsigned nlevels;
    struct CUarray_st *levels;
};
#define MIPMAP_MAGIC 0x4d495031u

/* A memory pool (pool.c).  `reserved` is what the pool holds charged on its GPU: its live
 * allocations (`used`) plus freed memory it keeps cached for reuse. */
struct CUmemPoolHandle_st {
    uint32_t magic;
    int ordinal;
    int phys;
    int is_default;
    int dead;                   /* destroyed while allocations were live: freed with the last */
    unsigned handle_types;      /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: exportable (ipc.c) */
    int share_fd;               /* exportable: its memfd + 1 once exported (its identity), else 0 */
    uint64_t ino;               /* exported or imported: that memfd's inode */
    int imported;               /* cuMemPoolImportFromShareableHandle: pointers only, no allocation */
    int reuse[3];               /* CU_MEMPOOL_ATTR_REUSE_* (1..3), kept and reported */
    uint64_t release_threshold; /* [pool_mu in pool.c, like the fields below] */
    uint64_t reserved, used;    /* bytes */
    uint64_t reserved_high, used_high;
    struct CUmemPoolHandle_st *next; /* created pools */
};

/* ---- process-wide state (init.c) ---------------------------------------------------------- */
struct cu_global {
    int inited;                     /* atomic acquire: cuInit succeeded (reset in a forked child) */
    struct sim_state *st;
    int nvis;                       /* visible devices after CUDA_VISIBLE_DEVICES */
    int vis[SIM_MAX_GPUS];          /* ordinal -> physical index */
    uint64_t kernel_ns;             /* SIMGPU_KERNEL_US */
    struct CUctx_st primary[SIM_MAX_GPUS];
    struct CUmemPoolHandle_st pool[SIM_MAX_GPUS];   /* each device's default pool */
    struct CUmemPoolHandle_st *current[SIM_MAX_GPUS]; /* cuDeviceSetMemPool (NULL: the default) */
    pthread_mutex_t mu;             /* process-local tables: contexts, modules, graphs */
};
extern struct cu_global cu_g SIM_HIDDEN;

/* NOT_INITIALIZED before cuInit. */
static inline CUresult cu_ready(void)
{
    return __atomic_load_n(&cu_g.inited, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_NOT_INITIALIZED;
}
/* Physical index of a CUdevice, -1 when invalid. */
static inline int cu_phys(CUdevice d)
{
    return (d >= 0 && d < cu_g.nvis) ? cu_g.vis[d] : -1;
}

/* The preamble of every call that takes a device: the driver is initialised and `dev` names a
 * visible device (its physical index in *phys when phys is not NULL). */
static inline CUresult cu_ready_device(CUdevice dev, int *phys)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    int p = cu_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (phys)
        *phys = p;
    return CUDA_SUCCESS;
}
/* The one place internal errors become CUresults. */
SIM_HIDDEN CUresult cu_result(const struct sim_err *e);
/* A new event of context c (stream.c); NULL when out of memory. */
SIM_HIDDEN CUevent cu_event_new(struct CUctx_st *c, unsigned flags);
/* Interprocess events (ipcevent.c): a record on stream s, whether its last record has
 * completed (wait: until it has; <0 with *r set), and a wait of stream s for it. */
SIM_HIDDEN CUresult cu_ipc_event_record(CUevent ev, struct CUstream_st *s);
SIM_HIDDEN int cu_ipc_event_done(CUevent ev, int wait, CUresult *r);
SIM_HIDDEN CUresult cu_ipc_event_gate(CUevent ev, struct CUstream_st *s);
/* The stream's held wait, if any, now gates its channel, before work that must follow it on the
 * GPU (a kernel, a copy, a record, a wait, a free). */
SIM_HIDDEN CUresult cu_stream_settle(struct CUstream_st *s);
/* For a query or a synchronize of s, which must not gate anything: 1 when s holds no wait, or
 * its awaited kernel has completed (the hold is dropped); 0 while it runs (wait: sleep until
 * it has completed); -1 with *r set on error. */
SIM_HIDDEN int cu_stream_hold_done(struct CUstream_st *s, int wait, CUresult *r);
/* What a memory write queued on s now follows, in *after: the stream's last work (&s->q.last,
 * which the engine reads under the state lock), or, when that is done and a held wait is
 * pending, the awaited kernel (copied into *held; only that stream waits for it). */
SIM_HIDDEN CUresult cu_stream_write_after(struct CUstream_st *s, struct sim_ticket *held,
                                          const struct sim_ticket **after);
SIM_HIDDEN void cu_ipc_event_fork_child(void);

/* Stream memory operations (memop.c): store this process's queued writes whose work has
 * completed (after every synchronize of a stream or context); forget the parent's at fork. */
SIM_HIDDEN void cu_memop_land(void);
SIM_HIDDEN void cu_memop_fork_child(void);

/* ---- contexts (context.c) ------------------------------------------------------------------ */
/* The current context of this thread: NOT_INITIALIZED / INVALID_CONTEXT otherwise. */
SIM_HIDDEN CUresult cu_ctx_current(struct CUctx_st **out);
SIM_HIDDEN int cu_ctx_alive(const struct CUctx_st *c);
SIM_HIDDEN CUresult cu_ctx_wait(struct CUctx_st *c); /* until all its work is done */
/* How a sync in context c waits: its CU_CTX_SCHED_* flag.  A context of flag 0 (AUTO) sleeps,
 * where a driver's heuristic spins while the process has no more contexts than the node has
 * CPUs: the simulated GPU's tenants share a few CPUs, and one that spun would slow the rest. */
SIM_HIDDEN enum sim_wait_how cu_wait_how(const struct CUctx_st *c);
/* An event's wait: CU_EVENT_BLOCKING_SYNC sleeps, else as its context says. */
SIM_HIDDEN enum sim_wait_how cu_event_wait_how(const struct CUevent_st *ev);
SIM_HIDDEN void cu_ctx_fork_child(void);

/* A process-wide counter for context and stream ids (real ids are unique per process too). */
SIM_HIDDEN unsigned long long cu_next_id(void);
/* Stream priorities: H100 and H200 report [-5, 0] (lower is more urgent). */
#define CU_STREAM_PRIORITY_LEAST 0
#define CU_STREAM_PRIORITY_GREATEST (-5)
/* limits.c: defaults and the reservation of a new context; release at its end. */
SIM_HIDDEN void cu_limits_init(struct CUctx_st *c);
SIM_HIDDEN void cu_limits_release(struct CUctx_st *c);

/* ---- streams (stream.c) ------------------------------------------------------------------- */
/* Resolves 0 / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD to the current context's stream. */
SIM_HIDDEN CUresult cu_stream(CUstream h, struct CUstream_st **out);
SIM_HIDDEN void cu_stream_init(struct CUstream_st *s, struct CUctx_st *c, unsigned flags);
SIM_HIDDEN CUresult cu_stream_wait(struct CUstream_st *s); /* until all its work is done */

/* ---- kernels (launch.c, module.c, library.c, graph.c) -------------------------------------- */
SIM_HIDDEN CUresult cu_func_check(CUfunction f); /* a CUfunction, or a CUkernel cast to one */
/* Parses an image, of which at most limit bytes may be read, into m (ctx NULL):
 * CUDA_ERROR_INVALID_IMAGE for what is no PTX/cubin/fatbin. */
SIM_HIDDEN CUresult cu_module_parse(struct CUmod_st *m, const void *image, uint64_t limit);
/* The limit of a caller's image in memory (its headers are trusted up to it); a file's is its
 * length, always less. */
#define CU_IMAGE_IN_MEMORY (1ull << 30)
/* fatbin.c: the entry a driver loads from a fatbin container or wrapper, unpacked into *out
 * (malloc'd, zero bytes after its *size), *elf set for an ELF cubin (else PTX text). */
SIM_HIDDEN CUresult cu_fatbin_entry(const void *image, uint64_t limit, unsigned char **out,
                                    uint64_t *size, int *elf);
/* The whole of a file, NUL-terminated (PTX is text), its length in *length; NULL with *r set. */
SIM_HIDDEN void *cu_read_file(const char *path, uint64_t *length, CUresult *r);
/* ptx.c: the variables of a PTX text as a driver reads them (names malloc'd, laid out in order) */
SIM_HIDDEN CUresult cu_ptx_vars(const char *text, struct cu_var **out, size_t *n, uint64_t *bytes);
SIM_HIDDEN void cu_vars_free(struct cu_var *v, size_t n);
/* A live module of ctx from a parsed prototype: copies its names, places and charges its
 * variables on ctx's GPU. */
SIM_HIDDEN CUresult cu_module_instance(const struct CUmod_st *proto, struct CUctx_st *ctx,
                                       struct CUmod_st **out);
SIM_HIDDEN void cu_module_destroy(struct CUmod_st *m); /* frees storage, functions, the module */
SIM_HIDDEN void cu_module_clear(struct CUmod_st *m);   /* a prototype's parsed data */
SIM_HIDDEN CUresult cu_module_function(struct CUmod_st *m, const char *name,
                                       struct CUfunc_st **out);
/* The function a kernel (or a function) stands for in ctx. */
SIM_HIDDEN CUresult cu_func_in(CUfunction f, struct CUctx_st *ctx, struct CUfunc_st **out);
SIM_HIDDEN uint64_t cu_kernel_ns(const struct CUfunc_st *f, void **params, void **extra);
/* Every launch entry point ends here (launch.c); the stream names the context. */
SIM_HIDDEN CUresult cu_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, CUstream h, void **params, void **extra,
                              int cooperative);
/* Submits kernels of the given durations on s (or records them when s is capturing). */
SIM_HIDDEN CUresult cu_submit(struct CUstream_st *s, const uint64_t *dur, size_t n,
                              const struct CUfunc_st *f);
SIM_HIDDEN CUresult cu_graph_capture_add(struct CUgraph_st *g, const struct CUfunc_st *f,
                                         uint64_t dur_ns);
SIM_HIDDEN void cu_graph_free(struct CUgraph_st *g);

/* ---- memory (memory.c, vmm.c) ------------------------------------------------------------- */
/* 0 when [p, p+len) lies inside one live allocation or one accessible VMM mapping. */
SIM_HIDDEN int cu_mem_range_ok(uintptr_t p, size_t len);
SIM_HIDDEN int cu_mem_word(uintptr_t p, size_t len, uint64_t *ino, uint64_t *off); /* memory.c */
SIM_HIDDEN int cu_vmm_range_ok(uintptr_t p, size_t len);
/* hostmem.c: 0 when [p, p+len) lies inside one page-locked host range (*read_only: registered
 * with CU_MEMHOSTREGISTER_READ_ONLY), -1 if not. */
SIM_HIDDEN int cu_host_range(uintptr_t p, size_t len, int *read_only);
/* A registered byte of a shared file mapping: the file's name for words and the byte's offset
 * in it (hostmem.c).  -1: not such memory. */
SIM_HIDDEN int cu_host_file(uintptr_t p, uint64_t *file, uint64_t *off);
SIM_HIDDEN void cu_host_fork_child(void);
/* 0 with the allocation (not VMM mapping) that contains p; -1 if none. */
SIM_HIDDEN int cu_mem_range_of(uintptr_t p, uintptr_t *base, size_t *size);
SIM_HIDDEN void cu_mem_free_ctx(struct CUctx_st *c); /* the context died: free what it held */
/* Device memory that no allocation call returns (module variables): placed and charged like
 * cuMemAlloc, owned by ctx, freed with cu_mem_free. */
SIM_HIDDEN CUresult cu_mem_reserve(struct CUctx_st *ctx, size_t size, CUdeviceptr *out);
/* Places an allocation whose charge its pool already holds (pool.c). */
SIM_HIDDEN CUresult cu_mem_place_pooled(struct CUctx_st *ctx, int phys, size_t size,
                                        struct CUmemPoolHandle_st *pool, CUdeviceptr *out);
/* 1 when p starts a live allocation: its pool (or NULL), bytes and GPU. */
SIM_HIDDEN int cu_mem_lookup(CUdeviceptr p, struct CUmemPoolHandle_st **pool, uint64_t *bytes,
                             int *phys);
SIM_HIDDEN CUresult cu_mem_free(CUdeviceptr p); /* now: its charge, or its pool's, goes back */
/* The address range of a graph memory node: placed, never charged (graph.c charges the graph
 * pool at launch); cuMemFree of it frees the memory, not the range, which the graph keeps. */
SIM_HIDDEN CUresult cu_mem_place_graph(struct CUctx_st *ctx, int phys, size_t size, CUdeviceptr *out);
SIM_HIDDEN void cu_mem_unplace_graph(CUdeviceptr p);
SIM_HIDDEN CUresult cu_graph_mem_free(CUdeviceptr p); /* graph.c: a live graph allocation ends */
/* IPC (ipc.c): an exported cuMemAlloc allocation is a memfd an importer maps. */
struct cu_ipc_share {
    int fd;          /* the exporter's descriptor of the memfd */
    uint64_t ino;    /* the memfd's identity */
    uint64_t off;    /* the allocation's offset in the memfd */
    uint64_t len;    /* the memfd's length (whole pages) */
    uint64_t size;   /* the allocation's placed size */
    uint64_t charge; /* the bytes it is charged */
    int phys;        /* its GPU */
    int freeable;    /* a pool pointer: the import ends at cuMemFree(Async), each import its own */
};
/* 0: the allocation that starts at p, shared (its pages moved onto a memfd, data kept); a pool
 * allocation only when its pool is exportable. */
SIM_HIDDEN CUresult cu_mem_share(CUdeviceptr p, struct cu_ipc_share *out);
/* Maps fd (a descriptor of sh's memfd) for ctx, charging sh->charge; a second open by the same
 * context returns the same pointer and counts one more reference. */
SIM_HIDDEN CUresult cu_mem_import(struct CUctx_st *ctx, int fd, const struct cu_ipc_share *sh,
                                  CUdeviceptr *out);
SIM_HIDDEN CUresult cu_mem_unimport(CUdeviceptr p); /* one reference of an import closed */
/* Stream capture of stream-ordered allocation (graph.c). */
SIM_HIDDEN CUresult cu_graph_capture_alloc(struct CUgraph_st *g, struct CUctx_st *ctx, int phys,
                                           size_t bytes, CUdeviceptr *out);
SIM_HIDDEN CUresult cu_graph_capture_free(struct CUgraph_st *g, CUdeviceptr p);

/* ---- memory pools (pool.c) ----------------------------------------------------------------- */
SIM_HIDDEN void cu_pool_returned(struct CUmemPoolHandle_st *pool, uint64_t bytes); /* cached */
/* A synchronisation point: applies the frees streams have reached, and every pool gives back
 * what it caches beyond its release threshold (as a driver's pools do at a sync). */
SIM_HIDDEN void cu_pools_sync(void);
/* A context of phys ended: its pools keep nothing cached. */
SIM_HIDDEN void cu_pools_trim_device(int phys);
/* The allocation at ptr died with its context: a free queued for it must not run later. */
SIM_HIDDEN void cu_pool_drop_pending(CUdeviceptr ptr);
SIM_HIDDEN void cu_pool_fork_child(void);
SIM_HIDDEN void cu_mem_fork_child(void);
SIM_HIDDEN void cu_vmm_fork_child(void);

/* ---- address-range allocator (arena.c); callers serialise ---------------------------------- */
struct arena_range {
    uintptr_t start;
    size_t len;
};
struct arena {
    struct arena_range *r; /* free ranges, sorted, never adjacent */
    size_t n, cap;
};
SIM_HIDDEN int arena_take(struct arena *a, size_t size, size_t align, uintptr_t *out);
SIM_HIDDEN int arena_give(struct arena *a, uintptr_t start, size_t len);

#define CU_GRANULARITY (2u * 1024u * 1024u)

#endif /* SIMGPU_CU_H */
