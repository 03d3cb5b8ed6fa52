/*
 * Stream memory operations in the shared state: the writes still queued behind their stream's
 * work, and what a wait on a memory word sees.
 *
 * Kernels do not run in the simulated GPU, so a word changes only through the host (copies,
 * memsets) and cuStreamWriteValue*.  A write on a stream lands when the stream's last kernel at
 * the time completes: at once on an idle stream (the bytes are stored then), else later, so it
 * waits here, in the state's table of pending writes, keyed by the word as every process names
 * it (struct sim_word), until its writer applies it (sim_mem_apply: the writer stores the bytes,
 * in its own mapping, the next time it looks at its work).  Until then the GPU's view of the word
 * is the table's: the last write whose kernel has completed, else the bytes in memory.
 *
 * A wait (cuStreamWaitValue*) whose condition that view meets does nothing.  Otherwise it gates
 * the waiter's channel in the engine: on the kernel of a pending write that will meet it (the
 * first queued), as a wait on an interprocess event does, or, with none queued yet, on the word
 * itself, until a later write meets it (common/engine.c, sim_engine_word_written_locked).
 * Host code that reads the word directly sees a pending write only once its writer applied it.
 */
#include "sim.h"

int sim_word_met(uint64_t cur, uint32_t op, uint64_t value, uint32_t size)
{
    const uint64_t mask = size == 4 ? 0xffffffffull : ~0ull;
    cur &= mask;
    value &= mask;
    switch (op) {
    case 0: /* CU_STREAM_WAIT_VALUE_GEQ: a cyclic greater-or-equal */
        return size == 4 ? (int32_t)(uint32_t)(cur - value) >= 0 : (int64_t)(cur - value) >= 0;
    case 1: return cur == value;             /* EQ */
    case 2: return (cur & value) != 0;       /* AND */
    case 3: return (~(cur | value) & mask) != 0; /* NOR */
    }
    return 0;
}

int sim_same_word(const struct sim_word *a, const struct sim_word *b)
{
    return a->ino == b->ino && a->off == b->off && a->owner == b->owner;
}

static uint64_t load(const void *mem, uint32_t size)
{
    return size == 4 ? __atomic_load_n((const uint32_t *)mem, __ATOMIC_ACQUIRE)
                     : __atomic_load_n((const uint64_t *)mem, __ATOMIC_ACQUIRE);
}

static void store(void *mem, uint32_t size, uint64_t value)
{
    if (size == 4)
        __atomic_store_n((uint32_t *)mem, (uint32_t)value, __ATOMIC_RELEASE);
    else
        __atomic_store_n((uint64_t *)mem, value, __ATOMIC_RELEASE);
}

/* Under lock: every engine committed up to now, so that "landed" means landed by now. */
static void advance_all_locked(struct sim_state *st)
{
    uint64_t now = sim_now_ns();
    for (unsigned d = 0; d < st->cfg.gpus && d < SIM_MAX_GPUS; d++)
        sim_engine_advance_locked(st, (int)d, now);
}

/* Under lock, engines advanced: the word as the GPU sees it (the last landed write in the table,
 * else `mem`), and in *meet the first pending write that would meet (op, value) (NULL: none). */
static uint64_t view_locked(const struct sim_state *st, const struct sim_word *w, const void *mem,
                            uint32_t op, uint64_t value, const struct sim_mem_write **meet)
{
    uint64_t cur = load(mem, w->size), landed_seq = 0;
    *meet = NULL;
    for (int i = 0; i < SIM_MEM_WRITES; i++) {
        const struct sim_mem_write *m = &st->mem_write[i];
        if (!m->owner || !sim_same_word(&m->word, w))
            continue;
        if (sim_engine_done_locked(st, m->dev, &m->after)) {
            if (m->seq > landed_seq) {
                landed_seq = m->seq;
                cur = m->value;
            }
        } else if (sim_word_met(m->value, op, value, w->size) && (!*meet || m->seq < (*meet)->seq)) {
            *meet = m;
        }
    }
    return cur;
}

int sim_mem_wait(struct sim_err *e, struct sim_state *st, int dev, const struct sim_word *w,
                 const void *mem, uint32_t op, uint64_t value)
{
    for (;;) {
        int c = sim_lock_own_slot(e, st);
        if (c < 0)
            return -1;
        advance_all_locked(st);
        const struct sim_mem_write *meet;
        if (sim_word_met(view_locked(st, w, mem, op, value, &meet), op, value, w->size)) {
            sim_unlock(st);
            return 0;
        }
        struct sim_ticket host = {0};
        int hdev = dev, rc;
        if (meet) { /* a queued write will meet it: follow its kernel (or an earlier write) */
            rc = meet->dev == dev ? sim_engine_gate_word_locked(st, dev, c, w, op, value, &meet->after)
                                  : -2;
            host = meet->after;
            hdev = meet->dev;
        } else {
            rc = sim_engine_gate_word_locked(st, dev, c, w, op, value, NULL);
        }
        sim_unlock(st);
        if (rc != -2)
            return rc;
        /* Another GPU's write, or our channel already has a gate: wait here, then look again. */
        if (!host.seq1)
            sim_sleep_until(sim_now_ns() + SIM_WORD_POLL_NS);
        else if (sim_engine_wait(e, st, hdev, &host, SIM_WAIT_SLEEP) < 0)
            return -1;
    }
}

/* Under lock: a free entry's index, or -1 when all are taken. */
static int free_entry_locked(const struct sim_state *st)
{
    for (int i = 0; i < SIM_MEM_WRITES; i++)
        if (!st->mem_write[i].owner)
            return i;
    return -1;
}

int sim_mem_write(struct sim_err *e, struct sim_state *st, int dev, const struct sim_word *w,
                  void *mem, uint64_t value, const struct sim_ticket *after, uint64_t *seq)
{
    int s = sim_slot_acquire(e, st);
    if (s < 0)
        return -1;
    for (;;) {
        if (sim_lock(e, st) < 0)
            return -1;
        advance_all_locked(st);
        int free;
        if (sim_engine_done_locked(st, dev, after)) { /* an idle stream: it lands now */
            store(mem, w->size, value);
            sim_engine_word_written_locked(st, dev, after, w, value);
            sim_unlock(st);
            return 0;
        }
        if ((free = free_entry_locked(st)) >= 0) {
            struct sim_mem_write *m = &st->mem_write[free];
            m->word = *w;
            m->value = value;
            m->dev = dev;
            m->after = *after;
            m->seq = *seq = ++st->mem_write_seq;
            m->owner = s + 1;
            sim_engine_word_written_locked(st, dev, after, w, value);
            sim_unlock(st);
            return free + 1;
        }
        sim_unlock(st);
        /* Every entry is taken: the caller blocks until its stream's work is done (a GPU would
         * not), and the write lands then. */
        if (sim_engine_wait(e, st, dev, after, SIM_WAIT_SLEEP) < 0)
            return -1;
    }
}

int sim_mem_apply(struct sim_err *e, struct sim_state *st, int index, uint64_t seq, void *mem)
{
    if (index < 0 || index >= SIM_MEM_WRITES)
        return 1;
    if (sim_lock(e, st) < 0)
        return -1;
    struct sim_mem_write *m = &st->mem_write[index];
    int slot = sim_slot_self();
    if (!m->owner || m->owner != slot + 1 || m->seq != seq) {
        sim_unlock(st);
        return 1; /* gone (freed by a repair or a sweep that judged us dead) */
    }
    sim_engine_advance_locked(st, m->dev, sim_now_ns());
    if (!sim_engine_done_locked(st, m->dev, &m->after)) {
        sim_unlock(st);
        return 0;
    }
    store(mem, m->word.size, m->value);
    sim_engine_word_written_locked(st, m->dev, &m->after, &m->word, m->value);
    m->owner = 0;
    sim_unlock(st);
    return 1;
}

void sim_mem_write_drop_locked(struct sim_state *st, int s)
{
    for (int i = 0; i < SIM_MEM_WRITES; i++)
        if (st->mem_write[i].owner == s + 1)
            st->mem_write[i].owner = 0;
}
