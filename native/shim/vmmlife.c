/*
 * VMM lifetime: physical memory of cuMemCreate lives until every handle of it is released AND
 * its last mapping is unmapped, as the driver frees it.  So the charge follows the allocation,
 * not a handle value:
 *
 * - the documented idiom (create, map, release at once, unmap much later) stays charged while
 *   mapped: cuMemRelease of a handle whose allocation still has mappings keeps its charge here,
 *   and the cuMemUnmap that removes the last mapping credits it;
 * - a second handle of the same allocation (cuMemImportFromShareableHandle of a POSIX descriptor
 *   this process exported) is the same allocation: the charge waits for it too.  An exported
 *   descriptor is known by its file identity (st_dev, st_ino), which the descriptor a program
 *   imports shares with the one we exported, however it was passed or duplicated.
 *
 * Every handle and mapping names an allocation id (never a handle value: the driver may give a
 * released value to a new allocation while the old one lives on through another handle).
 * Handles the shim did not create or import from its own export (another process's memory) have
 * no id and are not charged here: the exporter pays (README, "VMM sharing").
 *
 * Process-local tables, guarded by one mutex (VMM programs keep few, large objects; linear
 * scans).  A forked child maps nothing of its parent's and starts empty.
 */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>

struct handle_id { /* a live handle of an allocation we charged */
    CUmemGenericAllocationHandle handle;
    uint64_t id;
};

struct mapping {
    CUdeviceptr va;
    size_t size;
    uint64_t id; /* 0: a handle we do not account */
};

struct held { /* an allocation whose charged handle is released: its charge waits */
    uint64_t id;
    struct sg_charge charge;
};

struct export_id { /* a descriptor we exported */
    dev_t dev;
    ino_t ino;
    uint64_t id;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1; /* [mu] */
static struct handle_id *hids; /* [mu] */
static size_t nhids, caphids;
static struct mapping *maps; /* [mu] */
static size_t nmaps, capmaps;
static struct held *helds; /* [mu] */
static size_t nhelds, caphelds;
static struct export_id *exps; /* [mu] */
static size_t nexps, capexps;

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(hids);
    free(maps);
    free(helds);
    free(exps);
    hids = NULL;
    maps = NULL;
    helds = NULL;
    exps = NULL;
    nhids = caphids = nmaps = capmaps = nhelds = caphelds = nexps = capexps = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void setup(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

static void lock(void)
{
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
}

int sg_grow(void **arr, size_t *cap, size_t n, size_t elem)
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

/* ---- under mu ---------------------------------------------------------------------------- */

static uint64_t id_of_locked(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; i < nhids; i++)
        if (hids[i].handle == h)
            return hids[i].id;
    return 0;
}

static void add_handle_locked(CUmemGenericAllocationHandle h, uint64_t id)
{
    /* Out of host memory: the handle goes unrecorded, and its allocation may be credited while
     * it lives (the old behaviour), which the agent's audit still bounds. */
    if (sg_grow((void **)&hids, &caphids, nhids, sizeof(*hids)) == 0)
        hids[nhids++] = (struct handle_id){.handle = h, .id = id};
}

static void drop_handle_locked(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; i < nhids; i++)
        if (hids[i].handle == h) {
            hids[i] = hids[--nhids];
            return;
        }
}

/* Does anything still keep allocation id alive: a handle or a mapping? */
static bool alive_locked(uint64_t id)
{
    for (size_t i = 0; i < nhids; i++)
        if (hids[i].id == id)
            return true;
    for (size_t i = 0; i < nmaps; i++)
        if (maps[i].id == id)
            return true;
    return false;
}

/* Charges that came due under mu, credited once it is dropped (the ledger takes its own lock
 * and may wait for it).  As many as one call ends: a cuMemUnmap of a large range can end any
 * number of allocations. */
struct dues {
    struct sg_charge *v;
    size_t n, cap;
};

static void due_locked(struct dues *d, const struct sg_charge *c)
{
    if (sg_grow((void **)&d->v, &d->cap, d->n, sizeof(*d->v)) == 0)
        d->v[d->n++] = *c;
    else
        sg_credit(c); /* out of host memory: credited under mu, slower but never lost */
}

static void dues_credit(struct dues *d)
{
    for (size_t i = 0; i < d->n; i++)
        sg_credit(&d->v[i]);
    free(d->v);
}

/* If allocation id is gone, its held charges come due (and its exports are forgotten). */
static void take_if_dead_locked(uint64_t id, struct dues *d)
{
    if (id == 0 || alive_locked(id))
        return;
    for (size_t i = 0; i < nexps;)
        if (exps[i].id == id)
            exps[i] = exps[--nexps];
        else
            i++;
    for (size_t k = 0; k < nhelds;)
        if (helds[k].id == id) {
            due_locked(d, &helds[k].charge);
            helds[k] = helds[--nhelds];
        } else {
            k++;
        }
}

/* ---- the hooks' side ----------------------------------------------------------------------- */

void sg_vmm_created(CUmemGenericAllocationHandle handle)
{
    lock();
    add_handle_locked(handle, next_id++);
    pthread_mutex_unlock(&mu);
}

void sg_vmm_exported(CUmemGenericAllocationHandle handle, int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return;
    lock();
    uint64_t id = id_of_locked(handle);
    if (id && sg_grow((void **)&exps, &capexps, nexps, sizeof(*exps)) == 0)
        exps[nexps++] = (struct export_id){.dev = sb.st_dev, .ino = sb.st_ino, .id = id};
    pthread_mutex_unlock(&mu);
}

void sg_vmm_imported(CUmemGenericAllocationHandle handle, int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return;
    lock();
    for (size_t i = 0; i < nexps; i++)
        if (exps[i].dev == sb.st_dev && exps[i].ino == sb.st_ino) {
            add_handle_locked(handle, exps[i].id);
            break;
        }
    pthread_mutex_unlock(&mu);
}

bool sg_vmm_release(CUmemGenericAllocationHandle handle, const struct sg_charge *c)
{
    bool credit_now = false;
    struct dues due = {0};
    lock();
    uint64_t id = id_of_locked(handle);
    drop_handle_locked(handle);
    if (c && id && alive_locked(id) &&
        sg_grow((void **)&helds, &caphelds, nhelds, sizeof(*helds)) == 0)
        helds[nhelds++] = (struct held){.id = id, .charge = *c};
    else if (c)
        credit_now = true; /* nothing keeps it (or out of host memory: the old behaviour) */
    take_if_dead_locked(id, &due);
    pthread_mutex_unlock(&mu);
    dues_credit(&due); /* the last other handle of an allocation whose charge was held */
    return credit_now;
}

SG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!SG_REAL(cuMemMap))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (res != CUDA_SUCCESS || sg_in_hook || !sg_configured())
        return res;
    lock();
    uint64_t id = id_of_locked(handle);
    if (id && sg_grow((void **)&maps, &capmaps, nmaps, sizeof(*maps)) == 0)
        maps[nmaps++] = (struct mapping){.va = ptr, .size = size, .id = id};
    /* Out of host memory: the mapping goes unrecorded, and a later release credits at once
     * (the old behaviour), which the agent's audit still bounds. */
    pthread_mutex_unlock(&mu);
    return res;
}

SG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!SG_REAL(cuMemUnmap))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemUnmap)(ptr, size);
    if (res != CUDA_SUCCESS || sg_in_hook || !sg_configured())
        return res;
    struct dues due = {0};
    lock();
    for (size_t i = 0; i < nmaps;) {
        if (maps[i].va >= ptr && maps[i].va + maps[i].size <= ptr + size) {
            uint64_t id = maps[i].id;
            maps[i] = maps[--nmaps];
            take_if_dead_locked(id, &due);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    dues_credit(&due); /* outside the lock: the ledger takes its own */
    return res;
}
