/*
 * Ways past the cap that tests/integration/test_shim_escapes.py checks stay closed.  Built twice:
 *   -DWRAPPER -DWRAP_NAME(x)=wrapa_##x (and wrapb_): a tracing wrapper as profilers write
 *              them, preloaded after the shim: it defines cuMemAlloc_v2, which counts its calls
 *              in wrapX_calls and forwards to dlsym(RTLD_NEXT, "cuMemAlloc_v2"), and wrapX_next()
 *              returns that RTLD_NEXT answer;
 *   (none):    the program, linked against libcuda.so.1, one command per way:
 *     dlvsym-dlsym <ver>   glibc's dlsym through dlvsym(RTLD_DEFAULT, "dlsym", ver)
 *     dlvsym-cu <ver>      dlvsym(libcuda, "cuMemAlloc_v2", ver)
 *     dlvsym-dlvsym <ver>  dlvsym(RTLD_DEFAULT, "dlvsym", ver), then that for dlsym, then that
 *                          for the driver's alloc
 *     dlsym-dlvsym <ver>   the same from dlsym(RTLD_DEFAULT, "dlvsym")
 *     wrapper              wrapa_next() (the first wrapper's RTLD_NEXT) called past the cap, and
 *                          how often each wrapper's cuMemAlloc_v2 ran (calls_a=, calls_b=)
 *     raw-clone            a child made by the clone system call, past fork's atfork handlers,
 *                          allocating after its parent exited
 *     vmm-import           a VMM allocation exported and imported in the same process, the
 *                          original released: then as much again
 *     vmm-reimport         three rounds of: create, export, release the handle (unmapped: its
 *                          allocation ends for the shim), import the still-open descriptor, map
 *                          and write it
 *     vmm-import-refused   an import whose allocation is no longer charged, mapped while other
 *                          memory fills the cap (refused), then with room (charged once, also
 *                          when mapped twice)
 *     vmm-retain           create, map, cuMemRetainAllocationHandle, unmap, release: the
 *                          retained reference keeps the memory, so it stays charged
 *     vmm-many-unmap       100 allocations mapped into one reservation, released, and unmapped
 *                          by one cuMemUnmap of the whole range (more than any fixed batch)
 * Each prints over=<CUresult of an allocation past the cap> (-1: the lookup found nothing), and used=/total= from cuMemGetInfo.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <signal.h>
#include <unistd.h>

#include "sharegpu/cuda_api.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

#define MIB (1024ull * 1024ull)

#if defined(WRAPPER)
/* Calls into this copy of the wrapper's cuMemAlloc_v2 (the second copy counts them). */
__attribute__((visibility("default"))) int WRAP_NAME(calls);

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    WRAP_NAME(calls)++;
    alloc_fn next = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return next ? next(p, n) : CUDA_ERROR_NOT_FOUND;
}

/* What this library's RTLD_NEXT gives for the driver's allocator.  Not a tail call: glibc must
 * see this library as the caller. */
__attribute__((visibility("default"))) void *WRAP_NAME(next)(void)
{
    void *p = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    __asm__ volatile("" : "+r"(p));
    return p;
}
#else

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static void *driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        printf("error=%s\n", dlerror());
        exit(1);
    }
    return h;
}

/* Tries `size` bytes through fn; prints key=<CUresult>. */
static void try_alloc(const char *key, alloc_fn fn, size_t size)
{
    CUdeviceptr p = 0;
    printf("%s=%d\n", key, fn ? (int)fn(&p, size) : -1);
}

/* The driver's allocator through the dlsym that dv gives for version ver. */
static alloc_fn via_dlvsym(dlvsym_fn dv, const char *ver)
{
    dlsym_fn ds = dv ? (dlsym_fn)dv(RTLD_DEFAULT, "dlsym", ver) : NULL;
    return ds ? (alloc_fn)ds(driver(), "cuMemAlloc_v2") : NULL;
}

static void report(void)
{
    size_t fr = 0, tot = 0;
    cuMemGetInfo_v2(&fr, &tot);
    printf("used=%zu\ntotal=%zu\n", tot - fr, tot);
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

/* Maps handle over a fresh reservation, read-write; 0 on failure. */
static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h, size_t size)
{
    CUdeviceptr va = 0;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cuMemAddressReserve(&va, size, 0, 0, 0) || cuMemMap(va, size, 0, h, 0) ||
        cuMemSetAccess(va, size, &acc, 1))
        return 0;
    return va;
}

/* 600 MiB created, exported and imported (a second handle of the same memory), the imported
 * handle mapped and written, the original released; then another 600 MiB past a 1000 MiB cap. */
static void vmm_import(void)
{
    size_t size = 600 * MIB;
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0, h2 = 0, h3 = 0;
    printf("create=%d\n", (int)cuMemCreate(&h, size, &prop, 0));
    int fd = -1;
    printf("export=%d\n",
           (int)cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("import=%d\n", (int)cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)fd,
                                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr va = vmm_map(h2, size);
    printf("mapped=%d\n", va != 0);
    printf("release=%d\n", (int)cuMemRelease(h));
    if (va)
        printf("write=%d\n", (int)cuMemsetD8_v2(va, 0x5a, size));
    printf("over=%d\n", (int)cuMemCreate(&h3, size, &prop, 0));
    report();
    /* Last unmap, then the last handle: all of it back. */
    printf("unmap=%d\n", va ? (int)cuMemUnmap(va, size) : -1);
    report();
    printf("release2=%d\n", (int)cuMemRelease(h2));
    report();
    printf("after=%d\n", (int)cuMemCreate(&h3, size, &prop, 0));
}

/* Maps handle at va (in a reservation), read-write; the CUresult of the map. */
static CUresult vmm_map_at(CUdeviceptr va, CUmemGenericAllocationHandle h, size_t size)
{
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = cuMemMap(va, size, 0, h, 0);
    return r ? r : cuMemSetAccess(va, size, &acc, 1);
}

/* A handle of an allocation whose own handle is gone: created (charged), exported, released
 * unmapped (for the shim its allocation has ended), imported back from the open descriptor. */
static CUresult vmm_orphan(CUmemGenericAllocationHandle *h2, size_t size, const char *tag)
{
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    CUresult r = cuMemCreate(&h, size, &prop, 0);
    printf("%screate=%d\n", tag, (int)r);
    if (r)
        return r;
    r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (!r)
        r = cuMemRelease(h);
    if (!r)
        r = cuMemImportFromShareableHandle(h2, (void *)(intptr_t)fd,
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (fd >= 0)
        close(fd);
    printf("%simport=%d\n", tag, (int)r);
    return r;
}

/* Three rounds of vmm_orphan of 600 MiB, each mapped and written: under a 1000 MiB cap at most
 * one may be; then all of it unmapped and released. */
static void vmm_reimport(void)
{
    size_t size = 600 * MIB;
    CUmemGenericAllocationHandle hs[3] = {0};
    CUdeviceptr vas[3] = {0};
    int written = 0;
    for (int i = 0; i < 3; i++) {
        if (vmm_orphan(&hs[i], size, "") || cuMemAddressReserve(&vas[i], size, 0, 0, 0))
            continue;
        CUresult r = vmm_map_at(vas[i], hs[i], size);
        printf("map=%d\n", (int)r);
        if (!r && cuMemsetD8_v2(vas[i], 0x5a, size) == CUDA_SUCCESS)
            written++;
        report();
    }
    printf("written_mib=%d\n", written * 600);
    for (int i = 0; i < 3; i++) {
        if (vas[i])
            cuMemUnmap(vas[i], size); /* fails harmlessly where nothing was mapped */
        if (hs[i])
            cuMemRelease(hs[i]);
    }
    report();
}

/* vmm_orphan of 600 MiB; 600 MiB allocated: its map is past the cap; freed: it maps, charged
 * 600 MiB, and mapping it a second time costs nothing more; the charge ends with the last of
 * its mappings and handle. */
static void vmm_import_refused(void)
{
    size_t size = 600 * MIB;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0, va2 = 0, p = 0;
    if (vmm_orphan(&h, size, "") || cuMemAddressReserve(&va, size, 0, 0, 0) ||
        cuMemAddressReserve(&va2, size, 0, 0, 0))
        return;
    printf("alloc=%d\n", (int)cuMemAlloc_v2(&p, size));
    printf("map_over=%d\n", (int)cuMemMap(va, size, 0, h, 0));
    report();
    printf("free=%d\n", (int)cuMemFree_v2(p));
    printf("map=%d\n", (int)vmm_map_at(va, h, size));
    printf("map2=%d\n", (int)vmm_map_at(va2, h, size));
    report();
    printf("unmap=%d\n", (int)cuMemUnmap(va, size));
    printf("unmap2=%d\n", (int)cuMemUnmap(va2, size));
    report(); /* the handle still holds the memory */
    printf("release=%d\n", (int)cuMemRelease(h));
    report();
}

/* 600 MiB created and mapped; a reference retained from its address; unmapped; the first
 * reference released: the retained one keeps the memory, mapped again and written, so another
 * 600 MiB is past the cap; the charge ends with the last reference and mapping. */
static void vmm_retain(void)
{
    size_t size = 600 * MIB;
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0, h2 = 0, h3 = 0;
    CUdeviceptr va = 0;
    printf("create=%d\n", (int)cuMemCreate(&h, size, &prop, 0));
    if (cuMemAddressReserve(&va, size, 0, 0, 0))
        return;
    printf("map=%d\n", (int)vmm_map_at(va, h, size));
    printf("retain=%d\n", (int)cuMemRetainAllocationHandle(&h2, (void *)(va + 4096)));
    printf("same=%d\n", h2 == h);
    printf("unmap=%d\n", (int)cuMemUnmap(va, size));
    printf("release=%d\n", (int)cuMemRelease(h));
    report();
    printf("map2=%d\n", (int)vmm_map_at(va, h2, size));
    printf("write=%d\n", (int)cuMemsetD8_v2(va, 0x5a, size));
    printf("over=%d\n", (int)cuMemCreate(&h3, size, &prop, 0));
    report();
    printf("unmap2=%d\n", (int)cuMemUnmap(va, size));
    printf("release2=%d\n", (int)cuMemRelease(h2));
    report();
    printf("release3=%d\n", (int)cuMemRelease(h2)); /* no reference left */
}

/* 20 allocations of 2 MiB mapped side by side in one reservation, all released (the mappings
 * keep them), then one cuMemUnmap of the whole range ends all 20. */
static void vmm_many_unmap(void)
{
    enum { N = 100 };
    size_t gran = 2 * MIB;
    CUmemAllocationProp prop = vmm_prop();
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    CUdeviceptr va = 0;
    if (cuMemAddressReserve(&va, N * gran, 0, 0, 0))
        return;
    int mapped = 0;
    for (int i = 0; i < N; i++) {
        CUmemGenericAllocationHandle h = 0;
        if (cuMemCreate(&h, gran, &prop, 0) == CUDA_SUCCESS &&
            vmm_map_at(va + (CUdeviceptr)i * gran, h, gran) == CUDA_SUCCESS &&
            cuMemRelease(h) == CUDA_SUCCESS)
            mapped++;
    }
    printf("mapped=%d\n", mapped);
    report();
    printf("unmap=%d\n", (int)cuMemUnmap(va, N * gran));
    report();
}

/* A raw clone (no atfork handlers run): the parent holds 100 MiB, the child 600 MiB; the parent
 * exits normally; then the child asks for 500 MiB more, which is past the cap as long as its
 * 600 MiB count, as they must (the driver frees them only when the child lets go). */
static void raw_clone(void)
{
    CUdeviceptr p = 0;
    printf("parent=%d\n", (int)cuMemAlloc_v2(&p, 100 * MIB));
    fflush(stdout);
    int ready[2], gone[2];
    if (pipe(ready) || pipe(gone))
        exit(1);
    long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) {
        char c;
        close(gone[1]);
        printf("child=%d\n", (int)cuMemAlloc_v2(&p, 600 * MIB));
        fflush(stdout);
        if (write(ready[1], "r", 1) != 1 || read(gone[0], &c, 1) != 0)
            _exit(1); /* EOF: the parent has exited */
        try_alloc("over", cuMemAlloc_v2, 500 * MIB);
        report();
        fflush(stdout);
        _exit(0);
    }
    char c;
    if (pid < 0 || read(ready[0], &c, 1) != 1)
        exit(1);
    exit(0); /* a normal exit: the shim's destructor gives the parent's slot back */
}

/* A raw clone child spends its parent's spare on the lock-free path: the parent allocated and
 * freed (its spare topped up), the child takes 28 x 1 MiB, the parent exits normally (its slot,
 * spare and all, given back); then the child asks for 990 MiB, past the cap while its 28 MiB
 * count. */
static void raw_clone_spare(void)
{
    CUdeviceptr p = 0;
    cuMemAlloc_v2(&p, MIB);
    cuMemFree_v2(p);
    int ready[2], gone[2];
    if (pipe(ready) || pipe(gone))
        exit(1);
    long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) {
        char c;
        int ok = 0;
        close(gone[1]);
        for (int i = 0; i < 28; i++)
            ok += cuMemAlloc_v2(&p, MIB) == CUDA_SUCCESS;
        printf("child=%d\n", ok);
        fflush(stdout);
        if (write(ready[1], "r", 1) != 1 || read(gone[0], &c, 1) != 0)
            _exit(1);
        try_alloc("over", cuMemAlloc_v2, 990 * MIB);
        report();
        fflush(stdout);
        _exit(0);
    }
    char c;
    if (pid < 0 || read(ready[0], &c, 1) != 1)
        exit(1);
    exit(0);
}

/* Two threads set one context's malloc heap limit over and over, one to 8 MiB and one to 300
 * MiB; then the limit is set to 9 MiB.  What the tenant is charged for it must be what setting
 * 9 MiB cost before the race, not what a lost update left. */
static CUcontext race_ctx;
static void *limit_flipper(void *arg)
{
    size_t value = (size_t)(uintptr_t)arg;
    cuCtxSetCurrent(race_ctx);
    for (int i = 0; i < 20000; i++)
        cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, value);
    return NULL;
}

static void limit_race(void)
{
    cuCtxGetCurrent(&race_ctx);
    pthread_t a, b;
    pthread_create(&a, NULL, limit_flipper, (void *)(uintptr_t)(8 * MIB));
    pthread_create(&b, NULL, limit_flipper, (void *)(uintptr_t)(300 * MIB));
    pthread_join(a, NULL);
    pthread_join(b, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *cmd = argv[1], *ver = argc > 2 ? argv[2] : "GLIBC_2.34";
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        printf("error=init\n");
        return 1;
    }
    size_t over = 1500 * MIB; /* past a 1000 MiB cap, within the simulated card */
    if (strcmp(cmd, "dlvsym-dlsym") == 0) {
        dlsym_fn ds = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", ver);
        try_alloc("over", ds ? (alloc_fn)ds(driver(), "cuMemAlloc_v2") : NULL, over);
    } else if (strcmp(cmd, "dlvsym-cu") == 0) {
        try_alloc("over", (alloc_fn)dlvsym(driver(), "cuMemAlloc_v2", ver), over);
    } else if (strcmp(cmd, "dlvsym-dlvsym") == 0) {
        dlvsym_fn dv = (dlvsym_fn)dlvsym(RTLD_DEFAULT, "dlvsym", ver);
        try_alloc("over", via_dlvsym(dv, ver), over);
    } else if (strcmp(cmd, "dlsym-dlvsym") == 0) {
        dlvsym_fn dv = (dlvsym_fn)dlsym(RTLD_DEFAULT, "dlvsym");
        try_alloc("over", via_dlvsym(dv, ver), over);
    } else if (strcmp(cmd, "wrapper") == 0) {
        void *(*next)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "wrapa_next");
        try_alloc("over", next ? (alloc_fn)next() : NULL, over);
        try_alloc("fit", next ? (alloc_fn)next() : NULL, 100 * MIB);
        int *a = (int *)dlsym(RTLD_DEFAULT, "wrapa_calls"), *b = (int *)dlsym(RTLD_DEFAULT, "wrapb_calls");
        printf("calls_a=%d\ncalls_b=%d\n", a ? *a : -1, b ? *b : -1);
    } else if (strcmp(cmd, "raw-clone") == 0) {
        raw_clone();
    } else if (strcmp(cmd, "linked") == 0) {
        try_alloc("over", cuMemAlloc_v2, over); /* bound at load time, as C programs call it */
    } else if (strcmp(cmd, "raw-clone-spare") == 0) {
        raw_clone_spare();
    } else if (strcmp(cmd, "limit-race") == 0) {
        printf("set=%d\n", (int)cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 9 * MIB));
        report(); /* what 9 MiB costs, set once */
        limit_race();
        printf("set=%d\n", (int)cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 9 * MIB));
        report();
        return 0;
    } else if (strcmp(cmd, "vmm-import") == 0) {
        vmm_import();
        return 0;
    } else if (strcmp(cmd, "vmm-reimport") == 0) {
        vmm_reimport();
        return 0;
    } else if (strcmp(cmd, "vmm-import-refused") == 0) {
        vmm_import_refused();
        return 0;
    } else if (strcmp(cmd, "vmm-retain") == 0) {
        vmm_retain();
        return 0;
    } else if (strcmp(cmd, "vmm-many-unmap") == 0) {
        vmm_many_unmap();
        return 0;
    } else {
        return 2;
    }
    report();
    return 0;
}
#endif
