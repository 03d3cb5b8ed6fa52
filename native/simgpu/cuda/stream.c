/*
 * Streams and events.  A stream is a queue on its context's GPU engine (common/engine.c): its
 * `tail` is the instant its last submitted work completes, so synchronising is sleeping until the
 * tail and querying is comparing it with the clock.  The default stream (0, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) is one queue per context; legacy-stream implicit synchronisation with
 * other streams is not modelled beyond cuCtxSynchronize and synchronous copies waiting for all
 * work of the context.  An event records the tail of its stream when it is recorded.
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

void cu_stream_wait(struct CUstream_st *s)
{
    sim_sleep_until(sim_queue_tail(&s->q));
}

SIM_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
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
    *stream = s;
    return CUDA_SUCCESS;
}

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
    cu_stream_wait(s);
    return CUDA_SUCCESS;
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
    return sim_now_ns() >= sim_queue_tail(&s->q) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
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
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->ctx = c;
    ev->flags = flags;
    ev->magic = EVENT_MAGIC;
    *event = ev;
    return CUDA_SUCCESS;
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
    uint64_t now = sim_now_ns(), tail = sim_queue_tail(&s->q);
    __atomic_store_n(&ev->at, tail > now ? tail : now, __ATOMIC_RELEASE);
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

SIM_EXPORT CUresult cuEventQuery(CUevent event)
{
    CUresult r = event_check(event);
    if (r)
        return r;
    uint64_t at = __atomic_load_n(&event->at, __ATOMIC_ACQUIRE);
    return sim_now_ns() >= at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    CUresult r = event_check(event);
    if (r)
        return r;
    sim_sleep_until(__atomic_load_n(&event->at, __ATOMIC_ACQUIRE));
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
    uint64_t a = __atomic_load_n(&start->at, __ATOMIC_ACQUIRE);
    uint64_t b = __atomic_load_n(&end->at, __ATOMIC_ACQUIRE);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE; /* never recorded */
    uint64_t now = sim_now_ns();
    if (now < a || now < b)
        return CUDA_ERROR_NOT_READY;
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
    event->magic = 0;
    free(event);
    return CUDA_SUCCESS;
}
