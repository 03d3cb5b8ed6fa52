"""How the node's kubelet plugins run (the device plugin and the DRA plugin): their server until
SIGTERM or SIGINT, beside helper loops, and the sockets they watch by inode."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol


class Loop(Protocol):
    """A loop for a thread of its own: `run()` until `stop()`."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


def inode(path: Path) -> int | None:
    """The file's inode, None when it is not there: a socket removed or made again is another."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def run_until_signalled(server: Loop, helpers: Sequence[Loop], *, join_s: float = 5.0) -> None:
    """Run `server` until SIGTERM or SIGINT stops it, with each helper in a daemon thread (one
    stuck on the API server does not hold up the exit), then stop the helpers."""

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    threads = [threading.Thread(target=h.run, name=type(h).__name__, daemon=True) for h in helpers]
    for thread in threads:
        thread.start()
    runner = threading.Thread(target=server.run, name=type(server).__name__)
    runner.start()
    while runner.is_alive():
        runner.join(0.5)  # the main thread stays free for the signal handlers
    for helper in helpers:
        helper.stop()
    for thread in threads:
        thread.join(join_s)
