/*
 * Unit test of the cuGetProcAddress fallback table (proctable.c), compiled with it alone by
 * tests/integration/test_shim.py.  Prints key=value lines; "bad=..." lines are failures.
 */
#include <stdio.h>
#include <string.h>

#include "../shim.h"

static const char *const names[SG_H_COUNT] = {
#define SG_HOOK(lib, name) #name,
#include "../hooks.def"
#undef SG_HOOK
};
static const int is_cu[SG_H_COUNT] = {
#define SG_HOOK(lib, name) SG_LIB_##lib == SG_LIB_CU,
#include "../hooks.def"
#undef SG_HOOK
};

static const char *target(int v)
{
    switch (v) {
    case SG_PROC_NONE:
        return "NONE";
    case SG_PROC_PASS:
        return "PASS";
    case SG_PROC_UNHOOKED:
        return "UNHOOKED";
    default:
        return v >= 0 && v < SG_H_COUNT ? names[v] : "?";
    }
}

/* With --stdin: answers "base version ptds" lines with "base version ptds target". */
static int answer_stdin(void)
{
    char base[128];
    int version, ptds;
    while (scanf("%127s %d %d", base, &version, &ptds) == 3)
        printf("%s %d %d %s\n", base, version, ptds,
               target(sg_proc_table_lookup(base, version,
                                           ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0)));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--stdin") == 0)
        return answer_stdin();
    /* Every hooked CUDA base resolves, for a current version and either stream mode, to a hook
     * of the same base: no allocation path can fall through the table. */
    int checked = 0;
    for (int i = 0; i < SG_H_COUNT; i++) {
        if (!is_cu[i])
            continue;
        char base[128];
        size_t n = sg_base_len(names[i]);
        memcpy(base, names[i], n);
        base[n] = '\0';
        for (int ptds = 0; ptds < 2; ptds++) {
            int v = sg_proc_table_lookup(base, 13000,
                                         ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
            if (v < 0 || sg_base_len(names[v]) != n || strncmp(names[v], base, n) != 0)
                printf("bad=%s ptds=%d -> %s\n", base, ptds, target(v));
            checked++;
        }
    }
    printf("checked=%d\n", checked);
    static const struct {
        const char *sym;
        int version;
        int ptds;
    } cases[] = {
        {"cuMemAlloc", 13000, 0},       {"cuMemAlloc", 3020, 0},
        {"cuMemAlloc", 3010, 0},        {"cuMemAllocPitch", 12000, 0},
        {"cuMemAllocAsync", 12000, 0},  {"cuMemAllocAsync", 12000, 1},
        {"cuMemAllocAsync", 11010, 0},  {"cuMemAllocFromPoolAsync", 11020, 1},
        {"cuMemFreeAsync", 12000, 1},   {"cuMemFree", 12000, 0},
        {"cuMemFree", 3000, 0},         {"cuMemCreate", 10020, 0},
        {"cuMemCreate", 10010, 0},      {"cuArrayCreate", 12000, 0},
        {"cuGetProcAddress", 12000, 0}, {"cuGetProcAddress", 11030, 0},
        {"cuMemGetInfo", 12000, 0},     {"cuLaunchKernel", 12000, 0},
        {"cuMemAllocManaged", 12000, 1},   {"cuMemsetD8", 12000, 0},
        {"cuLaunchKernel", 12000, 1},      {"cuGraphLaunch", 12000, 1},
        {"cuMemcpyDtoH", 12000, 1},        {"cuMemcpyDtoH", 3000, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        printf("%s@%d%s=%s\n", cases[i].sym, cases[i].version, cases[i].ptds ? "_ptds" : "",
               target(sg_proc_table_lookup(
                   cases[i].sym, cases[i].version,
                   cases[i].ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0)));
    return 0;
}
