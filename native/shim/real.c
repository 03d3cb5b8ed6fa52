/*
 * Finding the real functions, and handing our hooks to whoever looks entry points up at run
 * time: the dlsym override and cuGetProcAddress / cuGetProcAddress_v2.
 *
 * Programs reach the driver three ways, and each lands on a hook:
 *   1. linked against libcuda.so.1: the preloaded shim's exports interpose at load time;
 *   2. dlopen + dlsym (ctypes, pynvml): our dlsym returns the hook when the name is hooked and
 *      the real lookup succeeds;
 *   3. cuGetProcAddress(_v2) (CUDA runtime, cuda-python): we call the real one, identify which
 *      exported variant it returned and return our hook for that variant (falling back to the
 *      version table of proctable.c when the pointer is not one we can name).
 */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

void *sg_real_ptr[SG_R_COUNT];
unsigned char sg_real_done[SG_R_COUNT];
__thread int sg_in_hook __attribute__((tls_model("initial-exec")));

const char *const sg_hook_names[SG_H_COUNT] = {
#define SG_HOOK(lib, name) #name,
#include "hooks.def"
#undef SG_HOOK
};

const unsigned char sg_hook_lib[SG_H_COUNT] = {
#define SG_HOOK(lib, name) SG_LIB_##lib,
#include "hooks.def"
#undef SG_HOOK
};

void *sg_hook_addr(enum sg_hook_id id)
{
    switch (id) {
#define SG_HOOK(lib, name)                                                                         \
    case SG_H_##name:                                                                              \
        return (void *)&name;
#include "hooks.def"
#undef SG_HOOK
    case SG_H_COUNT:
        break;
    }
    return NULL;
}

/* The real function behind hook id (NULL where missing). */
static const void *real_of(enum sg_hook_id id)
{
    switch (id) {
#define SG_HOOK(lib, name)                                                                         \
    case SG_H_##name:                                                                              \
        return (const void *)SG_REAL(name);
#include "hooks.def"
#undef SG_HOOK
    case SG_H_COUNT:
        break;
    }
    return NULL;
}

/* ---- errors and the one log line ------------------------------------------------------ */

int sg_fail(struct sg_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

CUresult sg_cu_result(int code)
{
    switch (code) {
    case SG_OK:
        return CUDA_SUCCESS;
    case SG_E_OVERCAP:
    case SG_E_NOSLOT:
    case SG_E_NOMEM:
    case SG_E_BUSY:
        return CUDA_ERROR_OUT_OF_MEMORY;
    case SG_E_INVAL:
        return CUDA_ERROR_INVALID_VALUE;
    case SG_E_NOTFOUND:
        return CUDA_ERROR_NOT_FOUND;
    case SG_E_CONFIG:
    default:
        return CUDA_ERROR_NOT_PERMITTED;
    }
}

nvmlReturn_t sg_nvml_result(int code)
{
    switch (code) {
    case SG_OK:
        return NVML_SUCCESS;
    case SG_E_INVAL:
        return NVML_ERROR_INVALID_ARGUMENT;
    case SG_E_NOMEM:
    case SG_E_OVERCAP:
    case SG_E_NOSLOT:
        return NVML_ERROR_MEMORY;
    case SG_E_NOTFOUND:
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    case SG_E_CONFIG:
    default:
        return NVML_ERROR_NO_PERMISSION;
    }
}

void sg_log_once(int *once, const char *fmt, ...)
{
    if (__atomic_exchange_n(once, 1, __ATOMIC_ACQ_REL))
        return;
    char line[512];
    size_t n = sizeof SG_PREFIX - 1;
    memcpy(line, SG_PREFIX, n);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += (size_t)m < sizeof line - n - 1 ? (size_t)m : sizeof line - n - 2;
    line[n++] = '\n';
    /* One write(2): the line is not interleaved with other threads' output. */
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}

/* ---- the real dlsym, dlvsym and dlopen ------------------------------------------------------ */

/* glibc's definition of a libdl function, by its symbol versions (2.34 moved libdl into libc;
 * older glibc has only the 2.2.5 version).  Read from the symbol tables (libcsym.c): asking
 * dlvsym would reach our own. */
static void *libc_fn(const char *name)
{
    void *p = sg_libc_sym(name, "GLIBC_2.34");
    return p ? p : sg_libc_sym(name, "GLIBC_2.2.5");
}

typedef void *(*sg_dlsym_fn)(void *, const char *);
typedef void *(*sg_dlvsym_fn)(void *, const char *, const char *);
typedef void *(*sg_dlopen_fn)(const char *, int);

/* Each found once: every thread finds the same pointer, so a race only repeats the work. */
#define SG_LIBC_FN(fn_name, type, name)                                                                \
    static type fn_name##_ptr;                                                                     \
    static type fn_name(void)                                                                      \
    {                                                                                              \
        type fn = __atomic_load_n(&fn_name##_ptr, __ATOMIC_ACQUIRE);                               \
        if (!fn) {                                                                                 \
            fn = (type)libc_fn(name);                                                              \
            __atomic_store_n(&fn_name##_ptr, fn, __ATOMIC_RELEASE);                                \
        }                                                                                          \
        return fn;                                                                                 \
    }
SG_LIBC_FN(real_dlsym, sg_dlsym_fn, "dlsym")
SG_LIBC_FN(real_dlvsym, sg_dlvsym_fn, "dlvsym")
SG_LIBC_FN(real_dlopen, sg_dlopen_fn, "dlopen")

/* ---- resolving the real functions (each once, on first use) ----------------------------- */

static const char *const real_names[SG_R_COUNT] = {
#define SG_HOOK(lib, name) #name,
#define SG_HELPER(lib, name) #name,
#include "hooks.def"
#undef SG_HOOK
#undef SG_HELPER
};

static const unsigned char real_lib[SG_R_COUNT] = {
#define SG_HOOK(lib, name) SG_LIB_##lib,
#define SG_HELPER(lib, name) SG_LIB_##lib,
#include "hooks.def"
#undef SG_HOOK
#undef SG_HELPER
};

static void *cu_handle, *nvml_handle;

static void open_cu(void)
{
    cu_handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
}
SG_FAST_ONCE(open_cu_once, open_cu)

static void open_nvml(void)
{
    nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
}
SG_FAST_ONCE(open_nvml_once, open_nvml)

/* The library is opened once; each name is looked up once.  Two threads racing on one name
 * both ask the real dlsym and store the same pointer. */
void *sg_real_lookup(enum sg_real_id id)
{
    void *h;
    if (real_lib[id] == SG_LIB_CU) {
        open_cu_once();
        h = cu_handle;
    } else {
        open_nvml_once();
        h = nvml_handle;
    }
    sg_dlsym_fn dls = real_dlsym();
    void *p = h && dls ? dls(h, real_names[id]) : NULL;
    __atomic_store_n(&sg_real_ptr[id], p, __ATOMIC_RELAXED);
    __atomic_store_n(&sg_real_done[id], 1, __ATOMIC_RELEASE);
    return p;
}

void sg_real_cu_all(void)
{
    for (int i = 0; i < SG_R_COUNT; i++)
        if (real_lib[i] == SG_LIB_CU)
            sg_real_get((enum sg_real_id)i);
}

/* ---- names -------------------------------------------------------------------------------- */

int sg_hook_find(const char *name)
{
    /* Cheap rejection first: every hooked name starts with "cu" or "nvml". */
    if (name[0] != 'c' && name[0] != 'n')
        return -1;
    for (int i = 0; i < SG_H_COUNT; i++)
        if (strcmp(sg_hook_names[i], name) == 0)
            return i;
    return -1;
}

/* ---- dlsym and dlvsym ------------------------------------------------------------------------ */

/*
 * Every lookup a program can make lands here: dlsym, and dlvsym of any version.  A hooked name
 * found by the real lookup is answered with its hook; dlsym, dlvsym and dlopen with ours (through
 * glibc's, a program would reach the driver past the shim).  RTLD_NEXT is different (below).
 */

static void *launder(const void *p)
{
    void *q = (void *)p;
    __asm__("" : "+r"(q));
    return q;
}

/* Ours for glibc's dlsym, dlvsym and dlopen (one address serves all their versions); else p. */
static void *ours_for_libc(void *p)
{
    if (p == (void *)real_dlsym())
        return (void *)&dlsym;
    if (p == (void *)real_dlvsym())
        return (void *)&dlvsym;
    if (p == (void *)real_dlopen())
        return (void *)&dlopen;
    return p;
}

/* Ours for a lookup of dlsym, dlvsym or dlopen by name, whoever defines it (a second libc in a
 * dlmopen namespace too); NULL for other names. */
static void *ours_by_name(const char *name)
{
    if (strcmp(name, "dlsym") == 0)
        return (void *)&dlsym;
    if (strcmp(name, "dlvsym") == 0)
        return (void *)&dlvsym;
    if (strcmp(name, "dlopen") == 0)
        return (void *)&dlopen;
    return NULL;
}

/* What a lookup of `name` on a handle that found p (not NULL) returns to the program. */
static void *answer(const char *name, void *p)
{
    int id = sg_hook_find(name);
    if (id >= 0)
        return sg_hook_addr((enum sg_hook_id)id);
    void *ours = ours_by_name(name);
    return ours ? ours : p;
}

/* The object (link map) that holds address p, NULL if none. */
static struct link_map *object_of(const void *p)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(p, &info, (void **)&lm, RTLD_DL_LINKMAP))
        return NULL;
    return lm;
}

/* Is p a function of the real libcuda or libnvidia-ml, the objects the hooks forward to? */
static bool in_driver(int id, const void *p)
{
    void *h;
    if (sg_hook_lib[id] == SG_LIB_CU) {
        open_cu_once();
        h = cu_handle;
    } else {
        open_nvml_once();
        h = nvml_handle;
    }
    struct link_map *lm = NULL;
    return h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && object_of(p) == lm;
}

/*
 * RTLD_NEXT is resolved relative to the caller, which glibc finds from its return address, so a
 * plain forward must be a sibling call (below).  But the next definition of a hooked name after
 * a library loaded after the shim (a tracing wrapper's dlsym(RTLD_NEXT, "cuMemAlloc_v2")) is the
 * driver's own, past the cap; and glibc's answer cannot be post-processed without losing the
 * caller.  For those names only we find the next definition ourselves, as glibc does: the
 * caller's object from the return address (dladdr1), then the first object after it in load
 * order that defines the name itself (read from its symbol table, elfsym.c).  It is the
 * next interposer, left alone, or the driver, answered with the hook, or glibc's dl* function,
 * answered with ours.  (glibc skips objects dlopen'ed RTLD_LOCAL; the public interface cannot
 * tell them, so such an object's own definition is returned where glibc would look past it: it
 * is never the driver's, which is what matters here.)
 */
static void *next_definition(const void *caller, const char *name, const char *version)
{
    struct link_map *from = object_of(caller);
    if (!from)
        return NULL;
    for (struct link_map *o = from->l_next; o; o = o->l_next) {
        void *p = sg_elf_sym(o->l_ld, o->l_addr, name, version);
        if (p)
            return p;
    }
    return NULL;
}

/* Does RTLD_NEXT for name need our answer (see above), not a plain forward? */
static bool next_needs_us(const char *name)
{
    if (!launder(name) || !sg_configured())
        return false;
    return sg_hook_find(name) >= 0 || ours_by_name(name) != NULL;
}

static void *next_answer(const void *caller, const char *name, const char *version)
{
    if (!real_dlsym() || !real_dlvsym())
        return NULL;
    void *p = next_definition(caller, name, version);
    if (!p)
        return NULL;
    int id = sg_hook_find(name);
    if (id >= 0)
        return in_driver(id, p) ? sg_hook_addr((enum sg_hook_id)id) : p;
    return ours_for_libc(p);
}

/* A handle other than RTLD_NEXT: the real lookup, then our answer. */
static void *lookup(void *handle, const char *name, const char *version)
{
    sg_dlsym_fn dls = real_dlsym();
    sg_dlvsym_fn dlv = real_dlvsym();
    if (!dls || (version && !dlv))
        return NULL;
    void *p = version ? dlv(handle, name, version) : dls(handle, name);
    /* glibc declares name nonnull; a NULL from a buggy caller is passed on, never read. */
    if (!p || !launder(name) || !sg_configured())
        return p;
    return answer(name, p);
}

/*
 * The forwards under RTLD_NEXT are sibling calls, which the optimize attribute asks for even in
 * a -O0 build, so that glibc sees our caller's return address (another preloaded library
 * wrapping malloc with dlsym(RTLD_NEXT, "malloc") would otherwise find itself).
 * tests/integration/test_shim.py checks this with two preloaded libraries.
 */
SG_EXPORT __attribute__((optimize("O2", "optimize-sibling-calls"), noinline)) void *
dlsym(void *__restrict handle, const char *__restrict name)
{
    if (handle != RTLD_NEXT)
        return lookup(handle, name, NULL);
    if (next_needs_us(name))
        return next_answer(__builtin_return_address(0), name, NULL);
    sg_dlsym_fn dls = real_dlsym();
    if (dls)
        return dls(handle, name); /* tail call */
    return NULL;
}

SG_EXPORT __attribute__((optimize("O2", "optimize-sibling-calls"), noinline)) void *
dlvsym(void *__restrict handle, const char *__restrict name, const char *__restrict version)
{
    if (handle != RTLD_NEXT)
        return lookup(handle, name, version);
    if (next_needs_us(name))
        return next_answer(__builtin_return_address(0), name, version);
    sg_dlvsym_fn dlv = real_dlvsym();
    if (dlv)
        return dlv(handle, name, version); /* tail call */
    return NULL;
}

/* ---- dlopen: no RTLD_DEEPBIND past the shim ------------------------------------------------ */

/*
 * A library opened with RTLD_DEEPBIND (also Python's sys.setdlopenflags) binds its own
 * dependencies first, so its cu* calls would reach the driver past the preloaded shim and its
 * limits.  Under a tenant the flag is dropped (one line on stderr, once).  The real dlopen is
 * reached by a sibling call, as dlsym above is, so glibc still sees the caller's return address
 * and resolves the caller's RUNPATH and $ORIGIN as without us.
 */
static int deepbind_logged;

SG_EXPORT __attribute__((optimize("O2", "optimize-sibling-calls"))) void *
dlopen(const char *file, int mode)
{
    sg_dlopen_fn real = real_dlopen();
    if (!real)
        return NULL;
    if ((mode & RTLD_DEEPBIND) && sg_configured()) {
        sg_log_once(&deepbind_logged, "RTLD_DEEPBIND ignored for %s: it would bind the CUDA driver "
                                      "past this tenant's limits",
                    file ? file : "the main program");
        mode &= ~RTLD_DEEPBIND;
    }
    return real(file, mode); /* tail call */
}

/* ---- cuGetProcAddress --------------------------------------------------------------------- */

/* The hook to hand out for the driver's answer p to a query for `symbol`, or p itself, or NULL
 * (refuse: the answer could be an allocation path we cannot account). */
static void *proc_resolve(const char *symbol, void *p, int version, cuuint64_t flags)
{
    sg_real_cu_all();
    size_t blen = sg_base_len(symbol);
    /* 0. Already ours: a driver whose table takes the address of its own exported functions
     *    gets our interposing definitions back from the dynamic linker. */
    for (int i = 0; i < SG_H_COUNT; i++)
        if (sg_hook_addr((enum sg_hook_id)i) == p)
            return p;
    /* 1. Identify p among the variants of the same base... */
    for (int i = 0; i < SG_H_COUNT; i++) {
        if (sg_hook_lib[i] != SG_LIB_CU || real_of((enum sg_hook_id)i) != p)
            continue;
        if (sg_base_len(sg_hook_names[i]) == blen && strncmp(sg_hook_names[i], symbol, blen) == 0)
            return sg_hook_addr((enum sg_hook_id)i);
    }
    /* ...2. or among all hooks (a driver may alias one entry point to another). */
    for (int i = 0; i < SG_H_COUNT; i++)
        if (sg_hook_lib[i] == SG_LIB_CU && real_of((enum sg_hook_id)i) == p)
            return sg_hook_addr((enum sg_hook_id)i);
    /* 3. Not one of ours: decide by name and version. */
    char base[128];
    if (blen >= sizeof base)
        return p; /* longer than any name we hook */
    memcpy(base, symbol, blen);
    base[blen] = '\0';
    int v = sg_proc_table_lookup(base, version, flags);
    if (v >= 0)
        return sg_hook_addr((enum sg_hook_id)v);
    if (v == SG_PROC_NONE)
        return NULL;
    return p; /* SG_PROC_PASS, SG_PROC_UNHOOKED */
}

SG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    __typeof__(&cuGetProcAddress_v2) real = SG_REAL(cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = real(symbol, pfn, cudaVersion, flags, status);
    if (res != CUDA_SUCCESS || !symbol || !pfn || !*pfn || !sg_configured())
        return res;
    void *mine = proc_resolve(symbol, *pfn, cudaVersion, flags);
    *pfn = mine;
    if (!mine) {
        if (status)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    __typeof__(&cuGetProcAddress) real = SG_REAL(cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult res = real(symbol, pfn, cudaVersion, flags);
    if (res != CUDA_SUCCESS || !symbol || !pfn || !*pfn || !sg_configured())
        return res;
    void *mine = proc_resolve(symbol, *pfn, cudaVersion, flags);
    *pfn = mine;
    return mine ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ---- load order ------------------------------------------------------------------------------ */

/* The driver loaded ahead of us (LD_PRELOAD="libcuda.so.1 libsharegpu.so", or the driver listed
 * before the container's /etc/ld.so.preload): a program linked against it binds every driver
 * call to the driver, past every hook, and no later check can fail closed because no later call
 * reaches us.  So it is checked once, at load, and only where a tenant is configured: the
 * process refuses to run with one line that says why. */
__attribute__((constructor)) static void sg_check_load_order(void)
{
    if (!sg_configured())
        return;
    sg_dlsym_fn dls = real_dlsym();
    sg_dlopen_fn dlo = real_dlopen();
    void *driver = dlo ? dlo("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (!dls || !driver)
        return; /* not loaded yet: it will come after us */
    void *first = dls(RTLD_DEFAULT, "cuMemAlloc_v2");
    bool ahead = first && first != (void *)&cuMemAlloc_v2 && first == dls(driver, "cuMemAlloc_v2");
    dlclose(driver);
    if (!ahead)
        return;
    static const char msg[] = "sharegpu: libcuda.so.1 is loaded ahead of the sharegpu shim (check "
                              "LD_PRELOAD: the shim must come first); the program's driver calls "
                              "would bypass its tenant's caps, so it is not run\n";
    ssize_t told = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)told;
    _exit(1);
}
