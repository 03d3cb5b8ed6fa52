"""One reading of the node: the agent's health (when one answers), the GPUs, the tenants and the
agent's recent warnings, through the agent or directly, in the agent API's own views."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.models import GpuView, Health, TenantView
from sharegpu.errors import SharegpuError

RECENT_EVENTS = 500  # events read to find the recent warnings and errors
RECENT_WARNINGS = 10


@dataclass
class Snapshot:
    runtime_dir: Path
    wall_time: float  # time.time() when it was taken
    monotonic: float  # time.monotonic() when it was taken (for rates between two snapshots)
    agent: Health | None
    socket: Path
    gpus: list[GpuView] = field(default_factory=list)
    tenants: list[TenantView] = field(default_factory=list)
    warnings: list[Event] = field(default_factory=list)  # with the agent only: warnings, errors
    gpu_error: str | None = None  # why the GPUs could not be listed (lenient mode only)


def _direct_gpus(root: Path, tenants: list[TenantView]) -> list[GpuView]:
    from sharegpu.agent.models import gpu_views
    from sharegpu.devices import list_gpus
    from sharegpu.report import read_arbiters

    found = list_gpus()
    return gpu_views(found, tenants, read_arbiters(root, [g.uuid for g in found]))


def take(
    root: Path | None = None,
    *,
    gpus: bool = True,
    tenants: bool = True,
    events: bool = False,
    strict: bool = True,
) -> Snapshot:
    """Read the node. With `strict` False, a GPU listing that fails (no NVML) is recorded in
    `gpu_error` instead of raised, so a summary can still be shown."""
    from sharegpu.agent.client import socket_path
    from sharegpu.doors import agent_client, tenant_service, tenant_views
    from sharegpu.tenant import runtime_dir

    root = root or runtime_dir()
    snap = Snapshot(root, time.time(), time.monotonic(), None, socket_path(root))
    with tenant_service(root) as service:
        client = agent_client(service)
        if client is not None:
            snap.agent = client.health()
        if tenants or gpus:
            snap.tenants = tenant_views(service)
        if gpus:
            try:
                snap.gpus = client.list_gpus() if client is not None else _direct_gpus(root, snap.tenants)
            except SharegpuError as err:
                if strict:
                    raise
                snap.gpu_error = str(err)
        if events and client is not None:
            items, _ = client.events(limit=RECENT_EVENTS)
            snap.warnings = [e for e in items if e.severity != "info"][-RECENT_WARNINGS:]
    snap.monotonic = time.monotonic()
    return snap
