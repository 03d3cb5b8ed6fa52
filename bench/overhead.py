"""What the interposer costs per call, measured side by side with and without it.

Runs the driver-API probe on the simulated GPU:
  * `cycle plain 1MiB N`  — N cuMemAlloc_v2 + cuMemFree_v2 pairs (ns per pair);
  * `launchbench N`       — N cuLaunchKernel of a 0 µs kernel (ns per launch call).
Each configuration runs ROUNDS times, interleaved (no shim, shim, no shim, ...), so drift of a
loaded machine hits both alike; the table shows medians and the added cost.

Goals (issue #2): the shim adds < 1 µs to an alloc/free pair and < 100 ns to a launch.
All figures come from the simulated GPU: they measure the interposer's own code path and the
simulated driver's, not a real GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sharegpu.native import LIB_DIR, probe_path
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant


def _run_probe(args: list[str], env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [str(probe_path()), *args], env=env, capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="runs per configuration (median reported)")
    parser.add_argument("--pairs", type=int, default=20000, help="alloc/free pairs per run")
    parser.add_argument("--launches", type=int, default=50000, help="launches per run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sharegpu-bench-") as tmp:
        work = Path(tmp)
        (work / "simgpu.json").write_text(json.dumps({"gpus": 1, "memory_mib": 81920}))
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SHAREGPU_TENANT")}
        base |= {
            "LD_LIBRARY_PATH": str(LIB_DIR / "simgpu"),
            "SIMGPU_STATE": str(work / "simgpu.state"),
            "SIMGPU_CONFIG": str(work / "simgpu.json"),
        }
        uuid = _run_probe(["info"], base)["dev0.uuid"]
        tenant = create_tenant(
            "bench", [DeviceLimit(uuid=uuid, mem_cap_bytes=40960 * MIB)], root=work / "run"
        )
        shim = base | {
            "LD_PRELOAD": str(LIB_DIR / "libsharegpu.so"),
            "SHAREGPU_TENANT": str(tenant),
        }

        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for label, env in (("without shim", base), ("with shim", shim)):
                pair = float(_run_probe(["cycle", "plain", "1048576", str(args.pairs)], env)["ns_per_pair"])
                launch = float(_run_probe(["launchbench", str(args.launches)], env)["ns_per_launch"])
                samples.setdefault(("alloc+free pair", label), []).append(pair)
                samples.setdefault(("launch (0 µs kernel)", label), []).append(launch)

    rows = []
    for what, goal in (("alloc+free pair", 1000.0), ("launch (0 µs kernel)", 100.0)):
        without = statistics.median(samples[(what, "without shim")])
        with_shim = statistics.median(samples[(what, "with shim")])
        rows.append(
            {
                "call": what,
                "without_ns": round(without, 1),
                "with_ns": round(with_shim, 1),
                "added_ns": round(with_shim - without, 1),
                "ratio": round(with_shim / without, 3) if without else None,
                "goal_added_ns": goal,
                "meets_goal": with_shim - without < goal,
            }
        )
    if args.json:
        print(json.dumps({"source": "simulated GPU", "rounds": args.rounds, "rows": rows}, indent=2))
        return 0
    print(f"Interposer overhead per call — simulated GPU, median of {args.rounds} interleaved runs")
    header = f"{'call':<22} {'no shim ns':>11} {'shim ns':>9} {'added ns':>9} {'ratio':>7} {'goal':>9}  met"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['call']:<22} {r['without_ns']:>11.1f} {r['with_ns']:>9.1f} {r['added_ns']:>9.1f} "
            f"{r['ratio']:>7.3f} {'<' + str(int(r['goal_added_ns'])):>9}  "
            f"{'yes' if r['meets_goal'] else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
