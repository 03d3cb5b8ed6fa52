"""What every tenant on this node is configured for and what it uses, in one structure.

Joins the tenant directories (limits: the configuration; usage: memory per process) with the
per-GPU arbiter regions (GPU time, waiting, throttling, preemptions per tenant), so the CLI's
table and JSON, and the agent's API and metrics, read the same figures.

GPU time, the share of the card the GPU spent running a tenant's work (``busy_ratio``), comes
from one of two sources, named in ``busy_source``:

- ``arbiter``: for a tenant the arbiter schedules (any policy but ``native``), its charges, which
  are exact: the GPU time its work used while it held the GPU's token (the holds' wall time less
  their idle time after syncs that drained them, the work's end read from the GPU's clock:
  docs/design/arbitration.md, "Exact charges"). A rate needs two readings, so this is what a
  caller that measured the charges over a window passes in (``charge_rates``: the agent's meter
  every second, ``sharegpu tenants`` between its two readings). Pid namespaces, containers and
  NVML's sampling cannot skew it.
- ``nvml``: NVML's per-process utilization over the last ``busy_window_s`` seconds, summed over
  the tenant's processes by host pid (the tenants of one card scaled down together if NVML's
  samples add up to more than the whole card). For ``native`` tenants, which the arbiter does
  not see, and where no charge rate was measured.

NVML's figure is always kept beside (``nvml_ratio``): the cross-check. A tenant whose NVML time
runs well past its charges launches around the arbiter or rewrites its charges
(``sharegpu.agent.busy`` reports it: ``audit.compute_uncharged``).

``held_ns`` and ``held_ratio`` are the arbiter's lifetime charge and that over the tenant's age
(a shim of ABI 1.5 or older charges the wall time held instead, much longer than the GPU ran for
a tenant with short kernels or host work between them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sharegpu.arbiter import ArbiterStatus, arbiter_path, iter_arbiters, read_arbiter
from sharegpu.devices import BUSY_WINDOW_S, GpuBusy, gpu_busy
from sharegpu.errors import ConfigError, DeviceError, SpecError
from sharegpu.regions import abi, liveness
from sharegpu.tenant import (
    ProcessUsage,
    is_stale,
    iter_tenants,
    read_limits,
    read_usage,
    runtime_dir,
    slot_host_pid,
    tenant_status,
    tenants_dir,
)

_K = TypeVar("_K", bound=Hashable)


@dataclass
class DeviceReport:
    uuid: str
    policy: str
    priority: str
    share_permille: int
    ceiling_permille: int
    weight: int
    mem_cap_bytes: int
    mem_used_bytes: int
    overhead_bytes: int
    mem_peak_bytes: int
    oom_events: int
    held_ns: int = 0  # charged by the arbiter: GPU time of its holds (ABI 1.6; before, wall time held)
    wait_ns: int = 0
    throttled_ns: int = 0
    preemptions: int = 0
    held_ratio: float | None = None  # held / age; None for memory-only (native) tenants
    busy_ratio: float | None = None  # GPU time share over the window; None: not measured
    busy_source: str | None = None  # "arbiter" (its charges) or "nvml"; None: not measured
    nvml_ratio: float | None = None  # NVML's GPU time share over its window: the cross-check


@dataclass
class TenantReport:
    id: str
    path: Path
    error: str | None
    command: object
    age_s: float
    stale: bool
    incarnation: int = 0
    devices: list[DeviceReport] = field(default_factory=list)
    processes: list[ProcessUsage] = field(default_factory=list)
    counters_at: float | None = None  # time.monotonic() as the arbiter's counters were read

    @property
    def live_processes(self) -> int:
        return sum(1 for p in self.processes if p.alive)


def read_arbiters(root: Path, uuids: Iterable[str]) -> dict[str, ArbiterStatus]:
    """The arbiter regions of `uuids` that exist and read cleanly."""
    found = {}
    for uuid in uuids:
        with contextlib.suppress(ConfigError, SpecError):
            path = arbiter_path(root, uuid)
            if path.exists():
                found[uuid] = read_arbiter(path)
    return found


ChargeKey = tuple[str, int, str]  # (tenant, incarnation, GPU uuid)


@dataclass(frozen=True)
class GpuTime:
    """What the agent's meter (``sharegpu.agent.busy``) measured of one tenant on one GPU."""

    ratio: float | None  # over the last second, from `source`; None: nothing measured yet
    source: str  # "arbiter" or "nvml"
    nvml_ratio: float | None  # NVML's over the last second (the cross-check)
    seconds: float  # since the agent started, from `source`
    nvml_seconds: float


def read_charges(root: Path) -> dict[ChargeKey, int]:
    """What each GPU's arbiter has charged each tenant it schedules (ns of GPU time, since the
    tenant's entry was made), by (tenant, incarnation, GPU uuid). One read of each arbiter
    region; regions that do not read cleanly are left out (the stall loop reports them).

    A holder is charged when its hold ends and at each quantum's end, so the hold in progress
    is not in the books yet: it is added, from the holder's last charge to now, at most one
    quantum (what a holder idle since its last sync would be charged too much, at most that,
    until its next charge takes the idle time out). Without it a rate over one second would be
    off by up to a quantum at each end: two points of the card with the default 10 ms."""
    statuses = []
    for path in iter_arbiters(root):
        with contextlib.suppress(ConfigError, SpecError):
            statuses.append(read_arbiter(path))
    return charges_of(statuses, time.monotonic_ns())


def charges_of(statuses: Iterable[ArbiterStatus], now_ns: int) -> dict[ChargeKey, int]:
    """read_charges from arbiter regions already read, at `now_ns` (CLOCK_MONOTONIC, taken when
    they were read): the agent's sweep reads each region once for all its loops."""
    found: dict[ChargeKey, int] = {}
    for status in statuses:
        entries = {t.id: t for t in status.tenants if t.policy != "native"}
        for t in entries.values():
            found[(t.id, t.incarnation, status.uuid)] = t.gpu_time_ns
        for c in status.clients:
            if c.holding and c.tenant in entries and c.grant_ns:
                t = entries[c.tenant]
                found[(t.id, t.incarnation, status.uuid)] += min(
                    max(now_ns - c.grant_ns, 0), status.quantum_ns
                )
    return found


def charge_rates(
    before: Mapping[ChargeKey, float], after: Mapping[ChargeKey, float], seconds: float
) -> dict[ChargeKey, float]:
    """Each tenant's GPU time over the `seconds` between two readings of the charges: the share
    of the card (0-1). A tenant new since the first reading was charged all it has since then
    (its entry is made at its first launch); one whose charge went back (its GPU's region was
    rebuilt) counts what the new region charged."""
    if seconds <= 0:
        return {}
    rates = {}
    for key, now in after.items():
        then = before.get(key, 0.0)
        spent = now - then if now >= then else now
        rates[key] = min(max(spent, 0) / 1e9 / seconds, 1.0)
    return rates


def measure_busy(window_s: float) -> dict[str, GpuBusy] | None:
    """NVML's GPU time over the window, each card's and its processes', or None when NVML does
    not answer."""
    try:
        return gpu_busy(window_s)
    except DeviceError:
        return None


def _scaled_to_card(per_gpu: Mapping[str, Mapping[_K, float]]) -> dict[_K, float]:
    """The tenants of one card scaled down together to at most the whole card (NVML's samples
    of one card may add up to more: they are taken at different instants)."""
    found: dict[_K, float] = {}
    for shares in per_gpu.values():
        total = sum(shares.values())
        for key, ratio in shares.items():
            found[key] = ratio / total if total > 1.0 else ratio
    return found


def _attribute_busy(reports: list[TenantReport], busy: dict[str, dict[int, float]]) -> None:
    """Each tenant's NVML GPU time on each GPU: its live processes' shares (NVML names processes
    by host pid), the tenants of one card scaled down together to at most the whole card; the
    GPU time of a device whose charges were not measured."""
    per_gpu: dict[str, dict[int, float]] = {}
    devices: dict[int, DeviceReport] = {}
    for report in reports:
        # By the pid the agent knows them by: a container's process by its host pid, never the
        # pid inside (that names another process here).
        pids = {p.host_pid for p in report.processes if p.alive and p.host_pid}
        for dev in report.devices:
            shares = busy.get(dev.uuid)
            if shares is not None:
                devices[id(dev)] = dev
                per_gpu.setdefault(dev.uuid, {})[id(dev)] = sum(shares.get(pid, 0.0) for pid in pids)
    for key, ratio in _scaled_to_card(per_gpu).items():
        dev = devices[key]
        dev.nvml_ratio = ratio
        if dev.busy_source is None:
            dev.busy_ratio, dev.busy_source = ratio, "nvml"


def busy_by_tenant(root: Path, busy: Mapping[str, Mapping[int, float]]) -> dict[tuple[str, int, str], float]:
    """{(tenant, incarnation, GPU uuid): share of the card} from NVML's busy processes: only
    the processes NVML names are looked up in the tenants' ledgers (by host pid and start time,
    so a reused pid is never counted), not every tenant's report (the loop runs every second)."""
    wanted = {pid for per_pid in busy.values() for pid in per_pid}
    starts = {pid: liveness.start_time(pid) for pid in wanted}
    per_gpu: dict[str, dict[tuple[str, int, str], float]] = {}
    for path in iter_tenants(root):
        try:
            usage = read_usage(path)
            pids = set()
            for proc in usage.procs:
                here = slot_host_pid(proc)
                if here in wanted and starts.get(here) == int(proc.start_time):
                    pids.add(here)
            if not pids:
                continue
            limits = read_limits(path)
        except ConfigError:
            continue  # being created or removed, or broken: the reaper and the API report it
        for dev in limits.devices[: limits.device_count]:
            uuid = abi.bytes_to_uuid(bytes(dev.uuid))
            ratio = sum(busy.get(uuid, {}).get(pid, 0.0) for pid in pids)
            if ratio:
                per_gpu.setdefault(uuid, {})[(path.name, int(limits.incarnation), uuid)] = ratio
    return _scaled_to_card(per_gpu)


def node_report(
    root: Path | None = None,
    only: str | None = None,
    *,
    busy_window_s: float | None = BUSY_WINDOW_S,
    charges: Mapping[ChargeKey, float] | None = None,
) -> list[TenantReport]:
    """Every tenant of the node, or only tenant `only` (reading nothing of the others), with
    NVML's GPU time measured over `busy_window_s` (None: not measured). `charges`: the charge
    rates a caller measured (``charge_rates``), the GPU time of the arbitrated tenants."""
    root = root or runtime_dir()
    paths = iter_tenants(root) if only is None else [p for p in [tenants_dir(root) / only] if p.is_dir()]
    statuses = [tenant_status(p) for p in paths]
    arbiters = read_arbiters(root, {d.uuid for s in statuses for d in s.devices})
    counters_at = time.monotonic()
    now = time.time()
    reports = []
    for status in statuses:
        created = status.meta.get("created")
        age = max(now - float(created), 1e-9) if isinstance(created, int | float) else 0.0
        report = TenantReport(
            id=status.id,
            path=status.path,
            error=status.error,
            command=status.meta.get("command"),
            age_s=age,
            stale=is_stale(status),
            processes=status.processes,
            counters_at=counters_at,
        )
        if status.error is None:
            limits = read_limits(status.path)
            report.incarnation = int(limits.incarnation)
            for i, dev in enumerate(status.devices):
                lim = limits.devices[i]
                arbiter = arbiters.get(dev.uuid)
                entry = arbiter.tenant(status.id, report.incarnation) if arbiter else None
                controlled = lim.policy != abi.POLICY_NATIVE
                charged = (charges or {}).get((status.id, report.incarnation, dev.uuid))
                if controlled and charged is None and charges is not None and entry is None:
                    charged = 0.0  # measured, and it has not launched: none of the card
                report.devices.append(
                    DeviceReport(
                        uuid=dev.uuid,
                        policy=abi.POLICY_NAMES.get(lim.policy, str(lim.policy)),
                        priority=abi.PRIORITY_NAMES.get(lim.priority, str(lim.priority)),
                        share_permille=int(lim.share_permille),
                        ceiling_permille=int(lim.ceiling_permille),
                        weight=int(lim.weight),
                        mem_cap_bytes=dev.mem_cap_bytes,
                        mem_used_bytes=dev.mem_used_bytes,
                        overhead_bytes=dev.overhead_bytes,
                        mem_peak_bytes=dev.mem_peak_bytes,
                        oom_events=dev.oom_events,
                        held_ns=entry.gpu_time_ns if entry else 0,
                        wait_ns=entry.wait_ns if entry else 0,
                        throttled_ns=entry.throttled_ns if entry else 0,
                        preemptions=entry.preemptions if entry else 0,
                        held_ratio=(entry.gpu_time_ns / 1e9 / age if entry and age else 0.0)
                        if controlled
                        else None,
                        busy_ratio=charged if controlled else None,
                        busy_source="arbiter" if controlled and charged is not None else None,
                    )
                )
        reports.append(report)
    if busy_window_s is not None and (busy := measure_busy(busy_window_s)) is not None:
        _attribute_busy(reports, {uuid: gpu.by_pid for uuid, gpu in busy.items()})
    return reports
