/* The shim's clocks (CLOCK_MONOTONIC, the launch clock), compiled into the agent with arbiter.c. */
#include "../shim/clock.c"
