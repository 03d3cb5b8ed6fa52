/*
 * What shim/ledger.c, shim/arbregion.c and shim/arbsched.c need from the rest of the shim,
 * reduced to what the agent's operations use.  The agent has no tenant configuration of its own (mode INERT), no
 * real libcuda (every function pointer NULL) and prints nothing: errors come back as text.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../shim/shim.h"

const struct sg_limits *sg_limits_map;
struct sg_usage *sg_usage_map;
char sg_tenant_dir[PATH_MAX] = "(agent)";
struct sg_limits_copy sg_lim;
/* No real library: every SG_REAL(name) is NULL (the lookup below). */
void *sg_real_ptr[SG_R_COUNT];
unsigned char sg_real_done[SG_R_COUNT];
__thread int sg_in_hook __attribute__((tls_model("initial-exec")));
/* The agent holds no GPU's region as a client: liveness tests use sg_arb_agent_live_fd. */
struct sg_gpu sg_gpus[SG_MAX_DEVICES];
uint32_t sg_stream_epoch; /* ledger.c's stream cache; the agent looks up no streams */

int sg_fail(struct sg_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

void sg_log_once(int *once, const char *fmt, ...)
{
    (void)fmt;
    *once = 1; /* the agent reports through return values, never on stderr */
}

void sg_break(const char *fmt, ...)
{
    (void)fmt;
}

bool sg_configured(void)
{
    return false;
}

enum sg_mode sg_mode(void)
{
    return SG_MODE_INERT;
}

void *sg_real_lookup(enum sg_real_id id)
{
    (void)id;
    return NULL;
}

int sg_limits_refresh_locked(struct sg_err *e)
{
    (void)e;
    return 0;
}

/* The agent creates no contexts (hooks_ctx.c is not part of it). */
void sg_ctx_forget_all(uint64_t out[SG_MAX_DEVICES])
{
    for (int d = 0; d < SG_MAX_DEVICES; d++)
        out[d] = 0;
}

void sg_ctx_fork_child(void)
{
}
