/*
 * Fatbin containers: what nvcc embeds in every program (and `fatbinary` writes), a header and
 * then entries back to back, each an entry header and a payload (a PTX text or an ELF cubin for
 * one architecture, possibly compressed).  Used by the shim (the names a fatbin's entries can
 * declare, hooks_module.c) and by the simulated driver (the entry a driver would load and its
 * variables, simgpu/cuda/fatbin.c), like sharegpu/cubin.h.
 *
 * The layout, as observed in CUDA 13's `fatbinary` and `nvcc -fatbin` output (little-endian):
 *
 *   container, 16 bytes: u32 magic 0xBA55ED50, u16 version (1), u16 header size (16), u64 fat
 *       size: the bytes of entries that follow the header.
 *   entry header, 64 bytes or more (64: an uncompressed sm_90 ELF; 80: a PTX; 112: an sm_100
 *       ELF; more when a file name or options sit inside it):
 *       +0  u16 kind: 1 PTX, 2 ELF cubin, 8 LTO IR      +2  u16 (0x0101)
 *       +4  u32 entry header size                        +8  u64 payload size (padded to 8)
 *       +16 u32 compressed size (exact bytes)            +20 u32
 *       +24 u16, u16 versions                            +28 u32 arch (90: sm_90)
 *       +32 u32, u32 name offset and length              +40 u64 flags: 0x8000 zstd
 *       +48 u64                                               (older toolkits 0x2000: LZ4)
 *       +56 u64 decompressed size (exact bytes)
 *     The payload starts at the entry + its header size; the next entry after the payload.
 *   wrapper (`__fatBinC_Wrapper_t`, what a program registers, also taken by
 *       cuModuleLoadFatBinary and cuModuleLoadData): u32 magic 0x466243B1, u32 version (1; 2
 *       for device-linked code), the fatbin's address, a file name (version 2: prelinked fatbins).
 *
 * Every offset and size is checked against the container's end (its header + fat size, itself
 * checked against what the caller may read): a container of another version, an entry whose
 * header or payload runs past the end, an entry header under 64 bytes, bytes after the last
 * entry that are no whole entry, a compressed size of 0 or past the payload, both compressions
 * at once, a decompressed size of 0, or a payload or decompressed size past
 * SG_FATBIN_UNPACK_MAX make it SG_FATBIN_MALFORMED; a payload that does not decompress to
 * exactly its stated size is SG_FATBIN_CORRUPT.
 *
 * Decompression is the system's libzstd.so.1 (liblz4.so.1 for LZ4), opened at first need, the
 * copy beside the calling library's own file first (so an install can ship one), then by the
 * dynamic linker's search: no link-time dependency, no header needed (the three entry points,
 * stable for a decade, are declared here).  A library that cannot be opened:
 * SG_FATBIN_NO_CODEC.
 */
#ifndef SHAREGPU_FATBIN_H
#define SHAREGPU_FATBIN_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SG_FATBIN_MAGIC 0xBA55ED50u
#define SG_FATBIN_WRAPPER_MAGIC 0x466243B1u
#define SG_FATBIN_HEADER 16u
#define SG_FATBIN_WRAPPER 24u
#define SG_FATBIN_ENTRY_MIN 64u
#define SG_FATBIN_KIND_PTX 1u
#define SG_FATBIN_KIND_ELF 2u
#define SG_FATBIN_KIND_LTOIR 8u /* NVVM IR for nvJitLink: no driver loads it as a module */
#define SG_FATBIN_ZSTD 0x8000u
#define SG_FATBIN_LZ4 0x2000u
#define SG_FATBIN_UNPACK_MAX (1ull << 30) /* an entry stated to unpack to more is malformed */
#define SG_FATBIN_PAD 8u                  /* zero bytes after every unpacked payload */

enum {
    SG_FATBIN_OK = 0,
    SG_FATBIN_MALFORMED = -1, /* sizes or offsets that do not fit the container */
    SG_FATBIN_CORRUPT = -2,   /* a payload that does not decompress to its stated size */
    SG_FATBIN_NO_CODEC = -3,  /* libzstd.so.1 / liblz4.so.1 cannot be opened */
    SG_FATBIN_NOMEM = -4,
};

struct sg_fatbin_entry {
    unsigned kind, arch;
    uint64_t flags;
    const unsigned char *stored; /* the payload's bytes inside the container */
    uint64_t stored_size;        /* compressed: its exact compressed size */
    uint64_t size;               /* once unpacked */
};

struct sg_fatbin_iter {
    const unsigned char *at, *end;
};

/* The wrapper's fields (read with memcpy: the caller's bytes may be unaligned). */
struct sg_fatbin_wrapper {
    uint32_t magic, version;
    const void *data;
    const void *filename_or_fatbins;
};

static inline uint32_t sg_fatbin_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t sg_fatbin_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint16_t sg_fatbin_u16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* How many bytes a container says it holds (header size + fat size), from its first 16 bytes;
 * SG_FATBIN_MALFORMED for another version, a header under 16 bytes or a sum that overflows. */
static inline int sg_fatbin_extent(const void *container, uint64_t *total)
{
    const unsigned char *p = (const unsigned char *)container;
    uint16_t header = sg_fatbin_u16(p + 6);
    if (sg_fatbin_u32(p) != SG_FATBIN_MAGIC || sg_fatbin_u16(p + 4) != 1 ||
        header < SG_FATBIN_HEADER ||
        __builtin_add_overflow((uint64_t)header, sg_fatbin_u64(p + 8), total))
        return SG_FATBIN_MALFORMED;
    return SG_FATBIN_OK;
}

/* Starts reading the container in the first `limit` bytes of image (limit >= 16). */
static inline int sg_fatbin_open(struct sg_fatbin_iter *it, const void *image, uint64_t limit)
{
    uint64_t total;
    if (limit < SG_FATBIN_HEADER || sg_fatbin_extent(image, &total) != SG_FATBIN_OK || total > limit)
        return SG_FATBIN_MALFORMED;
    const unsigned char *p = (const unsigned char *)image;
    it->at = p + sg_fatbin_u16(p + 6);
    it->end = p + total;
    return SG_FATBIN_OK;
}

/* The next entry: 1, 0 after the last one, or SG_FATBIN_MALFORMED. */
static inline int sg_fatbin_next(struct sg_fatbin_iter *it, struct sg_fatbin_entry *e)
{
    uint64_t left = (uint64_t)(it->end - it->at);
    if (left == 0)
        return 0;
    if (left < SG_FATBIN_ENTRY_MIN)
        return SG_FATBIN_MALFORMED;
    const unsigned char *h = it->at;
    uint64_t header = sg_fatbin_u32(h + 4), payload = sg_fatbin_u64(h + 8);
    if (header < SG_FATBIN_ENTRY_MIN || header > left || payload > left - header)
        return SG_FATBIN_MALFORMED;
    e->kind = sg_fatbin_u16(h);
    e->arch = sg_fatbin_u32(h + 28);
    e->flags = sg_fatbin_u64(h + 40);
    e->stored = h + header;
    e->stored_size = payload;
    e->size = payload;
    uint64_t packed = e->flags & (SG_FATBIN_ZSTD | SG_FATBIN_LZ4);
    if (packed == (SG_FATBIN_ZSTD | SG_FATBIN_LZ4))
        return SG_FATBIN_MALFORMED;
    if (packed) {
        e->stored_size = sg_fatbin_u32(h + 16);
        e->size = sg_fatbin_u64(h + 56);
        if (e->stored_size == 0 || e->stored_size > payload || e->size == 0)
            return SG_FATBIN_MALFORMED;
    }
    if (e->size > SG_FATBIN_UNPACK_MAX || e->stored_size > SG_FATBIN_UNPACK_MAX)
        return SG_FATBIN_MALFORMED;
    it->at = h + header + payload;
    return 1;
}

/* ---- decompression --------------------------------------------------------------------------- */

typedef size_t (*sg_zstd_decompress_fn)(void *dst, size_t capacity, const void *src, size_t size);
typedef unsigned (*sg_zstd_is_error_fn)(size_t code);
typedef int (*sg_lz4_decompress_fn)(const char *src, char *dst, int size, int capacity);

/* soname beside the file of the library that holds `self` (an address inside it), else as the
 * dynamic linker finds it; NULL when neither opens. */
static inline void *sg_fatbin_dlopen(const char *soname, const void *self)
{
    Dl_info info;
    if (self && dladdr(self, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        size_t dir = slash ? (size_t)(slash - info.dli_fname) + 1 : 0, name = strlen(soname);
        char path[4096];
        if (dir && dir + name < sizeof path) {
            memcpy(path, info.dli_fname, dir);
            memcpy(path + dir, soname, name + 1);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h)
                return h;
        }
    }
    return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

/* The codec's functions, each library opened once (a race opens it twice: reference-counted). */
static inline int sg_fatbin_zstd(const void *self, sg_zstd_decompress_fn *dec,
                                 sg_zstd_is_error_fn *err)
{
    static sg_zstd_decompress_fn dec_;
    static sg_zstd_is_error_fn err_;
    *dec = __atomic_load_n(&dec_, __ATOMIC_ACQUIRE);
    if (!*dec) {
        void *h = sg_fatbin_dlopen("libzstd.so.1", self);
        sg_zstd_is_error_fn e = h ? (sg_zstd_is_error_fn)dlsym(h, "ZSTD_isError") : NULL;
        sg_zstd_decompress_fn d = h ? (sg_zstd_decompress_fn)dlsym(h, "ZSTD_decompress") : NULL;
        if (!e || !d)
            return SG_FATBIN_NO_CODEC; /* a handle that lacks them stays open: harmless */
        __atomic_store_n(&err_, e, __ATOMIC_RELAXED);
        __atomic_store_n(&dec_, d, __ATOMIC_RELEASE);
        *dec = d;
    }
    *err = __atomic_load_n(&err_, __ATOMIC_RELAXED);
    return SG_FATBIN_OK;
}

static inline int sg_fatbin_lz4(const void *self, sg_lz4_decompress_fn *dec)
{
    static sg_lz4_decompress_fn dec_;
    *dec = __atomic_load_n(&dec_, __ATOMIC_ACQUIRE);
    if (!*dec) {
        void *h = sg_fatbin_dlopen("liblz4.so.1", self);
        *dec = h ? (sg_lz4_decompress_fn)dlsym(h, "LZ4_decompress_safe") : NULL;
        if (!*dec)
            return SG_FATBIN_NO_CODEC;
        __atomic_store_n(&dec_, *dec, __ATOMIC_RELEASE);
    }
    return SG_FATBIN_OK;
}

/* The entry's payload, unpacked into *out (malloc'd: e->size bytes, then SG_FATBIN_PAD zero
 * bytes, so a PTX text ends and an ELF is aligned); SG_FATBIN_OK or an error. */
static inline int sg_fatbin_unpack(const struct sg_fatbin_entry *e, const void *self,
                                   unsigned char **out)
{
    *out = NULL;
    unsigned char *buf = (unsigned char *)malloc((size_t)e->size + SG_FATBIN_PAD);
    if (!buf)
        return SG_FATBIN_NOMEM;
    memset(buf + e->size, 0, SG_FATBIN_PAD);
    int rc = SG_FATBIN_OK;
    if (e->flags & SG_FATBIN_ZSTD) {
        sg_zstd_decompress_fn dec;
        sg_zstd_is_error_fn err;
        rc = sg_fatbin_zstd(self, &dec, &err);
        if (rc == SG_FATBIN_OK) {
            size_t n = dec(buf, (size_t)e->size, e->stored, (size_t)e->stored_size);
            if (err(n) || n != e->size)
                rc = SG_FATBIN_CORRUPT;
        }
    } else if (e->flags & SG_FATBIN_LZ4) {
        sg_lz4_decompress_fn dec;
        rc = sg_fatbin_lz4(self, &dec);
        /* sizes fit an int: both are at most SG_FATBIN_UNPACK_MAX (and a u32) */
        if (rc == SG_FATBIN_OK &&
            dec((const char *)e->stored, (char *)buf, (int)e->stored_size, (int)e->size) != (int)e->size)
            rc = SG_FATBIN_CORRUPT;
    } else {
        memcpy(buf, e->stored, (size_t)e->size);
    }
    if (rc != SG_FATBIN_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    return SG_FATBIN_OK;
}

/* A PTX payload's text: the bytes up to its first NUL, with nothing but NULs after it (a text
 * that goes on past a NUL could be read further by a driver than by a scan stopping there). */
static inline int sg_fatbin_ptx_ok(const unsigned char *p, uint64_t size)
{
    const unsigned char *nul = (const unsigned char *)memchr(p, 0, (size_t)size);
    if (!nul)
        return 1;
    for (const unsigned char *q = nul; q < p + size; q++)
        if (*q)
            return 0;
    return 1;
}

#endif /* SHAREGPU_FATBIN_H */
