"""The node's MPS control daemon, if one runs: where its pipe directory is and whether the
daemon behind it lives. Under one, every client shares one GPU context and the shim makes an
offline tenant's processes BELOW_NORMAL clients (docs/design/arbitration.md, "Hardware
priority under MPS"); `sharegpu doctor` reports it and the CDI spec gives containers its pipe
directory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")
PID_FILE = "nvidia-cuda-mps-control.pid"  # what the control daemon writes in its pipe directory
CONTROL = "nvidia-cuda-mps-control"

State = Literal["running", "absent", "stale", "unreadable"]


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
    """What the pid file in `pipe` says, checked against /proc."""
    pid_file = pipe / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except FileNotFoundError:
        return Daemon(pipe, "absent")
    except (OSError, ValueError) as err:
        return Daemon(pipe, "unreadable", detail=f"{pid_file} cannot be read: {err}")
    if not (proc / str(pid)).exists():
        return Daemon(pipe, "stale", pid, f"{pid_file} names pid {pid}, which is gone")
    return Daemon(pipe, "running", pid)


def running_elsewhere(proc: Path = Path("/proc")) -> list[int]:
    """Pids of control daemons, whichever pipe directory they serve."""
    found = []
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == CONTROL:
                found.append(int(comm.parent.name))
        except (OSError, ValueError):
            continue
    return sorted(found)
