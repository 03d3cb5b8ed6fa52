"""What the Vulkan layer costs per call, measured side by side with and without it.

Runs native/vklayer/tests/vkprobe.c (`bench N`) on Mesa's lavapipe, the Vulkan driver on the
CPU, under a tenant of lavapipe's device (its deviceUUID as the tenant's GPU):
  * N pairs of vkAllocateMemory + vkFreeMemory of 4 KiB on the device-local heap (ns per pair):
    the layer's device lookup and the charge, re-key and credit in the tenant's ledger;
  * N empty vkQueueSubmit (ns per call) with the GPU's token held (a tenant with a 100% share,
    alone): the arbiter's fast path, and the empty submission of the layer's own fence behind
    each one that lets the arbiter wait for the work (native/vklayer/submit.c).
Each configuration runs ROUNDS times, interleaved (no layer, layer, no layer, ...), so drift of
a loaded machine hits both alike; the table shows medians and the added cost.

Goals (issue 39): the layer adds < 1 µs to an allocation and its free, < 200 ns to a submit.
lavapipe is the driver here, so the figures are the layer's own path and lavapipe's, not a real
GPU's.

    python bench/vulkan.py [--rounds 7] [--calls 200000] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sharegpu import native
from sharegpu.arbiter import ensure_arbiter
from sharegpu.runtime.run import device_limit
from sharegpu.spec import MIB, ComputeSpec
from sharegpu.tenant import create_tenant

REPO = Path(__file__).resolve().parent.parent
GOALS_NS = {"alloc+free 4 KiB": 1000.0, "submit (empty)": 200.0}
KEYS = {"alloc+free 4 KiB": "alloc_free_ns", "submit (empty)": "submit_ns"}


def parse_kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def build_probe(out: Path) -> Path:
    target = out / "vkprobe"
    simgpu = native.LIB_DIR / "simgpu"
    source = REPO / "native" / "vklayer" / "tests" / "vkprobe.c"
    cmd = ["gcc", "-std=c11", "-D_GNU_SOURCE", f"-I{REPO / 'native' / 'include'}", "-O2", "-o", str(target)]
    subprocess.run([*cmd, str(source), f"-L{simgpu}", "-l:libcuda.so.1", "-lvulkan"], check=True)
    return target


def environments(work: Path, probe: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(without the layer, with it under a tenant of lavapipe's device)."""
    icds = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd.*.json"))
    if not icds:
        sys.exit("bench/vulkan.py: lavapipe is not installed (Debian: mesa-vulkan-drivers)")
    share = native.vulkan_layer_share()
    if share is None:
        sys.exit("bench/vulkan.py: the Vulkan layer is not built (Debian: libvulkan-dev, then make)")
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SHAREGPU_TENANT")}
    plain |= {"VK_ICD_FILENAMES": icds[0], "XDG_RUNTIME_DIR": str(work)}
    plain["LD_LIBRARY_PATH"] = str(native.LIB_DIR / "simgpu")  # vkprobe links libcuda.so.1
    uuid = "GPU-" + parse_kv(run(probe, ["info", "13"], plain))["uuid"]
    limit = device_limit(uuid, 40960 * MIB, ComputeSpec.parse())  # arbitrated: a 100% share
    tenant = create_tenant("vkbench", [limit], root=work / "run")
    ensure_arbiter(work / "run", uuid)
    layered = plain | {
        "LD_PRELOAD": str(native.shim_path()),
        "SHAREGPU_TENANT": str(tenant),
        "SHAREGPU_RUNTIME_DIR": str(work / "run"),
        "SHAREGPU_NO_AGENT": "1",
        "SHAREGPU_VULKAN": "1",
        "XDG_DATA_DIRS": f"{share}:/usr/share",
    }
    return plain, layered


def run(probe: Path, args: list[str], env: dict[str, str]) -> str:
    return subprocess.run([str(probe), *args], env=env, capture_output=True, text=True, check=True).stdout


def measure(rounds: int, calls: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="sharegpu-vkbench-") as tmp:
        work = Path(tmp)
        probe = build_probe(work)
        plain, layered = environments(work, probe)
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for label, env in (("without", plain), ("with", layered)):
                got = parse_kv(run(probe, ["bench", str(calls)], env))
                for call, key in KEYS.items():
                    samples.setdefault((call, label), []).append(float(got[key]))
    rows = []
    for call, goal in GOALS_NS.items():
        without = statistics.median(samples[(call, "without")])
        with_layer = statistics.median(samples[(call, "with")])
        rows.append(
            {
                "call": call,
                "without_ns": round(without, 1),
                "with_ns": round(with_layer, 1),
                "added_ns": round(with_layer - without, 1),
                "goal_added_ns": goal,
                "meets_goal": with_layer - without < goal,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="runs per configuration (median reported)")
    parser.add_argument("--calls", type=int, default=200000, help="calls of each kind per run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = measure(args.rounds, args.calls)
    if args.json:
        print(json.dumps({"driver": "lavapipe", "rounds": args.rounds, "rows": rows}, indent=2))
        return 0
    print(f"Vulkan layer overhead per call — lavapipe (Mesa, CPU), median of {args.rounds} interleaved runs")
    header = f"{'call':<18} {'no layer ns':>12} {'layer ns':>9} {'added ns':>9} {'goal':>7}  met"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['call']:<18} {r['without_ns']:>12.1f} {r['with_ns']:>9.1f} {r['added_ns']:>9.1f} "
            f"{'<' + str(int(r['goal_added_ns'])):>7}  {'yes' if r['meets_goal'] else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
