"""Shared fixtures of every kind of test (unit, integration, e2e): an isolated simulated GPU per
test, the probe, and tenants. A kind's own fixtures are in its folder's conftest.py; helpers
shared by several files in tests/*util.py (this folder is on sys.path for them).

Every test gets its own simulated-GPU state file and runtime directory under tmp_path, so tests
never see each other's devices, memory or tenants.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sharegpu import native, simgpu
from sharegpu.placement import Node, Request
from sharegpu.sim import load_nodes, load_pods
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant
from simgpuutil import TUNING_VARS, run_python
from timingutil import host_steal_ms

# A suite started in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and every command it starts inherits that: the tests that stop `--watch` and `top` with Ctrl-C
# then wait for ever. Catching it here gives the children the default again (exec resets caught
# signals, not ignored ones), so they turn Ctrl-C into KeyboardInterrupt as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
REAL_GPU_ENV = "SHAREGPU_REAL_GPU"
_NOT_RUN = pytest.StashKey[tuple[int, str]]()


def real_gpu_env() -> dict[str, str]:
    """This process's environment for the machine's own driver: no shim, no tenant, no
    simulated GPU."""
    drop = ("LD_PRELOAD", "SHAREGPU_TENANT", "CUDA_VISIBLE_DEVICES")
    return simgpu.without({k: v for k, v in os.environ.items() if k not in drop})


def real_gpu() -> str | None:
    """None when a real NVIDIA GPU is here, else why not. SHAREGPU_REAL_GPU=1 says there is one
    (a failed detection then fails the tests instead of deselecting them), =0 that there is none."""
    forced = os.environ.get(REAL_GPU_ENV, "")
    if forced == "1":
        return None
    if forced == "0":
        return f"{REAL_GPU_ENV}=0 says there is none"
    code = (
        "import pynvml; pynvml.nvmlInit(); n = pynvml.nvmlDeviceGetCount(); "
        "maps = [line.split()[-1] for line in open('/proc/self/maps') if 'libnvidia-ml.so' in line]; "
        "print(n, maps[0] if maps else '-')"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=real_gpu_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "NVML did not answer in 30 s"
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 2:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no NVIDIA driver here ({last})"
    if Path(words[1]).resolve().parent == (native.LIB_DIR / "simgpu").resolve():
        return "NVML resolves to the simulated GPU"
    if words[0] == "0":
        return "NVML reports no GPU"
    return None


# A test judged on wall time runs again when it fails (pytest-rerunfailures; the summary counts
# each rerun), after a pause: a VM's hypervisor may take its CPUs for tenths of a second at a
# time, for tens of seconds (steal, tests/timingutil.py), which no bound that still catches a
# regression survives every time. A regression fails every run. Each timing test's report
# carries what the host stole during it.
TIMING_RERUNS = 2
TIMING_RERUN_DELAY_S = 10


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked timing get TIMING_RERUNS reruns. Tests marked realgpu run only where a real
    GPU is; elsewhere they are deselected and counted, and pytest_terminal_summary says so (never
    a silent skip)."""
    for item in items:
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=TIMING_RERUNS, reruns_delay=TIMING_RERUN_DELAY_S))
    marked = [item for item in items if item.get_closest_marker("realgpu")]
    if not marked:
        return
    why = real_gpu()
    if why is None:
        return
    items[:] = [item for item in items if not item.get_closest_marker("realgpu")]
    config.hook.pytest_deselected(items=marked)
    config.stash[_NOT_RUN] = (len(marked), why)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """A timing test's report says how much CPU the host stole while it ran (shown with its
    output when it fails)."""
    if not item.get_closest_marker("timing"):
        return (yield)
    began, stolen = time.monotonic(), host_steal_ms()
    try:
        return (yield)
    finally:
        seconds = time.monotonic() - began
        item.add_report_section(
            "call",
            "host",
            f"the hypervisor stole {host_steal_ms() - stolen:.0f} ms of CPU in this test's {seconds:.1f} s",
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(_NOT_RUN, None)
    if found is not None:
        count, why = found
        terminalreporter.write_line(
            f"realgpu: {count} real-GPU test{'s' if count != 1 else ''} not run: {why} "
            "(they run where a GPU is: make gpu-check)"
        )


def _require_native() -> None:
    # The C parts must be built; `make test` builds them. Fail loudly rather than skip.
    for path in (native.LIB_DIR / "libsharegpu.so", native.LIB_DIR / "simgpu" / "libcuda.so.1"):
        if not path.exists():
            pytest.fail(f"{path} is missing: run `make -C native` (or `make test`)")


@dataclass
class ProbeResult:
    returncode: int
    stdout: str
    stderr: str
    values: dict[str, str] = field(default_factory=dict)
    lines: list[tuple[str, str]] = field(default_factory=list)

    def __getitem__(self, key: str) -> str:
        return self.values[key]

    def all(self, key: str) -> list[str]:
        return [v for k, v in self.lines if k == key]

    def int(self, key: str) -> int:
        return int(self.values[key])


def parse_kv(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    lines = [tuple(line.split("=", 1)) for line in text.splitlines() if "=" in line]
    return dict(lines), lines  # type: ignore[misc]


def table_cell(table: str, column: str, tenant: str) -> str:
    """The cell of `column` (a header's first word(s), e.g. "WAIT (") in `tenant`'s row."""
    lines = table.splitlines()
    header = next(line for line in lines if column in line and "TENANT" in line)
    at = header.index(column)
    row = next(line for line in lines if line.split() and line.split()[0] == tenant)
    return row[at:].split()[0]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll `check` every 20 ms until it returns something true (returned); fail naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return found


def python(env: dict[str, str], code: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    """Runs a Python program (dedented) under env; its key=value lines and the process."""
    proc = run_python(env, code, timeout)
    values, _ = parse_kv(proc.stdout)
    return values, proc


@dataclass
class Sim:
    """One isolated simulated GPU node."""

    root: Path
    gpus: int = 2
    memory_mib: int = 1024
    extra_env: dict[str, str] = field(default_factory=dict)
    uuid0: str | None = None  # GPU 0's UUID, when another API must name the same GPU

    def __post_init__(self) -> None:
        _require_native()
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = self.root / "simgpu.json"
        config: dict[str, object] = {"gpus": self.gpus, "memory_mib": self.memory_mib}
        if self.uuid0:
            config["uuid0"] = self.uuid0
        self.config.write_text(json.dumps(config))
        self.state = self.root / "simgpu.state"
        self.runtime = self.root / "run"
        self._uuids: list[str] | None = None

    def env(self, **overrides: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "SHAREGPU_TENANT", "CUDA_VISIBLE_DEVICES")
        }
        env["LD_LIBRARY_PATH"] = str(native.LIB_DIR / "simgpu")
        env["SIMGPU_STATE"] = str(self.state)
        env["SIMGPU_CONFIG"] = str(self.config)
        env["SHAREGPU_RUNTIME_DIR"] = str(self.runtime)
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def tenant_env(self, tenant_dir: Path, **overrides: str) -> dict[str, str]:
        return self.env(
            LD_PRELOAD=str(native.LIB_DIR / "libsharegpu.so"),
            SHAREGPU_TENANT=str(tenant_dir),
            **overrides,
        )

    def probe(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        dlopen: bool = False,
        timeout: float = 60,
        check: bool = True,
    ) -> ProbeResult:
        cmd = [str(native.probe_path(dlopen)), *args]
        proc = subprocess.run(
            cmd, env=env or self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        values, lines = parse_kv(proc.stdout)
        result = ProbeResult(proc.returncode, proc.stdout, proc.stderr, values, lines)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"probe {args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return result

    def spawn_probe(
        self, *args: str, env: dict[str, str] | None = None, new_session: bool = False
    ) -> subprocess.Popen[str]:
        """The probe in the background; `new_session`: in a process group of its own, so that
        os.killpg(proc.pid, ...) also ends the children it forks."""
        cmd = [str(native.probe_path()), *args]
        return subprocess.Popen(
            cmd,
            env=env or self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=new_session,
        )

    def uuids(self) -> list[str]:
        if self._uuids is None:
            info = self.probe("info")
            self._uuids = [info[f"dev{i}.uuid"] for i in range(info.int("count"))]
        return self._uuids

    def tenant(self, name: str, caps_mib: Sequence[int] | int, gpus: Sequence[int] | None = None) -> Path:
        uuids = self.uuids()
        indexes = list(gpus) if gpus is not None else list(range(len(uuids)))
        caps = [caps_mib] * len(indexes) if isinstance(caps_mib, int) else list(caps_mib)
        limits = [
            DeviceLimit(uuid=uuids[i], mem_cap_bytes=c * MIB) for i, c in zip(indexes, caps, strict=True)
        ]
        return create_tenant(name, limits, root=self.runtime)

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sharegpu.cli", *args],
            env=env or self.env(),
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def sim(tmp_path: Path) -> Sim:
    return Sim(tmp_path / "node")


@pytest.fixture
def sim_factory(tmp_path: Path):  # type: ignore[no-untyped-def]
    count = 0

    def make(**kwargs: object) -> Sim:
        nonlocal count
        count += 1
        return Sim(tmp_path / f"node{count}", **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def built() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "native")], check=True, capture_output=True)
    return native.LIB_DIR


@pytest.fixture
def sim_env(sim_factory: Callable[..., Sim], built: Path) -> dict[str, str]:
    """The environment of a node of the shared fixture with the driver's default device size
    (2 GPUs of 80 GiB) and default kernel time and time slice, whatever the caller's environment."""
    env = sim_factory(memory_mib=80 * 1024).env()
    for var in TUNING_VARS:
        env.pop(var, None)
    return env


# -- the Alibaba GPU trace (tests/unit and tests/integration test_sim.py) --------------------------

TRACE = REPO / "data" / "alibaba-gpu-v2023"


@pytest.fixture(scope="module")
def data() -> Path:
    if not (TRACE / "openb_node_list_all_node.csv").is_file():
        pytest.fail(
            f"the Alibaba GPU trace is missing: expected {TRACE} "
            "(it ships in the repository; restore data/ from git)"
        )
    return TRACE


@pytest.fixture(scope="module")
def cluster(data: Path) -> list[Node]:
    nodes, report = load_nodes(data / "openb_node_list_all_node.csv")
    assert report.skipped_total == 0
    return nodes


@pytest.fixture(scope="module")
def small_cluster(cluster: list[Node]) -> list[Node]:
    """Every 4th node of the full cluster: the same mix of node kinds, a quarter of the size."""
    return cluster[::4]


@pytest.fixture(scope="module")
def default_pods(data: Path, cluster: list[Node]) -> list[Request]:
    pods, report = load_pods(data / "openb_pod_list_default.csv", cluster)
    assert report.skipped_total == 0
    return pods
