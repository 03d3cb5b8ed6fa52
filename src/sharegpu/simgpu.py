"""The simulated GPU seen from Python: where its state lives, how to select it, how to reset it.

The simulated ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (native/simgpu) keep one shared state
file that every process on the machine maps; this module only locates, configures and removes
it. Figures measured on it are simulated, never GPU figures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sharegpu.errors import SpecError
from sharegpu.native import simgpu_dir
from sharegpu.spec import MIB

STATE_ENV = "SIMGPU_STATE"
CONFIG_ENV = "SIMGPU_CONFIG"
KERNEL_US_ENV = "SIMGPU_KERNEL_US"
# The engine's settings from the environment, which win over the configuration file when the
# state is created (native/README.md): dropped wherever a node's file is to decide them.
ENGINE_ENV = ("SIMGPU_TIMESLICE_US", "SIMGPU_CTXSW_US", "SIMGPU_PREEMPT_US", "SIMGPU_MPS_BLOCK_US")


def state_path() -> Path:
    """`SIMGPU_STATE`, else /dev/shm/sharegpu-simgpu-<uid> (the default of the C library)."""
    if env := os.environ.get(STATE_ENV):
        return Path(env)
    return Path(f"/dev/shm/sharegpu-simgpu-{os.getuid()}")


def reset() -> Path | None:
    """Remove the shared state; the next process to initialise the simulated driver recreates
    it from the configuration. Returns the removed path, or None if there was none."""
    path = state_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path


@dataclass(frozen=True)
class SimConfig:
    gpus: int = 2
    memory_bytes: int = 80 * 1024 * MIB
    name: str = "sharegpu simulated H100"
    sm_count: int = 132
    context_overhead_bytes: int = 0  # memory each context takes

    def validate(self) -> None:
        if not 1 <= self.gpus <= 16:
            raise SpecError(f"invalid GPU count {self.gpus}: the simulated GPU supports 1 to 16")
        if self.memory_bytes < MIB or self.memory_bytes % MIB:
            raise SpecError("simulated GPU memory must be a positive whole number of MiB")
        if not 1 <= self.sm_count <= 1024:
            raise SpecError(f"invalid SM count {self.sm_count}")
        if self.context_overhead_bytes % MIB or not 0 <= self.context_overhead_bytes < self.memory_bytes:
            raise SpecError("the simulated context overhead must be whole MiB, less than the memory")

    def write(self, path: Path) -> Path:
        self.validate()
        doc = {
            "gpus": self.gpus,
            "memory_mib": self.memory_bytes // MIB,
            "name": self.name,
            "sm_count": self.sm_count,
            "context_overhead_mib": self.context_overhead_bytes // MIB,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc) + "\n")
        return path


def without(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for the machine's own driver: the simulated GPU's variables dropped and its
    directory taken off the library path (the variable too when nothing else is left)."""
    sim = simgpu_dir().resolve()
    out = {k: v for k, v in env.items() if not k.startswith("SIMGPU_")}
    paths = [p for p in out.get("LD_LIBRARY_PATH", "").split(":") if p and Path(p).resolve() != sim]
    if paths:
        out["LD_LIBRARY_PATH"] = ":".join(paths)
    else:
        out.pop("LD_LIBRARY_PATH", None)
    return out


def environment(state: Path | None = None, config: Path | None = None) -> dict[str, str]:
    """Variables that make CUDA and NVML programs use the simulated GPU."""
    lib = str(simgpu_dir())
    current = os.environ.get("LD_LIBRARY_PATH", "")
    parts = [lib] + [p for p in current.split(":") if p and p != lib]
    env = {"LD_LIBRARY_PATH": ":".join(parts)}
    if state is not None:
        env[STATE_ENV] = str(state)
    if config is not None:
        env[CONFIG_ENV] = str(config)
    return env
