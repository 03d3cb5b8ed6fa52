/*
 * Modules.  Nothing is compiled or run: a module is the list of its kernel names.  A PTX image
 * (text) exposes exactly its `.entry` names; a binary image (ELF cubin or fatbin) cannot be
 * parsed without the toolkit, so it accepts any name.
 */
#include "cu.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

static int is_binary(const unsigned char *p)
{
    uint32_t m;
    memcpy(&m, p, sizeof(m));
    return (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') || m == FATBIN_MAGIC ||
           m == FATBIN_WRAPPER_MAGIC;
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

static CUresult load(CUmodule *module, const void *image)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct CUmod_st *m = calloc(1, sizeof(*m));
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = c;
    if (!is_binary(image)) {
        const char *text = image;
        if (!strstr(text, ".version") && !strstr(text, ".entry") && !strstr(text, ".target")) {
            free(m);
            return CUDA_ERROR_INVALID_IMAGE;
        }
        m->ptx = 1;
        m->entries = ptx_entries(text);
        if (!m->entries) {
            free(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    m->magic = MODULE_MAGIC;
    *module = m;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return load(module, image);
}

SIM_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return load(module, fatCubin);
}

static int has_entry(const struct CUmod_st *m, const char *name)
{
    for (const char *e = m->entries; *e; e += strlen(e) + 1)
        if (strcmp(e, name) == 0)
            return 1;
    return 0;
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
    if (hmod->ptx && !has_entry(hmod, name))
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&cu_g.mu);
    struct CUfunc_st *f = hmod->funcs;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f) {
        size_t len = strlen(name);
        f = calloc(1, sizeof(*f) + len + 1);
        if (f) {
            memcpy(f->name, name, len + 1);
            f->spin = strncmp(name, "spin", 4) == 0;
            f->mod = hmod;
            f->next = hmod->funcs;
            f->magic = FUNC_MAGIC;
            hmod->funcs = f;
        }
    }
    pthread_mutex_unlock(&cu_g.mu);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = f;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!hmod || hmod->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&cu_g.mu);
    hmod->magic = 0;
    struct CUfunc_st *f = hmod->funcs;
    while (f) {
        struct CUfunc_st *next = f->next;
        f->magic = 0;
        free(f);
        f = next;
    }
    pthread_mutex_unlock(&cu_g.mu);
    free(hmod->entries);
    free(hmod);
    return CUDA_SUCCESS;
}

CUresult cu_func_check(CUfunction f)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (f && f->magic == FUNC_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
