/*
 * Configuration: where the tenant directory is, mapping its limits (read-only) and usage
 * (read-write) regions, validating them, and the seqlock reader of the limits.
 *
 * Three modes, decided lazily at the first hooked call (never in a constructor; the load-order
 * check of real.c only asks at load whether a tenant is configured):
 *   INERT   no tenant directory: SG_CONTAINER_TENANT_DIR does not exist and SHAREGPU_TENANT is
 *           unset or empty.  Every hook is a pure pass-through; no file is opened.
 *   ACTIVE  both regions mapped and valid.
 *   BROKEN  a tenant directory is configured but its files are missing, short or corrupt (or
 *           the limits became invalid on a resize).  Fail closed: cuInit and every allocation
 *           return CUDA_ERROR_NOT_PERMITTED ("the operation is not permitted" is what the
 *           tenant is told: it may not use the GPU until its configuration is repaired; an
 *           out-of-memory error would send it looking for leaks), the views return
 *           CUDA_ERROR_NOT_PERMITTED / NVML_ERROR_NO_PERMISSION, frees still work.  Exactly one
 *           line "sharegpu: <what is wrong and where>" goes to stderr per process.
 *
 * The limits are the only source of caps.  The environment only says where the directory is,
 * and inside a container the read-only mount at SG_CONTAINER_TENANT_DIR wins over it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

const struct sg_limits *sg_limits_map;
struct sg_usage *sg_usage_map;
char sg_tenant_dir[PATH_MAX];
struct sg_limits_copy sg_lim;

static bool configured;
static int mode = SG_MODE_INERT; /* [atomic acquire/release] after open_once */
static int broken_logged;

static void locate(void)
{
    struct stat st;
    const char *dir = NULL;
    if (stat(SG_CONTAINER_TENANT_DIR, &st) == 0 && S_ISDIR(st.st_mode))
        dir = SG_CONTAINER_TENANT_DIR;
    else {
        const char *env = getenv(SG_TENANT_ENV);
        if (env && env[0])
            dir = env;
    }
    if (!dir)
        return;
    size_t n = strlen(dir);
    if (n >= sizeof sg_tenant_dir - 16)
        n = sizeof sg_tenant_dir - 16; /* reported as a missing file by sg_mode */
    memcpy(sg_tenant_dir, dir, n);
    sg_tenant_dir[n] = '\0';
    configured = true;
}

SG_FAST_ONCE(locate_once, locate)

bool sg_configured(void)
{
    locate_once();
    return configured;
}

void sg_break(const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    __atomic_store_n(&mode, SG_MODE_BROKEN, __ATOMIC_RELEASE);
    sg_log_once(&broken_logged, "%s; GPU use refused (fail closed)", msg);
}

/* ---- mapping ----------------------------------------------------------------------------- */

static void *map_file(const char *name, size_t need, bool writable, struct sg_err *e)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", sg_tenant_dir, name);
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        sg_fail(e, SG_E_CONFIG, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        sg_fail(e, SG_E_CONFIG, "%s is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size < need) {
        sg_fail(e, SG_E_CONFIG, "%s is truncated (%lld bytes, need %zu)", path,
                (long long)st.st_size, need);
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, need, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        sg_fail(e, SG_E_CONFIG, "cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    return p;
}

static int check_header(const struct sg_region_header *h, uint32_t magic, size_t need,
                        const char *name, struct sg_err *e)
{
    uint32_t m = h->magic;
    if (m != magic)
        return sg_fail(e, SG_E_CONFIG, "%s/%s: bad magic 0x%08x (not a sharegpu %s region)",
                       sg_tenant_dir, name, m, name);
    if (h->abi_major != SG_ABI_MAJOR)
        return sg_fail(e, SG_E_CONFIG, "%s/%s: ABI %u.%u, this shim speaks %d.x", sg_tenant_dir,
                       name, h->abi_major, h->abi_minor, SG_ABI_MAJOR);
    if (h->total_size < need)
        return sg_fail(e, SG_E_CONFIG, "%s/%s: region is %u bytes, need %zu", sg_tenant_dir, name,
                       h->total_size, need);
    return 0;
}

/* ---- the limits seqlock ------------------------------------------------------------------ */

static uint64_t now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Copy n bytes with relaxed 8-byte atomic loads: a seqlock reader races with the writer by
 * design, and the generation check below throws away a torn copy. */
static void copy_relaxed(void *dst, const void *src, size_t n)
{
    const uint64_t *s = src;
    uint64_t *d = dst;
    for (size_t i = 0; i < n / 8; i++)
        d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

_Static_assert(offsetof(struct sg_limits, device_count) % 8 == 0, "device_count word");
_Static_assert(sizeof(((struct sg_limits *)0)->devices) % 8 == 0, "devices words");

int sg_limits_read(const struct sg_limits *l, struct sg_limits_copy *out, struct sg_err *e)
{
    uint64_t deadline = 0;
    for (unsigned tries = 0;; tries++) {
        uint64_t g1 = __atomic_load_n(&l->generation, __ATOMIC_ACQUIRE);
        if (!(g1 & 1)) {
            uint64_t words[1];
            copy_relaxed(words, &l->device_count, 8); /* device_count + flags */
            copy_relaxed(out->devices, l->devices, sizeof out->devices);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            uint64_t g2 = __atomic_load_n(&l->generation, __ATOMIC_RELAXED);
            if (g1 == g2) {
                uint32_t count;
                memcpy(&count, words, sizeof count);
                out->generation = g1;
                out->device_count = count;
                break;
            }
        }
        /* A writer is active: spin a little, then yield, and give up after 200 ms (a writer
         * that died half-way leaves the generation odd for ever). */
        if (tries > 64)
            sched_yield();
        if (tries == 64)
            deadline = now_ns(CLOCK_MONOTONIC) + 200000000u;
        else if (tries > 64 && now_ns(CLOCK_MONOTONIC) > deadline)
            return sg_fail(e, SG_E_CONFIG,
                           "%s/%s: generation %llu stays odd (a writer died mid-update?)",
                           sg_tenant_dir, SG_LIMITS_FILE, (unsigned long long)g1);
    }
    if (out->device_count == 0)
        return sg_fail(e, SG_E_CONFIG, "%s/%s: no devices", sg_tenant_dir, SG_LIMITS_FILE);
    if (out->device_count > SG_MAX_DEVICES)
        return sg_fail(e, SG_E_CONFIG, "%s/%s: device_count %u exceeds %d", sg_tenant_dir,
                       SG_LIMITS_FILE, out->device_count, SG_MAX_DEVICES);
    for (uint32_t i = 0; i < out->device_count; i++)
        if (out->devices[i].mem_cap_bytes == 0)
            return sg_fail(e, SG_E_CONFIG, "%s/%s: device %u has a zero memory cap",
                           sg_tenant_dir, SG_LIMITS_FILE, i);
    return 0;
}

int sg_limits_refresh_locked(struct sg_err *e)
{
    uint64_t g = __atomic_load_n(&sg_limits_map->generation, __ATOMIC_ACQUIRE);
    if (g == sg_lim.generation)
        return 0;
    struct sg_limits_copy fresh;
    int rc = sg_limits_read(sg_limits_map, &fresh, e);
    if (rc < 0) {
        sg_break("%s", e->msg);
        return rc;
    }
    sg_lim = fresh;
    return 0;
}

/* ---- opening -------------------------------------------------------------------------------- */

/* The creator must initialise the usage mutex as robust and process-shared (sharegpu.tenant
 * does, through libc).  A zeroed or private mutex would hang or corrupt across processes, so
 * it is refused.  The check reads glibc's mutex kind: PTHREAD_MUTEX_ROBUST_NORMAL_NP (16) and
 * the process-shared bit (128), both stable glibc ABI since 2.x. */
static int check_mutex(struct sg_usage *u, struct sg_err *e)
{
#ifdef __GLIBC__
    int kind = __atomic_load_n(&u->lock.mutex.__data.__kind, __ATOMIC_RELAXED);
    if ((kind & (16 | 128)) != (16 | 128))
        return sg_fail(e, SG_E_CONFIG,
                       "%s/%s: the usage mutex is not initialised as robust and process-shared",
                       sg_tenant_dir, SG_USAGE_FILE);
#else
    (void)u;
    (void)e;
#endif
    return 0;
}

static int open_regions(struct sg_err *e)
{
    const struct sg_limits *l = map_file(SG_LIMITS_FILE, sizeof(struct sg_limits), false, e);
    if (!l)
        return e->code;
    int rc = check_header(&l->hdr, SG_MAGIC_LIMITS, sizeof(struct sg_limits), SG_LIMITS_FILE, e);
    if (rc == 0)
        rc = sg_limits_read(l, &sg_lim, e);
    if (rc < 0) {
        munmap((void *)l, sizeof *l);
        return rc;
    }
    struct sg_usage *u = map_file(SG_USAGE_FILE, sizeof(struct sg_usage), true, e);
    if (!u) {
        munmap((void *)l, sizeof *l);
        return e->code;
    }
    rc = check_header(&u->hdr, SG_MAGIC_USAGE, sizeof(struct sg_usage), SG_USAGE_FILE, e);
    if (rc == 0 && (u->slot_count == 0 || u->slot_count > SG_MAX_PROCS))
        rc = sg_fail(e, SG_E_CONFIG, "%s/%s: slot_count %u out of range", sg_tenant_dir,
                     SG_USAGE_FILE, u->slot_count);
    if (rc == 0 && u->device_count != SG_MAX_DEVICES)
        rc = sg_fail(e, SG_E_CONFIG, "%s/%s: device_count %u, expected %d", sg_tenant_dir,
                     SG_USAGE_FILE, u->device_count, SG_MAX_DEVICES);
    if (rc == 0)
        rc = check_mutex(u, e);
    if (rc < 0) {
        munmap((void *)l, sizeof *l);
        munmap(u, sizeof *u);
        return rc;
    }
    sg_limits_map = l;
    sg_usage_map = u;
    return 0;
}

/* Under an MPS server every client shares one context and the GPU schedules a higher-priority
 * client's pending blocks first; the driver takes a client's priority from
 * CUDA_MPS_CLIENT_PRIORITY when it connects, at cuInit, which the caller's cuInit runs after
 * this.  So an offline tenant's processes are BELOW_NORMAL (1) clients, whatever they set; the
 * others keep theirs.  Without an MPS server the variable means nothing. */
static void mps_priority_apply(void)
{
    bool offline = sg_lim.device_count > 0;
    for (uint32_t i = 0; i < sg_lim.device_count; i++)
        offline = offline && sg_lim.devices[i].priority == SG_PRIORITY_OFFLINE;
    if (offline)
        setenv(SG_MPS_PRIORITY_ENV, "1", 1);
}

static void open_once_fn(void)
{
    if (!sg_configured())
        return;
    struct sg_err e = {0};
    if (open_regions(&e) < 0) {
        sg_break("%s", e.msg);
        return;
    }
    sg_ledger_setup();
    sg_arb_setup();
    mps_priority_apply();
    __atomic_store_n(&mode, SG_MODE_ACTIVE, __ATOMIC_RELEASE);
}

SG_FAST_ONCE(open_once, open_once_fn)

enum sg_mode sg_mode(void)
{
    open_once();
    return (enum sg_mode)__atomic_load_n(&mode, __ATOMIC_ACQUIRE);
}
