/*
 * libsgagent.so: the few operations of the node agent (src/sharegpu/agent) that must take a
 * region's robust mutex and change what the shims guard with it.  They are compiled from the
 * shim's own sources (usage.c includes shim/ledger.c; arbregion.c, arbsched.c and predict.c
 * include the shim's arbiter pieces), so
 * the agent frees a dead process's charges and hands a dead holder's token on exactly as a
 * shim would, EOWNERDEAD repair included.  Nothing here hooks CUDA or NVML: the library
 * exports only the sga_* functions below (exports.map), and the agent never loads
 * libsharegpu.so.
 *
 * Every function maps the region file itself (open, validate magic / ABI major / size / slot
 * counts, mmap MAP_SHARED), works under the region's lock and unmaps.  Return: >= 0 on
 * success (a count where documented), -1 with a one-line message in err[] otherwise.
 * Thread-safe (one internal mutex per region kind).
 *
 * Liveness is the shim's: a process is dead when its pid is gone, a zombie, or reused by a
 * process with another start time (sg_proc_alive in shim/ledger.c).  Usage slots are judged by
 * host_pid when the agent has filled it in, else by pid; both must be in the agent's pid
 * namespace.
 *
 * Mirrored with ctypes in src/sharegpu/regions/agentlib.py.
 */
#ifndef SHAREGPU_SGAGENT_H
#define SHAREGPU_SGAGENT_H

#include <stddef.h>
#include <stdint.h>

#include "sharegpu/abi.h"

#define SGA_EXPORT __attribute__((visibility("default")))
#define SGA_ERR_LEN 256

/* A usage slot freed because its process is dead. */
struct sga_usage_reaped {
    int32_t pid;        /* the slot's pid (tenant namespace) */
    int32_t host_pid;   /* host pid if known, else 0 */
    uint64_t start_time;
    uint64_t mem_bytes[SG_MAX_DEVICES]; /* bytes it held per limits index, now uncharged */
};

/* Outcome of one arbiter reap. */
struct sga_arb_reaped {
    int32_t pid;                     /* the dead client's pid */
    uint32_t held_token;             /* 1 if it held the GPU token */
    uint64_t start_time;
    char tenant_id[SG_TENANT_ID_LEN];
};

struct sga_arb_result {
    int32_t new_holder_pid;  /* pid granted the token by this reap, 0 if none */
    uint32_t recovered;      /* 1 if the lock was found EOWNERDEAD and repaired */
    uint32_t reaped;         /* entries freed (may exceed the capacity of the out array) */
    uint32_t reserved;
};

/* Free the slots of dead processes in the usage region at path, taking their bytes off the
 * per-device totals (ledger.c release_slot_locked).  Up to cap of them are described in out.
 * *recovered = 1 when the mutex was EOWNERDEAD (the totals were recomputed from the slots and
 * the slots of dead processes freed by the shim's own recovery; those are not in out).
 * Returns the number of slots freed by this call's own scan. */
SGA_EXPORT int sga_usage_reap(const char *path, struct sga_usage_reaped *out, int cap,
                              int *recovered, char err[SGA_ERR_LEN]);

/* Store overhead_bytes of limits index idx (the agent's figure: NVML minus the ledger). */
SGA_EXPORT int sga_usage_set_overhead(const char *path, int idx, uint64_t bytes,
                                      char err[SGA_ERR_LEN]);

/* Store overhead_bytes of limits index idx only if it still holds `expected` (what the agent
 * read before measuring): a shim that admitted or gave back a context's memory meanwhile
 * (native/shim/hooks_ctx.c) moved it, and a stale figure must not overwrite that.  1: stored,
 * 0: it had moved (nothing written), -1: error. */
SGA_EXPORT int sga_usage_swap_overhead(const char *path, int idx, uint64_t expected,
                                       uint64_t bytes, char err[SGA_ERR_LEN]);

/* Free the client entries of dead processes in the arbiter region at path and, when the token
 * came free and clients wait, grant it to the best waiter (shim/arbregion.c
 * sg_arb_reap_and_pick_locked).  Up to cap freed entries are described in out. */
SGA_EXPORT int sga_arbiter_reap(const char *path, struct sga_arb_reaped *out, int cap,
                                struct sga_arb_result *res, char err[SGA_ERR_LEN]);

/* Would a shim refuse the arbiter region at path for GPU uuid (16 bytes)?  The shim's own rule
 * (shim/arbregion.c sg_arb_region_problem: header, size, slot counts, GPU, quantum, a robust
 * process-shared mutex), plus a region marked broken (ABI 1.7), which the agent replaces.
 * SGA_ARB_USABLE; SGA_ARB_MISSING (no file); SGA_ARB_OTHER_ABI (a newer sharegpu wrote it: not
 * damage); SGA_ARB_DAMAGED; -1 when it cannot be read.  err says why for all but USABLE. */
#define SGA_ARB_USABLE 0
#define SGA_ARB_MISSING 1
#define SGA_ARB_OTHER_ABI 2
#define SGA_ARB_DAMAGED 3
SGA_EXPORT int sga_arbiter_check(const char *path, const uint8_t uuid[16], char err[SGA_ERR_LEN]);

/* The shim's liveness test (shim/live.c sg_entry_alive) of entry `index` of the region at
 * path, which names pid with its start time and pid namespace and has the entry flags `flags`:
 * its liveness lock when it has one, else its pid and start time, judged only from the pid
 * namespace that wrote them (elsewhere: alive, never guessed dead).  1 alive, 0 dead. */
SGA_EXPORT int sga_entry_alive(const char *path, uint32_t index, uint32_t flags, uint64_t pidns,
                               int32_t pid, uint64_t start);

/* Field 22 of /proc/<pid>/stat (clock ticks after boot) in *start: 0 read, -1 no such process
 * (or only its zombie), 1 cannot tell (not allowed to read it). */
SGA_EXPORT int sga_start_time(int32_t pid, uint64_t *start);

#endif /* SHAREGPU_SGAGENT_H */
