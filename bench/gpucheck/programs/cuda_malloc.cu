// Allocate device memory with cudaMalloc until refused, as an unmodified nvcc-built program.
//
//     nvcc -O2 -o cuda_malloc cuda_malloc.cu && ./cuda_malloc [CHUNK_MIB] [hold]
//
// Prints one JSON line: cudaMemGetInfo's free and total, cudaGetDeviceProperties' totalGlobalMem,
// the bytes allocated before the refusal and the refusal's error name, whether one more chunk
// fits after freeing one, and whether a kernel still runs. With `hold` it then keeps the memory
// until its standard input closes (NVML outside is read meanwhile).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__global__ void twice(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = 2.0f * x[i] + 1.0f;
}

int main(int argc, char **argv)
{
    size_t chunk = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
    int hold = argc > 2 && strcmp(argv[2], "hold") == 0;
    size_t free_b = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total);
    if (e != cudaSuccess) {
        printf("{\"init_error\": \"%s\"}\n", cudaGetErrorName(e));
        return 1;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    enum { MAX = 1 << 16 };
    static void *held[MAX];
    int n = 0;
    while (n < MAX && (e = cudaMalloc(&held[n], chunk)) == cudaSuccess)
        n++;
    const char *err = e == cudaSuccess ? "none" : cudaGetErrorName(e);
    cudaGetLastError(); /* clear the error the refusal left, so later calls report their own */
    int refill = 0, kernel_ok = 0;
    if (n > 0) {
        cudaFree(held[--n]);
        refill = cudaMalloc(&held[n], chunk) == cudaSuccess;
        if (refill)
            n++;
        float *x = (float *)held[0];
        cudaMemset(x, 0, 1024 * sizeof(float));
        twice<<<4, 256>>>(x, 1024);
        float host[4] = {0};
        kernel_ok = cudaMemcpy(host, x, sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess && host[3] == 1.0f;
    }
    printf("{\"lib\": \"cudart %d\", \"free\": %zu, \"total\": %zu, \"device_total_memory\": %zu, "
           "\"allocated\": %zu, \"chunk\": %zu, \"error_type\": \"%s\", \"refill\": %s, \"works_after\": %s, "
           "\"pid\": %d}\n",
           CUDART_VERSION, free_b, total, (size_t)prop.totalGlobalMem, (size_t)n * chunk, chunk, err,
           refill ? "true" : "false", kernel_ok ? "true" : "false", (int)getpid());
    fflush(stdout);
    if (hold)
        while (getchar() != EOF)
            ;
    while (n > 0)
        cudaFree(held[--n]);
    return 0;
}
