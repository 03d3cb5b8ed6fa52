/*
 * Module and library globals: the `__device__` and `__constant__` variables of a module are
 * device memory the driver places when the module is loaded into the current context (and frees
 * at cuModuleUnload or with the context).  No allocation call shows it, so unhooked a module with
 * a large global array is memory past the cap.  A library (cuLibraryLoad*, how CUDA 12+
 * runtimes load every fatbin) is placed per context, at load (EAGER) or at its first use there
 * (LAZY); the hooks ask for its globals in the current context right after the load, which
 * places them there under either mode, and charge them like a module's.
 *
 * The names come from the image, the sizes from the driver: every identifier of a PTX image (a
 * superset of its declarations' names, so no lexing difference from the driver can hide one), an
 * ELF cubin's object symbols in its `.nv.global*` and `.nv.constant*` sections; each distinct
 * name is asked of the loaded module (cuModuleGetGlobal) or library (cuLibraryGetGlobal), so a
 * name read wrongly costs one failed lookup and the size is the driver's own.  PTX with a
 * preprocessor line is refused.  The sum is admitted after the real load (it is only known
 * then): refused, the module or library is unloaded again and the load fails with
 * CUDA_ERROR_OUT_OF_MEMORY.  What is checked, loaded and sized is one buffer of the shim's
 * own: an image in memory is copied first (as far as its own headers say, image_copy), so a
 * thread that rewrites the caller's buffer meanwhile changes nothing the driver or the scan
 * reads; a file (cuModuleLoad, cuLibraryLoadFromFile) is read once, here.  The copy is freed
 * after the load (CU_LIBRARY_BINARY_IS_PRESERVED, which would let the driver read it later, is
 * withdrawn); its cost is one memcpy of the image per load.
 *
 * Not read: fatbins (what nvcc embeds in programs, possibly compressed; copied, by their
 * header's size, but not scanned); a library's placement
 * in a context other than the one current at its load (another device, a context created
 * later, a load with no current context): what those take is in the agent's NVML
 * reconciliation, like the driver's own overhead.
 */
#include "shim.h"
#include "sharegpu/cubin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* A PTX identifier's characters after its first (PTX ISA "Identifiers": followsym). */
static bool follow(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$';
}

static bool digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The names already asked of the driver: open addressing over slices of the image, so that a
 * name written a million times (a register, a label) costs one lookup. */
struct name_set {
    struct {
        const char *s;
        size_t len;
    } *slot;
    size_t cap, n;
    bool oom;
};

static uint64_t name_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* true the first time a name is offered; false after, and when the set cannot grow (then
 * `oom` is set and the load is refused: a name left unasked could be a global). */
static bool first_time(struct name_set *set, const char *s, size_t len)
{
    if (set->n * 2 >= set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        __typeof__(set->slot) slot = calloc(cap, sizeof(*slot));
        if (!slot) {
            set->oom = true;
            return false;
        }
        for (size_t i = 0; i < set->cap; i++) {
            if (!set->slot[i].s)
                continue;
            size_t k = name_hash(set->slot[i].s, set->slot[i].len) & (cap - 1);
            while (slot[k].s)
                k = (k + 1) & (cap - 1);
            slot[k] = set->slot[i];
        }
        free(set->slot);
        set->slot = slot;
        set->cap = cap;
    }
    size_t k = name_hash(s, len) & (set->cap - 1);
    for (; set->slot[k].s; k = (k + 1) & (set->cap - 1))
        if (set->slot[k].len == len && memcmp(set->slot[k].s, s, len) == 0)
            return false;
    set->slot[k].s = s;
    set->slot[k].len = len;
    set->n++;
    return true;
}

/* What the loaded image's globals take, asked name by name of the driver. */
struct sizing {
    CUresult (*get)(size_t *bytes, void *handle, const char *name);
    void *handle;
    uint64_t bytes;
    struct name_set asked;
};

static void add_global(const char *name, size_t len, void *arg)
{
    struct sizing *s = arg;
    if (len == 0 || digit(name[0]) || !first_time(&s->asked, name, len))
        return;
    char small[256];
    char *buf = len < sizeof small ? small : malloc(len + 1);
    if (!buf) {
        s->asked.oom = true;
        return;
    }
    memcpy(buf, name, len);
    buf[len] = '\0';
    size_t bytes = 0;
    if (s->get(&bytes, s->handle, buf) == CUDA_SUCCESS &&
        __builtin_add_overflow(s->bytes, (uint64_t)bytes, &s->bytes))
        s->bytes = UINT64_MAX;
    if (buf != small)
        free(buf);
}

/* Every identifier of a PTX text, offered to fn: a superset of the names its declarations give,
 * whatever separates them (any whitespace, comments, strings, several declarators, `.visible`,
 * `.weak`, `.common`, `.align`, dimensions, initialisers).  Reading only declarations would mean
 * matching the driver's lexer exactly, and every difference would be a name missed, so a hole;
 * a name offered that is no global costs one failed lookup.  A run of identifier characters is
 * cut where `%` starts a new identifier (PTX: `%` only begins one), and a run that starts with
 * digits (a number glued to a name) is also offered without them. */
static void ptx_identifiers(const char *text, void (*fn)(const char *, size_t, void *), void *arg)
{
    const char *p = text;
    while (*p) {
        if (!follow(*p) && *p != '%') {
            p++;
            continue;
        }
        const char *run = p;
        while (follow(*p) || *p == '%')
            p++;
        for (const char *s = run, *e; s < p; s = e) {
            for (e = s + 1; e < p && *e != '%'; e++)
                ;
            const char *name = s;
            while (name < e && digit(*name))
                name++;
            if (name < e)
                fn(name, (size_t)(e - name), arg);
        }
    }
}

/* The text with every backslash-newline removed (a reader that joins continued lines, as the C
 * preprocessor does, sees these names); NULL when there is none or no memory (*oom set). */
static char *spliced(const char *text, bool *oom)
{
    if (!strstr(text, "\\\n") && !strstr(text, "\\\r\n"))
        return NULL;
    char *out = malloc(strlen(text) + 1), *o = out;
    if (!out) {
        *oom = true;
        return NULL;
    }
    for (const char *p = text; *p;) {
        if (p[0] == '\\' && p[1] == '\n')
            p += 2;
        else if (p[0] == '\\' && p[1] == '\r' && p[2] == '\n')
            p += 3;
        else
            *o++ = *p++;
    }
    *o = '\0';
    return out;
}

/* A preprocessor line (`#` first on a line, PTX ISA "Source Format"): a driver that runs one
 * could paste a name together that no identifier of the text spells, so such PTX is refused.
 * A comment counts as whitespace there (a `#define` right after a closed comment is a
 * directive, as the simulated driver's lexer also reads it), and a newline inside a comment
 * starts a line (an over-refusal only: C would join the two lines).  A `#` that only
 * whitespace precedes on its line is refused even inside what looks like a comment (as before
 * comments were followed): a reader that ends or starts comments elsewhere (a comment opener
 * inside a string) would see it first on its line. */
static bool has_preprocessor_line(const char *text)
{
    bool line_start = true; /* since the last newline: whitespace and comments only */
    bool blank = true;      /* since the last newline: whitespace only */
    enum { CODE, BLOCK, LINE } in = CODE;
    for (const char *p = text; *p; p++) {
        if (*p == '#' && (blank || (in == CODE && line_start)))
            return true;
        if (*p == '\n') {
            line_start = blank = true;
            if (in == LINE)
                in = CODE;
        } else if (!strchr(" \t\r\v\f", *p)) {
            blank = false;
            if (in == CODE && p[0] == '/' && p[1] == '*') {
                in = BLOCK;
                p++;
            } else if (in == CODE && p[0] == '/' && p[1] == '/') {
                in = LINE;
                p++;
            } else if (in == BLOCK && p[0] == '*' && p[1] == '/') {
                in = CODE;
                p++;
            } else if (in == CODE) {
                line_start = false;
            }
        }
    }
    return false;
}

static void add_cubin_var(const char *name, uint64_t size, void *arg)
{
    (void)size; /* the driver's figure counts, not the image's */
    add_global(name, strlen(name), arg);
}

/* ---- the image: copied before anything reads it ----
 *
 * The caller's buffer can change while it is read (another thread of the tenant): a driver
 * that reads one name and a scan that then reads another would leave a global uncharged.  So
 * the image is copied once, into memory of the shim's own, and everything after reads only the
 * copy: the preprocessor check, the driver (it is handed the copy) and the scan for names.  How
 * much to copy comes from the image's own headers, and those are read from the copy too: the
 * copy grows until what its own headers say fits inside it (image_extent). */

#define FATBIN_MAGIC 0xBA55ED50u         /* fatBinaryHeader: magic, version, headerSize, fatSize */
#define FATBIN_WRAPPER_MAGIC 0x466243B1u /* __fatBinC_Wrapper_t: magic, version, data, filename */
#define FATBIN_HEADER 16u
#define FATBIN_WRAPPER 24u
#define IMAGE_PAD 8 /* zero bytes after every copy: magic reads stay inside, PTX text ends */
#define IMAGE_MAX (1ull << 30) /* an ELF or fatbin whose headers say more is refused */
#define IMAGE_ROUNDS 8         /* copies of a binary image before one is found consistent */

static uint32_t magic_of(const unsigned char *p)
{
    uint32_t m;
    memcpy(&m, p, sizeof m);
    return m;
}

static bool is_fatbin(const void *image)
{
    uint32_t m = magic_of(image);
    return m == FATBIN_MAGIC || m == FATBIN_WRAPPER_MAGIC;
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
 * its header and the size that header states (the shim reads no fatbin: the driver gets the
 * copy); a fatbin wrapper its own 24 bytes (the fatbin it points to stays the caller's, and is
 * read by the driver alone). */
static int image_extent(const unsigned char *img, uint64_t have, uint64_t *extent)
{
    if (sg_is_elf(img))
        return elf_extent(img, have, extent);
    uint32_t m = magic_of(img);
    if (m == FATBIN_WRAPPER_MAGIC) {
        *extent = FATBIN_WRAPPER;
    } else if (m == FATBIN_MAGIC) {
        *extent = FATBIN_HEADER;
        if (have >= FATBIN_HEADER) {
            uint16_t header;
            uint64_t fat;
            memcpy(&header, img + 6, sizeof header);
            memcpy(&fat, img + 8, sizeof fat);
            if (header < FATBIN_HEADER || !reach(extent, header, fat))
                return EXTENT_BAD;
        }
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

/* Whether the driver may be handed this copy: its headers fit inside it (an image read from a
 * file is checked here; image_copy's always fit), an ELF's symbols can all be read, and it is
 * not PTX that a preprocessor could rewrite. */
static void no_var(const char *name, uint64_t size, void *arg)
{
    (void)name;
    (void)size;
    (void)arg;
}

static CUresult image_check(const char *image, size_t length)
{
    uint64_t extent;
    if (image_extent((const unsigned char *)image, length, &extent) != EXTENT_DONE)
        return CUDA_ERROR_INVALID_IMAGE;
    /* An ELF whose symbols the scan cannot all read is refused, never loaded with globals
     * nobody asked the driver about (the scan would fail open). */
    if (sg_is_elf(image) && sg_cubin_vars(image, length, no_var, NULL) != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    if (!sg_is_elf(image) && !is_fatbin(image) && has_preprocessor_line(image))
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

/* Sum the driver's sizes of the globals the image names into s; -1 when the names could not
 * all be asked (host memory), so the load must be refused. */
static int globals_bytes(struct sizing *s, const void *image, uint64_t length)
{
    if (sg_is_elf(image)) {
        sg_cubin_vars(image, length, add_cubin_var, s);
    } else if (!is_fatbin(image)) { /* anything else the driver reads as PTX text */
        ptx_identifiers(image, add_global, s);
        char *joined = spliced(image, &s->asked.oom);
        if (joined)
            ptx_identifiers(joined, add_global, s);
        free(joined);
    }
    free(s->asked.slot);
    return s->asked.oom ? -1 : 0;
}

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

/* Admit the globals the loaded image names (sized by s->get) on the current context's device
 * and track them under key with that context; 0 when admitted or nothing is placed, else the
 * error (the caller unloads).  image is the shim's own copy that the driver loaded, length its
 * size (the offsets a cubin's headers give are followed inside it only). */
static int charge_globals(struct sizing *s, const void *image, uint64_t length, uint64_t key)
{
    CUcontext ctx;
    CUdevice dev;
    if (sg_current_place(&ctx, &dev) != CUDA_SUCCESS || !ctx)
        return 0;
    if (globals_bytes(s, image, length) < 0)
        return SG_E_NOMEM;
    if (!s->bytes)
        return 0;
    struct sg_charge c;
    struct sg_err e;
    sg_err_clear(&e);
    int rc = sg_reserve(dev, s->bytes, &c, &e);
    if (rc != 0)
        return rc;
    c.ctx = ctx; /* the globals go with their context */
    if (!c.active || sg_track(SG_KIND_MODULE, key, &c, &e) == 0)
        return 0;
    sg_unreserve(&c);
    return SG_E_NOMEM;
}

/* After a real module load: admit its globals, or unload it and refuse. */
static CUresult charge_module(CUresult res, CUmodule *module, const void *image, uint64_t length)
{
    if (res != CUDA_SUCCESS || !image)
        return res;
    struct sizing s = {.get = module_global, .handle = *module};
    int rc = SG_REAL(cuModuleGetGlobal_v2)
                 ? charge_globals(&s, image, length, (uint64_t)(uintptr_t)*module)
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
static CUresult charge_library(CUresult res, CUlibrary *library, const void *code, uint64_t length)
{
    if (res != CUDA_SUCCESS || !code)
        return res;
    struct sizing s = {.get = library_global, .handle = *library};
    int rc = SG_REAL(cuLibraryGetGlobal)
                 ? charge_globals(&s, code, length, (uint64_t)(uintptr_t)*library)
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
    size_t length;
    CUresult res;
    char *copy = image_copy(image, &length, &res);
    if (!copy)
        return res;
    res = image_check(copy, length);
    if (res == CUDA_SUCCESS) {
        sg_in_hook++;
        res = charge_module(real_(module, copy), module, copy, length);
        sg_in_hook--;
    }
    free(copy);
    return res;
}

SG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues)
{
    REAL(cuModuleLoadDataEx);
    if (!ACCOUNTED || !image)
        return real_(module, image, numOptions, options, optionValues);
    size_t length;
    CUresult res;
    char *copy = image_copy(image, &length, &res);
    if (!copy)
        return res;
    res = image_check(copy, length);
    if (res == CUDA_SUCCESS) {
        sg_in_hook++;
        res = charge_module(real_(module, copy, numOptions, options, optionValues), module, copy,
                            length);
        sg_in_hook--;
    }
    free(copy);
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
    size_t length;
    CUresult res;
    char *image = read_file(fname, &length, &res);
    if (!image)
        return res;
    res = image_check(image, length);
    if (res == CUDA_SUCCESS) {
        sg_in_hook++;
        res = charge_module(load(module, image), module, image, length);
        sg_in_hook--;
    }
    free(image);
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
    size_t length;
    CUresult res;
    char *copy = image_copy(code, &length, &res);
    if (copy) {
        res = image_check(copy, length);
        if (res == CUDA_SUCCESS) {
            sg_in_hook++;
            res = charge_library(real_(library, copy, jitOptions, jitOptionsValues, numJitOptions,
                                       opts, values, kept),
                                 library, copy, length);
            sg_in_hook--;
        }
        free(copy);
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
    size_t length;
    CUresult res;
    char *code = read_file(fileName, &length, &res);
    if (!code)
        return res;
    res = image_check(code, length);
    if (res == CUDA_SUCCESS) {
        sg_in_hook++;
        res = charge_library(load(library, code, jitOptions, jitOptionsValues, numJitOptions,
                                  libraryOptions, libraryOptionValues, numLibraryOptions),
                             library, code, length);
        sg_in_hook--;
    }
    free(code);
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
