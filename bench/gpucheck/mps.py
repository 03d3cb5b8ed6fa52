"""A private MPS control daemon: its own pipe and log directories, so no other client on the
machine sees it, always told to quit when the block ends."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharegpu import mps


@dataclass
class PrivateMps:
    env: dict[str, str]  # the caller's environment with this daemon's pipe and log directories
    found: dict[str, Any] = field(default_factory=dict)  # what starting and stopping it showed


def daemon_pids(pipe: Path) -> list[int]:
    """The MPS control daemon's and servers' pids serving `pipe` (their environment names it)."""
    wanted = f"{mps.PIPE_ENV}={pipe}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("nvidia-cuda-mps"):
                continue
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return sorted(found)


@contextlib.contextmanager
def private_daemon(base: Path, env: dict[str, str]) -> Iterator[PrivateMps]:
    """Start `nvidia-cuda-mps-control -d` under `base`; `found["started"]` says whether it did
    (the block runs either way, so the caller reports why not)."""
    control = shutil.which(mps.CONTROL)
    pipe, log = base / "pipe", base / "log"
    daemon = PrivateMps(env | {mps.PIPE_ENV: str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)})
    daemon.found["control"] = control
    if control is None:
        daemon.found["started"] = False
        daemon.found["why_not"] = f"{mps.CONTROL} is not installed"
        yield daemon
        return
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    started = subprocess.run(
        [control, "-d"], env=daemon.env, capture_output=True, text=True, timeout=20, check=False
    )
    daemon.found["start_rc"] = started.returncode
    daemon.found["started"] = started.returncode == 0
    if started.returncode != 0:
        daemon.found["why_not"] = f"did not start: {started.stderr.strip()[-200:]}"
    try:
        yield daemon
    finally:
        if started.returncode == 0:
            with contextlib.suppress(Exception):
                subprocess.run(
                    [control],
                    input="quit\n",
                    env=daemon.env,
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=False,
                )
            # The daemon leaves its pipe behind when it quits, so its being gone is judged by
            # its processes: none left with this pipe directory in its environment.
            for _ in range(50):
                if not daemon_pids(pipe):
                    break
                time.sleep(0.1)
            left = daemon_pids(pipe)
            daemon.found["stopped"] = not left
            if left:
                daemon.found["left_running"] = left
        for name in ("control.log", "server.log"):
            if (log / name).exists():
                daemon.found[f"{name}_tail"] = (log / name).read_text(errors="replace")[-600:]
