"""A private simulated-GPU node for benchmarks: its own state, runtime directory and tenants.

Shared by bench/overhead.py and bench/isolation.py so both set up the node, run the probe and
make tenants the same way `sharegpu run` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sharegpu import simgpu
from sharegpu.arbiter import arbiter_path, ensure_arbiter
from sharegpu.native import LIB_DIR, parse_probe_output, probe_path
from sharegpu.runtime.run import device_limit
from sharegpu.spec import MIB, ComputeSpec
from sharegpu.tenant import create_tenant, iter_tenants, remove_tenant


def parse(out: str) -> dict[str, str]:
    return parse_probe_output(out.splitlines())


@dataclass
class Node:
    root: Path
    base_env: dict[str, str]
    uuid: str

    def probe(self, args: Sequence[str], env: dict[str, str] | None = None) -> dict[str, str]:
        proc = subprocess.run(
            [str(probe_path()), *args], env=env or self.base_env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"probe {list(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return parse(proc.stdout)

    def spawn(
        self, args: Sequence[str], env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*prefix, str(probe_path()), *args],
            env=env or self.base_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def tenant_env(self, name: str, compute: ComputeSpec, memory_mib: int = 1024) -> dict[str, str]:
        """Create tenant `name` on GPU 0 (and the GPU's arbiter) as `sharegpu run` does."""
        path = self.root / "run" / "tenants" / name
        if path.exists():
            remove_tenant(path)
        if compute.policy != "native":
            ensure_arbiter(self.root / "run", self.uuid)
        path = create_tenant(
            name, [device_limit(self.uuid, memory_mib * MIB, compute)], root=self.root / "run"
        )
        return self.base_env | {"LD_PRELOAD": str(LIB_DIR / "libsharegpu.so"), "SHAREGPU_TENANT": str(path)}

    def clear_tenants(self) -> None:
        for path in iter_tenants(self.root / "run"):
            remove_tenant(path)

    def arbiter(self) -> Path:
        return arbiter_path(self.root / "run", self.uuid)


@contextmanager
def simulated_node(
    memory_mib: int = 81920, gpus: int = 1, gpu_config: Mapping[str, int] | None = None
) -> Iterator[Node]:
    """A node with its own simulated GPU; `gpu_config` adds keys of its configuration file
    (native/simgpu/README.md: timeslice_us, mps_block_us, ...)."""
    with tempfile.TemporaryDirectory(prefix="sharegpu-bench-") as tmp:
        root = Path(tmp)
        config: dict[str, int] = {"gpus": gpus, "memory_mib": memory_mib, **(gpu_config or {})}
        (root / "simgpu.json").write_text(json.dumps(config))
        drop = ("LD_PRELOAD", "SHAREGPU_TENANT", *simgpu.ENGINE_ENV, "CUDA_MPS_CLIENT_PRIORITY")
        base = {k: v for k, v in os.environ.items() if k not in drop}
        base |= {
            "LD_LIBRARY_PATH": str(LIB_DIR / "simgpu"),
            "SIMGPU_STATE": str(root / "simgpu.state"),
            "SIMGPU_CONFIG": str(root / "simgpu.json"),
        }
        uuid = parse(
            subprocess.run(
                [str(probe_path()), "info"], env=base, capture_output=True, text=True, check=True
            ).stdout
        )["dev0.uuid"]
        yield Node(root=root, base_env=base, uuid=uuid)


@contextmanager
def real_node() -> Iterator[Node]:
    """This machine's own GPU through its driver (never the simulated one), with tenants in a
    private runtime directory: for the benchmarks' --real runs and gpu-check."""
    with tempfile.TemporaryDirectory(prefix="sharegpu-bench-") as tmp:
        sim = (LIB_DIR / "simgpu").resolve()
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "SHAREGPU_TENANT") and not k.startswith("SIMGPU_")
        }
        paths = [p for p in base.get("LD_LIBRARY_PATH", "").split(":") if p and Path(p).resolve() != sim]
        base["LD_LIBRARY_PATH"] = ":".join(paths)
        if not paths:
            del base["LD_LIBRARY_PATH"]
        yield node_on(Path(tmp), base)


def node_on(root: Path, env: dict[str, str]) -> Node:
    """A node over `env`'s driver with its tenants under `root`."""
    info = subprocess.run([str(probe_path()), "info"], env=env, capture_output=True, text=True, check=False)
    if info.returncode != 0:
        raise RuntimeError(f"sgprobe info failed ({info.returncode}): {info.stderr.strip()}")
    return Node(root=root, base_env=env, uuid=parse(info.stdout)["dev0.uuid"])


def start_at(delay: float = 0.5) -> int:
    """A common CLOCK_MONOTONIC start instant, far enough ahead for every process to be ready."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(delay * 1e9)


def write_cdi_spec(node: Node, *shapes: str) -> Path:
    """The node's CDI spec with these shapes, in /var/run/cdi under a name of its own (Podman
    4.3 reads no other directory); the caller removes it."""
    spec = Path("/var/run/cdi") / f"sharegpu-bench-{uuid.uuid4().hex[:8]}.json"
    env = node.base_env | {"SHAREGPU_RUNTIME_DIR": str(node.root / "run"), "SHAREGPU_NO_AGENT": "1"}
    args = [a for shape in shapes for a in ("--shape", shape)]
    gen = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "cdi", "generate", *args, "--output", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if gen.returncode != 0:
        raise RuntimeError(f"cdi generate failed: {gen.stderr.strip()}")
    return spec
