/* Time: CLOCK_MONOTONIC is system-wide, so instants written by one process mean the same to all. */
#include "sim.h"

#include <errno.h>
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

void sim_sleep_until(uint64_t t_ns)
{
    for (;;) {
        uint64_t now = sim_now_ns();
        if (now >= t_ns)
            return;
        if (t_ns - now <= SPIN_NS)
            continue;
        uint64_t wake = t_ns - SPIN_NS / 2;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull),
                              .tv_nsec = (long)(wake % 1000000000ull)};
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (rc != 0 && rc != EINTR)
            return; /* cannot sleep: give up rather than spin forever */
    }
}
