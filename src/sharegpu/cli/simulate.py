"""`sharegpu simulate`: replay a pod trace with placement policies (docs/placement.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table

from sharegpu.cli.render import Format, OutputOpt, emit

app = typer.Typer()


@app.command(
    help="Replay a pod trace on a node list with placement policies and report the GPU allocation "
    "ratio at each level of arrived demand (the method of the FGD paper, ATC'23).\n\n"
    "Example: sharegpu simulate --trace openb_pod_list_default.csv "
    "--nodes openb_node_list_all_node.csv --policy fgd --policy ours --plot alloc.png"
)
def simulate(  # noqa: PLR0917 (typer maps parameters to options)
    trace: Annotated[Path, typer.Option("--trace", help="Pod list CSV (openb_pod_list_*.csv format).")],
    nodes: Annotated[Path, typer.Option("--nodes", help="Node list CSV (openb_node_list_*.csv format).")],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="Policy; repeat for several, or 'all'. Default: sharegpu."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the resampling (and of random ties).")] = 42,
    demand: Annotated[
        float, typer.Option("--demand", help="Stop when arrived GPU demand reaches this x capacity.")
    ] = 1.3,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw allocation ratio vs arrived demand to this PNG.")
    ] = None,
    output: OutputOpt = Format.table,
) -> None:
    from sharegpu.placement.policies import POLICIES, make_policy
    from sharegpu.sim import load_nodes, load_pods
    from sharegpu.sim import simulate as run_sim

    names = [n for p in policy or ["sharegpu"] for n in (POLICIES if p == "all" else [p])]
    names = list(dict.fromkeys(make_policy(n).name for n in names))
    node_list, node_report = load_nodes(nodes)
    pods, pod_report = load_pods(trace, node_list)
    for report in (node_report, pod_report):
        for line in report.examples:
            print(f"sharegpu: skipped {line}", file=sys.stderr)
        if report.skipped_total > len(report.examples):
            print(
                f"sharegpu: {report.path}: {report.skipped_total} rows skipped in all "
                f"({', '.join(f'{k}: {v}' for k, v in report.skipped.items())})",
                file=sys.stderr,
            )
    results = [run_sim(node_list, pods, name, seed, target=demand) for name in names]
    if plot is not None:
        from sharegpu.sim.plot import plot_allocation

        plot_allocation(results, plot, title=f"{trace.name} on {nodes.name}, seed {seed}")
    items = [
        {
            "policy": r.policy,
            "seed": r.seed,
            "nodes": r.nodes,
            "gpus": r.gpus,
            "capacity_milli": r.capacity_milli,
            "arrived_pods": r.arrived_pods,
            "failed_pods": r.failed_pods,
            "trace": pod_report.as_dict(),
            "node_list": node_report.as_dict(),
            "points": [
                {
                    "demand": p.demand,
                    "allocation_ratio": p.allocation_ratio,
                    "fragmentation_ratio": p.fragmentation_ratio,
                    "failed_pods": p.failed_pods,
                    "failed_gpu_milli": p.failed_gpu_milli,
                    "arrived_pods": p.arrived_pods,
                }
                for p in r.points
            ],
        }
        for r in results
    ]
    header = (
        f"{trace.name}: {pod_report.loaded} pods ({pod_report.skipped_total} skipped) on {nodes.name}: "
        f"{results[0].nodes} nodes, {results[0].gpus} GPUs; seed {seed}"
    )
    emit(output, "Simulation", items, lambda wide: _table(header, names, results, demand, plot))


def _table(
    header: str, names: list[str], results: list[Any], demand: float, plot: Path | None
) -> RenderableType:
    table = Table("ARRIVED", *(n.upper() for n in names), box=None)
    levels = sorted({round(x / 10, 1) for x in range(1, int(demand * 10) + 1)} | {1.0, demand})
    for level in levels:
        table.add_row(
            f"{level * 100:.0f}%",
            *(f"{r.at(level).allocation_ratio * 100:.2f}%" for r in results),
        )
    table.add_row("frag @100%", *(f"{r.at(1.0).fragmentation_ratio * 100:.2f}%" for r in results))
    table.add_row("failed pods", *(str(r.failed_pods) for r in results))
    return Group(header, table, *([f"plot: {plot}"] if plot is not None else []))
