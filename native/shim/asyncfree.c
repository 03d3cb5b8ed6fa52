/*
 * Stream-ordered frees take effect when their stream reaches them, not when they are queued:
 * until the kernels queued before a cuMemFreeAsync are done, its memory is still in use, so the
 * cap keeps counting it.  The hook records an event on the stream right after the free and keeps
 * the charge here; the charge is credited once the event has completed, checked before every
 * admission (sg_alloc_begin), at every sync hook and in the memory views.  No event (out of
 * resources) or a capturing stream (a graph's free node, not modelled here): credited at once.
 *
 * Cost when nothing is pending: one relaxed load.
 */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>

#define CU_EVENT_DISABLE_TIMING 0x2u

struct pending {
    CUevent ev;
    struct sg_charge charge;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pend; /* [mu] */
static size_t npend, cappend;
static size_t npend_hint; /* atomic: npend, read without the lock */

static void atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    free(pend); /* the parent's events and charges are not the child's */
    pend = NULL;
    npend = cappend = 0;
    __atomic_store_n(&npend_hint, 0, __ATOMIC_RELAXED);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void setup(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

void sg_async_free_queue(CUstream stream, bool per_thread, const struct sg_charge *c)
{
    CUstream s = (!stream && per_thread) ? CU_STREAM_PER_THREAD : stream;
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    CUevent ev = NULL;
    if (SG_REAL(cuStreamIsCapturing) && SG_REAL(cuStreamIsCapturing)(s, &cap) == CUDA_SUCCESS &&
        cap == CU_STREAM_CAPTURE_STATUS_NONE && SG_REAL(cuEventCreate) && SG_REAL(cuEventRecord) &&
        SG_REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
        if (SG_REAL(cuEventRecord)(ev, s) != CUDA_SUCCESS) {
            if (SG_REAL(cuEventDestroy_v2))
                SG_REAL(cuEventDestroy_v2)(ev);
            ev = NULL;
        }
    }
    if (!ev) {
        sg_credit(c);
        return;
    }
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    bool kept = false;
    if (sg_grow((void **)&pend, &cappend, npend, sizeof *pend) == 0) {
        pend[npend++] = (struct pending){.ev = ev, .charge = *c};
        __atomic_store_n(&npend_hint, npend, __ATOMIC_RELAXED);
        kept = true;
    }
    pthread_mutex_unlock(&mu);
    if (!kept) {
        if (SG_REAL(cuEventDestroy_v2))
            SG_REAL(cuEventDestroy_v2)(ev);
        sg_credit(c);
    }
}

void sg_async_free_settle(void)
{
    if (__atomic_load_n(&npend_hint, __ATOMIC_RELAXED) == 0)
        return;
    struct pending done[64];
    size_t ndone = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < npend && ndone < sizeof done / sizeof done[0];) {
        CUresult q = SG_REAL(cuEventQuery) ? SG_REAL(cuEventQuery)(pend[i].ev) : CUDA_SUCCESS;
        if (q == CUDA_ERROR_NOT_READY) {
            i++;
            continue;
        }
        done[ndone++] = pend[i]; /* completed, or no longer queryable: the free has happened */
        pend[i] = pend[--npend];
    }
    __atomic_store_n(&npend_hint, npend, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < ndone; i++) {
        if (SG_REAL(cuEventDestroy_v2))
            SG_REAL(cuEventDestroy_v2)(done[i].ev);
        sg_credit(&done[i].charge);
    }
}
