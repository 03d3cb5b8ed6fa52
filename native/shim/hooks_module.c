/*
 * Module globals: the `__device__` and `__constant__` variables of a module are device memory the
 * driver places when the module is loaded into the current context (and frees at cuModuleUnload
 * or with the context).  No allocation call shows it, so unhooked a module with a large global
 * array is memory past the cap.
 *
 * The names come from the image, the sizes from the driver: a PTX image's module-scope `.global`
 * and `.const` declarations, an ELF cubin's object symbols in its `.nv.global*` and
 * `.nv.constant*` sections; each name is asked of the loaded module with cuModuleGetGlobal, so a
 * name read wrongly costs nothing and the size is the driver's own.  The sum is admitted after
 * the real load (it is only known then): refused, the module is unloaded again and the load
 * fails with CUDA_ERROR_OUT_OF_MEMORY.  Fatbins (what nvcc embeds in programs, possibly
 * compressed) and libraries (cuLibraryLoad*, placed lazily per context) are not read here: what
 * their globals take is in the agent's NVML reconciliation, like the driver's own overhead.
 */
#include "shim.h"
#include "sharegpu/cubin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMAGE_FILE (256u << 20)


static bool ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$';
}

/* Each module-scope `.global` / `.const` declaration of a PTX text: the identifier before its
 * first `[`, `=` or `;`.  Instructions (`ld.global`) have no blank before the directive, and
 * `.extern` declarations place nothing. */
static void ptx_names(const char *text, void (*fn)(const char *, size_t, void *), void *arg)
{
    for (const char *p = text; (p = strchr(p, '.')) != NULL; p++) {
        size_t dir = strncmp(p, ".global", 7) == 0 ? 7 : strncmp(p, ".const", 6) == 0 ? 6 : 0;
        if (!dir || ident(p[dir]) || (p > text && p[-1] != ' ' && p[-1] != '\t' && p[-1] != '\n'))
            continue;
        const char *stmt = p;
        while (stmt > text && !strchr(";{}\n", stmt[-1]))
            stmt--;
        const char *end = p + strcspn(p, "[=;");
        if (*end == '\0')
            return;
        bool external = false;
        for (const char *q = stmt; q + 7 <= p && !external; q++)
            external = strncmp(q, ".extern", 7) == 0;
        const char *e = end;
        while (e > p && !ident(e[-1]))
            e--;
        const char *s = e;
        while (s > p && ident(s[-1]))
            s--;
        if (!external && e > s && s[-1] != '.')
            fn(s, (size_t)(e - s), arg);
        p = end;
    }
}

struct sizing {
    CUmodule mod;
    uint64_t bytes;
};

static void add_global(const char *name, size_t len, void *arg)
{
    struct sizing *s = arg;
    char buf[256];
    if (len >= sizeof buf)
        return;
    memcpy(buf, name, len);
    buf[len] = '\0';
    CUdeviceptr p;
    size_t bytes = 0;
    if (SG_REAL(cuModuleGetGlobal_v2) &&
        SG_REAL(cuModuleGetGlobal_v2)(&p, &bytes, s->mod, buf) == CUDA_SUCCESS &&
        __builtin_add_overflow(s->bytes, (uint64_t)bytes, &s->bytes))
        s->bytes = UINT64_MAX;
}

static void add_cubin_var(const char *name, uint64_t size, void *arg)
{
    (void)size; /* the driver's figure counts, not the image's */
    add_global(name, strlen(name), arg);
}

/* What the loaded module's globals take, as far as its image names them. */
static uint64_t globals_bytes(CUmodule mod, const void *image)
{
    struct sizing s = {.mod = mod, .bytes = 0};
    const unsigned char *img = image;
    if (!img)
        return 0;
    if (sg_is_elf(img))
        sg_cubin_vars(img, MAX_IMAGE_FILE, add_cubin_var, &s);
    else if (strstr(image, ".version") || strstr(image, ".entry") || strstr(image, ".target"))
        ptx_names(image, add_global, &s);
    return s.bytes;
}

/* After a successful real load: admit its globals, or unload it and refuse. */
static CUresult charge_module(CUresult res, CUmodule *module, const void *image)
{
    if (res != CUDA_SUCCESS || !image)
        return res;
    CUcontext ctx;
    CUdevice dev;
    if (sg_current_place(&ctx, &dev) != CUDA_SUCCESS || !ctx)
        return res;
    uint64_t bytes = globals_bytes(*module, image);
    if (!bytes)
        return res;
    struct sg_charge c;
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_reserve(dev, bytes, &c, &e);
    if (rc == 0) {
        c.ctx = ctx; /* the module's globals go with its context */
        if (!c.active || sg_track(SG_KIND_MODULE, (uint64_t)(uintptr_t)*module, &c, &e) == 0)
            return CUDA_SUCCESS;
        sg_unreserve(&c);
        rc = SG_E_NOMEM;
    }
    SG_REAL(cuModuleUnload)(*module);
    *module = NULL;
    return sg_cu_result(rc);
}

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

#define ACCOUNTED (!sg_in_hook && sg_configured() && SG_REAL(cuModuleUnload))

SG_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    REAL(cuModuleLoadData);
    if (!ACCOUNTED)
        return real_(module, image);
    sg_in_hook++;
    CUresult res = charge_module(real_(module, image), module, image);
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues)
{
    REAL(cuModuleLoadDataEx);
    if (!ACCOUNTED)
        return real_(module, image, numOptions, options, optionValues);
    sg_in_hook++;
    CUresult res =
        charge_module(real_(module, image, numOptions, options, optionValues), module, image);
    sg_in_hook--;
    return res;
}

/* The file's contents (NUL-terminated), or NULL when it cannot be read. */
static void *read_image(const char *path)
{
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && (unsigned long)n <= MAX_IMAGE_FILE &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

SG_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    REAL(cuModuleLoad);
    if (!ACCOUNTED)
        return real_(module, fname);
    sg_in_hook++;
    CUresult res = real_(module, fname);
    if (res == CUDA_SUCCESS) {
        void *image = read_image(fname);
        res = charge_module(res, module, image);
        free(image);
    }
    sg_in_hook--;
    return res;
}

SG_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    REAL(cuModuleUnload);
    if (!ACCOUNTED)
        return real_(hmod);
    sg_in_hook++;
    struct sg_charge c;
    bool tracked = sg_untrack(SG_KIND_MODULE, (uint64_t)(uintptr_t)hmod, &c);
    CUresult res = sg_free_end(real_(hmod), tracked, SG_KIND_MODULE, (uint64_t)(uintptr_t)hmod, &c);
    sg_in_hook--;
    return res;
}
