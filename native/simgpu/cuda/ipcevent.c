/*
 * Interprocess events, as the Driver API reference documents them:
 *   - cuIpcGetEventHandle takes an event made with CU_EVENT_INTERPROCESS and
 *     CU_EVENT_DISABLE_TIMING (else CUDA_ERROR_INVALID_VALUE) and returns a 64-byte handle;
 *   - another process opens it with cuIpcOpenEventHandle into an event that behaves like one
 *     made with CU_EVENT_DISABLE_TIMING, and frees it with cuEventDestroy;
 *   - cuEventRecord, cuEventQuery, cuEventSynchronize and cuStreamWaitEvent then work in either
 *     process on the one event: a wait in one process for a record in the other orders their
 *     work on the GPU (the engine's gates, common/engine.c), without blocking the caller.
 * The last record lives in the shared state (common/ipcevent.c); the handle names its entry and
 * the state it belongs to.  Operations after the exporter destroyed the event are undefined in
 * CUDA; here they see a completed event.
 *
 * Held streams.  The engine gates a whole channel (all of a process's streams on a GPU), where a
 * GPU holds only the waiting stream.  So a wait on another process's event first holds only its
 * stream (CUstream_st.hold): memory writes queued on that stream follow the awaited kernel in the
 * state's table of writes, and the process's other streams go on.  The stream's next other work
 * (a kernel, a copy, a record, a wait, a free) puts the wait on the channel's gate first
 * (cu_stream_settle), as before; a query or a synchronize of it looks at the awaited kernel
 * and gates nothing.  That makes the relay exact (a stream that waits for another
 * process's event and then writes a word that another stream waits for): a relay whose event
 * never completes holds nobody else, and another write of the word opens the waiter.  A context
 * synchronize does not wait for a held stream's writes (a GPU's would).
 */
#include "cu.h"

#include <string.h>

#define IPC_EVENT_MAGIC "SGIPCEV"
#define CU_EVENT_INTERPROCESS 0x4u
#define CU_EVENT_DISABLE_TIMING 0x2u

struct ipc_event_wire {
    char magic[8];
    uint64_t state; /* the state's creation instant: a handle of another simulated node misses */
    uint64_t gen;
    uint32_t index;
    char pad[36];
};
_Static_assert(sizeof(struct ipc_event_wire) == sizeof(CUipcEventHandle), "an IPC handle is 64 bytes");

SIM_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!pHandle || !event || event->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned need = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    if ((event->flags & need) != need)
        return CUDA_ERROR_INVALID_VALUE;
    if (!event->ipc) { /* the first export: from now on its records are shared */
        struct sim_err e = {0};
        if (sim_ipc_event_alloc(&e, cu_g.st, &event->ipc_index, &event->ipc_gen) < 0)
            return cu_result(&e);
        event->ipc = EVENT_IPC_EXPORTED;
        /* Recorded before the export: that record is the shared event's too.  Only this
         * process's threads record it, so its ticket is read without the state lock. */
        if (__atomic_load_n(&event->recorded, __ATOMIC_ACQUIRE) &&
            !__atomic_load_n(&event->w.at, __ATOMIC_ACQUIRE) &&
            sim_ipc_event_publish(&e, cu_g.st, event->ipc_index, event->ipc_gen, event->w.dev,
                                  &event->w.t) < 0)
            return cu_result(&e);
    }
    struct ipc_event_wire w = {.state = cu_g.st->created_ns, .gen = event->ipc_gen,
                               .index = event->ipc_index};
    memcpy(w.magic, IPC_EVENT_MAGIC, sizeof(IPC_EVENT_MAGIC));
    memcpy(pHandle, &w, sizeof(w));
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct ipc_event_wire w;
    memcpy(&w, &handle, sizeof(w));
    if (memcmp(w.magic, IPC_EVENT_MAGIC, sizeof(IPC_EVENT_MAGIC)) || w.state != cu_g.st->created_ns ||
        w.index >= SIM_IPC_EVENTS)
        return CUDA_ERROR_INVALID_VALUE; /* not an event handle of this node */
    struct sim_err e = {0};
    int live = sim_ipc_event_live(&e, cu_g.st, w.index, w.gen);
    if (live < 0)
        return cu_result(&e);
    if (!live)
        return CUDA_ERROR_INVALID_HANDLE; /* its exporter destroyed it, or died */
    struct CUevent_st *ev = cu_event_new(c, CU_EVENT_DISABLE_TIMING);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->ipc = EVENT_IPC_IMPORTED;
    ev->ipc_index = w.index;
    ev->ipc_gen = w.gen;
    *phEvent = ev;
    return CUDA_SUCCESS;
}

CUresult cu_ipc_event_record(CUevent ev, struct CUstream_st *s)
{
    CUresult r = cu_stream_settle(s);
    if (r)
        return r;
    struct sim_err e = {0};
    if (sim_ipc_event_publish(&e, cu_g.st, ev->ipc_index, ev->ipc_gen, s->ctx->phys, &s->q.last) < 0)
        return cu_result(&e);
    return CUDA_SUCCESS;
}

int cu_ipc_event_done(CUevent ev, int wait, CUresult *r)
{
    struct sim_err e = {0};
    struct sim_ticket t;
    int dev, done = 0;
    if (sim_ipc_event_read(&e, cu_g.st, ev->ipc_index, ev->ipc_gen, &dev, &t) == 0)
        done = !t.seq1 ? 1 : wait ? (sim_engine_wait(&e, cu_g.st, dev, &t, cu_event_wait_how(ev)) < 0 ? -1 : 1)
                                  : sim_engine_query(&e, cu_g.st, dev, &t);
    else
        done = -1;
    if (done < 0)
        *r = cu_result(&e);
    return done;
}

/* Kernel t of this GPU gates s's channel; the stream's marker behind the gate follows it. */
static CUresult gate(struct CUstream_st *s, const struct sim_ticket *t)
{
    struct sim_err e = {0};
    const int dev = s->ctx->phys;
    int rc = sim_engine_gate(&e, cu_g.st, dev, t);
    if (rc == 1) {
        /* The stream now waits: a 0 µs marker behind the gate is its last work, so that an event
         * recorded on it completes, and a query or sync of it returns, when the gate opens. */
        static const uint64_t marker = 0;
        rc = sim_engine_submit(&e, cu_g.st, dev, &s->q, &s->ctx->last, &marker, 1);
    }
    return rc < 0 ? cu_result(&e) : CUDA_SUCCESS;
}

static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct sim_ticket no_hold = {0};

void cu_ipc_event_fork_child(void)
{
    pthread_mutex_init(&hold_mu, NULL);
}

/* Whether s may have a held wait: one load, no lock (the common case is none). */
static int may_hold(const struct CUstream_st *s)
{
    return __atomic_load_n(&s->hold.seq1, __ATOMIC_ACQUIRE) != 0;
}

/* [hold_mu] s's held wait becomes t (seq1 last: may_hold reads it without the lock). */
static void set_hold(struct CUstream_st *s, const struct sim_ticket *t)
{
    s->hold.chan = t->chan;
    __atomic_store_n(&s->hold.seq1, t->seq1, __ATOMIC_RELEASE);
}

/* [hold_mu] s's held wait (seq1 0: none). */
static struct sim_ticket read_hold(const struct CUstream_st *s)
{
    return (struct sim_ticket){.seq1 = __atomic_load_n(&s->hold.seq1, __ATOMIC_RELAXED),
                               .chan = s->hold.chan};
}

/* s's held wait (seq1 0: none), read under hold_mu. */
static struct sim_ticket peek_hold(const struct CUstream_st *s)
{
    pthread_mutex_lock(&hold_mu);
    struct sim_ticket t = read_hold(s);
    pthread_mutex_unlock(&hold_mu);
    return t;
}

/* Takes s's held wait (seq1 0: none). */
static struct sim_ticket take_hold(struct CUstream_st *s)
{
    if (!may_hold(s))
        return no_hold;
    pthread_mutex_lock(&hold_mu);
    struct sim_ticket t = read_hold(s);
    set_hold(s, &no_hold);
    pthread_mutex_unlock(&hold_mu);
    return t;
}

CUresult cu_stream_settle(struct CUstream_st *s)
{
    struct sim_ticket t = take_hold(s);
    return t.seq1 ? gate(s, &t) : CUDA_SUCCESS;
}

int cu_stream_hold_done(struct CUstream_st *s, int wait, CUresult *r)
{
    struct sim_ticket held = may_hold(s) ? peek_hold(s) : no_hold;
    if (!held.seq1)
        return 1;
    struct sim_err e = {0};
    int done = wait ? (sim_engine_wait(&e, cu_g.st, s->ctx->phys, &held, cu_wait_how(s->ctx)) < 0 ? -1 : 1)
                    : sim_engine_query(&e, cu_g.st, s->ctx->phys, &held);
    if (done < 0) {
        *r = cu_result(&e);
        return -1;
    }
    if (done) {
        pthread_mutex_lock(&hold_mu);
        struct sim_ticket now = read_hold(s);
        if (now.seq1 == held.seq1 && now.chan == held.chan)
            set_hold(s, &no_hold); /* nothing left to wait for (unless another wait came meanwhile) */
        pthread_mutex_unlock(&hold_mu);
    }
    return done;
}

CUresult cu_stream_write_after(struct CUstream_st *s, struct sim_ticket *held,
                               const struct sim_ticket **after)
{
    *after = &s->q.last; /* the common case */
    if (!may_hold(s))
        return CUDA_SUCCESS;
    struct sim_err e = {0};
    int idle = sim_engine_query(&e, cu_g.st, s->ctx->phys, &s->q.last);
    if (idle < 0)
        return cu_result(&e);
    *held = peek_hold(s);
    if (idle && held->seq1) {
        *after = held; /* only the awaited kernel is ahead of the write */
        return CUDA_SUCCESS;
    }
    return cu_stream_settle(s); /* the stream's own work is ahead too: gate as before */
}

CUresult cu_ipc_event_gate(CUevent ev, struct CUstream_st *s)
{
    struct sim_err e = {0};
    struct sim_ticket t;
    int dev;
    if (sim_ipc_event_read(&e, cu_g.st, ev->ipc_index, ev->ipc_gen, &dev, &t) < 0)
        return cu_result(&e);
    if (!t.seq1)
        return CUDA_SUCCESS; /* never recorded, or nothing was pending: nothing to wait for */
    if (dev != s->ctx->phys) {
        CUresult r = cu_stream_settle(s);
        if (r)
            return r;
        return sim_engine_wait(&e, cu_g.st, dev, &t, cu_wait_how(s->ctx)) < 0 ? cu_result(&e) : CUDA_SUCCESS; /* here */
    }
    pthread_mutex_lock(&hold_mu);
    struct sim_ticket held = read_hold(s);
    const int merge = !held.seq1 || held.chan == t.chan; /* one kernel to wait for: the later */
    if (merge && t.seq1 > held.seq1)
        set_hold(s, &t);
    pthread_mutex_unlock(&hold_mu);
    if (merge)
        return CUDA_SUCCESS;
    CUresult r = cu_stream_settle(s); /* the earlier wait gates the channel; this one is held */
    if (r)
        return r;
    pthread_mutex_lock(&hold_mu);
    set_hold(s, &t);
    pthread_mutex_unlock(&hold_mu);
    return CUDA_SUCCESS;
}
