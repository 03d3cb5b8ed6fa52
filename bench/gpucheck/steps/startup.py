"""Process start-up under the shim: N probe processes (cuInit, a context, cuMemGetInfo) started
at once, with and without the shim, N = 1 and 64 (bench/containers.py's measurement): the p99
of their wall times and each one's own CPU time. The goal (< 1 ms added at 64) is reported; the
check is that every process started and the shim added no more than 10x the bare start-up."""

from __future__ import annotations

import os
from typing import Any

from gpucheck.context import StepContext


def run(ctx: StepContext) -> None:
    import containers

    node = ctx.target.node("startup")
    rounds = 3 if ctx.target.real else int(ctx.scale(3, 2))
    found = containers.process_startup(node, rounds, counts=(1, 64))
    rows: dict[str, dict[str, Any]] = {}
    for n, (bare, shim) in found.items():
        rows[str(n)] = {
            "wall_p99_ms": [round(bare.wall_p99, 2), round(shim.wall_p99, 2)],
            "wall_added_ms": round(shim.wall_p99 - bare.wall_p99, 2),
            "cpu_p50_ms": [round(containers.pct(bare.cpu, 0.5), 3), round(containers.pct(shim.cpu, 0.5), 3)],
            "cpu_added_p50_us": round(
                (containers.pct(shim.cpu, 0.5) - containers.pct(bare.cpu, 0.5)) * 1000, 0
            ),
        }
    ctx.figure("cpus", os.cpu_count())
    ctx.figure("rounds", rounds)
    ctx.figure("by_count", rows)
    ctx.figure("goal_met_64", rows["64"]["wall_added_ms"] < 1.0)
    for n, (bare, shim) in found.items():
        ctx.check(
            f"{n} at once: the shim adds less than 10x",
            shim.wall_p99 < 10 * bare.wall_p99 + 5,
            f"{bare.wall_p99:.1f} → {shim.wall_p99:.1f} ms",
        )
    ctx.summary(
        "; ".join(
            f"{n}: {r['wall_p99_ms'][0]:.1f}→{r['wall_p99_ms'][1]:.1f} ms p99, "
            f"+{r['cpu_added_p50_us']:.0f} µs CPU"
            for n, r in rows.items()
        )
    )
