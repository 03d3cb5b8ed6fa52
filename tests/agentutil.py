"""The node agent as a real process on a simulated node, for tests/integration/test_agent_*.py."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from conftest import Sim
from sharegpu.agent.client import AgentClient, socket_path

# A CUDA program (cuda-python) that allocates what it is told on stdin, one line per step:
# "alloc MIB..." answers "res=<CUresult>,... total=<MiB seen by cuMemGetInfo>".
ALLOCATOR = textwrap.dedent(
    """
    import sys
    from cuda.bindings import driver as d
    M = 1 << 20
    d.cuInit(0)
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    print("ready=1", flush=True)
    for line in sys.stdin:
        sizes = [int(x) for x in line.split()]
        res = [int(d.cuMemAlloc(n * M)[0]) for n in sizes]
        err, free, total = d.cuMemGetInfo()
        print("res=%s total=%d" % (",".join(map(str, res)), total // M), flush=True)
    """
)


class Agent:
    """`sharegpu agent` on `sim`, started and stopped by the test."""

    def __init__(
        self,
        sim: Sim,
        state: Path,
        *args: str,
        env: dict[str, str] | None = None,
        runtime: Path | None = None,
    ) -> None:
        self.sim = sim
        self.runtime = runtime or sim.runtime  # another runtime directory: a second agent on the node
        self.state = state
        self.args = args
        self.extra_env = env or {}
        self.log = state.parent / f"{state.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def sock(self) -> Path:
        return socket_path(self.runtime)

    def command(self, *extra: str) -> list[str]:
        runtime, state = str(self.runtime), str(self.state)
        return [
            sys.executable,
            "-m",
            "sharegpu.cli",
            "agent",
            "--runtime-dir",
            runtime,
            "--state-dir",
            state,
            "--metrics-port",  # tests that want metrics pass their own port (the last one wins)
            "0",
            "--cdi-spec",  # the node's /var/run/cdi is not the tests' (tests that want one pass a path)
            "none",
            *extra,
        ]

    def refused(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """Run the agent with `extra` flags to its end: for settings or a node it must refuse."""
        return subprocess.run(
            self.command(*self.args, *extra),
            env=self.sim.env() | self.extra_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(self, timeout: float = 60) -> Agent:
        self.state.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(*self.args),
                env=self.sim.env() | self.extra_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent exited {self.proc.returncode}:\n{self.log.read_text()}")
            client = AgentClient.connect(self.runtime)
            if client is not None:
                client.close()
                return self
            time.sleep(0.1)
        raise AssertionError(f"the agent never answered:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def client(self) -> AgentClient:
        client = AgentClient.connect(self.runtime, timeout=10)
        assert client is not None, "the agent does not answer"
        return client

    @contextlib.contextmanager
    def http(self) -> Iterator[httpx.Client]:
        """A raw HTTP client on the socket, for what the typed client would not send."""
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://agent", timeout=60
        ) as client:
            yield client

    def events(self, **params: Any) -> list[dict[str, Any]]:
        with self.http() as http:
            response = http.get("/v1/events", params={"limit": 10_000, **params})
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def wait_event(self, kind: str, tenant: str | None = None, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events(kind=kind) if tenant is None or e["tenant"] == tenant]
            if found:
                return found[-1]
            time.sleep(0.2)
        raise AssertionError(f"no {kind} event for {tenant} within {timeout} s")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None


def create(agent: Agent, **body: Any) -> dict[str, Any]:
    with agent.http() as http:
        response = http.post("/v1/tenants", json=body)
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def allocator(sim: Sim, tenant_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR],
        env=sim.tenant_env(tenant_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready=1"
    return proc


def step(proc: subprocess.Popen[str], *mib: int) -> tuple[list[str], int]:
    """Ask the allocator for allocations of `mib` MiB each: CUresult names per size, and total."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(" ".join(map(str, mib)) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline().strip()
    assert line.startswith("res="), line
    res, total = line.split()
    codes = ["OK" if c == "0" else ("OOM" if c == "2" else c) for c in res.removeprefix("res=").split(",")]
    return codes, int(total.removeprefix("total="))


def promtool() -> str | None:
    """promtool's path. Missing: fail in CI (.ci/run installs it), skip on a developer's machine."""
    import os
    import shutil

    import pytest

    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found
