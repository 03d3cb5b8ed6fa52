/*
 * The shim's identity, readable in the file without loading it: `sharegpu upgrade` (and
 * src/sharegpu/agent/upgrade.py) finds the marker below to name the installed file
 * libsharegpu-<version>-<sha>.so and to refuse a shim of another ABI major.  Not exported.
 */
#include "shim.h"

#ifndef SG_SHIM_VERSION
#define SG_SHIM_VERSION "0.0.0+unknown"
#endif

#define SG_STR2(x) #x
#define SG_STR(x) SG_STR2(x)

__attribute__((used)) static const char sg_shim_ident[] =
    "sharegpu-shim: version=" SG_SHIM_VERSION " abi=" SG_STR(SG_ABI_MAJOR) "." SG_STR(SG_ABI_MINOR);
