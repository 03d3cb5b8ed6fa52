/*
 * The whole driver API surface: every entry point of CUDA 13.0's cuda.h is exported, and
 * cuGetProcAddress answers from the real versioned table (both generated into api_table.inc by
 * tools/gen_api.py).
 *
 * An entry point that the simulator models is defined, with its real prototype, in another file
 * of this directory; every other one gets the weak stub below, which returns
 * CUDA_ERROR_NOT_SUPPORTED (never a missing symbol).  `nm -D` shows modelled entry points as T,
 * stubs as W.
 *
 * This file must not include cuda_api.h: the stubs and the table's declarations ignore the
 * prototypes on purpose (a function that ignores its arguments is called correctly with any on
 * x86-64 and aarch64, where the caller owns the argument registers and stack).
 */
#include "../common/sim.h"
#include "api_table.h"

#include <stdatomic.h>
#include <stdlib.h>

#define NOT_SUPPORTED 801 /* CUDA_ERROR_NOT_SUPPORTED */

/* SIMGPU_TRACE_UNSUPPORTED=1: one stderr line the first time each stub is called. */
static int not_supported(const char *name, atomic_int *said)
{
    static int trace = -1;
    if (trace < 0) {
        const char *v = getenv("SIMGPU_TRACE_UNSUPPORTED");
        trace = v && *v && *v != '0';
    }
    if (trace && !atomic_exchange(said, 1))
        sim_log("%s is not modelled: CUDA_ERROR_NOT_SUPPORTED", name);
    return NOT_SUPPORTED;
}

#define SIMGPU_ROW(name, version, symbol, per_thread)
#define SIMGPU_SYM(s)                                                                              \
    __attribute__((weak, visibility("default"))) int s(void);                                    \
    int s(void)                                                                                    \
    {                                                                                              \
        static atomic_int said;                                                                    \
        return not_supported(#s, &said);                                                           \
    }
#include "api_table.inc"
#undef SIMGPU_SYM
#undef SIMGPU_ROW

/* With -Bsymbolic-functions (native/Makefile) these addresses are the library's own
 * definitions, never a preloaded interposer's symbol of the same name. */
#define SIMGPU_ROW(name, version, symbol, per_thread) {name, version, per_thread, (void *)&symbol},
#define SIMGPU_SYM(s)
const struct sim_api_row sim_api_rows[] = {
#include "api_table.inc"
};
#undef SIMGPU_SYM
#undef SIMGPU_ROW
const size_t sim_api_nrows = sizeof(sim_api_rows) / sizeof(sim_api_rows[0]);
