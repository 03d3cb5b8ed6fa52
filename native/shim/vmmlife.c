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
 *
 * A handle that names no charged allocation (imported from another process's export, or from
 * our own after that allocation ended here while the driver kept it alive through the exported
 * descriptor) is paid for by the importer when it maps it: cuMemMap admits the bytes of the
 * mapping not yet paid for (the allocation's offsets, as spans), refuses past the cap before the
 * real map, and gives the handle an id whose charge ends like the others.  An import that matches
 * our own live export joins that allocation's id instead and pays nothing more: within one
 * process nothing is charged twice.
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

struct span { /* [lo, hi): offsets of an allocation charged at map that are paid for */
    uint64_t id;
    uint64_t lo, hi;
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
static struct span *spans; /* [mu] disjoint per id; an id with spans was charged at map */
static size_t nspans, capspans;

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(hids);
    free(maps);
    free(helds);
    free(exps);
    free(spans);
    hids = NULL;
    maps = NULL;
    helds = NULL;
    exps = NULL;
    spans = NULL;
    nhids = caphids = nmaps = capmaps = nhelds = caphelds = nexps = capexps = 0;
    nspans = capspans = 0;
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
    for (size_t i = 0; i < nspans;)
        if (spans[i].id == id)
            spans[i] = spans[--nspans];
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

/* Was allocation id charged at map (a handle that named no charged allocation)? */
static bool map_charged_locked(uint64_t id)
{
    for (size_t i = 0; i < nspans; i++)
        if (spans[i].id == id)
            return true;
    return false;
}

/* Bytes of [lo, hi) of allocation id not yet paid for (all of them for id 0). */
static uint64_t unpaid_locked(uint64_t id, uint64_t lo, uint64_t hi)
{
    uint64_t paid = 0;
    for (size_t i = 0; id && i < nspans; i++)
        if (spans[i].id == id && spans[i].lo < hi && lo < spans[i].hi)
            paid += (spans[i].hi < hi ? spans[i].hi : hi) - (spans[i].lo > lo ? spans[i].lo : lo);
    return hi - lo - paid;
}

/* Marks [lo, hi) of id paid, merging the spans it touches (room for one more is reserved). */
static void pay_locked(uint64_t id, uint64_t lo, uint64_t hi)
{
    for (size_t i = 0; i < nspans;)
        if (spans[i].id == id && spans[i].lo <= hi && lo <= spans[i].hi) {
            lo = spans[i].lo < lo ? spans[i].lo : lo;
            hi = spans[i].hi > hi ? spans[i].hi : hi;
            spans[i] = spans[--nspans];
        } else {
            i++;
        }
    spans[nspans++] = (struct span){.id = id, .lo = lo, .hi = hi};
}

/* Adds c to id's held charge (merged with one on the same device); room is reserved. */
static void hold_locked(uint64_t id, const struct sg_charge *c)
{
    for (size_t k = 0; k < nhelds; k++)
        if (helds[k].id == id && helds[k].charge.active == c->active &&
            helds[k].charge.idx == c->idx) {
            helds[k].charge.bytes += c->bytes;
            return;
        }
    helds[nhelds++] = (struct held){.id = id, .charge = *c};
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

/* Host locations of CUmemLocationType (pinned host memory: not GPU memory, never charged). */
#define SG_MEM_LOCATION_TYPE_HOST 2
#define SG_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4

/* Where the memory of handle lives, for a handle we did not create: *have_dev with its device
 * ordinal, or the current context's device when the driver cannot say; false: host memory. */
static bool device_of_handle(CUmemGenericAllocationHandle handle, bool *have_dev, CUdevice *dev)
{
    CUmemAllocationProp prop;
    *have_dev = false;
    if (!SG_REAL(cuMemGetAllocationPropertiesFromHandle) ||
        SG_REAL(cuMemGetAllocationPropertiesFromHandle)(&prop, handle) != CUDA_SUCCESS)
        return true;
    int type = (int)prop.location.type;
    if (type >= SG_MEM_LOCATION_TYPE_HOST && type <= SG_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        return false;
    if (type == CU_MEM_LOCATION_TYPE_DEVICE) {
        *have_dev = true;
        *dev = prop.location.id;
    }
    return true;
}

/* Room for one more of each record a map may add (so that recording cannot fail half-way). */
static int room_locked(void)
{
    return sg_grow((void **)&maps, &capmaps, nmaps, sizeof(*maps)) < 0 ||
                   sg_grow((void **)&hids, &caphids, nhids, sizeof(*hids)) < 0 ||
                   sg_grow((void **)&spans, &capspans, nspans, sizeof(*spans)) < 0 ||
                   sg_grow((void **)&helds, &caphelds, nhelds, sizeof(*helds)) < 0
               ? -1
               : 0;
}

/* A handle with an allocation id we charged at creation (or joined by import) maps for free.
 * One that names none pays for the bytes of the mapping not yet paid for: admitted before the
 * real map (refused past the cap, with nothing mapped), settled after it (a concurrent map of
 * the same bytes may have paid for some: the surplus goes back). */
static CUresult map_accounted(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    uint64_t lo = offset, hi;
    if (__builtin_add_overflow(lo, (uint64_t)size, &hi))
        return CUDA_ERROR_INVALID_VALUE;
    for (int attempt = 0;; attempt++) {
        lock();
        uint64_t id = id_of_locked(handle);
        bool pays = !id || map_charged_locked(id);
        uint64_t owe = pays ? unpaid_locked(id, lo, hi) : 0;
        pthread_mutex_unlock(&mu);

        struct sg_charge c = {.active = false};
        bool have_dev = false;
        CUdevice dev = 0;
        if (pays && !device_of_handle(handle, &have_dev, &dev)) {
            pays = false; /* host memory */
            owe = 0;
        }
        if (owe) {
            CUresult r = sg_alloc_begin(have_dev, dev, owe, &c);
            if (r != CUDA_SUCCESS)
                return r; /* past the cap (or broken): the handle is not mapped */
            c.ctx = NULL; /* VMM memory outlives contexts */
        }
        CUresult res = SG_REAL(cuMemMap)(ptr, size, offset, handle, flags);
        if (res != CUDA_SUCCESS) {
            sg_unreserve(&c);
            return res;
        }

        lock();
        id = id_of_locked(handle);
        bool pays_now = pays && (!id || map_charged_locked(id));
        uint64_t now = pays_now ? unpaid_locked(id, lo, hi) : 0;
        bool recorded = false, retry = false;
        if (now > c.bytes) {
            retry = true; /* the handle value came to name other memory meanwhile: again */
        } else if (room_locked() == 0) {
            if (pays_now && !id) {
                id = next_id++;
                hids[nhids++] = (struct handle_id){.handle = handle, .id = id};
            }
            if (pays_now) {
                pay_locked(id, lo, hi);
                struct sg_charge paid = c;
                paid.bytes = now;
                if (now)
                    hold_locked(id, &paid);
                c.bytes -= now; /* the surplus, credited below */
            }
            if (id)
                maps[nmaps++] = (struct mapping){.va = ptr, .size = size, .id = id};
            recorded = true;
        }
        pthread_mutex_unlock(&mu);
        if (recorded) {
            if (c.bytes)
                sg_credit(&c);
            return CUDA_SUCCESS;
        }
        /* Not recorded: undo the map rather than leave memory mapped that no charge follows. */
        if (SG_REAL(cuMemUnmap))
            SG_REAL(cuMemUnmap)(ptr, size);
        sg_unreserve(&c);
        if (!retry || attempt >= 2)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
}

SG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!SG_REAL(cuMemMap))
        return CUDA_ERROR_NOT_FOUND;
    if (sg_in_hook || !sg_configured())
        return SG_REAL(cuMemMap)(ptr, size, offset, handle, flags);
    sg_in_hook++;
    CUresult res = map_accounted(ptr, size, offset, handle, flags);
    sg_in_hook--;
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

/* One more reference to the handle mapped at addr (the driver's own reference counting): it
 * names the mapping's allocation id, so that allocation's charge lasts until this reference is
 * released too (each reference is one entry of the handle table). */
SG_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!SG_REAL(cuMemRetainAllocationHandle))
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = SG_REAL(cuMemRetainAllocationHandle)(handle, addr);
    if (res != CUDA_SUCCESS || sg_in_hook || !sg_configured())
        return res;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
    lock();
    uint64_t id = 0;
    for (size_t i = 0; i < nmaps && !id; i++)
        if (maps[i].va <= a && a - maps[i].va < maps[i].size)
            id = maps[i].id;
    if (!id)
        id = id_of_locked(*handle);
    bool kept = !id || sg_grow((void **)&hids, &caphids, nhids, sizeof(*hids)) == 0;
    if (id && kept)
        hids[nhids++] = (struct handle_id){.handle = *handle, .id = id};
    pthread_mutex_unlock(&mu);
    if (kept)
        return res;
    /* Out of host memory: a reference we cannot count would let the charge end early. */
    sg_in_hook++;
    if (SG_REAL(cuMemRelease))
        SG_REAL(cuMemRelease)(*handle);
    sg_in_hook--;
    return CUDA_ERROR_OUT_OF_MEMORY;
}
