"""Compute isolation in containers against the same work on the bare host, side by side.

    python bench/container_isolation.py [--runs 5] [--json]     (as root, with podman + runc)

1. Accuracy: two saturating tenants at 30/70, once as two processes on the host (`sharegpu run`'s
   tenants) and once as two Podman containers of the CDI shapes `gpu0-1GiB-30` and
   `gpu0-1GiB-70` (each probe pid 1 of its own pid namespace, its tenant made by the hooks).
   Achieved share of each (from the probe: GPU time of its kernels / wall time) against the
   configured one. Goal: within 1 point in containers too, and no token taken back from a live
   holder (reclaims 0).
2. Online next to offline: an online tenant's burst latency (p50/p99: 4 x 1 ms kernels every
   30 ms) next to a saturating offline one, both at 50%, on the host and in two containers
   (`gpu0-1GiB-50-online`, `gpu0-1GiB-50-offline`). Goal: the container's p99 as the host's.

Host and container runs alternate within each of --runs rounds; figures are medians. All
figures: simulated GPU, this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _node import Node, parse, simulated_node, start_at, write_cdi_spec
from isolation import ONLINE, run_together, saturate_args
from sharegpu.arbiter import read_arbiter
from sharegpu.runtime.rootfs import build_rootfs
from sharegpu.spec import ComputeSpec

RUN_FLAGS = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
SPLIT = (30, 70)
SECONDS = 3.0
CONTAINER_LEAD_S = 6.0  # two container starts with their hooks, on a loaded 2-core machine
SHAPES = [f"gpu0-1GiB-{p}" for p in SPLIT] + ["gpu0-1GiB-50-online", "gpu0-1GiB-50-offline"]


def in_containers(rootfs: Path, jobs: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Each (shape, probe args) in its own container, all from one start instant."""
    at = str(start_at(CONTAINER_LEAD_S))
    podman = ["podman", "--runtime", "runc", "run", "--rm", *RUN_FLAGS]
    procs = [
        subprocess.Popen(
            [*podman, "--device", f"sharegpu.io/vgpu={shape}", "--rootfs", str(rootfs), "sgprobe", *args, at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for shape, args in jobs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"container probe failed ({proc.returncode}): {err.strip()}")
        results.append(parse(out))
    return results


def measure(node: Node, rootfs: Path, runs: int) -> dict[str, dict[str, float]]:
    online_args = ["bursts", str(ONLINE["bursts"]), str(ONLINE["period_ms"]), str(ONLINE["kernels"])]
    online_args.append(str(ONLINE["us"]))
    window = ONLINE["bursts"] * ONLINE["period_ms"] / 1000
    figures: dict[str, dict[str, list[float]]] = {"host": {}, "containers": {}}

    def add(where: str, key: str, value: float) -> None:
        figures[where].setdefault(key, []).append(value)

    for _ in range(runs):
        node.clear_tenants()
        envs = [node.tenant_env(f"t{p}", ComputeSpec.parse(f"{p}%")) for p in SPLIT]
        before = read_arbiter(node.arbiter())
        host = run_together(node, [(env, saturate_args(SECONDS)) for env in envs])
        mid = read_arbiter(node.arbiter())
        boxed = in_containers(rootfs, [(f"gpu0-1GiB-{p}", saturate_args(SECONDS)) for p in SPLIT])
        after = read_arbiter(node.arbiter())
        for where, got, reclaims in (
            ("host", host, mid.reclaims - before.reclaims),
            ("containers", boxed, after.reclaims - mid.reclaims),
        ):
            for pct, values in zip(SPLIT, got, strict=True):
                add(where, f"achieved_{pct}", float(values["achieved"]) * 100)
            add(where, "reclaims", reclaims)
        node.clear_tenants()
        online = node.tenant_env("online", ComputeSpec.parse("50%", priority="online"))
        offline = node.tenant_env("offline", ComputeSpec.parse("50%", priority="offline"))
        on, _ = run_together(node, [(online, online_args), (offline, saturate_args(window))])
        add("host", "online_p50", float(on["p50_us"]))
        add("host", "online_p99", float(on["p99_us"]))
        on, _ = in_containers(
            rootfs, [("gpu0-1GiB-50-online", online_args), ("gpu0-1GiB-50-offline", saturate_args(window))]
        )
        add("containers", "online_p50", float(on["p50_us"]))
        add("containers", "online_p99", float(on["p99_us"]))
    return {
        where: {k: (sum(v) if k == "reclaims" else statistics.median(v)) for k, v in found.items()}
        for where, found in figures.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with simulated_node(memory_mib=81920, gpus=1) as node, tempfile.TemporaryDirectory() as tmp:
        rootfs = build_rootfs(Path(tmp) / "rootfs")
        spec = write_cdi_spec(node, *SHAPES)
        try:
            found = measure(node, rootfs, args.runs)
        finally:
            spec.unlink(missing_ok=True)
    if args.json:
        print(json.dumps(found))
        return 0
    host, boxed = found["host"], found["containers"]
    print(f"Compute 30/70, host processes vs Podman containers (median of {args.runs}) — simulated GPU")
    head = f"{'tenant':<10}{'host %':>9}{'containers %':>14}{'error host':>12}{'error ctr':>11}"
    print(f"{head}{'goal':>6}{'met':>5}")
    for pct in SPLIT:
        h, c = host[f"achieved_{pct}"], boxed[f"achieved_{pct}"]
        met = "yes" if abs(c - pct) <= 1 else "NO"
        print(f"{pct:>3}%{'':<6}{h:>9.1f}{c:>14.1f}{h - pct:>+12.1f}{c - pct:>+11.1f}{'<=1':>6}{met:>5}")
    reclaims = f"host {host['reclaims']:.0f}, containers {boxed['reclaims']:.0f}"
    print(f"reclaims from live holders: {reclaims} (goal 0)")
    print()
    print("Online (50%) next to offline (50%) saturating: online burst latency — simulated GPU")
    print(f"{'where':<12}{'p50 us':>9}{'p99 us':>9}{'p99 ratio':>11}")
    for where, values in (("host", host), ("containers", boxed)):
        ratio = values["online_p99"] / host["online_p99"]
        print(f"{where:<12}{values['online_p50']:>9.0f}{values['online_p99']:>9.0f}{ratio:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
