"""The shim's cost per call with and without it: bench/overhead.py's measurement (alloc+free
pairs of 4 KiB and 1 MiB, launches with the token held), on this target's driver.

On a real GPU the driver's own costs are micro-seconds, so the added figure is the one to read;
the goals (< 200 ns per pair, < 50 ns per launch) are the simulated GPU's and are reported, not
checked. The check is that every call ran with the shim and without it."""

from __future__ import annotations

from gpucheck.context import StepContext


def run(ctx: StepContext) -> None:
    import overhead

    node = ctx.target.node("overhead")
    if ctx.target.real:
        rounds, pairs, launches = 5, 20000, 50000
    else:
        rounds, pairs, launches = (
            int(ctx.scale(5, 3)),
            int(ctx.scale(100000, 20000)),
            int(ctx.scale(100000, 20000)),
        )
    ctx.figure("rounds", rounds)
    rows = ctx.figure("rows", overhead.measure(node, rounds, pairs, launches))
    ctx.check(
        "every call was measured with and without the shim",
        len(rows) == 3 and all(r["with_ns"] for r in rows),
    )
    ctx.summary(
        "; ".join(
            f"{r['call'].replace('alloc+free ', '')} {r['without_ns']:.0f}→{r['with_ns']:.0f} ns"
            for r in rows
        )
    )
