/*
 * One end of a legacy-IPC exchange, driven line by line on stdin by
 * tests/integration/test_ipc.py (two of these: an exporter and an importer).  Commands, each
 * answered with one line of key=value pairs:
 *   alloc <MiB>          cuMemAlloc              -> rc= ptr=
 *   free <ptr>           cuMemFree               -> rc=
 *   handle <ptr>         cuIpcGetMemHandle       -> rc= handle=<128 hex digits>
 *   open <hex> [flags]   cuIpcOpenMemHandle      -> rc= ptr=
 *   open1 <hex>          the CUDA 4.1 entry point, found with cuGetProcAddress(version 4010)
 *   close <ptr>          cuIpcCloseMemHandle     -> rc=
 *   write <ptr> <u64>    one word copied in      -> rc=
 *   read <ptr>           one word copied out     -> rc= value=
 *   info                 cuMemGetInfo            -> rc= used= total=
 *   pool                 cuMemPoolCreate, exportable by POSIX descriptor -> rc= pool=
 *   palloc <pool> <MiB>  cuMemAllocFromPoolAsync, then a sync -> rc= ptr=
 *   freeasync <ptr>      cuMemFreeAsync, then a sync -> rc=
 *   pexport <pool>       cuMemPoolExportToShareableHandle -> rc= pid= fd=
 *   pimport <pid> <fd>   /proc/<pid>/fd/<fd> opened, cuMemPoolImportFromShareableHandle -> rc= pool=
 *   pptr <ptr>           cuMemPoolExportPointer  -> rc= data=<128 hex digits>
 *   pget <pool> <hex>    cuMemPoolImportPointer  -> rc= ptr=
 *   quit
 * Pointers, pools, pids and descriptors are hexadecimal.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sharegpu/cuda_api.h"

#define MIB (1024ull * 1024ull)

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);

static int parse_hex(const char *hex, void *out, size_t n)
{
    if (strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        ((unsigned char *)out)[i] = (unsigned char)v;
    }
    return 0;
}

static void print_hex(const void *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", ((const unsigned char *)in)[i]);
    printf("\n");
}

static open_fn legacy_open(void)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult found;
    if (cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 4010, 0, &found) != CUDA_SUCCESS)
        return NULL;
    return (open_fn)fn;
}

int main(void)
{
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        printf("error=init\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready=1\n");
    char line[512], cmd[16], arg[160], arg2[160];
    while (fgets(line, sizeof(line), stdin)) {
        unsigned long long a = 0, b = 0;
        int n = sscanf(line, "%15s %159s %159s", cmd, arg, arg2);
        if (n < 1)
            continue;
        if (n >= 2)
            a = strtoull(arg, NULL, 16);
        if (n >= 3)
            b = strtoull(arg2, NULL, 16);
        if (strcmp(cmd, "alloc") == 0) {
            CUdeviceptr p = 0;
            CUresult rc = cuMemAlloc_v2(&p, (size_t)(strtoull(arg, NULL, 10) * MIB));
            printf("rc=%d ptr=%llx\n", (int)rc, (unsigned long long)p);
        } else if (strcmp(cmd, "free") == 0) {
            printf("rc=%d\n", (int)cuMemFree_v2((CUdeviceptr)a));
        } else if (strcmp(cmd, "handle") == 0) {
            CUipcMemHandle h;
            memset(&h, 0, sizeof(h));
            CUresult rc = cuIpcGetMemHandle(&h, (CUdeviceptr)a);
            printf("rc=%d handle=", (int)rc);
            print_hex(&h, sizeof(h));
        } else if (strcmp(cmd, "open") == 0 || strcmp(cmd, "open1") == 0) {
            CUipcMemHandle h;
            CUdeviceptr p = 0;
            open_fn fn = strcmp(cmd, "open1") == 0 ? legacy_open() : cuIpcOpenMemHandle_v2;
            unsigned flags = n >= 3 ? (unsigned)b : CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
            CUresult rc = parse_hex(arg, &h, sizeof(h)) ? CUDA_ERROR_INVALID_VALUE
                          : fn                  ? fn(&p, h, flags)
                                                : CUDA_ERROR_NOT_FOUND;
            printf("rc=%d ptr=%llx\n", (int)rc, (unsigned long long)p);
        } else if (strcmp(cmd, "close") == 0) {
            printf("rc=%d\n", (int)cuIpcCloseMemHandle((CUdeviceptr)a));
        } else if (strcmp(cmd, "write") == 0) {
            unsigned long long v = b;
            printf("rc=%d\n", (int)cuMemcpyHtoD_v2((CUdeviceptr)a, &v, sizeof(v)));
        } else if (strcmp(cmd, "read") == 0) {
            unsigned long long v = 0;
            CUresult rc = cuMemcpyDtoH_v2(&v, (CUdeviceptr)a, sizeof(v));
            printf("rc=%d value=%llx\n", (int)rc, v);
        } else if (strcmp(cmd, "info") == 0) {
            size_t free_b = 0, total = 0;
            CUresult rc = cuMemGetInfo_v2(&free_b, &total);
            printf("rc=%d used=%zu total=%zu\n", (int)rc, total - free_b, total);
        } else if (strcmp(cmd, "pool") == 0) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof(props));
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = 0;
            CUmemoryPool pool = NULL;
            CUresult rc = cuMemPoolCreate(&pool, &props);
            printf("rc=%d pool=%llx\n", (int)rc, (unsigned long long)(uintptr_t)pool);
        } else if (strcmp(cmd, "palloc") == 0) {
            CUdeviceptr p = 0;
            CUresult rc = cuMemAllocFromPoolAsync(&p, (size_t)(strtoull(arg2, NULL, 10) * MIB),
                                                  (CUmemoryPool)(uintptr_t)a, NULL);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamSynchronize(NULL);
            printf("rc=%d ptr=%llx\n", (int)rc, (unsigned long long)p);
        } else if (strcmp(cmd, "freeasync") == 0) {
            CUresult rc = cuMemFreeAsync((CUdeviceptr)a, NULL);
            if (rc == CUDA_SUCCESS)
                rc = cuStreamSynchronize(NULL);
            printf("rc=%d\n", (int)rc);
        } else if (strcmp(cmd, "pexport") == 0) {
            int fd = -1;
            CUresult rc = cuMemPoolExportToShareableHandle(&fd, (CUmemoryPool)(uintptr_t)a,
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            printf("rc=%d pid=%x fd=%x\n", (int)rc, (unsigned)getpid(), (unsigned)fd);
        } else if (strcmp(cmd, "pimport") == 0) {
            char path[64];
            snprintf(path, sizeof(path), "/proc/%llu/fd/%llu", a, b);
            int fd = open(path, O_RDWR | O_CLOEXEC);
            CUmemoryPool pool = NULL;
            CUresult rc = fd < 0 ? CUDA_ERROR_INVALID_VALUE
                                 : cuMemPoolImportFromShareableHandle(
                                       &pool, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (fd >= 0)
                close(fd);
            printf("rc=%d pool=%llx\n", (int)rc, (unsigned long long)(uintptr_t)pool);
        } else if (strcmp(cmd, "pptr") == 0) {
            CUmemPoolPtrExportData data;
            memset(&data, 0, sizeof(data));
            CUresult rc = cuMemPoolExportPointer(&data, (CUdeviceptr)a);
            printf("rc=%d data=", (int)rc);
            print_hex(&data, sizeof(data));
        } else if (strcmp(cmd, "pget") == 0) {
            CUmemPoolPtrExportData data;
            CUdeviceptr p = 0;
            CUresult rc = parse_hex(arg2, &data, sizeof(data))
                              ? CUDA_ERROR_INVALID_VALUE
                              : cuMemPoolImportPointer(&p, (CUmemoryPool)(uintptr_t)a, &data);
            printf("rc=%d ptr=%llx\n", (int)rc, (unsigned long long)p);
        } else if (strcmp(cmd, "quit") == 0) {
            return 0;
        } else {
            printf("rc=-1 error=unknown\n");
        }
    }
    return 0;
}
