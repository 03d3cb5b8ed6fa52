/*
 * Device memory.  Every allocation is charged to the shared state first (so all processes share
 * the card's capacity), then placed in this process's address space: device pointers are real
 * host addresses, so copies and memsets really move data.
 *
 * Placement: a few large MAP_NORESERVE anonymous regions (64 GiB each, added as needed) carved by
 * a first-fit allocator (arena.c).  One mapping per region, never one per allocation, so
 * vm.max_map_count is no concern; freed ranges are reused and their pages returned with
 * MADV_DONTNEED.  Live allocations are a sorted array (binary search for free and for the range
 * checks of copies).  Charged size = requested size (pitch*height for pitched allocations).
 *
 * Stream-ordered allocation and memory pools are in pool.c: a pool allocation is placed here
 * with its charge held by its pool (which keeps freed memory cached, as a driver's pool does);
 * a graph memory node's range is placed here uncharged (graph.c).  Copies and memsets: copy.c.
 *
 * Locks: mem_mu (process-local) may be held while taking the state lock, never the reverse.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define REGION_BYTES (64ull << 30)
#define MAX_REGIONS 256
#define SMALL_ALIGN 512u
#define MADVISE_MIN (64u * 1024u)

struct alloc {
    uintptr_t base;
    size_t size;       /* placed bytes (rounded) */
    uint64_t charged;  /* bytes charged to the device by this allocation (0: its pool's) */
    int phys;
    struct CUctx_st *ctx;
    struct CUmemPoolHandle_st *pool; /* a stream-ordered allocation's pool, else NULL */
    uint64_t pool_bytes;             /* its size as the pool counts it */
    int graph;                       /* the address range of a graph memory node (graph.c) */
    /* IPC (ipc.c).  Exported: the pages under the allocation were moved onto a memfd of their
     * own, which the importers open through /proc (share_fd is that descriptor + 1, 0: none). */
    int share_fd;
    uint64_t share_ino;
    uintptr_t share_base; /* the page-aligned range the memfd covers */
    size_t share_len;
    /* Imported: a MAP_SHARED mapping of an exporter's memfd, [map_base, map_base+map_len), its
     * own range of the arena; opened import_refs times by ctx (each needs its close). */
    uint64_t import_ino;
    int import_refs;
    int import_freeable; /* a pool pointer import: cuMemFree(Async) ends it */
    uintptr_t map_base;
    size_t map_len;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs; /* [mem_mu] sorted by base */
static size_t nallocs, capallocs;
static struct arena va;      /* [mem_mu] free address ranges inside the regions */
static size_t nregions;      /* [mem_mu] */

void cu_mem_fork_child(void)
{
    /* The parent's allocations are not the child's: forget them (their ranges stay taken). */
    pthread_mutex_init(&mem_mu, NULL);
    nallocs = 0;
}

static size_t find(uintptr_t p) /* first index with base >= p */
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].base < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int grow(size_t need)
{
    if (nregions >= MAX_REGIONS)
        return -1;
    size_t want = REGION_BYTES > need + CU_GRANULARITY ? REGION_BYTES : need + CU_GRANULARITY;
    for (size_t sz = want; sz >= need + CU_GRANULARITY; sz /= 2) {
        void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            continue;
        if (arena_give(&va, (uintptr_t)p, sz) < 0) {
            munmap(p, sz);
            return -1;
        }
        nregions++;
        return 0;
    }
    return -1;
}

static void release_pages(uintptr_t base, size_t size)
{
    if (size < MADVISE_MIN)
        return; /* small ranges are reused soon; a syscall per free would cost more */
    const uintptr_t page = 4096;
    uintptr_t a = (base + page - 1) & ~(page - 1), b = (base + size) & ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Under mem_mu: adds a to the sorted array; -1 when host memory is exhausted. */
static int insert_locked(const struct alloc *a)
{
    if (nallocs == capallocs) {
        size_t cap = capallocs ? capallocs * 2 : 256;
        struct alloc *n = realloc(allocs, cap * sizeof(*n));
        if (!n)
            return -1;
        allocs = n;
        capallocs = cap;
    }
    size_t i = find(a->base);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof(*allocs));
    allocs[i] = *a;
    nallocs++;
    return 0;
}

/* Places size bytes charged as `charge` on phys for ctx. */
static CUresult place(struct CUctx_st *ctx, int phys, size_t size, uint64_t charge,
                      struct CUmemPoolHandle_st *pool, CUdeviceptr *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > (1ull << 46))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_err e = {0};
    if (charge && sim_charge(&e, cu_g.st, phys, charge) < 0)
        return cu_result(&e);
    size_t align = size >= CU_GRANULARITY ? CU_GRANULARITY : SMALL_ALIGN;
    size_t rounded = (size + SMALL_ALIGN - 1) & ~(size_t)(SMALL_ALIGN - 1);
    uintptr_t p = 0;
    int ok = 0;
    pthread_mutex_lock(&mem_mu);
    if (arena_take(&va, rounded, align, &p) == 0 ||
        (grow(rounded + align) == 0 && arena_take(&va, rounded, align, &p) == 0)) {
        ok = insert_locked(&(struct alloc){.base = p,
                                           .size = rounded,
                                           .charged = pool ? 0 : charge,
                                           .phys = phys,
                                           .ctx = ctx,
                                           .pool = pool,
                                           .pool_bytes = pool ? size : 0}) == 0;
        if (!ok)
            arena_give(&va, p, rounded);
    }
    pthread_mutex_unlock(&mem_mu);
    if (!ok) {
        if (charge)
            sim_uncharge(cu_g.st, phys, charge);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

static CUresult dev_alloc(struct CUctx_st *ctx, int phys, size_t size, uint64_t charge,
                          CUdeviceptr *out)
{
    return place(ctx, phys, size, charge, NULL, out);
}

/* Puts private anonymous pages back over [base, base+len) (page-aligned): a shared mapping's
 * pages go with it. */
static void unshare_pages(uintptr_t base, size_t len)
{
    mmap((void *)base, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
}

/* Under mem_mu, allocs[i] already removed: 1 when no live allocation touches [lo, hi). */
static int range_alone(uintptr_t lo, uintptr_t hi)
{
    size_t j = find(hi);
    return !(j > 0 && allocs[j - 1].base + allocs[j - 1].size > lo);
}

/* Under mem_mu: removes allocs[i], returns its pages and range; *a is what it was. */
static void drop_locked(size_t i, struct alloc *a)
{
    *a = allocs[i];
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof(*allocs));
    nallocs--;
    if (a->import_refs) { /* its own range: the exporter's pages leave this process */
        unshare_pages(a->map_base, a->map_len);
        arena_give(&va, a->map_base, a->map_len);
        return;
    }
    if (a->share_fd) {
        close(a->share_fd - 1); /* importers keep the memfd alive through their mappings */
        /* Pages shared with a live neighbour keep the memfd under them (their data is there). */
        if (range_alone(a->share_base, a->share_base + a->share_len))
            unshare_pages(a->share_base, a->share_len);
    }
    release_pages(a->base, a->size);
    arena_give(&va, a->base, a->size);
}

/* An allocation's end: its own charge goes back; a pool allocation's goes to its pool. */
static void ended(const struct alloc *a)
{
    if (a->pool)
        cu_pool_returned(a->pool, a->pool_bytes);
    else
        sim_uncharge(cu_g.st, a->phys, a->charged);
}

static CUresult dev_free(CUdeviceptr dptr)
{
    struct alloc a;
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)dptr);
    int found = i < nallocs && allocs[i].base == (uintptr_t)dptr;
    int graph = found && allocs[i].graph;
    int imported = found && allocs[i].import_refs && !allocs[i].import_freeable;
    if (found && !graph && !imported)
        drop_locked(i, &a);
    pthread_mutex_unlock(&mem_mu);
    if (!found || imported) /* an opened IPC handle is closed with cuIpcCloseMemHandle */
        return CUDA_ERROR_INVALID_VALUE;
    if (graph) /* the range stays the graph's: only its memory goes back to the graph pool */
        return cu_graph_mem_free(dptr);
    ended(&a);
    return CUDA_SUCCESS;
}

CUresult cu_mem_place_graph(struct CUctx_st *ctx, int phys, size_t size, CUdeviceptr *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = place(ctx, phys, size, 0, NULL, out);
    if (!r) {
        pthread_mutex_lock(&mem_mu);
        size_t i = find((uintptr_t)*out);
        allocs[i].graph = 1;
        pthread_mutex_unlock(&mem_mu);
    }
    return r;
}

void cu_mem_unplace_graph(CUdeviceptr p)
{
    struct alloc a;
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)p);
    if (i < nallocs && allocs[i].base == (uintptr_t)p && allocs[i].graph)
        drop_locked(i, &a);
    pthread_mutex_unlock(&mem_mu);
}

void cu_mem_free_ctx(struct CUctx_st *c)
{
    pthread_mutex_lock(&mem_mu);
    for (size_t i = nallocs; i-- > 0;) {
        if (allocs[i].ctx == c && !allocs[i].graph) { /* a graph keeps its ranges (uncharged) */
            struct alloc a;
            drop_locked(i, &a);
            cu_pool_drop_pending((CUdeviceptr)a.base);
            ended(&a);
        }
    }
    pthread_mutex_unlock(&mem_mu);
}

CUresult cu_mem_place_pooled(struct CUctx_st *ctx, int phys, size_t size,
                             struct CUmemPoolHandle_st *pool, CUdeviceptr *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return place(ctx, phys, size, 0, pool, out);
}

int cu_mem_lookup(CUdeviceptr p, struct CUmemPoolHandle_st **pool, uint64_t *bytes, int *phys)
{
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)p);
    int found = i < nallocs && allocs[i].base == (uintptr_t)p;
    if (found && allocs[i].graph) {
        *pool = NULL;
        *bytes = 0;
        *phys = allocs[i].phys;
    } else if (found) {
        *pool = allocs[i].pool;
        *bytes = allocs[i].pool ? allocs[i].pool_bytes : allocs[i].charged;
        *phys = allocs[i].phys;
    }
    pthread_mutex_unlock(&mem_mu);
    return found;
}

CUresult cu_mem_free(CUdeviceptr p)
{
    return dev_free(p);
}

int cu_mem_range_of(uintptr_t p, uintptr_t *base, size_t *size)
{
    pthread_mutex_lock(&mem_mu);
    size_t i = find(p + 1); /* first base > p */
    int ok = i > 0 && p < allocs[i - 1].base + allocs[i - 1].size;
    if (ok) {
        *base = allocs[i - 1].base;
        *size = allocs[i - 1].size;
    }
    pthread_mutex_unlock(&mem_mu);
    return ok ? 0 : -1;
}

int cu_mem_range_ok(uintptr_t p, size_t len)
{
    if (len == 0)
        return 0;
    if (p + len < p)
        return -1;
    pthread_mutex_lock(&mem_mu);
    size_t i = find(p + 1); /* first base > p */
    int ok = i > 0 && p + len <= allocs[i - 1].base + allocs[i - 1].size;
    pthread_mutex_unlock(&mem_mu);
    return ok ? 0 : cu_vmm_range_ok(p, len);
}

/* The word [p, p + len) as every process names it (stream memory operations, memop.c): in an
 * exported allocation its memfd's inode and offset, in an imported one the exporter's, else
 * *ino 0 (this process's own memory, VMM mappings included).  -1: not device memory. */
int cu_mem_word(uintptr_t p, size_t len, uint64_t *ino, uint64_t *off)
{
    *ino = *off = 0;
    pthread_mutex_lock(&mem_mu);
    size_t i = find(p + 1); /* first base > p */
    const struct alloc *a = i > 0 && p + len <= allocs[i - 1].base + allocs[i - 1].size ? &allocs[i - 1] : NULL;
    if (a && a->share_fd) {
        *ino = a->share_ino;
        *off = p - a->share_base;
    } else if (a && a->import_ino) {
        *ino = a->import_ino;
        *off = p - a->map_base;
    }
    pthread_mutex_unlock(&mem_mu);
    return a || cu_vmm_range_ok(p, len) == 0 ? 0 : -1;
}

/* ---- IPC (ipc.c calls these) ------------------------------------------------------------ */

#define PAGE ((uintptr_t)4096)

/* Under mem_mu: 1 when a live shared allocation other than self covers part of [lo, hi). */
static int share_overlaps(const struct alloc *self, uintptr_t lo, uintptr_t hi)
{
    for (size_t j = 0; j < nallocs; j++) {
        const struct alloc *o = &allocs[j];
        if (o != self && o->share_fd && o->share_base < hi && o->share_base + o->share_len > lo)
            return 1;
    }
    return 0;
}

/* Copies the pages of [lo, lo+len) that hold data (resident ones) into fd at offset 0. */
static int copy_resident(int fd, uintptr_t lo, size_t len)
{
    size_t n = len / PAGE;
    unsigned char *vec = malloc(n);
    if (!vec)
        return -1;
    int all = mincore((void *)lo, len, vec) < 0;
    int rc = 0;
    for (size_t k = 0; k < n && rc == 0;) {
        if (!all && !(vec[k] & 1)) {
            k++;
            continue;
        }
        size_t run = 1;
        while (k + run < n && (all || (vec[k + run] & 1)))
            run++;
        const char *src = (const char *)(lo + k * PAGE);
        size_t left = run * PAGE;
        off_t at = (off_t)(k * PAGE);
        while (left > 0) {
            ssize_t w = pwrite(fd, src, left, at);
            if (w <= 0) {
                rc = -1;
                break;
            }
            src += w;
            at += w;
            left -= (size_t)w;
        }
        k += run;
    }
    free(vec);
    return rc;
}

/* Under mem_mu: moves a's pages (whole pages around it) onto a memfd of their own, data kept. */
static CUresult share_locked(struct alloc *a)
{
    uintptr_t lo = a->base & ~(PAGE - 1), hi = (a->base + a->size + PAGE - 1) & ~(PAGE - 1);
    if (share_overlaps(a, lo, hi)) {
        sim_log("cuIpcGetMemHandle: %#lx shares a page with another exported allocation: "
                "CUDA_ERROR_NOT_SUPPORTED (allocate 4 KiB or more)", (unsigned long)a->base);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int fd = memfd_create("simgpu-ipc", MFD_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)(hi - lo)) < 0 || copy_resident(fd, lo, hi - lo) < 0 ||
        fstat(fd, &sb) < 0 ||
        mmap((void *)lo, hi - lo, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
            MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->share_fd = fd + 1;
    a->share_ino = (uint64_t)sb.st_ino;
    a->share_base = lo;
    a->share_len = hi - lo;
    return CUDA_SUCCESS;
}

CUresult cu_mem_share(CUdeviceptr p, struct cu_ipc_share *out)
{
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)p);
    struct alloc *a = i < nallocs && allocs[i].base == (uintptr_t)p ? &allocs[i] : NULL;
    /* cuMemAlloc memory, or an exportable pool's: graph and imported memory are not shared. */
    int pooled_ok = a && a->pool && (a->pool->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUresult r = !a || (a->pool && !pooled_ok) || a->graph || a->import_refs ? CUDA_ERROR_INVALID_VALUE
                 : a->share_fd                                               ? CUDA_SUCCESS
                                                                             : share_locked(a);
    if (r == CUDA_SUCCESS)
        *out = (struct cu_ipc_share){.fd = a->share_fd - 1,
                                     .ino = a->share_ino,
                                     .off = a->base - a->share_base,
                                     .len = a->share_len,
                                     .size = a->size,
                                     .charge = a->pool ? a->pool_bytes : a->charged,
                                     .phys = a->phys};
    pthread_mutex_unlock(&mem_mu);
    return r;
}

CUresult cu_mem_import(struct CUctx_st *ctx, int fd, const struct cu_ipc_share *sh, CUdeviceptr *out)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mem_mu);
    for (size_t i = 0; i < nallocs && !sh->freeable; i++) {
        if (allocs[i].import_refs && !allocs[i].import_freeable && allocs[i].import_ino == sh->ino &&
            allocs[i].ctx == ctx) {
            allocs[i].import_refs++; /* opened again by this context: the same pointer */
            *out = (CUdeviceptr)allocs[i].base;
            pthread_mutex_unlock(&mem_mu);
            return CUDA_SUCCESS;
        }
    }
    /* Charged to the importer too: the driver keeps the memory for it after the exporter's
     * free (undefined behaviour to rely on, but no cheaper than that here). */
    struct sim_err e = {0};
    if (sim_charge(&e, cu_g.st, sh->phys, sh->charge) < 0) {
        pthread_mutex_unlock(&mem_mu);
        return cu_result(&e);
    }
    uintptr_t m = 0;
    if (arena_take(&va, sh->len, CU_GRANULARITY, &m) != 0 &&
        (grow(sh->len + CU_GRANULARITY) != 0 || arena_take(&va, sh->len, CU_GRANULARITY, &m) != 0))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (mmap((void *)m, sh->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
             MAP_FAILED)
        r = CUDA_ERROR_MAP_FAILED;
    else if (insert_locked(&(struct alloc){.base = m + sh->off,
                                          .size = sh->size,
                                          .charged = sh->charge,
                                          .phys = sh->phys,
                                          .ctx = ctx,
                                          .import_ino = sh->ino,
                                          .import_refs = 1,
                                          .import_freeable = sh->freeable,
                                          .map_base = m,
                                          .map_len = sh->len}) < 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r && m) {
        unshare_pages(m, sh->len);
        arena_give(&va, m, sh->len);
    }
    pthread_mutex_unlock(&mem_mu);
    if (r)
        sim_uncharge(cu_g.st, sh->phys, sh->charge);
    else
        *out = (CUdeviceptr)(m + sh->off);
    return r;
}

CUresult cu_mem_unimport(CUdeviceptr p)
{
    struct alloc a = {0};
    pthread_mutex_lock(&mem_mu);
    size_t i = find((uintptr_t)p);
    int found = i < nallocs && allocs[i].base == (uintptr_t)p && allocs[i].import_refs &&
                !allocs[i].import_freeable;
    int last = found && --allocs[i].import_refs == 0;
    if (last)
        drop_locked(i, &a);
    pthread_mutex_unlock(&mem_mu);
    if (last)
        ended(&a);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cu_mem_reserve(struct CUctx_st *ctx, size_t size, CUdeviceptr *out)
{
    return dev_alloc(ctx, ctx->phys, size, size, out);
}

/* ---- allocation entry points -------------------------------------------------------------- */

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    return dev_alloc(c, c->phys, bytesize, bytesize, dptr);
}

SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                       size_t height, unsigned int elementSizeBytes)
{
    if (!dptr || !pitch || !widthInBytes || !height ||
        (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    const size_t align = cu_g.st->cfg.pitch_alignment;
    size_t p = (widthInBytes + align - 1) & ~(align - 1);
    if (height > (1ull << 46) / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = dev_alloc(c, c->phys, p * height, p * height, dptr);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    /* Managed memory is charged to the device as if it were resident there. */
    return dev_alloc(c, c->phys, bytesize, bytesize, dptr);
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS; /* like free(NULL) */
    return dev_free(dptr);
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct sim_err e = {0};
    struct sim_state *st = cu_g.st;
    /* A query: show what dead processes held as free. */
    if (sim_reap(&e, st, 0) < 0 || sim_lock(&e, st) < 0)
        return cu_result(&e);
    uint64_t used = st->gpu[c->phys].used, cap = st->cfg.memory_bytes;
    sim_unlock(st);
    *total = (size_t)cap;
    *free_bytes = (size_t)(cap > used ? cap - used : 0);
    return CUDA_SUCCESS;
}
