/*
 * The tenant's ledger and the GPUs' arbiter live in the shim (libsharegpu.so): preloaded by
 * `sharegpu run` and the CDI spec, its layer API (sharegpu/layer_api.h) is found with dlsym; a
 * process that did not preload it (a Vulkan program started some other way with the layer
 * enabled) gets it loaded from beside this library.  Without a tenant (SHAREGPU_TENANT unset)
 * nothing is loaded and the layer passes everything through.
 */
#include "layer.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct vl_shim api;
static int api_rc = -1;

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
    if (!dladdr((void *)&vl_shim, &info) || !info.dli_fname)
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

#define FIND(field, name) (api.field = (__typeof__(api.field))find(lib, name))

static void load(void)
{
    const char *tenant = getenv("SHAREGPU_TENANT");
    if (!tenant || !*tenant) {
        api.state = inert;
        api_rc = 0;
        return;
    }
    void *lib = NULL;
    sharegpu_layer_api_version_fn version = (sharegpu_layer_api_version_fn)find(NULL, "sharegpu_layer_api_version");
    if (!version) {
        lib = shim_beside_us();
        version = lib ? (sharegpu_layer_api_version_fn)find(lib, "sharegpu_layer_api_version") : NULL;
    }
    if (!version) {
        vl_log("SHAREGPU_TENANT is set but libsharegpu.so is neither loaded nor beside this layer: "
               "refusing to run unmetered");
        return;
    }
    if (version() != SHAREGPU_LAYER_API_VERSION) {
        vl_log("libsharegpu.so speaks layer API %d, this layer %d: install them together", version(),
               SHAREGPU_LAYER_API_VERSION);
        return;
    }
    bool all = FIND(state, "sharegpu_ledger_state") && FIND(device, "sharegpu_ledger_device") &&
               FIND(charge, "sharegpu_ledger_charge") && FIND(rekey, "sharegpu_ledger_rekey") &&
               FIND(credit, "sharegpu_ledger_credit") && FIND(credit_owner, "sharegpu_ledger_credit_owner") &&
               FIND(arb_enter, "sharegpu_arb_enter") && FIND(arb_exit, "sharegpu_arb_exit") &&
               FIND(arb_forget, "sharegpu_arb_forget") && FIND(wait_begin, "sharegpu_arb_wait_begin") &&
               FIND(wait_end, "sharegpu_arb_wait_end");
    if (!all) {
        vl_log("libsharegpu.so lacks part of layer API %d: install them together", SHAREGPU_LAYER_API_VERSION);
        return;
    }
    api_rc = 0;
}

int vl_shim(const struct vl_shim **out)
{
    pthread_once(&once, load);
    *out = &api;
    return api_rc;
}
