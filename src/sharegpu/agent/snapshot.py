"""One read of the node per sweep: every tenant's regions, every GPU's arbiter, the processes.

The reaper, the reconciler, the audit, the GPU-time loop, the QoS loop and the online-wait sampler
each used to read every region themselves, every second: each tenant's usage region three or four
times, each arbiter region four times, /proc and NVML's process list twice. The sweep
(``sharegpu.agent.sweep``) reads them once into a `NodeSnapshot` and hands the same snapshot to
each of those loops in turn (docs/agent.md, Costs).

What a snapshot holds was true when it was read: a loop that changes a region (the reaper frees a
dead process's slot) does not change the snapshot, and the loops after it judge from what was read,
as each did from its own read before. A region that does not read cleanly is kept with its error,
so each loop reports it as it did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.agent.procs import ProcessTable, process_table
from sharegpu.arbiter import ArbiterStatus, iter_arbiters, read_arbiter
from sharegpu.devices import GpuProcess
from sharegpu.errors import ConfigError, DeviceError, SpecError
from sharegpu.regions import abi
from sharegpu.report import ChargeKey, charges_of
from sharegpu.tenant import UsageSnapshot, iter_tenants, read_limits, read_usage

NvmlSource = Callable[[], dict[str, list[GpuProcess]]]


@dataclass(frozen=True)
class TenantRead:
    """One tenant's regions as read: `usage` and `limits`, or the error that stopped the read
    (a tenant being created or removed, or a damaged file)."""

    path: Path
    usage: UsageSnapshot | None
    limits: abi.Limits | None
    error: ConfigError | None

    @property
    def id(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class ArbiterRead:
    """One GPU's arbiter region as read, or the error that stopped the read."""

    path: Path
    status: ArbiterStatus | None
    error: ConfigError | SpecError | None

    @property
    def uuid(self) -> str:
        return self.path.parent.name


def _read_tenant(path: Path) -> TenantRead:
    try:
        usage = read_usage(path)
    except ConfigError as err:
        return TenantRead(path, None, None, err)
    try:
        return TenantRead(path, usage, read_limits(path), None)
    except ConfigError as err:
        return TenantRead(path, usage, None, err)


def _read_arbiter(path: Path) -> ArbiterRead:
    try:
        return ArbiterRead(path, read_arbiter(path), None)
    except (ConfigError, SpecError) as err:
        return ArbiterRead(path, None, err)


@dataclass
class NodeSnapshot:
    """The node's shared state at one instant, read once for the loops of a sweep."""

    root: Path
    taken_ns: int  # CLOCK_MONOTONIC when the arbiter regions were read (their charges' "now")
    tenants: list[TenantRead]
    arbiters: list[ArbiterRead]
    table: ProcessTable  # /proc, read lazily and remembered for the sweep
    _nvml: dict[NvmlSource, dict[str, list[GpuProcess]] | DeviceError] = field(default_factory=dict)

    @classmethod
    def take(cls, root: Path) -> NodeSnapshot:
        tenants = [_read_tenant(path) for path in iter_tenants(root)]
        arbiters = [_read_arbiter(path) for path in iter_arbiters(root)]
        return cls(root, time.monotonic_ns(), tenants, arbiters, process_table())

    def statuses(self) -> list[ArbiterStatus]:
        """The arbiter regions that read cleanly."""
        return [a.status for a in self.arbiters if a.status is not None]

    def charges(self) -> dict[ChargeKey, int]:
        """What each GPU's arbiter had charged each tenant when it was read (report.charges_of)."""
        return charges_of(self.statuses(), self.taken_ns)

    def nvml(self, source: NvmlSource) -> dict[str, list[GpuProcess]]:
        """NVML's processes per GPU from `source`, asked once per snapshot (the reconciler and
        the audit share it); a DeviceError is raised again to each loop that asks."""
        if source not in self._nvml:
            try:
                self._nvml[source] = source()
            except DeviceError as err:
                self._nvml[source] = err
        found = self._nvml[source]
        if isinstance(found, DeviceError):
            raise found
        return found
