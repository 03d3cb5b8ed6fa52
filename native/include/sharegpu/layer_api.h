/*
 * What the shim (libsharegpu.so) offers the process's other API layer, the Vulkan layer
 * (libsharegpu_vk.so), which finds these functions with dlsym: one ledger and one arbiter client
 * per process, whichever API the process uses (native/shim/layer_api.c, docs/vulkan.md).
 *
 * Version 1.  A layer that finds another version refuses to run against it.
 */
#ifndef SHAREGPU_LAYER_API_H
#define SHAREGPU_LAYER_API_H

#include <stdint.h>

#define SHAREGPU_LAYER_API_VERSION 1

/* The layer's place in the GPU's arbiter, one per device object: kept by the layer, zeroed at
 * first, read and written by the shim only (atomically: several threads may submit at once). */
struct sharegpu_arb_slot {
    void *gpu;     /* the shim's record of the GPU, once known */
    uint64_t hold; /* the hold this slot's drain is registered for */
    uint64_t gen;  /* the limits generation when the GPU was found native (not arbitrated) */
};

/* Waits until every piece of work the layer submitted to the GPU through this slot is done
 * (called by the shim when it hands the GPU on, on any thread, never while a submission of the
 * slot is between enter and exit). */
typedef void (*sharegpu_drain_fn)(void *arg);

typedef int (*sharegpu_layer_api_version_fn)(void);
typedef int (*sharegpu_ledger_state_fn)(void);
typedef int (*sharegpu_ledger_device_fn)(const uint8_t uuid[16], uint64_t *cap, uint64_t *used);
typedef int (*sharegpu_ledger_charge_fn)(const uint8_t uuid[16], uint64_t bytes, uint64_t key,
                                         const void *owner);
typedef int (*sharegpu_ledger_rekey_fn)(uint64_t old_key, uint64_t new_key);
typedef void (*sharegpu_ledger_credit_fn)(uint64_t key);
typedef void (*sharegpu_ledger_credit_owner_fn)(const void *owner);
/* Before work is submitted to the GPU of uuid: waits for the GPU's token as a kernel launch does
 * (policies, shares, classes); drain(arg) is then waited for when the token moves on.  0: go on,
 * *gate to be passed to sharegpu_arb_exit after the submission (NULL: not arbitrated); -1:
 * refused (the tenant's configuration is broken). */
typedef int (*sharegpu_arb_enter_fn)(const uint8_t uuid[16], sharegpu_drain_fn drain, void *arg,
                                     struct sharegpu_arb_slot *slot, void **gate);
typedef void (*sharegpu_arb_exit_fn)(void *gate);
/* Around the program's own wait for its work (vkWaitForFences, vkQueueWaitIdle, vkDeviceWaitIdle):
 * while it waits the holder is not idle; if the wait covered all the work submitted through the
 * slot in the current hold (covered != 0), the time until its next submission is not charged. */
struct sharegpu_arb_wait {
    void *gpu;
    uint64_t begin;
};
typedef void (*sharegpu_arb_wait_begin_fn)(struct sharegpu_arb_slot *slot, struct sharegpu_arb_wait *w);
typedef void (*sharegpu_arb_wait_end_fn)(struct sharegpu_arb_wait *w, int covered, sharegpu_drain_fn drain,
                                         void *arg);
/* The device object is going: its drain is no longer called. */
typedef void (*sharegpu_arb_forget_fn)(struct sharegpu_arb_slot *slot, sharegpu_drain_fn drain, void *arg);

#endif
