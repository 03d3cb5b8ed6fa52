/* The shim's clocks (CLOCK_MONOTONIC, the launch clock), compiled into the agent with arbregion.c. */
#include "../shim/clock.c"
