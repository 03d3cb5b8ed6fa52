"""Where a step runs: the real GPU of this machine, or a private simulated GPU.

A target is an environment, not a process: the runner builds it once (`real_environment`,
`simulated_environment`), starts each step's process with it, and the step rebuilds the target
from that environment (`Target.current`). Either way tenants live in a runtime directory of the
run's own (never the node's /run/sharegpu) and no node agent is asked, so the check leaves
nothing behind; on the simulated GPU the state file is the run's own too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharegpu import simgpu
from sharegpu.native import LIB_DIR, probe_path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
KIND_ENV = "GPUCHECK_TARGET"  # real | simulated
ROOT_ENV = "GPUCHECK_ROOT"  # this run's scratch directory
REAL, SIMULATED = "real", "simulated"
LABELS = {REAL: "real GPU", SIMULATED: "simulated GPU"}
# What the simulated GPU of a dry run is: one GPU of the size of an H100/H200-class card, the
# driver's default time slice and switch costs (the figures issue 16 wants checked on a GPU).
# A context takes 512 MiB of its own, as on a real card (518 MiB measured on an H200, driver
# 580), so the dry run meets the cap that counts it.
SIM_CONFIG = {"gpus": 1, "memory_mib": 81920, "context_overhead_mib": 512}
SIM_DEFAULTS_US = {"timeslice_us": 2000, "preempt_us": 50, "ctxsw_us": 10}
_DROP = ("LD_PRELOAD", "SHAREGPU_TENANT", "SHAREGPU_CONFIG", "CUDA_VISIBLE_DEVICES")


def _python_path() -> str:
    parts = [str(REPO / "src"), str(BENCH)]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def _base(root: Path, kind: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith("SIMGPU_")}
    env |= {
        KIND_ENV: kind,
        ROOT_ENV: str(root),
        "SHAREGPU_RUNTIME_DIR": str(root / "run"),
        "SHAREGPU_NO_AGENT": "1",
        "PYTHONPATH": _python_path(),
        "PYTHONUNBUFFERED": "1",
    }
    return env


def real_environment(root: Path) -> dict[str, str]:
    """The machine's own driver: the simulated GPU's directory is taken off the library path."""
    return simgpu.without(_base(root, REAL))


def simulated_environment(root: Path) -> dict[str, str]:
    """A simulated GPU of this run's own (state and configuration under `root`), its defaults."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "simgpu.json"
    config.write_text(json.dumps(SIM_CONFIG))
    env = _base(root, SIMULATED)
    env |= {
        "LD_LIBRARY_PATH": str(LIB_DIR / "simgpu"),
        "SIMGPU_STATE": str(root / "simgpu.state"),
        "SIMGPU_CONFIG": str(config),
    }
    return env


def parse_kv(text: str) -> dict[str, str]:
    """The probe's key=value lines (the last value of a repeated key)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class ProbeError(RuntimeError):
    pass


@dataclass
class Target:
    kind: str
    root: Path
    env: dict[str, str]

    @classmethod
    def current(cls) -> Target:
        """The target this process was started for (by the runner)."""
        kind = os.environ.get(KIND_ENV, "")
        if kind not in LABELS:
            raise RuntimeError(f"{KIND_ENV} is {kind!r}: a step runs under the gpu-check runner")
        return cls(kind, Path(os.environ[ROOT_ENV]), dict(os.environ))

    @property
    def real(self) -> bool:
        return self.kind == REAL

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    @property
    def python(self) -> str:
        return sys.executable

    def scratch(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def probe(
        self, args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> dict[str, str]:
        """Run the driver-API probe to completion; its key=value output."""
        proc = subprocess.run(
            [str(probe_path()), *args],
            env=dict(env or self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise ProbeError(f"sgprobe {' '.join(args)} exited {proc.returncode}: {_tail(proc)}")
        return parse_kv(proc.stdout)

    def run_command(self, options: Sequence[str], command: Sequence[str]) -> list[str]:
        """The argv of `sharegpu run OPTIONS -- COMMAND` (the CLI users run)."""
        return [self.python, "-m", "sharegpu.cli", "run", *options, "--", *command]

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, stdin: int | None = None
    ) -> subprocess.Popen[str]:
        """A background process (its output piped): a probe, a program, or `sharegpu run`."""
        return subprocess.Popen(
            list(argv),
            env=dict(env or self.env),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def node(self, name: str) -> Any:
        """bench/_node.py's Node over this target's driver, its tenants under a scratch directory
        of its own: what the benches (overhead, isolation, containers) measure on."""
        import _node

        return _node.node_on(self.scratch(name), self.env)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for a spawned process; its output. Killed (and an error) past `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise ProbeError(f"{proc.args!r} did not finish in {timeout:g} s: {err.strip()[-400:]}") from None
    if proc.returncode != 0:
        raise ProbeError(f"{_argv0(proc)} exited {proc.returncode}: {err.strip()[-600:]}")
    return out, err


def _argv0(proc: subprocess.Popen[str]) -> str:
    args = proc.args
    if isinstance(args, list | tuple):
        return " ".join(str(a) for a in args[-4:])
    return str(args)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stderr.strip() or proc.stdout.strip())[-600:]


def last_json(text: str) -> dict[str, Any]:
    """The last line of a program's output that is a JSON object."""
    for raw in reversed(text.strip().splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ProbeError(f"no JSON line in the program's output: {text.strip()[-300:]!r}")


class Lines:
    """A spawned process's standard output, line by line, read on a thread: `wait_for` returns
    the first line that matches, or raises ProbeError past its timeout (the process may hang)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import queue
        import threading

        self.proc = proc
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, match: Callable[[str], bool], timeout: float) -> str:
        import queue

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise ProbeError(f"no expected output in {timeout:g} s; so far: {self.seen[-5:]}") from None
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise ProbeError(f"the process ended first (output {self.seen[-5:]}): {err.strip()[-600:]}")
            self.seen.append(line)
            if match(line):
                return line

    def rest(self, timeout: float) -> list[str]:
        """Every line until the process closes its output (at most `timeout` seconds)."""
        import queue

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return self.seen


def ready_lines(procs: Sequence[subprocess.Popen[str]], timeout: float = 60) -> list[Lines]:
    """A reader of each of `procs` once every one has printed its '"ready"' line; if one does
    not in `timeout` seconds, all are killed and the ProbeError raised."""
    readers = [Lines(p) for p in procs]
    try:
        for reader in readers:
            reader.wait_for(lambda line: '"ready"' in line, timeout=timeout)
    except ProbeError:
        for proc in procs:
            proc.kill()
        raise
    return readers
