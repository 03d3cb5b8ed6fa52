/* Drives fakecuda.c through dlopen + dlsym + cuGetProcAddress_v2 (tests/integration/test_shim.py). */
#include <dlfcn.h>
#include <stdio.h>

#include "sharegpu/cuda_api.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("error=%s\n", dlerror());
        return 1;
    }
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(&cuGetProcAddress_v2))dlsym(h, "cuGetProcAddress_v2");
    __typeof__(&cuInit) init = (__typeof__(&cuInit))dlsym(h, "cuInit");
    int (*hidden)(void) = (int (*)(void))dlsym(h, "fake_hidden_calls");
    printf("init=%d\n", (int)init(0));
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gpa("cuMemAlloc", &p, 12000, 0, &st);
    printf("gpa_alloc=%d\n", (int)r);
    printf("alloc_is_hook=%d\n", p == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    CUdeviceptr d1 = 0, d2 = 0;
    printf("alloc_over=%d\n", (int)((alloc_fn)p)(&d1, 2u << 20));
    printf("alloc_fit=%d\n", (int)((alloc_fn)p)(&d2, 1u << 20));
    printf("alloc_one_more=%d\n", (int)((alloc_fn)p)(&d1, 1));
    void *f = NULL;
    r = gpa("cuMemFree", &f, 12000, 0, &st);
    printf("gpa_free=%d\n", (int)r);
    printf("free=%d\n", (int)((free_fn)f)(d2));
    printf("alloc_after_free=%d\n", (int)((alloc_fn)p)(&d1, 1u << 20));
    void *g = NULL;
    r = gpa("cuMemGetInfo", &g, 12000, 0, &st);
    size_t fr = 0, tot = 0;
    printf("info=%d\n", (int)((info_fn)g)(&fr, &tot));
    printf("total=%zu\nfree=%zu\n", tot, fr);
    void *l = NULL;
    r = gpa("cuLaunchKernel", &l, 12000, 0, &st);
    printf("gpa_launch=%d\n", (int)r);
    printf("launch_is_hook=%d\n", l != NULL && l == dlsym(RTLD_DEFAULT, "cuLaunchKernel"));
    printf("hidden_calls=%d\n", hidden ? hidden() : -1);
    /* PTX with a preprocessor line, which the shim must refuse before the driver reads it (the
     * fake one loads anything), and a `#` in a line comment, which it must let through. */
    static const char *const ptx[][2] = {
        {"ptx_directive", ".version 8.0\n#define CAT(a, b) a##b\n"},
        {"ptx_after_comment", ".version 8.0\n/**/#define CAT(a, b) a##b\n"},
        {"ptx_after_multiline_comment", ".version 8.0\n/*\n*/#define CAT(a, b) a##b\n"},
        {"ptx_hash_in_comment", ".version 8.0\n// issue #3\n"},
    };
    __typeof__(&cuModuleLoadData) load = (__typeof__(&cuModuleLoadData))dlsym(h, "cuModuleLoadData");
    int (*loads)(void) = (int (*)(void))dlsym(h, "fake_module_loads");
    for (size_t i = 0; i < sizeof ptx / sizeof ptx[0]; i++) {
        CUmodule m;
        printf("%s=%d\n", ptx[i][0], load ? (int)load(&m, ptx[i][1]) : -1);
    }
    printf("module_loads=%d\n", loads ? loads() : -1);
    return 0;
}
