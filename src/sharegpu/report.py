"""What every tenant on this node is configured for and what it uses, in one structure.

Joins the tenant directories (limits: the configuration; usage: memory per process) with the
per-GPU arbiter regions (GPU time, waiting, throttling, preemptions per tenant), so the CLI's
table and JSON, and later the agent's API and metrics, read the same figures.

Two figures of compute, not to be confused:

- GPU time (``busy_ratio``): the share of the card the GPU spent running the tenant's work over
  the last ``busy_window_s`` seconds, from NVML's per-process utilization (summed over the
  tenant's processes; the tenants of one card scaled down together if NVML's samples add up to
  more than the whole card). This is what the tenant got.
- Charged time (``held_ns``, ``held_ratio``): what the arbiter charged the tenant for its holds of
  the GPU's token, and that divided by the tenant's age. Since ABI 1.6 that is the GPU time its
  work used while it held the token (the holds' wall time less their idle time after syncs that
  drained them: docs/design/arbitration.md, "Exact charges"); a shim of ABI 1.5 or older charges
  the wall time held, which for a tenant with short kernels or host work between them is much
  longer than the GPU ran for it. Lifetime, from the arbiter's books; GPU time above is NVML's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sharegpu import abi, liveness
from sharegpu.arbiter import ArbiterStatus, arbiter_path, read_arbiter
from sharegpu.devices import BUSY_WINDOW_S, busy_by_pid
from sharegpu.errors import ConfigError, DeviceError, SpecError
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
    busy_ratio: float | None = None  # GPU time share over the window (NVML); None: not measured


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


def measure_busy(window_s: float) -> dict[str, dict[int, float]] | None:
    """NVML's per-process GPU time over the window, or None when NVML does not answer."""
    try:
        return busy_by_pid(window_s)
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
    """Each tenant's GPU time on each GPU: its live processes' shares (NVML names processes by
    host pid), the tenants of one card scaled down together to at most the whole card."""
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
        devices[key].busy_ratio = ratio


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
    root: Path | None = None, only: str | None = None, *, busy_window_s: float | None = BUSY_WINDOW_S
) -> list[TenantReport]:
    """Every tenant of the node, or only tenant `only` (reading nothing of the others), with GPU
    time measured over `busy_window_s` (None: not measured)."""
    root = root or runtime_dir()
    paths = iter_tenants(root) if only is None else [p for p in [tenants_dir(root) / only] if p.is_dir()]
    statuses = [tenant_status(p) for p in paths]
    arbiters = read_arbiters(root, {d.uuid for s in statuses for d in s.devices})
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
        )
        if status.error is None:
            limits = read_limits(status.path)
            report.incarnation = int(limits.incarnation)
            for i, dev in enumerate(status.devices):
                lim = limits.devices[i]
                entry = arbiters[dev.uuid].tenant(status.id) if dev.uuid in arbiters else None
                controlled = lim.policy != abi.POLICY_NATIVE
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
                    )
                )
        reports.append(report)
    if busy_window_s is not None and (busy := measure_busy(busy_window_s)) is not None:
        _attribute_busy(reports, busy)
    return reports
