"""Online latency under periodic, random (Poisson) and bursty arrivals next to an offline job, per
offline kernel length and per arbitration mechanism (issue 16; bench/isolation.py --sections random).

The service: requests of 3 x 300 µs kernels (launched back to back, then a sync), mean gap 20 ms,
alone on the card and next to an offline job of back-to-back kernels (bursts of 4, then a sync),
under each mechanism and without sharegpu. Figures per cell: online p50 and p99 over the run's
requests divided by the same run's alone figures, and the offline job's GPU time as a share of
the time the service leaves idle; the median of the runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _host import host_steal_ms
from _node import Node
from sharegpu.arbiter import read_arbiter, tune_arbiter
from sharegpu.spec import ComputeSpec

REQUEST = {"mean_ms": 20, "kernels": 3, "us": 300}
# How the service's syncs wait (sgprobe's SGPROBE_SYNC, its context's CU_CTX_SCHED_* flag).
# "auto" (the driver's default) sleeps on the simulated GPU, whose tenants share the VM's two
# CPUs; a driver spins there for a process with fewer contexts than the node has CPUs, which
# "spin" models. Measured both ways on this VM, the late sync returns are the same host stalls
# (docs/design/arbitration.md, "Periodic repeats without MPS"), so the default stays comparable
# with every earlier series.
SERVICE_SYNC = "auto"
SYNC_MODES = ("spin", "yield", "blocking", "auto")
OFFLINE_BATCH = 4
OFFLINE_KERNELS_US = (500, 2000, 8000)
PATTERNS = {"periodic": "bursts", "poisson": "poisson", "bursty": "bursty"}
# Each mechanism is a setting of the GPU's arbiter (tune_arbiter), and "gpu" a simulated GPU of
# its own node: "timeslice_us" a time slice other than the default 2 ms (what `nvidia-smi
# compute-policy --set-timeslice` would change), "mps_block_us" an MPS server whose clients take
# their priority from the shim (offline tenants BELOW_NORMAL) and yield to a higher one at block
# boundaries that far apart (native/simgpu/README.md "MPS"). "none" runs without sharegpu.
MECHANISMS: dict[str, dict[str, Any]] = {
    "drain": {"online_preempt": "drain", "offline_quiet_ns": 0},
    "early": {"online_preempt": "early", "offline_quiet_ns": 0},
    "by-kernel": {"online_preempt": "by-kernel", "preempt_min_kernel_ns": 1_000_000, "offline_quiet_ns": 0},
    "quiet 5 ms": {"online_preempt": "drain", "offline_quiet_ns": 5_000_000},
    "early + quiet 5 ms": {"online_preempt": "early", "offline_quiet_ns": 5_000_000},
    "early + 0.5 ms slice": {"online_preempt": "early", "offline_quiet_ns": 0, "gpu": {"timeslice_us": 500}},
    "early + MPS 100 µs blocks": {
        "online_preempt": "early",
        "offline_quiet_ns": 0,
        "gpu": {"mps_block_us": 100},
    },
    "early + MPS 500 µs blocks": {
        "online_preempt": "early",
        "offline_quiet_ns": 0,
        "gpu": {"mps_block_us": 500},
    },
}
NONE = "none"
DEFAULT_GPU: dict[str, int] = {}  # the simulated GPU's defaults: 2 ms slices, no MPS server


def gpu_of(mechanism: str) -> dict[str, int]:
    """The simulated GPU's configuration the mechanism runs on."""
    gpu: dict[str, int] = MECHANISMS.get(mechanism, {}).get("gpu", DEFAULT_GPU)
    return gpu


@dataclass
class Cell:
    pattern: str
    kernel_us: int
    mechanism: str
    p50: list[float] = field(default_factory=list)  # µs, per run
    p99: list[float] = field(default_factory=list)
    offline: list[float] = field(default_factory=list)  # share of the idle time, per run

    def median(self, what: str) -> float:
        values: list[float] = getattr(self, what)
        return statistics.median(values) if values else float("nan")


RunTogether = Callable[[Node, list[tuple[dict[str, str], list[str]]]], list[dict[str, str]]]
NodeFor = Callable[[dict[str, int]], Node]  # the node whose simulated GPU has this configuration


def _online_args(pattern: str, requests: int) -> list[str]:
    return [
        PATTERNS[pattern],
        str(requests),
        str(REQUEST["mean_ms"]),
        str(REQUEST["kernels"]),
        str(REQUEST["us"]),
    ]


def _offline_args(seconds: float, kernel_us: int) -> list[str]:
    return ["saturate", f"{seconds:g}", str(kernel_us), "kernel", "START", str(OFFLINE_BATCH)]


def _service_env(env: dict[str, str], sync: str) -> dict[str, str]:
    return env | {"SGPROBE_SYNC": sync}


def alone(
    node: Node, run_together: RunTogether, pattern: str, requests: int, *, sync: str = SERVICE_SYNC
) -> tuple[float, float]:
    node.clear_tenants()
    env = _service_env(node.tenant_env("online", ComputeSpec.parse(priority="online")), sync)
    (on,) = run_together(node, [(env, _online_args(pattern, requests))])
    return float(on["p50_us"]), float(on["p99_us"])


def _tenant_wait_us(status: Any, name: str) -> float:
    t = status.tenant(name)
    return t.wait_ns / 1000 if t is not None else 0.0


@dataclass(frozen=True)
class Request:
    """One online request as the probe measured it, µs: its latency (its first launch to its
    sync's return), and the parts of it that tell where a late one lost its time."""

    latency: float
    cpu_wait: float  # runnable, not running (/proc/thread-self/schedstat)
    launched: float  # until its last launch returned: the token, the launch path
    span: float  # its kernels' span on the GPU's clock, queued behind other work included
    woke: float  # how late it began against its instant (the host's timer; not in the latency)


def requests_of(probe: dict[str, str]) -> list[Request]:
    """The service probe's requests, in order (its per-request lines, bench/isolation.py)."""

    def column(key: str) -> list[float]:
        return [float(v) for v in probe.get(f"{key}_us_all", "").split(",") if v]

    columns = [column(k) for k in ("lat", "runq", "launch", "span", "woke")]
    return [Request(*row) for row in zip(*columns, strict=True)]


# Why a late request was late, by the part of it furthest above the run's usual (its median):
# waiting for a CPU (at any point), for the token (its launches), on the GPU (its kernels queued
# behind an offline kernel: the prediction did not hold the offline job back), or for its sync
# to return after its kernels ended (a sleeping sync woken late by the host's timer).
CAUSES = {"cpu": "c", "token": "t", "gpu": "g", "return": "r"}
# A request that began this late missed the hold-back ahead of it if it lasted past its margin
# (predict.h: 300 µs and twice the jitter): the host stalled the service, not the GPU.
WOKE_LATE_US = 1000


def _parts(r: Request) -> dict[str, float]:
    """The request's latency in three parts that add up to it."""
    return {"token": r.launched, "gpu": r.span, "return": r.latency - r.launched - r.span}


def late_cause(r: Request, usual: Request) -> str:
    """A CPU wait may fall in any part: it is the cause when it makes up half the lateness."""
    if r.cpu_wait - usual.cpu_wait >= (r.latency - usual.latency) / 2:
        return "cpu"
    mine, usually = _parts(r), _parts(usual)
    return max(mine, key=lambda k: mine[k] - usually[k])


def late_causes(reqs: list[Request], late_at: list[int]) -> list[str]:
    """The cause of each late request (CAUSES), against the run's median request."""
    if not reqs:
        return []
    usual = Request(*(statistics.median(getattr(r, f) for r in reqs) for f in Request.__dataclass_fields__))
    return [late_cause(reqs[i], usual) for i in late_at]


@dataclass
class RunCounters:
    """What the GPU's arbiter counted during one run (bench --random, periodic repeats)."""

    holdbacks: int  # offline launches held back ahead of a predicted request
    misses: int  # hold-backs whose request never came
    early: int  # requests granted before the offline holder's drain (unpredicted ones)
    samples: int  # consistent intervals the prediction held at the end of the run
    waited_us: float  # the online tenant's wait for the token over the run
    stalls: int = 0  # runs of off-beat requests that ended back on the learned beat
    relearns: int = 0  # changed patterns learned from off-beat requests
    late_at: list[int] = field(default_factory=list)  # requests over 1.2 x the alone p50 (caller)
    host_late_at: list[int] = field(default_factory=list)  # of those, late only by CPU waits
    causes: list[str] = field(default_factory=list)  # of each late request (late_cause)
    woke_late: int = 0  # requests that began over WOKE_LATE_US after their instant
    woke_around: list[str] = field(default_factory=list)  # per late request: "its/before's" lateness, µs
    p99_less_cpu_us: float = 0.0  # p99 of each request's latency less its wait for a CPU
    steal_ms: float = 0.0  # time the hypervisor ran others on this VM's CPUs during the run

    @property
    def late(self) -> int:
        return len(self.late_at)

    @property
    def host_late(self) -> int:
        return len(self.host_late_at)


def shared(
    node: Node,
    run_together: RunTogether,
    pattern: str,
    requests: int,
    *,
    kernel_us: int,
    mechanism: str,
    counters: list[RunCounters] | None = None,
    served: list[Request] | None = None,
    sync: str = SERVICE_SYNC,
) -> tuple[float, float, float]:
    """One run next to the offline job: online p50, p99 (µs) and the offline share of idle time;
    the arbiter's counters into `counters` and each request as the service measured it into
    `served`."""
    node.clear_tenants()
    online_env = node.tenant_env("online", ComputeSpec.parse(priority="online"))
    offline_env = node.tenant_env("offline", ComputeSpec.parse(priority="offline"))
    if mechanism == NONE:
        online_env = offline_env = node.base_env
    else:
        settings = {k: v for k, v in MECHANISMS[mechanism].items() if k != "gpu"}
        tune_arbiter(node.arbiter(), **settings)
    window = (requests - 1) * REQUEST["mean_ms"] / 1000
    before = read_arbiter(node.arbiter()) if mechanism != NONE else None
    stolen = host_steal_ms()
    on, off = run_together(
        node,
        [
            (_service_env(online_env, sync), _online_args(pattern, requests)),
            (offline_env, _offline_args(window, kernel_us)),
        ],
    )
    stolen = host_steal_ms() - stolen
    if before is not None and counters is not None:
        after = read_arbiter(node.arbiter())
        counters.append(
            RunCounters(
                after.holdbacks - before.holdbacks,
                after.holdback_misses - before.holdback_misses,
                after.early_preemptions - before.early_preemptions,
                after.online_samples,
                _tenant_wait_us(after, "online"),  # a new tenant each run: its entry starts at 0
                after.online_stalls - before.online_stalls,
                after.online_relearns - before.online_relearns,
                steal_ms=stolen,
            )
        )
    if served is not None:
        served.extend(requests_of(on))
    online_busy = requests * REQUEST["kernels"] * REQUEST["us"] / 1e6
    idle = float(off["wall_ns"]) / 1e9 - online_busy
    return float(on["p50_us"]), float(on["p99_us"]), float(off["gpu_ns"]) / 1e9 / idle


def measure(
    node_for: NodeFor,
    run_together: RunTogether,
    *,
    runs: int,
    requests: int,
    patterns: list[str],
    kernels_us: list[int],
    mechanisms: list[str],
    progress: Callable[[str], None] = lambda _: None,
    sync: str = SERVICE_SYNC,
) -> tuple[list[Cell], dict[str, Cell]]:
    """The cells, and per pattern the service alone (a Cell with kernel 0)."""
    everything = [*mechanisms, NONE]
    cells = {(p, k, m): Cell(p, k, m) for p in patterns for k in kernels_us for m in everything}
    alones = {p: Cell(p, 0, "alone") for p in patterns}
    default = node_for(DEFAULT_GPU)
    for run in range(runs):
        for p in patterns:
            a50, a99 = alone(default, run_together, p, requests, sync=sync)
            alones[p].p50.append(a50)
            alones[p].p99.append(a99)
            for k in kernels_us:
                for m in everything:
                    node = node_for(gpu_of(m))
                    s50, s99, share = shared(
                        node, run_together, p, requests, kernel_us=k, mechanism=m, sync=sync
                    )
                    cell = cells[(p, k, m)]
                    cell.p50.append(s50)
                    cell.p99.append(s99)
                    cell.offline.append(share)
                    progress(
                        f"run {run + 1} {p} {k / 1000:g} ms {m}: p99 {s99:.0f} µs (alone {a99:.0f}), "
                        f"offline {share:.0%}"
                    )
    return list(cells.values()), alones


def goal_p99(kernel_us: int) -> float:
    """The issue's goal for online p99 / alone: 1.2 at 0.5 and 2 ms offline kernels, 1.5 at 8 ms."""
    return 1.5 if kernel_us >= 8000 else 1.2


NOISY_ALONE = 1.5
"""The service alone has p99 / p50 about 1.05 on a quiet host (every request runs the same
kernels): above this, host stalls set its p99 and every p99 ratio carries them."""


def noise_warnings(alones: dict[str, Cell]) -> list[str]:
    """A line per pattern whose service alone shows the host's noise in its p99."""
    out = []
    for p, a in alones.items():
        spread = a.median("p99") / a.median("p50")
        if spread > NOISY_ALONE:
            out.append(
                f"WARNING: {p} alone has p99 {spread:.2f}x its p50 (about 1.05x on a quiet host): "
                "host stalls set the p99, so the p99 ratios below carry them; p50 and the offline "
                "share hold"
            )
    return out


def table(cells: list[Cell], alones: dict[str, Cell], runs: int, sync: str = SERVICE_SYNC) -> list[str]:
    """p50 and p99: the medians over the runs divided by the medians of the service alone."""
    head = (
        f"{'offline kernel':>14}  {'arrivals':<9} {'mechanism':<25} {'p50 x alone':>11} {'p99 x alone':>11}"
    )
    head += f" {'offline of idle':>15}  goal (p99, offline >= 70%)"
    lines = [
        f"Online latency / arrivals x mechanism — simulated GPU, median of {runs} runs, "
        f"the service's syncs {sync} (SGPROBE_SYNC)"
    ]
    lines += [
        f"service alone, {p}: p50 {a.median('p50'):.0f} µs, p99 {a.median('p99'):.0f} µs"
        for p, a in alones.items()
    ]
    lines += noise_warnings(alones)
    lines += [head, "-" * len(head)]
    for c in cells:
        a = alones[c.pattern]
        p50, p99 = c.median("p50") / a.median("p50"), c.median("p99") / a.median("p99")
        off = c.median("offline")
        if c.mechanism == NONE:
            verdict = ""
        else:
            met = p99 <= goal_p99(c.kernel_us) and off >= 0.70
            verdict = f"<= {goal_p99(c.kernel_us):.1f}x: {'met' if met else 'NOT met'}"
        lines.append(
            f"{c.kernel_us / 1000:>11g} ms  {c.pattern:<9} {c.mechanism:<25} {p50:>10.2f}x {p99:>10.2f}x"
            f" {off * 100:>14.1f}%  {verdict}"
        )
    return lines


def late_requests(lat: list[float], cpu: list[float], bound: float) -> tuple[list[int], list[int]]:
    """The requests over `bound` (by index), and those of them that were late only by the time
    the service waited for a CPU: without that wait they were within it."""
    late = [i for i, v in enumerate(lat) if v > bound]
    return late, [i for i in late if i < len(cpu) and lat[i] - cpu[i] <= bound]


def p99(values: list[float]) -> float:
    """The probe's p99: the value at rank round(0.99 (n - 1)) of the sorted values."""
    ordered = sorted(values)
    return ordered[int((len(ordered) - 1) * 0.99 + 0.5)]


def periodic_repeats(
    node: Node,
    run_together: RunTogether,
    *,
    repeats: int,
    requests: int,
    kernel_us: int,
    mechanism: str,
    sync: str = SERVICE_SYNC,
) -> tuple[float, list[float], list[RunCounters]]:
    """The service's periodic p99 alone (median of `repeats` runs), p99 / that of `repeats`
    periodic runs next to the offline job, and each run's arbiter counters (with `late`: the
    requests over 1.2 x the alone p50, `host_late`: those of them on time but for the time the
    service waited for a CPU, and the cause of each)."""
    alones = [alone(node, run_together, "periodic", requests, sync=sync) for _ in range(repeats)]
    alone50 = statistics.median(a[0] for a in alones)
    alone99 = statistics.median(a[1] for a in alones)
    ratios: list[float] = []
    counters: list[RunCounters] = []
    for _ in range(repeats):
        served: list[Request] = []
        _, s99, _ = shared(
            node,
            run_together,
            "periodic",
            requests,
            kernel_us=kernel_us,
            mechanism=mechanism,
            counters=counters,
            served=served,
            sync=sync,
        )
        ratios.append(s99 / alone99)
        if counters and served:
            c = counters[-1]
            lat = [r.latency for r in served]
            c.late_at, c.host_late_at = late_requests(lat, [r.cpu_wait for r in served], 1.2 * alone50)
            c.causes = late_causes(served, c.late_at)
            c.woke_late = sum(r.woke > WOKE_LATE_US for r in served)
            c.woke_around = [
                f"{served[i].woke:.0f}/{served[i - 1].woke:.0f}" if i else f"{served[i].woke:.0f}/-"
                for i in c.late_at
            ]
            c.p99_less_cpu_us = p99([r.latency - r.cpu_wait for r in served])
    return alone99, ratios, counters
