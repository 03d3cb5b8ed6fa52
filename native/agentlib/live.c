/* The liveness rule of the shim (pid namespaces, liveness locks), compiled into the agent. */
#include "../shim/live.c"
