/*
 * The NVML hooks: memory and process views of the vGPU.  A device handle is mapped to the
 * tenant's limits entry by the UUID the real nvmlDeviceGetUUID reports ("GPU-xxxxxxxx-xxxx-
 * xxxx-xxxx-xxxxxxxxxxxx" -> the 16 bytes cuDeviceGetUuid gives).  A GPU that is not the
 * tenant's shows total 0 and no processes.
 */
#include <stdint.h>
#include <string.h>

#include "shim.h"

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return NVML_ERROR_FUNCTION_NOT_FOUND

#define FORWARD_IF_PASSIVE(...)                                                                    \
    if (sg_in_hook || !sg_configured())                                                            \
    return real_(__VA_ARGS__)

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Parse "GPU-<32 hex digits with dashes>" into 16 bytes; -1 if it is not that form. */
static int parse_uuid(const char *s, uint8_t out[16])
{
    if (strncmp(s, "GPU-", 4) == 0)
        s += 4;
    int n = 0;
    for (; *s && n < 32; s++) {
        if (*s == '-')
            continue;
        int v = hexval(*s);
        if (v < 0)
            return -1;
        if (n % 2 == 0)
            out[n / 2] = (uint8_t)(v << 4);
        else
            out[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32 && *s == '\0' ? 0 : -1;
}

/* The device's UUID; also validates the handle (the real call's error is returned). */
static nvmlReturn_t device_uuid(nvmlDevice_t device, uint8_t uuid[16], bool *ok)
{
    *ok = false;
    if (!SG_REAL(nvmlDeviceGetUUID))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {0};
    nvmlReturn_t ret = SG_REAL(nvmlDeviceGetUUID)(device, buf, sizeof buf);
    if (ret != NVML_SUCCESS)
        return ret;
    buf[sizeof buf - 1] = '\0';
    *ok = parse_uuid(buf, uuid) == 0; /* a MIG or odd UUID matches no limits entry */
    return NVML_SUCCESS;
}

/* total = cap, used = ledger + overhead, free = total - used (0 when over). */
static nvmlReturn_t memory_view(nvmlDevice_t device, uint64_t *total, uint64_t *used,
                                uint64_t *free)
{
    if (sg_mode() != SG_MODE_ACTIVE)
        return NVML_ERROR_NO_PERMISSION;
    uint8_t uuid[16];
    bool ok;
    nvmlReturn_t ret = device_uuid(device, uuid, &ok);
    if (ret != NVML_SUCCESS)
        return ret;
    struct sg_view v;
    struct sg_err e = {0};
    int rc = sg_view_device(-1, ok ? uuid : NULL, &v, &e);
    if (rc < 0)
        return sg_nvml_result(rc);
    *total = v.cap;
    *used = v.cap ? v.used : 0;
    *free = v.cap > v.used ? v.cap - v.used : 0;
    return NVML_SUCCESS;
}

SG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    REAL(nvmlDeviceGetMemoryInfo);
    FORWARD_IF_PASSIVE(device, memory);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    sg_in_hook++;
    nvmlMemory_t real_mem;
    nvmlReturn_t ret = real_(device, &real_mem);
    uint64_t t = 0, u = 0, f = 0;
    if (ret == NVML_SUCCESS)
        ret = memory_view(device, &t, &u, &f);
    if (ret == NVML_SUCCESS) {
        memory->total = t;
        memory->used = u;
        memory->free = f;
    }
    sg_in_hook--;
    return ret;
}

SG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    REAL(nvmlDeviceGetMemoryInfo_v2);
    FORWARD_IF_PASSIVE(device, memory);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    sg_in_hook++;
    nvmlMemory_v2_t real_mem;
    memset(&real_mem, 0, sizeof real_mem);
    real_mem.version = memory->version; /* the real call checks it */
    nvmlReturn_t ret = real_(device, &real_mem);
    uint64_t t = 0, u = 0, f = 0;
    if (ret == NVML_SUCCESS)
        ret = memory_view(device, &t, &u, &f);
    if (ret == NVML_SUCCESS) {
        memory->total = t;
        memory->reserved = 0;
        memory->used = u;
        memory->free = f;
    }
    sg_in_hook--;
    return ret;
}

/* The count/INSUFFICIENT_SIZE protocol of NVML: *count in = capacity of infos; out = number of
 * processes.  infos may be NULL only with *count == 0 (a size query). */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count,
                                   struct sg_proc_info *found, unsigned *n)
{
    *n = 0;
    if (sg_mode() != SG_MODE_ACTIVE)
        return NVML_ERROR_NO_PERMISSION;
    uint8_t uuid[16];
    bool ok;
    nvmlReturn_t ret = device_uuid(device, uuid, &ok);
    if (ret != NVML_SUCCESS)
        return ret;
    struct sg_err e = {0};
    int rc = sg_list_procs(ok ? uuid : NULL, found, SG_MAX_PROCS, n, &e);
    if (rc < 0)
        return sg_nvml_result(rc);
    if (*n > SG_MAX_PROCS)
        *n = SG_MAX_PROCS;
    if (*n > *count) {
        *count = *n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = *n;
    return NVML_SUCCESS;
}

SG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v1_t *infos)
{
    REAL(nvmlDeviceGetComputeRunningProcesses);
    FORWARD_IF_PASSIVE(device, infoCount, infos);
    if (!infoCount || (*infoCount && !infos))
        return NVML_ERROR_INVALID_ARGUMENT;
    sg_in_hook++;
    struct sg_proc_info found[SG_MAX_PROCS];
    unsigned n;
    nvmlReturn_t ret = list_processes(device, infoCount, found, &n);
    if (ret == NVML_SUCCESS)
        for (unsigned i = 0; i < n; i++) {
            infos[i].pid = (unsigned int)found[i].pid;
            infos[i].usedGpuMemory = found[i].bytes;
        }
    sg_in_hook--;
    return ret;
}

/*
 * The MPS client lists.  Forwarded, they would show every tenant's processes on the card (under
 * an MPS server all of them are clients, listed here and not in the compute lists).  A tenant
 * sees its own processes, as in the compute view, when the driver's list names any client on
 * the device, and an empty list when it names none (no MPS server there).  The driver is asked
 * for the count alone, so the other tenants' pids never reach this process's memory.
 */
static nvmlReturn_t mps_clients(nvmlReturn_t (*real_count)(nvmlDevice_t, unsigned int *, void *),
                                nvmlDevice_t device, unsigned int *count, struct sg_proc_info *found,
                                unsigned *n)
{
    *n = 0;
    unsigned int real_n = 0;
    nvmlReturn_t ret = real_count(device, &real_n, NULL);
    if (ret != NVML_SUCCESS && ret != NVML_ERROR_INSUFFICIENT_SIZE)
        return ret;
    if (real_n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    return list_processes(device, count, found, n);
}

/* The _v2/_v3 compute lists and the MPS lists: `lister` fills found[] from the ledger. */
#define PROCS(name, info_t, instance_ids, lister)                                                  \
    SG_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, info_t *infos)       \
    {                                                                                              \
        REAL(name);                                                                                \
        FORWARD_IF_PASSIVE(device, infoCount, infos);                                              \
        if (!infoCount || (*infoCount && !infos))                                                  \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        sg_in_hook++;                                                                              \
        struct sg_proc_info found[SG_MAX_PROCS];                                                   \
        unsigned n;                                                                                \
        nvmlReturn_t ret = lister;                                                                 \
        if (ret == NVML_SUCCESS)                                                                   \
            for (unsigned i = 0; i < n; i++) {                                                     \
                infos[i].pid = (unsigned int)found[i].pid;                                         \
                infos[i].usedGpuMemory = found[i].bytes;                                           \
                instance_ids(infos[i]);                                                            \
            }                                                                                      \
        sg_in_hook--;                                                                              \
        return ret;                                                                                \
    }
#define NO_INSTANCE_IDS(info) (void)(info)
#define UNSET_INSTANCE_IDS(info) ((info).gpuInstanceId = (info).computeInstanceId = 0xFFFFFFFFu)
#define COMPUTE list_processes(device, infoCount, found, &n)
#define MPS_CLIENTS                                                                                \
    mps_clients((nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, void *))real_, device, infoCount, \
                found, &n)
PROCS(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, UNSET_INSTANCE_IDS, COMPUTE)
PROCS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, UNSET_INSTANCE_IDS, COMPUTE)
PROCS(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, NO_INSTANCE_IDS, MPS_CLIENTS)
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t, UNSET_INSTANCE_IDS, MPS_CLIENTS)
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, UNSET_INSTANCE_IDS, MPS_CLIENTS)
