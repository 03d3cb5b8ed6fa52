"""Real, unmodified third-party CUDA clients on the simulated GPU, alone and under `sharegpu run`.

cuda-core, numba-cuda and pycuda (built from its sdist) live in a venv of their own,
.venv-clients (`make clients`, which `make test` runs first; tests/clients/README.md). Each runs
its scenario script (tests/clients/*_client.py), which prints one JSON line and exits 0 only if
every step behaved: the GPU's size, a round trip, a kernel, the over-cap allocation refused with
the client's own out-of-memory error. A missing client fails these tests; it never skips them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Sim
from simgpuutil import TUNING_VARS

CLIENTS_VENV = REPO / ".venv-clients"
SCRIPTS = REPO / "tests" / "clients"
CARD_MIB = 4096
SPIN_US = 20_000
REPEAT = 30  # 30 x 20 ms = 600 ms of GPU time asked for

# client -> (script, the class its out-of-memory error is, a fragment of its message)
CLIENTS = {
    "cuda-core": ("cuda_core_client.py", "cuda.core._utils.cuda_utils.CUDAError", "CUDA_ERROR_OUT_OF_MEMORY"),
    "numba-cuda": ("numba_client.py", "numba.cuda.cudadrv.driver.CudaAPIError", "CUDA_ERROR_OUT_OF_MEMORY"),
    "pycuda": ("pycuda_client.py", "pycuda._driver.MemoryError", "cuMemAlloc failed: out of memory"),
}
clients = pytest.mark.parametrize("client", list(CLIENTS))


@pytest.fixture(scope="module")
def client_python() -> Path:
    py = CLIENTS_VENV / "bin" / "python"
    if not (CLIENTS_VENV / ".installed").exists() or not py.exists():
        pytest.fail(f"{CLIENTS_VENV} is missing: run `make clients` (or `make test`, which runs it)")
    return py


@pytest.fixture
def node(sim_factory: Callable[..., Sim]) -> Sim:
    """One 4 GiB GPU, the driver's default kernel time and time slice."""
    return sim_factory(gpus=1, memory_mib=CARD_MIB)


def node_env(node: Sim) -> dict[str, str]:
    env = node.env()
    for var in TUNING_VARS:
        env.pop(var, None)
    return env


def scenario(client_python: Path, client: str, cap_mib: int) -> list[str]:
    script = SCRIPTS / CLIENTS[client][0]
    return [
        str(client_python),
        str(script),
        "--cap-mib",
        str(cap_mib),
        "--spin-us",
        str(SPIN_US),
        "--repeat",
        str(REPEAT),
        "--traceback",
    ]


def result(proc: subprocess.CompletedProcess[str], client: str, cap_mib: int) -> dict[str, Any]:
    """The scenario's JSON line, after checking what every run must show."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["ok"]
    assert r["client"] == client
    assert all(r["versions"].values()), r["versions"]
    assert r["device_name"] == "sharegpu simulated H100"
    assert r["total_mib"] == cap_mib
    assert 0 < r["free_mib"] <= cap_mib
    assert r["kernel_ok"]
    assert r["kernel_ms"] >= SPIN_US / 1e3 * 0.9
    _, oom_class, oom_text = CLIENTS[client]
    assert r["oom"]["size_mib"] == cap_mib + 1
    assert r["oom"]["class"] == oom_class, r["oom"]
    assert oom_text in r["oom"]["message"], r["oom"]
    assert r["gpu_ms"] == REPEAT * SPIN_US / 1e3
    return r


@pytest.mark.timing
@clients
def test_client_alone_on_the_simulator(client_python: Path, node: Sim, client: str) -> None:
    proc = subprocess.run(
        scenario(client_python, client, CARD_MIB),
        env=node_env(node),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    r = result(proc, client, CARD_MIB)
    assert r["loop_ms"] < 1.8 * r["gpu_ms"], r  # ~1.0x


@pytest.mark.timing
@clients
def test_client_under_a_memory_cap(client_python: Path, node: Sim, client: str) -> None:
    proc = node.cli(
        "run",
        "--memory",
        "1GiB",
        "--",
        *scenario(client_python, client, 1024),
        env=node_env(node),
        timeout=180,
    )
    r = result(proc, client, 1024)
    assert r["loop_ms"] < 1.8 * r["gpu_ms"], r  # no compute limit: ~1.0x


@pytest.mark.timing
@clients
def test_client_held_to_its_compute_cap(client_python: Path, node: Sim, client: str) -> None:
    proc = node.cli(
        "run",
        "--memory",
        "1GiB",
        "--compute",
        "25%",
        "--policy",
        "cap",
        "--",
        *scenario(client_python, client, 1024),
        env=node_env(node),
        timeout=180,
    )
    r = result(proc, client, 1024)
    # 25% of the card: ~4x the GPU time asked for (the last kernel's debt is paid after the loop).
    assert 2.5 * r["gpu_ms"] <= r["loop_ms"] <= 6 * r["gpu_ms"], r
