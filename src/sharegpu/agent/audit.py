"""The audit: GPU processes that escape the shim, seen from the driver's side (NVML).

The shim stops buggy and greedy workloads; a process that unloads it, or talks to the driver
directly, is invisible to it (threat model in DESIGN.md). Every second the audit lists each
GPU's compute processes through NVML and attributes each to a tenant: a process belongs to a
tenant when it is in the tenant's usage slots, or descends from the tenant's live supervisor
(meta.json "supervisor": pid + start time), so a process that dropped the shim is still its
tenant's. Two findings:

* ``audit.untracked``: a process using a GPU that belongs to no tenant;
* ``audit.bypass``: a tenant whose NVML-measured memory on a GPU (the sum over its processes)
  exceeds its cap plus its reconciled overhead by more than the tolerance.

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

from sharegpu import abi
from sharegpu.agent.events import Event
from sharegpu.agent.procs import ProcInfo, kill, live_slots, mib, process_table, tenant_pids
from sharegpu.agent.reconcile import NvmlSource
from sharegpu.devices import GpuProcess, processes_by_gpu
from sharegpu.errors import ConfigError, DeviceError
from sharegpu.spec import MIB
from sharegpu.tenant import TenantStatus, iter_tenants, read_limits, tenant_status

log = logging.getLogger(__name__)

Enforce = Literal["report", "kill"]
DEFAULT_TOLERANCE = 256 * MIB


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
        interval_s: float = 1.0,
        nvml: NvmlSource | None = None,
        kill_untracked: bool = False,
    ) -> None:
        if enforce not in ("report", "kill"):
            raise ValueError(f"enforce must be 'report' or 'kill', not {enforce!r}")
        self.root = root
        self.enforce: Enforce = "kill" if enforce == "kill" else "report"
        self.tolerance_bytes = tolerance_bytes
        self.interval_s = interval_s
        self.nvml = nvml or processes_by_gpu
        self.kill_untracked = kill_untracked
        self._active: dict[tuple[str, ...], _Finding] = {}
        self._killed: set[tuple[int, int]] = set()  # (pid, start time) already signalled
        self._nvml_failed = False

    def tick(self) -> list[Event]:
        try:
            gpus = self.nvml()
        except DeviceError as err:
            if not self._nvml_failed:
                log.warning("audit: %s", err)
            self._nvml_failed = True
            return []
        self._nvml_failed = False
        table = process_table()
        statuses = [s for s in map(tenant_status, iter_tenants(self.root)) if s.error is None]
        owners: dict[int, str] = {}
        members: dict[str, set[int]] = {}
        for status in statuses:
            pids = tenant_pids(status, table)
            members[status.id] = pids
            for pid in pids:
                owners.setdefault(pid, status.id)
        found: dict[tuple[str, ...], _Finding] = {}
        self._untracked(gpus, owners, table, found)
        for status in statuses:
            self._bypass(status, members[status.id], gpus, table, found)
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
        table: dict[int, ProcInfo],
        found: dict[tuple[str, ...], _Finding],
    ) -> None:
        me = os.getpid()
        for uuid, procs in gpus.items():
            for p in procs:
                if p.pid in owners or p.pid == me:
                    continue
                info = table.get(p.pid)
                start = info.start_time if info else 0
                found[("untracked", uuid, str(p.pid), str(start))] = _Finding(
                    Event(
                        kind="audit.untracked",
                        severity="warning",
                        gpu=uuid,
                        pid=p.pid,
                        message=f"process {p.pid} uses {mib(p.used_bytes)} on {uuid} "
                        "and belongs to no tenant",
                        data={"used_bytes": p.used_bytes, "start_time": start},
                    ),
                    [p.pid] if self.kill_untracked else [],
                )

    def _bypass(
        self,
        status: TenantStatus,
        pids: set[int],
        gpus: dict[str, list[GpuProcess]],
        table: dict[int, ProcInfo],
        found: dict[tuple[str, ...], _Finding],
    ) -> None:
        try:
            limits = read_limits(status.path)
        except ConfigError:
            return
        in_ledger = {s.pid for s in live_slots(status.path)}
        for i, dev in enumerate(limits.devices[: limits.device_count]):
            uuid = abi.bytes_to_uuid(bytes(dev.uuid))
            mine = [p for p in gpus.get(uuid, []) if p.pid in pids]
            measured = sum(p.used_bytes for p in mine)
            cap = int(dev.mem_cap_bytes)
            overhead = status.devices[i].overhead_bytes if i < len(status.devices) else 0
            allowed = cap + overhead
            if measured <= allowed + self.tolerance_bytes:
                continue
            outside = [p.pid for p in mine if p.pid not in in_ledger]
            offenders = outside or [p.pid for p in mine]
            found[("bypass", status.id, uuid)] = _Finding(
                Event(
                    kind="audit.bypass",
                    severity="error",
                    tenant=status.id,
                    gpu=uuid,
                    message=f"tenant {status.id} uses {mib(measured)} on {uuid} (NVML), over its "
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

    def _enforce(self, found: dict[tuple[str, ...], _Finding], table: dict[int, ProcInfo]) -> list[Event]:
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
