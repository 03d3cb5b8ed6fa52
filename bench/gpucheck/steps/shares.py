"""Compute shares: 30/70 and 10/90 under `share`, 20% under `cap` alone, programs that wait for
their own work at 30/70, and CUDA graphs at 30/70.

Saturating loops under `sharegpu run --compute N%`, started at one instant; each one's share is
measured twice: by its own completed work (the probe: kernels completed in the window x their
length / the window; PyTorch: matmuls completed / what the same loop completes alone on the card,
without sharegpu), and by NVML's per-process utilization sampled from outside during the window
(a coarser figure: the driver's samples). The claim is the first one within 2 points of the
configured share (the project's goal is 1 point: the error is reported against it; the quick
dry run on the simulated GPU allows 5).
"""

from __future__ import annotations

import contextlib
import importlib.util
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _node import start_at
from gpucheck import nvmlq
from gpucheck.context import StepContext
from gpucheck.target import ProbeError, finish, last_json, parse_kv, ready_lines

TOLERANCE_PT = 2.0
GOAL_PT = 1.0
# The CI dry run (--quick on the simulated GPU, 2 shared cores) checks the plumbing, not the
# accuracy: its windows are short and a host stall of the loaded machine moves a share by 3
# points (66.8% for 70% once). Accuracy is measured by bench/isolation.py and the real-GPU run.
QUICK_SIMULATED_TOLERANCE_PT = 5.0
KERNEL_US = 500
CASES: list[tuple[str, list[tuple[int, str]]]] = [
    ("share 30/70", [(30, "share"), (70, "share")]),
    ("share 10/90", [(10, "share"), (90, "share")]),
    ("cap 20% alone", [(20, "cap")]),
]
GRAPH_CASE = ("graphs share 30/70", [(30, "share"), (70, "share")])
# Programs that wait for their own work (issue 33): bursts of 4 x 1 ms, cuCtxSynchronize, 20 µs of
# host time. Their shares are judged as a split of what the card ran for both (each one's own
# waits leave the card idle under an exclusive token: docs/design/arbitration.md).
SYNC_CASE = ("syncing share 30/70 (4 x 1 ms, then a sync)", [(30, "share"), (70, "share")])
SYNC_WORK = ["4", "1000", "20"]
# The same with the hand-over queued on the GPU (ABI 1.12, `handoff: queued`: the next holder's
# work waits for a word the holder's stream writes), and with bursts of one 100 µs kernel, where
# a hand-over's cost shows most: whether it beats the drain on a real GPU, as it does not on the
# simulated one (docs/design/arbitration.md, "Queued hand-overs").
SHORT_SYNC_WORK = ["1", "100", "20"]
# And bursts of 4 x 100 µs, where the 70% tenant lends its gaps under `queued` (ABI 1.13, one kernel
# of the other queued behind its work: "Lending one kernel, queued"): whether that beats the drain
# on a real GPU as it does on the simulated one (96.6% against 95.4%, 97.5% without sharegpu).
LENT_SYNC_WORK = ["4", "100", "20"]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def child_of(pid: int) -> int | None:
    """The (first) child of process `pid`: the program `sharegpu run` started."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            return int(stat.parent.name)
    return None


class NvmlSampler:
    """NVML's per-process utilization, read from outside once a second while the loops run."""

    def __init__(self) -> None:
        self.samples: dict[int, list[float]] = {}
        self.clocks: list[dict[str, float]] = []  # the card's SM clock and power, each second
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, delay: float) -> None:
        self._delay = delay
        self._thread.start()

    def _run(self) -> None:
        from sharegpu.devices import busy_by_pid

        if self._stop.wait(self._delay + 1.0):
            return
        while not self._stop.is_set():
            try:
                for per_pid in busy_by_pid(1.0).values():
                    for pid, ratio in per_pid.items():
                        self.samples.setdefault(pid, []).append(ratio * 100)
                with nvmlq.session():
                    if clock := nvmlq.clocks(0):
                        self.clocks.append(clock)
            except Exception as err:
                self.error = f"{type(err).__name__}: {err}"
                return
            self._stop.wait(1.0)

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join(timeout=5)
        return {pid: statistics.mean(v) for pid, v in self.samples.items() if v}

    def card(self) -> dict[str, float]:
        """The mean SM clock and power over the window; {} where NVML cannot say."""
        if not self.clocks:
            return {}
        return {key: round(statistics.mean(c[key] for c in self.clocks), 1) for key in self.clocks[0]}


@dataclass
class Outcome:
    shares: list[float]  # percent of the card, by completed work
    nvml: list[float | None]  # percent, NVML per-process utilization
    raw: list[dict[str, Any]]


def _options(pct: int, policy: str, name: str) -> list[str]:
    return ["--memory", "2GiB", "--compute", f"{pct}%", "--policy", policy, "--name", name]


def probe_case(
    ctx: StepContext, split: list[tuple[int, str]], seconds: float, mode: str, work: list[str] = SYNC_WORK
) -> Outcome:
    """mode: saturate's (kernel, graph), or "sync" for `sgprobe syncloop` with `work`."""
    from sharegpu.native import probe_path

    delay = ctx.scale(3.0, 2.5) + 0.3 * len(split)
    start = start_at(delay)
    procs = []
    for i, (pct, policy) in enumerate(split):
        if mode == "sync":
            argv = [str(probe_path()), "syncloop", f"{seconds:g}", *work, str(start)]
        else:
            argv = [str(probe_path()), "saturate", f"{seconds:g}", str(KERNEL_US), mode, str(start)]
        procs.append(ctx.target.spawn(ctx.target.run_command(_options(pct, policy, f"gc-share-{i}"), argv)))
    sampler = NvmlSampler()
    sampler.start(delay)
    time.sleep(max(0.0, (start - time.clock_gettime_ns(time.CLOCK_MONOTONIC)) / 1e9 - 0.2))
    pids = [child_of(p.pid) for p in procs]  # the probes `sharegpu run` started, for NVML
    raw = [parse_kv(finish(p, seconds + delay + 60)[0]) for p in procs]
    nvml = sampler.stop()
    for r in raw:
        r["late_ms"] = str(round((int(r.get("start_ns", start)) - start) / 1e6, 2))
    return Outcome(
        [float(r["achieved"]) * 100 for r in raw],
        [nvml.get(pid) if pid else None for pid in pids],
        [dict(r) for r in raw],
    )


def _record(
    ctx: StepContext, case: str, split: list[tuple[int, str]], got: Outcome, *, as_split: bool = False
) -> str:
    """as_split: judge each share against its part of what the tenants got together."""
    configured = [pct for pct, _ in split]
    total = sum(got.shares) if as_split else 100.0
    err = max(abs(g - c * total / 100) for g, c in zip(got.shares, configured, strict=True))
    ctx.figure(
        case,
        {
            "configured_pct": configured,
            "achieved_pct": [round(g, 2) for g in got.shares],
            "nvml_pct": [None if n is None else round(n, 1) for n in got.nvml],
            "max_error_pt": round(err, 2),
            "goal_met": err <= GOAL_PT,
            "raw": got.raw,
        },
    )
    achieved = "/".join(f"{g:.1f}" for g in got.shares)
    tolerance = QUICK_SIMULATED_TOLERANCE_PT if ctx.quick and not ctx.target.real else TOLERANCE_PT
    ctx.check(f"{case}: within {tolerance:g} points", err <= tolerance, f"{achieved} (error {err:.2f} pt)")
    nvml = "/".join("?" if n is None else f"{n:.0f}" for n in got.nvml)
    label = "/".join(str(c) for c in configured) + (" cap" if split[0][1] == "cap" else "")
    return f"{label} → {achieved} (NVML {nvml})"


def probe(ctx: StepContext) -> None:
    seconds = ctx.scale(5.0, 1.5) if ctx.target.real else ctx.scale(3.0, 1.5)
    parts = []
    for case, split in CASES:
        parts.append(_record(ctx, case, split, probe_case(ctx, split, seconds, "kernel")))
        ctx.summary("; ".join(parts))
    case, split = SYNC_CASE
    got = probe_case(ctx, split, seconds, "sync")
    parts.append(_record(ctx, case, split, got, as_split=True) + f" (card {sum(got.shares):.1f}%)")
    ctx.summary("; ".join(parts))
    for handoff, work, label in (
        ("queued", SYNC_WORK, "4 x 1 ms"),
        ("drain", SHORT_SYNC_WORK, "1 x 100 µs"),
        ("queued", SHORT_SYNC_WORK, "1 x 100 µs"),
        ("drain", LENT_SYNC_WORK, "4 x 100 µs"),
        ("queued", LENT_SYNC_WORK, "4 x 100 µs"),
    ):
        with hand_over(ctx, handoff):
            got = probe_case(ctx, split, seconds, "sync", work)
        name = f"syncing share 30/70 ({label}, then a sync), hand-overs {handoff}"
        parts.append(
            _record(ctx, name, split, got, as_split=True) + f" (card {sum(got.shares):.1f}%, {handoff})"
        )
        ctx.summary("; ".join(parts))


@contextlib.contextmanager
def hand_over(ctx: StepContext, handoff: str) -> Iterator[None]:
    """Every arbiter region of the run's runtime directory set to `handoff`, the default after."""
    from sharegpu.arbiter import iter_arbiters, tune_arbiter
    from sharegpu.regions import abi

    regions = list(iter_arbiters(Path(ctx.target.env["SHAREGPU_RUNTIME_DIR"])))
    for path in regions:
        tune_arbiter(path, handoff=handoff)
    try:
        yield
    finally:
        for path in regions:
            tune_arbiter(path, handoff=abi.ARB_HANDOFF_NAMES[abi.ARB_DEFAULT_HANDOFF])


def graphs_probe(ctx: StepContext) -> None:
    seconds = ctx.scale(5.0, 1.5) if ctx.target.real else ctx.scale(3.0, 1.5)
    case, split = GRAPH_CASE
    ctx.summary(_record(ctx, case, split, probe_case(ctx, split, seconds, "graph")))


# ---- PyTorch ----------------------------------------------------------------------------------


def torch_case(
    ctx: StepContext, split: list[tuple[int, str]] | None, seconds: float, graph: bool
) -> list[dict[str, Any]]:
    """The matmul loop, alone without sharegpu (split None) or as tenants of `split`."""
    start_file = ctx.target.scratch("torch") / f"start-{time.monotonic_ns()}"
    argv = [ctx.target.python, str(PROGRAMS / "torch_loop.py"), "matmul", "--seconds", f"{seconds:g}"]
    argv += ["--start-file", str(start_file)] + (["--graph"] if graph else [])
    if split is None:
        procs = [ctx.target.spawn(argv)]
    else:
        procs = [
            ctx.target.spawn(ctx.target.run_command(_options(pct, policy, f"gc-torch-{i}"), argv))
            for i, (pct, policy) in enumerate(split)
        ]
    lines = ready_lines(procs)
    sampler = NvmlSampler()
    sampler.start(0.3)
    start_file.write_text(str(start_at(0.3)))
    results = []
    for p, reader in zip(procs, lines, strict=True):
        rest = reader.rest(timeout=seconds + 60)
        rc = p.wait(timeout=30)
        if rc != 0:
            err = p.stderr.read() if p.stderr else ""
            raise ProbeError(f"the matmul loop exited {rc}: {err.strip()[-600:]}")
        results.append(last_json("\n".join(rest)))
    nvml = sampler.stop()
    card = sampler.card()
    for r in results:
        r["nvml_pct"] = nvml.get(int(r["pid"]))
        r["card"] = card
    return results


def _torch_shares(ctx: StepContext, cases: list[tuple[str, list[tuple[int, str]]]], graph: bool) -> None:
    if importlib.util.find_spec("torch") is None:
        raise ctx.skip(f"torch is not installed for {ctx.target.python}")
    seconds = ctx.scale(5.0, 2.0)
    (alone,) = torch_case(ctx, None, seconds, graph)
    rate = float(alone["rate_per_s"])
    ctx.figure("alone_without_sharegpu", alone)
    alone_mhz = alone["card"].get("sm_mhz")
    parts = [
        f"alone {float(alone['tflops']):.0f} TFLOP/s" + (f" at {alone_mhz:.0f} MHz" if alone_mhz else "")
    ]
    for case, split in cases:
        got = torch_case(ctx, split, seconds, graph)
        shares = [float(r["rate_per_s"]) / rate * 100 for r in got]
        # A matmul runs faster when the card is not busy all the time: the power it is not
        # drawing lets the SM clock rise (on the H200 the 20% cap did 23.7% of the work
        # alone with 19.4% of the time). The share of the card's time is the work at the
        # clock it ran at, so each share is scaled by the clock alone over the clock then.
        mhz = got[0]["card"].get("sm_mhz")
        if alone_mhz and mhz:
            for r, share in zip(got, shares, strict=True):
                r["work_pct"] = round(share, 2)
            shares = [share * alone_mhz / mhz for share in shares]
        nvml = [None if r.get("nvml_pct") is None else float(r["nvml_pct"]) for r in got]
        parts.append(
            _record(ctx, case, split, Outcome(shares, nvml, got)) + (f" at {mhz:.0f} MHz" if mhz else "")
        )
        ctx.summary("; ".join(parts))


def torch(ctx: StepContext) -> None:
    _torch_shares(ctx, CASES, graph=False)


def graphs_torch(ctx: StepContext) -> None:
    _torch_shares(ctx, [GRAPH_CASE], graph=True)
