/* Time: CLOCK_MONOTONIC is system-wide, so instants written by one process mean the same to all. */
#include "sim.h"

#include <errno.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no syscall */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t sim_realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000u;
}

/* The least a sleep ends ahead of its instant, the rest spun, and the margin kept over the
 * learned lateness (the lateness varies from one wake-up to the next). */
#define MIN_LEAD_NS 15000ull
#define LEAD_MARGIN_NS 5000ull
/* What is learned of the timer's lateness counts at most this much: a stalled host must not
 * make every later wait spin for long. */
#define LATE_MAX_NS 100000ull

/* How late this process's timed sleeps wake (a moving average): 20-35 µs on a 2-core VM even
 * with a slack of 1 ns, ~5 µs on an idle physical host. */
static uint64_t late_ns = 20000;

/* A synchronising call returns when its work completes, as a driver's spinning or yielding wait
 * does (within a few µs).  A sleeping thread is woken up to its timer slack late (50 µs by
 * default), which made every sync here ~45 µs later than the work: a program that waits for its
 * own work lost that much per wait, far more than on a GPU.  So the wait sleeps with the
 * smallest slack and gives the thread its own slack back afterwards.  Even then a VM's timer
 * wakes a sleeper 20-35 µs late, and a wake-up planned 15 µs ahead still returned ~18 µs after
 * the work on average (measured at the shim: a syncing tenant's every wait, and every hand-over
 * of the GPU between two of them, lost that): so the sleep ends the learned lateness ahead of
 * the instant, and the rest is spun. */
void sim_sleep_until(uint64_t t_ns)
{
    int slack = -1;
    for (;;) {
        uint64_t now = sim_now_ns();
        if (now >= t_ns)
            break;
        uint64_t lead = __atomic_load_n(&late_ns, __ATOMIC_RELAXED) + LEAD_MARGIN_NS;
        if (lead < MIN_LEAD_NS)
            lead = MIN_LEAD_NS;
        if (t_ns - now <= lead + MIN_LEAD_NS)
            continue; /* below the wake-up's own latency: spin */
        if (slack < 0) {
            slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
            if (slack > 1)
                prctl(PR_SET_TIMERSLACK, 1ul, 0, 0, 0);
        }
        uint64_t wake = t_ns - lead;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull),
                              .tv_nsec = (long)(wake % 1000000000ull)};
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (rc != 0 && rc != EINTR)
            break; /* cannot sleep: give up rather than spin forever */
        if (rc == 0) {
            uint64_t woke = sim_now_ns(), late = woke > wake ? woke - wake : 0;
            if (late > LATE_MAX_NS)
                late = LATE_MAX_NS;
            uint64_t avg = __atomic_load_n(&late_ns, __ATOMIC_RELAXED);
            __atomic_store_n(&late_ns, (avg * 7 + late) / 8, __ATOMIC_RELAXED);
        }
    }
    if (slack > 1)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}

void sim_wait_until(uint64_t t_ns, enum sim_wait_how how)
{
    if (how == SIM_WAIT_SLEEP) {
        sim_sleep_until(t_ns);
        return;
    }
    /* A spinning driver's wait never leaves the CPU, so no timer can wake it late. */
    while (sim_now_ns() < t_ns) {
        if (how == SIM_WAIT_YIELD)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
}
