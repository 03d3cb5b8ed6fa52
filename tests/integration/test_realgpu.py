"""The shim against a real NVIDIA driver (marked realgpu: run where a GPU is, reported as not run
elsewhere; `make gpu-check` runs them on a GPU machine).

The same claims the simulated-GPU tests make, on the driver users have: the vGPU's memory as the
driver API and NVML show it inside a tenant, a refusal at the cap with the memory given back,
the entry points resolved through dlopen/dlsym and cuGetProcAddress, kernels and graphs under a
compute share (the probe's spin kernel really spins there), a killed process's memory
returned to the tenant, and memory opened from another process's IPC handle charged to the
importer.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import ipcpeer
from conftest import parse_kv, real_gpu_env
from sharegpu import native
from sharegpu.arbiter import ensure_arbiter
from sharegpu.runtime.run import device_limit
from sharegpu.spec import MIB, ComputeSpec
from sharegpu.tenant import create_tenant

pytestmark = pytest.mark.realgpu
CAP_MIB = 1024


@dataclass
class RealGpu:
    env: dict[str, str]
    runtime: Path
    uuid: str
    total: int

    def probe(self, *args: str, env: dict[str, str] | None = None, dlopen: bool = False) -> dict[str, str]:
        proc = subprocess.run(
            [str(native.probe_path(dlopen)), *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return parse_kv(proc.stdout)[0]

    def tenant(self, name: str, cap_mib: int = CAP_MIB, compute: str | None = None) -> dict[str, str]:
        spec = ComputeSpec.parse(compute) if compute else ComputeSpec.parse(policy="native")
        if spec.policy != "native":
            ensure_arbiter(self.runtime, self.uuid)
        path = create_tenant(name, [device_limit(self.uuid, cap_mib * MIB, spec)], root=self.runtime)
        return self.env | {"LD_PRELOAD": str(native.shim_path()), "SHAREGPU_TENANT": str(path)}


@pytest.fixture
def gpu(tmp_path: Path) -> RealGpu:
    runtime = tmp_path / "run"
    env = real_gpu_env() | {"SHAREGPU_RUNTIME_DIR": str(runtime), "SHAREGPU_NO_AGENT": "1"}
    proc = subprocess.run(
        [str(native.probe_path()), "info"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    info = parse_kv(proc.stdout)[0]
    return RealGpu(env, runtime, info["dev0.uuid"], int(info["dev0.total"]))


def test_the_driver_api_shows_the_vgpu_inside_a_tenant(gpu: RealGpu) -> None:
    inside = gpu.probe("meminfo", env=gpu.tenant("t"))
    assert int(inside["total"]) == CAP_MIB * MIB
    assert int(inside["devtotal"]) == CAP_MIB * MIB
    assert int(inside["free"]) <= CAP_MIB * MIB
    assert int(gpu.probe("meminfo")["total"]) == gpu.total > CAP_MIB * MIB


def test_allocations_stop_at_the_cap_and_a_freed_chunk_fits_again(gpu: RealGpu) -> None:
    got = gpu.probe("fill", "plain", "64M", "0.01", env=gpu.tenant("t"))
    assert got["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # The cap counts the context's own memory (about 520 MiB on an H200), so the allocations
    # stop short of it by that much, and what the tenant holds reaches it.
    held = int(got["total"]) - int(got["free"])
    assert CAP_MIB * MIB - 2 * 64 * MIB < held <= CAP_MIB * MIB
    assert 0 < int(got["bytes"]) < held
    assert got["refill"] == "OK"


def test_dlopen_and_dlsym_resolve_to_the_shim(gpu: RealGpu) -> None:
    inside = gpu.probe("meminfo", env=gpu.tenant("t"), dlopen=True)
    assert int(inside["total"]) == CAP_MIB * MIB


def test_nvml_shows_the_vgpu_inside_and_the_card_outside(gpu: RealGpu) -> None:
    code = (
        "import pynvml; pynvml.nvmlInit(); "
        "print(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)"
    )

    def total(env: dict[str, str]) -> int:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[-1])

    assert total(gpu.tenant("t")) == CAP_MIB * MIB
    # Outside, the card: NVML's total also counts what the driver reserves (616 MiB on an H200).
    assert gpu.total <= total(gpu.env) <= gpu.total * 1.02


@pytest.mark.timing
@pytest.mark.parametrize("mode", [pytest.param("kernel", id="kernels"), pytest.param("graph", id="graph")])
def test_kernels_and_graphs_run_their_time_under_a_compute_share(gpu: RealGpu, mode: str) -> None:
    got = gpu.probe("launch", "20", "500", mode, env=gpu.tenant("t", compute="50%"))
    assert got["kernels"] == "20"
    # The spin kernel reads the GPU's timer: 20 x 500 µs really take 10 ms on the GPU.
    assert float(got["gpu_us"]) >= 0.95 * 20 * 500
    assert int(got["wall_us"]) >= 0.95 * 20 * 500


def test_a_killed_process_gives_its_memory_back_to_the_tenant(gpu: RealGpu) -> None:
    # Each process's context takes some of the 2 GiB too, so two 1 GiB allocations fit one
    # after the other only if the killed process's memory came back.
    env = gpu.tenant("t", cap_mib=2048)
    proc = subprocess.run(
        [str(native.probe_path()), "killself", "plain", "1024M"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9
    got = gpu.probe("alloc", "plain", "1024M", env=env)
    assert got["alloc"] == "OK"


def test_ipc_imports_are_charged_to_the_importer_on_the_driver(gpu: RealGpu, tmp_path: Path) -> None:
    """The round trip of tests/integration/test_ipc.py on the real driver, under a 4 GiB cap (each
    process's context takes about 518 MiB of it): allocate 1200 MiB, export it, open it in a
    second process of the tenant, free it; the second open no longer fits."""
    env = gpu.tenant("t", 4096)
    binary = ipcpeer.build(tmp_path)
    with ipcpeer.peer(binary, env) as exporter, ipcpeer.peer(binary, env) as importer:
        opens = []
        for _ in range(3):
            p = exporter.alloc(1200)
            opens.append(importer.rc("open", ipcpeer.handle_of(exporter, p)))
            assert exporter.used() <= 4096 * MIB
            assert exporter.rc("free", p) == 0
        assert opens == [0, 2, 2], opens  # CUDA_ERROR_OUT_OF_MEMORY once 1200 are held
