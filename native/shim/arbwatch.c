/*
 * The watcher thread: one per process, started at its first arbitrated launch.  It releases a
 * token held past its quantum without launches (draining with the holder's contexts pushed on
 * this thread), hands it on at the end of a burst once the holder has idled past its grace
 * while others wait, and yields at once to a higher-class request when the holder is not
 * launching.  It sleeps on the futex word of its client entry (a yield request wakes it) or,
 * holding nothing, on a private word a grant kicks (arbhold.h).
 */
#include <pthread.h>
#include <signal.h>

#include "arbhold.h"
#include "arbregion.h"
#include "arbsched.h"
#include "futex.h"
#include "shim.h"

#define WATCHER_BUSY_RETRY_NS 200000ull

static uint32_t sg_arb_watcher_kick; /* [atomic] private futex word: a grant wakes the watcher */
/* [atomic seq_cst] when the watcher wakes on its own next; UINT64_MAX while it runs (its view
 * may be older than a burst's end) or sleeps with nothing held. */
static uint64_t watcher_due = UINT64_MAX;

uint64_t sg_arb_watcher_due(void)
{
    return __atomic_load_n(&watcher_due, __ATOMIC_SEQ_CST);
}

/* A tenth of a quantum (1 ms by default): a holder that stops launching hands on at most that
 * long after its grace, and a poll of a few µs each costs less than the wake-up per burst it
 * replaces, down to bursts of that length (1 ms: 4 x 0.1 ms bursts kept the card as busy as with
 * a wake-up at each; a poll of quantum/20 cost them 0.4 points, simulated GPU). */
uint64_t sg_arb_watch_poll_ns(uint64_t quantum)
{
    return quantum / 10;
}

void sg_arb_kick_watcher(void)
{
    __atomic_fetch_add(&sg_arb_watcher_kick, 1, __ATOMIC_RELEASE);
    sg_futex_wake(&sg_arb_watcher_kick, false);
}

/* Does a client of c's class other than c wait for the token?  (Read without the region's
 * lock: a stale answer costs one poll, or one poll's delay.) */
static bool own_class_waits(const struct sg_arbiter *a, int c)
{
    if (!__atomic_load_n(&a->waiting, __ATOMIC_RELAXED))
        return false;
    uint32_t prio = __atomic_load_n(&a->clients[c].priority, __ATOMIC_RELAXED);
    for (int i = 0; i < SG_ARB_MAX_CLIENTS; i++)
        if (i != c && __atomic_load_n(&a->clients[i].state, __ATOMIC_RELAXED) == SG_ARB_WAITING &&
            __atomic_load_n(&a->clients[i].priority, __ATOMIC_RELAXED) == prio)
            return true;
    return false;
}

static void watch_one(struct sg_gpu *g, uint64_t now)
{
    if (g->client < 0 || !g->a)
        return;
    if (!sg_arb_holding(g)) {
        __atomic_store_n(&g->token, 0, __ATOMIC_RELAXED);
        return;
    }
    sg_ho_watch(g, now); /* a gate whose awaited work ran past the bound */
    uint64_t q = sg_arb_quantum(g->a);
    uint32_t why = __atomic_load_n(&g->a->clients[g->client].yield, __ATOMIC_RELAXED);
    bool yield = why == SG_ARB_YIELD_CLASS;
    uint64_t last = __atomic_load_n(&g->last_launch, __ATOMIC_RELAXED);
    bool launching = __atomic_load_n(&g->launching, __ATOMIC_RELAXED) ||
                     __atomic_load_n(&g->syncing, __ATOMIC_RELAXED);
    /* A loan ends here only while the holder is in its host code: in its bound sync, the
     * holder hands the card back itself when the sync returns (a second thread waiting for the
     * same kernel would spin on one of the two CPUs the lender needs). */
    bool over = now >= __atomic_load_n(&g->qend, __ATOMIC_RELAXED) || why == SG_ARB_YIELD_TURN ||
                (why == SG_ARB_YIELD_LOAN && !launching);
    bool idle = now > last && now - last >= q / 2 && !launching;
    uint64_t burst_end = __atomic_load_n(&g->burst_end_ns, __ATOMIC_RELAXED);
    uint64_t grace = __atomic_load_n(&g->grace_ns, __ATOMIC_RELAXED);
    bool burst_over = burst_end > last && now > burst_end && now - burst_end >= grace &&
                      !launching &&
                      __atomic_load_n(&g->a->waiting, __ATOMIC_RELAXED);
    if (yield) {
        sg_arb_release(g, true); /* waits for launches under way, then drains */
    } else if ((over && idle) || burst_over) {
        sg_arb_release(g, false); /* not launching: do not keep the card */
    } else if (over) {
        sg_arb_hand_on(g, sg_arb_decide(g, now, false));
    }
}

static void *watcher_main(void *arg)
{
    (void)arg;
    sg_in_hook = 1; /* everything this thread calls is ours */
    for (;;) {
        __atomic_store_n(&watcher_due, UINT64_MAX, __ATOMIC_SEQ_CST); /* awake: wake us to be sure */
        /* Read the kick word first: a grant after this read wakes the futex wait below. */
        uint32_t kick = __atomic_load_n(&sg_arb_watcher_kick, __ATOMIC_ACQUIRE);
        uint64_t sleep = 0;
        uint32_t *word = NULL, val = 0;
        for (int i = 0; i < SG_MAX_DEVICES; i++) {
            struct sg_gpu *g = &sg_gpus[i];
            if (__atomic_load_n(&g->state, __ATOMIC_ACQUIRE) != SG_GPU_ARB || !g->a ||
                sg_arb_region_broken(g->a))
                continue;
            int c = __atomic_load_n(&g->client, __ATOMIC_RELAXED);
            if (c < 0 || c >= SG_ARB_MAX_CLIENTS)
                continue;
            uint32_t *w = &g->a->clients[c].watch;
            uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
            uint64_t q;
            if (pthread_mutex_trylock(&g->mu) != 0) {
                q = WATCHER_BUSY_RETRY_NS; /* a launch or sync is deciding: look again soon */
            } else {
                uint64_t now = sg_mono_ns();
                watch_one(g, now);
                bool held = __atomic_load_n(&g->token, __ATOMIC_RELAXED) != 0;
                q = sg_arb_quantum(g->a) / 2;
                uint64_t qend = __atomic_load_n(&g->qend, __ATOMIC_RELAXED);
                if (qend > now && qend - now < q)
                    q = qend - now + 1000;
                uint64_t be = __atomic_load_n(&g->burst_end_ns, __ATOMIC_RELAXED);
                uint64_t grace = __atomic_load_n(&g->grace_ns, __ATOMIC_RELAXED);
                if (be > __atomic_load_n(&g->last_launch, __ATOMIC_RELAXED) && be + grace > now &&
                    be + grace - now + 1000 < q)
                    q = be + grace - now + 1000;
                /* One of our class waits: poll, since our burst's end does not wake us. */
                uint64_t poll = sg_arb_watch_poll_ns(sg_arb_quantum(g->a));
                if (held && poll < q && own_class_waits(g->a, c))
                    q = poll;
                pthread_mutex_unlock(&g->mu);
                if (!held)
                    continue;
            }
            if (!sleep || q < sleep)
                sleep = q;
            if (!word) {
                word = w;
                val = v;
            }
        }
        if (word) {
            __atomic_store_n(&watcher_due, sg_mono_ns() + sleep, __ATOMIC_SEQ_CST);
            sg_futex_wait(word, val, sleep, true);
        } else {
            sg_futex_wait(&sg_arb_watcher_kick, kick, 1000000000ull, false);
        }
    }
    return NULL;
}

/* A detached watcher thread with a stack of `stack` bytes (0: the default size). */
static int spawn_watcher(size_t stack)
{
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (stack)
        pthread_attr_setstacksize(&attr, stack);
    int rc = pthread_create(&th, &attr, watcher_main, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

void sg_arb_start_watcher(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the watcher takes none of the app's signals */
    /* glibc carves the static TLS of every library loaded at start out of the thread's stack:
     * a process whose libraries carry more than 64 KiB gets the default size. */
    if (spawn_watcher(64 * 1024) != 0 && spawn_watcher(0) != 0) {
        static int logged;
        sg_log_once(&logged, "cannot start the GPU arbiter watcher thread: an idle holder keeps "
                             "the token until its next launch or sync");
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
