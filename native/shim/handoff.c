/*
 * Queued hand-overs (ABI 1.12; docs/design/arbitration.md, "Queued hand-overs"): the driver
 * calls of both sides.  arbqueue.c decides when the token moves and keeps the records.
 *
 *   the words      each client's record holds a `done` word.  Every process page-locks the
 *                  records' pages of its mapping of the region (cuMemHostRegister, portable,
 *                  mapped), so that the GPU reads and writes those words.  The region is the
 *                  one file every tenant of the GPU maps, in whatever container: no CUDA
 *                  interprocess handle is needed (those open only between processes that see
 *                  each other's pids, not between two pods).
 *   the holder     at a sync that covers its hold, its stream raises its done word to the
 *                  offer's seq after its work (cuStreamWriteValue32).
 *   the next one   its grant names the holder and the seq (`behind`).  Before the hold's first
 *                  launch on each stream, that stream waits for the holder's word (GEQ): the
 *                  card switches to our work as the holder's ends, with no host wake-up between.
 *                  The burst clock's `start` event after the wait tells when the gate opened,
 *                  so the wait is left out of our charge (the holder pays for its work to its
 *                  end).
 *   bounded        a holder's work that runs past our quantum and SG_ARB_STALL_NS (a kernel of
 *                  seconds, a tenant that wrote its word down), or a holder that died: our
 *                  watcher raises the word itself from an idle stream of ours, to the seq the
 *                  holder's own write brings it to (so a late write of the holder's lowers
 *                  nothing).
 *
 * Every failure falls back to running unqueued: the launch goes on, our work then runs beside
 * the holder's tail.  Nothing here fails a launch.
 */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "shim.h"

#define CU_MEMHOSTREGISTER_PORTABLE 0x1u
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x2u
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_STREAM_WAIT_VALUE_GEQ 0x0u

static bool push(CUcontext ctx)
{
    return SG_REAL(cuCtxPushCurrent_v2) && SG_REAL(cuCtxPopCurrent_v2) &&
           SG_REAL(cuCtxPushCurrent_v2)(ctx) == CUDA_SUCCESS;
}

static void pop(void)
{
    CUcontext popped;
    SG_REAL(cuCtxPopCurrent_v2)(&popped);
}

static struct sg_arb_handoff *record_of(struct sg_gpu *g)
{
    return g->handoffs && g->client >= 0 && g->client < SG_ARB_MAX_CLIENTS ? &g->handoffs[g->client]
                                                                           : NULL;
}

static CUdeviceptr word_of(const struct sg_gpu *g, uint32_t client)
{
    return g->ho.words_dev + (CUdeviceptr)client * sizeof(struct sg_arb_handoff) +
           offsetof(struct sg_arb_handoff, done);
}

bool sg_ho_words(struct sg_gpu *g, CUcontext ctx)
{
    struct sg_handoff *ho = &g->ho;
    if (!g->handoffs)
        return false;
    if (ho->words_for == g->a)
        return ho->words_ok;
    ho->words_for = g->a; /* tried once per region: a refusal stays one */
    ho->words_ok = false;
    if (!SG_REAL(cuMemHostRegister_v2) || !SG_REAL(cuMemHostGetDevicePointer_v2) ||
        !SG_REAL(cuStreamWaitValue32_v2) || !SG_REAL(cuStreamWriteValue32_v2) || !push(ctx))
        return false;
    CUdeviceptr d = 0;
    bool ok = SG_REAL(cuMemHostRegister_v2)(g->handoffs, sizeof(struct sg_arb_handoffs),
                                            CU_MEMHOSTREGISTER_PORTABLE |
                                                CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS &&
              SG_REAL(cuMemHostGetDevicePointer_v2)(&d, g->handoffs, 0) == CUDA_SUCCESS;
    pop();
    if (!ok) {
        static int logged;
        sg_log_once(&logged, "cannot page-lock the GPU arbiter's hand-over records: this "
                             "process's hand-overs drain its work first");
        return false;
    }
    ho->words_dev = d;
    ho->words_ok = true;
    return true;
}

/* ---- the holder ---------------------------------------------------------------------------- */

bool sg_ho_record(struct sg_gpu *g, CUstream s, uint32_t seq)
{
    if (!g->ho.words_ok || g->ho.words_for != g->a || g->client < 0)
        return false;
    return SG_REAL(cuStreamWriteValue32_v2)(s, word_of(g, (uint32_t)g->client), seq, 0) ==
           CUDA_SUCCESS;
}

/* ---- the next holder ----------------------------------------------------------------------- */

void sg_ho_granted_locked(struct sg_gpu *g, int c)
{
    struct sg_handoff *ho = &g->ho;
    ho->gate = false;
    ho->waiting = false;
    ho->open = false;
    ho->ngated = 0;
    ho->wait_from = 0;
    struct sg_arb_handoff *h = g->handoffs;
    if (!h)
        return;
    uint32_t b = h[c].behind;
    h[c].behind = 0;
    if (!b || b > SG_ARB_MAX_CLIENTS || (int)b - 1 == c)
        return; /* nobody's work queued, or our own (the same process runs it beside ours) */
    ho->behind = b;
    ho->behind_seq = h[c].behind_seq;
    ho->gate = true;
    __atomic_fetch_add(&h[c].gated, 1, __ATOMIC_RELAXED);
}

/* The gate is not waited for (our streams cannot wait, or the holder's work ran past the
 * bound): count it, and let this hold run unqueued. */
static void open_ourselves(struct sg_gpu *g)
{
    struct sg_arb_handoff *r = record_of(g);
    if (r)
        __atomic_fetch_add(&r->gates_opened, 1, __ATOMIC_RELAXED);
    g->ho.open = true;
    struct sg_arbiter *a = g->a; /* later grants need not wait for that work either */
    if (a && sg_arb_lock(a) == 0) {
        if (a->queued_by == g->ho.behind)
            a->queued_by = 0;
        sg_arb_unlock(a);
    }
}

static bool gated_already(struct sg_handoff *ho, CUcontext ctx, CUstream s, pid_t tid)
{
    for (int i = 0; i < ho->ngated; i++)
        if (ho->gated[i].ctx == ctx && ho->gated[i].s == s && ho->gated[i].tid == tid)
            return true;
    return false;
}

void sg_ho_gate_launch(struct sg_gpu *g, CUcontext ctx, CUstream s)
{
    struct sg_handoff *ho = &g->ho;
    if (!ho->gate || ho->open)
        return;
    pid_t tid = s == CU_STREAM_PER_THREAD ? (pid_t)syscall(SYS_gettid) : 0;
    if (gated_already(ho, ctx, s, tid))
        return;
    if (!sg_ho_words(g, ctx)) {
        open_ourselves(g);
        return;
    }
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!SG_REAL(cuStreamIsCapturing) || SG_REAL(cuStreamIsCapturing)(s, &cap) != CUDA_SUCCESS ||
        cap != CU_STREAM_CAPTURE_STATUS_NONE)
        return; /* captured work runs when its graph is launched, gated then */
    if (!push(ctx))
        return;
    bool waits = SG_REAL(cuStreamWaitValue32_v2)(s, word_of(g, ho->behind - 1), ho->behind_seq,
                                                 CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
    if (waits && !ho->waiting) {
        ho->waiting = true;
        ho->gate_at = ho->wait_from = sg_mono_ns();
        sg_bc_gate_start(g, ctx, s); /* when the gate opens, on the GPU's clock */
    }
    pop();
    if (waits && ho->ngated < SG_HO_GATED_STREAMS)
        ho->gated[ho->ngated++] = (__typeof__(ho->gated[0])){.ctx = ctx, .s = s, .tid = tid};
    /* (More streams than the table: each launch waits again, at once once the word is up.) */
}

void sg_ho_settle(struct sg_gpu *g, uint64_t now)
{
    struct sg_handoff *ho = &g->ho;
    if (!ho->gate || !ho->waiting || !ho->wait_from)
        return;
    uint64_t at = 0, waited = 0;
    int r = sg_bc_gate_open(g, &at);
    if (r > 0) {
        uint64_t end = at < now ? at : now;
        waited = end > ho->wait_from ? end - ho->wait_from : 0;
        ho->wait_from = 0;
    } else if (r == 0) {
        waited = now > ho->wait_from ? now - ho->wait_from : 0; /* nothing of ours ran yet */
        ho->wait_from = now;
    } else {
        ho->wait_from = 0; /* unknown: charged as wall time */
    }
    if (!waited)
        return;
    __atomic_fetch_add(&g->idle_ns, waited, __ATOMIC_RELAXED);
    struct sg_arb_handoff *rec = record_of(g);
    if (rec)
        __atomic_fetch_add(&rec->gate_wait_ns, waited, __ATOMIC_RELAXED);
}

/* An idle stream of ours in ctx, to write a word from. */
static CUstream opener_in(struct sg_handoff *ho, CUcontext ctx)
{
    uint32_t epoch = __atomic_load_n(&sg_stream_epoch, __ATOMIC_ACQUIRE);
    if (ho->opener && ho->opener_ctx == ctx && ho->opener_epoch == epoch)
        return ho->opener;
    CUstream s = NULL;
    if (!SG_REAL(cuStreamCreate) || SG_REAL(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return NULL;
    ho->opener = s;
    ho->opener_ctx = ctx;
    ho->opener_epoch = epoch;
    return s;
}

void sg_ho_watch(struct sg_gpu *g, uint64_t now)
{
    struct sg_handoff *ho = &g->ho;
    if (!ho->gate || !ho->waiting || ho->open || ho->ngated < 1)
        return;
    uint32_t done = __atomic_load_n(&g->handoffs[ho->behind - 1].done, __ATOMIC_ACQUIRE);
    if ((int32_t)(done - ho->behind_seq) >= 0 || sg_bc_gate_passed(g)) {
        ho->open = true; /* the holder's work is done */
        return;
    }
    /* The holder died (its entry freed: its work was dropped, its write never lands), or its
     * work ran past the bound: raise its word ourselves, from an idle stream. */
    bool dead = __atomic_load_n(&g->a->clients[ho->behind - 1].pid, __ATOMIC_RELAXED) == 0;
    if (!dead && now - ho->gate_at < sg_arb_quantum(g->a) + SG_ARB_STALL_NS)
        return;
    CUcontext ctx = ho->gated[0].ctx;
    if (push(ctx)) {
        CUstream s = opener_in(ho, ctx);
        if (s)
            SG_REAL(cuStreamWriteValue32_v2)(s, word_of(g, ho->behind - 1), ho->behind_seq, 0);
        pop();
    }
    open_ourselves(g);
}

void sg_ho_fork_child(struct sg_gpu *g)
{
    memset(&g->ho, 0, sizeof g->ho); /* the parent's registration and streams are not ours */
}
