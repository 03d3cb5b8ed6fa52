/*
 * libsharegpu_vk.so: the tenant's vGPU for Vulkan programs, as an implicit layer.
 *
 * Written from the Vulkan specification and the loader's layer interface documentation
 * (LoaderLayerInterface.md): the loader negotiates interface version 2 through
 * vkNegotiateLoaderLayerInterfaceVersion, the only symbol this library exports, and calls down
 * the chain through the next layer's vkGetInstanceProcAddr / vkGetDeviceProcAddr.
 *
 *   layer.c    negotiation, instance and device creation, the dispatch records, the proc-addr answers
 *   devices.c  which physical devices are the tenant's (deviceUUID against its GPUs' UUIDs): the
 *              others are not enumerated
 *   memory.c   the heaps and budgets the vGPU shows, allocations charged to the tenant's ledger
 *   submit.c   queue submissions through the GPU's arbiter, as kernel launches are
 *   shimapi.c  the shim's layer API (libsharegpu.so, layer_api.c): one ledger and one arbiter
 *              client per process, whichever API it uses
 */
#ifndef SHAREGPU_VKLAYER_H
#define SHAREGPU_VKLAYER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#include "sharegpu/layer_api.h"

#define VL_EXPORT __attribute__((visibility("default")))
#define VL_LAYER_NAME "VK_LAYER_SHAREGPU_vgpu"

/* ---- dispatch records (layer.c) -------------------------------------------------------------
 * Keyed by the loader's dispatch pointer, the first word of every dispatchable handle; a
 * physical device shares its instance's. */
struct vl_instance {
    void *key;
    VkInstance handle;
    PFN_vkGetInstanceProcAddr gipa;
    PFN_vkDestroyInstance DestroyInstance;
    PFN_vkEnumeratePhysicalDevices EnumeratePhysicalDevices;
    PFN_vkEnumeratePhysicalDeviceGroups EnumeratePhysicalDeviceGroups;
    PFN_vkGetPhysicalDeviceProperties2 GetPhysicalDeviceProperties2;
    PFN_vkGetPhysicalDeviceMemoryProperties GetPhysicalDeviceMemoryProperties;
    PFN_vkGetPhysicalDeviceMemoryProperties2 GetPhysicalDeviceMemoryProperties2;
    PFN_vkCreateDevice CreateDevice;
};

struct vl_device {
    void *key;
    VkDevice handle;
    PFN_vkGetDeviceProcAddr gdpa;
    PFN_vkDestroyDevice DestroyDevice;
    PFN_vkAllocateMemory AllocateMemory;
    PFN_vkFreeMemory FreeMemory;
    PFN_vkQueueSubmit QueueSubmit;
    PFN_vkQueueSubmit2 QueueSubmit2;    /* vkQueueSubmit2 or ...KHR; NULL: neither */
    PFN_vkQueuePresentKHR QueuePresentKHR;
    PFN_vkQueueWaitIdle QueueWaitIdle;
    PFN_vkDeviceWaitIdle DeviceWaitIdle;
    PFN_vkWaitForFences WaitForFences;
    PFN_vkQueueBindSparse QueueBindSparse;
    bool metered;                       /* one of the tenant's GPUs, a tenant present */
    struct sharegpu_arb_slot slot;      /* its place in the GPU's arbiter (submit.c) */
    pthread_mutex_t qmu;                /* every queue call the layer sees, and the list below */
    int nqueues;
    struct vl_queue *queues;            /* [qmu] queues submitted to in the GPU's current hold */
    uint8_t uuid[VK_UUID_SIZE];
    uint32_t type_count;
    bool type_local[VK_MAX_MEMORY_TYPES]; /* the type's heap is device-local: charged */
};

static inline void *vl_key(const void *dispatchable)
{
    return *(void *const *)dispatchable;
}

struct vl_instance *vl_instance_of(const void *dispatchable); /* an instance or physical device */
struct vl_device *vl_device_of(VkDevice device);
void vl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- devices.c ------------------------------------------------------------------------------ */
/* The device's UUID, asked of the next layer; false when it cannot tell. */
bool vl_device_uuid(struct vl_instance *in, VkPhysicalDevice pd, uint8_t uuid[VK_UUID_SIZE]);
/* Shown to the program: every device without a tenant, else only the tenant's GPUs. */
bool vl_visible(struct vl_instance *in, VkPhysicalDevice pd);
VKAPI_ATTR VkResult VKAPI_CALL vl_EnumeratePhysicalDevices(VkInstance instance, uint32_t *count,
                                                           VkPhysicalDevice *devices);
VKAPI_ATTR VkResult VKAPI_CALL vl_EnumeratePhysicalDeviceGroups(VkInstance instance, uint32_t *count,
                                                                VkPhysicalDeviceGroupProperties *groups);

/* ---- submit.c ------------------------------------------------------------------------------- */
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                              VkFence fence);
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit2(VkQueue queue, uint32_t count, const VkSubmitInfo2 *submits,
                                               VkFence fence);
VKAPI_ATTR VkResult VKAPI_CALL vl_QueuePresentKHR(VkQueue queue, const VkPresentInfoKHR *info);
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueWaitIdle(VkQueue queue);
VKAPI_ATTR VkResult VKAPI_CALL vl_DeviceWaitIdle(VkDevice device);
VKAPI_ATTR VkResult VKAPI_CALL vl_WaitForFences(VkDevice device, uint32_t count, const VkFence *fences,
                                                VkBool32 all, uint64_t timeout);
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueBindSparse(VkQueue queue, uint32_t count, const VkBindSparseInfo *binds,
                                                  VkFence fence);
/* The device is going: its place in the arbiter. */
void vl_device_submit_end(struct vl_device *dev);

/* ---- memory.c ------------------------------------------------------------------------------- */
VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceMemoryProperties(VkPhysicalDevice pd,
                                                                VkPhysicalDeviceMemoryProperties *props);
VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceProperties2(VkPhysicalDevice pd, VkPhysicalDeviceProperties2 *props);
VKAPI_ATTR void VKAPI_CALL vl_GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice pd,
                                                                 VkPhysicalDeviceMemoryProperties2 *props);
VKAPI_ATTR VkResult VKAPI_CALL vl_AllocateMemory(VkDevice device, const VkMemoryAllocateInfo *info,
                                                 const VkAllocationCallbacks *alloc, VkDeviceMemory *memory);
VKAPI_ATTR void VKAPI_CALL vl_FreeMemory(VkDevice device, VkDeviceMemory memory,
                                         const VkAllocationCallbacks *alloc);
/* Fills the device record's memory facts (which types are charged) at vkCreateDevice. */
void vl_device_memory_setup(struct vl_instance *in, VkPhysicalDevice pd, struct vl_device *dev);

/* ---- shimapi.c: the shim's layer API (sharegpu/layer_api.h) ------------------------------- */
struct vl_shim {
    sharegpu_ledger_state_fn state;
    sharegpu_ledger_device_fn device;
    sharegpu_ledger_charge_fn charge;
    sharegpu_ledger_rekey_fn rekey;
    sharegpu_ledger_credit_fn credit;
    sharegpu_ledger_credit_owner_fn credit_owner;
    sharegpu_arb_enter_fn arb_enter;
    sharegpu_arb_exit_fn arb_exit;
    sharegpu_arb_forget_fn arb_forget;
    sharegpu_arb_wait_begin_fn wait_begin;
    sharegpu_arb_wait_end_fn wait_end;
};
/* 0 with the shim's API (shim->state() says whether a tenant is present), or -1 when a tenant
 * is configured but the shim cannot be reached (the program must not run unmetered). */
int vl_shim(const struct vl_shim **out);

#endif
