"""Containers with a vGPU: what the CDI device costs a container's start, and what the shim
costs each process at start-up.

    python bench/containers.py [--starts 20] [--rounds 5] [--json]     (as root, with podman + runc)

1. Container start: `podman run --rm --rootfs R /bin/true` with no device, with a tenant's
   device (`sharegpu.io/vgpu=<tenant>`: mounts only) and with a shape device
   (`sharegpu.io/vgpu=gpu0-1GiB-30`: its hooks create the container's tenant, mount it, and
   remove it at stop), interleaved, `--starts` of each; p50 and p99 wall time of `podman run`.
2. Process start-up: N processes of `sgprobe meminfo` (cuInit, a context, cuMemGetInfo) started
   at once, with and without the shim, on one tenant, for N = 1, 16, 64; p99 of the
   processes' wall times, the median of `--rounds` rounds. Goal: under 1 ms added at 64.

All figures: simulated GPU, this machine (a 2-core VM in CI); container starts include
Podman's own work, which dominates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _node import Node, simulated_node
from sharegpu.native import probe_path
from sharegpu.runtime.rootfs import build_rootfs
from sharegpu.spec import ComputeSpec

RUN_FLAGS = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
SHAPE = "gpu0-1GiB-30"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def podman_start(rootfs: Path, device: str | None) -> float:
    cmd = ["podman", "--runtime", "runc", "run", "--rm", *RUN_FLAGS]
    cmd += ["--device", f"sharegpu.io/vgpu={device}"] if device else []
    began = time.perf_counter()
    proc = subprocess.run(
        [*cmd, "--rootfs", str(rootfs), "/bin/true"], capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"podman run ({device or 'no device'}) failed: {proc.stderr.strip()}")
    return took * 1000


def container_starts(node: Node, rootfs: Path, starts: int) -> dict[str, list[float]]:
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    node.tenant_env(tenant, ComputeSpec.parse(compute="50"), memory_mib=1024)
    spec = Path("/var/run/cdi") / f"sharegpu-bench-{uuid.uuid4().hex[:8]}.json"
    env = node.base_env | {"SHAREGPU_RUNTIME_DIR": str(node.root / "run"), "SHAREGPU_NO_AGENT": "1"}
    gen = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "cdi", "generate", "--shape", SHAPE, "--output", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if gen.returncode != 0:
        raise RuntimeError(f"cdi generate failed: {gen.stderr.strip()}")
    modes = {"no device": None, "tenant device": tenant, "shape device (hooks)": SHAPE}
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for device in modes.values():
            podman_start(rootfs, device)  # warm Podman's storage and caches
        for _ in range(starts):
            for mode, device in modes.items():
                times[mode].append(podman_start(rootfs, device))
    finally:
        spec.unlink(missing_ok=True)
    return times


def startup_p99(node: Node, n: int, env: dict[str, str]) -> float:
    """p99 wall time (ms) of n probe processes started at once."""
    began = time.perf_counter()
    procs = [
        subprocess.Popen(
            [str(probe_path()), "meminfo"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for _ in range(n)
    ]
    took = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"probe failed: {err.decode().strip()}")
        took.append((time.perf_counter() - began) * 1000)
    return pct(took, 0.99)


def process_startup(node: Node, rounds: int) -> dict[int, tuple[float, float]]:
    shim = node.tenant_env("startup", ComputeSpec.parse(compute="50"), memory_mib=4096)
    out = {}
    for n in (1, 16, 64):
        bare, with_shim = [], []
        for _ in range(rounds):
            bare.append(startup_p99(node, n, node.base_env))
            with_shim.append(startup_p99(node, n, shim))
        out[n] = (statistics.median(bare), statistics.median(with_shim))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with simulated_node(memory_mib=81920, gpus=1) as node, tempfile.TemporaryDirectory() as tmp:
        rootfs = build_rootfs(Path(tmp) / "rootfs")
        starts = container_starts(node, rootfs, args.starts)
        startup = process_startup(node, args.rounds)
    if args.json:
        print(json.dumps({"starts_ms": starts, "startup_p99_ms": {str(k): v for k, v in startup.items()}}))
        return 0
    base = starts["no device"]
    print(f"Container start (podman + runc, {args.starts} each, interleaved) — simulated GPU")
    print(f"{'device':<24}{'p50 ms':>9}{'p99 ms':>9}{'p50 added':>11}{'ratio':>8}")
    base50 = pct(base, 0.5)
    for mode, values in starts.items():
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        print(f"{mode:<24}{p50:>9.1f}{p99:>9.1f}{p50 - base50:>+11.1f}{p50 / base50:>8.2f}")
    print()
    print(f"Process start-up, N at once (p99 of wall time, median of {args.rounds} rounds) — simulated GPU")
    print(f"{'N':>4}{'no shim ms':>12}{'shim ms':>10}{'added ms':>10}{'goal':>8}{'met':>5}")
    for n, (bare, shim) in startup.items():
        added = shim - bare
        goal = "<1" if n == 64 else ""
        met = ("yes" if added < 1 else "NO") if n == 64 else ""
        print(f"{n:>4}{bare:>12.2f}{shim:>10.2f}{added:>+10.2f}{goal:>8}{met:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
