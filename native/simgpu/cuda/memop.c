/*
 * Stream memory operations, as the Driver API reference documents them:
 *   - cuStreamWriteValue32/64 write a value to a device word when the stream's earlier work is
 *     done; cuStreamWaitValue32/64 hold the stream's later work until a word meets a condition
 *     (CU_STREAM_WAIT_VALUE_GEQ cyclic, EQ, AND, NOR); cuStreamBatchMemOp queues several in
 *     order (plus memory barriers, which order nothing more here);
 *   - the word is device memory of this process, or memory another process shared with
 *     cuIpcGetMemHandle, so that one process's write releases another's wait on the GPU, or
 *     page-locked host memory of this process (hostmem.c: cuMemHostAlloc, cuMemHostRegister;
 *     a write to a range registered read-only is CUDA_ERROR_INVALID_VALUE), which, registered
 *     inside a shared mapping of a file, is the same word in every process that registers it;
 *   - the address must be aligned to the word's size and inside an allocation
 *     (CUDA_ERROR_INVALID_VALUE otherwise); unknown flags get CUDA_ERROR_INVALID_VALUE, and
 *     CU_STREAM_WAIT_VALUE_FLUSH and CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES, which need platform
 *     support (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES 0 here), CUDA_ERROR_NOT_SUPPORTED.
 * The writes, the waits and their gates live in the shared state (common/memop.c).  A write
 * queued behind work lands when that work completes, and this process stores its bytes the next
 * time it looks at its work (a synchronize, or its next memory operation).  A wait does not
 * block the caller: the engine holds the process's channel, so on this model all its streams
 * wait (a GPU holds only the waiting stream); a wait that needs the word written by later work
 * of the same process does not deadlock here only when that write is queued on an idle stream,
 * or on a stream held only by a wait on another process's event (ipcevent.c: a relay).
 * Capturing them into a graph is not modelled (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define WAIT_FLUSH (1u << 30) /* CU_STREAM_WAIT_VALUE_FLUSH */
#define WAIT_NOR 3u
#define WRITE_NO_MEMORY_BARRIER 1u
#define BATCH_MAX 256

enum { OP_WAIT_32 = 1, OP_WRITE_32 = 2, OP_FLUSH_REMOTE_WRITES = 3, OP_WAIT_64 = 4, OP_WRITE_64 = 5,
       OP_BARRIER = 6 };

/* CUstreamBatchMemOpParams: a 48-byte union whose members all start with the operation. */
union batch_op {
    uint32_t operation;
    struct {
        uint32_t operation;
        CUdeviceptr address;
        uint64_t value; /* a 32-bit operation reads the low half (little-endian) */
        unsigned int flags;
        CUdeviceptr alias;
    } value_op;
    struct {
        uint32_t operation;
        unsigned int flags;
    } barrier;
    uint64_t pad[6];
};
_Static_assert(sizeof(union batch_op) == 48, "CUstreamBatchMemOpParams is 48 bytes");

/* ---- this process's writes still queued behind their stream's work ------------------------ */

struct pending {
    int index;
    uint64_t seq;
    void *mem;
};

static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pending; /* [pending_mu] */
static size_t npending, cappending;

/* Stores the pending writes whose work has completed (common/memop.c keeps the GPU's view of
 * the word meanwhile). */
void cu_memop_land(void)
{
    if (!__atomic_load_n(&npending, __ATOMIC_RELAXED))
        return; /* the common case: a synchronize costs nothing more */
    pthread_mutex_lock(&pending_mu);
    size_t kept = 0;
    for (size_t i = 0; i < npending; i++) {
        struct sim_err e = {0};
        if (sim_mem_apply(&e, cu_g.st, pending[i].index, pending[i].seq, pending[i].mem) == 0)
            pending[kept++] = pending[i];
    }
    __atomic_store_n(&npending, kept, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pending_mu);
}

static CUresult remember(int index, uint64_t seq, void *mem)
{
    pthread_mutex_lock(&pending_mu);
    if (npending == cappending) {
        size_t cap = cappending ? cappending * 2 : 16;
        struct pending *n = realloc(pending, cap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&pending_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pending = n;
        cappending = cap;
    }
    pending[npending] = (struct pending){.index = index, .seq = seq, .mem = mem};
    __atomic_store_n(&npending, npending + 1, __ATOMIC_RELAXED); /* read outside the mutex */
    pthread_mutex_unlock(&pending_mu);
    return CUDA_SUCCESS;
}

void cu_memop_fork_child(void)
{
    pthread_mutex_init(&pending_mu, NULL);
    __atomic_store_n(&npending, 0, __ATOMIC_RELAXED); /* the parent's writes: its slot's, never the child's to store */
}

/* ---- the operations ------------------------------------------------------------------------ */

/* The word at addr, of size bytes, as every process names it; `write`: to be written (not
 * read-only page-locked memory). */
static CUresult word_of(CUdeviceptr addr, uint32_t size, int write, struct sim_word *w)
{
    if (!addr || addr % size)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t ino = 0, off = 0;
    int read_only = 0;
    if (cu_mem_word((uintptr_t)addr, size, &ino, &off) < 0 &&
        (cu_host_range((uintptr_t)addr, size, &read_only) < 0 || (write && read_only)))
        return CUDA_ERROR_INVALID_VALUE; /* neither device memory nor page-locked host memory */
    if (!ino)
        cu_host_file((uintptr_t)addr, &ino, &off); /* a shared file's: every process's word */
    *w = (struct sim_word){.ino = ino, .off = ino ? off : (uint64_t)addr, .size = size};
    if (!ino) { /* never exported: this process's own word */
        struct sim_err e = {0};
        int s = sim_slot_acquire(&e, cu_g.st);
        if (s < 0)
            return cu_result(&e);
        w->owner = s + 1;
    }
    return CUDA_SUCCESS;
}

/* The stream a memory operation goes on: capture is not modelled. */
static CUresult memop_stream(CUstream h, struct CUstream_st **s)
{
    CUresult r = cu_stream(h, s);
    if (r)
        return r;
    return (*s)->capture ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

static CUresult check_wait(CUdeviceptr addr, unsigned flags, uint32_t size, struct sim_word *w)
{
    if (flags & WAIT_FLUSH)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (flags > WAIT_NOR)
        return CUDA_ERROR_INVALID_VALUE;
    return word_of(addr, size, 0, w);
}

static CUresult check_write(CUdeviceptr addr, unsigned flags, uint32_t size, struct sim_word *w)
{
    if (flags & ~WRITE_NO_MEMORY_BARRIER)
        return CUDA_ERROR_INVALID_VALUE;
    return word_of(addr, size, 1, w);
}

static CUresult do_wait(struct CUstream_st *s, const struct sim_word *w, CUdeviceptr addr,
                        uint64_t value, unsigned op)
{
    CUresult r = cu_stream_settle(s);
    if (r)
        return r;
    struct sim_err e = {0};
    int rc = sim_mem_wait(&e, cu_g.st, s->ctx->phys, w, (const void *)(uintptr_t)addr, op, value);
    if (rc == 1) {
        /* The stream now waits: a 0 µs marker behind the gate is its last work (as behind a
         * wait on an interprocess event), for its later records, queries and syncs. */
        static const uint64_t marker = 0;
        rc = sim_engine_submit(&e, cu_g.st, s->ctx->phys, &s->q, &s->ctx->last, &marker, 1);
    }
    return rc < 0 ? cu_result(&e) : CUDA_SUCCESS;
}

static CUresult do_write(struct CUstream_st *s, const struct sim_word *w, CUdeviceptr addr,
                         uint64_t value)
{
    struct sim_ticket held;
    const struct sim_ticket *after;
    CUresult r = cu_stream_write_after(s, &held, &after);
    if (r)
        return r;
    struct sim_err e = {0};
    uint64_t seq = 0;
    void *mem = (void *)(uintptr_t)addr;
    int k = sim_mem_write(&e, cu_g.st, s->ctx->phys, w, mem, value, after, &seq);
    if (k < 0)
        return cu_result(&e);
    return k ? remember(k - 1, seq, mem) : CUDA_SUCCESS;
}

static CUresult wait_value(CUstream h, CUdeviceptr addr, uint64_t value, unsigned flags, uint32_t size)
{
    struct CUstream_st *s;
    CUresult r = memop_stream(h, &s);
    struct sim_word w;
    if (r || (r = check_wait(addr, flags, size, &w)))
        return r;
    cu_memop_land();
    return do_wait(s, &w, addr, value, flags);
}

static CUresult write_value(CUstream h, CUdeviceptr addr, uint64_t value, unsigned flags, uint32_t size)
{
    struct CUstream_st *s;
    CUresult r = memop_stream(h, &s);
    struct sim_word w;
    if (r || (r = check_write(addr, flags, size, &w)))
        return r;
    cu_memop_land();
    return do_write(s, &w, addr, value);
}

/* Every operation is checked before the first is queued: a bad one queues none. */
static CUresult batch(CUstream h, unsigned count, const union batch_op *ops, unsigned flags)
{
    struct CUstream_st *s;
    CUresult r = memop_stream(h, &s);
    if (r)
        return r;
    if (flags || count == 0 || count > BATCH_MAX || !ops)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_word *words = calloc(count, sizeof(*words));
    if (!words)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (unsigned i = 0; i < count && !r; i++) {
        const union batch_op *o = &ops[i];
        switch (o->operation) {
        case OP_WAIT_32:
        case OP_WAIT_64:
            r = check_wait(o->value_op.address, o->value_op.flags, o->operation == OP_WAIT_32 ? 4 : 8,
                           &words[i]);
            break;
        case OP_WRITE_32:
        case OP_WRITE_64:
            r = check_write(o->value_op.address, o->value_op.flags,
                            o->operation == OP_WRITE_32 ? 4 : 8, &words[i]);
            break;
        case OP_BARRIER: r = o->barrier.flags > 1 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; break;
        case OP_FLUSH_REMOTE_WRITES: r = CUDA_ERROR_NOT_SUPPORTED; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!r)
        cu_memop_land();
    for (unsigned i = 0; i < count && !r; i++) {
        const union batch_op *o = &ops[i];
        /* A 32-bit operation's value is the low half of the union (the rest is not set). */
        const uint64_t value = words[i].size == 4 ? (uint32_t)o->value_op.value : o->value_op.value;
        if (o->operation == OP_WAIT_32 || o->operation == OP_WAIT_64)
            r = do_wait(s, &words[i], o->value_op.address, value, o->value_op.flags);
        else if (o->operation == OP_WRITE_32 || o->operation == OP_WRITE_64)
            r = do_write(s, &words[i], o->value_op.address, value);
    }
    free(words);
    return r;
}

/* The v1 entry points (older binaries) take the same arguments and behave the same here. */
#define MEMOP_ENTRY(name, impl, vtype, size)                                                       \
    SIM_EXPORT CUresult name(CUstream stream, CUdeviceptr addr, vtype value, unsigned int flags)  \
    {                                                                                              \
        return impl(stream, addr, value, flags, size);                                             \
    }
#define MEMOP_ENTRIES(base, impl, vtype, size)                                                     \
    MEMOP_ENTRY(base, impl, vtype, size)                                                           \
    MEMOP_ENTRY(base##_ptsz, impl, vtype, size)                                                    \
    MEMOP_ENTRY(base##_v2, impl, vtype, size)                                                      \
    MEMOP_ENTRY(base##_v2_ptsz, impl, vtype, size)

MEMOP_ENTRIES(cuStreamWaitValue32, wait_value, cuuint32_t, 4)
MEMOP_ENTRIES(cuStreamWaitValue64, wait_value, cuuint64_t, 8)
MEMOP_ENTRIES(cuStreamWriteValue32, write_value, cuuint32_t, 4)
MEMOP_ENTRIES(cuStreamWriteValue64, write_value, cuuint64_t, 8)

#define BATCH_ENTRY(name)                                                                          \
    SIM_EXPORT CUresult name(CUstream stream, unsigned int count, void *paramArray,               \
                             unsigned int flags)                                                   \
    {                                                                                              \
        return batch(stream, count, paramArray, flags);                                            \
    }
BATCH_ENTRY(cuStreamBatchMemOp)
BATCH_ENTRY(cuStreamBatchMemOp_ptsz)
BATCH_ENTRY(cuStreamBatchMemOp_v2)
BATCH_ENTRY(cuStreamBatchMemOp_v2_ptsz)
