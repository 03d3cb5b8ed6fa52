/*
 * Fatbins: the entry a driver loads from a fatbin container (or the fatbin a fatbin wrapper
 * points to), unpacked, for module.c to read as the image it is (sharegpu/fatbin.h: the layout,
 * its bounds, zstd and LZ4 through the system's libraries).  So a fatbin's globals are placed
 * as the chosen entry declares them: the model is never more forgiving than the driver, which
 * places them.
 *
 * The choice, as CUDA documents binary compatibility: an ELF cubin of this GPU's major compute
 * capability and a minor at most its own (the newest such), else the newest PTX of an
 * architecture at most the GPU's (the driver compiles it), else CUDA_ERROR_NO_BINARY_FOR_GPU.
 * Entries of other kinds (LTO IR, for nvJitLink) are never chosen.  Every entry's layout is
 * checked (one that does not fit: CUDA_ERROR_INVALID_IMAGE), but only the chosen one is
 * decompressed, as a driver needs no other: one that does not decompress to its stated size is
 * CUDA_ERROR_INVALID_IMAGE, a missing libzstd.so.1 / liblz4.so.1 CUDA_ERROR_NOT_SUPPORTED (the
 * model cannot tell what it would place).  A PTX entry's text ends at its first NUL (bytes
 * after one: CUDA_ERROR_INVALID_IMAGE, as the shim reads it).  A wrapper (versions 1 and 2)
 * is followed to its fatbin when it is in memory; read from a file it is
 * CUDA_ERROR_INVALID_IMAGE.
 */
#include "cu.h"
#include "sharegpu/cubin.h"
#include "sharegpu/fatbin.h"

#include <stdlib.h>
#include <string.h>

static CUresult unpack_error(int rc)
{
    switch (rc) {
    case SG_FATBIN_NO_CODEC:
        return CUDA_ERROR_NOT_SUPPORTED;
    case SG_FATBIN_NOMEM:
        return CUDA_ERROR_OUT_OF_MEMORY;
    default:
        return CUDA_ERROR_INVALID_IMAGE;
    }
}

/* The container at image, of which at most limit bytes may be read: the chosen entry unpacked
 * into *out (malloc'd, SG_FATBIN_PAD zero bytes after its *size bytes) and its kind. */
static CUresult pick(const void *image, uint64_t limit, unsigned char **out, uint64_t *size,
                     unsigned *kind)
{
    uint64_t total;
    if (limit < SG_FATBIN_HEADER || sg_fatbin_extent(image, &total) != SG_FATBIN_OK ||
        total > CU_IMAGE_IN_MEMORY)
        return CUDA_ERROR_INVALID_IMAGE;
    struct sg_fatbin_iter it;
    if (sg_fatbin_open(&it, image, limit < total ? limit : total) != SG_FATBIN_OK)
        return CUDA_ERROR_INVALID_IMAGE;
    const struct sim_config *cfg = &cu_g.st->cfg;
    unsigned dev = (unsigned)(cfg->cc_major * 10 + cfg->cc_minor);
    struct sg_fatbin_entry e, elf = {0}, ptx = {0};
    int more;
    while ((more = sg_fatbin_next(&it, &e)) > 0) {
        if (e.kind == SG_FATBIN_KIND_ELF && e.arch / 10 == dev / 10 && e.arch <= dev &&
            (!elf.kind || e.arch > elf.arch))
            elf = e;
        else if (e.kind == SG_FATBIN_KIND_PTX && e.arch <= dev && (!ptx.kind || e.arch > ptx.arch))
            ptx = e;
    }
    if (more < 0)
        return CUDA_ERROR_INVALID_IMAGE;
    const struct sg_fatbin_entry *chosen = elf.kind ? &elf : ptx.kind ? &ptx : NULL;
    if (!chosen)
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    int rc = sg_fatbin_unpack(chosen, (const void *)&cu_fatbin_entry, out);
    if (rc != SG_FATBIN_OK)
        return unpack_error(rc);
    *size = chosen->size;
    *kind = chosen->kind;
    return CUDA_SUCCESS;
}

CUresult cu_fatbin_entry(const void *image, uint64_t limit, unsigned char **out, uint64_t *size,
                         int *elf)
{
    const unsigned char *p = image;
    if (limit >= SG_FATBIN_WRAPPER && sg_fatbin_u32(p) == SG_FATBIN_WRAPPER_MAGIC) {
        struct sg_fatbin_wrapper w;
        memcpy(&w.version, p + 4, sizeof w.version);
        memcpy(&w.data, p + 8, sizeof w.data);
        if (limit != CU_IMAGE_IN_MEMORY || /* read from a file, its address means nothing */
            (w.version != 1 && w.version != 2) || !w.data ||
            sg_fatbin_u32(w.data) != SG_FATBIN_MAGIC)
            return CUDA_ERROR_INVALID_IMAGE;
        image = w.data;
        limit = CU_IMAGE_IN_MEMORY; /* the caller's memory: as far as its header says */
    }
    unsigned kind;
    CUresult r = pick(image, limit, out, size, &kind);
    if (r)
        return r;
    int bad = kind == SG_FATBIN_KIND_ELF ? *size < 4 || !sg_is_elf(*out)
                                         : !sg_fatbin_ptx_ok(*out, *size);
    if (bad) {
        free(*out);
        *out = NULL;
        return CUDA_ERROR_INVALID_IMAGE; /* an entry that is not what its kind says */
    }
    *elf = kind == SG_FATBIN_KIND_ELF;
    return CUDA_SUCCESS;
}
