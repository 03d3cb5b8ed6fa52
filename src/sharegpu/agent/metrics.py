"""Prometheus metrics of the agent: tenants, GPUs, the arbiters, the loops' decisions.

Served over HTTP (prometheus_client's threaded server, next to the API's Unix socket) on
`DEFAULT_PORT` unless `--metrics-port 0`. Everything about tenants and GPUs is computed at scrape
time by `SharegpuCollector` from the same readers as the API (`sharegpu.agent.service.views`:
`sharegpu.report.node_report` under it, and `gpu_views`), so a scrape and `GET /v1/tenants` agree.
Two things cannot be read from the regions at scrape time and are kept by the agent instead:

- `EventCounts`: the audit findings, QoS decisions and reaped processes that the loops report
  (counters from the agent's start; Prometheus handles the reset at a restart);
- `OnlineWaitSampler`: a histogram of the mean wait per grant of each online tenant, observed
  once a second from the arbiter's counters (the regions keep totals, not a distribution).

No label is unbounded: tenant, gpu (UUID) and the tenant's namespace/pod/container labels
(empty when absent) are bounded by the node's tenants; never a pid. docs/metrics.md lists them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sharegpu import __version__
from sharegpu.agent.events import Event
from sharegpu.agent.models import TenantView, gpu_views
from sharegpu.agent.service import LoopStats, views
from sharegpu.agent.snapshot import NodeSnapshot
from sharegpu.agent.store import TenantRow
from sharegpu.arbiter import TUNABLES, Tunable
from sharegpu.devices import Gpu
from sharegpu.errors import AgentError, DeviceError
from sharegpu.regions import abi
from sharegpu.report import ChargeKey, GpuTime, read_arbiters

log = logging.getLogger("sharegpu.agent")

# 9400 is dcgm-exporter's, 9100 node_exporter's, 9835 nvidia_gpu_exporter's: all on GPU nodes.
DEFAULT_PORT = 9479
# Prometheus scrapes from another host (or pod): listen on every interface by default. The
# endpoint is read-only; the API (which changes things) stays on the Unix socket.
DEFAULT_ADDRESS = "0.0.0.0"
SAMPLE_INTERVAL_S = 1.0
# Mean wait per grant, seconds: from 100 us (an uncontended grant) to 5 s (starved).
WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

K8S_LABELS = ("namespace", "pod", "container")
TENANT_LABELS = ("tenant", *K8S_LABELS)
TENANT_GPU_LABELS = ("tenant", "gpu", *K8S_LABELS)
AUDIT_KINDS = ("untracked", "bypass", "killed", "compute_uncharged")
QOS_ACTIONS = ("raise", "lower", "hold")
REAP_REGIONS = ("usage", "arbiter")
TENANT_STATES = ("running", "idle", "stale", "error")

_NS = 1e9


def _by_label(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter with one label, a sample per key of `counts`."""
    fam = CounterMetricFamily(name, doc, labels=[label])
    for key, n in counts.items():
        fam.add_metric([key], float(n))
    return fam


def _setting_metric(tunable: Tunable) -> str:
    """The gauge of an arbiter tunable: its name, a time in seconds (`quantum_ns`:
    `sharegpu_arbiter_quantum_seconds`), a mode as its code (`online_preempt`)."""
    if tunable.nanoseconds:
        return f"sharegpu_arbiter_{tunable.name.removesuffix('_ns')}_seconds"
    return f"sharegpu_arbiter_{tunable.name}"


def _setting_value(tunable: Tunable, shown: int | str) -> float:
    """A tunable as ArbiterStatus shows it, as its gauge's value."""
    if tunable.nanoseconds:
        return int(shown) / _NS
    if tunable.codes:  # a mode: its code (a code of no mode reads as its digits)
        code = tunable.codes.get(str(shown))
        return float(code if code is not None else int(shown))
    return float(shown)


def _k8s(view: TenantView | None) -> list[str]:
    """namespace, pod, container: the tenant's own labels (the Kubernetes integration's names),
    else what the cgroups of its processes say: the container's id, the pod's UID."""
    if view is None:
        return ["" for _ in K8S_LABELS]
    labels = dict(view.labels)
    if view.containers:
        labels.setdefault("container", ",".join(c.id for c in view.containers))
        pods = sorted({c.pod_uid for c in view.containers if c.pod_uid})
        if pods:
            labels.setdefault("pod", ",".join(pods))
    return [labels.get(k, "") for k in K8S_LABELS]


# ---------------------------------------------------------------------------------------------
# What the agent keeps: event counts and the online wait histogram.


class EventCounts:
    """Counters of what the loops reported (thread-safe: observed on the event loop, read by
    the HTTP server's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.audit = dict.fromkeys(AUDIT_KINDS, 0)
        self.qos = dict.fromkeys(QOS_ACTIONS, 0)
        self.reaped_processes = dict.fromkeys(REAP_REGIONS, 0)
        self.reaped_tenants = 0
        self.arbiter_rebuilds: dict[str, int] = {}
        self.lock_holder_kills = dict.fromkeys(REAP_REGIONS, 0)
        self.cdi_left_out: list[str] = []  # tenants left out of the last CDI spec written

    def observe(self, events: Iterable[Event]) -> None:
        with self._lock:
            for event in events:
                if event.kind.startswith("audit."):
                    kind = event.kind.removeprefix("audit.")
                    if kind in self.audit and not event.data.get("cleared"):
                        self.audit[kind] += 1  # findings, not their clearing
                elif event.kind == "qos.decision":
                    action = str(event.data.get("action", ""))
                    if action in self.qos:
                        self.qos[action] += 1
                elif event.kind == "process.reaped":
                    region = str(event.data.get("region", "usage"))
                    if region in self.reaped_processes:
                        self.reaped_processes[region] += 1
                elif event.kind == "tenant.reaped":
                    self.reaped_tenants += 1
                elif event.kind == "gpu.arbiter_rebuilt" and event.gpu:
                    self.arbiter_rebuilds[event.gpu] = self.arbiter_rebuilds.get(event.gpu, 0) + 1
                elif event.kind == "cdi.written":
                    self.cdi_left_out = [str(t) for t in event.data.get("left_out", [])]
                elif event.kind == "process.lock_holder_killed":
                    region = str(event.data.get("region", ""))
                    if region in self.lock_holder_kills:
                        self.lock_holder_kills[region] += 1

    def rebuilds(self) -> dict[str, int]:
        with self._lock:
            return dict(self.arbiter_rebuilds)

    def left_out(self) -> list[str]:
        with self._lock:
            return list(self.cdi_left_out)

    def kills(self) -> dict[str, int]:
        with self._lock:
            return dict(self.lock_holder_kills)

    def snapshot(self) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
        with self._lock:
            return dict(self.audit), dict(self.qos), dict(self.reaped_processes), self.reaped_tenants


@dataclass
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * len(WAIT_BUCKETS))  # not cumulative
    count: int = 0
    total: float = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(WAIT_BUCKETS):
            if value <= bound:
                self.buckets[i] += 1
                break
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(WAIT_BUCKETS, self.buckets, strict=True):
            running += n
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


class OnlineWaitSampler:
    """A periodic loop (the daemon runs it like the others): every `interval_s`, for each online
    tenant on each arbiter, (wait_ns delta) / (grants delta) over the interval, observed when it
    was granted the GPU at least once. So the histogram counts intervals, not requests: "in how
    many seconds was the mean wait of this online tenant above X"."""

    name = "metrics"

    def __init__(self, root: Path, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.root = root
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[int, int]] = {}  # (tenant, gpu) -> (wait_ns, grants)
        self._hist: dict[tuple[str, str], _Histogram] = {}

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One sample from `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        seen: dict[tuple[str, str], tuple[int, int]] = {}
        for status in snap.statuses():
            for entry in status.tenants:
                if entry.priority == "online":
                    seen[(entry.id, status.uuid)] = (entry.wait_ns, entry.grants)
        with self._lock:
            for key, (wait_ns, grants) in seen.items():
                before = self._last.get(key)
                if before is None:
                    continue
                d_wait, d_grants = wait_ns - before[0], grants - before[1]
                if d_grants > 0 and d_wait >= 0:
                    self._hist.setdefault(key, _Histogram()).observe(d_wait / d_grants / _NS)
            self._last = seen
            for key in [k for k in self._hist if k not in seen]:
                del self._hist[key]  # the tenant left the arbiter: its series go
        return []

    def snapshot(self) -> dict[tuple[str, str], _Histogram]:
        with self._lock:
            return {
                k: _Histogram(buckets=list(h.buckets), count=h.count, total=h.total)
                for k, h in self._hist.items()
            }


# ---------------------------------------------------------------------------------------------
# The collector.


class SharegpuCollector(Collector):
    """Every sharegpu metric, computed when scraped."""

    def __init__(
        self,
        root: Path,
        rows: Callable[[], Mapping[str, TenantRow]],
        gpus: Callable[[], list[Gpu]],
        *,
        loops: Mapping[str, LoopStats] | None = None,
        counts: EventCounts | None = None,
        sampler: OnlineWaitSampler | None = None,
        driver: Callable[[], str] | None = None,
        gpu_time: Callable[[], Mapping[ChargeKey, GpuTime]] | None = None,
    ) -> None:
        self.root = root
        self.rows = rows
        self.gpus = gpus
        self.loops = loops if loops is not None else {}
        self.counts = counts or EventCounts()
        self.sampler = sampler
        self.gpu_time = gpu_time
        self._driver_source = driver
        self._driver: str | None = None
        self.started = time.time()

    def _driver_version(self) -> str:
        if self._driver is None and self._driver_source is not None:
            with contextlib.suppress(DeviceError):
                self._driver = self._driver_source()
        return self._driver or ""

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time; the registry needs no names up front

    def collect(self) -> Iterator[Metric]:
        yield from self._agent()
        tenants = views(self.root, self.rows(), gpu_time=self.gpu_time() if self.gpu_time else None)
        try:
            gpus = self.gpus()
            nvml_ok = 1.0
        except DeviceError as err:
            log.debug("metrics: GPU discovery failed: %s", err)
            gpus, nvml_ok = [], 0.0
        up = GaugeMetricFamily("sharegpu_nvml_up", "1 if NVML answered at this scrape, else 0")
        up.add_metric([], nvml_ok)
        yield up
        uuids = sorted({g.uuid for g in gpus} | {d.uuid for t in tenants for d in t.devices})
        arbiters = read_arbiters(self.root, uuids)
        yield from self._tenants(tenants)
        yield from self._gpus(gpus, tenants, arbiters)
        yield from self._arbiters(arbiters)
        yield from self._waits({t.id: t for t in tenants})

    # -- the agent -------------------------------------------------------------------------------

    def _agent(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "sharegpu_build_info", "The agent's version and shim ABI; always 1", labels=["version", "abi"]
        )
        build.add_metric([__version__, f"{abi.ABI_MAJOR}.{abi.ABI_MINOR}"], 1.0)
        yield build
        start = GaugeMetricFamily("sharegpu_agent_start_time_seconds", "When the agent started, Unix time")
        start.add_metric([], self.started)
        yield start
        ticks = CounterMetricFamily("sharegpu_agent_loop_ticks", "Ticks of each agent loop", labels=["loop"])
        errors = CounterMetricFamily(
            "sharegpu_agent_loop_errors", "Ticks of each agent loop that failed", labels=["loop"]
        )
        cpu = CounterMetricFamily(
            "sharegpu_agent_loop_cpu_seconds",
            "CPU time the ticks of each periodic loop have taken (thread time)",
            labels=["loop"],
        )
        for name, stats in sorted(self.loops.items()):
            ticks.add_metric([name], float(stats.ticks))
            errors.add_metric([name], float(stats.errors))
            if stats.cpu_seconds is not None:
                cpu.add_metric([name], stats.cpu_seconds)
        yield ticks
        yield errors
        yield cpu
        left_out = GaugeMetricFamily(
            "sharegpu_cdi_tenant_left_out",
            "1 for each tenant left out of the last CDI spec written: its files cannot be read "
            "(containers cannot use it; the node's other tenants are listed)",
            labels=["tenant"],
        )
        for name in self.counts.left_out():
            left_out.add_metric([name], 1.0)
        yield left_out
        audit, qos, reaped, reaped_tenants = self.counts.snapshot()
        yield _by_label(
            "sharegpu_audit_events",
            "Audit findings by kind (untracked, bypass, killed, compute_uncharged)",
            "kind",
            audit,
        )
        yield _by_label(
            "sharegpu_qos_decisions", "QoS loop decisions by action (raise, lower, hold)", "action", qos
        )
        yield _by_label(
            "sharegpu_reaped_processes",
            "Dead processes whose charges (usage) or arbiter entries were released",
            "region",
            reaped,
        )
        yield _by_label(
            "sharegpu_lock_holder_kills",
            "Processes killed because they stayed stopped holding a usage or arbiter region's lock "
            "(every process needing that lock waited)",
            "region",
            self.counts.kills(),
        )
        fam = CounterMetricFamily(
            "sharegpu_reaped_tenants", "Tenants removed because their owner (supervisor, pod) was gone"
        )
        fam.add_metric([], float(reaped_tenants))
        yield fam

    # -- tenants ---------------------------------------------------------------------------------

    def _tenants(self, tenants: Sequence[TenantView]) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: Sequence[str] = TENANT_GPU_LABELS) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=list(TENANT_GPU_LABELS))

        states = GaugeMetricFamily("sharegpu_tenants", "Tenants on this node by state", labels=["state"])
        by_state = dict.fromkeys(TENANT_STATES, 0)
        for t in tenants:
            by_state[t.state] = by_state.get(t.state, 0) + 1
        for state, n in by_state.items():
            states.add_metric([state], float(n))
        yield states
        processes = gauge("sharegpu_tenant_processes", "Live processes of the tenant", labels=TENANT_LABELS)
        info = gauge(
            "sharegpu_tenant_compute_info",
            "The tenant's compute policy and priority on the GPU; always 1",
            labels=[*TENANT_GPU_LABELS, "policy", "priority"],
        )
        cap = gauge("sharegpu_tenant_memory_cap_bytes", "Memory cap of the tenant on the GPU")
        used = gauge("sharegpu_tenant_memory_used_bytes", "Memory allocated by the tenant's live processes")
        overhead = gauge(
            "sharegpu_tenant_memory_overhead_bytes", "Driver overhead charged to the tenant (contexts)"
        )
        peak = gauge("sharegpu_tenant_memory_peak_bytes", "Highest memory use of the tenant on the GPU")
        over = gauge("sharegpu_tenant_over_cap", "1 when used + overhead is above the cap (after a shrink)")
        share = gauge("sharegpu_tenant_compute_share_ratio", "Configured compute share, 0-1")
        ceiling = gauge("sharegpu_tenant_compute_ceiling_ratio", "Configured burst ceiling, 0-1")
        guaranteed = gauge(
            "sharegpu_tenant_compute_guaranteed_ratio",
            "Compute guaranteed to the tenant, 0-1 (its share under cap or burst, else 0)",
        )
        busy = counter(
            "sharegpu_tenant_gpu_busy_seconds",
            "GPU time: the GPU ran the tenant's work, measured by the agent every second since it "
            "started (the arbiter's charges for an arbitrated tenant, NVML for a native one; rate: the "
            "achieved share of the card)",
        )
        nvml = counter(
            "sharegpu_tenant_gpu_nvml_seconds",
            "NVML's per-process utilization of the tenant's processes, integrated by the agent every "
            "second since it started: the cross-check of gpu_busy_seconds",
        )
        held = counter(
            "sharegpu_tenant_gpu_held_seconds",
            "What the arbiter charged for the tenant's holds of the GPU's token: the GPU time its work "
            "used while it held it (ABI 1.6; older shims: the wall time held, drain included)",
        )
        wait = counter("sharegpu_tenant_gpu_wait_seconds", "Time the tenant's processes waited for the GPU")
        throttled = counter(
            "sharegpu_tenant_gpu_throttled_seconds", "Time the tenant was held back by its cap or ceiling"
        )
        preempt = counter("sharegpu_tenant_preemptions", "Times the tenant lost the GPU to a higher class")
        oom = counter("sharegpu_tenant_oom_refusals", "Allocations refused at the tenant's memory cap")
        for t in tenants:
            k8s = _k8s(t)
            processes.add_metric([t.id, *k8s], float(sum(1 for p in t.processes if p.alive)))
            for d in t.devices:
                labels = [t.id, d.uuid, *k8s]
                info.add_metric([*labels, d.policy, d.priority], 1.0)
                cap.add_metric(labels, float(d.memory_cap_bytes))
                used.add_metric(labels, float(d.memory_used_bytes))
                overhead.add_metric(labels, float(d.memory_overhead_bytes))
                peak.add_metric(labels, float(d.memory_peak_bytes))
                over.add_metric(labels, 1.0 if d.over_cap else 0.0)
                share.add_metric(labels, d.compute_share_ratio)
                ceiling.add_metric(labels, d.compute_ceiling_ratio)
                guaranteed.add_metric(labels, d.compute_share_ratio if d.policy in ("cap", "burst") else 0.0)
                busy.add_metric(labels, d.gpu_time_seconds or 0.0)
                nvml.add_metric(labels, d.nvml_gpu_time_seconds or 0.0)
                held.add_metric(labels, d.held_seconds)
                wait.add_metric(labels, d.wait_seconds)
                throttled.add_metric(labels, d.throttled_seconds)
                preempt.add_metric(labels, float(d.preemptions))
                oom.add_metric(labels, float(d.oom_events))
        yield from (processes, info, cap, used, overhead, peak, over, share, ceiling, guaranteed)
        yield from (busy, nvml, held, wait, throttled, preempt, oom)

    def _waits(self, tenants: Mapping[str, TenantView]) -> Iterator[Metric]:
        fam = HistogramMetricFamily(
            "sharegpu_tenant_online_wait_seconds",
            "Mean wait per GPU grant of an online tenant, one observation per second in which it "
            "was granted the GPU (not per request)",
            labels=list(TENANT_GPU_LABELS),
        )
        if self.sampler is not None:
            for (tenant, gpu), hist in sorted(self.sampler.snapshot().items()):
                fam.add_metric([tenant, gpu, *_k8s(tenants.get(tenant))], hist.cumulative(), hist.total)
        yield fam

    # -- GPUs and arbiters -----------------------------------------------------------------------

    def _gpus(
        self, gpus: list[Gpu], tenants: list[TenantView], arbiters: Mapping[str, Any]
    ) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["gpu"])

        info = GaugeMetricFamily(
            "sharegpu_gpu_info",
            "The GPU's index, model and driver, for joins; always 1",
            labels=["gpu", "index", "name", "driver"],
        )
        total = gauge("sharegpu_gpu_memory_total_bytes", "Memory of the GPU")
        used = gauge("sharegpu_gpu_memory_used_bytes", "Memory in use on the GPU as NVML reports it")
        busy = gauge("sharegpu_gpu_busy_ratio", "GPU utilization from NVML, 0-1")
        count = gauge("sharegpu_gpu_tenants", "Tenants with a cap on the GPU")
        allocated = gauge("sharegpu_gpu_memory_allocated_bytes", "Sum of the tenants' memory caps on the GPU")
        tenants_used = gauge(
            "sharegpu_gpu_memory_tenants_used_bytes", "Sum of the tenants' usage and overhead on the GPU"
        )
        guaranteed = gauge(
            "sharegpu_gpu_compute_guaranteed_ratio", "Sum of the cap/burst guarantees on the GPU, 0-1+"
        )
        driver = self._driver_version() if gpus else ""
        for g in gpu_views(gpus, tenants, dict(arbiters)):
            info.add_metric([g.uuid, str(g.index), g.name, driver], 1.0)
            total.add_metric([g.uuid], float(g.memory_total_bytes))
            used.add_metric([g.uuid], float(g.memory_used_bytes))
            busy.add_metric([g.uuid], g.utilization_pct / 100)
            count.add_metric([g.uuid], float(len(g.tenants)))
            allocated.add_metric([g.uuid], float(g.memory_allocated_bytes))
            tenants_used.add_metric([g.uuid], float(g.memory_tenants_used_bytes))
            guaranteed.add_metric([g.uuid], g.compute_guaranteed_ratio)
        yield from (info, total, used, busy, count, allocated, tenants_used, guaranteed)

    def _arbiters(self, arbiters: Mapping[str, Any]) -> Iterator[Metric]:
        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["gpu"])

        waiting = GaugeMetricFamily(
            "sharegpu_arbiter_waiting_clients", "Processes waiting for the GPU now", labels=["gpu"]
        )
        grants = counter("sharegpu_arbiter_grants", "Times the GPU was granted to a process")
        handovers = counter("sharegpu_arbiter_handovers", "Times the GPU passed from one tenant to another")
        idle = counter(
            "sharegpu_arbiter_handover_idle_seconds", "GPU idle time between a release and the next grant"
        )
        holdbacks = counter(
            "sharegpu_arbiter_holdbacks", "Offline launches held back ahead of a predicted online request"
        )
        held = counter("sharegpu_arbiter_holdback_seconds", "Time offline launches were held back")
        misses = counter("sharegpu_arbiter_holdback_misses", "Hold-backs whose predicted request never came")
        early = counter(
            "sharegpu_arbiter_early_preemptions",
            "Grants to a higher class made before the lower-class holder drained (online_preempt early)",
        )
        quiet = counter(
            "sharegpu_arbiter_quiet_windows",
            "Quiet windows after online requests (no offline grant meanwhile)",
        )
        stalls = counter(
            "sharegpu_arbiter_online_stalls",
            "Runs of online requests off the learned beat that ended back on it (the prediction resumed)",
        )
        relearns = counter("sharegpu_arbiter_online_relearns", "Changed online request patterns learned anew")
        loans = counter(
            "sharegpu_arbiter_loans",
            "Grants that lent the card for a holder's host gap to a waiter of its class",
        )
        queued = counter(
            "sharegpu_arbiter_queued_handovers",
            "Hand-overs made before the holder's work ended, the next holder's queued behind it on the GPU",
        )
        gates_opened = counter(
            "sharegpu_arbiter_gates_opened",
            "Queued holds whose holder opened its gate itself (the awaited work ran past the bound, or "
            "the previous holder's event did not open)",
        )
        gate_wait = counter(
            "sharegpu_arbiter_gate_wait_seconds",
            "Time first work of queued holds waited on the GPU for the previous holder's work",
        )
        reclaims = counter("sharegpu_arbiter_reclaims", "Tokens reclaimed from a dead holder")
        stall_reclaims = counter(
            "sharegpu_arbiter_stall_reclaims",
            "Tokens taken back from a live holder stopped past its quantum (SIGSTOP, docker pause)",
        )
        entry_waits = counter(
            "sharegpu_arbiter_entry_waits", "Processes that waited for a free client entry instead of failing"
        )
        recoveries = counter("sharegpu_arbiter_recoveries", "Arbiter regions recovered after a crash")
        # From the agent's events, not the region (a new region counts from 0); every GPU with a
        # region has a sample, 0 until its first rebuild, so an alert's increase() sees the first.
        rebuilt = self.counts.rebuilds()
        rebuilds = _by_label(
            "sharegpu_arbiter_rebuilds",
            "Damaged or broken (a lock held past its deadline) arbiter regions the agent moved "
            "aside and made anew",
            "gpu",
            {**dict.fromkeys(arbiters, 0), **rebuilt},
        )
        lock_timeouts = counter(
            "sharegpu_arbiter_lock_timeouts",
            "Lock attempts that gave up at the deadline (the region is then replaced; counts from 0 again)",
        )
        settings = [
            (t, GaugeMetricFamily(_setting_metric(t), f"Arbiter setting: {t.doc}", labels=["gpu"]))
            for t in TUNABLES.values()
        ]
        for uuid, a in sorted(arbiters.items()):
            waiting.add_metric([uuid], float(a.waiting))
            grants.add_metric([uuid], float(a.grants))
            handovers.add_metric([uuid], float(a.handovers))
            idle.add_metric([uuid], a.handover_idle_ns / _NS)
            holdbacks.add_metric([uuid], float(a.holdbacks))
            held.add_metric([uuid], a.holdback_ns / _NS)
            misses.add_metric([uuid], float(a.holdback_misses))
            early.add_metric([uuid], float(a.early_preemptions))
            quiet.add_metric([uuid], float(a.quiet_windows))
            stalls.add_metric([uuid], float(a.online_stalls))
            relearns.add_metric([uuid], float(a.online_relearns))
            loans.add_metric([uuid], float(a.loans))
            queued.add_metric([uuid], float(a.queued_handovers))
            gates_opened.add_metric([uuid], float(a.gates_opened))
            gate_wait.add_metric([uuid], a.gate_wait_ns / _NS)
            reclaims.add_metric([uuid], float(a.reclaims))
            stall_reclaims.add_metric([uuid], float(a.stall_reclaims))
            entry_waits.add_metric([uuid], float(a.entry_waits))
            recoveries.add_metric([uuid], float(a.recoveries))
            lock_timeouts.add_metric([uuid], float(a.lock_timeouts))
            for tunable, gauge in settings:
                gauge.add_metric([uuid], _setting_value(tunable, getattr(a, tunable.name)))
        yield from (
            waiting,
            grants,
            handovers,
            idle,
            holdbacks,
            held,
            misses,
            early,
            quiet,
            stalls,
            relearns,
            loans,
            queued,
            gates_opened,
            gate_wait,
            reclaims,
            stall_reclaims,
            entry_waits,
            recoveries,
            lock_timeouts,
            rebuilds,
        )
        yield from (gauge for _, gauge in settings)


# ---------------------------------------------------------------------------------------------
# Serving.


def build_registry(collector: SharegpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)  # process_cpu_seconds_total etc. of the agent
    return registry


class MetricsServer:
    """prometheus_client's threaded HTTP server: scrapes run in its threads, never on the API's
    event loop. `stop()` closes the listening socket."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int) -> None:
        self.address = address
        self.port = port
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=registry)
        except OSError as err:
            raise AgentError(f"cannot serve metrics on {address}:{port}: {err.strerror}") from err
        self.port = int(self._server.server_address[1])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
