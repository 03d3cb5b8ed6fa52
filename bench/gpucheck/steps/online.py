"""An online service next to an offline job: the online p99 alone, with sharegpu (online vs
offline priority), and with the GPU's own time-slicing (no sharegpu).

- online-probe: bench/isolation.py's measurement (4 x 1 ms of work every 30 ms next to a
  saturating loop of 0.5 ms kernels), one run of each.
- online-torch: a PyTorch inference loop (an 8-layer MLP, batch 64, a request every 20 ms)
  next to a PyTorch training loop (a 4-layer MLP of width 8192, batch 8192, forward, backward
  and an SGD step), both unmodified.
- online-torch-mps: the same loops as clients of a private MPS daemon, where the shim makes the
  offline tenant's process a BELOW_NORMAL client (CUDA_MPS_CLIENT_PRIORITY=1), against both
  loops as NORMAL clients without sharegpu: whether the GPU's block scheduler honours the
  client priority, which is what the simulated GPU's MPS model (SIMGPU_MPS_BLOCK_US) assumes.

The claim is that sharegpu keeps the online p99 below what plain time-slicing gives; the
project's goal (p99 within 1.10x alone) is reported beside it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from _node import start_at
from gpucheck.context import StepContext
from gpucheck.mps import private_daemon
from gpucheck.target import ProbeError, last_json, ready_lines

GOAL_RATIO = 1.10
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def _judge(
    ctx: StepContext,
    alone: float,
    shared: float,
    bare: float,
    *,
    extra: str = "",
    baseline: str = "time-slicing",
) -> None:
    """`bare`: the same pair without sharegpu, which `baseline` names (plain time-slicing, or
    two NORMAL clients of an MPS daemon)."""
    ctx.figure("p99_ratio_sharegpu", round(shared / alone, 3))
    ctx.figure(f"p99_ratio_{baseline.replace('-', '_').replace(' ', '_')}", round(bare / alone, 3))
    ctx.figure("goal_met", shared / alone <= GOAL_RATIO)
    ctx.check(
        f"sharegpu keeps the online p99 below {baseline}'s",
        shared < bare,
        f"{shared:.0f} vs {bare:.0f} µs",
    )
    ctx.summary(
        f"p99 alone {alone:.0f} µs; sharegpu {shared:.0f} ({shared / alone:.2f}x); "
        f"{baseline} {bare:.0f} ({bare / alone:.2f}x){extra}"
    )


def probe(ctx: StepContext) -> None:
    import isolation

    if ctx.target.real:
        isolation.START_SLACK_S = 1.0
    isolation.ONLINE["bursts"] = int(ctx.scale(100, 40))
    node = ctx.target.node("online")
    f = isolation.online_offline(node, 1, isolation.KERNEL_US, "bursts")
    ctx.figure("figures", f)
    ctx.figure("offline_share_of_idle_sharegpu", round(f["shared_offline"], 3))
    _judge(
        ctx,
        f["alone_p99"],
        f["shared_p99"],
        f["bare_p99"],
        extra=f"; offline {f['shared_offline'] * 100:.0f}% of idle",
    )


def _loops(
    ctx: StepContext, shared: bool | None, requests: int, seconds: float, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The inference loop alone (shared None), or with the training loop under sharegpu
    (online / offline tenants) or without it; `env` for every process (an MPS daemon's)."""
    start_file = ctx.target.scratch("online") / f"start-{shared}"
    py, loop = ctx.target.python, str(PROGRAMS / "torch_loop.py")
    online = [py, loop, "infer", "--requests", str(requests), "--start-file", str(start_file)]
    offline = [py, loop, "train", "--seconds", f"{seconds:g}", "--start-file", str(start_file)]
    if shared is None:
        argvs = [
            ctx.target.run_command(
                ["--memory", "8GiB", "--priority", "online", "--name", "gc-online"], online
            )
        ]
    elif shared:
        argvs = [
            ctx.target.run_command(
                ["--memory", "8GiB", "--priority", "online", "--name", "gc-online"], online
            ),
            ctx.target.run_command(
                ["--memory", "16GiB", "--priority", "offline", "--name", "gc-offline"], offline
            ),
        ]
    else:
        argvs = [online, offline]
    procs = [ctx.target.spawn(a, env=env) for a in argvs]
    readers = ready_lines(procs)
    start_file.write_text(str(start_at(0.3)))
    results = []
    for p, r in zip(procs, readers, strict=True):
        rest = r.rest(timeout=seconds + 90)
        rc = p.wait(timeout=30)
        if rc != 0:
            raise ProbeError(f"a loop exited {rc}: {(p.stderr.read() if p.stderr else '').strip()[-600:]}")
        results.append(last_json("\n".join(rest)))
    return results


def torch(ctx: StepContext) -> None:
    if importlib.util.find_spec("torch") is None:
        raise ctx.skip(f"torch is not installed for {ctx.target.python}")
    requests = int(ctx.scale(150, 50))
    seconds = requests * 0.020 + 1.0
    (alone,) = ctx.figure("alone", _loops(ctx, None, requests, seconds))
    shared_on, shared_off = ctx.figure("sharegpu", _loops(ctx, True, requests, seconds))
    bare_on, bare_off = ctx.figure("time_slicing", _loops(ctx, False, requests, seconds))
    off = f"; training {float(shared_off['steps_per_s']):.1f} vs {float(bare_off['steps_per_s']):.1f} steps/s"
    _judge(ctx, float(alone["p99_us"]), float(shared_on["p99_us"]), float(bare_on["p99_us"]), extra=off)


def torch_mps(ctx: StepContext) -> None:
    if importlib.util.find_spec("torch") is None:
        raise ctx.skip(f"torch is not installed for {ctx.target.python}")
    requests = int(ctx.scale(100, 40))
    seconds = requests * 0.020 + 1.0
    with private_daemon(ctx.target.scratch("online-mps"), ctx.target.env) as daemon:
        if not daemon.found["started"]:
            ctx.figure("daemon", daemon.found)
            raise ctx.skip(f"no private MPS daemon: {daemon.found['why_not']}")
        (alone,) = ctx.figure("alone", _loops(ctx, None, requests, seconds, daemon.env))
        shared_on, shared_off = ctx.figure("sharegpu", _loops(ctx, True, requests, seconds, daemon.env))
        bare_on, bare_off = ctx.figure("both_normal", _loops(ctx, False, requests, seconds, daemon.env))
    ctx.figure("daemon", daemon.found)
    off = f"; training {float(shared_off['steps_per_s']):.1f} vs {float(bare_off['steps_per_s']):.1f} steps/s"
    on, bare = float(shared_on["p99_us"]), float(bare_on["p99_us"])
    _judge(ctx, float(alone["p99_us"]), on, bare, extra=off, baseline="both NORMAL under MPS")
