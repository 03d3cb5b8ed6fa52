/*
 * Streams and events.  A stream is a queue of kernels on its process's channel of the GPU engine
 * (common/engine.c): it remembers its last kernel, so synchronising waits for that kernel and
 * querying asks whether it has completed.  The default stream (0, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) is one queue per context; legacy-stream implicit synchronisation with
 * other streams is not modelled beyond cuCtxSynchronize and synchronous copies waiting for all
 * work of the context.  An event completes with the last kernel its stream had when it was
 * recorded (at the record instant if the stream was idle) and keeps that completion instant.
 * An interprocess event (ipcevent.c) keeps its last record in the shared state instead, where
 * every process that opened it records, waits and queries.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_FLAGS_VALID 0x7u  /* BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4 */
#define CU_EVENT_DISABLE_TIMING 0x2u

void cu_stream_init(struct CUstream_st *s, struct CUctx_st *c, unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->ctx = c;
    s->flags = flags;
    s->id = cu_next_id();
    s->magic = STREAM_MAGIC;
}

CUresult cu_stream(CUstream h, struct CUstream_st **out)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct CUctx_st *c;
        CUresult r = cu_ctx_current(&c);
        if (r)
            return r;
        *out = &c->defstream;
        return CUDA_SUCCESS;
    }
    CUresult r = cu_ready();
    if (r)
        return r;
    if (h->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cu_ctx_alive(h->ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = h;
    return CUDA_SUCCESS;
}

CUresult cu_stream_wait(struct CUstream_st *s)
{
    CUresult r = CUDA_SUCCESS;
    if (cu_stream_hold_done(s, 1, &r) < 0)
        return r;
    struct sim_err e = {0};
    if (sim_engine_wait(&e, cu_g.st, s->ctx->phys, &s->q.last, cu_wait_how(s->ctx)) < 0)
        return cu_result(&e);
    cu_memop_land();
    return CUDA_SUCCESS;
}

/* Priorities are kept and reported, not scheduled: kernels of one process run in launch order
 * on its channel (see the top of this file), as they would on one hardware queue. */
static CUresult stream_create(CUstream *stream, unsigned flags, int priority)
{
    if (!stream || (flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    struct CUstream_st *s = malloc(sizeof(*s));
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    cu_stream_init(s, c, flags);
    /* Out-of-range priorities are clamped, as the driver documents. */
    s->priority = priority > CU_STREAM_PRIORITY_LEAST      ? CU_STREAM_PRIORITY_LEAST
                  : priority < CU_STREAM_PRIORITY_GREATEST ? CU_STREAM_PRIORITY_GREATEST
                                                           : priority;
    *stream = s;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    return stream_create(stream, flags, CU_STREAM_PRIORITY_LEAST);
}

SIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    return stream_create(phStream, flags, priority);
}

SIM_EXPORT CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    if (leastPriority)
        *leastPriority = CU_STREAM_PRIORITY_LEAST;
    if (greatestPriority)
        *greatestPriority = CU_STREAM_PRIORITY_GREATEST;
    return CUDA_SUCCESS;
}

/* ---- stream queries: every one has a _ptsz twin, so each is written once ---------------- */

/* The stream a query names, once its output pointer is known to be there. */
static CUresult queried(CUstream h, const void *out, struct CUstream_st **s)
{
    return out ? cu_stream(h, s) : CUDA_ERROR_INVALID_VALUE;
}

static CUresult stream_priority(CUstream h, int *priority)
{
    struct CUstream_st *s;
    CUresult r = queried(h, priority, &s);
    if (!r)
        *priority = s->priority;
    return r;
}

static CUresult stream_flags(CUstream h, unsigned *flags)
{
    struct CUstream_st *s;
    CUresult r = queried(h, flags, &s);
    if (!r)
        *flags = s->flags;
    return r;
}

static CUresult stream_id(CUstream h, unsigned long long *id)
{
    struct CUstream_st *s;
    CUresult r = queried(h, id, &s);
    if (!r)
        *id = s->id;
    return r;
}

/* A stream's context needs no current context: the stream names it (CUDA 12 library launches
 * and cuda.core rely on this). */
static CUresult stream_ctx(CUstream h, CUcontext *pctx, CUgreenCtx *green)
{
    struct CUstream_st *s;
    CUresult r = queried(h, pctx, &s);
    if (r)
        return r;
    *pctx = s->ctx;
    if (green)
        *green = NULL; /* green contexts are not modelled */
    return CUDA_SUCCESS;
}

static CUresult stream_device(CUstream h, CUdevice *dev)
{
    struct CUstream_st *s;
    CUresult r = queried(h, dev, &s);
    if (!r)
        *dev = s->ctx->ordinal;
    return r;
}

SIM_EXPORT CUresult cuStreamGetPriority(CUstream h, int *p) { return stream_priority(h, p); }
SIM_EXPORT CUresult cuStreamGetPriority_ptsz(CUstream h, int *p) { return stream_priority(h, p); }
SIM_EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int *f) { return stream_flags(h, f); }
SIM_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream h, unsigned int *f) { return stream_flags(h, f); }
SIM_EXPORT CUresult cuStreamGetId(CUstream h, unsigned long long *id) { return stream_id(h, id); }
SIM_EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *id) { return stream_id(h, id); }
SIM_EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_ctx(h, c, NULL); }
SIM_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return stream_ctx(h, c, NULL); }
SIM_EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *c, CUgreenCtx *g)
{
    return stream_ctx(h, c, g);
}
SIM_EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, CUgreenCtx *g)
{
    return stream_ctx(h, c, g);
}
SIM_EXPORT CUresult cuStreamGetDevice(CUstream h, CUdevice *d) { return stream_device(h, d); }
SIM_EXPORT CUresult cuStreamGetDevice_ptsz(CUstream h, CUdevice *d) { return stream_device(h, d); }

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
        stream->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    /* Pending work keeps its place on the engine; only the bookkeeping goes. */
    if (stream->capture)
        cu_graph_free(stream->capture);
    stream->magic = 0;
    free(stream);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h)
{
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    r = cu_stream_wait(s);
    if (!r)
        cu_pools_sync();
    return r;
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    return stream_sync(stream);
}

SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    return stream_sync(stream);
}

static CUresult stream_query(CUstream h)
{
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    int held = cu_stream_hold_done(s, 0, &r);
    if (held <= 0)
        return held < 0 ? r : CUDA_ERROR_NOT_READY;
    struct sim_err e = {0};
    int done = sim_engine_query(&e, cu_g.st, s->ctx->phys, &s->q.last);
    if (done < 0)
        return cu_result(&e);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuStreamQuery(CUstream stream)
{
    return stream_query(stream);
}

SIM_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream)
{
    return stream_query(stream);
}

/* ---- events -------------------------------------------------------------------------------- */

static CUresult event_check(CUevent ev)
{
    CUresult r = cu_ready();
    if (r)
        return r;
    return (ev && ev->magic == EVENT_MAGIC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    if (!event || (flags & ~CU_EVENT_FLAGS_VALID))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = cu_ctx_current(&c);
    if (r)
        return r;
    *event = cu_event_new(c, flags);
    return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUevent cu_event_new(struct CUctx_st *c, unsigned flags)
{
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return NULL;
    ev->ctx = c;
    ev->flags = flags;
    ev->magic = EVENT_MAGIC;
    return ev;
}

static CUresult event_record(CUevent ev, CUstream h)
{
    CUresult r = event_check(ev);
    if (r)
        return r;
    struct CUstream_st *s;
    r = cu_stream(h, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_SUCCESS; /* an event node in a captured graph: ordering only, not modelled */
    if (ev->ipc) {
        r = cu_ipc_event_record(ev, s);
        if (r)
            return r;
    } else {
        struct sim_err e = {0};
        if ((r = cu_stream_settle(s)))
            return r;
        if (sim_engine_record(&e, cu_g.st, s->ctx->phys, &s->q, &ev->w) < 0)
            return cu_result(&e);
    }
    __atomic_store_n(&ev->recorded, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    return event_record(event, stream);
}

SIM_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream)
{
    return event_record(event, stream);
}

SIM_EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags)
{
    return (flags & ~1u) ? CUDA_ERROR_INVALID_VALUE : event_record(event, stream);
}

SIM_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream, unsigned int flags)
{
    return (flags & ~1u) ? CUDA_ERROR_INVALID_VALUE : event_record(event, stream);
}

/* 1 when ev's work has completed (or it was never recorded), 0 if not, <0 with *r set. */
static int event_done(CUevent ev, int wait, CUresult *r)
{
    if (ev->ipc)
        return cu_ipc_event_done(ev, wait, r);
    struct sim_err e = {0};
    int done = sim_engine_watch(&e, cu_g.st, &ev->w, wait, cu_event_wait_how(ev));
    if (done < 0)
        *r = cu_result(&e);
    return done;
}

SIM_EXPORT CUresult cuEventQuery(CUevent event)
{
    CUresult r = event_check(event);
    if (r)
        return r;
    int done = event_done(event, 0, &r);
    return done < 0 ? r : done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    CUresult r = event_check(event);
    if (r)
        return r;
    if (event_done(event, 1, &r) < 0)
        return r;
    cu_pools_sync();
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent start, CUevent end)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = event_check(start);
    if (!r)
        r = event_check(end);
    if (r)
        return r;
    if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&start->recorded, __ATOMIC_ACQUIRE) ||
        !__atomic_load_n(&end->recorded, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_INVALID_HANDLE; /* never recorded */
    int da = event_done(start, 0, &r);
    if (da < 0)
        return r;
    int db = event_done(end, 0, &r);
    if (db < 0)
        return r;
    if (!da || !db)
        return CUDA_ERROR_NOT_READY;
    uint64_t a = __atomic_load_n(&start->w.at, __ATOMIC_ACQUIRE);
    uint64_t b = __atomic_load_n(&end->w.at, __ATOMIC_ACQUIRE);
    *ms = (float)((double)((int64_t)(b - a)) / 1e6);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return elapsed(ms, start, end);
}

SIM_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    return elapsed(ms, start, end);
}

SIM_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    CUresult r = event_check(event);
    if (r)
        return r;
    sim_engine_unwatch(cu_g.st, &event->w);
    if (event->ipc == EVENT_IPC_EXPORTED)
        sim_ipc_event_free(cu_g.st, event->ipc_index, event->ipc_gen);
    event->magic = 0;
    free(event);
    return CUDA_SUCCESS;
}

/* ---- ordering between streams -------------------------------------------------------------- */

/* Kernels of one process on one GPU run in launch order on its channel, so work queued after
 * the wait already follows the event's kernel there; an event of another GPU is waited for on
 * the host before returning, which keeps the order (the caller blocks where a GPU would not).
 * An interprocess event recorded by another process on this GPU gates the channel: the GPU holds
 * the work queued after the wait until that kernel ends, and the caller does not block. */
static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags)
{
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (!ev || ev->magic != EVENT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~1u) /* CU_EVENT_WAIT_DEFAULT 0, CU_EVENT_WAIT_EXTERNAL 1 */
        return CUDA_ERROR_INVALID_VALUE;
    if (ev->ipc)
        return s->capture ? CUDA_SUCCESS /* a node of the graph: ordering only, not modelled */
                          : cu_ipc_event_gate(ev, s);
    if (ev->ctx && ev->ctx->phys == s->ctx->phys)
        return CUDA_SUCCESS;
    struct sim_err e = {0};
    return sim_engine_watch(&e, cu_g.st, &ev->w, 1, cu_wait_how(s->ctx)) < 0 ? cu_result(&e) : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    return stream_wait_event(h, ev, flags);
}

SIM_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent ev, unsigned int flags)
{
    return stream_wait_event(h, ev, flags);
}

/* The host function runs when the stream reaches it: here, on the calling thread once the
 * stream's earlier work is done, so later work on the stream starts after it (the caller blocks
 * where a driver would run it on its own thread). */
static CUresult launch_host_func(CUstream h, CUhostFn fn, void *user)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CUresult r = cu_stream(h, &s);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    r = cu_stream_wait(s);
    if (r)
        return r;
    fn(user);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *userData)
{
    return launch_host_func(h, fn, userData);
}

SIM_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *userData)
{
    return launch_host_func(h, fn, userData);
}
