/*
 * What a sync tells the arbiter (the hooks of cuCtxSynchronize, cuStreamSynchronize and the like
 * call these): whether it covered all the work of our hold, so that the hold is drained from the
 * work's end (by the burst clock) and its idle time is left out of the charge; the bounds the
 * shim itself puts on our work in flight (offline work beside an online service, a loan); and
 * the burst's end, where the token may be handed on.
 */
#include "arbentry.h"
#include "arbhold.h"
#include "arbsched.h"
#include "predict.h"
#include "shim.h"

/* Under g->mu: a sync that began at `begin` (the burst clock's end event `end_seq`, 0 none)
 * returned having waited for `what`.  When that covered all the work of our hold and nothing was
 * launched since it began, nothing of ours is on the GPU until the next launch: mark the hold
 * drained since the work ended (read from the GPU by the burst clock, else the sync's return),
 * so that its charge leaves that idle time out.  A launch racing with the mark either sees it
 * (its seq_cst load follows its seq_cst increment of `launching`), or is seen here: still under
 * way in `launching`, or done, its `last_launch` published by the release decrement.  Returns
 * the work's end, 0 when the hold is not drained. */
static uint64_t mark_drained_locked(struct sg_gpu *g, enum sg_sync_kind kind, const void *what,
                                    uint64_t begin, uint32_t end_seq)
{
    uint64_t last = __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST);
    if (!sg_arb_holding(g) || last >= begin || !sg_sync_covers_hold(g, kind, what))
        return 0;
    uint64_t end = sg_bc_end(g, end_seq, sg_mono_ns());
    if (end <= last)
        end = last + 1;
    __atomic_store_n(&g->drained_at, end, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g->launching, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST) >= begin) {
        __atomic_store_n(&g->drained_at, 0, __ATOMIC_SEQ_CST); /* another thread launched */
        return 0;
    }
    return end;
}

/* The shim's own sync of our context that bounds our work in flight (a loan, or offline work
 * beside an online service), begun at `start`; returns with g->mu held.  The card idles from
 * our last kernel's end to our next launch because of the bound, not the program's work or host
 * code: the hold is marked drained from the kernel's end (the burst clock, as at a sync of the
 * program's), so that the charge leaves that time out, but the program's gap (idle_from) is not
 * begun. */
static uint32_t mark_sync(struct sg_gpu *g, enum sg_sync_kind kind, const void *what, bool offer);

static void bound_sync(struct sg_gpu *g, CUcontext ctx, uint64_t start, bool offer)
{
    /* The kernel's end, by the GPU's clock; a loan's kernel is offered back queued. */
    uint32_t seq = mark_sync(g, SG_SYNC_CTX, ctx, offer);
    __atomic_fetch_add(&g->syncing, 1, __ATOMIC_RELAXED); /* waiting for our kernel: not idle */
    sg_arb_sync_context(ctx);
    __atomic_fetch_sub(&g->syncing, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g->mu);
    mark_drained_locked(g, SG_SYNC_CTX, ctx, start, seq);
}

/* Offline and online tenants active: synchronise every offline_inflight_max launches so that
 * an online request waits about one offline kernel, and hold the next launch back when the
 * next online request is predicted before it would finish. */
void sg_arb_offline_bound(struct sg_gpu *g, CUcontext ctx)
{
    struct sg_arbiter *a = g->a;
    uint64_t start = sg_mono_ns();
    uint64_t until = __atomic_load_n(&a->online_active_until_ns, __ATOMIC_RELAXED);
    if (!until || start >= until)
        return;
    uint32_t bound = __atomic_load_n(&a->offline_inflight_max, __ATOMIC_RELAXED);
    if (bound < 1)
        bound = 1;
    if (__atomic_add_fetch(&g->since_sync, 1, __ATOMIC_RELAXED) < bound)
        return;
    __atomic_store_n(&g->since_sync, 0, __ATOMIC_RELAXED);
    sg_in_hook++;
    bound_sync(g, ctx, start, false);
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
    uint64_t now = sg_mono_ns();
    /* What we had queued ran from `start` to `now`: what the next launch is expected to take. */
    uint64_t est = sg_predict_kernel_estimate(__atomic_load_n(&g->kernel_ns, __ATOMIC_RELAXED),
                                              now - start);
    __atomic_store_n(&g->kernel_ns, est, __ATOMIC_RELAXED);
    uint64_t late = 0, by = 0;
    uint64_t next = sg_predict_next(a, now, est, &late, &by);
    __atomic_store_n(&g->launch_by, by, __ATOMIC_RELAXED);
    if (next)
        sg_arb_hold_back(g, next + late);
}

/* The card is lent to us (SG_ARB_YIELD_LOAN): one kernel in flight, so that the lender, back,
 * waits for one kernel at most; when it is back, the card goes to it as our kernel ends.  The
 * bound's idle time is left out of our charge (bound_sync: charged, it cost a borrower of
 * 4 x 100 µs bursts on the 2-core VM up to a third more than its kernels ran, and the split
 * moved to 25/75).  Under `handoff: queued` the kernel is offered back as it is waited for:
 * the lender, back, takes the card queued behind it, with no wake-up of ours between. */
void sg_arb_loan_bound(struct sg_gpu *g, CUcontext ctx)
{
    sg_in_hook++;
    bound_sync(g, ctx, sg_mono_ns(), true);
    if (g->ho.offered && sg_arb_offer_end(g)) {
        pthread_mutex_unlock(&g->mu); /* taken back queued: paid to our kernel's end */
        sg_in_hook--;
        return;
    }
    if (g->client >= 0 && sg_arb_holding(g) &&
        __atomic_load_n(&g->a->clients[g->client].yield, __ATOMIC_RELAXED) == SG_ARB_YIELD_LOAN)
        sg_arb_hand_on(g, sg_arb_decide(g, sg_mono_ns(), false));
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
}

/* Does a sync of `what` (a context, NULL the current one; or a stream) wait for all the work of
 * our hold: the one context that launched in it, or the one stream it launched to?  Caller
 * holds g->mu. */
bool sg_sync_covers_hold(struct sg_gpu *g, enum sg_sync_kind kind, const void *what)
{
    if (g->next_ext)
        return false; /* the hold has Vulkan work too, which no CUDA sync waits for */
    if (kind == SG_SYNC_STREAM)
        return g->hold_streams == SG_HOLD_ONE && (CUstream)what == g->hold_stream;
    if (kind != SG_SYNC_CTX || g->nctx != 1)
        return false;
    CUcontext ctx = (CUcontext)what;
    if (!ctx && (!SG_REAL(cuCtxGetCurrent) || SG_REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS))
        return false;
    return ctx && ctx == g->ctxs[0];
}

/* A sync that may cover all the work of our hold is about to wait: record the burst clock's end
 * event after that work, and (`offer`: a sync of the program's, or a loan's bound) offer the
 * token queued behind it (arbqueue.c).  Never blocks behind a release under way (its drain
 * may be long): the sync's return then stands for the end. */
static uint32_t mark_sync(struct sg_gpu *g, enum sg_sync_kind kind, const void *what, bool offer)
{
    if (pthread_mutex_trylock(&g->mu) != 0)
        return 0;
    sg_in_hook++;
    uint64_t last = __atomic_load_n(&g->last_launch, __ATOMIC_SEQ_CST);
    uint32_t seq = sg_arb_holding(g) && sg_sync_covers_hold(g, kind, what) ? sg_bc_sync_begin(g) : 0;
    if (seq && offer)
        sg_arb_offer_queued(g, last);
    sg_in_hook--;
    pthread_mutex_unlock(&g->mu);
    return seq;
}

uint32_t sg_arb_sync_mark(struct sg_gpu *g, enum sg_sync_kind kind, const void *what)
{
    /* A sync of the program's ends its burst, held or not (a burst of one kernel lent and taken
     * back is synced after its hold ended): were its kernels several? */
    uint32_t launches = __atomic_exchange_n(&g->burst_launches, 0, __ATOMIC_RELAXED);
    if (launches)
        __atomic_store_n(&g->ho.several, launches > 1, __ATOMIC_RELAXED);
    return mark_sync(g, kind, what, true);
}

/* A sync returned that waited for `what`.  When that covered all the work of our hold
 * (sg_sync_covers_hold) and nothing was launched since it began, nothing of ours is on the GPU
 * until the next launch (mark_drained_locked); that gap is the program's own (note_gap). */
void sg_arb_drained(struct sg_gpu *g, const struct sg_sync *s, enum sg_sync_kind kind,
                    const void *what)
{
    sg_in_hook++;
    pthread_mutex_lock(&g->mu);
    if (g->ho.offered && s->end_seq && s->end_seq == g->ho.offer_end_seq && sg_arb_offer_end(g)) {
        pthread_mutex_unlock(&g->mu); /* taken queued as this sync waited: paid to its end */
        sg_in_hook--;
        return;
    }
    uint64_t end = mark_drained_locked(g, kind, what, s->begin, s->end_seq);
    if (end) {
        __atomic_store_n(&g->idle_from, end, __ATOMIC_RELAXED); /* the program's own gap begins */
        sg_arb_note_tail(g, end > s->begin ? end - s->begin : 0);
    }
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
}

/* The first launch after a drained sync: the idle period since it is over.  The first launch of
 * a hold ends its wait since the grant, which is kept apart: an early preemption's overlap moves
 * our charge's start past it (overlap_to_us_locked, arbrelease.c), and summed with the other idle
 * time it was left out twice, a request of 3 x 300 µs charged 15-22 µs short. */
void sg_arb_idle_end(struct sg_gpu *g, uint64_t now)
{
    uint64_t d = __atomic_exchange_n(&g->drained_at, 0, __ATOMIC_SEQ_CST);
    if (d && now > d) {
        if (__atomic_exchange_n(&g->wake_open, false, __ATOMIC_RELAXED)) {
            __atomic_store_n(&g->wake_from, d, __ATOMIC_RELAXED);
            __atomic_store_n(&g->wake_to, now, __ATOMIC_RELEASE);
        } else {
            __atomic_fetch_add(&g->idle_ns, now - d, __ATOMIC_RELAXED);
        }
    }
    sg_arb_note_gap(g, now);
}

/* A sync call returned: the end of a burst.  Hand the token on if a better waiter exists. */
void sg_arb_burst_end(void)
{
    struct sg_gpu *g = sg_arb_tls.g;
    if (!g || !__atomic_load_n(&g->token, __ATOMIC_RELAXED))
        return;
    if (!__atomic_load_n(&g->a->waiting, __ATOMIC_RELAXED)) {
        /* An online request is over with nobody waiting (the offline client we preempted early
         * still waits for its kernel in flight): note it, so that the watcher hands the card on
         * after the idle grace once a lower class asks, not at the end of our quantum. */
        int c = __atomic_load_n(&g->client, __ATOMIC_RELAXED);
        if (c >= 0 && c < SG_ARB_MAX_CLIENTS &&
            __atomic_load_n(&g->a->clients[c].priority, __ATOMIC_RELAXED) == SG_PRIORITY_ONLINE) {
            __atomic_store_n(&g->grace_ns, sg_arb_idle_grace(sg_arb_quantum(g->a)), __ATOMIC_RELAXED);
            __atomic_store_n(&g->burst_end_ns, sg_mono_ns(), __ATOMIC_RELAXED);
        }
        return;
    }
    sg_in_hook++;
    pthread_mutex_lock(&g->mu);
    if (g->client >= 0 && sg_arb_holding(g)) {
        enum sg_arb_decision d = sg_arb_decide(g, sg_mono_ns(), true);
        sg_arb_hand_on(g, d);
    }
    pthread_mutex_unlock(&g->mu);
    sg_in_hook--;
}
