/*
 * Page-locked host memory, as the Driver API reference documents it:
 *   - cuMemHostAlloc / cuMemAllocHost allocate it (flags PORTABLE, DEVICEMAP, WRITECOMBINED),
 *     cuMemFreeHost frees it (a pointer it did not allocate: CUDA_ERROR_INVALID_VALUE);
 *   - cuMemHostRegister page-locks a range the program already has (flags PORTABLE, DEVICEMAP,
 *     READ_ONLY; IOMEMORY, which needs a device's I/O memory, is CUDA_ERROR_NOT_SUPPORTED here);
 *     a range that overlaps one already page-locked is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
 *     one not mapped in the process CUDA_ERROR_INVALID_VALUE; cuMemHostUnregister takes the base
 *     of a registered range (anything else: CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
 *   - cuMemHostGetDevicePointer gives the device's address of a page-locked byte, which with
 *     unified addressing is the host address; cuMemHostGetFlags the range's flags.
 * Nothing is locked or charged: it is ordinary host memory, and the device reads it at the same
 * address (copies, stream memory operations: memop.c asks cu_host_range).  The ranges are the
 * process's, not a context's, and outlive the context that made them.  A registered range inside
 * one shared mapping of a file (MAP_SHARED: a region every tenant maps, /dev/shm) is the same
 * memory in every process that registers it: its words are named by the file and the offset
 * (cu_host_file), so one process's stream write meets another's stream wait, as on a GPU that
 * reaches the same physical pages through either mapping.
 */
#include "cu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define HOST_ALLOC_FLAGS 0xfu   /* PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4, (8: reserved, taken) */
#define REGISTER_PORTABLE 0x1u
#define REGISTER_DEVICEMAP 0x2u
#define REGISTER_IOMEMORY 0x4u
#define REGISTER_READ_ONLY 0x8u

struct host_range {
    uintptr_t base;
    size_t size;
    unsigned flags;
    int registered; /* 1: cuMemHostRegister (the program's memory), 0: cuMemHostAlloc (ours) */
    uint64_t file;  /* a shared mapping of a file: its name for words (cu_host_file); 0: none */
    uint64_t file_off; /* the file offset of base */
};

static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_range *ranges; /* [host_mu] unordered: a process has few */
static size_t nranges, capranges;

/* [host_mu] The range holding byte p, or NULL. */
static struct host_range *holding(uintptr_t p)
{
    for (size_t i = 0; i < nranges; i++)
        if (p >= ranges[i].base && p - ranges[i].base < ranges[i].size)
            return &ranges[i];
    return NULL;
}

/* [host_mu] 1 when [p, p+size) overlaps a range. */
static int overlaps(uintptr_t p, size_t size)
{
    for (size_t i = 0; i < nranges; i++)
        if (p < ranges[i].base + ranges[i].size && ranges[i].base < p + size)
            return 1;
    return 0;
}

/* [host_mu] */
static CUresult add(uintptr_t base, size_t size, unsigned flags, int registered)
{
    if (nranges == capranges) {
        size_t cap = capranges ? capranges * 2 : 8;
        struct host_range *n = realloc(ranges, cap * sizeof(*n));
        if (!n)
            return CUDA_ERROR_OUT_OF_MEMORY;
        ranges = n;
        capranges = cap;
    }
    ranges[nranges++] = (struct host_range){base, size, flags, registered, 0, 0};
    return CUDA_SUCCESS;
}

/* The file [p, p+size) is a shared mapping of, from /proc/self/maps: its name for words (bit 63
 * set, so it never meets the inode of exported device memory; the device and the inode
 * otherwise) and the file offset of p.  0 when the range is not all inside one such mapping. */
static uint64_t shared_file_of(uintptr_t p, size_t size, uint64_t *file_off)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    uint64_t id = 0;
    while (!id && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off, ino;
        unsigned maj, mnr;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu", &lo, &hi, perms, &off, &maj, &mnr, &ino) != 7)
            continue;
        if (p < lo || p >= hi)
            continue;
        if (perms[3] == 's' && ino && p + size <= hi) {
            id = 1ull << 63 | (((uint64_t)maj << 52) ^ ((uint64_t)mnr << 40) ^ (uint64_t)ino);
            *file_off = off + (p - lo);
        }
        break;
    }
    fclose(f);
    return id;
}

int cu_host_file(uintptr_t p, uint64_t *file, uint64_t *off)
{
    pthread_mutex_lock(&host_mu);
    const struct host_range *r = holding(p);
    int ok = r && r->file;
    if (ok) {
        *file = r->file;
        *off = r->file_off + (p - r->base);
    }
    pthread_mutex_unlock(&host_mu);
    return ok ? 0 : -1;
}

/* Forgets the range whose base is p and that was made the `registered` way: 0, or -1 when
 * there is none. */
static int forget(const void *p, int registered)
{
    int found = -1;
    pthread_mutex_lock(&host_mu);
    for (size_t i = 0; p && i < nranges && found < 0; i++) {
        if (ranges[i].base == (uintptr_t)p && ranges[i].registered == registered) {
            ranges[i] = ranges[--nranges];
            found = 0;
        }
    }
    pthread_mutex_unlock(&host_mu);
    return found;
}

/* 1 when every page of [p, p+size) is mapped in this process (msync: ENOMEM for a hole). */
static int mapped(uintptr_t p, size_t size)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = p & ~(page - 1), hi = (p + size + page - 1) & ~(page - 1);
    return msync((void *)lo, hi - lo, MS_ASYNC) == 0 || errno != ENOMEM;
}

int cu_host_range(uintptr_t p, size_t len, int *read_only)
{
    pthread_mutex_lock(&host_mu);
    const struct host_range *r = holding(p);
    int ok = r && len <= r->size - (p - r->base);
    if (ok && read_only)
        *read_only = r->registered && (r->flags & REGISTER_READ_ONLY);
    pthread_mutex_unlock(&host_mu);
    return ok ? 0 : -1;
}

void cu_host_fork_child(void)
{
    pthread_mutex_init(&host_mu, NULL);
}

SIM_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    if (!pp || !bytesize || (flags & ~HOST_ALLOC_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&host_mu);
    r = add((uintptr_t)p, bytesize, flags, 0);
    pthread_mutex_unlock(&host_mu);
    if (r) {
        free(p);
        return r;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

SIM_EXPORT CUresult cuMemFreeHost(void *p)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (forget(p, 0) < 0)
        return CUDA_ERROR_INVALID_VALUE; /* not ours to free: never free() it */
    free(p);
    return CUDA_SUCCESS;
}

static CUresult host_register(void *p, size_t bytesize, unsigned flags)
{
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    if (!p || !bytesize || (flags & ~(REGISTER_PORTABLE | REGISTER_DEVICEMAP | REGISTER_IOMEMORY |
                                      REGISTER_READ_ONLY)))
        return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)p + bytesize < (uintptr_t)p)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & REGISTER_IOMEMORY)
        return CUDA_ERROR_NOT_SUPPORTED; /* no device I/O memory to map here */
    if (!mapped((uintptr_t)p, bytesize))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t file_off = 0, file = shared_file_of((uintptr_t)p, bytesize, &file_off);
    pthread_mutex_lock(&host_mu);
    r = overlaps((uintptr_t)p, bytesize) ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
                                         : add((uintptr_t)p, bytesize, flags, 1);
    if (!r) {
        ranges[nranges - 1].file = file;
        ranges[nranges - 1].file_off = file_off;
    }
    pthread_mutex_unlock(&host_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

SIM_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

SIM_EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return forget(p, 1) < 0 ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    if (!pFlags || !p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    pthread_mutex_lock(&host_mu);
    const struct host_range *h = holding((uintptr_t)p);
    if (h)
        *pFlags = h->flags;
    pthread_mutex_unlock(&host_mu);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* With unified addressing the device sees page-locked host memory at the same address. */
SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    if (!pdptr || !p || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (cu_host_range((uintptr_t)p, 1, NULL) < 0)
        return CUDA_ERROR_INVALID_VALUE; /* not page-locked: the device cannot reach it */
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
