/*
 * Clocks: CLOCK_MONOTONIC, and the launch clock that reads it through the CPU's counter.
 *
 * The launch fast path (shim.h, sg_arb_enter) reads the time once per launch: is the quantum
 * over?  clock_gettime through the vDSO costs ~30 ns on a VM, more than the rest of the fast
 * path; the CPU's counter (x86 TSC, arm64 CNTVCT) costs a third of it.  Each thread takes an
 * anchor (CLOCK_MONOTONIC and the counter, read together) on its slow path, and the fast path
 * reads anchor + ticks x rate.  An anchor is trusted for SG_ANCHOR_FRESH_NS (a launch after
 * that reads clock_gettime once and anchors anew): CLOCK_MONOTONIC to within the rate's error
 * and the counter's drift over 5 ms (NTP slews at most 500 ppm: 2.5 us).  The rate is measured
 * from a baseline taken at setup to each later anchor; until it is known, where the kernel does
 * not trust the TSC (another clocksource), or on another architecture, the fast path reads
 * clock_gettime.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shim.h"

uint64_t sg_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the launch clock ------------------------------------------------------------------------ */

#define SG_ANCHOR_FRESH_NS 5000000ull /* how long an anchor is trusted */
#define SG_CAL_MIN_NS 10000000ull     /* the shortest baseline the rate is measured over */
uint64_t sg_tick_mult; /* [atomic relaxed] ns per tick << 32; 0: read clock_gettime */
static struct sg_clock_anchor cal;  /* [cal_mu] the first anchor, and the rate's baseline */
static uint64_t cal_span_ns;        /* [cal_mu] the span the rate was last measured over */
static pthread_mutex_t cal_mu = PTHREAD_MUTEX_INITIALIZER;
static int ticks_usable = -1;       /* [cal_mu] -1 unknown */

static bool counter_trusted(void)
{
#if defined(__x86_64__)
    char src[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    if (f) {
        if (!fgets(src, sizeof src, f))
            src[0] = '\0';
        fclose(f);
    }
    return strcmp(src, "tsc\n") == 0; /* the kernel keeps it synchronised across CPUs */
#elif defined(__aarch64__)
    return true; /* the generic timer: one system-wide counter */
#else
    return false;
#endif
}

/* The two clocks read together: a pair the thread was preempted inside (the counter moved
 * more than ~5 us across the clock read) is read again, or the rate would carry the gap. */
static void read_pair(struct sg_clock_anchor *a)
{
    for (int tries = 0; tries < 4; tries++) {
        uint64_t before = sg_ticks();
        a->ns = sg_mono_ns();
        uint64_t after = sg_ticks();
        a->ticks = before + (after - before) / 2;
        if (after - before < 10000u)
            break;
    }
    a->fresh = 0;
}

/* The rate's baseline, taken at setup (every process of a tenant, most of which never launch):
 * only the pair of clock reads.  Whether the kernel trusts the counter (a file read: four
 * system calls, a third of the shim's start-up work) is asked at the first real anchor, on
 * the launch slow path; a baseline on a counter that turns out untrusted is never used. */
void sg_clock_baseline(void)
{
    struct sg_clock_anchor a;
    read_pair(&a);
    pthread_mutex_lock(&cal_mu);
    if (ticks_usable != 0 && a.ticks && !cal.ns)
        cal = a;
    pthread_mutex_unlock(&cal_mu);
}

uint64_t sg_clock_anchor(struct sg_clock_anchor *a)
{
    read_pair(a);
    uint64_t now = a->ns;
    pthread_mutex_lock(&cal_mu);
    if (ticks_usable < 0)
        ticks_usable = counter_trusted();
    if (!ticks_usable || !a->ticks) {
        a->ns = 0;
    } else if (!cal.ns) {
        cal = *a;
    } else if (a->ns - cal.ns >= SG_CAL_MIN_NS && a->ns - cal.ns >= 2 * cal_span_ns &&
               a->ticks > cal.ticks) {
        /* Re-measured each time the baseline doubles (from 10 ms: a pair's jitter, ~5 us at
         * worst, is 0.05% of it, 2.5 us of a fresh anchor's 5 ms; at 1 s, 5 ppm). */
        cal_span_ns = a->ns - cal.ns;
        uint64_t mult = (uint64_t)(((unsigned __int128)cal_span_ns << 32) / (a->ticks - cal.ticks));
        __atomic_store_n(&sg_tick_mult, mult, __ATOMIC_RELAXED);
    }
    uint64_t mult = __atomic_load_n(&sg_tick_mult, __ATOMIC_RELAXED);
    if (a->ns && mult)
        a->fresh = (uint64_t)(((unsigned __int128)SG_ANCHOR_FRESH_NS << 32) / mult);
    pthread_mutex_unlock(&cal_mu);
    return now;
}

/* Anchor anew once the rate is known (at most once per SG_ANCHOR_FRESH_NS a thread), or every
 * SG_CAL_MIN_NS until it is (each anchor may measure it); otherwise only read the clock, so a
 * launch before the rate is known costs one clock_gettime, not a lock and two clock reads. */
uint64_t sg_clock_stale(struct sg_clock_anchor *a)
{
    if (!a->ns)
        return sg_mono_ns(); /* no anchor: the counter is not trusted here */
    if (a->fresh)
        return sg_clock_anchor(a);
    uint64_t now = sg_mono_ns();
    return now - a->ns >= SG_CAL_MIN_NS ? sg_clock_anchor(a) : now;
}

/* A forked child keeps the rate (same machine, same counter); the lock may have been held. */
void sg_clock_fork_child(void)
{
    pthread_mutex_init(&cal_mu, NULL);
}
