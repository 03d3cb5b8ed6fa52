/*
 * The process-local allocation table (shim.h, sg_track and the rest): which of this process's
 * device pointers, VMM handles and arrays the ledger charged, to which device's limits and for
 * how many bytes, so that a free credits exactly what its allocation was charged (ledger.c).
 * Taken on every allocation and free: one compare-and-swap to take its lock uncontended.
 */
#include <stdlib.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/* Open addressing, linear probing, backward-shift deletion (no tombstones), grown at half
 * load.  Keys are (kind, pointer or handle): device pointers, VMM handles and arrays live in
 * different name spaces. */
struct entry {
    uint64_t key;
    uint32_t kind; /* enum sg_kind; SG_KIND_NONE = empty */
    int32_t idx;
    uint64_t bytes;
    CUcontext ctx;
};

/* The table's lock: taken on every allocation and free, held for a probe of the table.  A
 * futex word (Drepper, "Futexes Are Tricky", mutex 2): one compare-and-swap to take and one
 * exchange to give when uncontended, a third of what a pthread mutex costs here; 0 free, 1
 * taken, 2 taken with waiters. */
static uint32_t map_lock;

static void map_lock_wait(uint32_t c)
{
    if (c != 2)
        c = __atomic_exchange_n(&map_lock, 2, __ATOMIC_ACQUIRE);
    while (c != 0) {
        syscall(SYS_futex, &map_lock, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        c = __atomic_exchange_n(&map_lock, 2, __ATOMIC_ACQUIRE);
    }
}

static inline void map_lock_take(void)
{
    uint32_t c = 0;
    if (!__atomic_compare_exchange_n(&map_lock, &c, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        map_lock_wait(c);
}

static inline void map_lock_give(void)
{
    if (__atomic_exchange_n(&map_lock, 0, __ATOMIC_RELEASE) == 2)
        syscall(SYS_futex, &map_lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
static struct entry *tab;  /* [map_lock] */
static size_t tab_mask;    /* [map_lock] capacity - 1 */
static size_t tab_count;   /* [map_lock] written; read relaxed as an emptiness hint */

static size_t home(uint32_t kind, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)kind << 61)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & tab_mask;
}

static struct entry *find_locked(uint32_t kind, uint64_t key)
{
    if (!tab)
        return NULL;
    for (size_t i = home(kind, key);; i = (i + 1) & tab_mask) {
        struct entry *en = &tab[i];
        if (en->kind == SG_KIND_NONE)
            return NULL;
        if (en->kind == kind && en->key == key)
            return en;
    }
}

static void place_locked(const struct entry *en)
{
    size_t i = home(en->kind, en->key);
    while (tab[i].kind != SG_KIND_NONE)
        i = (i + 1) & tab_mask;
    tab[i] = *en;
}

static int grow_locked(void)
{
    size_t old_cap = tab ? tab_mask + 1 : 0;
    size_t cap = old_cap ? old_cap * 2 : 1024;
    struct entry *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return -1;
    struct entry *old = tab;
    tab = fresh;
    tab_mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].kind != SG_KIND_NONE)
            place_locked(&old[i]);
    free(old);
    return 0;
}

static void erase_locked(struct entry *en)
{
    size_t i = (size_t)(en - tab);
    for (size_t j = (i + 1) & tab_mask; tab[j].kind != SG_KIND_NONE; j = (j + 1) & tab_mask) {
        size_t k = home(tab[j].kind, tab[j].key);
        /* Move j back into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            tab[i] = tab[j];
            i = j;
        }
    }
    tab[i].kind = SG_KIND_NONE;
    __atomic_store_n(&tab_count, tab_count - 1, __ATOMIC_RELAXED);
}

int sg_track(enum sg_kind kind, uint64_t key, const struct sg_charge *c, struct sg_err *e)
{
    if (!c->active)
        return 0;
    struct entry stale = {0};
    map_lock_take();
    struct entry *en = find_locked(kind, key);
    if (en) {
        /* The driver handed out a key we still hold: its free went by a path we do not see
         * (e.g. a legacy entry point).  The old charge is stale; replace it. */
        stale = *en;
        en->idx = c->idx;
        en->bytes = c->bytes;
        en->ctx = c->ctx;
    } else {
        if ((tab_count + 1) * 2 > (tab ? tab_mask + 1 : 0) && grow_locked() < 0) {
            map_lock_give();
            return sg_fail(e, SG_E_NOMEM, "cannot grow the allocation table");
        }
        struct entry fresh = {
            .key = key, .kind = kind, .idx = c->idx, .bytes = c->bytes, .ctx = c->ctx};
        place_locked(&fresh);
        __atomic_store_n(&tab_count, tab_count + 1, __ATOMIC_RELAXED);
    }
    map_lock_give();
    if (stale.kind != SG_KIND_NONE) {
        struct sg_charge old = {.active = true, .idx = stale.idx, .bytes = stale.bytes};
        sg_credit(&old);
    }
    return 0;
}

bool sg_untrack(enum sg_kind kind, uint64_t key, struct sg_charge *out)
{
    out->active = false;
    /* An empty table (always so when inert) costs one relaxed load: a key is tracked before
     * its allocation call returns, so no free of it can race with its insertion. */
    if (__atomic_load_n(&tab_count, __ATOMIC_RELAXED) == 0)
        return false;
    map_lock_take();
    struct entry *en = find_locked(kind, key);
    if (en) {
        out->active = true;
        out->idx = en->idx;
        out->bytes = en->bytes;
        out->ctx = en->ctx;
        erase_locked(en);
    }
    map_lock_give();
    return out->active;
}

bool sg_tracked(enum sg_kind kind, uint64_t key)
{
    if (__atomic_load_n(&tab_count, __ATOMIC_RELAXED) == 0)
        return false;
    map_lock_take();
    bool held = find_locked(kind, key) != NULL;
    map_lock_give();
    return held;
}

void sg_retrack(enum sg_kind kind, uint64_t key, const struct sg_charge *c)
{
    struct sg_err e;
    if (sg_track(kind, key, c, &e) < 0)
        sg_credit(c); /* cannot hold it: stop charging for it rather than leak */
}

void sg_credit_context(CUcontext ctx)
{
    if (!ctx || __atomic_load_n(&tab_count, __ATOMIC_RELAXED) == 0)
        return;
    /* Collect the context's entries first: erasing shifts entries while we scan. */
    map_lock_take();
    size_t n = 0, cap = tab_mask + 1;
    struct entry *gone = malloc(tab_count * sizeof *gone);
    for (size_t i = 0; gone && i < cap; i++)
        if (tab[i].kind != SG_KIND_NONE && tab[i].ctx == ctx)
            gone[n++] = tab[i];
    for (size_t i = 0; i < n; i++)
        erase_locked(find_locked(gone[i].kind, gone[i].key));
    map_lock_give();
    for (size_t i = 0; i < n; i++) {
        struct sg_charge c = {.active = true, .idx = gone[i].idx, .bytes = gone[i].bytes};
        sg_credit(&c);
    }
    free(gone);
}

void sg_alloc_table_lock(void)
{
    map_lock_take();
}

void sg_alloc_table_unlock(void)
{
    map_lock_give();
}

void sg_alloc_table_forget(void)
{
    map_lock = 0; /* held, if at all, by a thread the child does not have */
    free(tab);
    tab = NULL;
    tab_mask = 0;
    tab_count = 0;
}
