"""The GPU's time slice and the cost of a switch between two processes, measured (issue 16
wants the real figures to check the simulated GPU's SIMGPU_TIMESLICE_US / SIMGPU_PREEMPT_US).

Two plain processes, no sharegpu: one runs a single long kernel, the other many short kernels
(`sgprobe timeline`, an event after each). The second's intervals between events are its
kernel's length while it holds the GPU and longer when the first ran in between: a run of short
intervals is its time slice, a long interval is the other's slice plus two switches (each one a
preemption: both processes always have work). So, with equal slices,

    slice  = median run + one kernel          switch = (median gap - slice) / 2

A switch at a kernel boundary (SIMGPU_CTXSW_US) is not separated out by this measurement.
"""

from __future__ import annotations

import statistics

from _node import start_at
from gpucheck.context import StepContext
from gpucheck.target import SIM_DEFAULTS_US, finish, parse_kv

SHORT_US = 20
THRESHOLD_US = 20  # an interval this much over the kernel's length is a gap


def analyse(intervals: list[float], us: int) -> dict[str, float | int | None]:
    runs, gaps, current = [], [], 0.0
    for iv in intervals:
        if iv > us + THRESHOLD_US:
            runs.append(current)
            gaps.append(iv - us)
            current = 0.0
        else:
            current += iv
    runs = runs[1:]  # the first run began before the other process started
    if len(gaps) < 3 or not runs:
        return {"gaps": len(gaps), "slice_us": None, "switch_us": None}
    slice_us = statistics.median(runs) + us
    gap = statistics.median(gaps)
    return {
        "gaps": len(gaps),
        "run_p50_us": round(statistics.median(runs), 1),
        "gap_p50_us": round(gap, 1),
        "gap_p10_us": round(sorted(gaps)[len(gaps) // 10], 1),
        "gap_p90_us": round(sorted(gaps)[len(gaps) * 9 // 10], 1),
        "slice_us": round(slice_us, 1),
        "switch_us": round((gap - slice_us) / 2, 1),
    }


def run(ctx: StepContext) -> None:
    from sharegpu.native import probe_path

    n = 10000 if ctx.target.real else int(ctx.scale(10000, 4000))
    long_us = n * SHORT_US * 2
    start = start_at(1.5 if ctx.target.real else 0.8)
    probe = str(probe_path())
    long_run = ctx.target.spawn([probe, "launch", "1", str(long_us), "kernel", str(start)])
    short_run = ctx.target.spawn([probe, "timeline", str(n), str(SHORT_US), str(start)])
    short_out, _ = finish(short_run, 120)
    long_kv = parse_kv(finish(long_run, 120)[0])
    intervals = [float(line.split("=", 1)[1]) for line in short_out.splitlines() if line.startswith("iv_us=")]
    found = analyse(intervals, SHORT_US)
    ctx.figure("kernels", {"short_us": SHORT_US, "short_count": n, "long_us": long_us})
    ctx.figure("long_kernel_wall_us", int(long_kv.get("wall_us", 0)))
    ctx.figure("measured", found)
    if not ctx.target.real:
        ctx.figure("simulated_defaults_us", SIM_DEFAULTS_US)
    ok = ctx.check(
        "the other process's time slices were seen", found["slice_us"] is not None, f"{found['gaps']} gaps"
    )
    if not ok:
        ctx.summary(f"no time-slicing seen ({found['gaps']} gaps)")
        return
    ctx.summary(
        f"slice {found['slice_us']:.0f} µs, switch {found['switch_us']:.0f} µs "
        f"(gap p50 {found['gap_p50_us']:.0f} µs, {found['gaps']} gaps)"
    )
    if not ctx.target.real:  # the model must measure as configured
        ctx.check(
            "the simulated GPU measures as configured (2000 µs slice, 50 µs preemption)",
            abs(float(found["slice_us"] or 0) - SIM_DEFAULTS_US["timeslice_us"]) < 200
            and abs(float(found["switch_us"] or 0) - SIM_DEFAULTS_US["preempt_us"]) < 30,
        )
