/*
 * The names a fatbin container can declare (modnames.h): the union over its entries, each
 * unpacked (sharegpu/fatbin.h: bounds, zstd or LZ4 through the system's libraries) and read as
 * a plain image is: an ELF (whatever the entry's kind says) through the cubin scan, a PTX text
 * through the identifier scan, refused with a preprocessor line.  Every entry is read, not only
 * the one a driver would pick for this device: the union is a superset of what it places, and
 * the sizes are the driver's own (hooks_module.c), so a name of an entry it did not load costs
 * one failed lookup.
 *
 * Refusals (the load fails before the driver sees the image, nothing is placed): a container
 * whose layout does not fit, an entry that does not decompress to its stated size, an ELF the
 * scan cannot read in full, a PTX text with bytes past a NUL: CUDA_ERROR_INVALID_IMAGE (a
 * driver would not load those either).  A compressed entry whose library cannot be opened, PTX
 * with a preprocessor line: CUDA_ERROR_NOT_SUPPORTED (a driver might load it; its globals would
 * be uncharged).  The first decompression refusals of a process say why on stderr, once each.
 * Skipped: entries of LTO IR (kind 8: NVVM IR, the input of nvJitLink, which no driver loads as
 * a module, and which CUDA 13 stores encrypted), and an entry of a kind the shim does not know
 * that holds no ELF, with one line on stderr.  Such kinds are reported in NVIDIA's own libraries
 * (0x10, 0x40 in cuBLAS), and refusing them would fail those libraries' loads under the shim on
 * a real GPU; if a driver places globals from one, the agent's reconciler counts them (NVML),
 * as for the other gaps the threat model lists.
 */
#include "modnames.h"
#include "sharegpu/cubin.h"
#include "sharegpu/fatbin.h"

#include <stdlib.h>

static int no_zstd_logged, no_lz4_logged, corrupt_logged, kind_logged;

/* The names one unpacked entry can declare. */
static CUresult entry_names(struct sg_names *set, const struct sg_fatbin_entry *e,
                            const unsigned char *p)
{
    if (e->size >= 4 && sg_is_elf(p))
        return sg_names_cubin(set, p, e->size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
    if (e->kind == SG_FATBIN_KIND_ELF)
        return CUDA_ERROR_INVALID_IMAGE; /* an ELF entry that holds no ELF */
    if (e->kind != SG_FATBIN_KIND_PTX) {
        sg_log_once(&kind_logged, "a fatbin entry of kind %u (not PTX, not an ELF) is not read for "
                                  "its globals: what a driver places from it is counted by the "
                                  "agent's reconciler, not admitted here",
                    e->kind);
        return CUDA_SUCCESS;
    }
    if (!sg_fatbin_ptx_ok(p, e->size))
        return CUDA_ERROR_INVALID_IMAGE;
    if (sg_ptx_has_preprocessor_line((const char *)p))
        return CUDA_ERROR_NOT_SUPPORTED;
    sg_names_ptx(set, (const char *)p);
    return CUDA_SUCCESS;
}

static CUresult unpack_refused(const struct sg_fatbin_entry *e, int rc)
{
    bool zstd = e->flags & SG_FATBIN_ZSTD;
    switch (rc) {
    case SG_FATBIN_NO_CODEC:
        sg_log_once(zstd ? &no_zstd_logged : &no_lz4_logged,
                    "%s cannot be opened, so a %s-compressed fatbin entry cannot be read for its "
                    "globals: the load is refused (CUDA_ERROR_NOT_SUPPORTED); install it, or put "
                    "it beside libsharegpu.so",
                    zstd ? "libzstd.so.1" : "liblz4.so.1", zstd ? "zstd" : "LZ4");
        return CUDA_ERROR_NOT_SUPPORTED;
    case SG_FATBIN_CORRUPT:
        sg_log_once(&corrupt_logged, "a %s-compressed fatbin entry does not decompress to its "
                                     "stated size: the load is refused (CUDA_ERROR_INVALID_IMAGE)",
                    zstd ? "zstd" : "LZ4");
        return CUDA_ERROR_INVALID_IMAGE;
    case SG_FATBIN_NOMEM:
        return CUDA_ERROR_OUT_OF_MEMORY;
    default:
        return CUDA_ERROR_INVALID_IMAGE;
    }
}

CUresult sg_names_fatbin(struct sg_names *set, const void *container, uint64_t length)
{
    struct sg_fatbin_iter it;
    if (sg_fatbin_open(&it, container, length) != SG_FATBIN_OK)
        return CUDA_ERROR_INVALID_IMAGE;
    struct sg_fatbin_entry e;
    int more;
    while ((more = sg_fatbin_next(&it, &e)) > 0) {
        if (e.kind == SG_FATBIN_KIND_LTOIR)
            continue;
        unsigned char *p;
        int rc = sg_fatbin_unpack(&e, (const void *)&sg_names_fatbin, &p);
        if (rc != SG_FATBIN_OK)
            return unpack_refused(&e, rc);
        CUresult res = entry_names(set, &e, p);
        free(p);
        if (res != CUDA_SUCCESS)
            return res;
    }
    return more < 0 ? CUDA_ERROR_INVALID_IMAGE : CUDA_SUCCESS;
}
