/*
 * Unit test driver of the online-request prediction (predict.c), compiled with it alone by
 * tests/integration/test_predict.py.  Reads commands on stdin, times in microseconds, and answers
 * each with one line of key=value pairs:
 *   arrive T         an online request asks for the token at T -> the learned state
 *   end T            an online request's work ended at T (its drained sync) -> gap state
 *   next T K         would work of K µs started at T meet a predicted request -> next, late,
 *                    else the last instant it may start without (launch_by)
 *   hold T UNTIL     an offline holder wants to hold back at T until UNTIL -> allowed
 *   served           an online request was granted the token
 *   estimate EST M   an offline kernel estimate of EST µs after a bound sync that took M µs
 */
#include <stdio.h>
#include <string.h>

#include "../predict.h"

static struct sg_arbiter region;

static unsigned long long us(uint64_t ns)
{
    return (unsigned long long)(ns / 1000);
}

int main(void)
{
    struct sg_arbiter *a = &region;
    a->online_window_ns = SG_ARB_DEFAULT_ONLINE_WINDOW_NS;
    a->holdback_max_ns = SG_ARB_DEFAULT_HOLDBACK_MAX_NS;
    char cmd[32];
    unsigned long long t, k;
    while (scanf("%31s", cmd) == 1) {
        if (!strcmp(cmd, "arrive") && scanf("%llu", &t) == 1) {
            sg_predict_note_arrival(a, t * 1000);
            printf("period=%llu samples=%u jitter=%llu outliers=%u anchor=%llu stalls=%llu "
                   "relearns=%llu gap=%llu gap_samples=%u gap_jitter=%llu\n",
                   us(a->online_period_ns), a->online_samples, us(a->online_jitter_ns),
                   a->online_outliers, us(a->online_last_arrival_ns),
                   (unsigned long long)a->online_stalls, (unsigned long long)a->online_relearns,
                   us(a->online_gap_ns), a->online_gap_samples, us(a->online_gap_jitter_ns));
        } else if (!strcmp(cmd, "end") && scanf("%llu", &t) == 1) {
            sg_predict_note_end(a, t * 1000);
            printf("end=%llu\n", us(a->online_last_end_ns));
        } else if (!strcmp(cmd, "next") && scanf("%llu %llu", &t, &k) == 2) {
            uint64_t late = 0, by = 0, next = sg_predict_next(a, t * 1000, k * 1000, &late, &by);
            printf("next=%llu late=%llu launch_by=%llu\n", us(next), us(next ? late : 0), us(by));
        } else if (!strcmp(cmd, "hold") && scanf("%llu %llu", &t, &k) == 2) {
            bool ok = sg_predict_holdback_allowed(a, t * 1000);
            if (ok)
                a->offline_hold_until_ns = k * 1000;
            printf("allowed=%d misses=%llu\n", ok, (unsigned long long)a->holdback_misses);
        } else if (!strcmp(cmd, "estimate") && scanf("%llu %llu", &t, &k) == 2) {
            printf("estimate=%llu\n", us(sg_predict_kernel_estimate(t * 1000, k * 1000)));
        } else if (!strcmp(cmd, "served")) {
            sg_predict_served(a);
            printf("served=1\n");
        } else {
            fprintf(stderr, "predict_test: bad command %s\n", cmd);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
