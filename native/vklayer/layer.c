/*
 * The layer's frame: version negotiation, the instance and device chains, the dispatch records
 * and the answers to vkGetInstanceProcAddr / vkGetDeviceProcAddr.
 *
 * vkCreateInstance: the next layer's vkGetInstanceProcAddr comes from the loader's link info in
 * pCreateInfo's chain (VkLayerInstanceCreateInfo, function VK_LAYER_LINK_INFO), which this layer
 * advances before calling down, as the loader documents.  A 1.0 instance gets
 * VK_KHR_get_physical_device_properties2 enabled as well: the layer needs deviceUUID to know
 * which GPU a physical device is.  vkCreateDevice likewise with VkLayerDeviceCreateInfo.
 */
#include "layer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECORDS 64

/* The layer's records by dispatch key.  A lookup (every submission, allocation and free) takes
 * no lock and reads only the keys, never a record behind another key: a record removed and freed
 * by another thread is never touched (using a device while destroying it is the application's
 * error, Vulkan's external synchronisation).  Adding and removing take mu; a slot's record is
 * published before its key. */
struct table {
    void *keys[MAX_RECORDS];
    void *records[MAX_RECORDS]; /* each starts with its key */
};
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct table instances, devices;

void vl_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "sharegpu-vk: %s\n", line);
}

static bool keep(struct table *t, void *record)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_RECORDS; i++) {
        if (!t->records[i]) {
            __atomic_store_n(&t->records[i], record, __ATOMIC_RELEASE);
            __atomic_store_n(&t->keys[i], *(void **)record, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&mu);
            return true;
        }
    }
    pthread_mutex_unlock(&mu);
    return false;
}

static void *find(struct table *t, void *key)
{
    for (int i = 0; i < MAX_RECORDS; i++)
        if (__atomic_load_n(&t->keys[i], __ATOMIC_ACQUIRE) == key)
            return __atomic_load_n(&t->records[i], __ATOMIC_ACQUIRE);
    return NULL;
}

static void *take_out(struct table *t, void *key)
{
    void *found = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_RECORDS && !found; i++) {
        if (t->records[i] && t->keys[i] == key) {
            found = t->records[i];
            __atomic_store_n(&t->keys[i], NULL, __ATOMIC_RELEASE);
            __atomic_store_n(&t->records[i], NULL, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mu);
    return found;
}

struct vl_instance *vl_instance_of(const void *dispatchable)
{
    return dispatchable ? find(&instances, vl_key(dispatchable)) : NULL;
}

struct vl_device *vl_device_of(VkDevice device)
{
    return device ? find(&devices, vl_key(device)) : NULL;
}

/* ---- instance --------------------------------------------------------------------------------- */

static VkLayerInstanceCreateInfo *instance_link(const VkInstanceCreateInfo *info)
{
    for (const VkBaseInStructure *s = info->pNext; s; s = s->pNext) {
        VkLayerInstanceCreateInfo *l = (VkLayerInstanceCreateInfo *)s;
        if (s->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && l->function == VK_LAYER_LINK_INFO)
            return l;
    }
    return NULL;
}

static bool enabled(const VkInstanceCreateInfo *info, const char *ext)
{
    for (uint32_t i = 0; i < info->enabledExtensionCount; i++)
        if (strcmp(info->ppEnabledExtensionNames[i], ext) == 0)
            return true;
    return false;
}

#define GIPA(in, name) (PFN_##name)(in)->gipa((in)->handle, #name)

static VKAPI_ATTR VkResult VKAPI_CALL vl_CreateInstance(const VkInstanceCreateInfo *info,
                                                        const VkAllocationCallbacks *alloc,
                                                        VkInstance *instance)
{
    VkLayerInstanceCreateInfo *link = info ? instance_link(info) : NULL;
    if (!link || !link->u.pLayerInfo)
        return VK_ERROR_INITIALIZATION_FAILED;
    PFN_vkGetInstanceProcAddr next = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    PFN_vkCreateInstance create = (PFN_vkCreateInstance)next(VK_NULL_HANDLE, "vkCreateInstance");
    if (!create)
        return VK_ERROR_INITIALIZATION_FAILED;
    const struct vl_shim *shim;
    if (vl_shim(&shim) < 0)
        return VK_ERROR_INITIALIZATION_FAILED; /* a tenant, and no ledger: said on stderr */
    if (shim->state() < 0) {
        /* As cuInit refuses under a broken configuration: never run unmetered. */
        vl_log("the tenant's sharegpu configuration (SHAREGPU_TENANT) is broken: no Vulkan instance");
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    link->u.pLayerInfo = link->u.pLayerInfo->pNext;

    /* A 1.0 instance: ask for properties2 as well (deviceUUID), when it was not asked for. */
    uint32_t api = info->pApplicationInfo ? info->pApplicationInfo->apiVersion : VK_API_VERSION_1_0;
    const char *ext = VK_KHR_GET_PHYSICAL_DEVICE_PROPERTIES_2_EXTENSION_NAME;
    bool add = shim->state() != 0 && api < VK_API_VERSION_1_1 && !enabled(info, ext);
    VkInstanceCreateInfo ours = *info;
    const char **names = NULL;
    if (add) {
        names = malloc((info->enabledExtensionCount + 1) * sizeof(*names));
        if (!names)
            return VK_ERROR_OUT_OF_HOST_MEMORY;
        for (uint32_t i = 0; i < info->enabledExtensionCount; i++)
            names[i] = info->ppEnabledExtensionNames[i];
        names[info->enabledExtensionCount] = ext;
        ours.enabledExtensionCount = info->enabledExtensionCount + 1;
        ours.ppEnabledExtensionNames = names;
    }
    VkResult r = create(&ours, alloc, instance);
    if (r == VK_ERROR_EXTENSION_NOT_PRESENT && add) {
        add = false; /* no such extension: devices then cannot be told apart (see devices.c) */
        r = create(info, alloc, instance);
    }
    free(names);
    if (r != VK_SUCCESS)
        return r;

    struct vl_instance *in = calloc(1, sizeof(*in));
    if (!in) {
        PFN_vkDestroyInstance destroy = (PFN_vkDestroyInstance)next(*instance, "vkDestroyInstance");
        if (destroy)
            destroy(*instance, alloc);
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    in->key = vl_key(*instance);
    in->handle = *instance;
    in->gipa = next;
    in->DestroyInstance = GIPA(in, vkDestroyInstance);
    in->EnumeratePhysicalDevices = GIPA(in, vkEnumeratePhysicalDevices);
    in->EnumeratePhysicalDeviceGroups = GIPA(in, vkEnumeratePhysicalDeviceGroups);
    if (!in->EnumeratePhysicalDeviceGroups)
        in->EnumeratePhysicalDeviceGroups =
            (PFN_vkEnumeratePhysicalDeviceGroups)in->gipa(in->handle, "vkEnumeratePhysicalDeviceGroupsKHR");
    bool v11 = api >= VK_API_VERSION_1_1;
    in->GetPhysicalDeviceProperties2 =
        (PFN_vkGetPhysicalDeviceProperties2)in->gipa(in->handle, v11 ? "vkGetPhysicalDeviceProperties2"
                                                                     : "vkGetPhysicalDeviceProperties2KHR");
    in->GetPhysicalDeviceMemoryProperties = GIPA(in, vkGetPhysicalDeviceMemoryProperties);
    in->GetPhysicalDeviceMemoryProperties2 = (PFN_vkGetPhysicalDeviceMemoryProperties2)in->gipa(
        in->handle, v11 ? "vkGetPhysicalDeviceMemoryProperties2" : "vkGetPhysicalDeviceMemoryProperties2KHR");
    in->CreateDevice = GIPA(in, vkCreateDevice);
    if (!keep(&instances, in)) {
        vl_log("more than %d live Vulkan instances in one process", MAX_RECORDS);
        in->DestroyInstance(*instance, alloc);
        free(in);
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    return VK_SUCCESS;
}

static VKAPI_ATTR void VKAPI_CALL vl_DestroyInstance(VkInstance instance, const VkAllocationCallbacks *alloc)
{
    if (!instance)
        return;
    struct vl_instance *in = take_out(&instances, vl_key(instance));
    if (in && in->DestroyInstance)
        in->DestroyInstance(instance, alloc);
    free(in);
}

/* ---- device ----------------------------------------------------------------------------------- */

static VkLayerDeviceCreateInfo *device_link(const VkDeviceCreateInfo *info)
{
    for (const VkBaseInStructure *s = info->pNext; s; s = s->pNext) {
        VkLayerDeviceCreateInfo *l = (VkLayerDeviceCreateInfo *)s;
        if (s->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && l->function == VK_LAYER_LINK_INFO)
            return l;
    }
    return NULL;
}

#define GDPA(dev, name) (PFN_##name)(dev)->gdpa((dev)->handle, #name)

static VKAPI_ATTR VkResult VKAPI_CALL vl_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                      const VkAllocationCallbacks *alloc, VkDevice *device)
{
    struct vl_instance *in = vl_instance_of(pd);
    VkLayerDeviceCreateInfo *link = info ? device_link(info) : NULL;
    if (!in || !link || !link->u.pLayerInfo)
        return VK_ERROR_INITIALIZATION_FAILED;
    PFN_vkGetInstanceProcAddr next_gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    PFN_vkGetDeviceProcAddr next_gdpa = link->u.pLayerInfo->pfnNextGetDeviceProcAddr;
    PFN_vkCreateDevice create = (PFN_vkCreateDevice)next_gipa(in->handle, "vkCreateDevice");
    if (!create)
        return VK_ERROR_INITIALIZATION_FAILED;
    link->u.pLayerInfo = link->u.pLayerInfo->pNext;
    VkResult r = create(pd, info, alloc, device);
    if (r != VK_SUCCESS)
        return r;
    struct vl_device *dev = calloc(1, sizeof(*dev));
    if (dev) {
        dev->key = vl_key(*device);
        dev->handle = *device;
        dev->gdpa = next_gdpa;
        dev->DestroyDevice = GDPA(dev, vkDestroyDevice);
        dev->AllocateMemory = GDPA(dev, vkAllocateMemory);
        dev->FreeMemory = GDPA(dev, vkFreeMemory);
        dev->QueueSubmit = GDPA(dev, vkQueueSubmit);
        dev->QueueSubmit2 = GDPA(dev, vkQueueSubmit2);
        if (!dev->QueueSubmit2)
            dev->QueueSubmit2 = (PFN_vkQueueSubmit2)dev->gdpa(dev->handle, "vkQueueSubmit2KHR");
        dev->QueuePresentKHR = GDPA(dev, vkQueuePresentKHR);
        dev->QueueWaitIdle = GDPA(dev, vkQueueWaitIdle);
        dev->DeviceWaitIdle = GDPA(dev, vkDeviceWaitIdle);
        dev->WaitForFences = GDPA(dev, vkWaitForFences);
        dev->QueueBindSparse = GDPA(dev, vkQueueBindSparse);
        pthread_mutex_init(&dev->qmu, NULL);
        vl_device_memory_setup(in, pd, dev);
    }
    if (!dev || !keep(&devices, dev)) {
        vl_log("cannot record a Vulkan device (%s)", dev ? "too many live devices" : "out of memory");
        PFN_vkDestroyDevice destroy = (PFN_vkDestroyDevice)next_gdpa(*device, "vkDestroyDevice");
        if (destroy)
            destroy(*device, alloc);
        free(dev);
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    return VK_SUCCESS;
}

static VKAPI_ATTR void VKAPI_CALL vl_DestroyDevice(VkDevice device, const VkAllocationCallbacks *alloc)
{
    if (!device)
        return;
    struct vl_device *dev = take_out(&devices, vl_key(device));
    if (!dev)
        return;
    vl_device_submit_end(dev); /* out of the arbiter before the device goes */
    dev->DestroyDevice(device, alloc);
    const struct vl_shim *shim;
    if (dev->metered && vl_shim(&shim) == 0)
        shim->credit_owner(dev); /* memory the program never freed went with the device */
    free(dev);
}

/* ---- proc-addr ---------------------------------------------------------------------------------- */

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vl_GetDeviceProcAddr(VkDevice device, const char *name);
static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vl_GetInstanceProcAddr(VkInstance instance, const char *name);

struct named {
    const char *name;
    PFN_vkVoidFunction fn;
};

#define F(name, fn) {name, (PFN_vkVoidFunction)(fn)}
static const struct named device_fns[] = {
    F("vkGetDeviceProcAddr", vl_GetDeviceProcAddr),
    F("vkDestroyDevice", vl_DestroyDevice),
    F("vkAllocateMemory", vl_AllocateMemory),
    F("vkFreeMemory", vl_FreeMemory),
    F("vkQueueSubmit", vl_QueueSubmit),
    F("vkQueueSubmit2", vl_QueueSubmit2),
    F("vkQueueSubmit2KHR", vl_QueueSubmit2),
    F("vkQueuePresentKHR", vl_QueuePresentKHR),
    F("vkQueueWaitIdle", vl_QueueWaitIdle),
    F("vkDeviceWaitIdle", vl_DeviceWaitIdle),
    F("vkWaitForFences", vl_WaitForFences),
    F("vkQueueBindSparse", vl_QueueBindSparse),
};
static const struct named instance_fns[] = {
    F("vkGetInstanceProcAddr", vl_GetInstanceProcAddr),
    F("vkCreateInstance", vl_CreateInstance),
    F("vkDestroyInstance", vl_DestroyInstance),
    F("vkEnumeratePhysicalDevices", vl_EnumeratePhysicalDevices),
    F("vkEnumeratePhysicalDeviceGroups", vl_EnumeratePhysicalDeviceGroups),
    F("vkEnumeratePhysicalDeviceGroupsKHR", vl_EnumeratePhysicalDeviceGroups),
    F("vkGetPhysicalDeviceMemoryProperties", vl_GetPhysicalDeviceMemoryProperties),
    F("vkGetPhysicalDeviceMemoryProperties2", vl_GetPhysicalDeviceMemoryProperties2),
    F("vkGetPhysicalDeviceProperties2", vl_GetPhysicalDeviceProperties2),
    F("vkGetPhysicalDeviceProperties2KHR", vl_GetPhysicalDeviceProperties2),
    F("vkGetPhysicalDeviceMemoryProperties2KHR", vl_GetPhysicalDeviceMemoryProperties2),
    F("vkCreateDevice", vl_CreateDevice),
};
#undef F

static PFN_vkVoidFunction ours(const struct named *table, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].fn;
    return NULL;
}

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vl_GetDeviceProcAddr(VkDevice device, const char *name)
{
    if (!name)
        return NULL;
    struct vl_device *dev = vl_device_of(device);
    PFN_vkVoidFunction next = dev ? dev->gdpa(device, name) : NULL;
    PFN_vkVoidFunction fn = ours(device_fns, sizeof(device_fns) / sizeof(device_fns[0]), name);
    /* Ours only where the device has the function at all (vkQueueSubmit2 needs 1.3 or its
     * extension, vkQueuePresentKHR a swapchain): never a function the program was not given. */
    return fn && (next || !dev) ? fn : next;
}

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vl_GetInstanceProcAddr(VkInstance instance, const char *name)
{
    if (!name)
        return NULL;
    PFN_vkVoidFunction fn = ours(instance_fns, sizeof(instance_fns) / sizeof(instance_fns[0]), name);
    if (!fn)
        fn = ours(device_fns, sizeof(device_fns) / sizeof(device_fns[0]), name);
    if (fn)
        return fn;
    struct vl_instance *in = vl_instance_of(instance);
    return in ? in->gipa(instance, name) : NULL;
}

VL_EXPORT VKAPI_ATTR VkResult VKAPI_CALL vkNegotiateLoaderLayerInterfaceVersion(VkNegotiateLayerInterface *v)
{
    if (!v || v->sType != LAYER_NEGOTIATE_INTERFACE_STRUCT || v->loaderLayerInterfaceVersion < 2)
        return VK_ERROR_INITIALIZATION_FAILED;
    v->loaderLayerInterfaceVersion = 2;
    v->pfnGetInstanceProcAddr = vl_GetInstanceProcAddr;
    v->pfnGetDeviceProcAddr = vl_GetDeviceProcAddr;
    v->pfnGetPhysicalDeviceProcAddr = NULL;
    return VK_SUCCESS;
}
