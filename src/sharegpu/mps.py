"""The node's MPS control daemon, if one runs: where its pipe directory is and whether the
daemon behind it lives. Under one, every client shares one GPU context and the shim makes an
offline tenant's processes BELOW_NORMAL clients (docs/design/arbitration.md, "Hardware
priority under MPS"); `sharegpu doctor` reports it and the CDI spec gives containers its pipe
directory."""

from __future__ import annotations

import os
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
