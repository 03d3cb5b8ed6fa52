/*
 * Libraries and kernels (CUDA 12's context-independent loading).  A library is its parsed image;
 * it becomes a module of a context at its first use there (cuLibraryGetModule, cuKernelGetFunction,
 * cuLibraryGetGlobal, or a launch of one of its kernels on a stream of that context), and only then
 * are its variables placed and charged on that context's GPU, as with the driver's lazy loading.
 *
 * A CUkernel may be cast to a CUfunction and launched: the launch takes its context from the
 * stream, so no current context is needed.  Unloading a library destroys its modules in every
 * context and invalidates its kernels; using one afterwards is CUDA_ERROR_INVALID_HANDLE as long
 * as its memory was not reused (the driver promises no more).
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

static CUresult lib_check(CUlibrary lib)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (lib && lib->magic == LIB_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult kernel_check(CUkernel k)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (k && k->magic == KERNEL_MAGIC && k->lib->magic == LIB_MAGIC) ? CUDA_SUCCESS
                                                                         : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult lib_load(CUlibrary *library, const void *code, uint64_t limit, unsigned numJit,
                         CUjit_option *jit, void **jitValues, unsigned numLib, CUlibraryOption *opts,
                         void **optValues)
{
    if (!library || !code || (numJit && (!jit || !jitValues)) || (numLib && (!opts || !optValues)))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    struct CUlib_st *lib = calloc(1, sizeof(*lib));
    if (!lib)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = cu_module_parse(&lib->proto, code, limit);
    if (r) {
        free(lib);
        return r;
    }
    lib->magic = LIB_MAGIC;
    *library = lib;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                      void **jitOptionsValues, unsigned int numJitOptions,
                                      CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                      unsigned int numLibraryOptions)
{
    return lib_load(library, code, CU_IMAGE_IN_MEMORY, numJitOptions, jitOptions, jitOptionsValues, numLibraryOptions,
                    libraryOptions, libraryOptionValues);
}

SIM_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                          CUjit_option *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                          void **libraryOptionValues, unsigned int numLibraryOptions)
{
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    uint64_t length;
    void *code = cu_read_file(fileName, &length, &r);
    if (!code)
        return r;
    r = lib_load(library, code, length, numJitOptions, jitOptions, jitOptionsValues, numLibraryOptions,
                 libraryOptions, libraryOptionValues);
    free(code);
    return r;
}

SIM_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    CUresult r = lib_check(library);
    if (r)
        return r;
    pthread_mutex_lock(&cu_g.mu);
    library->magic = 0;
    struct CUmod_st *m = library->per_ctx;
    struct CUkern_st *k = library->kernels;
    library->per_ctx = NULL;
    library->kernels = NULL;
    pthread_mutex_unlock(&cu_g.mu);
    while (m) {
        struct CUmod_st *next = m->next_in_lib;
        cu_module_destroy(m);
        m = next;
    }
    while (k) {
        struct CUkern_st *next = k->next;
        k->magic = 0;
        free(k);
        k = next;
    }
    cu_module_clear(&library->proto);
    /* The library struct itself is kept (magic cleared): its kernels' handles may still be
     * checked by a caller, and reading a dead kernel's lib must stay a valid read. */
    return CUDA_SUCCESS;
}

/* The library's module in ctx, made at the first use there. */
static CUresult lib_module(struct CUlib_st *lib, struct CUctx_st *ctx, struct CUmod_st **out)
{
    pthread_mutex_lock(&cu_g.mu);
    struct CUmod_st *m = lib->per_ctx;
    while (m && m->ctx != ctx)
        m = m->next_in_lib;
    pthread_mutex_unlock(&cu_g.mu);
    if (m) {
        *out = m;
        return CUDA_SUCCESS;
    }
    CUresult r = cu_module_instance(&lib->proto, ctx, &m);
    if (r)
        return r;
    m->lib = lib;
    pthread_mutex_lock(&cu_g.mu);
    m->next_in_lib = lib->per_ctx;
    lib->per_ctx = m;
    pthread_mutex_unlock(&cu_g.mu);
    *out = m;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lib_check(library);
    if (r)
        return r;
    struct CUctx_st *c;
    r = cu_ctx_current(&c);
    return r ? r : lib_module(library, c, pMod);
}

SIM_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lib_check(library);
    if (r)
        return r;
    if (library->proto.ptx) {
        int found = 0;
        for (const char *e = library->proto.entries; *e && !found; e += strlen(e) + 1)
            found = strcmp(e, name) == 0;
        if (!found)
            return CUDA_ERROR_NOT_FOUND;
    }
    pthread_mutex_lock(&cu_g.mu);
    struct CUkern_st *k = library->kernels;
    while (k && strcmp(k->name, name) != 0)
        k = k->next;
    if (!k) {
        size_t len = strlen(name);
        k = calloc(1, sizeof(*k) + len + 1);
        if (k) {
            memcpy(k->name, name, len + 1);
            k->lib = library;
            k->next = library->kernels;
            k->magic = KERNEL_MAGIC;
            library->kernels = k;
        }
    }
    pthread_mutex_unlock(&cu_g.mu);
    if (!k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = k;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                       const char *name)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lib_check(library);
    if (r)
        return r;
    struct CUctx_st *c;
    struct CUmod_st *m;
    if ((r = cu_ctx_current(&c)) || (r = lib_module(library, c, &m)))
        return r;
    return cuModuleGetGlobal_v2(dptr, bytes, m, name);
}

CUresult cu_func_in(CUfunction f, struct CUctx_st *ctx, struct CUfunc_st **out)
{
    if (f->magic == FUNC_MAGIC) {
        *out = f;
        return CUDA_SUCCESS;
    }
    struct CUkern_st *k = (struct CUkern_st *)(void *)f;
    pthread_mutex_lock(&cu_g.mu);
    struct CUfunc_st *cached = k->last_ctx == ctx ? k->last_fn : NULL;
    pthread_mutex_unlock(&cu_g.mu);
    if (cached) {
        *out = cached;
        return CUDA_SUCCESS;
    }
    struct CUmod_st *m;
    CUresult r = lib_module(k->lib, ctx, &m);
    if (!r)
        r = cu_module_function(m, k->name, out);
    if (!r) {
        pthread_mutex_lock(&cu_g.mu);
        k->last_ctx = ctx;
        k->last_fn = *out;
        pthread_mutex_unlock(&cu_g.mu);
    }
    return r;
}

SIM_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(kernel);
    if (r)
        return r;
    struct CUctx_st *c;
    r = cu_ctx_current(&c);
    return r ? r : cu_func_in((CUfunction)(void *)kernel, c, pFunc);
}

SIM_EXPORT CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    if (!pLib)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(kernel);
    if (!r)
        *pLib = kernel->lib;
    return r;
}

SIM_EXPORT CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(hfunc);
    if (!r)
        *name = hfunc->name;
    return r;
}
