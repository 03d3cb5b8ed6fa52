"""The steps of the check, in the order they run.

Each step is a function of one module here taking a StepContext. `needs` names the CUDA-runtime
programs a step launches (PyTorch, CuPy, an nvcc-built program): those cannot run on the
simulated driver, so a dry run reports them as skipped with that reason; `analog` is the
driver-API step whose simulated figures stand beside such a step's real ones. Time limits are
the most a step may take (seconds), on a real GPU and in a dry run; the run's budget can cut
them shorter. The driver-API steps run first and the CUDA-runtime ones after them, so that a
runtime program that hangs under the shim (each is killed at its limit, and the later steps
that need the same runtime are then not tried) cannot take the others' time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from gpucheck.context import StepContext


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    entry: str  # "module:function" under gpucheck.steps
    timeout_s: float
    dry_timeout_s: float
    needs: str | None = None
    analog: str | None = None

    def function(self) -> Callable[[StepContext], None]:
        module, _, name = self.entry.partition(":")
        fn: Callable[[StepContext], None] = getattr(importlib.import_module(f"gpucheck.steps.{module}"), name)
        return fn


TORCH = "PyTorch (the CUDA runtime)"
CUPY = "CuPy (the CUDA runtime)"
NVCC = "nvcc and the CUDA runtime"
# name, what it shows, entry, limit on a real GPU, limit in a dry run, needs, analog
_TABLE: list[tuple[str, str, str, float, float, str | None, str | None]] = [
    ("driver", "driver, CUDA, GPU: NVML, nvidia-smi, driver API", "driver:run", 60, 30, None, None),
    (
        "features",
        "driver features present (MPS, NVML memory limits, MIG)",
        "features:run",
        60,
        20,
        None,
        None,
    ),
    ("suite", "the suite's real-GPU tests (pytest -m realgpu)", "suite:run", 150, 60, None, None),
    ("memory-probe", "memory cap 4GiB, driver-API program", "memory:probe", 60, 30, None, None),
    (
        "shares-probe",
        "shares 30/70, 10/90, cap 20%, syncing 30/70 drained and queued, 1 and 4 kernels (driver API)",
        "shares:probe",
        120,
        60,
        None,
        None,
    ),
    ("graphs-probe", "CUDA graphs held to 30/70 (driver API)", "shares:graphs_probe", 60, 30, None, None),
    ("online-probe", "online p99 next to offline (driver API)", "online:probe", 60, 40, None, None),
    ("overhead", "launch, alloc/free cost (bench/overhead.py)", "overhead:run", 90, 60, None, None),
    ("startup", "process start-up, 1 and 64 at once", "startup:run", 120, 60, None, None),
    ("timeslice", "the GPU's time slice and switch cost", "timeslice:run", 45, 30, None, None),
    ("handover", "a hand-over queued on the GPU or told after the sync", "handover:run", 110, 60, None, None),
    ("memory-torch", "memory cap 4GiB, unmodified PyTorch", "memory:torch", 60, 10, TORCH, "memory-probe"),
    ("memory-cupy", "memory cap 4GiB, unmodified CuPy", "memory:cupy", 60, 10, CUPY, "memory-probe"),
    ("memory-nvcc", "memory cap 4GiB, nvcc-built cudaMalloc", "memory:nvcc", 90, 10, NVCC, "memory-probe"),
    (
        "shares-torch",
        "shares 30/70, 10/90, cap 20% (PyTorch matmul)",
        "shares:torch",
        120,
        10,
        TORCH,
        "shares-probe",
    ),
    (
        "graphs-torch",
        "torch.cuda.graph replay held to 30/70",
        "shares:graphs_torch",
        60,
        10,
        TORCH,
        "graphs-probe",
    ),
    (
        "online-torch",
        "PyTorch inference p99 next to training",
        "online:torch",
        100,
        10,
        TORCH,
        "online-probe",
    ),
    (
        "online-torch-mps",
        "the same under MPS: offline a BELOW_NORMAL client",
        "online:torch_mps",
        90,
        10,
        TORCH,
        "online-probe",
    ),
    ("settings", "the GPU's settings as found, nothing left", "settings:run", 30, 20, None, None),
]
STEPS: list[Step] = [Step(*row) for row in _TABLE]
BY_NAME = {s.name: s for s in STEPS}
