/*
 * The agent's side of the GPU arbiter region.  The library is linked against the shim's own
 * arbregion.c and arbsched.c (agentlib/arbregion.c, agentlib/arbsched.c), so reaping a dead
 * client and handing a token it held to the best waiter is the shim's own
 * sg_arb_reap_and_pick_locked (eligibility, ceiling buckets, virtual time, the futex wake of
 * the waiter), and the lock's EOWNERDEAD repair is the shim's.  The agent has no client entry
 * of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../shim/arbregion.h"
#include "internal.h"

static pthread_mutex_t agent_mu = PTHREAD_MUTEX_INITIALIZER;

struct snap {
    int32_t pid;
    uint32_t tenant;
    uint64_t start_time;
};

int sga_arbiter_reap(const char *path, struct sga_arb_reaped *out, int cap,
                     struct sga_arb_result *res, char err[SGA_ERR_LEN])
{
    memset(res, 0, sizeof *res);
    void *m;
    if (sga_map(path, SG_MAGIC_ARBITER, sizeof(struct sg_arbiter), &m, err) < 0)
        return -1;
    struct sg_arbiter *a = m;
    if (a->tenant_slots != SG_ARB_MAX_TENANTS || a->client_slots != SG_ARB_MAX_CLIENTS) {
        sga_unmap(m, sizeof *a);
        return sga_error(err, "%s: %u tenant / %u client slots, expected %d / %d", path,
                         a->tenant_slots, a->client_slots, SG_ARB_MAX_TENANTS, SG_ARB_MAX_CLIENTS);
    }
    pthread_mutex_lock(&agent_mu);
    sg_arb_agent_live_fd = sg_live_open(path);
    static struct snap before[SG_ARB_MAX_CLIENTS]; /* [agent_mu] */
    uint64_t recoveries = a->recoveries;
    int n = 0;
    if (sg_arb_lock(a) < 0) {
        n = sga_error(err, "%s: cannot lock the GPU arbiter mutex", path);
    } else {
        res->recovered = a->recoveries != recoveries;
        int holder = SG_ARB_TOKEN_HOLDER(a->token);
        for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
            before[c].pid = a->clients[c].pid;
            before[c].tenant = a->clients[c].tenant;
            before[c].start_time = a->clients[c].start_time;
        }
        sg_arb_reap_and_pick_locked(a);
        for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
            const struct sg_arb_client *cl = &a->clients[c];
            if (before[c].pid == 0 ||
                (cl->pid == before[c].pid && cl->start_time == before[c].start_time))
                continue;
            if (n < cap) {
                struct sga_arb_reaped *r = &out[n];
                memset(r, 0, sizeof *r);
                r->pid = before[c].pid;
                r->start_time = before[c].start_time;
                r->held_token = c == holder;
                if (before[c].tenant < SG_ARB_MAX_TENANTS)
                    memcpy(r->tenant_id, a->tenants[before[c].tenant].tenant_id,
                           SG_TENANT_ID_LEN - 1);
            }
            n++;
        }
        int now_holder = SG_ARB_TOKEN_HOLDER(a->token);
        if (now_holder >= 0 && now_holder < SG_ARB_MAX_CLIENTS && now_holder != holder)
            res->new_holder_pid = a->clients[now_holder].pid;
        res->reaped = (uint32_t)n;
        sg_arb_unlock(a);
    }
    if (sg_arb_agent_live_fd >= 0)
        close(sg_arb_agent_live_fd);
    sg_arb_agent_live_fd = -1;
    pthread_mutex_unlock(&agent_mu);
    sga_unmap(m, sizeof *a);
    return n;
}

int sga_arbiter_check(const char *path, const uint8_t uuid[16], char err[SGA_ERR_LEN])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        sga_error(err, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? SGA_ARB_MISSING : -1;
    }
    /* A copy, not a mapping: a file shorter than the region is judged, not faulted on. */
    struct sg_arbiter *a = calloc(1, sizeof *a);
    struct stat st;
    ssize_t got = -1;
    if (a && fstat(fd, &st) == 0)
        got = pread(fd, a, sizeof *a, 0);
    int saved = errno;
    close(fd);
    if (!a || got < 0 || !S_ISREG(st.st_mode)) {
        free(a);
        return sga_error(err, "%s: %s", path, got < 0 ? strerror(saved) : "not a regular file");
    }
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_arb_region_problem(a, (uint64_t)st.st_size, uuid, path, &e);
    if (rc == 0 && sg_arb_region_broken(a)) {
        sg_fail(&e, SG_E_CONFIG,
                "%s: a process held its lock past %llu ms (%llu lock attempts gave up); the GPU "
                "runs unarbitrated",
                path, (unsigned long long)(SG_ARB_LOCK_DEADLINE_NS / 1000000),
                (unsigned long long)a->lock_timeouts);
        rc = -1;
    }
    free(a);
    if (rc == 0)
        return SGA_ARB_USABLE;
    snprintf(err, SGA_ERR_LEN, "%s", e.msg);
    return rc > 0 ? SGA_ARB_OTHER_ABI : SGA_ARB_DAMAGED;
}
