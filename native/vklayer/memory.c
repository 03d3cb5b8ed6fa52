/*
 * Memory: what the vGPU shows and what it charges.
 *
 *   - vkGetPhysicalDeviceMemoryProperties(2): every device-local heap of a tenant's GPU is at most
 *     the tenant's cap, so engines size their caches to the vGPU; so is the largest allocation
 *     (maxMemoryAllocationSize, vkGetPhysicalDeviceProperties2);
 *   - VK_EXT_memory_budget (VkPhysicalDeviceMemoryBudgetPropertiesEXT in properties2's chain):
 *     a device-local heap's budget is at most what this process uses of it plus what the tenant
 *     has left under its cap;
 *   - vkAllocateMemory of a memory type on a device-local heap is charged to the tenant's ledger
 *     before the driver allocates (past the cap: VK_ERROR_OUT_OF_DEVICE_MEMORY, the driver never
 *     called), whatever its pNext chain says (dedicated, exported or imported memory: an importer
 *     pays as well, as with CUDA IPC); host heaps pass uncharged.  vkFreeMemory credits it, and
 *     vkDestroyDevice credits what the program never freed.
 *
 * The charge is keyed by the VkDeviceMemory handle; before the driver returns it, by a
 * provisional key (the top bit set, never a handle value the driver gives).
 */
#include "layer.h"

#include <stdatomic.h>
#include <string.h>

#define PROVISIONAL (1ull << 63)

static atomic_uint_fast64_t provisional_seq;

/* The tenant's cap and use of the GPU of pd: true when it is one of the tenant's. */
static bool vgpu_of(struct vl_instance *in, VkPhysicalDevice pd, uint64_t *cap, uint64_t *used)
{
    const struct vl_shim *shim;
    uint8_t uuid[VK_UUID_SIZE];
    return vl_shim(&shim) == 0 && shim->state() == 1 && vl_device_uuid(in, pd, uuid) &&
           shim->device(uuid, cap, used) == 1;
}

static void clip_heaps(VkPhysicalDeviceMemoryProperties *p, uint64_t cap)
{
    for (uint32_t h = 0; h < p->memoryHeapCount && h < VK_MAX_MEMORY_HEAPS; h++)
        if ((p->memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && p->memoryHeaps[h].size > cap)
            p->memoryHeaps[h].size = cap;
}

VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceMemoryProperties(VkPhysicalDevice pd,
                                                                VkPhysicalDeviceMemoryProperties *props)
{
    struct vl_instance *in = vl_instance_of(pd);
    if (!in || !in->GetPhysicalDeviceMemoryProperties)
        return;
    in->GetPhysicalDeviceMemoryProperties(pd, props);
    uint64_t cap, used;
    if (props && vgpu_of(in, pd, &cap, &used))
        clip_heaps(props, cap);
}

VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice pd,
                                                                 VkPhysicalDeviceMemoryProperties2 *props)
{
    struct vl_instance *in = vl_instance_of(pd);
    if (!in || !in->GetPhysicalDeviceMemoryProperties2)
        return;
    in->GetPhysicalDeviceMemoryProperties2(pd, props);
    uint64_t cap, used;
    if (!props || !vgpu_of(in, pd, &cap, &used))
        return;
    VkPhysicalDeviceMemoryProperties *p = &props->memoryProperties;
    clip_heaps(p, cap);
    uint64_t left = cap > used ? cap - used : 0;
    for (VkBaseOutStructure *s = props->pNext; s; s = s->pNext) {
        if (s->sType != VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT)
            continue;
        VkPhysicalDeviceMemoryBudgetPropertiesEXT *b = (VkPhysicalDeviceMemoryBudgetPropertiesEXT *)s;
        for (uint32_t h = 0; h < p->memoryHeapCount && h < VK_MAX_MEMORY_HEAPS; h++) {
            if (!(p->memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT))
                continue;
            uint64_t ours = b->heapUsage[h] + left;
            if (ours < b->heapUsage[h])
                ours = UINT64_MAX;
            if (b->heapBudget[h] > ours)
                b->heapBudget[h] = ours;
            if (b->heapBudget[h] > cap)
                b->heapBudget[h] = cap;
        }
    }
}

/* A single allocation is at most the cap too: engines size their largest buffer by it
 * (maxMemoryAllocationSize, in Maintenance3 or Vulkan 1.1 properties). */
VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceProperties2(VkPhysicalDevice pd, VkPhysicalDeviceProperties2 *props)
{
    struct vl_instance *in = vl_instance_of(pd);
    if (!in || !in->GetPhysicalDeviceProperties2)
        return;
    in->GetPhysicalDeviceProperties2(pd, props);
    uint64_t cap, used;
    if (!props || !vgpu_of(in, pd, &cap, &used))
        return;
    for (VkBaseOutStructure *s = props->pNext; s; s = s->pNext) {
        VkDeviceSize *max = NULL;
        if (s->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES)
            max = &((VkPhysicalDeviceMaintenance3Properties *)s)->maxMemoryAllocationSize;
        else if (s->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES)
            max = &((VkPhysicalDeviceVulkan11Properties *)s)->maxMemoryAllocationSize;
        if (max && *max > cap)
            *max = cap;
    }
}

void vl_device_memory_setup(struct vl_instance *in, VkPhysicalDevice pd, struct vl_device *dev)
{
    uint64_t cap, used;
    dev->metered = vgpu_of(in, pd, &cap, &used) && vl_device_uuid(in, pd, dev->uuid);
    if (!dev->metered || !in->GetPhysicalDeviceMemoryProperties)
        return;
    VkPhysicalDeviceMemoryProperties p;
    memset(&p, 0, sizeof(p));
    in->GetPhysicalDeviceMemoryProperties(pd, &p);
    dev->type_count = p.memoryTypeCount < VK_MAX_MEMORY_TYPES ? p.memoryTypeCount : VK_MAX_MEMORY_TYPES;
    for (uint32_t t = 0; t < dev->type_count; t++) {
        uint32_t h = p.memoryTypes[t].heapIndex;
        dev->type_local[t] = h < p.memoryHeapCount && (p.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT);
    }
}

VKAPI_ATTR VkResult VKAPI_CALL vl_AllocateMemory(VkDevice device, const VkMemoryAllocateInfo *info,
                                                 const VkAllocationCallbacks *alloc, VkDeviceMemory *memory)
{
    struct vl_device *dev = vl_device_of(device);
    if (!dev)
        return VK_ERROR_INITIALIZATION_FAILED;
    const struct vl_shim *shim;
    bool charged = dev->metered && info && memory && info->memoryTypeIndex < dev->type_count &&
                   dev->type_local[info->memoryTypeIndex] && vl_shim(&shim) == 0;
    if (!charged)
        return dev->AllocateMemory(device, info, alloc, memory); /* the driver judges the rest */
    uint64_t key = PROVISIONAL | atomic_fetch_add(&provisional_seq, 1);
    int rc = shim->charge(dev->uuid, info->allocationSize, key, dev);
    if (rc != 0)
        return VK_ERROR_OUT_OF_DEVICE_MEMORY; /* over the cap, or the tenant's ledger is broken */
    VkResult r = dev->AllocateMemory(device, info, alloc, memory);
    if (r != VK_SUCCESS) {
        shim->credit(key);
        return r;
    }
    if (shim->rekey(key, (uint64_t)(uintptr_t)*memory) != 0) { /* nothing stays charged: free it */
        dev->FreeMemory(device, *memory, alloc);
        *memory = VK_NULL_HANDLE;
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL vl_FreeMemory(VkDevice device, VkDeviceMemory memory, const VkAllocationCallbacks *alloc)
{
    struct vl_device *dev = vl_device_of(device);
    if (!dev)
        return;
    dev->FreeMemory(device, memory, alloc);
    const struct vl_shim *shim;
    if (dev->metered && memory != VK_NULL_HANDLE && vl_shim(&shim) == 0)
        shim->credit((uint64_t)(uintptr_t)memory);
}
