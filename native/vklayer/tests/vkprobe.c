/*
 * A plain Vulkan program for tests/integration/test_vulkan.py: it knows nothing of sharegpu.
 *   vkprobe info [api]         the devices it sees (uuid, name) and their heaps
 *   vkprobe fill <MiB> [how]   (Vulkan 1.0) allocates <MiB> chunks of a device-local type until
 *                              refused, frees one and allocates it again, then frees all.  how:
 *                              leak  frees none, destroys the device, then fills a second device
 *                                    (allocated2=)
 *                              pnext on a 1.3 instance, each allocation with a
 *                                    VkMemoryAllocateFlagsInfo in its pNext chain
 *   vkprobe groups             the device groups it sees
 *   vkprobe bench <N>          N pairs of vkAllocateMemory + vkFreeMemory of 4 KiB (device-local), and
 *                              N empty vkQueueSubmit: ns per pair, per submit (bench/vulkan.py)
 *   vkprobe work <start_ns> <seconds> <MiB> [gap_us]  from CLOCK_MONOTONIC start_ns, for seconds:
 *                              submit a command buffer that fills a <MiB> buffer, wait for its
 *                              fence, spend gap_us on the host, again (a renderer that waits for
 *                              each frame): done= how many
 *   vkprobe mixed <CUDA MiB> <MiB>  cuMemAlloc of <CUDA MiB> on CUDA device 0 first (one process,
 *                              both APIs), then fill <MiB>
 * api: 10 (Vulkan 1.0, the default) or 13; groups uses 1.1.  Output: key=value lines.
 */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

#include "sharegpu/cuda_api.h"

#define MIB (1024ull * 1024ull)
#define MAX_CHUNKS 4096

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static VkInstance make_instance(uint32_t api)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "vkprobe",
                             .apiVersion = api};
    VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance instance = VK_NULL_HANDLE;
    VkResult r = vkCreateInstance(&info, NULL, &instance);
    printf("instance=%d\n", (int)r);
    return r == VK_SUCCESS ? instance : VK_NULL_HANDLE;
}

static void print_uuid(const char *key, const uint8_t *u)
{
    printf("%s=", key);
    for (unsigned i = 0; i < VK_UUID_SIZE; i++)
        printf("%02x%s", u[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
    printf("\n");
}

static uint32_t devices_of(VkInstance instance, VkPhysicalDevice *out, uint32_t cap)
{
    uint32_t n = 0;
    VkResult r = vkEnumeratePhysicalDevices(instance, &n, NULL);
    printf("enumerate=%d\ndevices=%u\n", (int)r, n);
    if (n > cap)
        n = cap;
    r = vkEnumeratePhysicalDevices(instance, &n, out);
    return r == VK_SUCCESS || r == VK_INCOMPLETE ? n : 0;
}

static void info(VkInstance instance, uint32_t api)
{
    VkPhysicalDevice pds[16];
    uint32_t n = devices_of(instance, pds, 16);
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        printf("name=%s\n", p.deviceName);
        if (api >= VK_API_VERSION_1_1) {
            VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
            VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
            vkGetPhysicalDeviceProperties2(pds[i], &p2);
            print_uuid("uuid", id.deviceUUID);
            VkPhysicalDeviceMemoryProperties2 m2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
            vkGetPhysicalDeviceMemoryProperties2(pds[i], &m2);
            for (uint32_t h = 0; h < m2.memoryProperties.memoryHeapCount; h++)
                printf("heap2=%llu\n", (unsigned long long)m2.memoryProperties.memoryHeaps[h].size);
        }
        VkPhysicalDeviceMemoryProperties m;
        vkGetPhysicalDeviceMemoryProperties(pds[i], &m);
        for (uint32_t h = 0; h < m.memoryHeapCount; h++)
            printf("heap=%llu local=%d\n", (unsigned long long)m.memoryHeaps[h].size,
                   (m.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) ? 1 : 0);
    }
}

static void groups(VkInstance instance)
{
    uint32_t n = 0;
    VkResult r = vkEnumeratePhysicalDeviceGroups(instance, &n, NULL);
    printf("groups=%u rc=%d\n", n, (int)r);
    VkPhysicalDeviceGroupProperties g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (VkPhysicalDeviceGroupProperties){.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_GROUP_PROPERTIES};
    n = n > 8 ? 8 : n;
    r = vkEnumeratePhysicalDeviceGroups(instance, &n, g);
    for (uint32_t i = 0; i < n; i++)
        printf("group=%u\n", g[i].physicalDeviceCount);
}


static int bench(VkPhysicalDevice pd, VkDevice dev, uint32_t type, long n)
{
    (void)pd;
    VkQueue queue;
    vkGetDeviceQueue(dev, 0, 0, &queue);
    VkMemoryAllocateInfo a = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = 4096,
                              .memoryTypeIndex = type};
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        VkDeviceMemory m;
        if (vkAllocateMemory(dev, &a, NULL, &m) != VK_SUCCESS)
            return 1;
        vkFreeMemory(dev, m, NULL);
    }
    double t1 = now_ns();
    for (long i = 0; i < n; i++)
        if (vkQueueSubmit(queue, 0, NULL, VK_NULL_HANDLE) != VK_SUCCESS)
            return 1;
    double t2 = now_ns();
    vkQueueWaitIdle(queue);
    printf("alloc_free_ns=%.1f\nsubmit_ns=%.1f\n", (t1 - t0) / (double)n, (t2 - t1) / (double)n);
    return 0;
}


enum fill_how { FILL_PLAIN, FILL_LEAK, FILL_PNEXT, FILL_BENCH };

static int work(VkInstance instance, double start_ns, double seconds, uint64_t bytes, double gap_us)
{
    VkPhysicalDevice pd;
    if (devices_of(instance, &pd, 1) < 1)
        return 1;
    VkPhysicalDeviceMemoryProperties m;
    vkGetPhysicalDeviceMemoryProperties(pd, &m);
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueCount = 1,
                                  .pQueuePriorities = &prio};
    VkDeviceCreateInfo dinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                .pQueueCreateInfos = &qi};
    VkDevice dev;
    if (vkCreateDevice(pd, &dinfo, NULL, &dev) != VK_SUCCESS)
        return 1;
    VkQueue queue;
    vkGetDeviceQueue(dev, 0, 0, &queue);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                             .usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT};
    VkBuffer buf;
    if (vkCreateBuffer(dev, &bi, NULL, &buf) != VK_SUCCESS)
        return 1;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, buf, &req);
    uint32_t type = UINT32_MAX;
    for (uint32_t t = 0; t < m.memoryTypeCount && type == UINT32_MAX; t++)
        if (req.memoryTypeBits & (1u << t))
            type = t;
    VkMemoryAllocateInfo a = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                              .memoryTypeIndex = type};
    VkDeviceMemory mem;
    if (vkAllocateMemory(dev, &a, NULL, &mem) != VK_SUCCESS || vkBindBufferMemory(dev, buf, mem, 0) != VK_SUCCESS)
        return 1;
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    VkCommandPool pool;
    vkCreateCommandPool(dev, &pi, NULL, &pool);
    VkCommandBufferAllocateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    vkAllocateCommandBuffers(dev, &ci, &cb);
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cb, &begin);
    vkCmdFillBuffer(cb, buf, 0, VK_WHOLE_SIZE, 0x5a5a5a5au);
    vkEndCommandBuffer(cb);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    vkCreateFence(dev, &fi, NULL, &fence);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    while (now_ns() < start_ns)
        ;
    long done = 0;
    VkResult r = VK_SUCCESS;
    double end = start_ns + seconds * 1e9;
    while (now_ns() < end && r == VK_SUCCESS) {
        r = vkQueueSubmit(queue, 1, &si, fence);
        if (r == VK_SUCCESS)
            r = vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX);
        if (r == VK_SUCCESS) {
            vkResetFences(dev, 1, &fence);
            done++;
            for (double until = now_ns() + gap_us * 1e3; now_ns() < until;)
                ; /* host work between frames */
        }
    }
    printf("done=%ld\nwork=%d\n", done, (int)r);
    vkDestroyFence(dev, fence, NULL);
    vkDestroyCommandPool(dev, pool, NULL);
    vkDestroyBuffer(dev, buf, NULL);
    vkFreeMemory(dev, mem, NULL);
    vkDestroyDevice(dev, NULL);
    return r == VK_SUCCESS ? 0 : 1;
}

static int fill(VkInstance instance, uint64_t chunk, enum fill_how how)
{
    VkPhysicalDevice pd;
    if (devices_of(instance, &pd, 1) < 1)
        return 1;
    VkPhysicalDeviceMemoryProperties m;
    vkGetPhysicalDeviceMemoryProperties(pd, &m);
    uint32_t type = UINT32_MAX;
    for (uint32_t t = 0; t < m.memoryTypeCount && type == UINT32_MAX; t++)
        if (m.memoryHeaps[m.memoryTypes[t].heapIndex].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            type = t;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueCount = 1,
                                 .pQueuePriorities = &prio};
    VkDeviceCreateInfo dinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                .pQueueCreateInfos = &q};
    VkDevice dev;
    VkResult r = vkCreateDevice(pd, &dinfo, NULL, &dev);
    printf("device=%d\n", (int)r);
    if (r != VK_SUCCESS)
        return 1;
    if (how == FILL_BENCH) { /* chunk is the count */
        int brc = bench(pd, dev, type, (long)chunk);
        vkDestroyDevice(dev, NULL);
        return brc;
    }
    static VkDeviceMemory chunks[MAX_CHUNKS];
    int n = 0;
    VkMemoryAllocateFlagsInfo flags = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    VkMemoryAllocateInfo a = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = chunk,
                              .memoryTypeIndex = type, .pNext = how == FILL_PNEXT ? &flags : NULL};
    for (; n < MAX_CHUNKS; n++) {
        r = vkAllocateMemory(dev, &a, NULL, &chunks[n]);
        if (r != VK_SUCCESS)
            break;
    }
    printf("allocated=%d\nrefused=%d\n", n, (int)r);
    if (n > 0) {
        vkFreeMemory(dev, chunks[n - 1], NULL);
        r = vkAllocateMemory(dev, &a, NULL, &chunks[n - 1]);
        printf("again=%d\n", (int)r);
        if (r != VK_SUCCESS)
            n--;
    }
    for (int i = 0; i < n && how != FILL_LEAK; i++)
        vkFreeMemory(dev, chunks[i], NULL);
    vkDestroyDevice(dev, NULL); /* with FILL_LEAK, the memory goes with it */
    if (how == FILL_LEAK) {
        if (vkCreateDevice(pd, &dinfo, NULL, &dev) != VK_SUCCESS)
            return 1;
        for (n = 0; n < MAX_CHUNKS && vkAllocateMemory(dev, &a, NULL, &chunks[n]) == VK_SUCCESS; n++)
            ;
        printf("allocated2=%d\n", n);
        for (int i = 0; i < n; i++)
            vkFreeMemory(dev, chunks[i], NULL);
        vkDestroyDevice(dev, NULL);
    }
    printf("done=1\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *api_word = strcmp(argv[1], "info") == 0 && argc > 2 ? argv[2] : "10";
    enum fill_how how = FILL_PLAIN;
    if (strcmp(argv[1], "fill") == 0 && argc > 3)
        how = strcmp(argv[3], "leak") == 0 ? FILL_LEAK : strcmp(argv[3], "pnext") == 0 ? FILL_PNEXT : FILL_PLAIN;
    if (how == FILL_PNEXT)
        api_word = "13";
    uint32_t api = strcmp(api_word, "13") == 0 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_0;
    VkInstance instance = make_instance(strcmp(argv[1], "groups") == 0 ? VK_API_VERSION_1_1 : api);
    if (!instance)
        return 1;
    int rc = 0;
    if (strcmp(argv[1], "info") == 0)
        info(instance, api);
    else if (strcmp(argv[1], "groups") == 0)
        groups(instance);
    else if (strcmp(argv[1], "mixed") == 0 && argc > 3) {
        CUcontext ctx;
        CUdeviceptr p = 0;
        CUresult cr = cuInit(0);
        if (!cr)
            cr = cuDevicePrimaryCtxRetain(&ctx, 0);
        if (!cr)
            cr = cuCtxSetCurrent(ctx);
        if (!cr)
            cr = cuMemAlloc_v2(&p, (size_t)(strtoull(argv[2], NULL, 10) * MIB));
        printf("cuda=%d\n", (int)cr);
        rc = fill(instance, strtoull(argv[3], NULL, 10) * MIB, FILL_PLAIN);
        size_t free_b = 0, total = 0;
        cuMemGetInfo_v2(&free_b, &total);
        printf("cuda_used=%zu\n", total - free_b);
    } else if (strcmp(argv[1], "work") == 0 && argc > 4)
        rc = work(instance, strtod(argv[2], NULL), strtod(argv[3], NULL), strtoull(argv[4], NULL, 10) * MIB,
                  argc > 5 ? strtod(argv[5], NULL) : 0.0);
    else if (strcmp(argv[1], "bench") == 0 && argc > 2)
        rc = fill(instance, strtoull(argv[2], NULL, 10), FILL_BENCH);
    else if (strcmp(argv[1], "fill") == 0 && argc > 2)
        rc = fill(instance, strtoull(argv[2], NULL, 10) * MIB, how);
    else
        rc = 2;
    vkDestroyInstance(instance, NULL);
    return rc;
}
