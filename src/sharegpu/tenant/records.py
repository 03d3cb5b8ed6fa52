"""What a tenant is made of, as Python values: its vGPUs' limits and what it uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.cgroup import Container
from sharegpu.regions import abi


@dataclass(frozen=True)
class DeviceLimit:
    """One vGPU of a tenant: the physical GPU and the limits on it."""

    uuid: str
    mem_cap_bytes: int
    policy: int = abi.POLICY_NATIVE
    priority: int = abi.PRIORITY_NORMAL
    share_permille: int = 1000
    ceiling_permille: int = 1000
    weight: int = 1


@dataclass
class ProcessUsage:
    pid: int  # as the process's own namespace knows it (a container's, inside one)
    host_pid: int  # in this process's namespace (liveness.host_pids); 0 when out of sight
    alive: bool
    mem_bytes: dict[str, int]
    oom_events: int
    container: Container | None = None  # the container it runs in (its cgroup), if any


@dataclass
class DeviceUsage:
    uuid: str
    mem_cap_bytes: int
    mem_used_bytes: int
    overhead_bytes: int
    mem_peak_bytes: int
    oom_events: int


@dataclass
class TenantStatus:
    id: str
    path: Path
    devices: list[DeviceUsage]
    processes: list[ProcessUsage]
    meta: dict[str, object] = field(default_factory=dict)
    error: str | None = None
