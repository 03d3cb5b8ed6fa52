"""The audit: GPU processes that escape the shim, seen from the driver's side (NVML).

The shim stops buggy and greedy workloads; a process that unloads it, or talks to the driver
directly, is invisible to it (the threat model in docs/architecture.md). Every second the audit lists each
GPU's compute processes through NVML and attributes each to a tenant: a process belongs to a
tenant when it is in the tenant's usage slots (a container's process by its host pid), descends
from the tenant's live supervisor (meta.json "supervisor": pid + start time), or runs in the
container (its cgroup, sharegpu.cgroup) of one of the tenant's processes, so a process that
dropped the shim is still its tenant's. Two findings:

* ``audit.untracked``: a process using a GPU that belongs to no tenant (one in a container that
  holds no vGPU names the container);
* ``audit.bypass``: a tenant whose NVML-measured memory on a GPU (the sum over its processes)
  exceeds its cap plus its reconciled overhead by more than the tolerance.

The node's MPS server (a child of the trusted control daemon, ``sharegpu.mps``) is a GPU
process of no tenant by design: it is never reported nor killed. Its clients are listed apart
by the driver and read with the compute processes (``sharegpu.devices.processes_by_gpu``).

Findings are reported when they appear and once more when they clear (``data.cleared``), never
every second. With ``enforce="kill"`` the processes behind a bypass are killed with SIGKILL
(``audit.killed``): the tenant's processes on that GPU that are outside its ledger (they dropped
the shim), or, when all are in the ledger (the ledger itself was tampered with), every process
of the tenant on that GPU. Untracked processes are only reported unless ``kill_untracked``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sharegpu import mps
from sharegpu.agent.events import Event
from sharegpu.agent.procs import ProcessTable, kill, live_slots, mib, tenant_pids
from sharegpu.agent.snapshot import NodeSnapshot, NvmlSource
from sharegpu.cgroup import Container, container_of
from sharegpu.devices import GpuProcess, processes_by_gpu
from sharegpu.errors import DeviceError
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import (
    UsageSnapshot,
    read_meta,
    shrunk_from,
    tenant_status,
)

log = logging.getLogger(__name__)

Enforce = Literal["report", "kill"]
DEFAULT_TOLERANCE = 256 * MIB


@dataclass
class _Tenant:
    """A tenant whose limits and usage region read cleanly (in the sweep's snapshot)."""

    id: str
    path: Path
    limits: abi.Limits
    usage: UsageSnapshot


@dataclass
class _Finding:
    event: Event
    pids: list[int]


class Auditor:
    """Reports GPU processes outside every tenant and tenants over their cap; may kill."""

    name = "audit"

    def __init__(
        self,
        root: Path,
        enforce: str = "report",
        tolerance_bytes: int = DEFAULT_TOLERANCE,
        *,
        interval_s: float = 2.0,
        nvml: NvmlSource | None = None,
        kill_untracked: bool = False,
        mps_pipe_dir: Path | None = None,
    ) -> None:
        if enforce not in ("report", "kill"):
            raise ValueError(f"enforce must be 'report' or 'kill', not {enforce!r}")
        self.root = root
        self.enforce: Enforce = "kill" if enforce == "kill" else "report"
        self.tolerance_bytes = tolerance_bytes
        self.interval_s = interval_s
        self.nvml = nvml or processes_by_gpu
        self.kill_untracked = kill_untracked
        self.mps_pipe_dir = mps_pipe_dir or mps.pipe_dir()
        self._active: dict[tuple[str, ...], _Finding] = {}
        self._killed: set[tuple[int, int]] = set()  # (pid, start time) already signalled
        self._nvml_failed = False

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One pass over `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        try:
            gpus = snap.nvml(self.nvml)
        except DeviceError as err:
            if not self._nvml_failed:
                log.warning("audit: %s", err)
            self._nvml_failed = True
            return []
        self._nvml_failed = False
        table = snap.table
        tenants = [
            _Tenant(t.id, t.path, t.limits, t.usage)
            for t in snap.tenants
            if t.limits is not None and t.usage is not None  # else the reaper and the API report it
        ]
        ledgers = {t.id: {s.pid for s in live_slots(t.usage, table)} for t in tenants}
        in_some_ledger = set().union(*ledgers.values())
        if all(p.pid in in_some_ledger for procs in gpus.values() for p in procs):
            members = ledgers  # the usual case: nothing to attribute, no pass over /proc
        else:
            members = {t.id: tenant_pids(tenant_status(t.path), table, ledgers[t.id]) for t in tenants}
        owners: dict[int, str] = {}
        for t in tenants:
            for pid in members[t.id]:
                owners.setdefault(pid, t.id)
        if members is not ledgers:
            _attribute_by_container(gpus, tenants, members, owners)
        found: dict[tuple[str, ...], _Finding] = {}
        self._untracked(gpus, owners, table, found)
        for t in tenants:
            self._bypass(t, members[t.id], ledgers[t.id], gpus, found)
        events = []
        for key, finding in found.items():
            if key not in self._active:
                events.append(finding.event)
        for key, old in self._active.items():
            if key not in found:
                events.append(_cleared(old.event))
        self._active = found
        events += self._enforce(found, table)
        return events

    def _untracked(
        self,
        gpus: dict[str, list[GpuProcess]],
        owners: dict[int, str],
        table: ProcessTable,
        found: dict[tuple[str, ...], _Finding],
    ) -> None:
        me = os.getpid()
        daemon: mps.Daemon | None = None
        for uuid, procs in gpus.items():
            for p in procs:
                if p.pid in owners or p.pid == me:
                    continue
                daemon = daemon or mps.find(self.mps_pipe_dir)
                if mps.is_server(p.pid, daemon):
                    continue
                info = table.get(p.pid)
                start = info.start_time if info else 0
                container = container_of(p.pid)
                where = f" in {container.runtime or 'a'} container {container.short_id}" if container else ""
                found[("untracked", uuid, str(p.pid), str(start))] = _Finding(
                    Event(
                        kind="audit.untracked",
                        severity="warning",
                        gpu=uuid,
                        pid=p.pid,
                        message=f"process {p.pid}{where} uses {mib(p.used_bytes)} on {uuid} "
                        + ("and holds no vGPU" if container else "and belongs to no tenant"),
                        data={"used_bytes": p.used_bytes, "start_time": start, **_container_data(container)},
                    ),
                    [p.pid] if self.kill_untracked else [],
                )

    def _bypass(
        self,
        tenant: _Tenant,
        pids: set[int],
        in_ledger: set[int],
        gpus: dict[str, list[GpuProcess]],
        found: dict[tuple[str, ...], _Finding],
    ) -> None:
        limits, usage = tenant.limits, tenant.usage
        for i, dev in enumerate(limits.devices[: limits.device_count]):
            uuid = abi.bytes_to_uuid(bytes(dev.uuid))
            mine = [p for p in gpus.get(uuid, []) if p.pid in pids]
            measured = sum(p.used_bytes for p in mine)
            cap = int(dev.mem_cap_bytes)
            overhead = int(usage.devices[i].overhead_bytes)
            if measured <= cap + overhead + self.tolerance_bytes:
                continue
            # A cap shrunk below what the tenant holds is not a bypass: what it held before the
            # resize (as its ledger says, never more than the cap it had) is allowed until freed.
            used = int(usage.devices[i].mem_used_bytes)
            allowed = max(cap, min(used, shrunk_from(read_meta(tenant.path)).get(uuid, cap))) + overhead
            if measured <= allowed + self.tolerance_bytes:
                continue
            outside = [p.pid for p in mine if p.pid not in in_ledger]
            offenders = outside or [p.pid for p in mine]
            found[("bypass", tenant.id, uuid)] = _Finding(
                Event(
                    kind="audit.bypass",
                    severity="error",
                    tenant=tenant.id,
                    gpu=uuid,
                    message=f"tenant {tenant.id} uses {mib(measured)} on {uuid} (NVML), over its "
                    f"{mib(cap)} cap + {mib(overhead)} overhead; "
                    + (
                        f"processes {outside} are outside its ledger (shim bypassed)"
                        if outside
                        else "its ledger disagrees with the driver (tampered usage region?)"
                    ),
                    data={
                        "measured_bytes": measured,
                        "cap_bytes": cap,
                        "overhead_bytes": overhead,
                        "tolerance_bytes": self.tolerance_bytes,
                        "processes": {str(p.pid): p.used_bytes for p in mine},
                        "outside_ledger": outside,
                    },
                ),
                offenders,
            )

    def _enforce(self, found: dict[tuple[str, ...], _Finding], table: ProcessTable) -> list[Event]:
        if self.enforce != "kill":
            return []
        self._killed = {k for k in self._killed if (i := table.get(k[0])) and i.start_time == k[1]}
        events = []
        for finding in found.values():
            for pid in finding.pids:
                info = table.get(pid)
                if info is None or (pid, info.start_time) in self._killed:
                    continue
                if not kill(pid, info.start_time):
                    continue
                self._killed.add((pid, info.start_time))
                ev = finding.event
                events.append(
                    Event(
                        kind="audit.killed",
                        severity="warning",
                        tenant=ev.tenant,
                        gpu=ev.gpu,
                        pid=pid,
                        message=f"killed process {pid} (SIGKILL): {ev.kind.removeprefix('audit.')} "
                        f"on {ev.gpu}" + (f" by tenant {ev.tenant}" if ev.tenant else ""),
                        data={"finding": ev.kind, "start_time": info.start_time},
                    )
                )
        return events


def _container_data(container: Container | None) -> dict[str, object]:
    if container is None:
        return {}
    return {"container": container.id, "runtime": container.runtime, "pod_uid": container.pod_uid}


def _attribute_by_container(
    gpus: dict[str, list[GpuProcess]],
    tenants: list[_Tenant],
    members: dict[str, set[int]],
    owners: dict[int, str],
) -> None:
    """A GPU process in the container of a tenant's process is the tenant's (it dropped the shim,
    or never loaded it): the container's cgroup is the boundary, not the process tree."""
    by_container: dict[str, str] = {}
    for t in tenants:
        for pid in members[t.id]:
            container = container_of(pid) if pid > 0 else None
            if container is not None:
                by_container.setdefault(container.id, t.id)
    if not by_container:
        return
    for procs in gpus.values():
        for p in procs:
            if p.pid in owners:
                continue
            container = container_of(p.pid)
            if container is not None and container.id in by_container:
                tenant = by_container[container.id]
                owners[p.pid] = tenant
                members[tenant].add(p.pid)


def _cleared(event: Event) -> Event:
    what = "bypass" if event.kind == "audit.bypass" else "untracked process"
    return event.model_copy(
        update={
            "severity": "info",
            "time": time.time(),
            "message": f"cleared: {what} "
            + (f"of tenant {event.tenant} " if event.tenant else "")
            + (f"(process {event.pid}) " if event.pid else "")
            + f"on {event.gpu}",
            "data": {**event.data, "cleared": True},
        }
    )
