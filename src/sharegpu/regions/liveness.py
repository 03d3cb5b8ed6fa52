"""Liveness of the processes named in shared regions: the shim's rule (native/shim/live.c).

Tenants of one GPU run in different pid namespaces, so a pid in a region is only meaningful to
processes of the namespace that wrote it. An entry written by ABI 1.3 shims carries a liveness
lock: its owner holds an OFD write lock on byte ``LIVE_LOCK_BASE + index`` of the region's file
while it lives, and the kernel drops it at exit, whatever namespace the reader is in. Entries
without one are judged by pid and start time, and only from the writer's own namespace.

That test and a process's start time are the shim's C (``entry_alive`` and ``start_time``, called
in libsgagent.so through ``agentlib``); what is here is what only Python readers need: this
process's identity and the host pid of a process another namespace knows by its own pid.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sharegpu.regions.agentlib import entry_alive, start_time

__all__ = ["HostPids", "Identity", "entry_alive", "host_pids", "host_view", "identity", "start_time"]


@dataclass(frozen=True)
class Identity:
    pidns: int  # inode of /proc/self/ns/pid, 0 unknown
    pid: int
    proc_is_ours: bool  # /proc is our namespace's: pids of our namespace can be judged


def identity() -> Identity:
    """This process's identity, read once per process (a forked child reads its own)."""
    return _identity(os.getpid())


@functools.cache
def _identity(pid: int) -> Identity:
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    try:
        ours = int(os.readlink("/proc/self")) == pid
    except (OSError, ValueError):
        ours = False
    return Identity(pidns=pidns, pid=pid, proc_is_ours=ours)


# The kernel's inode of the initial pid namespace (PROC_PID_INIT_INO, include/linux/proc_ns.h).
INIT_PIDNS = 0xEFFFFFFC
_RESCAN_S = 0.5  # a pid not found is looked for again at most this often


def host_view() -> bool:
    """This process sees every process: it is in the initial pid namespace, through its /proc."""
    me = identity()
    return me.pidns == INIT_PIDNS and me.proc_is_ours


def _innermost_pid(pid: int) -> int | None:
    """The pid the process has in its own namespace (the last NSpid field)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class HostPids:
    """The pid here of a process that another pid namespace (a container's) knows as `pid`.

    A ledger slot written in a container records its writer's namespace, pid there and start
    time; the agent, on the host, finds the process with that namespace, that innermost pid and
    that start time with one pass over /proc, and remembers it (checked again by its start time
    at every use, so a reused pid is never taken for it)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int, int], int] = {}
        self._scanned_at = -_RESCAN_S

    def resolve(self, pidns: int, pid: int, start: int) -> int | None:
        me = identity()
        if not pidns or pidns == me.pidns:
            return pid if me.proc_is_ours else None
        if not host_view():
            return None  # another namespace's process is out of sight from here
        key = (pidns, pid, start)
        found = self._known.get(key)
        if found is not None and start_time(found) == start:
            return found
        self._known.pop(key, None)
        now = time.monotonic()
        if now - self._scanned_at < _RESCAN_S:
            return None
        self._scanned_at = now
        self._scan(me.pidns)
        return self._known.get(key)

    def _scan(self, own: int) -> None:
        known: dict[tuple[int, int, int], int] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    ns = os.stat(f"/proc/{entry.name}/ns/pid").st_ino
                except OSError:
                    continue
                if ns == own:
                    continue
                h = int(entry.name)
                inner, start = _innermost_pid(h), start_time(h)
                if inner is not None and start is not None:
                    known[(ns, inner, start)] = h
        self._known = known


host_pids = HostPids()  # one per process: the agent's loops and readers share what it learned
