/*
 * Memory shared between processes, as the Driver API reference documents it.
 *
 * Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle):
 *   - a handle names a cuMemAlloc allocation by its base (pool, VMM and graph memory have none);
 *   - another process opens it into its current context; a second open by the same context
 *     returns the same pointer and counts a reference, each open needs its close;
 *   - the opened pointer is closed with cuIpcCloseMemHandle, never cuMemFree.
 * Pool IPC (cuMemPoolExportToShareableHandle / ImportFromShareableHandle, cuMemPoolExportPointer /
 * ImportPointer):
 *   - a pool created with the POSIX descriptor handle type is exported as a descriptor; the
 *     imported pool allocates nothing, it only imports that pool's pointers;
 *   - each imported pointer is freed with cuMemFree or cuMemFreeAsync in the importer.
 *
 * Here the exported allocation's pages move onto a memfd of their own (memory.c), and the handle
 * carries the exporter's pid, the descriptor number and the memfd's inode (a pool's descriptor is
 * a memfd of its own, named "simgpu-pool", its inode the pool's identity); the importer opens
 * /proc/<pid>/fd/<fd> and checks the inode (a freed allocation, or an exporter gone, is
 * CUDA_ERROR_INVALID_HANDLE), then maps it MAP_SHARED: both processes see the same bytes.
 *
 * Charge: the importer is charged the allocation as well, until its last close (or free).  The reference
 * calls an exporter's cuMemFree before the importer's close undefined; a driver may keep the
 * memory alive for the importer, so the simulator does (it is never more forgiving than a
 * driver: an interposer that charges nothing for an import is caught here).
 */
#include "cu.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define IPC_MAGIC "SGIPC1"
#define POOL_PTR_MAGIC "SGPOOL1"
#define POOL_MEMFD "simgpu-pool"
#define IPC_MEMFD "simgpu-ipc" /* memory.c names an exported allocation's memfd so */

/* The 64 bytes of a CUipcMemHandle or a CUmemPoolPtrExportData.  The importer trusts none of
 * it for the charge: what it maps and pays for is the memfd's size, as the kernel reports it. */
struct ipc_wire {
    char magic[8];
    int32_t pid;
    int32_t fd;
    uint64_t ino;
    uint64_t off;
    uint64_t pool_ino; /* a pool pointer's: its pool's identity */
    int32_t phys;
    char pad[20];
};
_Static_assert(sizeof(struct ipc_wire) == sizeof(CUipcMemHandle), "an IPC handle is 64 bytes");
_Static_assert(sizeof(struct ipc_wire) == sizeof(CUmemPoolPtrExportData), "export data is 64 bytes");

static pthread_mutex_t pool_id_mu = PTHREAD_MUTEX_INITIALIZER;

/* The export of ptr (an allocation's base) in the wire format. */
static CUresult export_wire(CUdeviceptr ptr, const char *magic, uint64_t pool_ino, struct ipc_wire *w)
{
    struct cu_ipc_share sh;
    CUresult r = cu_mem_share(ptr, &sh);
    if (r)
        return r;
    *w = (struct ipc_wire){.pid = (int32_t)getpid(),
                           .fd = sh.fd,
                           .ino = sh.ino,
                           .off = sh.off,
                           .pool_ino = pool_ino,
                           .phys = sh.phys};
    memcpy(w->magic, magic, strlen(magic) + 1);
    return CUDA_SUCCESS;
}

/* Opens w's memfd through /proc and maps it for the current context. */
static CUresult import_wire(const struct ipc_wire *w, const char *magic, int freeable, CUdeviceptr *out)
{
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    if (memcmp(w->magic, magic, strlen(magic) + 1) != 0 || w->phys < 0 ||
        w->phys >= (int32_t)cu_g.st->cfg.gpus)
        return CUDA_ERROR_INVALID_HANDLE;
    if (w->pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* a process does not open its own exports */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w->pid, (int)w->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE; /* freed, or its exporter is gone */
    char self[64], target[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(self, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = 0;
    /* Only an exported allocation's memfd, whole: never another file the caller can open. */
    if (strncmp(target, "/memfd:" IPC_MEMFD " ", strlen("/memfd:" IPC_MEMFD " ")) != 0 ||
        fstat(fd, &sb) < 0 || (uint64_t)sb.st_ino != w->ino || w->off >= (uint64_t)sb.st_size) {
        close(fd);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint64_t size = (uint64_t)sb.st_size - w->off;
    struct cu_ipc_share sh = {.fd = w->fd,
                              .ino = w->ino,
                              .off = w->off,
                              .len = (uint64_t)sb.st_size,
                              .size = size,
                              .charge = size,
                              .phys = w->phys,
                              .freeable = freeable};
    r = cu_mem_import(c, fd, &sh, out);
    close(fd); /* the mapping holds the memfd */
    return r;
}

/* The pool of the allocation that starts at p, or NULL (not a pool allocation's base). */
static struct CUmemPoolHandle_st *pool_of(CUdeviceptr p)
{
    struct CUmemPoolHandle_st *pool = NULL;
    uint64_t bytes;
    int phys;
    return cu_mem_lookup(p, &pool, &bytes, &phys) ? pool : NULL;
}

/* ---- legacy IPC ------------------------------------------------------------------------------ */

SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (pool_of(dptr))
        return CUDA_ERROR_INVALID_VALUE; /* pool memory is exported with cuMemPoolExportPointer */
    struct ipc_wire w;
    r = export_wire(dptr, IPC_MAGIC, 0, &w);
    if (!r)
        memcpy(pHandle, &w, sizeof(w));
    return r;
}

static CUresult ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, unsigned int flags)
{
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    struct ipc_wire w;
    memcpy(&w, handle, sizeof(w));
    return import_wire(&w, IPC_MAGIC, 0, pdptr);
}

SIM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, &handle, Flags);
}

SIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                          unsigned int Flags)
{
    return ipc_open(pdptr, &handle, Flags);
}

SIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return cu_mem_unimport(dptr);
}

/* ---- pool IPC -------------------------------------------------------------------------------- */

/* The exportable pool's identity: a small memfd made at its first export, holding its GPU. */
static CUresult pool_identity(struct CUmemPoolHandle_st *p, int *fd, uint64_t *ino)
{
    if (!(p->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || p->imported)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_id_mu);
    if (!p->share_fd) {
        int m = memfd_create(POOL_MEMFD, MFD_CLOEXEC);
        struct stat sb;
        int32_t phys = p->phys;
        if (m < 0 || pwrite(m, &phys, sizeof(phys), 0) != (ssize_t)sizeof(phys) || fstat(m, &sb) < 0) {
            if (m >= 0)
                close(m);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            p->share_fd = m + 1;
            p->ino = (uint64_t)sb.st_ino;
        }
    }
    if (!r) {
        *fd = p->share_fd - 1;
        *ino = p->ino;
    }
    pthread_mutex_unlock(&pool_id_mu);
    return r;
}

SIM_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                     CUmemAllocationHandleType handleType,
                                                     unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!handle_out || flags || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !pool ||
        pool->magic != POOL_MAGIC || pool->dead)
        return CUDA_ERROR_INVALID_VALUE;
    int fd;
    uint64_t ino;
    r = pool_identity(pool, &fd, &ino);
    if (r)
        return r;
    int out = dup(fd); /* the caller's to pass on and close */
    if (out < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)handle_out = out;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                       CUmemAllocationHandleType handleType,
                                                       unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!pool_out || flags || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)handle;
    char path[64], target[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    struct stat sb;
    int32_t phys = -1;
    if (n <= 0 || fstat(fd, &sb) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    target[n] = 0;
    if (strncmp(target, "/memfd:" POOL_MEMFD " ", strlen("/memfd:" POOL_MEMFD " ")) != 0 ||
        pread(fd, &phys, sizeof(phys), 0) != (ssize_t)sizeof(phys) || phys < 0 ||
        phys >= (int32_t)cu_g.st->cfg.gpus)
        return CUDA_ERROR_INVALID_VALUE; /* not a pool's descriptor */
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->ordinal = -1; /* it allocates nothing, on no device of ours */
    p->phys = phys;
    p->imported = 1;
    p->ino = (uint64_t)sb.st_ino;
    p->magic = POOL_MAGIC;
    *pool_out = p;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    if (!shareData_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    struct CUmemPoolHandle_st *pool = pool_of(ptr);
    int fd;
    uint64_t pool_ino;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE; /* not a pool allocation's base */
    r = pool_identity(pool, &fd, &pool_ino);
    struct ipc_wire w;
    if (!r)
        r = export_wire(ptr, POOL_PTR_MAGIC, pool_ino, &w);
    if (!r)
        memcpy(shareData_out, &w, sizeof(w));
    return r;
}

SIM_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                           CUmemPoolPtrExportData *shareData)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!ptr_out || !shareData || !pool || pool->magic != POOL_MAGIC || pool->dead || !pool->imported)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_wire w;
    memcpy(&w, shareData, sizeof(w));
    if (w.pool_ino != pool->ino)
        return CUDA_ERROR_INVALID_VALUE; /* a pointer of another pool */
    return import_wire(&w, POOL_PTR_MAGIC, 1, ptr_out);
}
