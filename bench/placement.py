"""Placement policies replayed on the Alibaba GPU trace, side by side, in one run.

Every policy x every pod list of the data folder x seeds 42-51, with the method of Weng et al.
(ATC'23): pods resampled with replacement until GPU demand reaches 130% of capacity, shuffled,
placed one at a time on the full 1,523-node cluster (openb_node_list_all_node.csv). Prints:

  * allocation ratio (allocated milli-GPU / capacity) at 100% and 130% arrived demand, mean +- sd
    over the seeds, and the unallocated GPUs at 130%, next to the published figures (default trace);
  * sharegpu minus FGD per trace (paired by seed: both replay the same arrivals);
  * the decision latency of each policy (p50, p99 over every decision of one run, on the full
    cluster, caches warmed as a scheduler warms them at start-up).

The trace is read from <repo>/data/alibaba-gpu-v2023 (or --data), where the repository ships it
(public copy: https://github.com/alibaba/clusterdata, cluster-trace-gpu-v2023).
No GPU is involved: these are simulated placements.

  python bench/placement.py                                  # the full run (make bench)
  python bench/placement.py --traces default --seeds 42-43 --policies fgd,ours
  python bench/placement.py --variants                       # the workload variants (one table)
  python bench/placement.py --variants pin20,cpu2 --seeds 42-44
  python bench/placement.py --variants pin20,pin33 --variant-seed 1   # other pods pinned

--variants replays variants of the default pod list (sharegpu.sim.variants: GPU-model pins,
CPU-only share, CPU demand; made in memory from the seed 0 of each spec, as bench/variants.py
writes them, or from --variant-seed) and prints one row per variant: FGD, ours, best-fit and
random at 100% arrived demand, and ours minus FGD paired by seed. The variants marked "tuned"
are those the policy's constants were chosen on; the others are held out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sharegpu.placement.model import Node, Request
from sharegpu.placement.policies import POLICIES, make_policy
from sharegpu.sim import load_nodes, load_pods, simulate
from sharegpu.sim.trace import LoadReport, screen_pods
from sharegpu.sim.variants import make_variant, with_assumed_memory

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "alibaba-gpu-v2023"
NODE_LIST = "openb_node_list_all_node.csv"
PUBLISHED = {  # ATC'23 artifact, default trace, 100% arrived demand, mean of 10 seeds
    "random": 86.30,
    "dot-product": 90.62,
    "gpu-clustering": 91.65,
    "gpu-packing": 91.78,
    "best-fit": 92.86,
    "fgd": 95.23,
}

VARIANTS = (
    "pin5", "pin10", "pin20", "pin25", "pin33",
    "cpuonly0", "cpuonly2", "cpuonly3",
    "cpu0.5", "cpu2", "cpu2.75", "cpu3",
    "pin20+cpuonly2", "cpu2+cpuonly2",
    "cpu2.5", "cpu3.25", "cpu3.5", "cpu4", "cpu3+pin20",
)  # fmt: skip
TUNED = frozenset({"pin10", "pin25", "cpuonly2", "cpuonly3", "cpu2", "cpu3", "cpu2.75", "cpu2+cpuonly2"})
"""Variants the policy's choices were measured on while changing it; every other one is held out."""
VARIANT_POLICIES = ("fgd", "sharegpu", "best-fit", "random")

_loaded: dict[tuple[str, str], tuple[list[Node], list[Request]]] = {}


def traces_in(data: Path) -> list[str]:
    names = sorted(
        p.name.removeprefix("openb_pod_list_").removesuffix(".csv") for p in data.glob("openb_pod_list_*.csv")
    )
    return sorted(names, key=lambda n: (n != "default", n))


def _load(data: str, trace: str) -> tuple[list[Node], list[Request]]:
    """A pod list of the data folder, or ``variant:<spec>[#<variant seed>]`` of the default one."""
    if (data, trace) not in _loaded:
        nodes, _ = load_nodes(Path(data) / NODE_LIST)
        # Tuning runs may use every n-th node (the same mix, n times faster); latency never does.
        every = 1 if trace.endswith("@full") else int(os.environ.get("SHAREGPU_BENCH_EVERY_NTH_NODE", "1"))
        nodes = nodes[::every]
        qos = trace.startswith("qos:")
        spec, _, variant_seed = (
            trace.removeprefix("variant:").removeprefix("qos:").removesuffix("@full").partition("#")
        )
        if "mem" in spec.split("+"):
            nodes = with_assumed_memory(nodes)
        base = "default" if spec != trace else trace
        pods, _ = load_pods(Path(data) / f"openb_pod_list_{base}.csv", nodes, qos=qos)
        if spec not in (trace, "default"):
            made = make_variant(pods, nodes, spec, seed=int(variant_seed or 0))
            pods = screen_pods(enumerate(made), nodes, LoadReport(spec))
        _loaded[(data, trace)] = (nodes, pods)
    return _loaded[(data, trace)]


def run_one(job: tuple[str, str, str, int, bool]) -> dict[str, Any]:
    data, trace, policy, seed, timed = job
    nodes, pods = _load(data, trace)
    t0 = time.perf_counter()
    r = simulate(nodes, pods, policy, seed, time_decisions=timed)
    out: dict[str, Any] = {
        "trace": trace,
        "policy": r.policy,
        "seed": seed,
        "alloc100": r.at(1.0).allocation_ratio * 100,
        "alloc130": r.at(1.3).allocation_ratio * 100,
        "unalloc_gpus130": (r.capacity_milli - r.at(1.3).allocation_ratio * r.capacity_milli) / 1000,
        "frag100": r.at(1.0).fragmentation_ratio * 100,
        "failed": r.failed_pods,
        "seconds": time.perf_counter() - t0,
        "colocation": r.colocation.as_dict() if r.colocation else None,
    }
    if timed:
        ns = np.array(r.decision_ns)
        out |= {"p50_us": float(np.percentile(ns, 50)) / 1e3, "p99_us": float(np.percentile(ns, 99)) / 1e3}
    return out


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def _ms(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:6.2f}"
    return f"{statistics.mean(values):6.2f} ± {statistics.stdev(values):4.2f}"


def run_all(jobs: list[tuple[str, str, str, int, bool]], workers: int) -> list[dict[str, Any]]:
    """Every job on `workers` processes, results in job order; a progress line on stderr (the
    variant table takes 45 minutes on 2 cores, and the tables print only at the end)."""
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        for done, result in enumerate(pool.map(run_one, jobs), 1):
            results.append(result)
            if sys.stderr.isatty() or done == len(jobs) or done % 10 == 0:
                elapsed = time.perf_counter() - t0
                print(f"{done}/{len(jobs)} runs in {elapsed:.0f} s", file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA, help=f"trace folder (default {DATA})")
    parser.add_argument("--traces", default="all", help="pod lists, e.g. default,gpushare40 (default all)")
    parser.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,45")
    parser.add_argument("--policies", default="all", help="e.g. fgd,ours (default all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--json", action="store_true", help="print every run as JSON instead of tables")
    parser.add_argument(
        "--variants",
        nargs="?",
        const=",".join(VARIANTS),
        help=f"replay variants of the default list instead (default: {','.join(VARIANTS)})",
    )
    parser.add_argument(
        "--variant-seed",
        type=int,
        default=0,
        help="seed the variants are drawn with (which pods are pinned, copied; default 0)",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="GPU memory as a second dimension: default list with and without it",
    )
    parser.add_argument(
        "--qos", action="store_true", help="the trace's qos classes as priorities: colocation"
    )
    args = parser.parse_args()
    if args.variants:
        return variants_main(args)
    if args.memory or args.qos:
        return memory_qos_main(args)

    if not (args.data / NODE_LIST).is_file():
        print(
            f"bench/placement.py: the trace is missing: {args.data / NODE_LIST} not found "
            "(it ships in the repository's data/ folder, or pass --data)",
            file=sys.stderr,
        )
        return 2
    available = traces_in(args.data)
    traces = available if args.traces == "all" else args.traces.split(",")
    unknown = [t for t in traces if t not in available]
    if unknown:
        print(
            f"bench/placement.py: no pod list {', '.join(unknown)} in {args.data} "
            f"(have: {', '.join(available)})",
            file=sys.stderr,
        )
        return 2
    policies = (
        list(POLICIES) if args.policies == "all" else [make_policy(p).name for p in args.policies.split(",")]
    )
    seeds = _seeds(args.seeds)
    jobs = [
        (str(args.data), t, p, s, t == traces[0] and s == seeds[0])
        for t in traces
        for p in policies
        for s in seeds
    ]
    # Longest first: the fragmentation-aware policies take the most time per run.
    jobs.sort(key=lambda j: (j[2] not in ("fgd", "sharegpu"), j[1], j[3]))
    t0 = time.perf_counter()
    results = run_all(jobs, args.jobs)
    wall = time.perf_counter() - t0
    # Latency alone, one run at a time, so that the pool's own runs do not inflate it.
    latency = [run_one((str(args.data), traces[0], p, seeds[0], True)) for p in policies]
    if args.json:
        print(json.dumps({"version": 1, "runs": results, "latency": latency, "wall_seconds": wall}, indent=2))
        return 0

    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["trace"], r["policy"]), []).append(r)
    print(
        f"Placement on {NODE_LIST} (1,523 nodes), seeds {args.seeds}, {len(results)} runs in {wall:.0f} s "
        f"with {args.jobs} workers. Simulated placements (no GPU).\n"
    )
    print(
        f"{'trace':<13} {'policy':<15} {'alloc@100% (%)':>16} {'published':>9} {'alloc@130% (%)':>16} "
        f"{'unalloc GPUs@130%':>18} {'frag@100%':>9} {'failed':>7}"
    )
    for t in traces:
        for p in policies:
            rs = by[(t, p)]
            pub = f"{PUBLISHED[p]:.2f}" if t == "default" and p in PUBLISHED else ""
            unalloc = [r["unalloc_gpus130"] for r in rs]
            unalloc_txt = f"{statistics.mean(unalloc):7.1f}" + (
                f" ± {statistics.stdev(unalloc):5.1f}" if len(rs) > 1 else ""
            )
            print(
                f"{t:<13} {p:<15} {_ms([r['alloc100'] for r in rs]):>16} {pub:>9} "
                f"{_ms([r['alloc130'] for r in rs]):>16} {unalloc_txt:>18} "
                f"{statistics.mean(r['frag100'] for r in rs):9.2f} "
                f"{statistics.mean(r['failed'] for r in rs):7.0f}"
            )
        print()
    if "fgd" in policies and "sharegpu" in policies:
        print("sharegpu minus FGD, paired by seed (percentage points of capacity):")
        print(
            f"{'trace':<13} {'@100% mean':>10} {'@100% min':>10} "
            f"{'@130% mean':>10} {'@130% min':>10} {'wins':>6}"
        )
        for t in traces:
            f = {r["seed"]: r for r in by[(t, "fgd")]}
            o = {r["seed"]: r for r in by[(t, "sharegpu")]}
            d100 = [o[s]["alloc100"] - f[s]["alloc100"] for s in seeds]
            d130 = [o[s]["alloc130"] - f[s]["alloc130"] for s in seeds]
            wins = sum(1 for a, b in zip(d100, d130, strict=True) if a > 0 and b > 0)
            print(
                f"{t:<13} {statistics.mean(d100):+10.2f} {min(d100):+10.2f} {statistics.mean(d130):+10.2f} "
                f"{min(d130):+10.2f} {wins:>3}/{len(seeds)}"
            )
        print()
    print(
        f"Decision latency on the full cluster ({traces[0]} trace, seed {seeds[0]}, "
        "every decision of one run, one run at a time, decide + commit):"
    )
    print(f"{'policy':<15} {'p50 (µs)':>9} {'p99 (µs)':>9} {'run (s)':>8}")
    for r in latency:
        print(f"{r['policy']:<15} {r['p50_us']:9.0f} {r['p99_us']:9.0f} {r['seconds']:8.1f}")
    return 0


def variants_main(args: argparse.Namespace) -> int:
    from sharegpu.errors import SpecError
    from sharegpu.sim.variants import cluster_models, parse_variant

    names = ["default", *(v for v in args.variants.split(",") if v and v != "default")]
    nodes, _ = load_nodes(args.data / NODE_LIST)
    try:
        for name in names[1:]:
            parse_variant(name, sorted(cluster_models(nodes)))
    except SpecError as err:
        print(f"bench/placement.py: {err}", file=sys.stderr)
        return 2
    policies = (
        list(VARIANT_POLICIES)
        if args.policies == "all"
        else [make_policy(p).name for p in args.policies.split(",")]
    )
    seeds = _seeds(args.seeds)
    drawn = f"#{args.variant_seed}" if args.variant_seed else ""
    jobs = [
        (str(args.data), f"variant:{v}{drawn}", p, s, False) for v in names for p in policies for s in seeds
    ]
    jobs.sort(key=lambda j: (j[2] not in ("fgd", "sharegpu"), j[1], j[3]))
    t0 = time.perf_counter()
    results = run_all(jobs, args.jobs)
    wall = time.perf_counter() - t0
    latency = [
        run_one((str(args.data), "variant:default@full", p, seeds[0], True)) for p in ("fgd", "sharegpu")
    ]
    if args.json:
        print(json.dumps({"version": 1, "runs": results, "latency": latency, "wall_seconds": wall}, indent=2))
        return 0
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["trace"].removeprefix("variant:").removesuffix(drawn), r["policy"]), {})[
            r["seed"]
        ] = r
    every = os.environ.get("SHAREGPU_BENCH_EVERY_NTH_NODE", "1")
    where = f"{NODE_LIST} ({len(nodes)} nodes)" if every == "1" else f"every {every}th node of {NODE_LIST}"
    print(
        f"Workload variants of openb_pod_list_default (drawn with seed {args.variant_seed}) on {where}, "
        f"seeds {args.seeds}, {len(results)} runs "
        f"in {wall:.0f} s with {args.jobs} workers. Simulated placements (no GPU).\n"
        "GPU allocation at 100% arrived demand (%), mean over seeds; ours-FGD paired by seed "
        "(mean ± sd, min, wins).\n"
    )
    cols = "".join(f"{p:>10}" for p in policies)
    print(f"{'variant':<16} {'set':<8}{cols} {'ours-FGD':>15} {'min':>7} {'wins':>6}")
    for v in names:
        row = "".join(
            f"{statistics.mean(r['alloc100'] for r in by[(v, p)].values()):10.2f}" for p in policies
        )
        diff = ""
        if "fgd" in policies and "sharegpu" in policies:
            d = [by[(v, "sharegpu")][s]["alloc100"] - by[(v, "fgd")][s]["alloc100"] for s in seeds]
            sd = statistics.stdev(d) if len(d) > 1 else 0.0
            wins = sum(1 for x in d if x > 0)
            diff = f" {statistics.mean(d):+8.2f} ± {sd:4.2f} {min(d):+7.2f} {wins:>3}/{len(d)}"
        kind = "base" if v == "default" else ("tuned" if v in TUNED else "held")
        print(f"{v:<16} {kind:<8}{row}{diff}")
    print()
    print(f"Decision latency (default list, seed {seeds[0]}, every decision of one run, decide + commit):")
    print(f"{'policy':<15} {'p50 (µs)':>9} {'p99 (µs)':>9} {'run (s)':>8}")
    for r in latency:
        print(f"{r['policy']:<15} {r['p50_us']:9.0f} {r['p99_us']:9.0f} {r['seconds']:8.1f}")
    return 0


def memory_qos_main(args: argparse.Namespace) -> int:
    """One table for --memory (the ``mem`` variant: pods ask GPU memory, sim.variants' rule) or
    --qos (priorities from the qos column, with the colocation at 100% arrived demand)."""
    policies = ["fgd", "sharegpu", "best-fit"] if args.policies == "all" else [
        make_policy(p).name for p in args.policies.split(",")
    ]  # fmt: skip
    seeds = _seeds(args.seeds)
    lists = ["variant:default", "variant:mem"] if args.memory else ["variant:default", "qos:default"]
    jobs = [(str(args.data), t, p, s, False) for t in lists for p in policies for s in seeds]
    t0 = time.perf_counter()
    results = run_all(jobs, args.jobs)
    wall = time.perf_counter() - t0
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["trace"], r["policy"]), []).append(r)
    what = "GPU memory as a second dimension" if args.memory else "qos classes as priorities"
    print(
        f"{what}: openb_pod_list_default, seeds {args.seeds}, {len(results)} runs in {wall:.0f} s. "
        "Simulated placements (no GPU).\n"
    )
    if args.memory:
        print(f"{'policy':<12} {'alloc@100% compute only':>24} {'alloc@100% with memory':>23} {'failed':>7}")
        for p in policies:
            a, b = by[("variant:default", p)], by[("variant:mem", p)]
            failed = statistics.mean(r["failed"] for r in b)
            print(
                f"{p:<12} {_ms([r['alloc100'] for r in a]):>24} "
                f"{_ms([r['alloc100'] for r in b]):>23} {failed:7.0f}"
            )
        if "fgd" in policies and "sharegpu" in policies:
            print("\nsharegpu minus FGD, paired by seed (points at 100% arrived demand):")
            for t, label in (("variant:default", "compute only"), ("variant:mem", "with memory")):
                f = {r["seed"]: r["alloc100"] for r in by[(t, "fgd")]}
                d = [r["alloc100"] - f[r["seed"]] for r in by[(t, "sharegpu")]]
                wins = sum(1 for x in d if x > 0)
                print(f"{label:<13} {statistics.mean(d):+6.2f} (min {min(d):+.2f}, wins {wins}/{len(d)})")
        return 0
    print(
        f"{'policy':<12} {'alloc@100% no qos':>18} {'alloc@100% qos':>16} {'online GPUs':>12} "
        f"{'with offline':>13} {'online pods':>12} {'sharing online':>15}"
    )
    for p in policies:
        a, b = by[("variant:default", p)], by[("qos:default", p)]
        col = [r["colocation"] for r in b]
        mean = {k: statistics.mean(c[k] for c in col) for k in col[0]}
        print(
            f"{p:<12} {_ms([r['alloc100'] for r in a]):>18} {_ms([r['alloc100'] for r in b]):>16} "
            f"{mean['online_gpus']:12.0f} {mean['mixed_share'] * 100:12.1f}% {mean['online_pods']:12.0f} "
            f"{mean['online_pods_sharing']:15.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
