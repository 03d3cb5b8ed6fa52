/* Futex wait and wake on a 32-bit word: `shared` for a word in a region other processes map
 * (the arbiter's wake and watch words), private for one of this process's. */
#ifndef SHAREGPU_FUTEX_H
#define SHAREGPU_FUTEX_H

#include <limits.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline void sg_futex_wait(uint32_t *word, uint32_t val, uint64_t timeout_ns, bool shared)
{
    struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000u),
                          .tv_nsec = (long)(timeout_ns % 1000000000u)};
    syscall(SYS_futex, word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static inline void sg_futex_wake(uint32_t *word, bool shared)
{
    syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

#endif
