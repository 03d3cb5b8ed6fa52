/* cuInit, cuDriverGetVersion, CUDA_VISIBLE_DEVICES, process lifetime (fork, exit). */
#include "cu.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cu_global cu_g = {.mu = PTHREAD_MUTEX_INITIALIZER};

unsigned long long cu_next_id(void)
{
    static unsigned long long next;
    return __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
}

CUresult cu_result(const struct sim_err *e)
{
    switch (e->code) {
    case SIM_OK: return CUDA_SUCCESS;
    case SIM_EINVAL: return CUDA_ERROR_INVALID_VALUE;
    case SIM_ENODEV_MEM: return CUDA_ERROR_OUT_OF_MEMORY;
    case SIM_ENOMEM: return CUDA_ERROR_OUT_OF_MEMORY;
    case SIM_ECONFIG: return CUDA_ERROR_INVALID_VALUE;
    case SIM_ESTATE: return CUDA_ERROR_OPERATING_SYSTEM;
    case SIM_EOS: return CUDA_ERROR_OPERATING_SYSTEM;
    case SIM_ENOTFOUND: return CUDA_ERROR_NOT_FOUND;
    case SIM_ENOSLOT: return CUDA_ERROR_OUT_OF_MEMORY;
    case SIM_EDEVICE: return CUDA_ERROR_INVALID_DEVICE;
    }
    return CUDA_ERROR_UNKNOWN;
}

/* The real driver's rules: indices or GPU-UUID (prefixes), comma-separated; the first invalid
 * entry ends the list; an empty variable hides every device. */
static int parse_visible(const struct sim_config *c, const char *env, unsigned count, int *vis)
{
    int n = 0;
    const char *p = env;
    while (*p && n < (int)count) {
        char tok[128];
        size_t len = strcspn(p, ",");
        if (len >= sizeof(tok))
            break;
        memcpy(tok, p, len);
        tok[len] = '\0';
        char *t = tok;
        while (isspace((unsigned char)*t))
            t++;
        char *end = t + strlen(t);
        while (end > t && isspace((unsigned char)end[-1]))
            *--end = '\0';
        int idx = -1;
        if (isdigit((unsigned char)*t)) {
            char *stop;
            errno = 0;
            long v = strtol(t, &stop, 10);
            if (!errno && *stop == '\0' && v >= 0 && v < (long)count)
                idx = (int)v;
        } else if (strncmp(t, "GPU-", 4) == 0 && strlen(t) > 4) {
            for (unsigned g = 0; g < count; g++) {
                char u[SIM_UUID_STR_LEN];
                sim_uuid_string(c, g, u);
                if (strncasecmp(u, t, strlen(t)) == 0) {
                    if (idx >= 0) {
                        idx = -1; /* ambiguous prefix */
                        break;
                    }
                    idx = (int)g;
                }
            }
        }
        for (int i = 0; i < n && idx >= 0; i++)
            if (vis[i] == idx)
                idx = -1; /* a duplicate is invalid too */
        if (idx < 0)
            break;
        vis[n++] = idx;
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

static int parse_kernel_us(struct sim_err *e, uint64_t *ns)
{
    const char *v = getenv("SIMGPU_KERNEL_US");
    *ns = 10000;
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long us = strtoull(v, &end, 10);
    if (errno || *end || !isdigit((unsigned char)*v) || us > 3600ull * 1000000ull)
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_KERNEL_US=%s: expected microseconds (0..3600000000)",
                        v);
    *ns = us * 1000ull;
    return 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&cu_g.mu);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&cu_g.mu);
}

/* A forked child does not inherit CUDA (as with the real driver): its contexts are dead, its
 * allocations are the parent's, and it must not free the parent's slot at exit.  It may call
 * cuInit again and starts afresh. */
static void atfork_child(void)
{
    pthread_mutex_unlock(&cu_g.mu);
    __atomic_store_n(&cu_g.inited, 0, __ATOMIC_RELEASE);
    sim_slot_forget();
    sim_engine_fork_child();
    cu_ctx_fork_child();
    cu_mem_fork_child();
    cu_vmm_fork_child();
    cu_pool_fork_child();
    cu_memop_fork_child();
    cu_ipc_event_fork_child();
    cu_host_fork_child();
}

static CUresult init_locked(void)
{
    static int atfork_done;
    struct sim_err e = {0};
    struct sim_state *st;
    if (sim_state_open(&e, &st) < 0) {
        sim_log("cuInit: %s", e.msg);
        return cu_result(&e);
    }
    uint64_t kns;
    if (parse_kernel_us(&e, &kns) < 0) {
        sim_log("cuInit: %s", e.msg);
        return cu_result(&e);
    }
    int vis[SIM_MAX_GPUS];
    int nvis = (int)st->cfg.gpus;
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    if (env)
        nvis = parse_visible(&st->cfg, env, st->cfg.gpus, vis);
    else
        for (int i = 0; i < nvis; i++)
            vis[i] = i;
    if (nvis == 0)
        return CUDA_ERROR_NO_DEVICE;
    if (!atfork_done) {
        if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0)
            return CUDA_ERROR_OPERATING_SYSTEM;
        atfork_done = 1;
    }
    cu_g.st = st;
    cu_g.kernel_ns = kns;
    cu_g.nvis = nvis;
    for (int i = 0; i < nvis; i++) {
        cu_g.vis[i] = vis[i];
        struct CUctx_st *c = &cu_g.primary[i];
        if (c->magic != CTX_MAGIC) {
            memset(c, 0, sizeof(*c));
            c->ordinal = i;
            c->phys = vis[i];
            c->primary = 1;
            cu_stream_init(&c->defstream, c, 0);
            c->magic = CTX_MAGIC;
        }
        if (cu_g.pool[i].magic != POOL_MAGIC) {
            memset(&cu_g.pool[i], 0, sizeof(cu_g.pool[i]));
            cu_g.pool[i].ordinal = i;
            cu_g.pool[i].phys = vis[i];
            cu_g.pool[i].is_default = 1;
            for (int k = 0; k < 3; k++)
                cu_g.pool[i].reuse[k] = 1;
            cu_g.pool[i].magic = POOL_MAGIC;
        }
    }
    __atomic_store_n(&cu_g.inited, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (cu_ready() == CUDA_SUCCESS)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&cu_g.mu);
    CUresult r = cu_ready() == CUDA_SUCCESS ? CUDA_SUCCESS : init_locked();
    pthread_mutex_unlock(&cu_g.mu);
    return r;
}

SIM_EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    /* Works before cuInit, as the real one does. */
    struct sim_state *st;
    struct sim_err e = {0};
    if (sim_state_open(&e, &st) == 0) {
        *version = st->cfg.cuda_version;
        return CUDA_SUCCESS;
    }
    struct sim_config cfg;
    if (sim_config_load(&e, &cfg) < 0)
        sim_config_defaults(&cfg);
    *version = cfg.cuda_version;
    return CUDA_SUCCESS;
}

/* Normal exit: give the process's memory back at once rather than waiting for a reaper. */
__attribute__((destructor)) static void cu_fini(void)
{
    struct sim_state *st = sim_state_get();
    if (st)
        sim_slot_release(st);
}
