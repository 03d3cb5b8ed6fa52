/*
 * Reading the dynamic symbol tables of loaded objects, for the two lookups that cannot ask
 * glibc's dlsym (real.c):
 *
 * - glibc's own dlsym, dlvsym and dlopen.  The shim exports dlsym and dlvsym, and the dynamic
 *   linker binds a versioned reference such as dlvsym@GLIBC_2.34 to an unversioned definition
 *   that comes first: the shim's, even from inside the shim.  So we take, among the objects
 *   loaded after the shim (dl_iterate_phdr, load order), the first definition of the name that
 *   carries exactly the glibc version asked for; the shim's carry none, so it is never us.
 * - One object's own definition of a name (the RTLD_NEXT answer, real.c): glibc's lookup on an
 *   object's handle also searches its dependencies, and not every link map is a usable handle.
 *
 * Only what the dynamic linker itself reads: DT_SYMTAB, DT_STRTAB, DT_GNU_HASH (else DT_HASH),
 * DT_VERSYM and DT_VERDEF.  Functions only; glibc-specific, as the version names are.
 */
#include <elf.h>
#include <link.h>
#include <string.h>

#include "shim.h"

struct elf_tables {
    const ElfW(Sym) *sym;
    const char *str;
    const ElfW(Half) *versym;   /* NULL: the object has no symbol versions */
    const ElfW(Verdef) *verdef; /* NULL: it defines no version */
    const uint32_t *gnu_hash;
    const ElfW(Word) *sysv_hash;
};

/* glibc relocates the pointers of .dynamic in place on most targets; on the rest (and in the
 * vDSO) they are still offsets from the load address. */
static const void *dyn_ptr(ElfW(Addr) base, ElfW(Addr) v)
{
    return (const void *)(v < base ? v + base : v);
}

static int tables_of(const ElfW(Dyn) *dyn, ElfW(Addr) base, struct elf_tables *t)
{
    memset(t, 0, sizeof *t);
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        const void *p = dyn_ptr(base, dyn->d_un.d_ptr);
        switch (dyn->d_tag) {
        case DT_SYMTAB: t->sym = p; break;
        case DT_STRTAB: t->str = p; break;
        case DT_VERSYM: t->versym = p; break;
        case DT_VERDEF: t->verdef = p; break;
        case DT_GNU_HASH: t->gnu_hash = p; break;
        case DT_HASH: t->sysv_hash = p; break;
        default: break;
        }
    }
    return t->sym && t->str && (t->gnu_hash || t->sysv_hash) ? 0 : -1;
}

/* The name of symbol i's version, NULL if it has none (unversioned, or the base version). */
static const char *version_of(const struct elf_tables *t, size_t i)
{
    if (!t->versym || !t->verdef)
        return NULL;
    ElfW(Half) ndx = t->versym[i] & 0x7fff;
    for (const ElfW(Verdef) *d = t->verdef;; d = (const void *)((const char *)d + d->vd_next)) {
        if (d->vd_ndx == ndx) {
            const ElfW(Verdaux) *a = (const void *)((const char *)d + d->vd_aux);
            return d->vd_flags & VER_FLG_BASE ? NULL : t->str + a->vda_name;
        }
        if (d->vd_next == 0)
            return NULL;
    }
}

/* Symbol i is a function defined here and visible under that name, in the version asked for:
 * exactly `version`, or with none asked, the default one (not a hidden `name@VER`). */
static int matches(const struct elf_tables *t, size_t i, const char *name, const char *version)
{
    const ElfW(Sym) *s = &t->sym[i];
    /* ST_TYPE and ST_VISIBILITY are one macro for both ELF classes. */
    if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
        ELF64_ST_BIND(s->st_info) == STB_LOCAL ||
        ELF64_ST_VISIBILITY(s->st_other) == STV_HIDDEN ||
        ELF64_ST_VISIBILITY(s->st_other) == STV_INTERNAL || strcmp(t->str + s->st_name, name) != 0)
        return 0;
    if (!version)
        return !t->versym || !(t->versym[i] & 0x8000);
    const char *v = version_of(t, i);
    return v && strcmp(v, version) == 0;
}

static uint32_t gnu_hash_of(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* Index of the wanted symbol in the object's table, or 0 (the null symbol) if absent. */
static size_t find_index(const struct elf_tables *t, const char *name, const char *version)
{
    if (t->gnu_hash) {
        uint32_t nbuckets = t->gnu_hash[0], symoffset = t->gnu_hash[1], bloom = t->gnu_hash[2];
        const uint32_t *buckets = t->gnu_hash + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t h = gnu_hash_of(name);
        for (uint32_t i = nbuckets ? buckets[h % nbuckets] : 0; i != 0 && i >= symoffset; i++) {
            uint32_t c = chain[i - symoffset];
            if ((c | 1) == (h | 1) && matches(t, i, name, version))
                return i;
            if (c & 1)
                break;
        }
        return 0;
    }
    for (size_t i = 1; i < t->sysv_hash[1]; i++) /* nchain: the number of symbols */
        if (matches(t, i, name, version))
            return i;
    return 0;
}

void *sg_elf_sym(const void *dynamic, uintptr_t base, const char *name, const char *version)
{
    struct elf_tables t;
    if (tables_of(dynamic, base, &t) < 0)
        return NULL;
    size_t i = find_index(&t, name, version);
    return i ? (void *)(base + t.sym[i].st_value) : NULL;
}

/* ---- glibc's definitions ------------------------------------------------------------------ */

struct want {
    const char *name;
    const char *version;
    int past_self; /* the shim has been seen: later objects may answer */
    void *found;
};

static int inside(const struct dl_phdr_info *info, const void *addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        ElfW(Addr) lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ElfW(Addr))addr >= lo && (ElfW(Addr))addr < lo + ph->p_memsz)
            return 1;
    }
    return 0;
}

static int visit(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct want *w = arg;
    if (!w->past_self) {
        w->past_self = inside(info, (const void *)&sg_libc_sym);
        return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
            continue;
        const void *dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        w->found = sg_elf_sym(dyn, info->dlpi_addr, w->name, w->version);
        return w->found != NULL;
    }
    return 0;
}

void *sg_libc_sym(const char *name, const char *version)
{
    struct want w = {.name = name, .version = version};
    dl_iterate_phdr(visit, &w);
    return w.found;
}
