/*
 * The arbiter's scheduling decisions (arbsched.h): pure functions of the region and the time,
 * under the region's lock.
 */
#include "arbsched.h"

#include "futex.h"
#include "predict.h"

bool sg_arb_has_ceiling(const struct sg_arb_tenant *t)
{
    return (t->policy == SG_POLICY_CAP || t->policy == SG_POLICY_BURST) &&
           t->ceiling_permille < 1000;
}

uint64_t sg_arb_quantum(const struct sg_arbiter *a)
{
    uint64_t q = __atomic_load_n(&a->quantum_ns, __ATOMIC_RELAXED);
    if (q < SG_ARB_MIN_QUANTUM_NS)
        q = SG_ARB_MIN_QUANTUM_NS;
    if (q > SG_ARB_MAX_QUANTUM_NS)
        q = SG_ARB_MAX_QUANTUM_NS;
    return q;
}

/* Does a client of tenant t hold the token? */
static bool tenant_holds_locked(const struct sg_arbiter *a, const struct sg_arb_tenant *t)
{
    int h = SG_ARB_TOKEN_HOLDER(a->token);
    return h >= 0 && h < SG_ARB_MAX_CLIENTS && a->clients[h].tenant < SG_ARB_MAX_TENANTS &&
           &a->tenants[a->clients[h].tenant] == t;
}

/* Bring a ceiling bucket up to `now`: it earns credit at the ceiling; the charge of a hold
 * (charge_locked) spends the GPU time the hold used.  While the tenant holds the card the depth
 * cap waits for that charge, so that a hold's earnings and spending are netted before the cap:
 * capping the earnings alone (and charging the hold afterwards) threw away up to C x hold of
 * credit per grant, which held a 90% cap alone to 67%. */
static void refill_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t now)
{
    uint64_t from = t->bucket_ts_ns;
    t->bucket_ts_ns = now;
    if (!sg_arb_has_ceiling(t) || now <= from)
        return;
    uint64_t elapsed = now - from;
    if (elapsed > (uint64_t)INT64_MAX / 2000u)
        elapsed = (uint64_t)INT64_MAX / 2000u;
    int64_t depth = (int64_t)sg_arb_quantum(a);
    int64_t b = t->bucket_ns + (int64_t)(elapsed * t->ceiling_permille / 1000u);
    t->bucket_ns = b > depth && !tenant_holds_locked(a, t) ? depth : b;
}

/* Spend `used` ns of GPU time from tenant t's bucket (earned up to now first). */
static void spend_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t used,
                         uint64_t now)
{
    refill_locked(a, t, now);
    if (!sg_arb_has_ceiling(t))
        return;
    int64_t depth = (int64_t)sg_arb_quantum(a), b = t->bucket_ns - (int64_t)used;
    t->bucket_ns = b > depth ? depth : b;
}

/* A tenant is eligible for a grant unless its ceiling bucket is below the minimum grant.  Half a
 * quantum: each throttle cycle (release, drain, wake, refill the pipeline) loses ~0.1 ms of the
 * tenant's time, so short cycles cost a ceiling tenant its own share (a 1/8-quantum grant left a
 * 50% cap alone at ~48%); half a quantum keeps cycles >= 10 ms at 50%. */
int64_t sg_arb_min_grant_ns(const struct sg_arbiter *a)
{
    return (int64_t)(sg_arb_quantum(a) / 2);
}

bool sg_arb_eligible_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t now)
{
    return !sg_arb_runs_dry_locked(a, t, 0, now);
}

bool sg_arb_runs_dry_locked(struct sg_arbiter *a, struct sg_arb_tenant *t, uint64_t pending,
                            uint64_t now)
{
    if (!sg_arb_has_ceiling(t))
        return false;
    refill_locked(a, t, now);
    return t->bucket_ns - (int64_t)pending < sg_arb_min_grant_ns(a);
}

/* Active: a client waiting or holding, or a request/grant/release within four quanta. */
void sg_arb_active_tenants_locked(struct sg_arbiter *a, uint64_t now, bool active[])
{
    uint64_t win = 4 * sg_arb_quantum(a);
    for (int t = 0; t < SG_ARB_MAX_TENANTS; t++)
        active[t] = a->tenants[t].tenant_id[0] && a->tenants[t].clients > 0 &&
                    now - a->tenants[t].last_active_ns <= win;
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
        const struct sg_arb_client *cl = &a->clients[c];
        if (cl->pid && cl->tenant < SG_ARB_MAX_TENANTS &&
            (cl->state == SG_ARB_WAITING || cl->state == SG_ARB_HOLDING))
            active[cl->tenant] = true;
    }
}

static uint64_t eff_weight_locked(struct sg_arbiter *a, int ti, uint64_t now)
{
    struct sg_arb_tenant *t = &a->tenants[ti];
    uint64_t share = t->share_permille ? t->share_permille : 1;
    if (t->policy == SG_POLICY_CAP || t->policy == SG_POLICY_BURST)
        return share;
    bool active[SG_ARB_MAX_TENANTS];
    sg_arb_active_tenants_locked(a, now, active);
    active[ti] = true;
    uint64_t g = 0, s = 0;
    for (int i = 0; i < SG_ARB_MAX_TENANTS; i++) {
        const struct sg_arb_tenant *o = &a->tenants[i];
        if (!active[i])
            continue;
        if (o->policy == SG_POLICY_CAP || o->policy == SG_POLICY_BURST)
            g += o->share_permille;
        else if (o->policy == SG_POLICY_SHARE)
            s += (uint64_t)(o->share_permille ? o->share_permille : 1) * (o->weight ? o->weight : 1);
    }
    uint64_t rem = g >= 1000 ? 10 : 1000 - g;
    uint64_t w = share * (t->weight ? t->weight : 1) * rem / (s ? s : 1);
    return w ? w : 1;
}

bool sg_arb_pay_locked(struct sg_arbiter *a, int c, uint64_t used, uint64_t now)
{
    struct sg_arb_client *cl = &a->clients[c];
    if (cl->tenant >= SG_ARB_MAX_TENANTS)
        return false;
    struct sg_arb_tenant *t = &a->tenants[cl->tenant];
    __atomic_fetch_add(&t->gpu_time_ns, used, __ATOMIC_RELAXED);
    __atomic_fetch_add(&cl->gpu_time_ns, used, __ATOMIC_RELAXED);
    t->vtime += used * 1000u / eff_weight_locked(a, (int)cl->tenant, now);
    spend_locked(a, t, used, now);
    return true;
}

/* Client c's tenant's virtual time, as if `pending` ns of its work not yet charged were paid. */
static uint64_t vtime_paid_locked(struct sg_arbiter *a, int c, uint64_t pending, uint64_t now)
{
    const struct sg_arb_client *cl = &a->clients[c];
    uint64_t v = a->tenants[cl->tenant].vtime;
    return pending ? v + pending * 1000u / eff_weight_locked(a, (int)cl->tenant, now) : v;
}

/* Is waiter w a better candidate than client c (by class, virtual time with each one's pending
 * work paid, then waiting time)?  Against the holder (c_holds) a tie goes to the waiter, so
 * processes of one tenant alternate. */
static bool better_paid_locked(struct sg_arbiter *a, int w, uint64_t w_pending, int c,
                               uint64_t c_pending, bool c_holds, uint64_t now)
{
    const struct sg_arb_client *x = &a->clients[w], *y = &a->clients[c];
    if (x->priority != y->priority)
        return x->priority > y->priority;
    uint64_t vx = vtime_paid_locked(a, w, w_pending, now), vy = vtime_paid_locked(a, c, c_pending, now);
    if (vx != vy)
        return vx < vy;
    return c_holds || x->wait_since_ns < y->wait_since_ns;
}

bool sg_arb_better_locked(struct sg_arbiter *a, int w, int c, bool c_holds)
{
    return better_paid_locked(a, w, 0, c, 0, c_holds, 0);
}

bool sg_arb_better_pending_locked(struct sg_arbiter *a, int w, uint64_t w_pending, int c,
                                  uint64_t c_pending, uint64_t now)
{
    return better_paid_locked(a, w, w_pending, c, c_pending, true, now);
}

bool sg_arb_may_lend_locked(struct sg_arbiter *a, int c, int w, uint64_t now)
{
    const struct sg_arb_client *x = &a->clients[w], *y = &a->clients[c];
    /* An online holder does not lend: its next burst would wait for the borrower's kernel, and
     * its latency is what the class is for. */
    if (x->priority != y->priority || y->priority == SG_PRIORITY_ONLINE ||
        x->tenant >= SG_ARB_MAX_TENANTS || y->tenant >= SG_ARB_MAX_TENANTS)
        return false;
    uint64_t vw = a->tenants[x->tenant].vtime, vc = a->tenants[y->tenant].vtime;
    uint64_t lag = sg_arb_quantum(a) / 4 * 1000u / eff_weight_locked(a, (int)x->tenant, now);
    return vw >= vc && vw - vc < lag;
}

/* The best eligible waiter, or -1. */
int sg_arb_pick_locked(struct sg_arbiter *a, uint64_t now)
{
    int best = -1;
    for (int c = 0; c < SG_ARB_MAX_CLIENTS; c++) {
        struct sg_arb_client *cl = &a->clients[c];
        if (cl->pid == 0 || cl->state != SG_ARB_WAITING || cl->tenant >= SG_ARB_MAX_TENANTS)
            continue;
        if (!sg_arb_eligible_locked(a, &a->tenants[cl->tenant], now))
            continue;
        if (cl->priority == SG_PRIORITY_OFFLINE &&
            (now < a->offline_hold_until_ns || now < a->offline_quiet_until_ns))
            continue; /* held back ahead of a predicted online request, or a quiet window */
        if (best < 0 || sg_arb_better_locked(a, c, best, false))
            best = c;
    }
    return best;
}

/* Quantum length for client c from now: the quantum, shortened so that a ceiling bucket does
 * not run dry (it drains at 1 - ceiling while held). */
uint64_t sg_arb_quantum_len_locked(struct sg_arbiter *a, int c, uint64_t now)
{
    uint64_t q = sg_arb_quantum(a);
    struct sg_arb_tenant *t = &a->tenants[a->clients[c].tenant];
    if (sg_arb_has_ceiling(t)) {
        refill_locked(a, t, now);
        int64_t b = t->bucket_ns > 0 ? t->bucket_ns : 0;
        uint64_t tte = (uint64_t)b * 1000u / (1000u - t->ceiling_permille);
        if (tte < q)
            q = tte;
    }
    return q;
}

void sg_arb_grant_locked(struct sg_arbiter *a, int c, uint64_t now)
{
    struct sg_arb_client *cl = &a->clients[c];
    uint64_t gen = SG_ARB_TOKEN_GEN(a->token) + 1;
    a->quantum_end_ns = now + sg_arb_quantum_len_locked(a, c, now);
    a->grant_ns = now;
    cl->grant_ns = now;
    if (cl->state == SG_ARB_WAITING && a->waiting > 0)
        __atomic_store_n(&a->waiting, a->waiting - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&cl->state, SG_ARB_HOLDING, __ATOMIC_RELAXED);
    __atomic_store_n(&cl->yield, 0, __ATOMIC_RELAXED);
    struct sg_arb_handoff *h = sg_arb_handoffs(a);
    if (h) { /* queued behind the last holder's work, if it may still run (ABI 1.12) */
        h[c].behind = a->queued_by;
        h[c].behind_seq = a->queued_seq;
        h[c].offer = 0; /* a new hold offers nothing yet */
    }
    a->grants++;
    struct sg_arb_tenant *t = &a->tenants[cl->tenant];
    __atomic_fetch_add(&t->grants, 1, __ATOMIC_RELAXED);
    t->last_active_ns = now;
    if (cl->priority == SG_PRIORITY_ONLINE)
        sg_predict_served(a);
    __atomic_store_n(&a->token, SG_ARB_TOKEN(gen, c), __ATOMIC_RELEASE);
    __atomic_fetch_add(&cl->wake, 1, __ATOMIC_RELEASE);
    sg_futex_wake(&cl->wake, true);
}

void sg_arb_note_online_locked(struct sg_arbiter *a, int c, uint64_t now)
{
    if (a->clients[c].priority != SG_PRIORITY_ONLINE)
        return;
    uint64_t until = now + __atomic_load_n(&a->online_window_ns, __ATOMIC_RELAXED);
    if (until > __atomic_load_n(&a->online_active_until_ns, __ATOMIC_RELAXED))
        __atomic_store_n(&a->online_active_until_ns, until, __ATOMIC_RELAXED);
}
