/*
 * When did our work on the GPU really end?  The arbiter charges a hold the time the card ran the
 * holder's work (arbiter.c, charge_locked): the hold's wall time less the idle time between a
 * sync that drained the hold and the next launch.  A sync returns some time after the work it
 * waited for ended (a few µs for a driver that spins, tens of µs for one that sleeps); charged
 * as work, that lateness would cost a tenant whose bursts are short a visible part of its share
 * (a 50% cap of 100 µs bursts got 43% on the simulated GPU).  So the end is read from the GPU:
 *
 *   hold start   on the first launch of a hold, an event (`ref`) is recorded on a private idle
 *                stream of the hold's context; it completes at once, at host time ref_host.
 *   sync begin   when the sync will cover all the hold's work (one context, and one stream or only
 *                the default streams), an event (`end`) is recorded after the work, on that
 *                stream or the legacy stream.
 *   sync end     the work ended at ref_host + elapsed(ref, end), on the GPU's own clock.
 *
 * Events are never recorded on a stream that is capturing (it would add a node to the user's
 * graph), and nothing here changes what the user's work waits for.  Whenever a step is not
 * possible (a capture, several streams, an event that cannot be made) the sync's return is the
 * end, as before.  Costs: per hold one event record; per covering sync one stream capture query,
 * one event record and one elapsed-time read.
 */
#include "shim.h"

#define CU_STREAM_NON_BLOCKING 0x1u
#define REF_TRIES 4
#define REF_MAX_CALL_NS 6000ull /* a record call no longer than this places its instant within 3 µs */

/* A stream whose event follows all of the hold's work: its one stream, or the legacy stream
 * when it launched only to default streams (an operation of the legacy stream waits for all
 * earlier work of the blocking streams, the per-thread default streams among them). */
static bool hold_end_stream(const struct sg_gpu *g, CUstream *s)
{
    if (g->hold_streams == SG_HOLD_ONE)
        *s = g->hold_stream;
    else if (g->hold_streams == SG_HOLD_DEFAULT)
        *s = CU_STREAM_LEGACY;
    else
        return false;
    return true;
}

static bool not_capturing(CUstream s)
{
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    return SG_REAL(cuStreamIsCapturing) && SG_REAL(cuStreamIsCapturing)(s, &cap) == CUDA_SUCCESS &&
           cap == CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Our events and private stream in ctx (made with ctx pushed).  Those of a previous context are
 * forgotten, and destroyed only while no stream or context has died since they were made: a dead
 * context's handles may already name someone else's objects. */
static bool clock_for(struct sg_burst_clock *bc, CUcontext ctx)
{
    uint32_t epoch = __atomic_load_n(&sg_stream_epoch, __ATOMIC_ACQUIRE);
    if (bc->ctx == ctx && bc->epoch == epoch)
        return true;
    if (bc->ctx && bc->epoch == epoch) {
        if (SG_REAL(cuEventDestroy_v2)) {
            SG_REAL(cuEventDestroy_v2)(bc->ref);
            SG_REAL(cuEventDestroy_v2)(bc->end);
            SG_REAL(cuEventDestroy_v2)(bc->start);
        }
        if (SG_REAL(cuStreamDestroy_v2))
            SG_REAL(cuStreamDestroy_v2)(bc->stream);
    }
    *bc = (struct sg_burst_clock){0};
    if (!SG_REAL(cuCtxPushCurrent_v2) || !SG_REAL(cuCtxPopCurrent_v2) || !SG_REAL(cuEventCreate) ||
        !SG_REAL(cuStreamCreate) || !SG_REAL(cuEventRecord))
        return false;
    if (SG_REAL(cuCtxPushCurrent_v2)(ctx) != CUDA_SUCCESS)
        return false;
    CUevent ref = NULL, end = NULL, start = NULL;
    CUstream s = NULL;
    bool ok = SG_REAL(cuEventCreate)(&ref, 0) == CUDA_SUCCESS &&
              SG_REAL(cuEventCreate)(&end, 0) == CUDA_SUCCESS &&
              SG_REAL(cuEventCreate)(&start, 0) == CUDA_SUCCESS &&
              SG_REAL(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    CUcontext popped;
    SG_REAL(cuCtxPopCurrent_v2)(&popped);
    if (!ok) {
        if (SG_REAL(cuEventDestroy_v2)) {
            if (ref)
                SG_REAL(cuEventDestroy_v2)(ref);
            if (end)
                SG_REAL(cuEventDestroy_v2)(end);
            if (start)
                SG_REAL(cuEventDestroy_v2)(start);
        }
        return false;
    }
    *bc = (struct sg_burst_clock){
        .ctx = ctx, .ref = ref, .end = end, .start = start, .stream = s, .epoch = epoch};
    return true;
}

/* Record `ref` anew (the clock's events exist).  The record's host time is the middle of the call: a call that took long (the driver
     * waited for a lock, the thread was preempted) would place it anywhere in between, and
     * every end read against it would be off by as much; such a record is made again.  (Taken
     * once from a 66 µs call, the ends came 33 µs early for a whole run: a 50% cap of 100 µs
     * bursts got 66%.) */
static void record_ref(struct sg_burst_clock *bc)
{
    bc->ref_ok = false;
    for (int tries = 0; tries < REF_TRIES; tries++) {
        uint64_t before = sg_mono_ns();
        if (SG_REAL(cuEventRecord)(bc->ref, bc->stream) != CUDA_SUCCESS)
            return;
        uint64_t took = sg_mono_ns() - before;
        if (took <= REF_MAX_CALL_NS) {
            bc->ref_host = before + took / 2;
            bc->ref_ok = true;
            return;
        }
    }
}

void sg_bc_hold_start(struct sg_gpu *g, CUcontext ctx)
{
    struct sg_burst_clock *bc = &g->bc;
    bc->ref_ok = false;
    bc->start_set = false;
    bc->end_seq++; /* an end recorded in an earlier hold is not this one's */
    if (ctx && clock_for(bc, ctx))
        record_ref(bc);
}

/* A hold renewed for another quantum: a fresh reference, so that whatever error one record
 * carries lasts a quantum at most. */
void sg_bc_renew(struct sg_gpu *g)
{
    if (g->bc.ctx && g->bc.ref_ok)
        record_ref(&g->bc);
}

uint32_t sg_bc_sync_begin(struct sg_gpu *g)
{
    struct sg_burst_clock *bc = &g->bc;
    CUstream s;
    if (!bc->ref_ok || g->nctx != 1 || g->ctxs[0] != bc->ctx || !hold_end_stream(g, &s))
        return 0;
    if (s == CU_STREAM_LEGACY) {
        /* The legacy stream of the current context: ours must be current. */
        CUcontext cur = NULL;
        if (!SG_REAL(cuCtxGetCurrent) || SG_REAL(cuCtxGetCurrent)(&cur) != CUDA_SUCCESS ||
            cur != bc->ctx)
            return 0;
    }
    if (!not_capturing(s) || SG_REAL(cuEventRecord)(bc->end, s) != CUDA_SUCCESS)
        return 0;
    return ++bc->end_seq;
}

bool sg_bc_end_stream(const struct sg_gpu *g, CUstream *s)
{
    return hold_end_stream(g, s);
}

/* CUDA 12.8+ has a _v2; older drivers only the first. */
static CUresult elapsed(const struct sg_burst_clock *bc, CUevent to, float *ms)
{
    if (SG_REAL(cuEventElapsedTime_v2))
        return SG_REAL(cuEventElapsedTime_v2)(ms, bc->ref, to);
    if (SG_REAL(cuEventElapsedTime))
        return SG_REAL(cuEventElapsedTime)(ms, bc->ref, to);
    return CUDA_ERROR_NOT_FOUND;
}

bool sg_bc_gate_start(struct sg_gpu *g, CUcontext ctx, CUstream s)
{
    struct sg_burst_clock *bc = &g->bc;
    if (!bc->ref_ok || bc->ctx != ctx || bc->start_set || !not_capturing(s))
        return false;
    bc->start_set = SG_REAL(cuEventRecord)(bc->start, s) == CUDA_SUCCESS;
    return bc->start_set;
}

bool sg_bc_gate_passed(struct sg_gpu *g)
{
    return g->bc.start_set && SG_REAL(cuEventQuery) &&
           SG_REAL(cuEventQuery)(g->bc.start) == CUDA_SUCCESS;
}

int sg_bc_gate_open(struct sg_gpu *g, uint64_t *at)
{
    struct sg_burst_clock *bc = &g->bc;
    float ms;
    if (!bc->start_set || !bc->ref_ok)
        return -1;
    CUresult r = elapsed(bc, bc->start, &ms);
    if (r == CUDA_ERROR_NOT_READY)
        return 0;
    bc->start_set = false;
    if (r != CUDA_SUCCESS || ms < 0)
        return -1;
    *at = bc->ref_host + (uint64_t)((double)ms * 1e6);
    return 1;
}

uint64_t sg_bc_end(struct sg_gpu *g, uint32_t seq, uint64_t fallback)
{
    struct sg_burst_clock *bc = &g->bc;
    float ms;
    if (!seq || seq != bc->end_seq || !bc->ref_ok)
        return fallback;
    /* A completed record's end does not move: read from the GPU once (a driver call that a
     * holder keeping the card makes in its own gap, where the card idles). */
    if (bc->end_read_seq != seq) {
        if (elapsed(bc, bc->end, &ms) != CUDA_SUCCESS || ms < 0)
            return fallback;
        bc->end_read_seq = seq;
        bc->end_read_ns = bc->ref_host + (uint64_t)((double)ms * 1e6);
    }
    return bc->end_read_ns < fallback ? bc->end_read_ns : fallback;
}
