/*
 * The names a PTX text or an ELF cubin can declare as globals (modnames.h).  The names come
 * from the image, the sizes from the driver (hooks_module.c): every identifier of a PTX text (a
 * superset of its declarations' names, so no lexing difference from the driver can hide one),
 * an ELF cubin's object symbols in its `.nv.global*` and `.nv.constant*` sections
 * (sharegpu/cubin.h).  A name read wrongly costs one failed lookup.
 */
#include "modnames.h"
#include "sharegpu/cubin.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- the set: a name written a million times (a register, a label) is kept once ---------- */

struct sg_name_chunk {
    struct sg_name_chunk *next;
    size_t used, cap;
    char bytes[];
};

#define CHUNK (64u << 10)

static uint64_t name_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A NUL-terminated copy of the name in the set's own memory; NULL on host OOM. */
static const char *keep(struct sg_names *set, const char *s, size_t len)
{
    struct sg_name_chunk *c = set->chunks;
    if (!c || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > CHUNK ? len + 1 : CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->next = set->chunks;
        c->used = 0;
        c->cap = cap;
        set->chunks = c;
    }
    char *p = c->bytes + c->used;
    memcpy(p, s, len);
    p[len] = '\0';
    c->used += len + 1;
    return p;
}

static bool grow(struct sg_names *set)
{
    size_t cap = set->cap ? set->cap * 2 : 1024;
    struct sg_name *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return false;
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
    return true;
}

void sg_names_add(struct sg_names *set, const char *s, size_t len)
{
    if (len == 0 || digit(s[0]) || set->oom)
        return;
    if (set->n * 2 >= set->cap && !grow(set)) {
        set->oom = true;
        return;
    }
    size_t k = name_hash(s, len) & (set->cap - 1);
    for (; set->slot[k].s; k = (k + 1) & (set->cap - 1))
        if (set->slot[k].len == len && memcmp(set->slot[k].s, s, len) == 0)
            return;
    const char *copy = keep(set, s, len);
    if (!copy) {
        set->oom = true;
        return;
    }
    set->slot[k].s = copy;
    set->slot[k].len = len;
    set->n++;
}

void sg_names_free(struct sg_names *set)
{
    free(set->slot);
    for (struct sg_name_chunk *c = set->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    memset(set, 0, sizeof *set);
}

/* ---- PTX ------------------------------------------------------------------------------------ */

/* Every identifier of a PTX text: a superset of the names its declarations give, whatever
 * separates them (any whitespace, comments, strings, several declarators, `.visible`, `.weak`,
 * `.common`, `.align`, dimensions, initialisers).  Reading only declarations would mean
 * matching the driver's lexer exactly, and every difference would be a name missed, so a hole;
 * a name offered that is no global costs one failed lookup.  A run of identifier characters is
 * cut where `%` starts a new identifier (PTX: `%` only begins one), and a run that starts with
 * digits (a number glued to a name) is also offered without them. */
static void ptx_identifiers(struct sg_names *set, const char *text)
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
                sg_names_add(set, name, (size_t)(e - name));
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

void sg_names_ptx(struct sg_names *set, const char *text)
{
    ptx_identifiers(set, text);
    char *joined = spliced(text, &set->oom);
    if (joined)
        ptx_identifiers(set, joined);
    free(joined);
}

/* A preprocessor line (`#` first on a line, PTX ISA "Source Format"): a driver that runs one
 * could paste a name together that no identifier of the text spells, so such PTX is refused.
 * A comment counts as whitespace there (a `#define` right after a closed comment is a
 * directive, as the simulated driver's lexer also reads it), and a newline inside a comment
 * starts a line (an over-refusal only: C would join the two lines).  A `#` that only
 * whitespace precedes on its line is refused even inside what looks like a comment (as before
 * comments were followed): a reader that ends or starts comments elsewhere (a comment opener
 * inside a string) would see it first on its line. */
bool sg_ptx_has_preprocessor_line(const char *text)
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

/* ---- ELF cubins ----------------------------------------------------------------------------- */

static void add_cubin_var(const char *name, uint64_t size, void *arg)
{
    (void)size; /* the driver's figure counts, not the image's */
    sg_names_add(arg, name, strlen(name));
}

int sg_names_cubin(struct sg_names *set, const void *image, uint64_t length)
{
    return sg_cubin_vars(image, length, add_cubin_var, set);
}
