/*
 * The variables of an ELF cubin, as the ELF specification lays out its symbol table: each
 * STT_OBJECT symbol placed in a section whose name starts with `.nv.global` (`__device__`
 * variables, initialised or not) or `.nv.constant` (`__constant__` banks).  Used by the shim
 * (names to ask the driver about) and by the simulated driver (the variables it places).
 *
 * Every read stays inside the first `limit` bytes: the section header table, the symbol table
 * and both string tables must lie there whole (offset + size, without overflow), a name must
 * start inside its string table and end (NUL) before the table does.  What does not is not
 * read, and counted: sg_cubin_vars returns how many symbol tables and object symbols it could
 * not read (-1: not even the section headers), so that a caller refuses the image rather than
 * load it with variables it never saw (a driver reading the same bytes its own way might place
 * them).
 */
#ifndef SHAREGPU_CUBIN_H
#define SHAREGPU_CUBIN_H

#include <elf.h>
#include <stdint.h>
#include <string.h>

typedef void (*sg_cubin_var_fn)(const char *name, uint64_t size, void *arg);

static inline int sg_is_elf(const void *image)
{
    const unsigned char *p = (const unsigned char *)image;
    return p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F';
}

/* true when [off, off + size) lies inside the first limit bytes. */
static inline int sg_cubin_inside(uint64_t off, uint64_t size, uint64_t limit)
{
    return off <= limit && size <= limit - off;
}

/* The NUL-terminated string at offset off of a string table section, or NULL when it does not
 * start and end inside the section (which sg_cubin_vars has checked lies inside the image). */
static inline const char *sg_cubin_str(const unsigned char *img, const Elf64_Shdr *tab, uint64_t off)
{
    if (off >= tab->sh_size)
        return NULL;
    const char *s = (const char *)img + tab->sh_offset + off;
    return memchr(s, '\0', tab->sh_size - off) ? s : NULL;
}

static inline int sg_cubin_vars(const void *image, uint64_t limit, sg_cubin_var_fn fn, void *arg)
{
    const unsigned char *img = (const unsigned char *)image;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)image;
    if (limit < sizeof(*eh) || !sg_is_elf(image) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shstrndx >= eh->e_shnum ||
        !sg_cubin_inside(eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr), limit))
        return -1;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    const Elf64_Shdr *secnames = &sh[eh->e_shstrndx];
    if (!sg_cubin_inside(secnames->sh_offset, secnames->sh_size, limit))
        return -1;
    int unread = 0;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        if (sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(Elf64_Sym) ||
            !sg_cubin_inside(sh[i].sh_offset, sh[i].sh_size, limit) ||
            !sg_cubin_inside(sh[sh[i].sh_link].sh_offset, sh[sh[i].sh_link].sh_size, limit)) {
            unread++;
            continue;
        }
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        const Elf64_Shdr *names = &sh[sh[i].sh_link];
        for (uint64_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++) {
            unsigned sec = sym[k].st_shndx;
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_OBJECT || sec == SHN_UNDEF ||
                sec >= SHN_LORESERVE) /* SHN_ABS, SHN_COMMON: no section of the image */
                continue;
            const char *secname =
                sec < eh->e_shnum ? sg_cubin_str(img, secnames, sh[sec].sh_name) : NULL;
            const char *name = sg_cubin_str(img, names, sym[k].st_name);
            if (!secname || !name) {
                unread++; /* names a section that is not there, or a name out of its table */
                continue;
            }
            if (strncmp(secname, ".nv.global", 10) == 0 || strncmp(secname, ".nv.constant", 12) == 0)
                fn(name, sym[k].st_size, arg);
        }
    }
    return unread;
}

#endif /* SHAREGPU_CUBIN_H */
