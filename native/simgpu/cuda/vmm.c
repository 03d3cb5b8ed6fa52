/*
 * Virtual memory management (cuMemCreate / AddressReserve / Map / SetAccess ...).
 *
 * Physical allocations live in ONE memfd per process, carved by the arena allocator (one fd in
 * total, whatever the number of handles; released ranges get their pages punched out).  A
 * reservation is a PROT_NONE MAP_NORESERVE anonymous mapping; cuMemMap maps the memfd range over
 * it MAP_SHARED|MAP_FIXED (still PROT_NONE) and cuMemSetAccess mprotects it, so two mappings of
 * one handle really share data.  A handle is charged at cuMemCreate and uncharged once it is both
 * released and unmapped everywhere, as the real driver frees it.
 *
 * References, as the driver documents them: cuMemCreate and cuMemImportFromShareableHandle give a
 * handle one reference, cuMemRetainAllocationHandle(addr) one more to the handle mapped at addr
 * (the same handle value, even after its last reference was released while still mapped); each
 * needs its own cuMemRelease, and a release past the last is CUDA_ERROR_INVALID_VALUE.
 *
 * Sharing between processes: a handle created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR gets
 * a memfd of its own (named "simgpu-vmm:gpu<N>", sealed against resizing); exporting it gives a
 * new file descriptor of that memfd, and importing one (received over a Unix socket, or through
 * pidfd_getfd) makes a handle whose mappings share the exporter's pages.  As the driver, the
 * memory lives while any handle or mapping of it lives: an import of our own export in the same
 * process is the same allocation (one charge, ended by the last handle and mapping of either);
 * an import of another process's is charged to the importer too, until it has released and
 * unmapped it, so memory that outlives its creator's handles never leaves the card's count (it
 * is counted twice while both hold it: a difference that only makes the card look fuller).  A
 * descriptor that is not such a memfd is refused with CUDA_ERROR_INVALID_VALUE.
 */
#include "cu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BACKING_BYTES (1ull << 44) /* sparse: costs nothing until written */

struct vmm_handle {
    int phys;
    int refs;         /* live mappings */
    int hrefs;        /* references: creation or import, plus each cuMemRetainAllocationHandle */
    int released;     /* hrefs reached 0 */
    int fd;           /* an exportable or imported handle's own memfd, else -1 (shared backing) */
    int imported;     /* memory created elsewhere: charged here only if another process's */
    int sharers;      /* live handles imported from this one's export in this process */
    struct vmm_handle *origin; /* an import of our own export: the handle it shares */
    uint64_t off;     /* in the memfd */
    size_t size;
};

#define EXPORT_NAME "simgpu-vmm:gpu"

struct vmm_res {
    uintptr_t base;
    size_t size;
};

struct vmm_map {
    uintptr_t base;
    size_t size;
    struct vmm_handle *h;
    int prot;
};

static pthread_mutex_t vmm_mu = PTHREAD_MUTEX_INITIALIZER;
static int memfd = -1;            /* [vmm_mu] */
static struct arena backing;      /* [vmm_mu] free offsets in memfd */
/* [vmm_mu] small tables, linear scans: VMM users keep few, large objects. */
static struct vmm_handle **handles;
static size_t nhandles, caphandles;
static struct vmm_res *res;
static size_t nres, capres;
static struct vmm_map *maps;
static size_t nmaps, capmaps;

void cu_vmm_fork_child(void)
{
    pthread_mutex_init(&vmm_mu, NULL);
    if (memfd >= 0)
        close(memfd); /* the parent's backing: the child gets its own on first use */
    memfd = -1;
    backing.n = 0;
    nhandles = nres = nmaps = 0;
}

static int grow_array(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, c * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

static int backing_open(void)
{
    if (memfd >= 0)
        return 0;
    int fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    uint64_t size = BACKING_BYTES;
    while (ftruncate(fd, (off_t)size) < 0 && size > (1ull << 30))
        size /= 2;
    if (arena_give(&backing, 0, size) < 0) {
        close(fd);
        return -1;
    }
    memfd = fd;
    return 0;
}

static struct vmm_handle *handle_find(CUmemGenericAllocationHandle hv, size_t *idx)
{
    for (size_t i = 0; i < nhandles; i++)
        if ((uintptr_t)handles[i] == (uintptr_t)hv) {
            if (idx)
                *idx = i;
            return handles[i];
        }
    return NULL;
}

/* Under vmm_mu: frees the handle if released, unmapped and shared by no import of it; returns
 * the bytes to uncharge.  The last import of our own export to go takes its origin with it. */
static uint64_t handle_maybe_destroy(struct vmm_handle *h, int *phys)
{
    if (!h->released || h->refs > 0 || h->sharers > 0)
        return 0;
    size_t idx;
    if (!handle_find((CUmemGenericAllocationHandle)(uintptr_t)h, &idx))
        return 0;
    handles[idx] = handles[--nhandles];
    if (h->fd >= 0) {
        close(h->fd); /* the pages live on while another process maps or holds them */
    } else {
        fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->off, (off_t)h->size);
        arena_give(&backing, h->off, h->size);
    }
    struct vmm_handle *origin = h->origin;
    uint64_t b = h->origin ? 0 : h->size; /* an import of another process's: charged at import */
    *phys = h->phys;
    free(h);
    if (origin) {
        origin->sharers--;
        b = handle_maybe_destroy(origin, phys);
    }
    return b;
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *phys)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    *phys = cu_phys(prop->location.id);
    return *phys < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    int phys;
    r = check_prop(prop, &phys);
    if (r)
        return r;
    *granularity = CU_GRANULARITY;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || flags || size == 0 || size % CU_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    int phys;
    r = check_prop(prop, &phys);
    if (r)
        return r;
    if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* Win32, fabric: not on this (Linux) model */
    int own_fd = -1;
    if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        char name[32];
        snprintf(name, sizeof(name), EXPORT_NAME "%d", phys);
        own_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (own_fd < 0 || ftruncate(own_fd, (off_t)size) < 0 ||
            fcntl(own_fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
            if (own_fd >= 0)
                close(own_fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct sim_err e = {0};
    if (sim_charge(&e, cu_g.st, phys, size) < 0) {
        if (own_fd >= 0)
            close(own_fd);
        return cu_result(&e);
    }
    struct vmm_handle *h = calloc(1, sizeof(*h));
    uintptr_t off = 0;
    pthread_mutex_lock(&vmm_mu);
    int ok = h && grow_array((void **)&handles, &caphandles, nhandles, sizeof(*handles)) == 0 &&
             (own_fd >= 0 ||
              (backing_open() == 0 && arena_take(&backing, size, CU_GRANULARITY, &off) == 0));
    if (ok) {
        h->phys = phys;
        h->hrefs = 1;
        h->fd = own_fd;
        h->off = off;
        h->size = size;
        handles[nhandles++] = h;
    }
    pthread_mutex_unlock(&vmm_mu);
    if (!ok) {
        if (own_fd >= 0)
            close(own_fd);
        free(h);
        sim_uncharge(cu_g.st, phys, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    int phys = -1;
    uint64_t freed = 0;
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *h = handle_find(handle, NULL);
    if (!h || h->released) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (--h->hrefs == 0) {
        h->released = 1;
        freed = handle_maybe_destroy(h, &phys);
    }
    pthread_mutex_unlock(&vmm_mu);
    if (freed)
        sim_uncharge(cu_g.st, phys, freed);
    return r;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags)
{
    if (!ptr || flags || size == 0 || size % CU_GRANULARITY ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (alignment < CU_GRANULARITY)
        alignment = CU_GRANULARITY;
    if (size > (1ull << 46) || alignment > (1ull << 40))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t span = size + alignment;
    void *p = mmap((void *)(uintptr_t)addr, span, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + span;
    if (end > base + size)
        munmap((void *)(base + size), end - (base + size));
    pthread_mutex_lock(&vmm_mu);
    int ok = grow_array((void **)&res, &capres, nres, sizeof(*res)) == 0;
    if (ok)
        res[nres++] = (struct vmm_res){.base = base, .size = size};
    pthread_mutex_unlock(&vmm_mu);
    if (!ok) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

/* Bytes freed per device under vmm_mu, given back to the device after it is released: any
 * number of mappings may go in one call (a reservation freed whole, one unmap of many). */
struct freed {
    uint64_t dev[SIM_MAX_GPUS];
};

static void freed_add(struct freed *f, int phys, uint64_t bytes)
{
    if (bytes && phys >= 0 && phys < SIM_MAX_GPUS)
        f->dev[phys] += bytes;
}

static void freed_give_back(const struct freed *f)
{
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (f->dev[d])
            sim_uncharge(cu_g.st, d, f->dev[d]);
}

/* Under vmm_mu: drops maps[i] (the address range is left to the caller). */
static uint64_t map_drop(size_t i, int *phys)
{
    struct vmm_handle *h = maps[i].h;
    maps[i] = maps[--nmaps];
    h->refs--;
    return handle_maybe_destroy(h, phys);
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    struct freed freed = {0};
    pthread_mutex_lock(&vmm_mu);
    size_t i = 0;
    while (i < nres && !(res[i].base == (uintptr_t)ptr && res[i].size == size))
        i++;
    if (i == nres) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* Mappings left inside go with the reservation. */
        for (size_t m = nmaps; m-- > 0;) {
            if (maps[m].base >= (uintptr_t)ptr && maps[m].base < (uintptr_t)ptr + size) {
                int p = -1;
                uint64_t b = map_drop(m, &p);
                freed_add(&freed, p, b);
            }
        }
        munmap((void *)(uintptr_t)ptr, size);
        res[i] = res[--nres];
    }
    pthread_mutex_unlock(&vmm_mu);
    freed_give_back(&freed);
    return r;
}

static int inside_reservation(uintptr_t p, size_t size)
{
    for (size_t i = 0; i < nres; i++)
        if (p >= res[i].base && p + size <= res[i].base + res[i].size)
            return 1;
    return 0;
}

static int overlaps_map(uintptr_t p, size_t size)
{
    for (size_t i = 0; i < nmaps; i++)
        if (p < maps[i].base + maps[i].size && maps[i].base < p + size)
            return 1;
    return 0;
}

SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (flags || size == 0 || size % CU_GRANULARITY || offset % CU_GRANULARITY ||
        ptr % CU_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *h = handle_find(handle, NULL);
    if (!h || h->released || offset > h->size || size > h->size - offset ||
        !inside_reservation((uintptr_t)ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (overlaps_map((uintptr_t)ptr, size)) {
        r = CUDA_ERROR_ALREADY_MAPPED;
    } else if (grow_array((void **)&maps, &capmaps, nmaps, sizeof(*maps)) < 0) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                    h->fd >= 0 ? h->fd : memfd, (off_t)(h->off + offset)) == MAP_FAILED) {
        r = CUDA_ERROR_MAP_FAILED;
    } else {
        maps[nmaps++] = (struct vmm_map){.base = (uintptr_t)ptr, .size = size, .h = h};
        h->refs++;
    }
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    uintptr_t a = (uintptr_t)ptr, b = a + size;
    struct freed freed = {0};
    size_t found = 0;
    pthread_mutex_lock(&vmm_mu);
    for (size_t i = 0; i < nmaps; i++) {
        if (maps[i].base < b && a < maps[i].base + maps[i].size) {
            if (maps[i].base < a || maps[i].base + maps[i].size > b) {
                r = CUDA_ERROR_INVALID_VALUE; /* would split a mapping */
                break;
            }
            found++;
        }
    }
    if (!r && !found)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        for (size_t i = nmaps; i-- > 0;) {
            if (maps[i].base >= a && maps[i].base < b) {
                /* Back to a reservation: PROT_NONE anonymous over the same range. */
                mmap((void *)maps[i].base, maps[i].size, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
                int p = -1;
                uint64_t bytes = map_drop(i, &p); /* sets p: before it is read */
                freed_add(&freed, p, bytes);
            }
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    freed_give_back(&freed);
    return r;
}

/* One more reference to the handle mapped at addr (any address inside a mapping): the handle
 * value that was mapped, alive again if its references were all released while mapped. */
SIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    uintptr_t a = (uintptr_t)addr;
    pthread_mutex_lock(&vmm_mu);
    size_t i = 0;
    while (i < nmaps && !(maps[i].base <= a && a < maps[i].base + maps[i].size))
        i++;
    if (i == nmaps) {
        r = CUDA_ERROR_INVALID_VALUE; /* not mapped */
    } else {
        struct vmm_handle *h = maps[i].h;
        h->hrefs++;
        h->released = 0;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    }
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

/* The properties a handle was made with: pinned, on its device (the visible ordinal of its GPU),
 * with the POSIX descriptor handle type when it has a memfd of its own. */
SIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                           CUmemGenericAllocationHandle handle)
{
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *h = handle_find(handle, NULL);
    int phys = h && !h->released ? h->phys : -1, fd = h ? h->fd : -1;
    pthread_mutex_unlock(&vmm_mu);
    if (phys < 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = 0;
    while (dev < cu_g.nvis && cu_g.vis[dev] != phys)
        dev++;
    if (dev == cu_g.nvis)
        return CUDA_ERROR_INVALID_DEVICE; /* imported from a GPU this process does not see */
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = fd >= 0 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                         : CU_MEM_HANDLE_TYPE_NONE;
    return CUDA_SUCCESS;
}

/* Under vmm_mu: is [a, b) covered by mappings without a gap? */
static int covered(uintptr_t a, uintptr_t b, int need_prot)
{
    uintptr_t cur = a;
    while (cur < b) {
        size_t i = 0;
        while (i < nmaps && !(maps[i].base <= cur && cur < maps[i].base + maps[i].size &&
                              (maps[i].prot & need_prot) == need_prot))
            i++;
        if (i == nmaps)
            return 0;
        cur = maps[i].base + maps[i].size;
    }
    return 1;
}

SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            cu_phys(desc[i].location.id) < 0)
            return CUDA_ERROR_INVALID_DEVICE;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ: prot |= PROT_READ; break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: prot |= PROT_READ | PROT_WRITE; break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    uintptr_t a = (uintptr_t)ptr, b = a + size;
    pthread_mutex_lock(&vmm_mu);
    if (!covered(a, b, 0)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (mprotect((void *)a, size, prot) < 0) {
        r = CUDA_ERROR_OPERATING_SYSTEM;
    } else {
        for (size_t i = 0; i < nmaps; i++)
            if (maps[i].base >= a && maps[i].base < b)
                maps[i].prot = prot;
    }
    pthread_mutex_unlock(&vmm_mu);
    return r;
}

int cu_vmm_range_ok(uintptr_t p, size_t len)
{
    pthread_mutex_lock(&vmm_mu);
    int ok = covered(p, p + len, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&vmm_mu);
    return ok ? 0 : -1;
}

/* ---- sharing between processes ------------------------------------------------------------ */

SIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                 CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags)
{
    if (!shareableHandle || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *h = handle_find(handle, NULL);
    int fd = -1;
    if (!h || h->released || h->fd < 0)
        r = CUDA_ERROR_INVALID_VALUE; /* not created with the POSIX descriptor handle type */
    else if ((fd = dup(h->fd)) < 0)
        r = CUDA_ERROR_OPERATING_SYSTEM;
    pthread_mutex_unlock(&vmm_mu);
    if (!r)
        *(int *)shareableHandle = fd;
    return r;
}

/* The GPU of a memfd exported by cuMemExportToShareableHandle, -1 if fd is no such memfd. */
static int exported_gpu(int fd, size_t *size)
{
    char link[64], target[128];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n <= 0)
        return -1;
    target[n] = '\0';
    const char *want = "/memfd:" EXPORT_NAME;
    if (strncmp(target, want, strlen(want)) != 0)
        return -1;
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat sb;
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &sb) < 0 || sb.st_size <= 0 ||
        sb.st_size % CU_GRANULARITY)
        return -1;
    *size = (size_t)sb.st_size;
    int phys = atoi(target + strlen(want));
    return phys >= 0 && phys < SIM_MAX_GPUS ? phys : -1;
}

/* Under vmm_mu: the live handle of this process whose export fd is (its memfd), NULL if none. */
static struct vmm_handle *local_origin(int fd)
{
    struct stat want, sb;
    if (fstat(fd, &want) < 0)
        return NULL;
    for (size_t i = 0; i < nhandles; i++) {
        struct vmm_handle *h = handles[i];
        if (h->fd >= 0 && !h->imported && fstat(h->fd, &sb) == 0 && sb.st_dev == want.st_dev &&
            sb.st_ino == want.st_ino)
            return h;
    }
    return NULL;
}

SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                   void *osHandle,
                                                   CUmemAllocationHandleType shHandleType)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle; /* the driver takes the descriptor itself, cast */
    size_t size;
    int phys = exported_gpu(fd, &size);
    if (phys < 0)
        return CUDA_ERROR_INVALID_VALUE;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps (and closes) its descriptor */
    struct vmm_handle *h = calloc(1, sizeof(*h));
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *origin = own >= 0 ? local_origin(own) : NULL;
    int ok = own >= 0 && h &&
             grow_array((void **)&handles, &caphandles, nhandles, sizeof(*handles)) == 0;
    if (ok) {
        *h = (struct vmm_handle){
            .phys = phys, .hrefs = 1, .fd = own, .imported = 1, .size = size, .origin = origin};
        handles[nhandles++] = h;
        if (origin)
            origin->sharers++;
    }
    pthread_mutex_unlock(&vmm_mu);
    struct sim_err e = {0};
    if (ok && !origin && sim_charge(&e, cu_g.st, phys, size) < 0) {
        int p = -1;
        pthread_mutex_lock(&vmm_mu);
        h->released = 1;
        handle_maybe_destroy(h, &p);
        pthread_mutex_unlock(&vmm_mu);
        return cu_result(&e);
    }
    if (!ok) {
        if (own >= 0)
            close(own);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}
