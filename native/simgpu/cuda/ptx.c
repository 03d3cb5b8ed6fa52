/*
 * The variables a PTX image declares, read as a driver's PTX front end reads them (PTX ISA,
 * "Syntax"): all whitespace is equivalent, `//` and `/ * * /` comments are whitespace, strings are
 * one token, a backslash-newline joins two lines (as the C preprocessor that the ISA mentions
 * would; assuming the join places more, which is the side a model of the driver must err on).
 * Every `.global`/`.const` declaration that is not `.extern` is placed, at module or function
 * scope, with each of its declarators (`.global .u8 a[1 << 20], b[2][3] = {...};`), dimensions
 * being constant expressions.  What this model cannot read is refused rather than skipped:
 * a malformed declaration is CUDA_ERROR_INVALID_PTX, a preprocessor line (`#define` could make
 * declarations that no text spells) CUDA_ERROR_NOT_SUPPORTED.  So the model never places less
 * than a driver would, which is what an interposer's test needs from it.
 */
#include "cu.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum tok_kind { T_END, T_IDENT, T_DIRECTIVE, T_NUMBER, T_STRING, T_PUNCT };

struct tok {
    const char *s;
    size_t len;
    unsigned char kind;
    unsigned char glued; /* nothing (no whitespace, no comment) between it and the previous token */
};

struct toks {
    struct tok *t;
    size_t n, cap;
};

static int follow(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$';
}

static int push(struct toks *ts, const char *s, size_t len, unsigned char kind, int glued)
{
    if (ts->n + 1 >= ts->cap) {
        size_t cap = ts->cap ? ts->cap * 2 : 1024;
        struct tok *t = realloc(ts->t, cap * sizeof(*t));
        if (!t)
            return -1;
        ts->t = t;
        ts->cap = cap;
    }
    ts->t[ts->n++] = (struct tok){s, len, kind, (unsigned char)glued};
    ts->t[ts->n] = (struct tok){s + len, 0, T_END, 0};
    return 0;
}

/* Length of the token at p (not whitespace, not a comment) and its kind; 0 for a bad string. */
static size_t token_at(const char *p, unsigned char *kind)
{
    const char *q = p + 1;
    if (*p == '"') {
        for (; *q && *q != '"' && *q != '\n'; q++)
            if (*q == '\\' && q[1])
                q++;
        *kind = T_STRING;
        return *q == '"' ? (size_t)(q + 1 - p) : 0;
    }
    if ((*p == '.' && follow(*q)) || isalpha((unsigned char)*p) || *p == '_' || *p == '$' ||
        (*p == '%' && follow(*q))) {
        while (follow(*q))
            q++;
        *kind = *p == '.' ? T_DIRECTIVE : T_IDENT;
        return (size_t)(q - p);
    }
    if (isdigit((unsigned char)*p)) {
        while (follow(*q) || (*q == '.' && isdigit((unsigned char)q[1])))
            q++;
        *kind = T_NUMBER;
        return (size_t)(q - p);
    }
    *kind = T_PUNCT;
    return ((p[0] == '<' || p[0] == '>') && p[1] == p[0]) ? 2 : 1;
}

static CUresult lex(const char *text, struct toks *ts)
{
    int line_start = 1, sep = 1;
    for (const char *p = text; *p;) {
        if (isspace((unsigned char)*p)) {
            line_start |= *p++ == '\n';
            sep = 1;
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
            sep = 1;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            if (!end)
                return CUDA_ERROR_INVALID_PTX;
            p = end + 2;
            sep = 1;
        } else if (*p == '#' && line_start) {
            return CUDA_ERROR_NOT_SUPPORTED; /* the preprocessor is not modelled */
        } else {
            unsigned char kind;
            size_t len = token_at(p, &kind);
            if (!len)
                return CUDA_ERROR_INVALID_PTX;
            if (push(ts, p, len, kind, !sep) < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
            p += len;
            line_start = sep = 0;
        }
    }
    return CUDA_SUCCESS;
}

static int is(const struct tok *t, const char *s)
{
    return t->len == strlen(s) && memcmp(t->s, s, t->len) == 0;
}

/* ---- constant expressions (dimensions): C's integer operators and precedence ---- */

struct expr {
    const struct tok *t;
    int bad;
};

static uint64_t expr_or(struct expr *x);

/* The next token; never past the end. */
static const struct tok *take(struct expr *x)
{
    const struct tok *t = x->t;
    if (t->kind != T_END)
        x->t++;
    return t;
}

static uint64_t primary(struct expr *x)
{
    const struct tok *t = take(x);
    if (is(t, "(")) {
        uint64_t v = expr_or(x);
        if (!is(take(x), ")"))
            x->bad = 1;
        return v;
    }
    if (is(t, "-") || is(t, "~") || is(t, "!")) {
        uint64_t v = primary(x);
        return t->s[0] == '-' ? (uint64_t)0 - v : t->s[0] == '~' ? ~v : !v;
    }
    char buf[32];
    if (t->kind != T_NUMBER || t->len >= sizeof(buf)) {
        x->bad = 1;
        return 0;
    }
    memcpy(buf, t->s, t->len);
    buf[t->len] = '\0';
    char *end;
    errno = 0;
    uint64_t v = strtoull(buf, &end, 0);
    if (*end == 'U')
        end++;
    if (*end || errno)
        x->bad = 1;
    return v;
}

static uint64_t mul(struct expr *x)
{
    uint64_t v = primary(x);
    while (is(x->t, "*") || is(x->t, "/") || is(x->t, "%")) {
        char op = take(x)->s[0];
        uint64_t r = primary(x);
        if (op != '*' && r == 0)
            x->bad = 1;
        v = op == '*' ? v * r : r == 0 ? 0 : op == '/' ? v / r : v % r;
    }
    return v;
}

static uint64_t add(struct expr *x)
{
    uint64_t v = mul(x);
    while (is(x->t, "+") || is(x->t, "-")) {
        char op = take(x)->s[0];
        uint64_t r = mul(x);
        v = op == '+' ? v + r : v - r;
    }
    return v;
}

static uint64_t shift(struct expr *x)
{
    uint64_t v = add(x);
    while (is(x->t, "<<") || is(x->t, ">>")) {
        char op = take(x)->s[0];
        uint64_t r = add(x);
        if (r >= 64)
            x->bad = 1;
        v = r >= 64 ? 0 : op == '<' ? v << r : v >> r;
    }
    return v;
}

static uint64_t expr_or(struct expr *x)
{
    uint64_t v = shift(x);
    while (is(x->t, "&") || is(x->t, "^") || is(x->t, "|")) {
        char op = take(x)->s[0];
        uint64_t r = shift(x);
        v = op == '&' ? v & r : op == '^' ? v ^ r : v | r;
    }
    return v;
}

/* ---- declarations ---- */

/* Bytes of a type directive (`.u32`, `.f16x2`, `.b128`, the opaque `.texref`...), 0 if none. */
static uint64_t type_bytes(const struct tok *t)
{
    static const char *const opaque[] = {".texref", ".samplerref", ".surfref"};
    for (size_t i = 0; i < sizeof(opaque) / sizeof(*opaque); i++)
        if (is(t, opaque[i]))
            return 8;
    if (t->len < 3 || !strchr("ubsf", t->s[1]) || (t->s[1] == 'b' && t->s[2] == 'f'))
        return is(t, ".bf16") ? 2 : is(t, ".bf16x2") ? 4 : 0;
    char *end;
    unsigned long bits = strtoul(t->s + 2, &end, 10);
    size_t used = (size_t)(end - t->s);
    if (used + 2 == t->len && end[0] == 'x' && end[1] == '2')
        bits *= 2; /* .f16x2 */
    else if (used != t->len)
        return 0;
    return (bits == 8 || bits == 16 || bits == 32 || bits == 64 || bits == 128 || bits == 256)
               ? bits / 8
               : 0;
}

/* Skips a balanced (), [] or {} group starting at *t. */
static const struct tok *skip_group(const struct tok *t)
{
    int depth = 0;
    do {
        if (t->kind == T_END)
            return t;
        if (is(t, "(") || is(t, "[") || is(t, "{"))
            depth++;
        else if (is(t, ")") || is(t, "]") || is(t, "}"))
            depth--;
        t++;
    } while (depth > 0);
    return t;
}

/* Items at the top level of an initializer `{a, b, {c, d}}`: the omitted first dimension. */
static uint64_t initializer_items(const struct tok *t)
{
    if (!is(t, "{"))
        return 1;
    uint64_t n = 1;
    const struct tok *end = skip_group(t);
    for (t++; t < end - 1; t = skip_group(t))
        n += is(t, ",");
    return n;
}

struct vars {
    struct cu_var *v;
    size_t n, cap;
    uint64_t off;
};

static int add_var(struct vars *vs, const struct tok *name, uint64_t size, uint64_t align)
{
    if (vs->n == vs->cap) {
        size_t cap = vs->cap ? vs->cap * 2 : 8;
        struct cu_var *v = realloc(vs->v, cap * sizeof(*v));
        if (!v)
            return -1;
        vs->v = v;
        vs->cap = cap;
    }
    char *copy = strndup(name->s, name->len);
    if (!copy)
        return -1;
    uint64_t off = (vs->off + align - 1) / align * align;
    vs->v[vs->n++] = (struct cu_var){.name = copy, .offset = off, .size = size};
    vs->off = off + size;
    return 0;
}

/* One declaration whose state space is at t: its declarators appended to vs; the token after
 * its `;` in *next. */
static CUresult declaration(const struct tok *t, struct vars *vs, const struct tok **next)
{
    uint64_t elem = 0, vec = 1, align = 0;
    for (t++; t->kind == T_DIRECTIVE; t++) {
        if (is(t, ".align")) {
            struct expr x = {t + 1, 0};
            align = primary(&x);
            if (x.bad || align == 0 || (align & (align - 1)))
                return CUDA_ERROR_INVALID_PTX;
            t++;
        } else if (is(t, ".attribute")) {
            t = skip_group(t + 1) - 1;
        } else if (is(t, ".v2") || is(t, ".v4") || is(t, ".v8")) {
            vec = (uint64_t)(t->s[2] - '0');
        } else if (elem || !(elem = type_bytes(t))) {
            return CUDA_ERROR_INVALID_PTX; /* a second type, or a directive not modelled */
        }
    }
    if (!elem)
        return CUDA_ERROR_INVALID_PTX;
    for (;;) {
        const struct tok *name = t++;
        if (name->kind != T_IDENT)
            return CUDA_ERROR_INVALID_PTX;
        uint64_t count = 1;
        int open = 0;
        for (int dim = 0; is(t, "["); dim++) {
            if (is(t + 1, "]") && dim == 0) {
                open = 1;
                t += 2;
                continue;
            }
            struct expr x = {t + 1, 0};
            uint64_t d = expr_or(&x);
            if (x.bad || !is(x.t, "]") || __builtin_mul_overflow(count, d, &count))
                return CUDA_ERROR_INVALID_PTX;
            t = x.t + 1;
        }
        if (is(t, "=")) {
            t++;
            if (open && __builtin_mul_overflow(count, initializer_items(t), &count))
                return CUDA_ERROR_INVALID_PTX;
            open = 0;
            while (t->kind != T_END && !is(t, ",") && !is(t, ";"))
                t = skip_group(t);
        }
        uint64_t size;
        if (open || __builtin_mul_overflow(count, elem * vec, &size))
            return CUDA_ERROR_INVALID_PTX;
        if (add_var(vs, name, size, align > elem * vec ? align : elem * vec) < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (is(t, ";"))
            break;
        if (!is(t++, ","))
            return CUDA_ERROR_INVALID_PTX;
    }
    *next = t + 1;
    return CUDA_SUCCESS;
}

/* Whether the `.global`/`.const` at t declares variables: not part of an instruction
 * (`ld.global`, `cvta.to.global`: glued to an opcode) and not a parameter's pointer space
 * (`.ptr.global`), an `.extern` or another state space's declaration. */
static int declares(const struct toks *ts, size_t i)
{
    size_t k = i;
    while (k > 0 && ts->t[k].glued)
        k--;
    if (ts->t[k].kind == T_IDENT)
        return 0;
    static const char *const not_placed[] = {".extern", ".ptr", ".param", ".reg", ".local",
                                             ".shared", ".sreg", ".tex"};
    for (k = i; k > 0 && ts->t[k - 1].kind == T_DIRECTIVE; k--)
        for (size_t j = 0; j < sizeof(not_placed) / sizeof(*not_placed); j++)
            if (is(&ts->t[k - 1], not_placed[j]))
                return 0;
    return 1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct cu_var *)a)->name, ((const struct cu_var *)b)->name);
}

static CUresult collect(const char *text, struct vars *vs)
{
    struct toks ts = {0};
    CUresult r = lex(text, &ts);
    for (size_t i = 0; r == CUDA_SUCCESS && i < ts.n; i++) {
        const struct tok *t = &ts.t[i];
        if (t->kind != T_DIRECTIVE || !(is(t, ".global") || is(t, ".const")) || !declares(&ts, i))
            continue;
        const struct tok *next;
        r = declaration(t, vs, &next);
        if (r == CUDA_SUCCESS)
            i = (size_t)(next - ts.t) - 1;
    }
    free(ts.t);
    if (r == CUDA_SUCCESS && vs->n > 1) { /* a name defined twice is an error to a driver */
        struct cu_var *sorted = malloc(vs->n * sizeof(*sorted));
        if (!sorted)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(sorted, vs->v, vs->n * sizeof(*sorted));
        qsort(sorted, vs->n, sizeof(*sorted), by_name);
        for (size_t i = 1; i < vs->n && r == CUDA_SUCCESS; i++)
            if (strcmp(sorted[i - 1].name, sorted[i].name) == 0)
                r = CUDA_ERROR_INVALID_PTX;
        free(sorted);
    }
    return r;
}

/* The text with each backslash-newline removed; NULL on host OOM. */
static char *join_lines(const char *text)
{
    char *out = malloc(strlen(text) + 1), *o = out;
    if (!out)
        return NULL;
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

CUresult cu_ptx_vars(const char *text, struct cu_var **out, size_t *nout, uint64_t *bytes)
{
    char *joined = join_lines(text);
    if (!joined)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct vars vs = {0};
    CUresult r = collect(joined, &vs);
    free(joined);
    if (r != CUDA_SUCCESS) {
        cu_vars_free(vs.v, vs.n);
        return r;
    }
    *out = vs.v;
    *nout = vs.n;
    *bytes = vs.off;
    return CUDA_SUCCESS;
}

void cu_vars_free(struct cu_var *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}
