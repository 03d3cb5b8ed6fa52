/* The shim's allocation table (shim/alloctable.c), which the ledger's fork hooks (usage.c
 * includes shim/ledger.c) hold and reset: compiled here so that those hooks link, unused. */
#include "../shim/alloctable.c"
