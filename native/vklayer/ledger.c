/*
 * The tenant's ledger lives in the shim (libsharegpu.so): preloaded by `sharegpu run` and the CDI
 * spec, its API is found with dlsym; a process that did not preload it (a Vulkan program started
 * some other way with the layer enabled) gets it loaded from beside this library.  Without a
 * tenant (SHAREGPU_TENANT unset) nothing is loaded and the layer passes everything through.
 */
#include "layer.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define LEDGER_API_VERSION 1

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct vl_ledger ledger;
static int ledger_rc = -1;

static int inert(void)
{
    return 0;
}

static void *find(void *lib, const char *name)
{
    return lib ? dlsym(lib, name) : dlsym(RTLD_DEFAULT, name);
}

static void *shim_beside_us(void)
{
    Dl_info info;
    if (!dladdr((void *)&vl_ledger, &info) || !info.dli_fname)
        return NULL;
    char path[PATH_MAX];
    const char *slash = strrchr(info.dli_fname, '/');
    size_t dir = slash ? (size_t)(slash - info.dli_fname) : 0;
    if (dir + sizeof("/libsharegpu.so") > sizeof(path))
        return NULL;
    memcpy(path, info.dli_fname, dir);
    memcpy(path + dir, "/libsharegpu.so", sizeof("/libsharegpu.so"));
    return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

static void load(void)
{
    const char *tenant = getenv("SHAREGPU_TENANT");
    if (!tenant || !*tenant) {
        ledger.state = inert;
        ledger_rc = 0;
        return;
    }
    void *lib = NULL;
    int (*version)(void) = (int (*)(void))find(NULL, "sharegpu_ledger_api_version");
    if (!version) {
        lib = shim_beside_us();
        version = lib ? (int (*)(void))find(lib, "sharegpu_ledger_api_version") : NULL;
    }
    if (!version) {
        vl_log("SHAREGPU_TENANT is set but libsharegpu.so is neither loaded nor beside this layer: "
               "refusing to run unmetered");
        return;
    }
    if (version() != LEDGER_API_VERSION) {
        vl_log("libsharegpu.so speaks ledger API %d, this layer %d: install them together", version(),
               LEDGER_API_VERSION);
        return;
    }
    ledger.state = (int (*)(void))find(lib, "sharegpu_ledger_state");
    ledger.device = (int (*)(const uint8_t *, uint64_t *, uint64_t *))find(lib, "sharegpu_ledger_device");
    ledger.charge = (int (*)(const uint8_t *, uint64_t, uint64_t, const void *))find(lib, "sharegpu_ledger_charge");
    ledger.rekey = (int (*)(uint64_t, uint64_t))find(lib, "sharegpu_ledger_rekey");
    ledger.credit = (void (*)(uint64_t))find(lib, "sharegpu_ledger_credit");
    ledger.credit_owner = (void (*)(const void *))find(lib, "sharegpu_ledger_credit_owner");
    if (!ledger.state || !ledger.device || !ledger.charge || !ledger.rekey || !ledger.credit ||
        !ledger.credit_owner) {
        vl_log("libsharegpu.so lacks part of ledger API %d: install them together", LEDGER_API_VERSION);
        return;
    }
    ledger_rc = 0;
}

int vl_ledger(const struct vl_ledger **out)
{
    pthread_once(&once, load);
    *out = &ledger;
    return ledger_rc;
}
