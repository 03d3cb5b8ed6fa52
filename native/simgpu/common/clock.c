/* Time: CLOCK_MONOTONIC is system-wide, so instants written by one process mean the same to all. */
#include "sim.h"

#include <errno.h>
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

/* Below this the scheduler's wake-up latency exceeds the wait itself, so we spin. */
#define SPIN_NS 30000ull

/* A synchronising call returns when its work completes, as a driver's spinning or yielding wait
 * does (within a few µs).  A sleeping thread is woken up to its timer slack late (50 µs by
 * default), which made every sync here ~45 µs later than the work: a program that waits for its
 * own work lost that much per wait, far more than on a GPU.  So the wait sleeps with the
 * smallest slack and gives the thread its own slack back afterwards. */
void sim_sleep_until(uint64_t t_ns)
{
    int slack = -1;
    for (;;) {
        uint64_t now = sim_now_ns();
        if (now >= t_ns)
            break;
        if (t_ns - now <= SPIN_NS)
            continue;
        if (slack < 0) {
            slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
            if (slack > 1)
                prctl(PR_SET_TIMERSLACK, 1ul, 0, 0, 0);
        }
        uint64_t wake = t_ns - SPIN_NS / 2;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull),
                              .tv_nsec = (long)(wake % 1000000000ull)};
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (rc != 0 && rc != EINTR)
            break; /* cannot sleep: give up rather than spin forever */
    }
    if (slack > 1)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}
