/*
 * Unit test driver of the arbiter's scheduling decisions (arbsched.c), compiled with it and
 * predict.c alone by tests/integration/test_sched.py: one region in memory, a fake clock, no processes.
 * Reads commands on stdin (times in microseconds) and answers each with one line of key=value
 * pairs:
 *   quantum US                       the region's quantum
 *   tenant I POLICY SHARE CEIL W T   tenant entry I made at T: share|cap|burst, permille,
 *                                    weight (its bucket starts with one grant's credit)
 *   client C I PRIO                  client entry C of tenant I: offline|normal|online, idle
 *                                    (I out of range: a client that names no tenant)
 *   wait C T                         client C asks for the token at T -> waiting
 *   pick T                           the best eligible waiter at T -> best (-1: none)
 *   grant C T                        the token to client C at T -> quantum (its length)
 *   pay C USED T                     client C's tenant pays USED µs at T -> vtime, bucket
 *   holdback UNTIL                   offline grants held back until UNTIL -> until
 *   lend C W T                       may holder C lend its host gap to waiter W at T -> lend
 *   dry I PENDING T                  would tenant I's ceiling bucket at T fall below a grant
 *                                    once PENDING µs more were paid -> dry
 *   run T0 MS                        every client waits for ever from T0; for MS ms each grant
 *                                    holds a whole quantum (or what its ceiling allows) and
 *                                    is paid, the ceiling tenants sit out while throttled ->
 *                                    each tenant's share of the time (permille), idle permille
 */
#include <stdio.h>
#include <string.h>

#include "../arbsched.h"

static struct sg_arbiter region;

/* The hand-over records (arbregion.c): this region has none, as the agent's mapping has none. */
struct sg_arb_handoff *sg_arb_handoffs(const struct sg_arbiter *a)
{
    (void)a;
    return NULL;
}

static unsigned long long us(uint64_t ns)
{
    return (unsigned long long)(ns / 1000);
}

static uint32_t named(const char *word, const char *const names[], int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(word, names[i]))
            return (uint32_t)i;
    fprintf(stderr, "sched_test: unknown name %s\n", word);
    return 0;
}

static void wait_at(struct sg_arbiter *a, int c, uint64_t now)
{
    struct sg_arb_client *cl = &a->clients[c];
    if (cl->state != SG_ARB_WAITING)
        a->waiting++;
    cl->state = SG_ARB_WAITING;
    cl->wait_since_ns = now;
    a->tenants[cl->tenant].last_active_ns = now;
}

/* Saturating clients: every client waits again as soon as it releases. */
static void run(struct sg_arbiter *a, uint64_t t0, uint64_t ms)
{
    uint64_t now = t0, end = t0 + ms * 1000000ull, idle = 0;
    uint64_t before[SG_ARB_MAX_TENANTS];
    for (int t = 0; t < SG_ARB_MAX_TENANTS; t++)
        before[t] = a->tenants[t].gpu_time_ns;
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++)
        if (a->clients[c].pid)
            wait_at(a, c, now);
    while (now < end) {
        int best = sg_arb_pick_locked(a, now);
        if (best < 0) {
            now += 100000; /* nobody eligible: the card idles 0.1 ms, the buckets refill */
            idle += 100000;
            continue;
        }
        sg_arb_grant_locked(a, best, now);
        uint64_t held = a->quantum_end_ns - now;
        if (held < 1000)
            held = 1000;
        now += held;
        sg_arb_pay_locked(a, best, held, now);
        a->clients[best].grant_ns = now;
        a->token = SG_ARB_TOKEN(SG_ARB_TOKEN_GEN(a->token), -1);
        wait_at(a, best, now);
    }
    uint64_t span = now - t0;
    for (int t = 0; t < SG_ARB_MAX_TENANTS; t++)
        if (a->tenants[t].tenant_id[0])
            printf("t%d=%llu ", t,
                   (unsigned long long)((a->tenants[t].gpu_time_ns - before[t]) * 1000 / span));
    printf("idle=%llu\n", (unsigned long long)(idle * 1000 / span));
}

int main(void)
{
    static const char *const policies[] = {"share", "cap", "burst"};
    static const char *const classes[] = {"offline", "normal", "online"};
    struct sg_arbiter *a = &region;
    a->quantum_ns = SG_ARB_DEFAULT_QUANTUM_NS;
    a->online_window_ns = SG_ARB_DEFAULT_ONLINE_WINDOW_NS;
    a->token = SG_ARB_TOKEN(0, -1);
    char cmd[32], w1[16], w2[16];
    unsigned long long x, y, z, v;
    int i, c;
    while (scanf("%31s", cmd) == 1) {
        if (!strcmp(cmd, "quantum") && scanf("%llu", &x) == 1) {
            a->quantum_ns = x * 1000;
            printf("quantum=%llu\n", us(sg_arb_quantum(a)));
        } else if (!strcmp(cmd, "tenant") &&
                   scanf("%d %15s %llu %llu %llu %llu", &i, w1, &x, &y, &z, &v) == 6) {
            struct sg_arb_tenant *t = &a->tenants[i];
            snprintf(t->tenant_id, sizeof t->tenant_id, "t%d", i);
            t->policy = named(w1, policies, 3);
            t->share_permille = (uint32_t)x;
            t->ceiling_permille = (uint32_t)y;
            t->weight = (uint32_t)z;
            t->bucket_ns = sg_arb_min_grant_ns(a);
            t->bucket_ts_ns = v * 1000;
            printf("tenant=%d ceiling=%d\n", i, sg_arb_has_ceiling(t));
        } else if (!strcmp(cmd, "client") && scanf("%d %d %15s", &c, &i, w2) == 3) {
            struct sg_arb_client *cl = &a->clients[c];
            cl->pid = 1000 + c;
            cl->tenant = (uint32_t)i;
            cl->priority = named(w2, classes, 3);
            cl->state = SG_ARB_IDLE;
            if (i >= 0 && i < SG_ARB_MAX_TENANTS) { /* else a client that names no tenant */
                a->tenants[i].clients++;
                a->tenants[i].priority = cl->priority;
            }
            printf("client=%d\n", c);
        } else if (!strcmp(cmd, "wait") && scanf("%d %llu", &c, &x) == 2) {
            wait_at(a, c, x * 1000);
            printf("waiting=%u\n", a->waiting);
        } else if (!strcmp(cmd, "pick") && scanf("%llu", &x) == 1) {
            printf("best=%d\n", sg_arb_pick_locked(a, x * 1000));
        } else if (!strcmp(cmd, "grant") && scanf("%d %llu", &c, &x) == 2) {
            sg_arb_grant_locked(a, c, x * 1000);
            printf("holder=%d quantum=%llu waiting=%u\n", SG_ARB_TOKEN_HOLDER(a->token),
                   us(a->quantum_end_ns - x * 1000), a->waiting);
        } else if (!strcmp(cmd, "pay") && scanf("%d %llu %llu", &c, &x, &y) == 3) {
            bool paid = sg_arb_pay_locked(a, c, x * 1000, y * 1000);
            const struct sg_arb_tenant *t = &a->tenants[a->clients[c].tenant];
            printf("paid=%d vtime=%llu bucket=%lld gpu_time=%llu\n", paid,
                   (unsigned long long)t->vtime, (long long)t->bucket_ns / 1000,
                   us(t->gpu_time_ns));
        } else if (!strcmp(cmd, "holdback") && scanf("%llu", &x) == 1) {
            a->offline_hold_until_ns = x * 1000;
            printf("until=%llu\n", x);
        } else if (!strcmp(cmd, "lend") && scanf("%d %d %llu", &c, &i, &x) == 3) {
            printf("lend=%d\n", sg_arb_may_lend_locked(a, c, i, x * 1000));
        } else if (!strcmp(cmd, "dry") && scanf("%d %llu %llu", &i, &y, &x) == 3) {
            printf("dry=%d\n", sg_arb_runs_dry_locked(a, &a->tenants[i], y * 1000, x * 1000));
        } else if (!strcmp(cmd, "run") && scanf("%llu %llu", &x, &v) == 2) {
            run(a, x * 1000, v);
        } else {
            fprintf(stderr, "sched_test: bad command %s\n", cmd);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
