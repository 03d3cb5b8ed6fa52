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
        done = !t.seq1 ? 1 : wait ? (sim_engine_wait(&e, cu_g.st, dev, &t) < 0 ? -1 : 1)
                                  : sim_engine_query(&e, cu_g.st, dev, &t);
    else
        done = -1;
    if (done < 0)
        *r = cu_result(&e);
    return done;
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
    int rc = dev == s->ctx->phys ? sim_engine_gate(&e, cu_g.st, dev, &t) /* on the GPU */
                                 : sim_engine_wait(&e, cu_g.st, dev, &t); /* another GPU: here */
    if (rc == 1 && dev == s->ctx->phys) {
        /* The stream now waits: a 0 µs marker behind the gate is its last work, so that an event
         * recorded on it completes, and a query or sync of it returns, when the gate opens. */
        static const uint64_t marker = 0;
        rc = sim_engine_submit(&e, cu_g.st, dev, &s->q, &s->ctx->last, &marker, 1);
    }
    return rc < 0 ? cu_result(&e) : CUDA_SUCCESS;
}
