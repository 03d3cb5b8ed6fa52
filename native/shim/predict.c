/* Predicted online requests: see predict.h. */
#include "predict.h"

/* Off-beat requests before the prediction is suspended (see sg_predict_next): one is a stray
 * request, a second in a row a stall or a changed pattern. */
#define SUSPEND_OUTLIERS 2
/* A candidate pattern replaces the learned one after this many consistent intervals spanning
 * at least this many learned periods.  A stall looks like a new pattern for a while (a service
 * on absolute deadlines catches up: its late requests come at shorter, even intervals); the
 * old beat returning ends it.  So a change must outlast a stall's look-alikes: the bench's bad
 * periodic runs had 4 late requests in a row. */
#define RELEARN_INTERVALS 4
#define RELEARN_SPAN_PERIODS 2
/* The host time is trusted after the first gap and two consistent ones: random requests
 * (exponential gaps) give two gaps within an eighth of each other about one time in ten, and
 * each such pair would hold offline work back for a request that may not come. */
#define GAP_MIN_SAMPLES 3

static void forget_candidate(struct sg_arbiter *a)
{
    a->online_cand_period_ns = 0;
    a->online_cand_last_ns = 0;
    a->online_cand_samples = 0;
}

static void restart_learning(struct sg_arbiter *a, uint64_t now, uint64_t period)
{
    __atomic_store_n(&a->online_last_arrival_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_period_ns, period, __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_jitter_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_samples, period ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_outliers, 0, __ATOMIC_RELAXED);
    forget_candidate(a);
}

/* How far a request at `now` is from continuing the candidate pattern, in ns, or UINT64_MAX
 * when there is no candidate interval yet. */
static uint64_t candidate_dev(const struct sg_arbiter *a, uint64_t now)
{
    uint64_t last = a->online_cand_last_ns, cp = a->online_cand_period_ns;
    if (!last || !cp || now <= last)
        return UINT64_MAX;
    uint64_t iv = now - last;
    return iv > cp ? iv - cp : cp - iv;
}

/* Does a request at `now` continue the candidate pattern (within an eighth of its period)? */
static bool fits_candidate(const struct sg_arbiter *a, uint64_t now)
{
    uint64_t dev = candidate_dev(a, now);
    return dev != UINT64_MAX && dev * 8 <= a->online_cand_period_ns;
}

/* An off-beat request: learn the candidate pattern from it, and adopt the candidate once it
 * has held long enough (RELEARN_*) to be more than a stall. */
static void learn_candidate(struct sg_arbiter *a, uint64_t now, uint64_t learned_period)
{
    uint64_t last = a->online_cand_last_ns, cp = a->online_cand_period_ns;
    bool fits = fits_candidate(a, now);
    a->online_cand_last_ns = now;
    if (!last || now <= last)
        return; /* the candidate's first request */
    uint64_t iv = now - last;
    if (!fits) {
        a->online_cand_period_ns = iv; /* its first interval, or a new start */
        a->online_cand_samples = 1;
        return;
    }
    cp = (cp * 3 + iv) / 4;
    a->online_cand_period_ns = cp;
    uint32_t n = ++a->online_cand_samples;
    if (n < RELEARN_INTERVALS || cp * n < RELEARN_SPAN_PERIODS * learned_period)
        return;
    a->online_relearns++;
    restart_learning(a, now, cp);
    __atomic_store_n(&a->online_samples, HOLDBACK_MIN_SAMPLES, __ATOMIC_RELAXED);
}

/* The host time of a closed-loop service: a request at `now` after the last one's work ended.
 * A service that waits for each request before its host time keeps no beat while its requests
 * wait behind offline work (each wait moves every later request), but keeps its host time:
 * beside 2 ms offline kernels a service of 4 x 0.2 ms requests with 5 ms of host time learned
 * no beat in 3 s (50-65 patterns adopted and dropped), each request waited for an offline
 * kernel and it got 11.4% of the card where it asks 13.6%.  Predicted from its host time, its
 * requests find the card free, and then keep a beat too.  A gap off by more than an eighth
 * starts the learning over from it (GAP_MIN_SAMPLES). */
static void learn_gap(struct sg_arbiter *a, uint64_t now)
{
    uint64_t end = a->online_last_end_ns;
    a->online_last_end_ns = 0; /* the next request came: the gap is closed */
    if (!end || now <= end)
        return; /* no end since the last request (it kept the token through): nothing to learn */
    uint64_t gap = now - end, g = a->online_gap_ns;
    uint32_t n = a->online_gap_samples;
    uint64_t dev = gap > g ? gap - g : g - gap;
    if (gap > __atomic_load_n(&a->online_window_ns, __ATOMIC_RELAXED) || !g || dev * 8 > g) {
        a->online_gap_ns = gap; /* a first gap, a pause in traffic, or a changed host time */
        a->online_gap_jitter_ns = 0;
        a->online_gap_samples = 1;
        return;
    }
    a->online_gap_jitter_ns = n < 2 ? dev : (a->online_gap_jitter_ns * 3 + dev) / 4;
    a->online_gap_ns = (g * 3 + gap) / 4;
    if (n < 1000)
        a->online_gap_samples = n + 1;
}

void sg_predict_note_end(struct sg_arbiter *a, uint64_t end)
{
    if (end > a->online_last_end_ns)
        a->online_last_end_ns = end;
}

/* An online client starts a request (it asks for the token): learn the period of requests.
 *
 * An interval of about k periods (2 <= k <= 8) is k - 1 requests served without asking (the
 * client still held the token) and counts as one period.  A longer gap (a pause in traffic,
 * or one longer than the online window) teaches nothing but keeps the phase.  Against an
 * established period (while learning, only single periods count) an interval off by more than
 * an eighth is an outlier.  The first is ignored (a stray request).  From the second in a row
 * the prediction is suspended, but the learned period and phase are kept: the off-beat
 * requests are learned apart as a candidate pattern.  A request back on the old beat ends the
 * run (a stall: late requests, then the old beat again) and the prediction resumes at once; a
 * candidate that holds for RELEARN_INTERVALS consistent intervals replaces the learned pattern
 * (a changed period or phase).  Until ABI 1.8 the second outlier restarted learning, so a
 * stall of a few requests left the following ones unpredicted until two consistent intervals
 * were learned again (the periodic bench's 2.6x run).  The prediction is trusted after two
 * consistent intervals (sg_predict_next). */
void sg_predict_note_arrival(struct sg_arbiter *a, uint64_t now)
{
    learn_gap(a, now);
    uint64_t last = a->online_last_arrival_ns;
    if (!last || now <= last) {
        __atomic_store_n(&a->online_last_arrival_ns, now, __ATOMIC_RELAXED);
        return;
    }
    uint64_t iv = now - last, p = a->online_period_ns;
    uint32_t n = a->online_samples, outliers = a->online_outliers;
    uint64_t k = p ? (iv + p / 2) / p : 0;
    if (iv > __atomic_load_n(&a->online_window_ns, __ATOMIC_RELAXED)) {
        /* Traffic paused: keep what was learned, re-anchor at this request. */
        __atomic_store_n(&a->online_last_arrival_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&a->online_outliers, 0, __ATOMIC_RELAXED);
        forget_candidate(a);
        return;
    }
    if (k > 8) {
        /* A gap of many periods: re-anchor, keeping the period.  Learned as a candidate too, so
         * that a service that slowed down by more than 8 times is learned. */
        __atomic_store_n(&a->online_last_arrival_ns, now, __ATOMIC_RELAXED);
        learn_candidate(a, now, p);
        return;
    }
    /* Off by more than an eighth of a period from the nearest multiple: an outlier. */
    uint64_t kp = k * p, dev = iv > kp ? iv - kp : kp - iv;
    bool outlier = k == 0 || dev * 8 > p || (k > 1 && n < HOLDBACK_MIN_SAMPLES);
    if (!p || (outlier && n < HOLDBACK_MIN_SAMPLES)) {
        restart_learning(a, now, iv); /* still learning: start over from this interval */
        return;
    }
    /* During a run of outliers, a request that fits both patterns is the one's it fits better
     * (relative to the period), the candidate's on a tie: 15 ms requests against a 20 ms beat
     * fall on the old beat every fourth, and a stalled service's requests, late by less each
     * time, reach the old beat at about the candidate's next instant. */
    if (!outlier && outliers > 0 && fits_candidate(a, now) &&
        candidate_dev(a, now) * p <= dev * a->online_cand_period_ns)
        outlier = true;
    /* Resuming a suspended prediction takes a request close to the beat, closer than the
     * eighth that keeps a running one: random traffic falls within an eighth of some multiple
     * of the period one time in four, and each such request resumed hold-backs for nothing
     * (23-30 per 60 random requests instead of 12-20). */
    uint64_t resume_dev = 4 * a->online_jitter_ns > p / 32 ? 4 * a->online_jitter_ns : p / 32;
    if (!outlier && outliers >= SUSPEND_OUTLIERS && dev > resume_dev)
        outlier = true;
    if (outlier) {
        /* The instant is not the beat's: the phase stays at the last request on it, so that
         * the next one on the beat (k periods later) is not an outlier. */
        if (outliers < UINT32_MAX)
            __atomic_store_n(&a->online_outliers, outliers + 1, __ATOMIC_RELAXED);
        learn_candidate(a, now, p);
        return;
    }
    if (outliers >= SUSPEND_OUTLIERS)
        a->online_stalls++; /* back on the beat after a stall */
    /* The phase follows the beat, not each request: a request later than its beat (a timer
     * fires late, never early) moves it a quarter of the way, an earlier one all the way.
     * Anchored at a late request, the next prediction was late by as much, the next request
     * (on time) came before the hold-back began and was preempted early. */
    __atomic_store_n(&a->online_last_arrival_ns, now <= last + kp ? now : last + kp + dev / 4,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_outliers, 0, __ATOMIC_RELAXED);
    forget_candidate(a);
    dev /= k;
    uint64_t j = n < 2 ? dev : (a->online_jitter_ns * 3 + dev) / 4;
    __atomic_store_n(&a->online_jitter_ns, j, __ATOMIC_RELAXED);
    __atomic_store_n(&a->online_period_ns, (p * 3 + iv / k) / 4, __ATOMIC_RELAXED);
    if (n < 1000)
        __atomic_store_n(&a->online_samples, n + 1, __ATOMIC_RELAXED);
}

/* The next online request the learned period predicts (else, for a closed-loop service, the
 * learned host time after the last request's end), or 0 when the prediction is not trusted
 * (too few samples, too much jitter) or would hold back too long.  *late: how long
 * past the predicted instant the hold-back waits for it. */
uint64_t sg_predict_next(struct sg_arbiter *a, uint64_t now, uint64_t kernel_ns, uint64_t *late,
                         uint64_t *launch_by)
{
    if (launch_by)
        *launch_by = 0;
    uint64_t hmax = __atomic_load_n(&a->holdback_max_ns, __ATOMIC_RELAXED);
    uint64_t p = __atomic_load_n(&a->online_period_ns, __ATOMIC_RELAXED);
    uint64_t j = __atomic_load_n(&a->online_jitter_ns, __ATOMIC_RELAXED);
    uint64_t last = __atomic_load_n(&a->online_last_arrival_ns, __ATOMIC_RELAXED);
    uint32_t n = __atomic_load_n(&a->online_samples, __ATOMIC_RELAXED);
    /* The next request is one of the beat's, or else the host time after the last request's
     * end (a closed-loop service; its gap stands for the period in the margins below). */
    bool beat = p && last && n >= HOLDBACK_MIN_SAMPLES && j * 8 <= p && now >= last &&
                __atomic_load_n(&a->online_outliers, __ATOMIC_RELAXED) < SUSPEND_OUTLIERS;
    uint64_t end = __atomic_load_n(&a->online_last_end_ns, __ATOMIC_RELAXED);
    if (!beat) {
        p = __atomic_load_n(&a->online_gap_ns, __ATOMIC_RELAXED);
        j = __atomic_load_n(&a->online_gap_jitter_ns, __ATOMIC_RELAXED);
        if (!end || now < end || !p || j * 8 > p ||
            __atomic_load_n(&a->online_gap_samples, __ATOMIC_RELAXED) < GAP_MIN_SAMPLES)
            end = 0;
    }
    if (!hmax || (!beat && !end))
        return 0; /* not learned, too irregular, or suspended by requests off the beat */
    /* The longest hold-back this may cause is the smaller of holdback_max and half the period
     * (it was a quarter: kernels over a fifth of the period then got no hold-back, and every
     * request waited for the GPU's time slice).  Kernels that leave no room for the fixed
     * margins within it get no prediction (the in-flight bound alone applies); otherwise the
     * jitter's share of each margin (2 jitter) is cut to fit: a jitter inflated by one late
     * request on a busy host then narrows the window instead of turning prediction off for the
     * requests until it decays. */
    uint64_t room = hmax < p / 2 ? hmax : p / 2;
    uint64_t fixed = kernel_ns + HOLDBACK_EARLY_NS + HOLDBACK_LATE_NS;
    if (fixed > room)
        return 0;
    uint64_t jit = 2 * j;
    if (fixed + 2 * jit > room)
        jit = (room - fixed) / 2;
    uint64_t early = HOLDBACK_EARLY_NS + jit;
    /* An overdue request is waited for one more offline kernel, as far as the room allows: its
     * timer fired late (0.9-2.3 ms on the bench's loaded VM), and ending the hold-back at the
     * fixed margin let an offline kernel start just before it, which it then waited behind
     * (every queued request of the periodic repeats after a run's first).  Waiting costs the
     * offline job at most that kernel, and only when a request is late or never comes. */
    uint64_t spare = room - fixed - 2 * jit;
    *late = HOLDBACK_LATE_NS + jit + (kernel_ns < spare ? kernel_ns : spare);
    uint64_t next;
    if (beat) {
        uint64_t k = (now - last) / p;
        next = last + (k ? k : 1) * p;
        if (next + *late <= now)
            next += p;
    } else {
        next = end + p;
        if (next + *late <= now)
            return 0; /* overdue past the wait: no host time to predict from until it comes */
    }
    if (now + kernel_ns + early >= next)
        return next;
    if (launch_by)
        *launch_by = next - kernel_ns - early;
    return 0;
}

/* Under the region lock: may a hold-back start now?  The request the previous hold-back waited
 * for may never have come (no online grant cleared it); two such misses in a row suspend the
 * prediction as two requests off the beat do, until a request comes on the beat again or a
 * new pattern is learned. */
bool sg_predict_holdback_allowed(struct sg_arbiter *a, uint64_t now)
{
    uint64_t prev = a->offline_hold_until_ns;
    if (!prev || prev > now)
        return true;
    a->holdback_misses++;
    a->offline_hold_until_ns = 0;
    if (++a->misses_in_row < 2)
        return true;
    a->misses_in_row = 0;
    if (a->online_outliers < SUSPEND_OUTLIERS)
        __atomic_store_n(&a->online_outliers, SUSPEND_OUTLIERS, __ATOMIC_RELAXED);
    a->online_gap_samples = 0; /* nor the host time, until two consistent gaps again */
    return false;
}

/* An online request was granted the token: the hold-back that waited for it is over. */
void sg_predict_served(struct sg_arbiter *a)
{
    a->offline_hold_until_ns = 0;
    a->misses_in_row = 0;
}

/* A decaying maximum (an eighth off per sync), so that the hold-back allows for the longest
 * recent kernel.  A sync whose process the host stalled returns long after the work ended, and
 * a maximum takes that stall for a kernel: 14 ms after one on the bench's 2-core VM, for 2 ms
 * kernels, more than the hold-back may last (half the period), so the prediction turned itself
 * off and the next request found an offline kernel running.  So a measurement may at most
 * double the estimate: a stall costs a few hold-backs that start early, and kernels that really
 * got longer are followed within a few syncs (0.5 to 8 ms in four). */
uint64_t sg_predict_kernel_estimate(uint64_t est, uint64_t measured)
{
    uint64_t decayed = est - est / 8;
    if (est && measured / 2 > est)
        measured = 2 * est;
    return measured > decayed ? measured : decayed;
}
