/*
 * A first-fit allocator over address ranges (device memory regions, offsets in the VMM backing
 * file).  Free ranges are kept sorted and coalesced, so a freed range is reused and the live
 * set stays small.  Callers hold their own lock.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

static int arena_reserve(struct arena *a, size_t want)
{
    if (want <= a->cap)
        return 0;
    size_t cap = a->cap ? a->cap * 2 : 64;
    while (cap < want)
        cap *= 2;
    struct arena_range *r = realloc(a->r, cap * sizeof(*r));
    if (!r)
        return -1;
    a->r = r;
    a->cap = cap;
    return 0;
}

int arena_take(struct arena *a, size_t size, size_t align, uintptr_t *out)
{
    for (size_t i = 0; i < a->n; i++) {
        struct arena_range *f = &a->r[i];
        uintptr_t start = (f->start + align - 1) & ~(uintptr_t)(align - 1);
        size_t pad = start - f->start;
        if (pad > f->len || f->len - pad < size)
            continue;
        size_t after = f->len - pad - size;
        if (pad && after) {
            /* Split into two free ranges around the allocation. */
            if (arena_reserve(a, a->n + 1) < 0)
                return -1;
            f = &a->r[i];
            memmove(&a->r[i + 2], &a->r[i + 1], (a->n - i - 1) * sizeof(*f));
            a->r[i + 1].start = start + size;
            a->r[i + 1].len = after;
            a->n++;
            f->len = pad;
        } else if (pad) {
            f->len = pad;
        } else if (after) {
            f->start = start + size;
            f->len = after;
        } else {
            memmove(&a->r[i], &a->r[i + 1], (a->n - i - 1) * sizeof(*f));
            a->n--;
        }
        *out = start;
        return 0;
    }
    return -1;
}

int arena_give(struct arena *a, uintptr_t start, size_t len)
{
    /* Binary search for the first range after start. */
    size_t lo = 0, hi = a->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->r[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    int join_prev = lo > 0 && a->r[lo - 1].start + a->r[lo - 1].len == start;
    int join_next = lo < a->n && start + len == a->r[lo].start;
    if (join_prev && join_next) {
        a->r[lo - 1].len += len + a->r[lo].len;
        memmove(&a->r[lo], &a->r[lo + 1], (a->n - lo - 1) * sizeof(a->r[0]));
        a->n--;
    } else if (join_prev) {
        a->r[lo - 1].len += len;
    } else if (join_next) {
        a->r[lo].start = start;
        a->r[lo].len += len;
    } else {
        if (arena_reserve(a, a->n + 1) < 0)
            return -1; /* the range leaks: host memory is exhausted anyway */
        memmove(&a->r[lo + 1], &a->r[lo], (a->n - lo) * sizeof(a->r[0]));
        a->r[lo].start = start;
        a->r[lo].len = len;
        a->n++;
    }
    return 0;
}
