"""Write workload variants of an Alibaba pod list as CSV files, seeded and documented.

Each spec (sharegpu.sim.variants: ``pin<P>[:<model>|...]``, ``cpuonly<M>``, ``cpu<M>``, ``mem``,
joined with ``+``) becomes ``openb_pod_list_<spec>.csv`` in --out, in the trace's own columns plus
``gpu_memory_mib``; a spec with ``mem`` also writes the node list with the memory assumed for the
undisclosed models (``openb_node_list_all_node_mem.csv``). Replay one with
``sharegpu simulate --trace OUT/openb_pod_list_pin20.csv --nodes data/.../openb_node_list_all_node.csv``.
bench/placement.py --variants builds the same lists in memory (seed 0).

  python bench/variants.py --out /tmp/variants                      # the benchmark's variants
  python bench/variants.py --out /tmp/variants pin15 cpuonly1.5+cpu2 --seed 3
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from sharegpu.errors import SharegpuError
from sharegpu.sim import load_nodes, load_pods
from sharegpu.sim.variants import cluster_models, make_variant, parse_variant, with_assumed_memory

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "alibaba-gpu-v2023"
DEFAULT_SPECS = ("pin5", "pin10", "pin20", "pin25", "pin33", "cpuonly0", "cpuonly2", "cpuonly3",
                 "cpu0.5", "cpu2", "cpu3", "pin20+cpuonly2", "mem")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("specs", nargs="*", default=list(DEFAULT_SPECS), help="variant specs")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the CSV files to")
    parser.add_argument("--data", type=Path, default=DATA, help=f"trace folder (default {DATA})")
    parser.add_argument("--base", default="default", help="pod list to derive from (default: default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the transformations (default 0)")
    args = parser.parse_args()
    try:
        nodes, _ = load_nodes(args.data / "openb_node_list_all_node.csv")
        specs = [parse_variant(s, sorted(cluster_models(nodes))) for s in args.specs]
        pods, _ = load_pods(args.data / f"openb_pod_list_{args.base}.csv", nodes)
    except SharegpuError as err:
        print(f"bench/variants.py: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        path = args.out / f"openb_pod_list_{spec.text}.csv"
        with path.open("w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(
                ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "gpu_memory_mib"]
            )
            for pod in make_variant(pods, nodes, spec, seed=args.seed):
                out.writerow([
                    pod.name, pod.cpu_milli, pod.host_memory_mib, pod.count,
                    pod.compute_milli if pod.count else 0, "|".join(sorted(pod.models)), pod.memory_mib,
                ])  # fmt: skip
        print(path)
        if spec.gpu_memory:
            node_path = args.out / "openb_node_list_all_node_mem.csv"
            with node_path.open("w", newline="") as handle:
                out = csv.writer(handle)
                out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model", "gpu_memory_mib"])
                for n in with_assumed_memory(nodes):
                    out.writerow([n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model, n.gpu_memory_mib])
            print(node_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
