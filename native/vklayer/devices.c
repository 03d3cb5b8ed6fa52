/*
 * Which physical devices the program sees.  A tenant's GPUs are named by UUID in its limits; a
 * Vulkan physical device's deviceUUID (VkPhysicalDeviceIDProperties) is the same 16 bytes on
 * NVIDIA's driver, so the layer asks the ledger about that UUID and enumerates only the tenant's
 * devices, as CUDA_VISIBLE_DEVICES does for CUDA.  Without a tenant every device is shown; a
 * device whose UUID cannot be learned is not shown to a tenant (it could be any GPU).
 */
#include "layer.h"

#include <stdlib.h>
#include <string.h>

bool vl_device_uuid(struct vl_instance *in, VkPhysicalDevice pd, uint8_t uuid[VK_UUID_SIZE])
{
    if (!in->GetPhysicalDeviceProperties2)
        return false;
    VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
    VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
    in->GetPhysicalDeviceProperties2(pd, &props);
    memcpy(uuid, id.deviceUUID, VK_UUID_SIZE);
    static const uint8_t zero[VK_UUID_SIZE];
    return memcmp(uuid, zero, VK_UUID_SIZE) != 0;
}

bool vl_visible(struct vl_instance *in, VkPhysicalDevice pd)
{
    const struct vl_shim *shim;
    if (vl_shim(&shim) < 0)
        return false;
    if (shim->state() == 0)
        return true;
    uint8_t uuid[VK_UUID_SIZE];
    uint64_t cap, used;
    return vl_device_uuid(in, pd, uuid) && shim->device(uuid, &cap, &used) == 1;
}

/* The next layer's devices, all of them (malloc'd, *n of them). */
static VkResult all_devices(struct vl_instance *in, VkPhysicalDevice **out, uint32_t *n)
{
    for (;;) {
        VkResult r = in->EnumeratePhysicalDevices(in->handle, n, NULL);
        if (r != VK_SUCCESS)
            return r;
        *out = malloc((*n ? *n : 1) * sizeof(**out));
        if (!*out)
            return VK_ERROR_OUT_OF_HOST_MEMORY;
        r = in->EnumeratePhysicalDevices(in->handle, n, *out);
        if (r != VK_INCOMPLETE)
            return r; /* VK_INCOMPLETE: a device came between the two calls; ask again */
        free(*out);
    }
}

/* The application's side of an enumeration: the count, or up to *count items and VK_INCOMPLETE
 * when that is fewer than there are. */
static VkResult answer(uint32_t have, uint32_t *count, void *dst, const void *src, size_t item)
{
    if (!dst) {
        *count = have;
        return VK_SUCCESS;
    }
    uint32_t n = *count < have ? *count : have;
    memcpy(dst, src, n * item);
    *count = n;
    return n < have ? VK_INCOMPLETE : VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_EnumeratePhysicalDevices(VkInstance instance, uint32_t *count,
                                                           VkPhysicalDevice *devices)
{
    struct vl_instance *in = vl_instance_of(instance);
    if (!in || !count)
        return VK_ERROR_INITIALIZATION_FAILED;
    VkPhysicalDevice *all;
    uint32_t n = 0, kept = 0;
    VkResult r = all_devices(in, &all, &n);
    if (r != VK_SUCCESS)
        return r;
    for (uint32_t i = 0; i < n; i++)
        if (vl_visible(in, all[i]))
            all[kept++] = all[i];
    r = answer(kept, count, devices, all, sizeof(*all));
    free(all);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_EnumeratePhysicalDeviceGroups(VkInstance instance, uint32_t *count,
                                                                VkPhysicalDeviceGroupProperties *groups)
{
    struct vl_instance *in = vl_instance_of(instance);
    if (!in || !count || !in->EnumeratePhysicalDeviceGroups)
        return VK_ERROR_INITIALIZATION_FAILED;
    uint32_t n = 0;
    VkResult r = in->EnumeratePhysicalDeviceGroups(in->handle, &n, NULL);
    if (r != VK_SUCCESS)
        return r;
    VkPhysicalDeviceGroupProperties *all = calloc(n ? n : 1, sizeof(*all));
    if (!all)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < n; i++)
        all[i].sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_GROUP_PROPERTIES;
    r = in->EnumeratePhysicalDeviceGroups(in->handle, &n, all);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        free(all);
        return r;
    }
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceGroupProperties g = all[i];
        uint32_t m = 0;
        for (uint32_t j = 0; j < g.physicalDeviceCount; j++)
            if (vl_visible(in, g.physicalDevices[j]))
                g.physicalDevices[m++] = g.physicalDevices[j];
        if (m == 0)
            continue; /* none of the tenant's: the whole group is hidden */
        g.physicalDeviceCount = m;
        g.subsetAllocation = m > 1 ? g.subsetAllocation : VK_FALSE;
        all[kept++] = g;
    }
    if (!groups) {
        *count = kept;
        free(all);
        return VK_SUCCESS;
    }
    uint32_t give = *count < kept ? *count : kept;
    for (uint32_t i = 0; i < give; i++) {
        void *next = groups[i].pNext; /* the application's chain stays its own */
        groups[i] = all[i];
        groups[i].sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_GROUP_PROPERTIES;
        groups[i].pNext = next;
    }
    *count = give;
    free(all);
    return give < kept ? VK_INCOMPLETE : VK_SUCCESS;
}
