/* Stable identities derived from the GPU index alone, so every process agrees without storing them. */
#include "sim.h"

#include <stdio.h>
#include <string.h>

/* A fixed, arbitrary namespace mixed with the index (splitmix64), so UUIDs of different GPUs
 * differ from their first hex digit on, as real ones do (short CUDA_VISIBLE_DEVICES prefixes). */
static const unsigned char uuid_ns[16] = {0x5e, 0x1a, 0x9c, 0x3b, 0x7d, 0x42, 0x4f, 0x11,
                                          0x8a, 0x6e, 0x53, 0x47, 0x50, 0x55, 0x53, 0x47};

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void sim_uuid_bytes(const struct sim_config *c, unsigned idx, unsigned char out[16])
{
    if (idx == 0 && c->uuid0_set) {
        memcpy(out, c->uuid0, 16);
        return;
    }
    for (unsigned half = 0; half < 2; half++) {
        uint64_t m = splitmix64((uint64_t)idx * 2u + half);
        for (unsigned i = 0; i < 8; i++)
            out[half * 8 + i] = uuid_ns[half * 8 + i] ^ (unsigned char)(m >> (8 * i));
    }
}

void sim_uuid_string(const struct sim_config *c, unsigned idx, char out[SIM_UUID_STR_LEN])
{
    unsigned char b[16];
    sim_uuid_bytes(c, idx, b);
    snprintf(out, SIM_UUID_STR_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

/* Bus numbers of a typical 8-GPU HGX board. */
static const unsigned char pci_bus[SIM_MAX_GPUS] = {0x1a, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

unsigned sim_pci_bus(unsigned idx)
{
    return idx < SIM_MAX_GPUS ? pci_bus[idx] : 0;
}

void sim_pci_bus_id(unsigned idx, char out[SIM_PCI_STR_LEN])
{
    snprintf(out, SIM_PCI_STR_LEN, "00000000:%02X:00.0", sim_pci_bus(idx) & 0xffu);
}
