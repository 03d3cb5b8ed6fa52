"""The processes a tenant names: its ledger's slots and its supervisor, alive or not (the shim's
rule, sharegpu.regions.liveness)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sharegpu.regions import abi, liveness


def process_uid(pid: int) -> int | None:
    """The real uid of process `pid` (/proc/<pid>/status), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if the pid is gone."""
    return liveness.start_time(pid)


def slot_host_pid(proc: abi.UsageProc) -> int | None:
    """The pid in this namespace of a slot's process (a container's process has another one in
    its own namespace), None when it cannot be seen from here."""
    if proc.host_pid:
        return int(proc.host_pid)
    return liveness.host_pids.resolve(int(proc.pidns), int(proc.pid), int(proc.start_time))


def slot_alive(tenant: Path, index: int, proc: abi.UsageProc) -> bool:
    """The shim's rule (liveness.py): the slot's liveness lock, else pid plus start time (never
    pid alone: pids are reused), judged only from the writer's pid namespace."""
    if proc.host_pid:  # learned by the agent: a pid of the host's namespace
        return process_start_time(int(proc.host_pid)) == int(proc.start_time)
    return liveness.entry_alive(
        tenant / abi.USAGE_FILE,
        index,
        flags=int(proc.flags),
        pidns=int(proc.pidns),
        pid=int(proc.pid),
        start=int(proc.start_time),
    )


def supervisor_identity(pid: int | None = None) -> dict[str, int]:
    """This process (or `pid`) as a tenant's supervisor: pid plus start time, so a reused pid
    is not it."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start_time": process_start_time(pid) or 0}


def supervisor_gone(meta: Mapping[str, Any]) -> bool:
    """The tenant names a supervisor (`sharegpu run`) and that process is gone."""
    sup = meta.get("supervisor")
    if not isinstance(sup, dict):
        return False
    return process_start_time(int(sup.get("pid", 0))) != int(sup.get("start_time", -1))
