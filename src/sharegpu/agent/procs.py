"""Processes as the agent sees them: liveness, parentage and attribution to tenants.

Liveness is the shim's rule (``sg_proc_alive`` in native/shim/ledger.c): a process is alive
while its pid exists, is not a zombie, and has the recorded start time (field 22 of
/proc/<pid>/stat), so a reused pid is never mistaken for the original. The agent must share the
pid namespace of the processes it judges, or an ancestor of it: on the host, a container's process
is known by its host pid (``liveness.host_pids``), which its NVML entries and its cgroup name.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from sharegpu.errors import ConfigError
from sharegpu.regions import abi
from sharegpu.tenant import TenantStatus, UsageSnapshot, read_usage, slot_alive, slot_host_pid


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str
    start_time: int


def proc_info(pid: int) -> ProcInfo | None:
    """/proc/<pid>/stat, or None when there is no such process."""
    try:  # os.open/os.read, not Path.read_text: three loops read every tenant's pids each second
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    try:
        # The command (field 2) may hold spaces and ')': the fields resume after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        return ProcInfo(
            pid=pid,
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            state=fields[0],
            start_time=int(fields[19]),
        )
    except (ValueError, IndexError):
        return None


def alive(pid: int, start_time: int | None = None) -> bool:
    """The shim's liveness: the pid exists, is not a zombie, and (if given) started then."""
    if pid <= 0:
        return False
    info = proc_info(pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return start_time is None or info.start_time == start_time


class ProcessTable:
    """The processes of this pid namespace as one tick of a loop sees them.

    A pid is read from /proc when first asked for and remembered for the tick; a full pass
    over /proc (one file per process: milliseconds on a busy node) happens only when a question
    needs every process (a process group, the children of a supervisor)."""

    def __init__(self) -> None:
        self._known: dict[int, ProcInfo | None] = {}
        self._scanned = False
        self._children: dict[int, list[int]] | None = None

    def get(self, pid: int) -> ProcInfo | None:
        if pid not in self._known and not self._scanned:
            self._known[pid] = proc_info(pid)
        return self._known.get(pid)

    def values(self) -> list[ProcInfo]:
        """Every process (a full pass over /proc, once per table)."""
        if not self._scanned:
            with contextlib.suppress(OSError):
                for entry in os.scandir("/proc"):
                    if entry.name.isdigit() and int(entry.name) not in self._known:
                        self._known[int(entry.name)] = proc_info(int(entry.name))
            self._known = {pid: info for pid, info in self._known.items() if info is not None}
            self._scanned = True
        return [info for info in self._known.values() if info is not None]

    def children(self) -> dict[int, list[int]]:
        """Parent pid -> child pids (from a full pass)."""
        if self._children is None:
            self._children = {}
            for info in self.values():
                self._children.setdefault(info.ppid, []).append(info.pid)
        return self._children


def process_table() -> ProcessTable:
    """A fresh view of the processes, read lazily (see ProcessTable)."""
    return ProcessTable()


def alive_in(table: ProcessTable, pid: int, start_time: int) -> bool:
    """The shim's liveness rule, answered from a process table."""
    info = table.get(pid)
    return info is not None and info.state not in ("Z", "X") and info.start_time == start_time


def descendants(root_pid: int, table: ProcessTable) -> set[int]:
    """root_pid and every live process below it."""
    children = table.children()
    found: set[int] = set()
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return {p for p in found if (i := table.get(p)) is not None and i.state not in ("Z", "X")}


def supervisor_of(meta: dict[str, object]) -> tuple[int, int] | None:
    """(pid, start time) of the tenant's supervisor from meta.json, if it names one."""
    sup = meta.get("supervisor")
    if not isinstance(sup, dict):
        return None
    try:
        return int(sup.get("pid", 0)), int(sup.get("start_time", -1))
    except (TypeError, ValueError):
        return None


def owner_gone(meta: dict[str, object], table: ProcessTable) -> str | None:
    """Why the tenant's owner is gone, or None while it lives or when the tenant names none.

    Owners: "supervisor" {pid, start_time} (`sharegpu run`), "pgid" (a process group: gone
    when no process is left in it). A tenant that names neither is managed by the agent's API
    and never reaped here."""
    reasons = []
    sup = supervisor_of(meta)
    if sup is not None:
        pid, start = sup
        info = table.get(pid)
        if info is not None and info.state not in ("Z", "X") and info.start_time == start:
            return None
        reasons.append(f"supervisor {pid} is gone")
    pgid = meta.get("pgid")
    if isinstance(pgid, int) and pgid > 0:
        if any(i.pgid == pgid and i.state not in ("Z", "X") for i in table.values()):
            return None
        reasons.append(f"process group {pgid} is empty")
    return "; ".join(reasons) or None


@dataclass(frozen=True)
class SlotProc:
    """A live process in a tenant's usage region."""

    pid: int  # in the agent's namespace (a container's process by its host pid); 0 when unknown
    start_time: int
    mem_bytes: tuple[int, ...]  # per limits index: what the ledger charges it (its spare included)


def live_slots(tenant: Path | UsageSnapshot, table: ProcessTable | None = None) -> list[SlotProc]:
    """Live processes of the tenant's ledger (its directory, or its usage already read), with the
    bytes each holds per limits index (judged from `table` when given, else from /proc)."""
    if isinstance(tenant, UsageSnapshot):
        usage = tenant
    else:
        try:
            usage = read_usage(tenant)
        except ConfigError:
            return []
    found = []
    for index, proc in zip(usage.slots, usage.procs, strict=True):
        start = int(proc.start_time)
        here = slot_host_pid(proc)
        if here is not None:
            live = alive_in(table, here, start) if table is not None else alive(here, start)
        else:  # a process this namespace cannot name (yet): its liveness lock says
            live = usage.path is not None and slot_alive(usage.path, index, proc)
        if live:
            found.append(
                SlotProc(
                    pid=here or 0,
                    start_time=start,
                    mem_bytes=tuple(int(proc.dev[i].mem_bytes) for i in range(abi.MAX_DEVICES)),
                )
            )
    return found


def tenant_pids(status: TenantStatus, table: ProcessTable, in_ledger: set[int] | None = None) -> set[int]:
    """The processes that belong to a tenant: those in its usage slots (`in_ledger` if already
    known), and every descendant of its live supervisor (so a process that unloaded the shim is
    still the tenant's)."""
    pids = set(in_ledger) if in_ledger is not None else {s.pid for s in live_slots(status.path, table)}
    sup = supervisor_of(status.meta)
    if sup is not None:
        pid, start = sup
        info = table.get(pid)
        if info is not None and info.start_time == start:
            pids |= descendants(pid, table)
    return pids


def kill(pid: int, start_time: int | None) -> bool:
    """SIGKILL pid if it is still the process that started at start_time (through a pidfd, so a
    pid reused in between is never hit). True if the signal was sent."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if start_time is not None and not alive(pid, start_time):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
