/*
 * Round trips between two processes, for bench/broker.py: `futex N` (two futex words in shared
 * memory, each side waits on its own and wakes the other's) or `socket N` (a SOCK_SEQPACKET
 * Unix socket pair, request and answer).  Prints one line per round trip: its length in ns,
 * measured by the parent with CLOCK_MONOTONIC.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void futex_wait(uint32_t *word, uint32_t seen)
{
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen)
        syscall(SYS_futex, word, FUTEX_WAIT, seen, NULL, NULL, 0);
}

static void futex_post(uint32_t *word)
{
    __atomic_fetch_add(word, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static int pingpong_futex(long n, uint64_t *out)
{
    uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED)
        return 1;
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < n; i++) {
            futex_wait(&w[0], (uint32_t)i);
            futex_post(&w[1]);
        }
        _exit(0);
    }
    for (long i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        futex_post(&w[0]);
        futex_wait(&w[1], (uint32_t)i);
        out[i] = now_ns() - t0;
    }
    waitpid(child, NULL, 0);
    return 0;
}

static int pingpong_socket(long n, uint64_t *out)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0)
        return 1;
    pid_t child = fork();
    char msg[32] = "release";
    if (child == 0) {
        close(sv[0]);
        for (long i = 0; i < n; i++)
            if (recv(sv[1], msg, sizeof msg, 0) <= 0 || send(sv[1], msg, sizeof msg, 0) <= 0)
                _exit(1);
        _exit(0);
    }
    close(sv[1]);
    for (long i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        if (send(sv[0], msg, sizeof msg, 0) <= 0 || recv(sv[0], msg, sizeof msg, 0) <= 0)
            return 1;
        out[i] = now_ns() - t0;
    }
    waitpid(child, NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    long n = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
    if (n < 1 || (strcmp(argv[1], "futex") && strcmp(argv[1], "socket"))) {
        fprintf(stderr, "usage: broker_pingpong futex|socket N\n");
        return 2;
    }
    uint64_t *out = calloc((size_t)n, sizeof *out);
    if (!out)
        return 1;
    int rc = strcmp(argv[1], "futex") == 0 ? pingpong_futex(n, out) : pingpong_socket(n, out);
    for (long i = 0; rc == 0 && i < n; i++)
        printf("%llu\n", (unsigned long long)out[i]);
    return rc;
}
