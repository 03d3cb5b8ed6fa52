"""The steps of the check, in the order they run.

Each step is a function of one module here taking a StepContext. `needs` names the CUDA-runtime
programs a step launches (PyTorch, CuPy, an nvcc-built program): those cannot run on the
simulated driver, so a dry run reports them as skipped with that reason; `analog` is the
driver-API step whose simulated figures stand beside such a step's real ones. Time limits are
the most a step may take (seconds), on a real GPU and in a dry run; the run's budget can cut
them shorter.
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
STEPS: list[Step] = [
    Step("driver", "driver, CUDA and GPU as NVML, nvidia-smi and the driver API report them", "driver:run", 60, 30),
    Step("features", "driver-level features present (MPS, NVML memory limits, MIG), detected", "features:run", 60, 20),
    Step("suite", "the suite's real-GPU tests (pytest -m realgpu)", "suite:run", 150, 60),
    Step("memory-probe", "memory cap, driver-API program under sharegpu run --memory 4GiB", "memory:probe", 60, 30),
    Step("memory-torch", "memory cap, unmodified PyTorch", "memory:torch", 90, 10, TORCH, "memory-probe"),
    Step("memory-cupy", "memory cap, unmodified CuPy", "memory:cupy", 90, 10, "CuPy (the CUDA runtime)", "memory-probe"),
    Step("memory-nvcc", "memory cap, an nvcc-built cudaMalloc program", "memory:nvcc", 120, 10, "nvcc and the CUDA runtime", "memory-probe"),
    Step("shares-probe", "compute shares 30/70, 10/90, cap 20% alone (driver-API loops)", "shares:probe", 90, 60),
    Step("shares-torch", "compute shares 30/70, 10/90, cap 20% alone (PyTorch matmul loops)", "shares:torch", 150, 10, TORCH, "shares-probe"),
    Step("graphs-probe", "CUDA graph launches held to a 30/70 share (driver API)", "shares:graphs_probe", 60, 30),
    Step("graphs-torch", "torch.cuda.graph replay held to a 30/70 share", "shares:graphs_torch", 90, 10, TORCH, "graphs-probe"),
    Step("online-probe", "online requests next to an offline job: p99 alone, sharegpu, time-slicing", "online:probe", 60, 40),
    Step("online-torch", "PyTorch inference next to PyTorch training: p99 alone, sharegpu, time-slicing", "online:torch", 150, 10, TORCH, "online-probe"),
    Step("overhead", "launch and alloc/free cost with and without the shim (bench/overhead.py)", "overhead:run", 90, 60),
    Step("startup", "process start-up under the shim, 1 and 64 processes at once", "startup:run", 120, 60),
    Step("timeslice", "the GPU's time slice and context-switch cost between two processes", "timeslice:run", 45, 30),
    Step("settings", "the GPU's settings as found, nothing left behind", "settings:run", 30, 20),
]
BY_NAME = {s.name: s for s in STEPS}
