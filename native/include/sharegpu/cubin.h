/*
 * The variables of an ELF cubin, as the ELF specification lays out its symbol table: each
 * STT_OBJECT symbol placed in a section whose name starts with `.nv.global` (`__device__`
 * variables, initialised or not) or `.nv.constant` (`__constant__` banks).  Used by the shim
 * (names to ask the driver about) and by the simulated driver (the variables it places).
 *
 * A cubin has no length beside its headers: the caller passes only images a driver accepted,
 * and offsets past `limit` bytes are not followed.
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

static inline void sg_cubin_vars(const void *image, uint64_t limit, sg_cubin_var_fn fn, void *arg)
{
    const unsigned char *img = (const unsigned char *)image;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)image;
    if (!sg_is_elf(image) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shstrndx >= eh->e_shnum ||
        eh->e_shoff > limit)
        return;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    if (sh[eh->e_shstrndx].sh_offset > limit)
        return;
    const char *secnames = (const char *)img + sh[eh->e_shstrndx].sh_offset;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum ||
            sh[i].sh_entsize != sizeof(Elf64_Sym) || sh[i].sh_offset > limit ||
            sh[sh[i].sh_link].sh_offset > limit)
            continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        const char *names = (const char *)img + sh[sh[i].sh_link].sh_offset;
        for (uint64_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++) {
            unsigned sec = sym[k].st_shndx;
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_OBJECT || sec == SHN_UNDEF ||
                sec >= eh->e_shnum)
                continue;
            const char *secname = secnames + sh[sec].sh_name;
            if (strncmp(secname, ".nv.global", 10) == 0 || strncmp(secname, ".nv.constant", 12) == 0)
                fn(names + sym[k].st_name, sym[k].st_size, arg);
        }
    }
}

#endif /* SHAREGPU_CUBIN_H */
