/* The shim's burst clock, which arbiter.c calls; in the agent SG_REAL is always NULL, so it never
 * records anything. */
#include "../shim/burstclock.c"
