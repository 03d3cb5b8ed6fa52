/*
 * Module and library globals: the `__device__` and `__constant__` variables of a module are
 * device memory the driver places when the module is loaded into the current context (and frees
 * at cuModuleUnload or with the context).  No allocation call shows it, so unhooked a module with
 * a large global array is memory past the cap.  A library (cuLibraryLoad*, how CUDA 12+
 * runtimes load every fatbin) is placed per context, at load (EAGER) or at its first use there
 * (LAZY); the hooks ask for its globals in the current context right after the load, which
 * places them there under either mode, and charge them like a module's.
 *
 * The names come from the image, the sizes from the driver (modnames.c, fatnames.c): every
 * identifier of a PTX image (a superset of its declarations' names, so no lexing difference
 * from the driver can hide one), an ELF cubin's object symbols in its `.nv.global*` and
 * `.nv.constant*` sections, and for a fatbin container (what nvcc embeds in programs; a
 * fatbin wrapper's fatbin too) the union of those over all its entries, each decompressed
 * first (zstd or LZ4, through libzstd.so.1 / liblz4.so.1; sharegpu/fatbin.h).  They are read
 * before the driver is handed the image, and an image that cannot be read in full is refused
 * then: PTX with a preprocessor line, a compressed entry without its library, an entry of an
 * unknown kind that holds no ELF (CUDA_ERROR_NOT_SUPPORTED); an ELF whose symbols cannot all
 * be read, a container whose sizes do not fit, an entry that does not decompress to its
 * stated size (CUDA_ERROR_INVALID_IMAGE).  After the real load each distinct name is asked of
 * the loaded module (cuModuleGetGlobal) or library (cuLibraryGetGlobal), so a name read
 * wrongly, or one of a fatbin entry the driver did not pick, costs one failed lookup and the
 * size is the driver's own.  The sum is admitted then (it is only known then): refused, the
 * module or library is unloaded again and the load fails with CUDA_ERROR_OUT_OF_MEMORY.
 *
 * What is checked, loaded and sized is one buffer of the shim's own: an image in memory is
 * copied first (as far as its own headers say, image_copy; a fatbin wrapper's fatbin as well,
 * and the copied wrapper pointed at the copy, image_take), so a thread that rewrites the
 * caller's buffer meanwhile changes nothing the driver or the scan reads; a file (cuModuleLoad,
 * cuLibraryLoadFromFile) is read once, here.  The copy is freed after the load
 * (CU_LIBRARY_BINARY_IS_PRESERVED, which would let the driver read it later, is withdrawn);
 * its cost is one memcpy of the image per load, and for a fatbin the decompression of every
 * entry.
 *
 * Not read: a library's placement in a context other than the one current at its load
 * (another device, a context created later, a load with no current context), and the
 * prelinked fatbins a version-2 wrapper also names (relocatable input of a link, which no
 * module load is known to place; unverified on a driver): what those take is in the agent's
 * NVML reconciliation, like the driver's own overhead.
 */
#include "modnames.h"
#include "sharegpu/cubin.h"
#include "sharegpu/fatbin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the image: copied before anything reads it ----
 *
 * The caller's buffer can change while it is read (another thread of the tenant): a driver
 * that reads one name and a scan that then reads another would leave a global uncharged.  So
 * the image is copied once, into memory of the shim's own, and everything after reads only the
 * copy: the preprocessor check, the driver (it is handed the copy) and the scan for names.  How
 * much to copy comes from the image's own headers, and those are read from the copy too: the
 * copy grows until what its own headers say fits inside it (image_extent). */

#define FATBIN_MAGIC SG_FATBIN_MAGIC
#define FATBIN_WRAPPER_MAGIC SG_FATBIN_WRAPPER_MAGIC
#define IMAGE_PAD 8 /* zero bytes after every copy: magic reads stay inside, PTX text ends */
#define IMAGE_MAX (1ull << 30) /* an ELF or fatbin whose headers say more is refused */
#define IMAGE_ROUNDS 8         /* copies of a binary image before one is found consistent */

static uint32_t magic_of(const unsigned char *p)
{
    uint32_t m;
    memcpy(&m, p, sizeof m);
    return m;
}

enum { EXTENT_DONE, EXTENT_MORE, EXTENT_BAD };

/* Extends *end to off + size (a size of 0 reaches nothing); false past IMAGE_MAX. */
static bool reach(uint64_t *end, uint64_t off, uint64_t size)
{
    uint64_t e;
    if (!size)
        return true;
    if (__builtin_add_overflow(off, size, &e) || e > IMAGE_MAX)
        return false;
    if (e > *end)
        *end = e;
    return true;
}

/* What an ELF image's headers say a reader may read: its header, the section and program
 * header tables, every section that has bytes in the file (all but NOBITS) and every segment's
 * file bytes.  Only a 64-bit ELF with standard entry sizes and no extended numbering (which
 * sg_cubin_vars would not follow) is taken. */
static int elf_extent(const unsigned char *img, uint64_t have, uint64_t *extent)
{
    Elf64_Ehdr eh;
    uint64_t end = sizeof eh;
    if (have < end) {
        *extent = end;
        return EXTENT_MORE;
    }
    memcpy(&eh, img, sizeof eh);
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        (eh.e_shnum && eh.e_shentsize != sizeof(Elf64_Shdr)) ||
        (eh.e_phnum && eh.e_phentsize != sizeof(Elf64_Phdr)) || (!eh.e_shnum && eh.e_shoff) ||
        eh.e_shstrndx == SHN_XINDEX || eh.e_phnum == PN_XNUM ||
        !reach(&end, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr)) ||
        !reach(&end, eh.e_phoff, (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr)))
        return EXTENT_BAD;
    if (end <= have) {
        for (unsigned i = 0; i < eh.e_shnum; i++) {
            Elf64_Shdr sh;
            memcpy(&sh, img + eh.e_shoff + i * sizeof sh, sizeof sh);
            if (sh.sh_type != SHT_NOBITS && !reach(&end, sh.sh_offset, sh.sh_size))
                return EXTENT_BAD;
        }
        for (unsigned i = 0; i < eh.e_phnum; i++) {
            Elf64_Phdr ph;
            memcpy(&ph, img + eh.e_phoff + i * sizeof ph, sizeof ph);
            if (!reach(&end, ph.p_offset, ph.p_filesz))
                return EXTENT_BAD;
        }
    }
    *extent = end;
    return end <= have ? EXTENT_DONE : EXTENT_MORE;
}

/* How many bytes the image in the first `have` bytes of img (followed by IMAGE_PAD readable
 * bytes) says a reader may read: EXTENT_DONE (*extent <= have), EXTENT_MORE (*extent > have:
 * copy that much and ask again) or EXTENT_BAD (headers that overflow or say more than
 * IMAGE_MAX, or an ELF the shim cannot read: refused).  PTX is the text up to its NUL; a fatbin
 * its header and the size that header states (a container of another version is refused); a
 * fatbin wrapper its own 24 bytes (the fatbin it points to is copied on its own, image_take). */
static int image_extent(const unsigned char *img, uint64_t have, uint64_t *extent)
{
    if (sg_is_elf(img))
        return elf_extent(img, have, extent);
    uint32_t m = magic_of(img);
    if (m == FATBIN_WRAPPER_MAGIC) {
        *extent = SG_FATBIN_WRAPPER;
    } else if (m == FATBIN_MAGIC) {
        *extent = SG_FATBIN_HEADER;
        uint64_t total;
        if (have >= SG_FATBIN_HEADER &&
            (sg_fatbin_extent(img, &total) != SG_FATBIN_OK || !reach(extent, 0, total)))
            return EXTENT_BAD;
    } else {
        *extent = have; /* PTX: the copy ends with IMAGE_PAD zero bytes */
    }
    return *extent <= have ? EXTENT_DONE : EXTENT_MORE;
}

/* Whether the image starts with the magic of an ELF, a fatbin or a fatbin wrapper, its bytes
 * compared one by one, so that a PTX text shorter than a magic is not read past its NUL. */
static bool starts_with_magic(const unsigned char *p)
{
    static const uint32_t binary[] = {FATBIN_MAGIC, FATBIN_WRAPPER_MAGIC};
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F')
        return true;
    for (size_t k = 0; k < sizeof binary / sizeof binary[0]; k++) {
        unsigned char m[4];
        memcpy(m, &binary[k], sizeof m);
        size_t i = 0;
        while (i < sizeof m && p[i] == m[i])
            i++;
        if (i == sizeof m)
            return true;
    }
    return false;
}

/* The caller's image copied into a buffer of the shim's own (followed by IMAGE_PAD zero bytes)
 * whose headers fit it (image_extent, read from the copy); NULL with *res set when it cannot
 * be copied.  PTX is read up to its NUL, a binary image as far as its headers say, so the
 * caller's buffer is read no further than a driver trusting those headers would read it.  A
 * header that changes between two copies only means another copy; after IMAGE_ROUNDS the image
 * is refused. */
static char *image_copy(const void *image, size_t *length, CUresult *res)
{
    uint64_t need = starts_with_magic(image) ? 4 : strlen(image);
    char *buf = NULL;
    for (int round = 0; round < IMAGE_ROUNDS; round++) {
        char *nb = realloc(buf, need + IMAGE_PAD);
        if (!nb) {
            free(buf);
            *res = CUDA_ERROR_OUT_OF_MEMORY;
            return NULL;
        }
        buf = nb;
        memcpy(buf, image, need);
        memset(buf + need, 0, IMAGE_PAD);
        uint64_t extent;
        int r = image_extent((const unsigned char *)buf, need, &extent);
        if (r == EXTENT_DONE) {
            *length = need;
            return buf;
        }
        if (r == EXTENT_BAD)
            break;
        need = extent;
    }
    free(buf);
    *res = CUDA_ERROR_INVALID_IMAGE;
    return NULL;
}

/* ---- what the driver is handed and the scan reads: the shim's own copies ---- */

struct image {
    char *buf; /* handed to the driver */
    size_t length;
    char *fat; /* a fatbin wrapper's fatbin, copied; the wrapper in buf points to it */
    size_t fat_length;
};

static void image_free(struct image *im)
{
    free(im->buf);
    free(im->fat);
    memset(im, 0, sizeof *im);
}

/* The caller's image copied into im (image_copy); a fatbin wrapper's fatbin too, and the copy
 * of the wrapper pointed at that copy, so that the driver and the scan read the same bytes
 * there as well.  A wrapper of version 1 (a program's fatbin) or 2 (device-linked code: its
 * prelinked fatbins, relocatable input of a link, stay the caller's) is taken; another
 * version, no fatbin address, or an address where no fatbin starts is refused. */
static CUresult image_take(const void *image, struct image *im)
{
    CUresult res;
    memset(im, 0, sizeof *im);
    im->buf = image_copy(image, &im->length, &res);
    if (!im->buf)
        return res;
    if (magic_of((const unsigned char *)im->buf) != FATBIN_WRAPPER_MAGIC)
        return CUDA_SUCCESS;
    struct sg_fatbin_wrapper w;
    memcpy(&w.version, im->buf + 4, sizeof w.version);
    memcpy(&w.data, im->buf + 8, sizeof w.data);
    res = CUDA_ERROR_INVALID_IMAGE;
    if ((w.version == 1 || w.version == 2) && w.data)
        im->fat = image_copy(w.data, &im->fat_length, &res);
    if (im->fat && magic_of((const unsigned char *)im->fat) == FATBIN_MAGIC) {
        memcpy(im->buf + 8, &im->fat, sizeof im->fat);
        return CUDA_SUCCESS;
    }
    if (im->fat)
        res = CUDA_ERROR_INVALID_IMAGE;
    image_free(im);
    return res;
}

/* Whether the driver may be handed this copy, and the names its globals can have: its headers
 * fit inside it (an image read from a file is checked here; image_copy's always fit), an ELF's
 * symbols can all be read, a fatbin's entries can all be read (fatnames.c), and it is not PTX
 * that a preprocessor could rewrite.  A wrapper whose fatbin was not copied (read from a file,
 * where its address means nothing) is refused. */
static CUresult image_names(const struct image *im, struct sg_names *names)
{
    uint64_t extent;
    if (image_extent((const unsigned char *)im->buf, im->length, &extent) != EXTENT_DONE)
        return CUDA_ERROR_INVALID_IMAGE;
    const char *img = im->fat ? im->fat : im->buf;
    uint64_t length = im->fat ? im->fat_length : im->length;
    uint32_t m = magic_of((const unsigned char *)img);
    CUresult res = CUDA_SUCCESS;
    /* An ELF whose symbols the scan cannot all read is refused, never loaded with globals
     * nobody asked the driver about (the scan would fail open). */
    if (sg_is_elf(img))
        res = sg_names_cubin(names, img, length) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
    else if (m == FATBIN_MAGIC)
        res = sg_names_fatbin(names, img, length);
    else if (m == FATBIN_WRAPPER_MAGIC)
        res = CUDA_ERROR_INVALID_IMAGE;
    else if (sg_ptx_has_preprocessor_line(img)) /* anything else the driver reads as PTX text */
        res = CUDA_ERROR_NOT_SUPPORTED;
    else
        sg_names_ptx(names, img);
    if (res == CUDA_SUCCESS && names->oom)
        res = CUDA_ERROR_OUT_OF_MEMORY; /* a name left unasked could be a global */
    return res;
}

/* The caller's image in memory, copied and read: CUDA_SUCCESS, or the refusal with nothing
 * left to free. */
static CUresult take_data(const void *image, struct image *im, struct sg_names *names)
{
    CUresult res = image_take(image, im);
    if (res == CUDA_SUCCESS)
        res = image_names(im, names);
    if (res != CUDA_SUCCESS) {
        image_free(im);
        sg_names_free(names);
    }
    return res;
}

/* ---- the globals' size, asked of the driver after the load ---- */

typedef CUresult (*global_size_fn)(size_t *bytes, void *handle, const char *name);

static CUresult module_global(size_t *bytes, void *mod, const char *name)
{
    CUdeviceptr p;
    return SG_REAL(cuModuleGetGlobal_v2)(&p, bytes, (CUmodule)mod, name);
}

static CUresult library_global(size_t *bytes, void *lib, const char *name)
{
    CUdeviceptr p;
    return SG_REAL(cuLibraryGetGlobal)(&p, bytes, (CUlibrary)lib, name);
}

/* What the loaded image's globals take: each name asked of the driver, the sizes summed. */
static uint64_t globals_bytes(global_size_fn get, void *handle, const struct sg_names *names)
{
    uint64_t total = 0;
    for (size_t i = 0; i < names->cap; i++) {
        size_t bytes = 0;
        if (names->slot[i].s && get(&bytes, handle, names->slot[i].s) == CUDA_SUCCESS &&
            __builtin_add_overflow(total, (uint64_t)bytes, &total))
            total = UINT64_MAX;
    }
    return total;
}

/* Admit the globals of the loaded image (its names, sized by get) on the current context's
 * device and track them under key with that context; 0 when admitted or nothing is placed,
 * else the error (the caller unloads). */
static int charge_globals(global_size_fn get, void *handle, const struct sg_names *names, uint64_t key)
{
    CUcontext ctx;
    CUdevice dev;
    if (sg_current_place(&ctx, &dev) != CUDA_SUCCESS || !ctx)
        return 0;
    uint64_t bytes = globals_bytes(get, handle, names);
    if (!bytes)
        return 0;
    struct sg_charge c;
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_reserve(dev, bytes, &c, &e);
    if (rc != 0)
        return rc;
    c.ctx = ctx; /* the globals go with their context */
    if (!c.active || sg_track(SG_KIND_MODULE, key, &c, &e) == 0)
        return 0;
    sg_unreserve(&c);
    return SG_E_NOMEM;
}

/* After a real module load: admit its globals, or unload it and refuse. */
static CUresult charge_module(CUresult res, CUmodule *module, const struct sg_names *names)
{
    if (res != CUDA_SUCCESS)
        return res;
    int rc = SG_REAL(cuModuleGetGlobal_v2)
                 ? charge_globals(module_global, *module, names, (uint64_t)(uintptr_t)*module)
                 : SG_E_NOMEM;
    if (rc == 0)
        return CUDA_SUCCESS;
    SG_REAL(cuModuleUnload)(*module);
    *module = NULL;
    return sg_cu_result(rc);
}

/* After a real library load: its globals are placed in the current context now (asking for
 * one makes a lazily loading driver load the library there) and admitted, or the library is
 * unloaded and the load refused. */
static CUresult charge_library(CUresult res, CUlibrary *library, const struct sg_names *names)
{
    if (res != CUDA_SUCCESS)
        return res;
    int rc = SG_REAL(cuLibraryGetGlobal)
                 ? charge_globals(library_global, *library, names, (uint64_t)(uintptr_t)*library)
                 : SG_E_NOMEM;
    if (rc == 0)
        return CUDA_SUCCESS;
    SG_REAL(cuLibraryUnload)(*library);
    *library = NULL;
    return sg_cu_result(rc);
}

#define REAL(name)                                                                                 \
    __typeof__(&name) real_ = SG_REAL(name);                                                       \
    if (!real_)                                                                                    \
        return CUDA_ERROR_NOT_FOUND

#define ACCOUNTED (!sg_in_hook && sg_configured() && SG_REAL(cuModuleUnload))

SG_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    REAL(cuModuleLoadData);
    if (!ACCOUNTED || !image)
        return real_(module, image);
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_data(image, &im, &names);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    res = charge_module(real_(module, im.buf), module, &names);
    sg_in_hook--;
    image_free(&im);
    sg_names_free(&names);
    return res;
}

SG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues)
{
    REAL(cuModuleLoadDataEx);
    if (!ACCOUNTED || !image)
        return real_(module, image, numOptions, options, optionValues);
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_data(image, &im, &names);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    res = charge_module(real_(module, im.buf, numOptions, options, optionValues), module, &names);
    sg_in_hook--;
    image_free(&im);
    sg_names_free(&names);
    return res;
}

/* A fatbin or a fatbin wrapper (the driver takes any image here, as cuModuleLoadData does). */
SG_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    REAL(cuModuleLoadFatBinary);
    if (!ACCOUNTED || !fatCubin)
        return real_(module, fatCubin);
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_data(fatCubin, &im, &names);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    res = charge_module(real_(module, im.buf), module, &names);
    sg_in_hook--;
    image_free(&im);
    sg_names_free(&names);
    return res;
}

/* The whole file, read once (a pipe or a FIFO too, any size), followed by IMAGE_PAD zero bytes;
 * NULL with *res set to the driver's error for a file it cannot read, or host OOM. */
static char *read_file(const char *path, size_t *length, CUresult *res)
{
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) {
        *res = path ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_INVALID_VALUE;
        return NULL;
    }
    size_t n = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (cap - n < IMAGE_PAD + 4096) {
            size_t grown = cap ? cap * 2 : 1u << 16;
            char *nb = grown > cap ? realloc(buf, grown) : NULL;
            if (!nb) {
                *res = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            buf = nb;
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n - IMAGE_PAD);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            *res = got < 0 ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_SUCCESS; /* EISDIR, EIO, ... */
            break;
        }
        n += (size_t)got;
    }
    close(fd);
    if (*res != CUDA_SUCCESS) {
        free(buf);
        return NULL;
    }
    memset(buf + n, 0, IMAGE_PAD);
    *length = n;
    return buf;
}

/* A file read once (read_file) and read for names: CUDA_SUCCESS, or the refusal with nothing
 * left to free. */
static CUresult take_file(const char *path, struct image *im, struct sg_names *names)
{
    CUresult res;
    memset(im, 0, sizeof *im);
    im->buf = read_file(path, &im->length, &res);
    if (!im->buf)
        return res;
    res = image_names(im, names);
    if (res != CUDA_SUCCESS) {
        image_free(im);
        sg_names_free(names);
    }
    return res;
}

/* Under a tenant the file is read here, once, and those bytes are loaded with cuModuleLoadData
 * and sized: reading it a second time to size it would miss a pipe (readable once) and a file
 * swapped between the two reads.  The real cuModuleLoad is never called then. */
SG_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    REAL(cuModuleLoad);
    if (!ACCOUNTED)
        return real_(module, fname);
    __typeof__(&cuModuleLoadData) load = SG_REAL(cuModuleLoadData);
    if (!load)
        return CUDA_ERROR_NOT_FOUND;
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_file(fname, &im, &names);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    res = charge_module(load(module, im.buf), module, &names);
    sg_in_hook--;
    image_free(&im);
    sg_names_free(&names);
    return res;
}

SG_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    REAL(cuModuleUnload);
    if (!ACCOUNTED)
        return real_(hmod);
    sg_in_hook++;
    struct sg_charge c;
    bool tracked = sg_untrack(SG_KIND_MODULE, (uint64_t)(uintptr_t)hmod, &c);
    CUresult res = sg_free_end(real_(hmod), tracked, SG_KIND_MODULE, (uint64_t)(uintptr_t)hmod, &c);
    sg_in_hook--;
    return res;
}

/* ---- libraries (CUDA 12+: the runtime loads every fatbin this way) ---- */

#define LIB_ACCOUNTED (!sg_in_hook && sg_configured() && SG_REAL(cuLibraryUnload))

/* The library options without CU_LIBRARY_BINARY_IS_PRESERVED, in *opts and *values (NULL when
 * none is left; allocated, for the caller to free, when some are); false on host OOM.  That
 * option lets the driver keep reading the code after the load returns, and the code it gets is
 * the shim's copy, freed then.  It is a memory hint the driver may ignore (cuda.h): without it
 * the driver keeps its own copy, its default. */
static bool unpreserved(unsigned n, CUlibraryOption *in, void **in_values, unsigned *kept,
                        CUlibraryOption **opts, void ***values)
{
    *kept = 0;
    *opts = NULL;
    *values = NULL;
    bool any = false;
    for (unsigned i = 0; i < n; i++)
        any |= in[i] == 1 /* CU_LIBRARY_BINARY_IS_PRESERVED */;
    if (!any) {
        *kept = n;
        *opts = in;
        *values = in_values;
        return true;
    }
    CUlibraryOption *o = malloc(n * sizeof *o);
    void **v = malloc(n * sizeof *v);
    if (!o || !v) {
        free(o);
        free(v);
        return false;
    }
    for (unsigned i = 0; i < n; i++) {
        if (in[i] == 1)
            continue;
        o[*kept] = in[i];
        v[*kept] = in_values ? in_values[i] : NULL;
        ++*kept;
    }
    if (*kept) {
        *opts = o;
        *values = v; /* NULL entries where the caller gave no values: the driver judges that */
    } else {
        free(o);
        free(v);
    }
    return true;
}

SG_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions)
{
    REAL(cuLibraryLoadData);
    if (numLibraryOptions && !libraryOptions)
        return CUDA_ERROR_INVALID_VALUE; /* never past the accounting, whatever a driver makes of it */
    if (!LIB_ACCOUNTED || !code)
        return real_(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                     libraryOptionValues, numLibraryOptions);
    unsigned kept;
    CUlibraryOption *opts;
    void **values;
    if (!unpreserved(numLibraryOptions, libraryOptions, libraryOptionValues, &kept, &opts, &values))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_data(code, &im, &names);
    if (res == CUDA_SUCCESS) {
        sg_in_hook++;
        res = charge_library(real_(library, im.buf, jitOptions, jitOptionsValues, numJitOptions,
                                   opts, values, kept),
                             library, &names);
        sg_in_hook--;
        image_free(&im);
        sg_names_free(&names);
    }
    if (opts != libraryOptions) {
        free(opts);
        free(values);
    }
    return res;
}

/* As cuModuleLoad: the file is read once here and those bytes are loaded with
 * cuLibraryLoadData.  CU_LIBRARY_BINARY_IS_PRESERVED is invalid for a file (cuda.h), and must
 * not reach cuLibraryLoadData, which would keep our buffer. */
SG_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                         CUjit_option *jitOptions, void **jitOptionsValues,
                                         unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                         void **libraryOptionValues, unsigned int numLibraryOptions)
{
    REAL(cuLibraryLoadFromFile);
    if (!LIB_ACCOUNTED)
        return real_(library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                     libraryOptionValues, numLibraryOptions);
    __typeof__(&cuLibraryLoadData) load = SG_REAL(cuLibraryLoadData);
    if (!load)
        return CUDA_ERROR_NOT_FOUND;
    if (!library || (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numLibraryOptions; i++)
        if (libraryOptions[i] == 1 /* CU_LIBRARY_BINARY_IS_PRESERVED */)
            return CUDA_ERROR_INVALID_VALUE;
    struct image im;
    struct sg_names names = {0};
    CUresult res = take_file(fileName, &im, &names);
    if (res != CUDA_SUCCESS)
        return res;
    sg_in_hook++;
    res = charge_library(load(library, im.buf, jitOptions, jitOptionsValues, numJitOptions,
                              libraryOptions, libraryOptionValues, numLibraryOptions),
                         library, &names);
    sg_in_hook--;
    image_free(&im);
    sg_names_free(&names);
    return res;
}

SG_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    REAL(cuLibraryUnload);
    if (!LIB_ACCOUNTED)
        return real_(library);
    sg_in_hook++;
    uint64_t key = (uint64_t)(uintptr_t)library;
    struct sg_charge c;
    bool tracked = sg_untrack(SG_KIND_MODULE, key, &c);
    CUresult res = sg_free_end(real_(library), tracked, SG_KIND_MODULE, key, &c);
    sg_in_hook--;
    return res;
}
