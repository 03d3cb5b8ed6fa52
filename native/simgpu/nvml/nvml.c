/*
 * libnvidia-ml.so.1 of the simulated GPU: reads the same shared state as libcuda.so.1.
 * Like real NVML it ignores CUDA_VISIBLE_DEVICES and numbers GPUs physically.
 * Every query first reaps dead processes, so a killed process's memory disappears from it.
 */
#include "sharegpu/nvml_api.h"
#include "../common/sim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NVML_EXPORT __attribute__((visibility("default")))
#define DEV_MAGIC 0x4e564d31u

struct nvmlDevice_st {
    uint32_t magic;
    unsigned index;
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;                /* [init_mu] nvmlInit minus nvmlShutdown */
static struct sim_state *st;        /* set once at the first successful init */
static struct nvmlDevice_st devs[SIM_MAX_GPUS];

/*
 * Faults a test asks for, per GPU (SIMGPU_NVML_FAULTS, read at every nvmlInit; "@<file>" reads
 * the list from that file, none when it does not exist, so a running daemon's GPUs can fail):
 *   lost           every query of the GPU answers NVML_ERROR_GPU_IS_LOST (fallen off the bus);
 *                  its handle is still given out, as the driver does until it notices
 *   no_permission  its handle answers NVML_ERROR_NO_PERMISSION (a GPU outside a container's
 *                  devices: nvmlDeviceGetCount_v2 still counts it)
 * Written under init_mu, read by queries without it: atomics.
 */
static nvmlReturn_t faults[SIM_MAX_GPUS];

static nvmlReturn_t fault_of(unsigned g)
{
    return __atomic_load_n(&faults[g], __ATOMIC_RELAXED);
}

/* "1:lost,2:no_permission" into out[]; a malformed list is an error, never half-applied. */
static int parse_faults(struct sim_err *e, const char *v, nvmlReturn_t out[SIM_MAX_GPUS])
{
    memset(out, 0, sizeof(nvmlReturn_t) * SIM_MAX_GPUS);
    const char *p = v;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9')
            return sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS=%.60s: expected <index>:lost or "
                            "<index>:no_permission, separated by commas", v);
        unsigned long g = strtoul(p, &end, 10);
        if (g >= SIM_MAX_GPUS || *end != ':')
            return sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS=%.60s: expected <index>:<fault> "
                            "with an index below %d", v, SIM_MAX_GPUS);
        p = end + 1;
        size_t n = strcspn(p, ",");
        if (n == 4 && strncmp(p, "lost", n) == 0)
            out[g] = NVML_ERROR_GPU_IS_LOST;
        else if (n == 13 && strncmp(p, "no_permission", n) == 0)
            out[g] = NVML_ERROR_NO_PERMISSION;
        else
            return sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS=%.60s: unknown fault %.*s "
                            "(lost or no_permission)", v, (int)n, p);
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

static nvmlReturn_t nvml_result(const struct sim_err *e)
{
    switch (e->code) {
    case SIM_OK: return NVML_SUCCESS;
    case SIM_EINVAL: return NVML_ERROR_INVALID_ARGUMENT;
    case SIM_ENODEV_MEM:
    case SIM_ENOMEM: return NVML_ERROR_MEMORY;
    case SIM_ECONFIG: return NVML_ERROR_INVALID_ARGUMENT;
    case SIM_ESTATE: return NVML_ERROR_CORRUPTED_INFOROM;
    case SIM_EOS: return NVML_ERROR_OPERATING_SYSTEM;
    case SIM_ENOTFOUND: return NVML_ERROR_NOT_FOUND;
    case SIM_ENOSLOT: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case SIM_EDEVICE: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_ERROR_UNKNOWN;
}

/* SIMGPU_NVML_FAULTS, or the file it names after '@', into out ("" for none). */
static int fault_list(struct sim_err *e, char *out, size_t size)
{
    const char *v = getenv("SIMGPU_NVML_FAULTS");
    out[0] = '\0';
    if (!v)
        return 0;
    if (v[0] != '@') {
        if (strlen(v) >= size)
            return sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS: longer than %zu bytes", size - 1);
        memcpy(out, v, strlen(v) + 1);
        return 0;
    }
    FILE *f = fopen(v + 1, "re");
    if (!f)
        return errno == ENOENT ? 0
                               : sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS=%.200s: %s", v,
                                          strerror(errno));
    size_t n = fread(out, 1, size - 1, f);
    int overlong = n == size - 1 && fgetc(f) != EOF;
    fclose(f);
    if (overlong)
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_NVML_FAULTS=%.200s: longer than %zu bytes", v,
                        size - 1);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        n--; /* a file written by echo ends in a newline */
    out[n] = '\0';
    return 0;
}

static nvmlReturn_t init(unsigned flags)
{
    (void)flags; /* NVML_INIT_FLAG_NO_GPUS / NO_ATTACH change nothing here */
    pthread_mutex_lock(&init_mu);
    nvmlReturn_t r = NVML_SUCCESS;
    struct sim_err e = {0};
    struct sim_state *s;
    nvmlReturn_t wanted[SIM_MAX_GPUS];
    char listed[256];
    if (fault_list(&e, listed, sizeof listed) < 0 || parse_faults(&e, listed, wanted) < 0 ||
        sim_state_open(&e, &s) < 0) {
        sim_log("nvmlInit: %s", e.msg);
        r = nvml_result(&e);
    } else {
        for (unsigned i = 0; i < SIM_MAX_GPUS; i++)
            __atomic_store_n(&faults[i], wanted[i], __ATOMIC_RELAXED);
        for (unsigned i = 0; i < SIM_MAX_GPUS; i++) {
            devs[i].index = i;
            devs[i].magic = DEV_MAGIC;
        }
        __atomic_store_n(&st, s, __ATOMIC_RELEASE);
        refcount++;
    }
    pthread_mutex_unlock(&init_mu);
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlInit(void) { return init(0); }
NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(0); }
NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init(flags); }

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&init_mu);
    nvmlReturn_t r = refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (refcount > 0)
        refcount--; /* the mapping stays: cheap, and handles given out stay harmless */
    pthread_mutex_unlock(&init_mu);
    return r;
}

static int inited(void)
{
    pthread_mutex_lock(&init_mu);
    int n = refcount;
    pthread_mutex_unlock(&init_mu);
    return n > 0;
}

/* Validates the library state and a device handle; *g gets the index. */
static nvmlReturn_t check_dev(nvmlDevice_t d, unsigned *g)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!d || d < devs || d >= devs + SIM_MAX_GPUS || d->magic != DEV_MAGIC ||
        d->index >= st->cfg.gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (fault_of(d->index) == NVML_ERROR_GPU_IS_LOST)
        return NVML_ERROR_GPU_IS_LOST;
    *g = d->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *out, unsigned length, const char *s)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_ENABLED: return "ECC is not enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, st->cfg.driver_version);
}

static nvmlReturn_t cuda_version(int *version)
{
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    *version = st->cfg.cuda_version;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return cuda_version(version); }
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return cuda_version(version); }

static nvmlReturn_t count(unsigned *n)
{
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    *n = st->cfg.gpus;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return count(n); }
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return count(n); }

static nvmlReturn_t by_index(unsigned index, nvmlDevice_t *device)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (index >= st->cfg.gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (fault_of(index) == NVML_ERROR_NO_PERMISSION)
        return NVML_ERROR_NO_PERMISSION;
    *device = &devs[index];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return by_index(i, d); }
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return by_index(i, d); }

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned g = 0; g < st->cfg.gpus; g++) {
        char u[SIM_UUID_STR_LEN];
        sim_uuid_string(&st->cfg, g, u);
        if (strcmp(u, uuid) == 0) {
            if (fault_of(g) == NVML_ERROR_NO_PERMISSION)
                return NVML_ERROR_NO_PERMISSION;
            *device = &devs[g];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = g;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    return r ? r : copy_string(name, length, st->cfg.name);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    char u[SIM_UUID_STR_LEN];
    sim_uuid_string(&st->cfg, g, u);
    return copy_string(uuid, length, u);
}

/* total/used of GPU g after reaping dead processes (see SIM_NVML_REAP_NS). */
static nvmlReturn_t memory(unsigned g, uint64_t *total, uint64_t *used)
{
    struct sim_err e = {0};
    if (sim_reap(&e, st, SIM_NVML_REAP_NS) < 0 || sim_lock(&e, st) < 0)
        return nvml_result(&e);
    *total = st->cfg.memory_bytes;
    *used = st->gpu[g].used;
    sim_unlock(st);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t total, used;
    r = memory(g, &total, &used);
    if (r)
        return r;
    mem->total = total;
    mem->used = used;
    mem->free = total - used;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, used;
    r = memory(g, &total, &used);
    if (r)
        return r;
    mem->total = total;
    mem->reserved = 0;
    mem->used = used;
    mem->free = total - used;
    return NVML_SUCCESS;
}

#define WINDOW_NS 1000000000ull

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_err e = {0};
    if (sim_lock(&e, st) < 0)
        return nvml_result(&e);
    uint64_t now = sim_now_ns(), from = now > WINDOW_NS ? now - WINDOW_NS : 0, covered;
    sim_engine_advance_locked(st, (int)g, now); /* the run segments up to now */
    uint64_t busy = sim_busy_locked(st, (int)g, -1, from, now, &covered);
    sim_unlock(st);
    uint64_t span = now - covered;
    unsigned pct = span ? (unsigned)((busy * 100 + span / 2) / span) : 0;
    u->gpu = pct > 100 ? 100 : pct;
    u->memory = 0;
    return NVML_SUCCESS;
}

/* Slots listed on GPU g: processes holding memory there or a context on it. */
struct proc_row {
    unsigned pid;
    unsigned long long bytes;
};

/* Which list a caller asked for.  Under an MPS server (mps_block_us) every process is a client:
 * the real driver lists clients only through nvmlDeviceGetMPSComputeRunningProcesses, and the
 * plain compute list holds the server (the one real context), which the simulation has none of.
 * Without MPS the MPS list is empty. */
enum proc_list { LIST_COMPUTE, LIST_MPS };

static nvmlReturn_t list_procs(unsigned g, enum proc_list which, struct proc_row *rows, unsigned *n)
{
    struct sim_err e = {0};
    if (sim_slots_resolve(&e, st) < 0 || sim_reap(&e, st, SIM_NVML_REAP_NS) < 0 || sim_lock(&e, st) < 0)
        return nvml_result(&e);
    unsigned k = 0;
    if ((st->cfg.mps_block_us != 0) != (which == LIST_MPS)) {
        sim_unlock(st);
        *n = 0;
        return NVML_SUCCESS;
    }
    for (int i = 0; i < SIM_MAX_SLOTS; i++) {
        const struct sim_slot *s = &st->slot[i];
        if (s->pid != 0 && (s->bytes[g] || (s->ctx_mask & (1u << g)))) {
            rows[k].pid = sim_slot_pid(s);
            rows[k].bytes = s->bytes[g];
            k++;
        }
    }
    sim_unlock(st);
    *n = k;
    return NVML_SUCCESS;
}

/* The count in/out protocol shared by the three versions: n rows into infos, or the size. */
static nvmlReturn_t report_rows(const struct proc_row *rows, unsigned n, unsigned *count,
                                void *infos, int version)
{
    if (n > 0 && (!infos || *count < n)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = rows[i].pid;
            p->usedGpuMemory = rows[i].bytes;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = rows[i].pid;
            p->usedGpuMemory = rows[i].bytes;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t running(nvmlDevice_t device, enum proc_list which, unsigned *count, void *infos,
                            int version)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* On the heap, not in thread-local storage: glibc carves a library's TLS out of every
     * thread's stack, and a table per thread would not fit a small-stacked one. */
    struct proc_row *rows = malloc(sizeof(*rows) * SIM_MAX_SLOTS);
    if (!rows)
        return NVML_ERROR_MEMORY;
    unsigned n;
    r = list_procs(g, which, rows, &n);
    if (r == NVML_SUCCESS)
        r = report_rows(rows, n, count, infos, version);
    free(rows);
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_v1_t *infos)
{
    return running(device, LIST_COMPUTE, count, infos, 1);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    return running(device, LIST_COMPUTE, count, infos, 2);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    return running(device, LIST_COMPUTE, count, infos, 3);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_v1_t *infos)
{
    return running(device, LIST_MPS, count, infos, 1);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                    unsigned int *count,
                                                                    nvmlProcessInfo_t *infos)
{
    return running(device, LIST_MPS, count, infos, 2);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                    unsigned int *count,
                                                                    nvmlProcessInfo_t *infos)
{
    return running(device, LIST_MPS, count, infos, 3);
}

struct util_row {
    unsigned pid;
    unsigned pct;
};

/* One row per process that kept GPU g's engine busy in [from, now). */
static int sample_utilization(struct sim_err *e, unsigned g, uint64_t from, uint64_t now,
                              struct util_row *rows, unsigned *count)
{
    unsigned n = 0;
    if (sim_slots_resolve(e, st) < 0 || sim_lock(e, st) < 0)
        return -1;
    sim_engine_advance_locked(st, (int)g, now);
    for (int i = 0; i < SIM_MAX_SLOTS && now > from; i++) {
        const struct sim_slot *s = &st->slot[i];
        if (s->pid == 0)
            continue;
        uint64_t covered;
        uint64_t busy = sim_busy_locked(st, (int)g, i, from, now, &covered);
        if (busy == 0 || now <= covered)
            continue;
        unsigned pct = (unsigned)((busy * 100 + (now - covered) / 2) / (now - covered));
        rows[n].pid = sim_slot_pid(s);
        rows[n].pct = pct > 100 ? 100 : pct;
        n++;
    }
    sim_unlock(st);
    *count = n;
    return 0;
}

/* The count in/out protocol: n samples into util, or the size; none is NOT_FOUND. */
static nvmlReturn_t report_samples(const struct util_row *rows, unsigned n, uint64_t wall_us,
                                   nvmlProcessUtilizationSample_t *util, unsigned *count)
{
    if (n == 0)
        return NVML_ERROR_NOT_FOUND; /* no samples since lastSeenTimeStamp */
    if (!util || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        util[i].pid = rows[i].pid;
        util[i].timeStamp = wall_us;
        util[i].smUtil = rows[i].pct;
        util[i].memUtil = 0;
        util[i].encUtil = 0;
        util[i].decUtil = 0;
    }
    *count = n;
    return NVML_SUCCESS;
}

/*
 * Per-process SM utilization since lastSeenTimeStamp (µs of CLOCK_REALTIME, as real NVML), over
 * at most the last second: one sample per process that kept the engine busy in that window.
 */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                         nvmlProcessUtilizationSample_t *util,
                                                         unsigned int *count,
                                                         unsigned long long lastSeenTimeStamp)
{
    unsigned g;
    nvmlReturn_t r = check_dev(device, &g);
    if (r)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now_ns(), wall_us = sim_realtime_us();
    uint64_t from = now > WINDOW_NS ? now - WINDOW_NS : 0;
    if (lastSeenTimeStamp && lastSeenTimeStamp < wall_us) {
        uint64_t since = (wall_us - lastSeenTimeStamp) * 1000ull;
        if (since < now - from)
            from = now - since;
    } else if (lastSeenTimeStamp >= wall_us) {
        from = now;
    }
    struct util_row *samples = malloc(sizeof(*samples) * SIM_MAX_SLOTS); /* not TLS: see running */
    if (!samples)
        return NVML_ERROR_MEMORY;
    unsigned n = 0;
    struct sim_err e = {0};
    if (sample_utilization(&e, g, from, now, samples, &n) < 0)
        r = nvml_result(&e);
    else
        r = report_samples(samples, n, wall_us, util, count);
    free(samples);
    return r;
}
