/* The error contract's two helpers: fill an error, print one prefixed line. */
#include "sim.h"

#include <stdarg.h>
#include <stdio.h>

int sim_fail(struct sim_err *e, enum sim_errc code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
    }
    return -1;
}

void sim_log(const char *fmt, ...)
{
    /* Capped: a library inside someone else's process must not flood its stderr. */
    static int lines;
    if (__atomic_fetch_add(&lines, 1, __ATOMIC_RELAXED) >= SIM_LOG_MAX)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "simgpu: %s\n", buf);
    fflush(stderr);
}
