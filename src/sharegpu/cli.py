"""The `sharegpu` command.

Every deliberate error (sharegpu.errors) is printed as one line, ``sharegpu: error: ...``, with
exit status 2 for bad input, 127 for a command that does not exist and 1 for anything
else; a traceback only with SHAREGPU_DEBUG=1.
JSON output is stable for scripts and carries ``"version": 1``.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sharegpu import __version__
from sharegpu.errors import SharegpuError

if TYPE_CHECKING:
    from sharegpu.report import DeviceReport

JSON_VERSION = 1

app = typer.Typer(
    name="sharegpu",
    help="Share one NVIDIA GPU between many containers: memory caps and compute shares per tenant.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
simgpu_app = typer.Typer(
    help="The simulated GPU used by tests, benchmarks and the demo.", no_args_is_help=True
)
app.add_typer(simgpu_app, name="simgpu")

# Piped output (scripts, CI logs) is not cut at 80 columns: tables keep whole UUIDs.
console = Console(width=None if sys.stdout.isatty() else 200)


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="Output format.")]


def _emit_json(kind: str, items: list[dict[str, Any]]) -> None:
    print(json.dumps({"version": JSON_VERSION, "kind": kind, "items": items}, indent=2))


def _size(n: int) -> str:
    from sharegpu.spec import format_size

    return format_size(n) if n else "0"


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run COMMAND as a tenant with a memory cap and a compute share on each GPU it uses.\n\n"
    "Example: sharegpu run --memory 4GiB --compute 30% -- python train.py",
)
def run(  # noqa: PLR0917 (typer maps parameters to options)
    memory: Annotated[
        str, typer.Option("--memory", "-m", help="Memory cap per GPU, e.g. 512MiB, 4GiB, 1.5GiB.")
    ],
    command: Annotated[
        list[str] | None, typer.Argument(help="The command and its arguments, after --.")
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", "-g", help="GPU index or UUID; repeat for several. Default: all."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Tenant name (default run-<pid>).")] = None,
    compute: Annotated[
        str | None,
        typer.Option(
            "--compute", "-c", help="Share of GPU time, 1%-100%: the share, the cap or the guarantee."
        ),
    ] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="share (default) | cap | burst | native (memory only).")
    ] = None,
    ceiling: Annotated[
        str | None, typer.Option("--ceiling", help="burst only: most GPU time when idle.")
    ] = None,
    priority: Annotated[
        str | None, typer.Option("--priority", help="online | normal (default) | offline.")
    ] = None,
    weight: Annotated[
        int | None, typer.Option("--weight", help="Tie-break weight within a class (1-1000).")
    ] = None,
) -> None:
    from sharegpu.runtime.run import RunRequest
    from sharegpu.runtime.run import run as run_tenant
    from sharegpu.spec import ComputeSpec, GpuSelector, parse_memory_cap

    request = RunRequest(
        command=command or [],
        memory_bytes=parse_memory_cap(memory),
        gpus=[GpuSelector.parse(g) for g in gpu or []],
        name=name,
        compute=ComputeSpec.parse(compute, policy, ceiling, priority, weight),
    )
    raise typer.Exit(run_tenant(request))


@app.command(help="List the GPUs of this node as NVML reports them.")
def devices(output: OutputOpt = Output.table) -> None:
    from sharegpu.devices import list_gpus

    gpus = list_gpus()
    if output is Output.json:
        _emit_json(
            "DeviceList",
            [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "memory_total_bytes": g.memory_total,
                    "memory_used_bytes": g.memory_used,
                    "utilization_pct": g.utilization_pct,
                }
                for g in gpus
            ],
        )
        return
    table = Table("INDEX", "UUID", "NAME", "MEMORY USED / TOTAL", "UTIL", box=None)
    for g in gpus:
        table.add_row(
            str(g.index),
            g.uuid,
            g.name,
            f"{_size(g.memory_used)} / {_size(g.memory_total)}",
            f"{g.utilization_pct}%",
        )
    console.print(table)


def _pct(permille: int) -> str:
    return f"{permille / 10:g}%"


def _configured(d: DeviceReport) -> str:
    if d.policy == "native":
        return "native"
    if d.policy == "burst":
        return f"burst {_pct(d.share_permille)}-{_pct(d.ceiling_permille)}"
    return f"{d.policy} {_pct(d.share_permille)}"


@app.command(help="List the tenants on this node: memory cap and usage, configured and used GPU time.")
def tenants(output: OutputOpt = Output.table) -> None:
    from sharegpu.report import node_report

    reports = node_report()
    if output is Output.json:
        _emit_json(
            "TenantList",
            [
                {
                    "id": r.id,
                    "path": str(r.path),
                    "error": r.error,
                    "stale": r.stale,
                    "command": r.command,
                    "age_seconds": round(r.age_s, 3),
                    "devices": [
                        {
                            "uuid": d.uuid,
                            "memory_cap_bytes": d.mem_cap_bytes,
                            "memory_used_bytes": d.mem_used_bytes,
                            "memory_overhead_bytes": d.overhead_bytes,
                            "memory_peak_bytes": d.mem_peak_bytes,
                            "oom_events": d.oom_events,
                            "policy": d.policy,
                            "priority": d.priority,
                            "compute_share_ratio": d.share_permille / 1000,
                            "compute_ceiling_ratio": d.ceiling_permille / 1000,
                            "weight": d.weight,
                            "gpu_time_seconds": d.gpu_time_ns / 1e9,
                            "wait_seconds": d.wait_ns / 1e9,
                            "throttled_seconds": d.throttled_ns / 1e9,
                            "preemptions": d.preemptions,
                            "share_used_ratio": d.share_used,
                        }
                        for d in r.devices
                    ],
                    "processes": [
                        {
                            "pid": p.pid,
                            "alive": p.alive,
                            "memory_bytes": p.mem_bytes,
                            "oom_events": p.oom_events,
                        }
                        for p in r.processes
                    ],
                }
                for r in reports
            ],
        )
        return
    if not reports:
        console.print("no tenants")
        return
    table = Table(
        "TENANT",
        "GPU",
        "PRIORITY",
        "COMPUTE",
        "USED",
        "WAIT",
        "THROTTLED",
        "MEMORY USED / CAP",
        "OOM",
        "PROCS",
        box=None,
    )
    for r in reports:
        name = f"{r.id} (stale)" if r.stale else r.id
        if r.error:
            table.add_row(name, "-", "", "", "", "", "", f"[red]unreadable: {r.error}[/red]", "", "")
            continue
        age = r.age_s or 1.0
        for i, d in enumerate(r.devices):
            table.add_row(
                name if i == 0 else "",
                d.uuid,
                d.priority,
                _configured(d),
                "-" if d.share_used is None else f"{d.share_used * 100:.1f}%",
                f"{d.wait_ns / 1e9 / age * 100:.1f}%",
                f"{d.throttled_ns / 1e9 / age * 100:.1f}%",
                f"{_size(d.mem_used_bytes + d.overhead_bytes)} / {_size(d.mem_cap_bytes)}",
                str(d.oom_events),
                str(r.live_processes) if i == 0 else "",
            )
    console.print(table)


@simgpu_app.command(
    "env",
    help='Print the shell exports that select the simulated GPU: eval "$(sharegpu simgpu env)".',
)
def simgpu_env(
    gpus: Annotated[int | None, typer.Option(help="Number of simulated GPUs (writes a config).")] = None,
    memory: Annotated[
        str | None, typer.Option(help="Memory per simulated GPU, e.g. 16GiB (writes a config).")
    ] = None,
) -> None:
    from sharegpu import simgpu
    from sharegpu.spec import parse_memory_cap
    from sharegpu.tenant import runtime_dir

    config = None
    if gpus is not None or memory is not None:
        defaults = simgpu.SimConfig()
        cfg = simgpu.SimConfig(
            gpus=gpus if gpus is not None else defaults.gpus,
            memory_bytes=parse_memory_cap(memory) if memory else defaults.memory_bytes,
        )
        config = cfg.write(runtime_dir() / "simgpu.json")
    for key, value in simgpu.environment(config=config).items():
        print(f"export {key}={value}")


@simgpu_app.command("reset", help="Clear the simulated GPU's shared state (memory, processes, clocks).")
def simgpu_reset() -> None:
    from sharegpu import simgpu

    removed = simgpu.reset()
    print(f"removed {removed}" if removed else f"nothing to reset ({simgpu.state_path()} does not exist)")


@app.command(help="Show two tenants sharing a simulated GPU with their memory caps enforced.")
def demo() -> None:
    from sharegpu.demo import run_demo

    raise typer.Exit(run_demo(console))


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
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
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
    if as_json:
        _emit_json(
            "Simulation",
            [
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
            ],
        )
        return
    console.print(
        f"{trace.name}: {pod_report.loaded} pods ({pod_report.skipped_total} skipped) on {nodes.name}: "
        f"{results[0].nodes} nodes, {results[0].gpus} GPUs; seed {seed}"
    )
    table = Table("ARRIVED", *(n.upper() for n in names), box=None)
    levels = sorted({round(x / 10, 1) for x in range(1, int(demand * 10) + 1)} | {1.0, demand})
    for level in levels:
        table.add_row(
            f"{level * 100:.0f}%",
            *(f"{r.at(level).allocation_ratio * 100:.2f}%" for r in results),
        )
    table.add_row("frag @100%", *(f"{r.at(1.0).fragmentation_ratio * 100:.2f}%" for r in results))
    table.add_row("failed pods", *(str(r.failed_pods) for r in results))
    console.print(table)
    if plot is not None:
        console.print(f"plot: {plot}")


@app.command(help="Print the version.")
def version() -> None:
    print(f"sharegpu {__version__}")


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except SharegpuError as err:
        if os.environ.get("SHAREGPU_DEBUG"):
            raise
        print(f"sharegpu: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as err:  # usage errors: bad flag, missing option, no such command
        ctx = getattr(err, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        print(f"sharegpu: error: {message}{hint}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
