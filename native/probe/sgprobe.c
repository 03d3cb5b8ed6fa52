/*
 * sgprobe: one small CUDA driver-API client, many commands, `key=value` output (one fact per
 * line, flushed).  Used by the tests, the benchmarks and the demo, against the simulated GPU or a
 * real one.  `sgprobe help` lists the commands.
 *
 * Built twice from this file: `sgprobe` links against libcuda.so.1; `sgprobe-dl`
 * (-DSG_PROBE_DLOPEN) loads it with dlopen + dlsym.  Both take their functions from PROBE_API
 * below, typed from sharegpu/cuda_api.h.
 *
 * Exit status: 0 the command ran (a refused allocation is a result), 2 usage error, 1 the driver
 * failed where the command did not expect it (a `fail=` line says where).
 */
#include "sharegpu/cuda_api.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_API(X)                                                                               \
    X(cuInit)                                                                                      \
    X(cuDriverGetVersion)                                                                          \
    X(cuGetErrorName)                                                                              \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDeviceTotalMem_v2)                                                                         \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxSetFlags_v2)                                                               \
    X(cuDevicePrimaryCtxRelease_v2)                                                                \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxSynchronize)                                                                            \
    X(cuMemAlloc_v2)                                                                               \
    X(cuMemAllocPitch_v2)                                                                          \
    X(cuMemAllocManaged)                                                                           \
    X(cuMemFree_v2)                                                                                \
    X(cuMemGetInfo_v2)                                                                             \
    X(cuMemAllocAsync)                                                                             \
    X(cuMemAllocFromPoolAsync)                                                                     \
    X(cuMemFreeAsync)                                                                              \
    X(cuDeviceGetDefaultMemPool)                                                                   \
    X(cuMemCreate)                                                                                 \
    X(cuMemRelease)                                                                                \
    X(cuMemAddressReserve)                                                                         \
    X(cuMemAddressFree)                                                                            \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemSetAccess)                                                                              \
    X(cuMemGetAllocationGranularity)                                                               \
    X(cuArrayCreate_v2)                                                                            \
    X(cuArrayDestroy)                                                                              \
    X(cuMemcpyHtoD_v2)                                                                             \
    X(cuMemcpyDtoH_v2)                                                                             \
    X(cuMemcpyDtoD_v2)                                                                             \
    X(cuMemsetD8_v2)                                                                               \
    X(cuMemsetD32_v2)                                                                              \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleGetFunction)                                                                         \
    X(cuModuleUnload)                                                                              \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernelEx)                                                                            \
    X(cuLaunchCooperativeKernel)                                                                   \
    X(cuGraphCreate)                                                                               \
    X(cuGraphAddKernelNode_v2)                                                                     \
    X(cuGraphInstantiateWithFlags)                                                                 \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphExecDestroy)                                                                          \
    X(cuGraphDestroy)                                                                              \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy_v2)                                                                          \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamBeginCapture_v2)                                                                     \
    X(cuStreamEndCapture)                                                                          \
    X(cuEventCreate)                                                                               \
    X(cuEventRecord)                                                                               \
    X(cuEventSynchronize)                                                                          \
    X(cuEventElapsedTime)                                                                          \
    X(cuEventDestroy_v2)                                                                           \
    X(cuIpcGetEventHandle)                                                                         \
    X(cuStreamWaitEvent)                                                                           \
    X(cuStreamWaitValue32_v2)                                                                      \
    X(cuStreamWriteValue32_v2)

static struct {
#define X(name) __typeof__(&name) name;
    PROBE_API(X)
#undef X
} api;

/* `spin` runs for its parameter in µs on a real GPU too: one thread reads the GPU's global
 * nanosecond timer until that much wall time has passed since the kernel started (a preempted
 * kernel counts the time it was switched out, so a share is measured by completed kernels only
 * where no other context runs in between: under the arbiter's token).  The simulated GPU runs no
 * code and takes the same parameter as the kernel's time (its kernel time contract). */
static const char ptx[] = ".version 8.0\n"
                          ".target sm_90\n"
                          ".address_size 64\n"
                          "\n"
                          ".visible .entry spin(.param .u64 us)\n"
                          "{\n"
                          "    .reg .pred %p;\n"
                          "    .reg .u64 %rd<5>;\n"
                          "    ld.param.u64 %rd1, [us];\n"
                          "    mul.lo.u64 %rd1, %rd1, 1000;\n"
                          "    mov.u64 %rd2, %globaltimer;\n"
                          "SPIN:\n"
                          "    mov.u64 %rd3, %globaltimer;\n"
                          "    sub.u64 %rd4, %rd3, %rd2;\n"
                          "    setp.lt.u64 %p, %rd4, %rd1;\n"
                          "    @%p bra SPIN;\n"
                          "    ret;\n"
                          "}\n"
                          "\n"
                          ".visible .entry other()\n"
                          "{\n"
                          "    ret;\n"
                          "}\n";

static int ordinal;
static CUdevice dev;
static CUcontext ctx;
static CUstream stream;

/* ---- output ------------------------------------------------------------------------------- */

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static const char *errname(CUresult r)
{
    const char *s = NULL;
    if (api.cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "CUDA_ERROR_UNRECOGNIZED";
    return s;
}

/* An unexpected driver failure: report and exit 1. */
static int fail(const char *what, CUresult r)
{
    out("fail=%s", what);
    out("error=%s", errname(r));
    return 1;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult ck_r = (call);                                                                    \
        if (ck_r != CUDA_SUCCESS)                                                                  \
            return fail(#call, ck_r);                                                              \
    } while (0)

static int usage(const char *msg)
{
    fprintf(stderr, "sgprobe: %s (run `sgprobe help`)\n", msg);
    return 2;
}

/* This thread's time runnable but not running (waiting for a CPU), ns: the second field of
 * /proc/thread-self/schedstat; 0 where the kernel does not keep it.  A request's share of it is
 * the host's delay, not the GPU's or the arbiter's: on a loaded machine the service waits for a
 * CPU to wake from the token's futex, or between its launches. */
static uint64_t runq_ns(void)
{
    char buf[96];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long on_cpu = 0, waited = 0;
    return sscanf(buf, "%llu %llu", &on_cpu, &waited) == 2 ? (uint64_t)waited : 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* "123", "4k", "256M", "2G" (binary units). */
static int parse_size(const char *s, size_t *v)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || end == s || !isdigit((unsigned char)*s))
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: return -1;
    }
    if (*end || (shift && n > (~0ull >> shift)))
        return -1;
    *v = (size_t)(n << shift);
    return 0;
}

static int parse_count(const char *s, long *v)
{
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || end == s || *end || n < 0)
        return -1;
    *v = n;
    return 0;
}

/* ---- loading the driver ------------------------------------------------------------------- */

static int load_api(void)
{
#ifdef SG_PROBE_DLOPEN
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        out("fail=dlopen");
        out("error=%s", dlerror());
        return 1;
    }
#define X(name)                                                                                    \
    api.name = (__typeof__(api.name))dlsym(h, #name);                                              \
    if (!api.name) {                                                                               \
        out("fail=dlsym:%s", #name);                                                               \
        return 1;                                                                                  \
    }
    PROBE_API(X)
#undef X
#else
#define X(name) api.name = name;
    PROBE_API(X)
#undef X
#endif
    return 0;
}

static int setup(int with_ctx)
{
    CK(api.cuInit(0));
    CK(api.cuDeviceGet(&dev, ordinal));
    if (!with_ctx)
        return 0;
    /* SGPROBE_SYNC: how this probe's syncs wait, its context's CU_CTX_SCHED_* flag (a service
     * on a node with more CPUs than it has contexts spins under the driver's default). */
    const char *sync = getenv("SGPROBE_SYNC");
    if (sync && *sync) {
        static const char *const names[] = {"auto", "spin", "yield", "", "blocking"};
        unsigned flag = 0;
        while (flag < 5 && (!*names[flag] || strcmp(sync, names[flag]) != 0))
            flag++;
        if (flag == 5)
            return usage("SGPROBE_SYNC: auto, spin, yield or blocking");
        CK(api.cuDevicePrimaryCtxSetFlags_v2(dev, flag));
    }
    CK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(api.cuCtxSetCurrent(ctx));
    CK(api.cuStreamCreate(&stream, 0));
    return 0;
}

/* ---- allocation kinds ------------------------------------------------------------------------ */

enum kind { K_PLAIN, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_COUNT };
static const char *const kind_names[K_COUNT] = {"plain", "pitch", "managed", "async",
                                                "pool",  "vmm",   "array"};

static int parse_kind(const char *s)
{
    for (int k = 0; k < K_COUNT; k++)
        if (strcmp(s, kind_names[k]) == 0)
            return k;
    return -1;
}

struct held {
    int kind;
    CUdeviceptr p;
    size_t size;
    CUarray arr;
    CUmemGenericAllocationHandle h;
};

static CUresult vmm_alloc(size_t bytes, struct held *o)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CUresult r = api.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r)
        return r;
    size_t size = (bytes + gran - 1) / gran * gran;
    r = api.cuMemCreate(&o->h, size, &prop, 0);
    if (r)
        return r;
    r = api.cuMemAddressReserve(&o->p, size, 0, 0, 0);
    if (r)
        goto release;
    r = api.cuMemMap(o->p, size, 0, o->h, 0);
    if (r)
        goto unreserve;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = api.cuMemSetAccess(o->p, size, &acc, 1);
    if (r)
        goto unmap;
    o->size = size;
    return CUDA_SUCCESS;
unmap:
    api.cuMemUnmap(o->p, size);
unreserve:
    api.cuMemAddressFree(o->p, size);
release:
    api.cuMemRelease(o->h);
    return r;
}

static CUresult do_alloc(int kind, size_t bytes, struct held *o)
{
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->size = bytes;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    switch (kind) {
    case K_PLAIN: return api.cuMemAlloc_v2(&o->p, bytes);
    case K_PITCH: {
        size_t pitch, width = bytes / 16 ? bytes / 16 : 1;
        return api.cuMemAllocPitch_v2(&o->p, &pitch, width, 16, 4);
    }
    case K_MANAGED: return api.cuMemAllocManaged(&o->p, bytes, CU_MEM_ATTACH_GLOBAL);
    case K_ASYNC:
        r = api.cuMemAllocAsync(&o->p, bytes, stream);
        return r ? r : api.cuStreamSynchronize(stream);
    case K_POOL: {
        CUmemoryPool pool;
        r = api.cuDeviceGetDefaultMemPool(&pool, dev);
        if (!r)
            r = api.cuMemAllocFromPoolAsync(&o->p, bytes, pool, stream);
        return r ? r : api.cuStreamSynchronize(stream);
    }
    case K_VMM: return vmm_alloc(bytes, o);
    case K_ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d;
        memset(&d, 0, sizeof(d));
        d.Width = bytes;
        d.Height = 0;
        d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
        d.NumChannels = 1;
        return api.cuArrayCreate_v2(&o->arr, &d);
    }
    }
    return r;
}

static CUresult do_free(struct held *o)
{
    CUresult r;
    switch (o->kind) {
    case K_ASYNC:
    case K_POOL:
        r = api.cuMemFreeAsync(o->p, stream);
        return r ? r : api.cuStreamSynchronize(stream);
    case K_VMM:
        r = api.cuMemUnmap(o->p, o->size);
        if (!r)
            r = api.cuMemAddressFree(o->p, o->size);
        if (!r)
            r = api.cuMemRelease(o->h);
        return r;
    case K_ARRAY: return api.cuArrayDestroy(o->arr);
    default: return api.cuMemFree_v2(o->p);
    }
}

static int print_meminfo(void)
{
    size_t free_b, total, devtotal;
    CK(api.cuMemGetInfo_v2(&free_b, &total));
    CK(api.cuDeviceTotalMem_v2(&devtotal, dev));
    out("free=%zu", free_b);
    out("total=%zu", total);
    out("devtotal=%zu", devtotal);
    return 0;
}

/* ---- commands -------------------------------------------------------------------------------- */

static int cmd_info(int argc, char **argv)
{
    if (setup(0))
        return 1;
    int n, ver;
    CK(api.cuDeviceGetCount(&n));
    CK(api.cuDriverGetVersion(&ver));
    out("count=%d", n);
    out("driver_version=%d", ver);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        char name[256];
        CUuuid u;
        size_t total;
        CK(api.cuDeviceGet(&d, i));
        CK(api.cuDeviceGetName(name, sizeof(name), d));
        CK(api.cuDeviceGetUuid(&u, d));
        CK(api.cuDeviceTotalMem_v2(&total, d));
        const unsigned char *b = (const unsigned char *)u.bytes;
        out("dev%d.name=%s", i, name);
        out("dev%d.uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", i,
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
            b[14], b[15]);
        out("dev%d.total=%zu", i, total);
    }
    return 0;
}

static int cmd_meminfo(int argc, char **argv)
{
    return setup(1) ? 1 : print_meminfo();
}

static int cmd_alloc(int argc, char **argv)
{
    if (argc < 2)
        return usage("alloc KIND BYTES...");
    int kind = parse_kind(argv[0]);
    if (kind < 0)
        return usage("unknown allocation kind");
    for (int i = 1; i < argc; i++) {
        size_t b;
        if (parse_size(argv[i], &b) < 0)
            return usage("bad size");
    }
    if (setup(1))
        return 1;
    for (int i = 1; i < argc; i++) {
        size_t b;
        parse_size(argv[i], &b);
        struct held h;
        CUresult r = do_alloc(kind, b, &h);
        out("alloc=%s", r ? errname(r) : "OK"); /* what succeeded is kept until exit */
    }
    return print_meminfo();
}

#define FILL_MAX 1000000

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* A non-negative number of seconds, fractions allowed. */
static int parse_seconds(const char *text, double *secs)
{
    char *end;
    *secs = strtod(text, &end);
    return (end == text || *end || *secs < 0) ? -1 : 0;
}

static int cmd_fill(int argc, char **argv)
{
    size_t chunk;
    double hold = 0;
    if ((argc != 2 && argc != 3) || parse_size(argv[1], &chunk) < 0 || chunk == 0)
        return usage("fill KIND CHUNK [HOLD_SECONDS]");
    if (argc == 3 && parse_seconds(argv[2], &hold) < 0)
        return usage("bad HOLD_SECONDS");
    int kind = parse_kind(argv[0]);
    if (kind < 0)
        return usage("unknown allocation kind");
    if (setup(1))
        return 1;
    struct held *held = calloc(FILL_MAX, sizeof(*held));
    if (!held)
        return usage("out of host memory");
    long n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < FILL_MAX && (r = do_alloc(kind, chunk, &held[n])) == CUDA_SUCCESS)
        n++;
    out("count=%ld", n);
    out("bytes=%zu", (size_t)n * chunk);
    out("error=%s", r ? errname(r) : "NONE");
    if (n > 0) {
        CK(do_free(&held[--n]));
        r = do_alloc(kind, chunk, &held[n]);
        out("refill=%s", r ? errname(r) : "OK");
        if (!r)
            n++;
    }
    if (hold > 0) {
        /* Keep the memory while someone looks from outside; say what this process sees. */
        if (print_meminfo())
            return 1;
        out("held=1");
        sleep_s(hold);
    }
    while (n > 0)
        CK(do_free(&held[--n]));
    free(held);
    return 0;
}

static int cmd_hold(int argc, char **argv)
{
    size_t b;
    double secs;
    if (argc != 3 || parse_size(argv[1], &b) < 0)
        return usage("hold KIND BYTES SECONDS");
    if (parse_seconds(argv[2], &secs) < 0)
        return usage("bad SECONDS");
    int kind = parse_kind(argv[0]);
    if (kind < 0)
        return usage("unknown allocation kind");
    if (setup(1))
        return 1;
    struct held h;
    CUresult r = do_alloc(kind, b, &h);
    if (r) {
        out("alloc=%s", errname(r));
        return 0;
    }
    out("ready=1");
    sleep_s(secs);
    CK(do_free(&h));
    out("done=1");
    return 0;
}

static int cmd_killself(int argc, char **argv)
{
    size_t b;
    if (argc != 2 || parse_size(argv[1], &b) < 0)
        return usage("killself KIND BYTES");
    int kind = parse_kind(argv[0]);
    if (kind < 0)
        return usage("unknown allocation kind");
    if (setup(1))
        return 1;
    struct held h;
    CK(do_alloc(kind, b, &h));
    out("ready=1");
    raise(SIGKILL);
    return 1;
}

static int cmd_forkfree(int argc, char **argv)
{
    size_t b;
    if (argc != 2 || parse_size(argv[1], &b) < 0 || parse_kind(argv[0]) < 0)
        return usage("forkfree KIND BYTES");
    if (setup(1))
        return 1;
    size_t free0, free1, total;
    CK(api.cuMemGetInfo_v2(&free0, &total));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return usage("fork failed");
    if (pid == 0) {
        char d[16];
        snprintf(d, sizeof(d), "%d", ordinal);
        char *args[] = {"sgprobe", "-d", d, "killself", argv[0], argv[1], NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFSIGNALED(status))
        out("child=signal:%d", WTERMSIG(status));
    else
        out("child=exit:%d", WEXITSTATUS(status));
    /* Reclaiming is lazy but every query triggers it: allow a little time anyway. */
    uint64_t deadline = now_ns() + 2000000000ull;
    do {
        CK(api.cuMemGetInfo_v2(&free1, &total));
        if (free1 == free0)
            break;
        sleep_s(0.01);
    } while (now_ns() < deadline);
    out("free_before=%zu", free0);
    out("free_after=%zu", free1);
    out("freed=%d", free1 == free0);
    return 0;
}

static int cmd_cycle(int argc, char **argv)
{
    size_t b;
    long n;
    double hold = 0;
    if ((argc != 3 && argc != 4) || parse_size(argv[1], &b) < 0 || parse_count(argv[2], &n) < 0 ||
        n == 0 || (argc == 4 && parse_seconds(argv[3], &hold) < 0))
        return usage("cycle KIND BYTES N [HOLD_SECONDS]");
    int kind = parse_kind(argv[0]);
    if (kind < 0)
        return usage("unknown allocation kind");
    if (setup(1))
        return 1;
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        struct held h;
        CK(do_alloc(kind, b, &h));
        CK(do_free(&h));
    }
    uint64_t t1 = now_ns();
    out("pairs=%ld", n);
    out("ns_per_pair=%" PRIu64, (t1 - t0) / (uint64_t)n);
    if (hold > 0) {
        out("ready=1"); /* still alive, holding nothing (what the ledger kept spare is its) */
        sleep_s(hold);
    }
    return 0;
}

struct thread_arg {
    int kind;
    size_t chunk;
    long count;
    CUresult err;
};

static void *thread_fill(void *p)
{
    struct thread_arg *a = p;
    a->err = api.cuCtxSetCurrent(ctx);
    if (a->err)
        return NULL;
    for (;;) {
        struct held h;
        CUresult r = do_alloc(a->kind, a->chunk, &h);
        if (r) {
            a->err = r;
            return NULL;
        }
        a->count++; /* kept until exit */
        if (a->count >= FILL_MAX)
            return NULL;
    }
}

static int cmd_threads(int argc, char **argv)
{
    long t;
    size_t chunk;
    if (argc != 3 || parse_count(argv[0], &t) < 0 || t < 1 || t > 256 ||
        parse_size(argv[2], &chunk) < 0 || chunk == 0)
        return usage("threads T KIND CHUNK");
    int kind = parse_kind(argv[1]);
    if (kind < 0)
        return usage("unknown allocation kind");
    if (setup(1))
        return 1;
    pthread_t th[256];
    struct thread_arg args[256];
    for (long i = 0; i < t; i++) {
        args[i] = (struct thread_arg){.kind = kind, .chunk = chunk};
        if (pthread_create(&th[i], NULL, thread_fill, &args[i]) != 0)
            return usage("pthread_create failed");
    }
    long count = 0;
    const char *err = "NONE";
    for (long i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        count += args[i].count;
        if (args[i].err && args[i].err != CUDA_ERROR_OUT_OF_MEMORY)
            err = errname(args[i].err);
        else if (args[i].err && strcmp(err, "NONE") == 0)
            err = errname(args[i].err);
    }
    out("count=%ld", count);
    out("bytes=%zu", (size_t)count * chunk);
    out("error=%s", err);
    return print_meminfo();
}

static int load_spin(CUmodule *mod, CUfunction *f)
{
    CK(api.cuModuleLoadData(mod, ptx));
    CK(api.cuModuleGetFunction(f, *mod, "spin"));
    return 0;
}

/* A context, the spin kernel and its one parameter (µs), for the compute commands. */
struct spin {
    CUmodule mod;
    CUfunction f;
    uint64_t arg;
    void *params[1];
};

static int spin_setup(struct spin *sp, uint64_t us)
{
    if (setup(1) || load_spin(&sp->mod, &sp->f))
        return 1;
    sp->arg = us;
    sp->params[0] = &sp->arg;
    return 0;
}

static int cmd_launch(int argc, char **argv)
{
    long n;
    size_t us;
    unsigned long long start_at = 0;
    char *end = NULL;
    if (argc == 4) {
        errno = 0;
        start_at = strtoull(argv[3], &end, 10);
    }
    if (argc < 2 || argc > 4 || parse_count(argv[0], &n) < 0 || parse_size(argv[1], &us) < 0 ||
        (argc == 4 && (errno || !end || *end || !isdigit((unsigned char)argv[3][0]))))
        return usage("launch N US [kernel|ex|coop|graph|capture [START_NS]]");
    const char *mode = argc >= 3 ? argv[2] : "kernel";
    if (strcmp(mode, "kernel") && strcmp(mode, "ex") && strcmp(mode, "coop") &&
        strcmp(mode, "graph") && strcmp(mode, "capture"))
        return usage("unknown launch mode");
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    CUevent e0, e1;
    CK(api.cuEventCreate(&e0, 0));
    CK(api.cuEventCreate(&e1, 0));
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (!strcmp(mode, "graph")) {
        CK(api.cuGraphCreate(&graph, 0));
        CUgraphNode prev = NULL;
        for (long i = 0; i < n; i++) {
            CUDA_KERNEL_NODE_PARAMS_v2 p;
            memset(&p, 0, sizeof(p));
            p.func = sp.f;
            p.gridDimX = p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = p.blockDimY = p.blockDimZ = 1;
            p.kernelParams = sp.params;
            CUgraphNode node;
            CK(api.cuGraphAddKernelNode_v2(&node, graph, prev ? &prev : NULL, prev ? 1 : 0, &p));
            prev = node;
        }
        CK(api.cuGraphInstantiateWithFlags(&exec, graph, 0));
    } else if (!strcmp(mode, "capture")) {
        CK(api.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (long i = 0; i < n; i++)
            CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
        CK(api.cuStreamEndCapture(stream, &graph));
        CK(api.cuGraphInstantiateWithFlags(&exec, graph, 0));
    }
    if (start_at) { /* a common start for several processes: CLOCK_MONOTONIC, absolute */
        struct timespec ts = {.tv_sec = (time_t)(start_at / 1000000000ull),
                              .tv_nsec = (long)(start_at % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    uint64_t t0 = now_ns();
    uint64_t t_launched = 0; /* the first launch returned: the engine has work from here on */
    CK(api.cuEventRecord(e0, stream));
    if (exec) {
        CK(api.cuGraphLaunch(exec, stream));
        t_launched = now_ns();
    } else {
        for (long i = 0; i < n; i++) {
            if (!strcmp(mode, "kernel")) {
                CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
            } else if (!strcmp(mode, "ex")) {
                CUlaunchConfig cfg;
                memset(&cfg, 0, sizeof(cfg));
                cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
                cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
                cfg.hStream = stream;
                CK(api.cuLaunchKernelEx(&cfg, sp.f, sp.params, NULL));
            } else {
                CK(api.cuLaunchCooperativeKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params));
            }
            if (!t_launched)
                t_launched = now_ns();
        }
    }
    CK(api.cuEventRecord(e1, stream));
    out("launched=1"); /* submitted, not yet complete: a test may act on the backlog now */
    CK(api.cuStreamSynchronize(stream));
    uint64_t t1 = now_ns();
    float ms = 0;
    CK(api.cuEventElapsedTime(&ms, e0, e1));
    out("kernels=%ld", n);
    out("mode=%s", mode);
    out("wall_us=%" PRIu64, (t1 - t0) / 1000u);
    out("start_ns=%" PRIu64, t0); /* CLOCK_MONOTONIC: comparable across processes */
    out("end_ns=%" PRIu64, t1);
    out("gpu_us=%.0f", (double)ms * 1000.0);
    /* At most this much of gpu_us is the host's gap between recording the start event and the
     * first launch (an idle engine completes the start event when it is recorded). */
    out("launch_gap_us=%" PRIu64, t_launched ? (t_launched - t0) / 1000u : 0); /* 0: N was 0 */
    if (exec)
        CK(api.cuGraphExecDestroy(exec));
    if (graph)
        CK(api.cuGraphDestroy(graph));
    CK(api.cuEventDestroy_v2(e0));
    CK(api.cuEventDestroy_v2(e1));
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

static int cmd_launchbench(int argc, char **argv)
{
    long n;
    if (argc != 1 || parse_count(argv[0], &n) < 0 || n == 0)
        return usage("launchbench N");
    struct spin sp;
    if (spin_setup(&sp, 0))
        return 1;
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    uint64_t t1 = now_ns();
    CK(api.cuStreamSynchronize(stream));
    out("launches=%ld", n);
    out("ns_per_launch=%" PRIu64, (t1 - t0) / (uint64_t)n);
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

static int cmd_copy(int argc, char **argv)
{
    size_t b;
    if (argc != 1 || parse_size(argv[0], &b) < 0 || b == 0 || b % 4)
        return usage("copy BYTES (a positive multiple of 4)");
    if (setup(1))
        return 1;
    unsigned char *src = malloc(b), *dst = malloc(b);
    if (!src || !dst)
        return usage("out of host memory");
    for (size_t i = 0; i < b; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    CUdeviceptr a, c;
    CK(api.cuMemAlloc_v2(&a, b));
    CK(api.cuMemAlloc_v2(&c, b));
    CK(api.cuMemcpyHtoD_v2(a, src, b));
    CK(api.cuMemcpyDtoD_v2(c, a, b));
    CK(api.cuMemcpyDtoH_v2(dst, c, b));
    out("copy=%s", memcmp(src, dst, b) ? "MISMATCH" : "OK");
    int ok = 1;
    CK(api.cuMemsetD8_v2(a, 0xab, b));
    CK(api.cuMemcpyDtoH_v2(dst, a, b));
    for (size_t i = 0; i < b; i++)
        ok &= dst[i] == 0xab;
    CK(api.cuMemsetD32_v2(a, 0x01020304u, b / 4));
    CK(api.cuMemcpyDtoH_v2(dst, a, b));
    for (size_t i = 0; i < b / 4; i++) {
        uint32_t v;
        memcpy(&v, dst + 4 * i, 4);
        ok &= v == 0x01020304u;
    }
    out("memset=%s", ok ? "OK" : "MISMATCH");
    CK(api.cuMemFree_v2(a));
    CK(api.cuMemFree_v2(c));
    free(src);
    free(dst);
    return 0;
}

/* A thread that opens a word gate of the main thread's stream: it writes the word from an idle
 * stream of its own 10 ms later. */
static void *thread_open_word(void *p)
{
    CUdeviceptr *word = p;
    CUstream idle;
    CUresult r = api.cuCtxSetCurrent(ctx);
    if (!r)
        r = api.cuStreamCreate(&idle, 0);
    struct timespec ten_ms = {.tv_nsec = 10000000};
    nanosleep(&ten_ms, NULL);
    if (!r)
        r = api.cuStreamWriteValue32_v2(idle, *word, 5, 0);
    if (!r)
        r = api.cuStreamDestroy_v2(idle);
    return (void *)(uintptr_t)r;
}

static int cmd_memops(int argc, char **argv)
{
    (void)argv;
    struct spin sp;
    if (argc != 0)
        return usage("memops");
    if (spin_setup(&sp, 20000))
        return 1;
    CUdeviceptr w;
    CUstream a, b, relay;
    CK(api.cuMemAlloc_v2(&w, 4096));
    CK(api.cuMemsetD32_v2(w, 0, 1024));
    CK(api.cuStreamCreate(&a, 0));
    CK(api.cuStreamCreate(&b, 0));
    CK(api.cuStreamCreate(&relay, 0));
    /* A write queued behind a kernel, and a wait for it on another stream. */
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, a, sp.params, NULL));
    CK(api.cuStreamWriteValue32_v2(a, w, 7, 0));
    CK(api.cuStreamWaitValue32_v2(b, w, 7, 0));
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, b, sp.params, NULL));
    /* A relay: a stream waits for an interprocess event recorded behind a kernel and then
     * writes a word, which another stream waits for. */
    CUevent shared;
    CUipcEventHandle handle;
    CK(api.cuEventCreate(&shared, 0x4 | 0x2)); /* CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING */
    CK(api.cuIpcGetEventHandle(&handle, shared));
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, a, sp.params, NULL));
    CK(api.cuEventRecord(shared, a));
    CK(api.cuStreamWaitEvent(relay, shared, 0));
    CK(api.cuStreamWriteValue32_v2(relay, w + 8, 9, 0));
    CK(api.cuStreamWaitValue32_v2(b, w + 8, 9, 0));
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, b, sp.params, NULL));
    /* A wait nobody has met yet, opened by another thread's write. */
    CUdeviceptr second = w + 4;
    CK(api.cuStreamWaitValue32_v2(stream, second, 5, 1 /* CU_STREAM_WAIT_VALUE_EQ */));
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    pthread_t th;
    if (pthread_create(&th, NULL, thread_open_word, &second) != 0)
        return usage("pthread_create failed");
    CK(api.cuStreamSynchronize(stream));
    void *rv;
    pthread_join(th, &rv);
    CK((CUresult)(uintptr_t)rv);
    CK(api.cuCtxSynchronize());
    uint32_t got[3];
    CK(api.cuMemcpyDtoH_v2(got, w, sizeof(got)));
    out("memops=%s", got[0] == 7 && got[1] == 5 && got[2] == 9 ? "OK" : "MISMATCH");
    CK(api.cuEventDestroy_v2(shared));
    CK(api.cuStreamDestroy_v2(a));
    CK(api.cuStreamDestroy_v2(b));
    CK(api.cuStreamDestroy_v2(relay));
    CK(api.cuMemFree_v2(w));
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

/* ---- compute workloads (arbitration) ------------------------------------------------------ */

/* Sleep until an absolute CLOCK_MONOTONIC instant (a common start for several processes). */
static void sleep_until(uint64_t at)
{
    if (!at)
        return;
    struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull), .tv_nsec = (long)(at % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static int parse_start(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || end == s || *end || !isdigit((unsigned char)*s))
        return -1;
    *v = n;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A graph of n spin kernels of the given parameters, built either with the graph API or by
 * capturing launches on `stream`. */
static int build_graph(const char *mode, CUfunction f, void **params, long n, CUgraph *graph,
                       CUgraphExec *exec)
{
    if (!strcmp(mode, "graph")) {
        CK(api.cuGraphCreate(graph, 0));
        CUgraphNode prev = NULL;
        for (long i = 0; i < n; i++) {
            CUDA_KERNEL_NODE_PARAMS_v2 p;
            memset(&p, 0, sizeof(p));
            p.func = f;
            p.gridDimX = p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = p.blockDimY = p.blockDimZ = 1;
            p.kernelParams = params;
            CUgraphNode node;
            CK(api.cuGraphAddKernelNode_v2(&node, *graph, prev ? &prev : NULL, prev ? 1 : 0, &p));
            prev = node;
        }
    } else {
        CK(api.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (long i = 0; i < n; i++)
            CK(api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
        CK(api.cuStreamEndCapture(stream, graph));
    }
    CK(api.cuGraphInstantiateWithFlags(exec, *graph, 0));
    return 0;
}

static int cmd_saturate(int argc, char **argv)
{
    double secs;
    size_t us;
    long batch = 0;
    uint64_t start_at = 0;
    if (argc < 2 || argc > 5 || parse_seconds(argv[0], &secs) < 0 || parse_size(argv[1], &us) < 0 ||
        us == 0 || (argc >= 4 && parse_start(argv[3], &start_at) < 0) ||
        (argc == 5 && (parse_count(argv[4], &batch) < 0 || batch == 0)))
        return usage("saturate SECONDS US [kernel|graph|capture [START_NS [BATCH]]]");
    const char *mode = argc >= 3 ? argv[2] : "kernel";
    if (strcmp(mode, "kernel") && strcmp(mode, "graph") && strcmp(mode, "capture"))
        return usage("unknown saturate mode");
    if (!batch) /* about 2 ms of work between syncs */
        batch = us >= 2000 ? 1 : (long)(2000 / us);
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (strcmp(mode, "kernel") && build_graph(mode, sp.f, sp.params, batch, &graph, &exec))
        return 1;
    /* Double-buffered, as a real training loop: after queueing batch i, wait for batch i-1, so
     * the GPU always has work queued while the host waits.  achieved= counts only the batches
     * that completed inside the SECONDS window (event times against an event at the start), so
     * the tail after the window (the last batch drains, the token comes back) does not dilute it. */
    CUevent ev[2], ev0;
    CK(api.cuEventCreate(&ev[0], 0));
    CK(api.cuEventCreate(&ev[1], 0));
    CK(api.cuEventCreate(&ev0, 0));
    sleep_until(start_at);
    uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(secs * 1e9), last = t0, max_gap = 0;
    CK(api.cuEventRecord(ev0, stream));
    long kernels = 0, syncs = 0, inside = 0;
    const float window_ms = (float)(secs * 1e3);
    out("started=1");
    long it = 0;
    for (; now_ns() < deadline; it++) {
        if (exec) {
            CK(api.cuGraphLaunch(exec, stream));
        } else {
            for (long i = 0; i < batch; i++)
                CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
        }
        CK(api.cuEventRecord(ev[it % 2], stream));
        if (it > 0) {
            CK(api.cuEventSynchronize(ev[(it + 1) % 2]));
            float ms;
            CK(api.cuEventElapsedTime(&ms, ev0, ev[(it + 1) % 2]));
            if (ms <= window_ms)
                inside += batch;
        }
        kernels += batch;
        syncs++;
        uint64_t t = now_ns();
        if (t - last > max_gap)
            max_gap = t - last;
        last = t;
    }
    CK(api.cuStreamSynchronize(stream));
    uint64_t t1 = now_ns();
    if (it > 0) {
        float ms;
        CK(api.cuEventElapsedTime(&ms, ev0, ev[(it + 1) % 2]));
        if (ms <= window_ms)
            inside += batch;
    }
    CK(api.cuEventDestroy_v2(ev[0]));
    CK(api.cuEventDestroy_v2(ev[1]));
    CK(api.cuEventDestroy_v2(ev0));
    uint64_t gpu = (uint64_t)kernels * us * 1000u;
    out("kernels=%ld", kernels);
    out("syncs=%ld", syncs);
    out("mode=%s", mode);
    out("gpu_ns=%" PRIu64, gpu);
    out("wall_ns=%" PRIu64, t1 - t0);
    out("window_kernels=%ld", inside);
    out("achieved=%.4f", (double)inside * (double)us * 1e3 / (secs * 1e9));
    out("max_gap_us=%" PRIu64, max_gap / 1000u);
    out("start_ns=%" PRIu64, t0);
    out("end_ns=%" PRIu64, t1);
    if (exec)
        CK(api.cuGraphExecDestroy(exec));
    if (graph)
        CK(api.cuGraphDestroy(graph));
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

/* Host time between bursts: spun (a process preparing its next step) up to 1 ms, slept beyond
 * (a service waiting for its next request). */
static void host_gap(uint64_t ns)
{
    if (ns > 1000000u) {
        sleep_until(now_ns() + ns);
        return;
    }
    for (uint64_t until = now_ns() + ns; now_ns() < until;)
        ;
}

#define SYNCLOOP_MAX_K 64

/* A program that waits for its own work: from START_NS for SECONDS, K kernels of US µs, then
 * cuCtxSynchronize, then GAP_US of host time, again and again (the shape of a training step or
 * an inference request).  achieved= is the kernel time this process completed inside the window
 * over the window: every kernel of a burst that synchronised inside it, and of the burst that
 * crosses its end, those whose event (recorded after each kernel) completed inside it. */
static int cmd_syncloop(int argc, char **argv)
{
    double secs;
    size_t us, gap_us;
    long k;
    uint64_t start_at = 0;
    bool log = argc == 6 && !strcmp(argv[5], "log");
    if (argc < 4 || argc > 6 || parse_seconds(argv[0], &secs) < 0 || parse_count(argv[1], &k) < 0 ||
        k < 1 || k > SYNCLOOP_MAX_K || parse_size(argv[2], &us) < 0 || us == 0 ||
        parse_size(argv[3], &gap_us) < 0 || (argc >= 5 && parse_start(argv[4], &start_at) < 0) ||
        (argc == 6 && !log))
        return usage("syncloop SECONDS K US GAP_US [START_NS [log]] (K 1..64)");
    /* log: every burst's end (its sync's return), kept here and printed after the window. */
    size_t cap = log ? (size_t)(secs * 1e6 / (double)(us * (size_t)k)) + 16 : 0;
    uint64_t *ends = log ? calloc(cap, sizeof(*ends)) : NULL;
    if (log && !ends)
        return usage("out of host memory");
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    CUevent ev0, ev[SYNCLOOP_MAX_K];
    CK(api.cuEventCreate(&ev0, 0));
    for (long j = 0; j < k; j++)
        CK(api.cuEventCreate(&ev[j], 0));
    /* One warm-up burst: the first launch pays for loading and for joining the arbiter. */
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    CK(api.cuCtxSynchronize());
    sleep_until(start_at);
    uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(secs * 1e9);
    CK(api.cuEventRecord(ev0, stream));
    const float window_ms = (float)(secs * 1e3);
    long bursts = 0, inside = 0;
    uint64_t sync_ns = 0;
    out("started=1");
    while (now_ns() < deadline) {
        for (long j = 0; j < k; j++) {
            CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
            CK(api.cuEventRecord(ev[j], stream));
        }
        uint64_t s = now_ns();
        CK(api.cuCtxSynchronize());
        uint64_t done = now_ns();
        sync_ns += done - s;
        if (ends && (size_t)bursts < cap)
            ends[bursts] = done;
        bursts++;
        if (done <= deadline) {
            inside += k;
        } else {
            for (long j = 0; j < k; j++) {
                float ms;
                CK(api.cuEventElapsedTime(&ms, ev0, ev[j]));
                inside += ms <= window_ms;
            }
            break;
        }
        host_gap((uint64_t)gap_us * 1000u);
    }
    uint64_t t1 = now_ns();
    for (long j = 0; j < k; j++)
        CK(api.cuEventDestroy_v2(ev[j]));
    CK(api.cuEventDestroy_v2(ev0));
    for (long b = 0; ends && b < bursts && (size_t)b < cap; b++)
        out("burst_end_ns=%" PRIu64, ends[b]);
    free(ends);
    out("bursts=%ld", bursts);
    out("kernels=%ld", bursts * k);
    out("window_kernels=%ld", inside);
    out("achieved=%.4f", (double)inside * (double)us * 1e3 / (secs * 1e9));
    out("sync_us_mean=%" PRIu64, bursts ? sync_ns / (uint64_t)bursts / 1000u : 0);
    out("wall_ns=%" PRIu64, t1 - t0);
    out("start_ns=%" PRIu64, t0);
    out("end_ns=%" PRIu64, t1);
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

/* How online requests arrive: at a fixed period, with exponential gaps of that mean (poisson:
 * nothing to predict), or in bursts of BURSTY_N requests, exponential gaps of an eighth of the
 * mean inside a burst and longer ones between bursts, the same mean overall (bursty). */
enum arrivals { PERIODIC, POISSON, BURSTY };
#define BURSTY_N 4

static double next_gap(enum arrivals how, double mean, long i, unsigned short seed[3])
{
    if (how == PERIODIC)
        return mean;
    double m = mean;
    if (how == BURSTY) /* BURSTY_N - 1 short gaps and one long one: the mean stays `mean` */
        m = i % BURSTY_N ? mean / 8 : mean * (BURSTY_N - (BURSTY_N - 1) / 8.0);
    return m * -log(1.0 - erand48(seed));
}

/* Online requests: N bursts of K spin kernels of US µs, each synchronised, arriving as `how`. */
static int run_bursts(int argc, char **argv, enum arrivals how)
{
    bool poisson = how != PERIODIC;
    long n, period_ms, k;
    size_t us;
    uint64_t start_at = 0;
    if (argc < 4 || argc > 5 || parse_count(argv[0], &n) < 0 || n < 1 || n > 1000000 ||
        parse_count(argv[1], &period_ms) < 0 || parse_count(argv[2], &k) < 0 || k < 1 ||
        parse_size(argv[3], &us) < 0 || (argc == 5 && parse_start(argv[4], &start_at) < 0))
        return usage(poisson ? "poisson|bursty N MEAN_MS K US [START_NS]" : "bursts N PERIOD_MS K US [START_NS]");
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    uint64_t *lat = calloc((size_t)n, sizeof(*lat));
    uint64_t *runq = calloc((size_t)n, sizeof(*runq));
    uint64_t *launched = calloc((size_t)n, sizeof(*launched));
    uint64_t *ran = calloc((size_t)n, sizeof(*ran));
    uint64_t *woke = calloc((size_t)n, sizeof(*woke));
    double *gap = calloc((size_t)n, sizeof(*gap));
    if (!lat || !runq || !launched || !ran || !woke || !gap)
        return usage("out of host memory");
    /* The gaps, scaled so that they add up to (N - 1) means: every run covers the same window
     * (a benchmark runs the offline job for exactly that long), the pattern stays random. */
    unsigned short seed[3] = {0x5347, 0x5055, (unsigned short)getpid()};
    double total = 0;
    for (long i = 1; i < n; i++)
        total += gap[i] = next_gap(how, (double)period_ms * 1e6, i, seed);
    for (long i = 1; i < n && total > 0; i++)
        gap[i] *= (double)(n - 1) * (double)period_ms * 1e6 / total;
    /* One warm-up burst: the first launch pays for loading and for joining the arbiter. */
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    CK(api.cuStreamSynchronize(stream));
    /* Events around each request's kernels measure their span on the GPU's clock: with other
     * work queued on the engine, it includes the wait behind it. */
    CUevent first, last;
    CK(api.cuEventCreate(&first, 0));
    CK(api.cuEventCreate(&last, 0));
    sleep_until(start_at);
    uint64_t t0 = now_ns(), sum = 0, at = t0;
    out("started=1");
    for (long i = 0; i < n; i++) {
        if (i > 0)
            at += (uint64_t)gap[i];
        sleep_until(at);
        uint64_t q = runq_ns(), b = now_ns();
        woke[i] = b > at ? b - at : 0;
        CK(api.cuEventRecord(first, stream));
        for (long j = 0; j < k; j++)
            CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
        CK(api.cuEventRecord(last, stream));
        launched[i] = now_ns() - b;
        CK(api.cuStreamSynchronize(stream));
        lat[i] = now_ns() - b;
        float span = 0;
        CK(api.cuEventElapsedTime(&span, first, last));
        ran[i] = (uint64_t)((double)span * 1e6);
        runq[i] = runq_ns() - q;
        sum += lat[i];
    }
    for (long i = 0; i < n; i++)
        out("lat_us=%" PRIu64, lat[i] / 1000u); /* in order, before the sort below */
    for (long i = 0; i < n; i++)
        out("runq_us=%" PRIu64, runq[i] / 1000u); /* of each request: waiting for a CPU */
    for (long i = 0; i < n; i++) /* of each request: until its last launch returned (the token) */
        out("launch_us=%" PRIu64, launched[i] / 1000u);
    for (long i = 0; i < n; i++) /* of each request: its kernels' span on the GPU */
        out("span_us=%" PRIu64, ran[i] / 1000u);
    for (long i = 0; i < n; i++) /* of each request: how late it began (the host's timer) */
        out("woke_us=%" PRIu64, woke[i] / 1000u);
    uint64_t t1 = now_ns();
    qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
    size_t p99 = (size_t)((double)(n - 1) * 0.99 + 0.5);
    out("bursts=%ld", n);
    out("p50_us=%" PRIu64, lat[(n - 1) / 2] / 1000u);
    out("p99_us=%" PRIu64, lat[p99] / 1000u);
    out("max_us=%" PRIu64, lat[n - 1] / 1000u);
    out("mean_us=%" PRIu64, sum / (uint64_t)n / 1000u);
    out("wall_ns=%" PRIu64, t1 - t0);
    free(lat);
    free(runq);
    free(launched);
    free(ran);
    free(woke);
    free(gap);
    CK(api.cuEventDestroy_v2(first));
    CK(api.cuEventDestroy_v2(last));
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

/* N kernels of US µs queued back to back, an event after each: the time between consecutive
 * events is US while this process has the GPU and longer where another context ran in between
 * (a time slice of the other plus the switches).  Prints iv_us= per interval, in order. */
static int cmd_timeline(int argc, char **argv)
{
    long n;
    size_t us;
    uint64_t start_at = 0;
    if (argc < 2 || argc > 3 || parse_count(argv[0], &n) < 0 || n < 2 || n > 100000 ||
        parse_size(argv[1], &us) < 0 || (argc == 3 && parse_start(argv[2], &start_at) < 0))
        return usage("timeline N US [START_NS]");
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    CUevent *ev = calloc((size_t)n + 1, sizeof(*ev));
    if (!ev)
        return usage("out of host memory");
    for (long i = 0; i <= n; i++)
        CK(api.cuEventCreate(&ev[i], 0));
    sleep_until(start_at);
    uint64_t t0 = now_ns();
    CK(api.cuEventRecord(ev[0], stream));
    for (long i = 1; i <= n; i++) {
        CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
        CK(api.cuEventRecord(ev[i], stream));
    }
    CK(api.cuStreamSynchronize(stream));
    uint64_t t1 = now_ns();
    out("kernels=%ld", n);
    out("wall_us=%" PRIu64, (t1 - t0) / 1000u);
    for (long i = 1; i <= n; i++) {
        float ms = 0;
        CK(api.cuEventElapsedTime(&ms, ev[i - 1], ev[i]));
        out("iv_us=%.1f", (double)ms * 1000.0);
    }
    for (long i = 0; i <= n; i++)
        CK(api.cuEventDestroy_v2(ev[i]));
    free(ev);
    CK(api.cuModuleUnload(sp.mod));
    return 0;
}

static int cmd_bursts(int argc, char **argv)
{
    return run_bursts(argc, argv, PERIODIC);
}

static int cmd_poisson(int argc, char **argv)
{
    return run_bursts(argc, argv, POISSON);
}

static int cmd_bursty(int argc, char **argv)
{
    return run_bursts(argc, argv, BURSTY);
}

/* Launch in the parent (it takes the GPU token), fork, launch in the child: the child must ask
 * for the token itself, never use the parent's. */
static int cmd_forklaunch(int argc, char **argv)
{
    size_t us;
    double hold;
    if (argc != 2 || parse_size(argv[0], &us) < 0 || parse_seconds(argv[1], &hold) < 0)
        return usage("forklaunch US HOLD_SECONDS");
    struct spin sp;
    if (spin_setup(&sp, us))
        return 1;
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    CK(api.cuStreamSynchronize(stream));
    out("parent_pid=%d", (int)getpid());
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return usage("fork failed");
    if (pid == 0) {
        /* A real driver needs a fresh initialisation after fork; the simulated one too. */
        CUresult r = api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL);
        if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_INVALID_CONTEXT ||
            r == CUDA_ERROR_INVALID_HANDLE) {
            if (spin_setup(&sp, us))
                _exit(1);
            r = api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL);
        }
        if (!r)
            r = api.cuStreamSynchronize(stream);
        out("child_pid=%d", (int)getpid());
        out("child_launch=%s", r ? errname(r) : "OK");
        sleep_s(hold);
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    CK(api.cuLaunchKernel(sp.f, 1, 1, 1, 1, 1, 1, 0, stream, sp.params, NULL));
    CK(api.cuStreamSynchronize(stream));
    out("child_status=%d", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    out("parent_launch=OK");
    return 0;
}

static int cmd_help(int argc, char **argv);

static const struct command {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"help", cmd_help, "this list"},
    {"info", cmd_info, "device count, driver version, devN.name / devN.uuid / devN.total"},
    {"meminfo", cmd_meminfo, "free= total= (cuMemGetInfo_v2), devtotal= (cuDeviceTotalMem_v2)"},
    {"alloc", cmd_alloc, "KIND BYTES...: alloc=OK|<error> per size (kept), then meminfo keys"},
    {"fill", cmd_fill, "KIND CHUNK [HOLD_SECONDS]: allocate until refused: count= bytes= error=; "
                       "free one, retry: refill=OK|<error>; with HOLD_SECONDS, meminfo keys, held=1, "
                       "then keep the memory that long"},
    {"hold", cmd_hold, "KIND BYTES SECONDS: allocate, ready=1 (or alloc=<error>), sleep, free"},
    {"killself", cmd_killself, "KIND BYTES: allocate, ready=1, then SIGKILL itself"},
    {"forkfree", cmd_forkfree, "KIND BYTES: run `killself` in a child, then freed=1 when its "
                               "memory came back (free_before= free_after= child=)"},
    {"cycle", cmd_cycle, "KIND BYTES N [HOLD_SECONDS]: N alloc+free pairs, ns_per_pair=; then "
                         "ready=1 and stay alive HOLD_SECONDS"},
    {"threads", cmd_threads, "T KIND CHUNK: T threads allocate until refused: count= bytes="},
    {"launch", cmd_launch, "N US [kernel|ex|coop|graph|capture [START_NS]]: from CLOCK_MONOTONIC "
                           "START_NS if given, N spin kernels of US µs (launched=1 once queued), then "
                           "sync: wall_us= gpu_us= (events), launch_gap_us=, start_ns= end_ns= (CLOCK_MONOTONIC)"},
    {"launchbench", cmd_launchbench, "N: N launches of a 0 µs kernel, ns_per_launch= (calls only)"},
    {"copy", cmd_copy, "BYTES: HtoD, DtoD, DtoH round trip: copy=OK; memsets: memset=OK"},
    {"memops", cmd_memops, "stream memory operations: a wait for a write queued behind a kernel, "
                           "a wait another thread's write opens, a relay stream behind an "
                           "interprocess event: memops=OK"},
    {"saturate", cmd_saturate, "SECONDS US [kernel|graph|capture [START_NS [BATCH]]]: from START_NS, "
                               "launch US-µs spin kernels back to back for SECONDS, BATCH (default ~2 ms of "
                               "work; graph/capture: one BATCH-kernel graph) at a time, waiting for the "
                               "previous batch after queueing the next (double-buffered): "
                               "kernels= gpu_ns= (kernels x US) wall_ns= window_kernels= (batches "
                               "completed inside the window) achieved= (window_kernels x US / "
                               "SECONDS) max_gap_us= (longest time between two syncs)"},
    {"syncloop", cmd_syncloop, "SECONDS K US GAP_US [START_NS [log]]: from START_NS for SECONDS: K spin "
                               "kernels of US µs, cuCtxSynchronize, GAP_US of host time (spun up to "
                               "1 ms, slept beyond), again: bursts= window_kernels= (kernels completed "
                               "inside the window) achieved= (window_kernels x US / SECONDS) "
                               "sync_us_mean=; with log, burst_end_ns= (CLOCK_MONOTONIC) per burst first"},
    {"timeline", cmd_timeline, "N US [START_NS]: from START_NS, N US-µs spin kernels back to back, an "
                               "event after each: kernels= wall_us=, then iv_us= (the time between "
                               "consecutive events) for each kernel in order"},
    {"forklaunch", cmd_forklaunch, "US HOLD_SECONDS: launch and sync, fork; the child launches "
                                   "(re-initialising if needed): child_pid= child_launch=OK, holds "
                                   "HOLD_SECONDS; then the parent launches again: parent_launch=OK"},
    {"poisson", cmd_poisson, "N MEAN_MS K US [START_NS]: as bursts, but the gaps between bursts are "
                             "exponentially distributed with mean MEAN_MS (random arrivals)"},
    {"bursty", cmd_bursty, "N MEAN_MS K US [START_NS]: as poisson, in groups of 4: gaps of mean "
                           "MEAN_MS/8 inside a group, longer between groups (mean MEAN_MS overall)"},
    {"bursts", cmd_bursts, "N PERIOD_MS K US [START_NS]: every PERIOD_MS launch K spin kernels of "
                           "US µs and sync, N times; lat_us= per burst in order, then of each: "
                           "runq_us= (waiting for a CPU), launch_us= (until its last launch "
                           "returned), span_us= (its kernels on the GPU's clock, queued behind "
                           "other work included), woke_us= (how late it began); then "
                           "p50_us= p99_us= max_us= mean_us="},
};

static int cmd_help(int argc, char **argv)
{
    printf("usage: sgprobe [-d ORDINAL] COMMAND ARGS...\n"
           "KIND: plain pitch managed async pool vmm array; sizes accept k/M/G suffixes "
           "(binary)\nexit: 0 ran, 1 unexpected driver failure (fail= error=), 2 usage\n"
           "SGPROBE_SYNC=auto|spin|yield|blocking: how its syncs wait (its context's flag)\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        printf("  %-12s %s\n", commands[i].name, commands[i].help);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "-d") == 0) {
        long d;
        if (parse_count(argv[i + 1], &d) < 0 || d > 1024)
            return usage("bad -d ORDINAL");
        ordinal = (int)d;
        i += 2;
    }
    if (i >= argc)
        return usage("missing command");
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++) {
        if (strcmp(argv[i], commands[c].name) == 0) {
            if (commands[c].fn != cmd_help && load_api())
                return 1;
            return commands[c].fn(argc - i - 1, argv + i + 1);
        }
    }
    return usage("unknown command");
}
