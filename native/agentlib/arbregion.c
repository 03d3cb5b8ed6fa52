/* The arbiter region's lock, its repair and the reaping of dead clients: the shim's own. */
#include "../shim/arbregion.c"
