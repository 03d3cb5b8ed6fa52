/*
 * A process's place in its GPUs' arbiter regions (arbiter.c holds the token; this file is
 * where it stands): the limits it follows (a resize applies at the next slow-path call or
 * quantum), the GPU of a device ordinal or UUID, the region it maps (and maps again when the
 * agent replaced a broken one), its tenant's entry and its client entry.  docs/design/
 * arbitration.md explains the region; abi.h lays it out.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "arbentry.h"
#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "shim.h"

#define REATTACH_POLL_NS 20000000ull /* a client of a broken region looks for its successor */

/* Global slow-path state, guarded by setup_mu: the arbiter's copy of the limits, our identity,
 * the watcher. */
static pthread_mutex_t setup_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_limits_copy alim;
static bool alim_valid;
static char tenant_id[SG_TENANT_ID_LEN];
static uint64_t tenant_incarnation; /* the limits' incarnation: a re-created tenant is another */
static bool watcher_started;
static int entry_logged, retired_logged;

void sg_arb_entries_setup(void)
{
    memcpy(tenant_id, sg_limits_map->tenant_id, SG_TENANT_ID_LEN);
    tenant_id[SG_TENANT_ID_LEN - 1] = 0;
    tenant_incarnation = sg_limits_map->incarnation;
}

void sg_arb_entries_fork_child(void)
{
    pthread_mutex_init(&setup_mu, NULL);
    watcher_started = false;
}

/* ---- limits and devices ------------------------------------------------------------------ */

static void gpu_apply_policy(struct sg_gpu *g, const struct sg_limits_device *d)
{
    int want = d->policy == SG_POLICY_NATIVE ? SG_GPU_NATIVE : SG_GPU_ARB;
    __atomic_store_n(&g->offline, d->priority == SG_PRIORITY_OFFLINE, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g->state, __ATOMIC_RELAXED) != want)
        __atomic_store_n(&g->state, want, __ATOMIC_RELEASE);
}

static int validate_compute(const struct sg_limits_copy *l, struct sg_err *e)
{
    for (uint32_t i = 0; i < l->device_count; i++) {
        const struct sg_limits_device *d = &l->devices[i];
        if (d->policy > SG_POLICY_NATIVE || d->priority > SG_PRIORITY_ONLINE)
            return sg_fail(e, SG_E_CONFIG, "%s/%s: device %u has policy %u / priority %u",
                           sg_tenant_dir, SG_LIMITS_FILE, i, d->policy, d->priority);
        if (d->policy != SG_POLICY_NATIVE &&
            (d->share_permille == 0 || d->share_permille > 1000 ||
             d->ceiling_permille < d->share_permille || d->ceiling_permille > 1000))
            return sg_fail(e, SG_E_CONFIG,
                           "%s/%s: device %u has share %u / ceiling %u permille (need 1..1000, "
                           "ceiling >= share)",
                           sg_tenant_dir, SG_LIMITS_FILE, i, d->share_permille,
                           d->ceiling_permille);
    }
    return 0;
}

/* Follow a resize (one acquire load when there is none).  Caller holds setup_mu. */
static int limits_refresh_setup_locked(struct sg_err *e)
{
    uint64_t gen = __atomic_load_n(&sg_limits_map->generation, __ATOMIC_ACQUIRE);
    if (alim_valid && gen == alim.generation)
        return 0;
    struct sg_limits_copy fresh;
    int rc = sg_limits_read(sg_limits_map, &fresh, e);
    if (rc == 0)
        rc = validate_compute(&fresh, e);
    if (rc < 0) {
        sg_break("%s", e->msg);
        return rc;
    }
    for (uint32_t i = 0; i < SG_MAX_DEVICES; i++) {
        struct sg_gpu *g = &sg_gpus[i];
        if (alim_valid && i < alim.device_count &&
            (i >= fresh.device_count ||
             memcmp(alim.devices[i].uuid, fresh.devices[i].uuid, 16) != 0) &&
            g->a) {
            /* The device set changed under a running process: keep the old region mapped but
             * treat the slot as native until restart (documented gap). */
            __atomic_store_n(&g->state, SG_GPU_NATIVE, __ATOMIC_RELEASE);
            continue;
        }
        if (i < fresh.device_count)
            gpu_apply_policy(g, &fresh.devices[i]);
    }
    alim = fresh;
    alim_valid = true;
    return 0;
}

/* The tenant's GPU of this UUID (NULL: none known): *out set, or NULL when it is not one of the
 * tenant's; *arbitrated, whether any of the tenant's GPUs is arbitrated. */
int sg_arb_gpu_of_uuid(const uint8_t *uuid, struct sg_gpu **out, uint64_t *gen, bool *arbitrated,
                       struct sg_err *e)
{
    *out = NULL;
    *arbitrated = false;
    pthread_mutex_lock(&setup_mu);
    int rc = limits_refresh_setup_locked(e);
    for (uint32_t i = 0; rc == 0 && i < alim.device_count; i++) {
        if (!*out && uuid && memcmp(alim.devices[i].uuid, uuid, 16) == 0)
            *out = &sg_gpus[i];
        *arbitrated |= alim.devices[i].policy != SG_POLICY_NATIVE;
    }
    *gen = alim.generation;
    pthread_mutex_unlock(&setup_mu);
    return rc;
}

/* The GPU of device ordinal dev (by its UUID): *out set, or NULL when the device is not the
 * tenant's; refused when it is not and the tenant's GPUs are arbitrated. */
int sg_arb_gpu_of_ordinal(CUdevice dev, struct sg_gpu **out, uint64_t *gen, struct sg_err *e)
{
    uint8_t uuid[16];
    bool arbitrated;
    const uint8_t *known = sg_ordinal_uuid(dev, uuid) == 0 ? uuid : NULL;
    int rc = sg_arb_gpu_of_uuid(known, out, gen, &arbitrated, e);
    if (rc == 0 && !*out && arbitrated)
        return sg_fail(e, SG_E_CONFIG, "device %d is not assigned to this tenant", (int)dev);
    return rc;
}

void sg_arb_device_limits(const struct sg_gpu *g, bool refresh, struct sg_limits_device *d,
                          uint64_t *gen)
{
    pthread_mutex_lock(&setup_mu);
    if (refresh) {
        struct sg_err e;
        sg_err_clear(&e);
        limits_refresh_setup_locked(&e); /* a failure breaks the tenant (sg_break): as it was */
    }
    *d = alim.devices[g->idx];
    *gen = alim.generation;
    pthread_mutex_unlock(&setup_mu);
}

/* ---- the region ---------------------------------------------------------------------------- */

static void uuid_text(const uint8_t *b, char *out, size_t n)
{
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

static void region_path(const struct sg_gpu *g, char *path, size_t n)
{
    char id[48];
    uuid_text(alim.devices[g->idx].uuid, id, sizeof id);
    snprintf(path, n, "%s/%s/%s/%s", sg_tenant_dir, SG_GPUS_DIR, id, SG_ARBITER_FILE);
}

static int open_region(struct sg_gpu *g, struct sg_err *e)
{
    char path[PATH_MAX + 96];
    region_path(g, path, sizeof path);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return sg_fail(e, SG_E_CONFIG, "%s: cannot open the GPU arbiter: %s", path,
                       strerror(errno));
    if (g->live_fd < 0)
        g->live_fd = sg_live_open(path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size < sizeof(struct sg_arbiter)) {
        close(fd);
        return sg_fail(e, SG_E_CONFIG, "%s: not a GPU arbiter region (%lld bytes, need %zu)",
                       path, (long long)st.st_size, sizeof(struct sg_arbiter));
    }
    /* The hand-over records (1.12) follow the region in a file made for them; the file's size
     * is fixed at its creation, so a mapping of it never reaches past its end. */
    size_t len = (uint64_t)st.st_size >= SG_ARB_FILE_SIZE ? SG_ARB_FILE_SIZE
                                                           : sizeof(struct sg_arbiter);
    struct sg_arbiter *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (a == MAP_FAILED)
        return sg_fail(e, SG_E_CONFIG, "%s: cannot map: %s", path, strerror(errno));
    int rc = sg_arb_region_problem(a, (uint64_t)st.st_size, alim.devices[g->idx].uuid, path, e);
    if (rc > 0)
        rc = SG_E_CONFIG; /* another ABI major: refused all the same */
    if (rc < 0) {
        munmap(a, len);
        return rc;
    }
    g->handoffs = len == SG_ARB_FILE_SIZE && a->hdr.total_size >= SG_ARB_FILE_SIZE
                      ? (struct sg_arb_handoff *)((char *)a + SG_ARB_HANDOFFS_OFFSET)
                      : NULL;
    g->region_dev = (uint64_t)st.st_dev; /* only a valid region counts as seen (sg_arb_reattach) */
    g->region_ino = (uint64_t)st.st_ino;
    g->a = a;
    return 0;
}

/* Our hold on a region we leave: the token word is forgotten (a launch on another thread then
 * takes the slow path), nothing is charged or handed on (the region's lock is not ours). */
void sg_arb_forget_hold(struct sg_gpu *g)
{
    __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g->qend, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g->drained_at, 0, __ATOMIC_SEQ_CST);
}

/* Regions we moved away from stay mapped: a thread of ours may have read the old pointer on the
 * launch fast path just before the move, and reads it without our lock (it then finds its token
 * stale).  A tenant that breaks its GPU's region again and again would make us map one more
 * each time (each move is at least a reaper pass, about a second, after the last): after
 * RETIRED_MAX moves we stop following and launch unarbitrated until the process restarts. */
#define RETIRED_MAX 64

/* A broken region (mark_broken) is replaced by the agent: map the new file when it is there.
 * False while it is not (looked for at most every REATTACH_POLL_NS): launch unarbitrated.  The
 * old mapping stays: another thread of ours may still read it on the fast path.  Caller holds
 * g->mu. */
bool sg_arb_reattach(struct sg_gpu *g)
{
    uint64_t now = sg_mono_ns();
    if (now < g->reattach_at || g->retired >= RETIRED_MAX)
        return false;
    g->reattach_at = now + REATTACH_POLL_NS;
    char path[PATH_MAX + 96];
    pthread_mutex_lock(&setup_mu);
    region_path(g, path, sizeof path);
    pthread_mutex_unlock(&setup_mu);
    struct stat st;
    if (stat(path, &st) != 0 ||
        ((uint64_t)st.st_dev == g->region_dev && (uint64_t)st.st_ino == g->region_ino))
        return false;
    struct sg_arbiter *old = g->a;
    int old_live = g->live_fd;
    g->live_fd = -1;
    struct sg_err e;
    sg_err_clear(&e);
    pthread_mutex_lock(&setup_mu);
    int rc = open_region(g, &e);
    pthread_mutex_unlock(&setup_mu);
    if (rc < 0) {
        if (g->live_fd >= 0)
            close(g->live_fd);
        g->live_fd = old_live;
        g->a = old;
        return false;
    }
    if (old_live >= 0)
        close(old_live); /* our liveness locks on the old file go with it */
    (void)old; /* stays mapped (see RETIRED_MAX) */
    if (++g->retired == RETIRED_MAX)
        sg_log_once(&retired_logged, "the GPU arbiter region was replaced %d times: this process "
                    "no longer follows it and launches unarbitrated", RETIRED_MAX);
    sg_arb_forget_hold(g);
    sg_arb_hold_reset(g);
    g->client = -1; /* a new entry in the new region at this launch */
    return true;
}

/* Copy the tenant's limits into its entry when they differ.  Under the region lock.  The values
 * are compared, not only the generation: a tenant re-created under the same name starts again
 * at generation 0 with other limits, and must not inherit the old entry's. */
void sg_arb_tenant_sync_locked(struct sg_arbiter *a, int ti, const struct sg_limits_device *d,
                               uint64_t gen)
{
    struct sg_arb_tenant *t = &a->tenants[ti];
    uint32_t ceiling = d->policy == SG_POLICY_BURST ? d->ceiling_permille
                       : d->policy == SG_POLICY_CAP ? d->share_permille
                                                    : 1000;
    uint32_t weight = d->weight ? d->weight : 1;
    if (t->limits_generation == gen && t->policy == d->policy && t->priority == d->priority &&
        t->share_permille == d->share_permille && t->ceiling_permille == ceiling &&
        t->weight == weight)
        return;
    t->policy = d->policy;
    t->priority = d->priority;
    t->share_permille = d->share_permille;
    t->ceiling_permille = ceiling;
    t->weight = weight;
    t->limits_generation = gen;
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++)
        if (a->clients[c].pid && a->clients[c].tenant == (uint32_t)ti)
            a->clients[c].priority = d->priority;
}

/* Our tenant's entry, made when missing.  An entry of our name and another incarnation is a
 * deleted tenant's: nothing of it (GPU time, virtual time, ceiling debt) is ours, and once no
 * process of it is left its slot is the one we take. */
static int find_tenant_locked(struct sg_arbiter *a, uint64_t now)
{
    int fresh = -1, reuse = -1, stale = -1;
    for (int t = 0; t < SG_ARB_MAX_TENANTS; t++) {
        struct sg_arb_tenant *te = &a->tenants[t];
        if (te->tenant_id[0] == 0) {
            if (fresh < 0)
                fresh = t;
            continue;
        }
        bool named = strncmp(te->tenant_id, tenant_id, SG_TENANT_ID_LEN) == 0;
        if (named && te->incarnation == tenant_incarnation)
            return t;
        if (te->clients != 0)
            continue;
        if (named)
            stale = t;
        else if (reuse < 0 || te->last_active_ns < a->tenants[reuse].last_active_ns)
            reuse = t;
    }
    int t = stale >= 0 ? stale : fresh >= 0 ? fresh : reuse;
    if (t < 0)
        return -1;
    struct sg_arb_tenant *te = &a->tenants[t];
    memset(te, 0, sizeof *te);
    memcpy(te->tenant_id, tenant_id, SG_TENANT_ID_LEN);
    te->tenant_id[SG_TENANT_ID_LEN - 1] = 0;
    te->incarnation = tenant_incarnation;
    te->bucket_ns = sg_arb_min_grant_ns(a); /* one grant's credit to start, not a whole quantum */
    te->bucket_ts_ns = now;
    return t;
}

/* Under the region lock: a free entry for us (*c) and our tenant's entry (*t), or *c = -1 when
 * there is none we may take: our tenant holds SG_ARB_TENANT_MAX_CLIENTS, or none is free even
 * after reaping the dead. */
static void claim_entry_locked(struct sg_gpu *g, int *c, int *t, uint64_t now)
{
    struct sg_arbiter *a = g->a;
    for (int pass = 0; pass < 2 && *c < 0; pass++) {
        for (int i = 0; i < SG_ARB_MAX_CLIENTS; i++) {
            /* Our identity but not ours: what this process held before an exec. */
            if (sg_arb_client_is_mine(&a->clients[i]))
                sg_arb_free_client_locked(a, i);
        }
        *t = find_tenant_locked(a, now);
        bool room = *t >= 0 && a->tenants[*t].clients < SG_ARB_TENANT_MAX_CLIENTS;
        /* The liveness lock is taken before the entry is published; a byte still locked
         * belongs to a live process that lost its entry by mistake: leave it. */
        for (int i = 0; room && i < SG_ARB_MAX_CLIENTS; i++)
            if (a->clients[i].pid == 0 &&
                (sg_live_hold(g->live_fd, (uint32_t)i) || g->live_fd < 0)) {
                *c = i;
                break;
            }
        if (*c < 0)
            sg_arb_reap_and_pick_locked(a);
    }
}

/* Claim our client entry (and our tenant's), start the watcher.  Caller holds g->mu. */
int sg_arb_ensure_client(struct sg_gpu *g, struct sg_err *e)
{
    if (g->client >= 0)
        return 0;
    if (!g->a && open_region(g, e) < 0) {
        sg_break("%s", e->msg);
        return SG_E_CONFIG;
    }
    pthread_mutex_lock(&setup_mu);
    if (!sg_arb_self.pid)
        sg_identity_read(&sg_arb_self);
    struct sg_limits_device d = alim.devices[g->idx];
    uint64_t gen = alim.generation;
    pthread_mutex_unlock(&setup_mu);
    int slot = sg_usage_slot();
    g->usage = slot >= 0 ? &sg_usage_map->procs[slot].dev[g->idx] : NULL;
    struct sg_arbiter *a = g->a;
    int c, t;
    bool waited = false;
    for (;;) {
        c = t = -1;
        if (sg_arb_lock(a) < 0)
            return sg_fail(e, SG_E_CONFIG, "cannot lock the GPU arbiter");
        claim_entry_locked(g, &c, &t, sg_mono_ns());
        if (c >= 0)
            break;
        /* No entry we may take (our tenant holds its limit, or every entry is live): wait for
         * one to be freed, as for the token, instead of failing the launch. */
        if (!waited)
            a->entry_waits++;
        sg_arb_unlock(a);
        if (!waited)
            sg_log_once(&entry_logged,
                        "waiting for a GPU arbiter entry (a tenant may hold %d per GPU, %d in all)",
                        SG_ARB_TENANT_MAX_CLIENTS, SG_ARB_MAX_CLIENTS);
        waited = true;
        struct timespec ts = {0, (long)LIVENESS_POLL_NS};
        nanosleep(&ts, NULL);
        if (g->usage)
            __atomic_fetch_add(&g->usage->wait_ns, LIVENESS_POLL_NS, __ATOMIC_RELAXED);
    }
    struct sg_arb_client *cl = &a->clients[c];
    uint32_t wake = cl->wake, watch = cl->watch;
    memset(cl, 0, sizeof *cl);
    cl->wake = wake;
    cl->watch = watch;
    cl->pid = sg_arb_self.pid;
    cl->start_time = sg_arb_self.start;
    cl->pidns = sg_arb_self.pidns;
    cl->flags = g->live_fd >= 0 ? SG_ENTRY_LIVE_LOCK : 0;
    cl->tenant = (uint32_t)t;
    cl->state = SG_ARB_IDLE;
    a->tenants[t].clients++;
    sg_arb_tenant_sync_locked(a, t, &d, gen);
    cl->priority = a->tenants[t].priority;
    sg_arb_unlock(a);
    g->client = c;
    g->tenant = t;
    pthread_mutex_lock(&setup_mu);
    bool start = !watcher_started;
    watcher_started = true;
    pthread_mutex_unlock(&setup_mu);
    if (start)
        sg_arb_start_watcher();
    return 0;
}
