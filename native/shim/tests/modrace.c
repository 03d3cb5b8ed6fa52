/*
 * A tenant racing the module-globals charge (tests/integration/test_driver_memory.py): one thread flips the
 * first byte of a global's name in a PTX image (`big` <-> `%ig`, both names the driver places)
 * while the main thread loads that same buffer again and again.  A shim that lets the driver
 * read the caller's buffer and then scans the buffer again for names can ask for the name the
 * driver did not place, so the load succeeds with nothing charged.
 *
 *   modrace <module|module-ex|library|library-preserved> <tries> <global MiB>
 *
 * (library-preserved: cuLibraryLoadData with CU_LIBRARY_BINARY_IS_PRESERVED, which lets the
 * driver read the code after the load.)
 *
 * After each successful load the placed globals are asked of the driver under both names and
 * compared with what the load took from the tenant's free memory (cuMemGetInfo); then the
 * module or library is unloaded.  Prints tries=, loads=, big=, pct= (loads that placed each
 * name), uncharged= (loads whose globals were not all charged) and max_used= (bytes).  Stops
 * at the first uncharged load.  A comment of repeated identifiers before the declaration makes
 * the scan reach the name later than the driver read it, so the flip lands in between often.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sharegpu/cuda_api.h"

#define MIB (1024ull * 1024ull)
#define PAD (64u * 1024u)

static char *image;
static size_t flip_at;
static atomic_int stop;

static void *flipper(void *arg)
{
    (void)arg;
    _Atomic char *c = (_Atomic char *)&image[flip_at];
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        atomic_store_explicit(c, '%', memory_order_relaxed);
        atomic_store_explicit(c, 'b', memory_order_relaxed);
    }
    return NULL;
}

static size_t global_size(const char *mode, void *handle, const char *name)
{
    CUdeviceptr p;
    size_t bytes = 0;
    CUresult r = strncmp(mode, "library", 7) == 0
                     ? cuLibraryGetGlobal(&p, &bytes, (CUlibrary)handle, name)
                     : cuModuleGetGlobal_v2(&p, &bytes, (CUmodule)handle, name);
    return r == CUDA_SUCCESS ? bytes : 0;
}

static CUresult load(const char *mode, void **handle)
{
    if (strcmp(mode, "module") == 0)
        return cuModuleLoadData((CUmodule *)handle, image);
    if (strcmp(mode, "module-ex") == 0)
        return cuModuleLoadDataEx((CUmodule *)handle, image, 0, NULL, NULL);
    if (strcmp(mode, "library") == 0)
        return cuLibraryLoadData((CUlibrary *)handle, image, NULL, NULL, 0, NULL, NULL, 0);
    CUlibraryOption preserved[] = {1 /* CU_LIBRARY_BINARY_IS_PRESERVED */};
    void *values[] = {NULL};
    return cuLibraryLoadData((CUlibrary *)handle, image, NULL, NULL, 0, preserved, values, 1);
}

static void unload(const char *mode, void *handle)
{
    if (strncmp(mode, "library", 7) == 0)
        cuLibraryUnload((CUlibrary)handle);
    else
        cuModuleUnload((CUmodule)handle);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: modrace <module|module-ex|library|library-preserved> <tries> <global MiB>\n");
        return 2;
    }
    const char *mode = argv[1];
    long tries = atol(argv[2]);
    unsigned long long mib = strtoull(argv[3], NULL, 10);
    size_t cap = PAD + 256;
    image = malloc(cap);
    if (!image)
        return 1;
    int n = snprintf(image, cap, ".version 8.0\n.target sm_90\n.address_size 64\n// ");
    for (unsigned i = 0; i < PAD / 2; i++) {
        image[n++] = 'x';
        image[n++] = ' ';
    }
    n += snprintf(image + n, cap - (size_t)n, "\n.global .b8 ");
    flip_at = (size_t)n;
    snprintf(image + n, cap - (size_t)n, "big[%llu];\n.visible .entry k()\n{\n\tret;\n}\n",
             mib * MIB);

    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("error=setup\n");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, flipper, NULL);
    long done, loads = 0, uncharged = 0, big = 0, pct = 0;
    size_t max_used = 0;
    for (done = 0; done < tries && !uncharged; done++) {
        size_t free0, free1, total;
        cuMemGetInfo_v2(&free0, &total);
        void *handle = NULL;
        if (load(mode, &handle) != CUDA_SUCCESS)
            continue;
        loads++;
        size_t b = global_size(mode, handle, "big"), p = global_size(mode, handle, "%ig");
        big += b != 0;
        pct += p != 0;
        cuMemGetInfo_v2(&free1, &total);
        if (total - free1 > max_used)
            max_used = total - free1;
        if (free0 < free1 || free0 - free1 < b + p)
            uncharged++;
        unload(mode, handle);
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("tries=%ld\nloads=%ld\nbig=%ld\npct=%ld\nuncharged=%ld\nmax_used=%zu\n", done, loads, big,
           pct, uncharged, max_used);
    return 0;
}
