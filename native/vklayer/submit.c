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
 * Queue calls the layer does not see (debug labels) must not run concurrently with a drain.
 *
 * A hold is charged the time it held the card, less the idle time after a wait of the program's
 * that covered all the hold's Vulkan work (a fence of each queue's latest submission, the queue
 * or the device idle) until its next submission: the time its work ran, up to the wait's
 * lateness, as the CUDA path leaves out the idle time after a sync.  (No GPU timestamps yet.)
 *
 * vkQueuePresentKHR takes the token too (its presentation work).
 */
#include "layer.h"

#include <stdlib.h>
#include <string.h>

struct vl_queue {
    VkQueue queue;
    VkFence last_fence; /* the program's fence of its latest submission there, or none */
};

/* Under qmu: queue is among those the drain waits for; fence, the program's, signals when its
 * latest submission is done (VK_NULL_HANDLE: none). */
static void note_queue(struct vl_device *dev, VkQueue queue, VkFence fence)
{
    for (int i = 0; i < dev->nqueues; i++) {
        if (dev->queues[i].queue == queue) {
            dev->queues[i].last_fence = fence;
            return;
        }
    }
    struct vl_queue *grown = realloc(dev->queues, (size_t)(dev->nqueues + 1) * sizeof(*grown));
    if (!grown) {
        dev->QueueWaitIdle(queue); /* cannot remember it: its work is waited for now */
        return;
    }
    dev->queues = grown;
    dev->queues[dev->nqueues++] = (struct vl_queue){queue, fence};
}

/* Under qmu: the hold's queues are only `queue` (VK_NULL_HANDLE: any), or every queue's latest
 * submission signals one of fences: waiting for it covered all the hold's Vulkan work. */
static bool covers(const struct vl_device *dev, VkQueue queue, uint32_t nfences, const VkFence *fences)
{
    for (int i = 0; i < dev->nqueues; i++) {
        if (queue != VK_NULL_HANDLE) {
            if (dev->queues[i].queue != queue)
                return false;
            continue;
        }
        bool found = false;
        for (uint32_t j = 0; j < nfences && !found; j++)
            found = dev->queues[i].last_fence != VK_NULL_HANDLE && fences[j] == dev->queues[i].last_fence;
        if (!found)
            return false;
    }
    return true;
}

/* The arbiter's drain: the work of every queue it submitted to is done.  Every host access to
 * those queues that the layer sees takes qmu, so waiting on them here keeps the queues'
 * external synchronisation (the drain never runs while a submission is between enter and exit). */
static void drain(void *arg)
{
    struct vl_device *dev = arg;
    pthread_mutex_lock(&dev->qmu);
    for (int i = 0; i < dev->nqueues; i++)
        dev->QueueWaitIdle(dev->queues[i].queue);
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

/* One submission, whichever entry point: the token, the call under the queue lock, the queue
 * noted for the drain when arbitrated (a presentation's work is waited for with the queue's). */
enum submission_kind { SUBMIT, SUBMIT2, PRESENT };

struct submission {
    VkQueue queue;
    uint32_t count;
    const void *submits; /* VkSubmitInfo, VkSubmitInfo2 or (PRESENT) VkPresentInfoKHR */
    VkFence fence;
    enum submission_kind kind;
};

static VkResult submit(struct vl_device *dev, const struct submission *s)
{
    const struct vl_shim *shim;
    void *gate;
    VkResult r = enter(dev, &shim, &gate);
    if (r != VK_SUCCESS)
        return r;
    pthread_mutex_lock(&dev->qmu);
    switch (s->kind) {
    case SUBMIT:
        r = dev->QueueSubmit(s->queue, s->count, s->submits, s->fence);
        break;
    case SUBMIT2:
        r = dev->QueueSubmit2(s->queue, s->count, s->submits, s->fence);
        break;
    case PRESENT:
        r = dev->QueuePresentKHR(s->queue, s->submits);
        break;
    }
    if (gate && r == VK_SUCCESS && s->kind != PRESENT)
        note_queue(dev, s->queue, s->fence);
    pthread_mutex_unlock(&dev->qmu);
    if (gate)
        shim->arb_exit(gate);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                              VkFence fence)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue); /* a queue shares its device's key */
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    return submit(dev, &(struct submission){queue, count, submits, fence, SUBMIT});
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueueSubmit2(VkQueue queue, uint32_t count, const VkSubmitInfo2 *submits,
                                               VkFence fence)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev || !dev->QueueSubmit2)
        return VK_ERROR_DEVICE_LOST;
    return submit(dev, &(struct submission){queue, count, submits, fence, SUBMIT2});
}

VKAPI_ATTR VkResult VKAPI_CALL vl_QueuePresentKHR(VkQueue queue, const VkPresentInfoKHR *info)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev || !dev->QueuePresentKHR)
        return VK_ERROR_DEVICE_LOST;
    return submit(dev, &(struct submission){queue, 0, info, VK_NULL_HANDLE, PRESENT});
}

/* The program's own waits: not idle while they last, and idle after one that covered all the
 * hold's Vulkan work, until the next submission (the charge leaves that out). */
static bool wait_begin(struct vl_device *dev, const struct vl_shim **shim, struct sharegpu_arb_wait *w)
{
    w->gpu = NULL;
    if (!dev->metered || vl_shim(shim) < 0 || (*shim)->state() != 1)
        return false;
    (*shim)->wait_begin(&dev->slot, w);
    return w->gpu != NULL;
}

/* Queue waits and sparse binds are queue accesses: under qmu, as the drain's waits are. */
VKAPI_ATTR VkResult VKAPI_CALL vl_QueueWaitIdle(VkQueue queue)
{
    struct vl_device *dev = vl_device_of((VkDevice)(void *)queue);
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    struct sharegpu_arb_wait w;
    bool arbitrated = wait_begin(dev, &shim, &w);
    pthread_mutex_lock(&dev->qmu);
    VkResult r = dev->QueueWaitIdle(queue);
    bool covered = r == VK_SUCCESS && covers(dev, queue, 0, NULL);
    pthread_mutex_unlock(&dev->qmu);
    if (arbitrated)
        shim->wait_end(&w, covered, drain, dev);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_DeviceWaitIdle(VkDevice device)
{
    struct vl_device *dev = vl_device_of(device);
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    struct sharegpu_arb_wait w;
    bool arbitrated = wait_begin(dev, &shim, &w);
    pthread_mutex_lock(&dev->qmu); /* every queue of the device is accessed */
    VkResult r = dev->DeviceWaitIdle(device);
    pthread_mutex_unlock(&dev->qmu);
    if (arbitrated)
        shim->wait_end(&w, r == VK_SUCCESS, drain, dev);
    return r;
}

VKAPI_ATTR VkResult VKAPI_CALL vl_WaitForFences(VkDevice device, uint32_t count, const VkFence *fences,
                                                VkBool32 all, uint64_t timeout)
{
    struct vl_device *dev = vl_device_of(device);
    if (!dev)
        return VK_ERROR_DEVICE_LOST;
    const struct vl_shim *shim;
    struct sharegpu_arb_wait w;
    bool arbitrated = wait_begin(dev, &shim, &w);
    VkResult r = dev->WaitForFences(device, count, fences, all, timeout);
    if (arbitrated) {
        bool covered = false;
        if (r == VK_SUCCESS && (all || count == 1)) {
            pthread_mutex_lock(&dev->qmu);
            covered = covers(dev, VK_NULL_HANDLE, count, fences);
            pthread_mutex_unlock(&dev->qmu);
        }
        shim->wait_end(&w, covered, drain, dev);
    }
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
