/*
 * Modules.  Nothing is compiled or run: a module is the list of its kernel names and its
 * variables.  A PTX image (text) exposes exactly its `.entry` names and its `.global`/`.const`
 * variables (read as a driver reads them, ptx.c), which are device memory of the module:
 * placed and charged to the process when the module is loaded, given back when it is unloaded
 * (or its context dies).  An ELF cubin's variables are the object symbols of its global and
 * constant sections (sharegpu/cubin.h); its kernels cannot be listed without the toolkit, so it
 * accepts any kernel name.  A fatbin (or a fatbin wrapper) is the entry a driver would load
 * from it (fatbin.c), read as that PTX text or ELF cubin.  A file is read no further than it
 * goes; an image in memory as far as its headers say (up to 1 GiB), as a driver trusts them.
 */
#include "cu.h"
#include "sharegpu/cubin.h"
#include "sharegpu/fatbin.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMAGE_FILE (1u << 30)

static int is_fatbin(const unsigned char *p)
{
    uint32_t m;
    memcpy(&m, p, sizeof(m));
    return m == SG_FATBIN_MAGIC || m == SG_FATBIN_WRAPPER_MAGIC;
}

static int ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* NUL-separated names after each `.entry`, ending with an empty name; NULL on host OOM. */
static char *ptx_entries(const char *text)
{
    size_t cap = strlen(text) + 2, n = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = text; (p = strstr(p, ".entry")) != NULL;) {
        p += 6;
        if (!isspace((unsigned char)*p))
            continue;
        while (isspace((unsigned char)*p))
            p++;
        const char *s = p;
        while (ident_char(*p))
            p++;
        if (p > s) {
            memcpy(out + n, s, (size_t)(p - s));
            n += (size_t)(p - s);
            out[n++] = '\0';
        }
    }
    out[n] = '\0';
    return out;
}

/* The variables of an ELF cubin (its symbol table), laid out in order, 8-byte aligned. */
struct elf_vars {
    struct cu_var *vars;
    size_t n, cap;
    uint64_t off;
    int oom;
};

static void add_elf_var(const char *name, uint64_t size, void *arg)
{
    struct elf_vars *ev = arg;
    size_t len = strlen(name);
    if (ev->oom || len == 0)
        return;
    if (ev->n == ev->cap) {
        size_t cap = ev->cap ? ev->cap * 2 : 8;
        struct cu_var *nv = realloc(ev->vars, cap * sizeof(*nv));
        if (!nv) {
            ev->oom = 1;
            return;
        }
        ev->vars = nv;
        ev->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) {
        ev->oom = 1;
        return;
    }
    struct cu_var *v = &ev->vars[ev->n++];
    v->name = copy;
    v->size = size;
    v->offset = (ev->off + 7) / 8 * 8;
    ev->off = v->offset + size;
}

static CUresult parse_elf(struct CUmod_st *m, const void *image, uint64_t limit)
{
    struct elf_vars ev = {0};
    if (sg_cubin_vars(image, limit, add_elf_var, &ev) != 0) {
        cu_vars_free(ev.vars, ev.n);
        return CUDA_ERROR_INVALID_IMAGE; /* a symbol table or an object it cannot read */
    }
    if (ev.oom) {
        cu_vars_free(ev.vars, ev.n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->vars = ev.vars;
    m->nvars = ev.n;
    m->var_bytes = ev.off;
    return CUDA_SUCCESS;
}

static CUresult parse_ptx(struct CUmod_st *m, const char *text)
{
    if (!strstr(text, ".version") && !strstr(text, ".entry") && !strstr(text, ".target"))
        return CUDA_ERROR_INVALID_IMAGE;
    m->ptx = 1;
    m->entries = ptx_entries(text);
    if (!m->entries)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = cu_ptx_vars(text, &m->vars, &m->nvars, &m->var_bytes);
    if (r) {
        free(m->entries);
        m->entries = NULL;
    }
    return r;
}

CUresult cu_module_parse(struct CUmod_st *m, const void *image, uint64_t limit)
{
    memset(m, 0, sizeof(*m));
    if (limit > MAX_IMAGE_FILE)
        limit = MAX_IMAGE_FILE;
    if (sg_is_elf(image))
        return parse_elf(m, image, limit);
    if (!is_fatbin(image))
        return parse_ptx(m, image);
    unsigned char *entry;
    uint64_t size;
    int elf;
    CUresult r = cu_fatbin_entry(image, limit, &entry, &size, &elf);
    if (r)
        return r;
    r = elf ? parse_elf(m, entry, size) : parse_ptx(m, (const char *)entry);
    free(entry);
    return r;
}

void cu_module_clear(struct CUmod_st *m)
{
    free(m->entries);
    cu_vars_free(m->vars, m->nvars);
    m->entries = NULL;
    m->vars = NULL;
}

CUresult cu_module_instance(const struct CUmod_st *proto, struct CUctx_st *ctx, struct CUmod_st **out)
{
    struct CUmod_st *m = calloc(1, sizeof(*m));
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ptx = proto->ptx;
    m->ctx = ctx;
    m->nvars = proto->nvars;
    m->var_bytes = proto->var_bytes;
    if (proto->entries) {
        size_t len = 0;
        for (const char *e = proto->entries; *e; e += strlen(e) + 1)
            len += strlen(e) + 1;
        m->entries = malloc(len + 1);
        if (m->entries)
            memcpy(m->entries, proto->entries, len + 1);
    }
    int names_ok = 1;
    if (proto->nvars) {
        m->vars = calloc(proto->nvars, sizeof(*m->vars));
        for (size_t i = 0; m->vars && i < proto->nvars; i++) {
            m->vars[i] = proto->vars[i];
            names_ok &= (m->vars[i].name = strdup(proto->vars[i].name)) != NULL;
        }
    }
    if ((proto->entries && !m->entries) || (proto->nvars && !m->vars) || !names_ok) {
        cu_module_clear(m);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (m->var_bytes) {
        CUresult r = cu_mem_reserve(ctx, m->var_bytes, &m->globals);
        if (r) {
            cu_module_clear(m);
            free(m);
            return r;
        }
    }
    m->magic = MODULE_MAGIC;
    *out = m;
    return CUDA_SUCCESS;
}

void cu_module_destroy(struct CUmod_st *m)
{
    pthread_mutex_lock(&cu_g.mu);
    m->magic = 0;
    struct CUfunc_st *f = m->funcs;
    while (f) {
        struct CUfunc_st *next = f->next;
        f->magic = 0;
        free(f->params);
        free(f);
        f = next;
    }
    pthread_mutex_unlock(&cu_g.mu);
    /* A dead context already gave its memory back (cu_mem_free_ctx). */
    if (m->globals && cu_ctx_alive(m->ctx))
        (void)cu_mem_free(m->globals);
    cu_module_clear(m);
    free(m);
}

static CUresult load(CUmodule *module, const void *image, uint64_t limit)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct CUmod_st proto;
    r = cu_module_parse(&proto, image, limit);
    if (r)
        return r;
    r = cu_module_instance(&proto, c, module);
    cu_module_clear(&proto);
    return r;
}

void *cu_read_file(const char *path, uint64_t *length, CUresult *r)
{
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        *r = path ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_INVALID_VALUE;
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = cap <= MAX_IMAGE_FILE ? realloc(buf, cap) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                *r = CUDA_ERROR_OUT_OF_MEMORY;
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int unreadable = ferror(f); /* a directory, an I/O error */
    fclose(f);
    if (unreadable) {
        free(buf);
        *r = CUDA_ERROR_FILE_NOT_FOUND;
        return NULL;
    }
    if (n < 4) {
        free(buf);
        *r = CUDA_ERROR_INVALID_IMAGE;
        return NULL;
    }
    buf[n] = '\0';
    if (length)
        *length = n;
    *r = CUDA_SUCCESS;
    return buf;
}

SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return load(module, image, CU_IMAGE_IN_MEMORY);
}

SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                       CUjit_option *options, void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    /* JIT options (log buffers, optimisation level) are ignored */
    return load(module, image, CU_IMAGE_IN_MEMORY);
}

SIM_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return load(module, fatCubin, CU_IMAGE_IN_MEMORY);
}

SIM_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    uint64_t length;
    void *image = cu_read_file(fname, &length, &r);
    if (!image)
        return r;
    r = load(module, image, length);
    free(image);
    return r;
}

static int has_entry(const struct CUmod_st *m, const char *name)
{
    for (const char *e = m->entries; *e; e += strlen(e) + 1)
        if (strcmp(e, name) == 0)
            return 1;
    return 0;
}

CUresult cu_module_function(struct CUmod_st *m, const char *name, struct CUfunc_st **out)
{
    if (m->ptx && !has_entry(m, name))
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&cu_g.mu);
    struct CUfunc_st *f = m->funcs;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f) {
        size_t len = strlen(name);
        f = calloc(1, sizeof(*f) + len + 1);
        if (f) {
            memcpy(f->name, name, len + 1);
            f->spin = strncmp(name, "spin", 4) == 0;
            f->mod = m;
            f->next = m->funcs;
            f->magic = FUNC_MAGIC;
            m->funcs = f;
        }
    }
    pthread_mutex_unlock(&cu_g.mu);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = f;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!hmod || hmod->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    return cu_module_function(hmod, name, hfunc);
}

SIM_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
                                         const char *name)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!hmod || hmod->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < hmod->nvars; i++) {
        if (strcmp(hmod->vars[i].name, name) == 0) {
            if (dptr)
                *dptr = hmod->globals + hmod->vars[i].offset;
            if (bytes)
                *bytes = (size_t)hmod->vars[i].size;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!hmod || hmod->magic != MODULE_MAGIC || hmod->lib)
        return CUDA_ERROR_INVALID_HANDLE; /* a library's modules go with cuLibraryUnload */
    cu_module_destroy(hmod);
    return CUDA_SUCCESS;
}

CUresult cu_func_check(CUfunction f)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (f->magic == FUNC_MAGIC)
        return CUDA_SUCCESS;
    const struct CUkern_st *k = (const struct CUkern_st *)(void *)f;
    return (k->magic == KERNEL_MAGIC && k->lib->magic == LIB_MAGIC) ? CUDA_SUCCESS
                                                                   : CUDA_ERROR_INVALID_HANDLE;
}
