"""What every tenant on this node is configured for and what it uses, in one structure.

Joins the tenant directories (limits: the configuration; usage: memory per process) with the
per-GPU arbiter regions (GPU time, waiting, throttling, preemptions per tenant), so the CLI's
table and JSON, and later the agent's API and metrics, read the same figures.

"Share used" is GPU time held divided by the tenant's age on this node: what it actually got,
next to what it was configured for. A tenant that was idle for part of its life shows less than
its share; that is the truth, not an error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu import abi
from sharegpu.arbiter import ArbiterStatus, arbiter_path, read_arbiter
from sharegpu.errors import ConfigError, SpecError
from sharegpu.tenant import (
    ProcessUsage,
    is_stale,
    iter_tenants,
    read_limits,
    runtime_dir,
    tenant_status,
    tenants_dir,
)


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
    gpu_time_ns: int = 0
    wait_ns: int = 0
    throttled_ns: int = 0
    preemptions: int = 0
    share_used: float | None = None  # GPU time / age; None for memory-only (native) tenants


@dataclass
class TenantReport:
    id: str
    path: Path
    error: str | None
    command: object
    age_s: float
    stale: bool
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


def node_report(root: Path | None = None, only: str | None = None) -> list[TenantReport]:
    """Every tenant of the node, or only tenant `only` (reading nothing of the others)."""
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
                        gpu_time_ns=entry.gpu_time_ns if entry else 0,
                        wait_ns=entry.wait_ns if entry else 0,
                        throttled_ns=entry.throttled_ns if entry else 0,
                        preemptions=entry.preemptions if entry else 0,
                        share_used=(entry.gpu_time_ns / 1e9 / age if entry and age else 0.0)
                        if controlled
                        else None,
                    )
                )
        reports.append(report)
    return reports
