"""The node's MPS control daemon, if one runs: where its pipe directory is and whether the
daemon behind it lives. Under one, every client shares one GPU context and the shim makes an
offline tenant's processes BELOW_NORMAL clients (docs/design/arbitration.md, "Hardware
priority under MPS"); `sharegpu doctor` reports it, the CDI spec gives containers its pipe
directory and its /dev/shm (`shm_of`), and the agent's audit spares its server (`is_server`)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")
PID_FILE = "nvidia-cuda-mps-control.pid"  # what the control daemon writes in its pipe directory
CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"  # what the control daemon starts: it holds the one GPU context
COMM = CONTROL[:15]  # what /proc/<pid>/comm shows of either: the kernel keeps 15 characters

State = Literal["running", "absent", "stale", "unreadable", "untrusted"]


@dataclass(frozen=True)
class Daemon:
    pipe_dir: Path
    state: State
    pid: int | None = None
    detail: str = ""


def pipe_dir(env: Mapping[str, str] | None = None) -> Path:
    """The pipe directory MPS clients of this environment look in (as the driver decides it)."""
    found = (os.environ if env is None else env).get(PIPE_ENV)
    return Path(found) if found else DEFAULT_PIPE_DIR


def find(pipe: Path, proc: Path = Path("/proc")) -> Daemon:
    """What the pid file in `pipe` says, checked against /proc. A daemon counts only if the
    directory is its owner's alone (root's or this process's user's, writable by nobody else)
    and the pid is a control daemon: the default directory is under /tmp, where any user could
    make one, and the CDI spec mounts it into every container."""
    pid_file = pipe / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except FileNotFoundError:
        return Daemon(pipe, "absent")
    except (OSError, ValueError) as err:
        return Daemon(pipe, "unreadable", detail=f"{pid_file} cannot be read: {err}")
    try:
        info = pipe.lstat()
    except OSError as err:
        return Daemon(pipe, "unreadable", detail=f"{pipe}: {err.strerror}")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        return Daemon(
            pipe,
            "untrusted",
            pid,
            f"{pipe} is not a directory of root or uid {os.geteuid()} that only its owner may write",
        )
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return Daemon(pipe, "stale", pid, f"{pid_file} names pid {pid}, which is gone")
    if comm != COMM:
        return Daemon(pipe, "stale", pid, f"{pid_file} names pid {pid}, which is {comm!r}, not {CONTROL}")
    return Daemon(pipe, "running", pid)


@dataclass(frozen=True)
class _Mount:
    dev: str  # "major:minor"
    root: str  # the directory of the filesystem mounted there
    point: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def _mounts(mountinfo: Path) -> list[_Mount]:
    """The mounts of /proc/<pid>/mountinfo (proc(5)), in order: a later one covers an earlier
    one at the same point. Paths there escape space, tab, newline and backslash as octal."""
    found = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5:
            root, point = (_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[3:5])
            found.append(_Mount(fields[2], root, point))
    return found


SHM = "/dev/shm"
ShmState = Literal["own", "host", "unreachable", "unreadable"]


@dataclass(frozen=True)
class Shm:
    state: ShmState
    host_path: Path | None = None
    detail: str = ""


def shm_of(daemon: Daemon, proc: Path = Path("/proc")) -> Shm:
    """Where the daemon's /dev/shm is from this mount namespace. The MPS server and its clients
    meet in shared memory there, so a client in a container needs the daemon's at /dev/shm:
    "own", a directory here that is the daemon's /dev/shm and not this namespace's (the CDI
    spec mounts it); "host", this namespace's own /dev/shm, which no container may get (every
    process's segments are in it); "unreachable", a filesystem private to the daemon's mount
    namespace, or one a later mount hides here."""
    if daemon.state != "running" or daemon.pid is None:
        return Shm("unreachable", detail="no live daemon")
    try:
        theirs = [m for m in _mounts(proc / str(daemon.pid) / "mountinfo") if m.point == SHM]
        ours = _mounts(proc / "self" / "mountinfo")
    except OSError as err:
        return Shm("unreadable", detail=f"the mounts of pid {daemon.pid} or of this process: {err}")
    if not theirs:
        return Shm("unreachable", detail=f"pid {daemon.pid} has no {SHM} mount")
    shm = theirs[-1]
    mine = [m for m in ours if m.point == SHM]
    if mine and (mine[-1].dev, mine[-1].root) == (shm.dev, shm.root):
        return Shm("host", Path(SHM), f"pid {daemon.pid} uses this machine's own {SHM}")
    # A mount here of the same filesystem at or above that directory shows it at a path.
    above = [
        m
        for m in ours
        if m.dev == shm.dev and (shm.root == m.root or shm.root.startswith(m.root.rstrip("/") + "/"))
    ]
    if not above:
        return Shm("unreachable", detail=f"pid {daemon.pid}'s {SHM} ({shm.dev}) is mounted nowhere here")
    best = max(above, key=lambda m: len(m.root))
    path = Path(best.point) / shm.root[len(best.root) :].lstrip("/")
    major, minor = (int(x) for x in shm.dev.split(":"))
    try:
        if path.stat().st_dev != os.makedev(major, minor):
            return Shm("unreachable", detail=f"{path} is covered by another mount here")
    except OSError as err:
        return Shm("unreachable", detail=f"{path}: {err.strerror}")
    return Shm("own", path)


def running_elsewhere(proc: Path = Path("/proc")) -> list[int]:
    """Pids of control daemons, whichever pipe directory they serve."""
    found = []
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == COMM:
                found.append(int(comm.parent.name))
        except (OSError, ValueError):
            continue
    return sorted(found)


def is_server(pid: int, daemon: Daemon, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is an MPS server of the live, trusted `daemon`: a child of it with the
    server's name. Under MPS the driver lists the server among the compute processes; it belongs
    to no tenant, and killing it would end every client's work. The name alone proves nothing
    (any process may set its comm), so parentage decides."""
    if daemon.state != "running" or daemon.pid is None:
        return False
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return comm == COMM and len(fields) > 1 and fields[1] == str(daemon.pid)
