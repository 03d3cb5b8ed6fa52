"""A stand-in for the MPS control daemon: a process with its name (the comm the kernel keeps),
optionally in a mount namespace of its own with a directory of this machine as its /dev/shm."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path


def mps_stand_in(tmp_path: Path, shm: Path | None) -> subprocess.Popen[bytes]:
    """A process named like the MPS control daemon; with `shm`, in a mount namespace of its own
    where that directory is its /dev/shm (as `sharegpu doctor` says to start the real one)."""
    daemon = tmp_path / "nvidia-cuda-mps-control"
    shutil.copy("/bin/sleep", daemon)
    if shm is None:
        return subprocess.Popen([str(daemon), "60"])
    script = 'mount --bind "$1" /dev/shm && exec "$2" 60'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(shm), str(daemon)]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "nvidia-cuda-mps":
        assert time.monotonic() < deadline, "the stand-in daemon did not start"
        time.sleep(0.01)
    return proc
