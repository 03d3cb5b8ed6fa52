/* The cuGetProcAddress table (api_table.c, generated rows in api_table.inc). */
#ifndef SIMGPU_API_TABLE_H
#define SIMGPU_API_TABLE_H

#include "../common/sim.h"

#include <stddef.h>

struct sim_api_row {
    const char *name; /* the name a caller asks for (no _vN, _ptds or _ptsz suffix) */
    int version;      /* the first CUDA version this row answers */
    int per_thread;   /* answers only per-thread-default-stream requests */
    void *fn;
};

/* Sorted by name, then version, plain rows before per-thread ones. */
extern const struct sim_api_row sim_api_rows[] SIM_HIDDEN;
extern const size_t sim_api_nrows SIM_HIDDEN;

#endif /* SIMGPU_API_TABLE_H */
