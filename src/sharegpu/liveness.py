"""Liveness of the processes named in shared regions: the shim's rule (native/shim/live.c).

Tenants of one GPU run in different pid namespaces, so a pid in a region is only meaningful to
processes of the namespace that wrote it. An entry written by ABI 1.3 shims carries a liveness
lock: its owner holds an OFD write lock on byte ``LIVE_LOCK_BASE + index`` of the region's file
while it lives, and the kernel drops it at exit, whatever namespace the reader is in. Entries
without one are judged by pid and start time, and only from the writer's own namespace.
"""

from __future__ import annotations

import fcntl
import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from sharegpu import abi

# struct flock on Linux (x86-64, arm64): short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid, with the padding the C layout has.
_FLOCK = "hh4xqqi4x"
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)


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


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) if fields[0] not in ("Z", "X") else None


def lock_held(region: Path, index: int) -> bool | None:
    """Is the liveness lock of entry `index` of `region` held?  None: cannot tell."""
    try:
        fd = os.open(region, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, abi.LIVE_LOCK_BASE + index, 1, 0)
        answer = fcntl.fcntl(fd, _F_OFD_GETLK, probe)
        kind: int = struct.unpack(_FLOCK, answer)[0]
        return kind != fcntl.F_UNLCK
    except OSError:
        return None
    finally:
        os.close(fd)


def entry_alive(region: Path, index: int, *, flags: int, pidns: int, pid: int, start: int) -> bool:
    """The shim's sg_entry_alive: the liveness lock if the entry has one, else pid + start
    time, judged only from the writer's pid namespace (elsewhere: alive, never guessed dead)."""
    if pid <= 0:
        return False
    if flags & abi.ENTRY_LIVE_LOCK:
        held = lock_held(region, index)
        if held is not None:
            return held
    me = identity()
    if (pidns and pidns != me.pidns) or not me.proc_is_ours:
        return True
    return start_time(pid) == start
