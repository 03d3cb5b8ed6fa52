/*
 * Queue submissions go through the GPU's arbiter, as kernel launches do: a tenant's Vulkan work
 * waits for the GPU's token, is held to the tenant's compute share, policy and class, and an
 * online tenant's request preempts an offline one at its next submission (the shim's arbiter,
 * docs/design/arbitration.md).  One process is one client, whichever API it uses.
 *
 * The arbiter hands the token on only after the holder's work is done (an exclusive hold): its
 * drain, on whichever thread releases, waits idle each queue the hold submitted to.  A queue's
 * host access must be externally synchronised, so every queue call the layer sees (submit,
 * submit2, present, wait idle, bind sparse) takes the device's queue lock, and so does the
 * drain; the release waits for every submission between enter and exit first, so a drain and a
 * submission never wait for each other.  (A fence of the layer's own behind each submission
 * would avoid the lock, but lavapipe charges a queue-thread hand-off, about 1 µs, for each.)
 * Queue calls the layer does not see (debug labels) must not run concurrently with a drain.  A
 * hold's charge is the time it held the card, its Vulkan work's end included (no GPU
 * timestamps yet).
 *
 * vkQueuePresentKHR takes the token too (its presentation work).
 */
#include "layer.h"

#include <stdlib.h>
#include <string.h>

/* Under qmu: queue is among those the drain waits for. */
static void note_queue(struct vl_device *dev, VkQueue queue)
{
    for (int i = 0; i < dev->nqueues; i++)
        if (dev->queues[i] == queue)
            return;
    VkQueue *grown = realloc(dev->queues, (size_t)(dev->nqueues + 1) * sizeof(*grown));
    if (!grown) {
        dev->QueueWaitIdle(queue); /* cannot remember it: its work is waited for now */
        return;
    }
    dev->queues = grown;
    dev->queues[dev->nqueues++] = queue;
}

/* The arbiter's drain: the work of every queue it submitted to is done.  Every host access to
 * those queues that the layer sees takes qmu, so waiting on them here keeps the queues'
 * external synchronisation (the drain never runs while a submission is between enter and exit). */
static void drain(void *arg)
{
    struct vl_device *dev = arg;
    pthread_mutex_lock(&dev->qmu);
    for (int i = 0; i < dev->nqueues; i++)
        dev->QueueWaitIdle(dev->queues[i]);
    dev->nqueues = 0;
    pthread_mutex_unlock(&dev->qmu);
}

/* The token for a submission to dev: 0 with *gate (NULL: not arbitrated), or a refusal. */
static VkResult enter(struct vl_device *dev, const struct vl_shim **shim, void **gate)
{
    *gate = NULL;
    if (!dev->metered || vl_shim(shim) < 0)
        return VK_SUCCESS;
    if ((*shim)->arb_enter(dev->uuid, drain, dev, &dev->slot, gate) == 0)
        return VK_SUCCESS;
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        vl_log("the GPU's arbiter refused this tenant's work (its configuration is broken): VK_ERROR_DEVICE_LOST");
    return VK_ERROR_DEVICE_LOST;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                              VkFence fence)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue); /* a queue shares its device's key */
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    void *gate;
    VkResult r = enter(dev, &shim, &gate);
    if (r != VK_SUCCESS)
        return r;
    pthread_mutex_lock(&dev->qmu);
    r = dev->QueueSubmit(queue, count, submits, fence);
    if (gate && r == VK_SUCCESS)
        note_queue(dev, queue);
    pthread_mutex_unlock(&dev->qmu);
    if (gate)
        shim->arb_exit(gate);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit2(VkQueue queue, uint32_t count, const VkSubmitInfo2 *submits,
                                               VkFence fence)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev || !dev->QueueSubmit2)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    void *gate;
    VkResult r = enter(dev, &shim, &gate);
    if (r != VK_SUCCESS)
        return r;
    pthread_mutex_lock(&dev->qmu);
    r = dev->QueueSubmit2(queue, count, submits, fence);
    if (gate && r == VK_SUCCESS)
        note_queue(dev, queue);
    pthread_mutex_unlock(&dev->qmu);
    if (gate)
        shim->arb_exit(gate);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueuePresentKHR(VkQueue queue, const VkPresentInfoKHR *info)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev || !dev->QueuePresentKHR)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    void *gate;
    VkResult r = enter(dev, &shim, &gate);
    if (r != VK_SUCCESS)
        return r;
    pthread_mutex_lock(&dev->qmu);
    r = dev->QueuePresentKHR(queue, info);
    pthread_mutex_unlock(&dev->qmu);
    if (gate)
        shim->arb_exit(gate);
    return r;
}

/* The program's own waits and sparse binds: under qmu, as the drain's waits are. */
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueWaitIdle(VkQueue queue)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    pthread_mutex_lock(&dev->qmu);
    VkResult r = dev->QueueWaitIdle(queue);
    pthread_mutex_unlock(&dev->qmu);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueueBindSparse(VkQueue queue, uint32_t count, const VkBindSparseInfo *binds,
                                                  VkFence fence)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    pthread_mutex_lock(&dev->qmu);
    VkResult r = dev->QueueBindSparse(queue, count, binds, fence);
    pthread_mutex_unlock(&dev->qmu);
    return r;
}

void vl_device_submit_end(struct vl_device *dev)
{
    const struct vl_shim *shim;
    if (dev->metered && vl_shim(&shim) == 0 && shim->state() == 1)
        shim->arb_forget(&dev->slot, drain, dev);
    free(dev->queues);
    dev->queues = NULL;
    dev->nqueues = 0;
}
