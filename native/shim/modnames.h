/*
 * The names a module image can declare as globals (modnames.c: PTX and ELF cubins; fatnames.c:
 * fatbin containers), read from the shim's own copy before the driver is handed it, and asked
 * of the driver one by one after the load (hooks_module.c).
 */
#ifndef SHAREGPU_SHIM_MODNAMES_H
#define SHAREGPU_SHIM_MODNAMES_H

#include "shim.h"

/* The distinct names offered: open addressing over copies the set owns (NUL-terminated, so
 * they outlive whatever buffer they were read from: a decompressed fatbin entry, a joined
 * text).  oom: a name could not be kept, so the load must be refused (a name left unasked
 * could be a global). */
struct sg_names {
    struct sg_name {
        const char *s; /* NULL: an empty slot */
        size_t len;
    } *slot;
    size_t cap, n;
    struct sg_name_chunk *chunks;
    bool oom;
};

/* Offers a name: kept once; an empty one or one starting with a digit is no identifier. */
void sg_names_add(struct sg_names *set, const char *s, size_t len);
void sg_names_free(struct sg_names *set);

/* Every identifier of a PTX text, also with its backslash-newlines joined: a superset of the
 * names its declarations give, whatever the driver's lexer takes as whitespace or comment. */
void sg_names_ptx(struct sg_names *set, const char *text);

/* A preprocessor line (`#` first on a line, whitespace and comments before it): such PTX is
 * refused, since a preprocessor could paste a name no identifier of the text spells. */
bool sg_ptx_has_preprocessor_line(const char *text);

/* The object symbols of an ELF cubin's global and constant sections in its first `length`
 * bytes; sg_cubin_vars' count of what it could not read (0: all of it). */
int sg_names_cubin(struct sg_names *set, const void *image, uint64_t length);

/* Every name the entries of the fatbin container in the first `length` bytes of container can
 * declare (fatnames.c): CUDA_SUCCESS, or the refusal of the load (an entry the shim cannot
 * read in full must not be loaded with globals nobody was charged for). */
CUresult sg_names_fatbin(struct sg_names *set, const void *container, uint64_t length);

#endif /* SHAREGPU_SHIM_MODNAMES_H */
