/* The arbiter's scheduling decisions (a token freed by the reaper goes to the best waiter). */
#include "../shim/arbsched.c"
