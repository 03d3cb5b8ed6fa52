"""Two ends of a cross-process memory exchange: native/shim/tests/ipcpeer.c, built and driven
line by line (tests/integration/test_ipc.py on the simulated GPU, test_realgpu.py on a real one)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cbuild import SHIM_DIR, gcc
from sharegpu import native


def build(tmp_path: Path) -> Path:
    """The peer program, linked against libcuda.so.1 (the simulator's at build time; the loader
    finds the real one where LD_LIBRARY_PATH does not name the simulator)."""
    simgpu = str(native.LIB_DIR / "simgpu")
    return gcc(tmp_path, "ipcpeer", str(SHIM_DIR / "tests" / "ipcpeer.c"), f"-L{simgpu}", "-l:libcuda.so.1")


class Peer:
    """One ipcpeer process: each call sends a command and returns its answer as a dict."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert self._line() == {"ready": "1"}, self.proc.stderr.read() if self.proc.stderr else ""

    def _line(self) -> dict[str, str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the peer exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return dict(field.split("=", 1) for field in line.split())

    def __call__(self, *words: object) -> dict[str, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self._line()

    def rc(self, *words: object) -> int:
        return int(self(*words)["rc"])

    def alloc(self, mib: int) -> str:
        answer = self("alloc", mib)
        assert answer["rc"] == "0", answer
        return answer["ptr"]

    def used(self) -> int:
        answer = self("info")
        assert answer["rc"] == "0", answer
        return int(answer["used"])


@contextmanager
def peer(binary: Path, env: dict[str, str]) -> Iterator[Peer]:
    proc = subprocess.Popen(
        [str(binary)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with proc:  # closes the pipes and waits
        try:
            yield Peer(proc)
        finally:
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def handle_of(exporter: Peer, ptr: str) -> str:
    answer = exporter("handle", ptr)
    assert answer["rc"] == "0", answer
    return answer["handle"]
