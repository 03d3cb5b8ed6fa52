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
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sharegpu import __version__, cli_tenant
from sharegpu.errors import SharegpuError

if TYPE_CHECKING:
    from sharegpu.agent.events import Event
    from sharegpu.agent.models import DeviceView

JSON_VERSION = 1

app = typer.Typer(
    name="sharegpu",
    help="Share one NVIDIA GPU between many containers: memory caps and compute shares per tenant.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
simgpu_app = typer.Typer(
    help="The simulated GPU used by tests, benchmarks and the demo.", no_args_is_help=True
)
app.add_typer(simgpu_app, name="simgpu")
cdi_app = typer.Typer(
    help="Container Device Interface: vGPUs as `sharegpu.io/vgpu=<tenant>` devices for Podman, "
    "Docker, containerd and CRI-O.",
    no_args_is_help=True,
)
app.add_typer(cdi_app, name="cdi")
hook_app = typer.Typer(
    help="The OCI hooks the CDI spec names for shape devices (run by the container runtime).",
    no_args_is_help=True,
)
app.add_typer(hook_app, name="hook")

# Piped output (scripts, CI logs) is not cut at 80 columns: tables keep whole UUIDs (the widest,
# `devices -o wide`, is about 240 columns). NO_COLOR (https://no-color.org): no styling at all,
# not even bold; no tty: rich adds none either.
console = Console(
    width=None if sys.stdout.isatty() else 320,
    color_system=None if os.environ.get("NO_COLOR") else "auto",
)


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="Output format.")]


class Format(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


FormatOpt = Annotated[
    Format, typer.Option("--output", "-o", help="table, wide (more columns), json or yaml.")
]
WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="Refresh every --interval seconds until Ctrl-C.")
]
IntervalOpt = Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")]


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
    memory: cli_tenant.MemoryOpt,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command and its arguments, after --.")
    ] = None,
    gpu: cli_tenant.GpuOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="Tenant name (default run-<pid>).")] = None,
    compute: cli_tenant.ComputeOpt = None,
    policy: cli_tenant.PolicyOpt = None,
    ceiling: cli_tenant.CeilingOpt = None,
    priority: cli_tenant.PriorityOpt = None,
    weight: cli_tenant.WeightOpt = None,
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


# One tenant at a time, through the one tenant service (cli_tenant.py).
app.command(
    "create",
    help="Create a tenant for containers to use (the CDI device sharegpu.io/vgpu=NAME): a memory cap "
    "and a compute share on each GPU.\n\n"
    "Example: sharegpu create web --memory 4GiB --compute 30% --owner 1000",
)(cli_tenant.create)
app.command("get", help="Show one tenant: its state, incarnation and limits.\n\nExample: sharegpu get web")(
    cli_tenant.get
)
app.command(
    "delete",
    help="Delete a tenant: refused while processes use it unless --force (a damaged one too).\n\n"
    "Example: sharegpu delete web --force",
)(cli_tenant.delete)


@app.command(
    help="List the GPUs of this node: memory and utilization as NVML reports them, and what the "
    "tenants were given (memory caps, compute guarantees) and use.\n\n"
    "Example: sharegpu devices -o wide --watch"
)
def devices(output: FormatOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    from sharegpu.ops.output import devices_items, devices_table, document, dump
    from sharegpu.ops.snapshot import take

    def frame() -> None:
        gpus = take(tenants=False).gpus
        if output in (Format.json, Format.yaml):
            print(dump(document("DeviceList", devices_items(gpus)), output, stream=watch), flush=True)
        else:
            console.print(devices_table(gpus, wide=output is Format.wide))

    _show(frame, output, watch, interval, "sharegpu devices")


def _show(frame: Callable[[], None], output: Format, watch: bool, interval: float, what: str) -> None:
    from sharegpu.ops.output import watch as watch_frames

    if not watch:
        frame()
        return
    if interval <= 0:
        raise typer.BadParameter(f"{interval:g} is not a positive number of seconds", param_hint="--interval")
    header = what if output in (Format.table, Format.wide) else None
    watch_frames(frame, interval, console, header=header)


def _configured(d: DeviceView) -> str:
    from sharegpu.ops.output import configured

    return configured(d)


@app.command(
    help="List the tenants on this node: memory cap and usage, configured and used GPU time.\n\n"
    "Example: sharegpu tenants -o yaml"
)
def tenants(
    output: FormatOpt = Format.table,
    watch: WatchOpt = False,
    interval: IntervalOpt = 2.0,
    sample: Annotated[
        float,
        typer.Option(
            "--sample",
            min=0,
            help="Tables: seconds between the two readings GPU TIME, WAIT and THROTTLED are measured over "
            "(GPU TIME: the arbiter's charges; a native tenant's, NVML's last second); 0: one reading "
            "(lifetime waits). --watch: between frames.",
        ),
    ] = 1.0,
) -> None:
    from sharegpu.ops.output import document, dump, rates_between, tenants_items, tenants_renderable
    from sharegpu.ops.snapshot import Snapshot, take

    last: list[Snapshot] = []  # the previous reading: rates between frames

    def frame() -> None:
        if output in (Format.json, Format.yaml):
            items = take(gpus=False).tenants
            print(dump(document("TenantList", tenants_items(items)), output, stream=watch), flush=True)
            return
        if not last and sample > 0:
            last.append(take(gpus=False))
            time.sleep(sample)
        snap = take(gpus=False)
        waits, window = None, None
        if last:
            window = snap.monotonic - last[0].monotonic
            waits = rates_between(last[0].tenants, snap.tenants, window)
        last[:] = [snap]
        console.print(
            tenants_renderable(snap.tenants, wide=output is Format.wide, waits=waits, window_s=window)
        )

    _show(frame, output, watch, interval, "sharegpu tenants")


@app.command(
    help="Summarize this node: the agent (running or not, version), the GPUs, the tenants by "
    "state, and the agent's recent warnings and errors.\n\n"
    "Example: sharegpu status -o json"
)
def status(output: FormatOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    from sharegpu.ops.output import document, dump, status_item, status_renderable
    from sharegpu.ops.snapshot import take

    def frame() -> None:
        snap = take(events=True, strict=False)
        if output in (Format.json, Format.yaml):
            print(dump(document("NodeStatus", [status_item(snap)]), output, stream=watch), flush=True)
        else:
            console.print(status_renderable(snap, wide=output is Format.wide))

    _show(frame, output, watch, interval, "sharegpu status")


class TopSort(StrEnum):
    mem = "mem"
    compute = "compute"
    wait = "wait"
    name = "name"


@app.command(
    help="A live screen of the node: a bar per GPU (memory, busy) and a row per tenant on each GPU "
    "(memory used / cap / overhead, compute achieved / configured, wait, throttled, preemptions, "
    "OOM refusals). Keys: m, c, w, n sort; q quits. Rates are measured between refreshes; with "
    "--once, over --sample seconds (0: over each tenant's lifetime).\n\n"
    "Example: sharegpu top --sort compute"
)
def top(
    sort: Annotated[TopSort, typer.Option("--sort", "-s", help="Order of the tenant rows.")] = TopSort.mem,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (no live screen).")] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-n", help="Seconds between refreshes.", min=0.1)
    ] = 2.0,
    sample: Annotated[
        float,
        typer.Option("--sample", help="--once: seconds between the two readings (0: lifetime rates).", min=0),
    ] = 1.0,
) -> None:
    from sharegpu.ops import top as top_screen

    order = top_screen.Sort(sort.value)
    if once:
        top_screen.once(console, order, sample)
    else:
        top_screen.live(console, order, interval)


@app.command(
    help="Check this node, in order: NVML, the driver and its CUDA version, the shim (built, "
    "installed, loads without failing closed), the runtime directory, the GPUs' arbiter regions, "
    "the tenants, the CDI spec, the agent, the /etc/ld.so.preload mount, the clock source, and "
    "other GPU-sharing software. One line per check (ok / warn / FAIL) with the fix for what "
    "fails. Exit status 1 when a check fails."
)
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    from sharegpu.ops.doctor import print_report, report_document, run_checks

    results = run_checks()
    if as_json:
        print(json.dumps(report_document(results), indent=2))
    else:
        print_report(results, console)
    raise typer.Exit(1 if any(r.status == "fail" for r in results) else 0)


@app.command(
    "support-bundle",
    help="Write a tar.gz for a bug report: status, devices, tenants and recent events (JSON), the "
    "configuration (directories, SHAREGPU_*/SIMGPU_* variables, versions), the doctor's report "
    "and the agent's log when found. No secrets: nothing else from the environment.",
)
def support_bundle(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write it (default sharegpu-support-<time>.tar.gz)."),
    ] = None,
) -> None:
    from sharegpu.ops.bundle import write_bundle

    path, notes = write_bundle(output)
    for note in notes:
        print(f"sharegpu: {note}", file=sys.stderr)
    print(f"wrote {path}")


@app.command(
    help="Resize a tenant while it runs: memory cap, compute share, ceiling, priority, policy, "
    "weight. Only what is given changes; the shim follows at the next allocation or launch.\n\n"
    "Shrinking memory below what the tenant holds kills nothing: its new allocations are refused "
    "until its usage falls under the new cap.\n\n"
    "Example: sharegpu resize web --memory 2GiB --compute 40%"
)
def resize(  # noqa: PLR0917 (typer maps parameters to options)
    tenant: Annotated[str, typer.Argument(help="The tenant's name.")],
    memory: Annotated[str | None, typer.Option("--memory", "-m", help="New memory cap per GPU.")] = None,
    compute: Annotated[
        str | None, typer.Option("--compute", "-c", help="New share, cap or guarantee, 1%-100%.")
    ] = None,
    ceiling: Annotated[str | None, typer.Option("--ceiling", help="New burst ceiling.")] = None,
    priority: Annotated[str | None, typer.Option("--priority", help="online | normal | offline.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="share | cap | burst | native.")] = None,
    weight: Annotated[int | None, typer.Option("--weight", help="Tie-break weight (1-1000).")] = None,
    output: OutputOpt = Output.table,
) -> None:
    from sharegpu.agent.models import TenantResize
    from sharegpu.agent.service import parse_model, resize_request
    from sharegpu.doors import tenant_service, tenant_views
    from sharegpu.errors import TenantNotFound
    from sharegpu.spec import validate_tenant_id

    validate_tenant_id(tenant)  # bad input: exit 2 with the same line with and without the agent
    fields: dict[str, str | int | None] = {"memory": memory, "compute": compute, "ceiling": ceiling}
    fields |= {"priority": priority, "policy": policy, "weight": weight}
    changes = {k: v for k, v in fields.items() if v is not None}
    request = parse_model(TenantResize, changes)  # the agent's checks and messages, here too
    with tenant_service() as service:
        service.resize(tenant, resize_request(request))
        found = tenant_views(service, only=tenant)
    if not found:
        raise TenantNotFound(f"tenant {tenant!r} vanished during the resize")
    view = found[0]
    if output is Output.json:
        _emit_json("TenantList", [view.model_dump(mode="json")])
        return
    parts = [f"{_size(d.memory_cap_bytes)} {_configured(d)} {d.priority}" for d in view.devices[:1]]
    print(f"resized {view.id}: {', '.join(parts)} (limits generation {view.limits_generation})")
    if view.note:
        print(f"note: {view.note}")


@app.command(
    help="List what the agent noticed and decided: tenants created, resized, recovered and reaped, "
    "audit findings, QoS decisions. Needs a running agent.\n\n"
    "Example: sharegpu events --kind audit --limit 20"
)
def events(  # noqa: PLR0917 (typer maps parameters to options)
    output: OutputOpt = Output.table,
    kind: Annotated[
        str | None, typer.Option("--kind", help="A kind (tenant.resized) or a family (tenant, audit).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (the latest).")] = 50,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's events.")] = None,
    since: Annotated[int | None, typer.Option("--since", help="Only events after this id.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events.")] = False,
) -> None:
    from sharegpu.agent.client import socket_path
    from sharegpu.doors import agent_client, tenant_service
    from sharegpu.errors import AgentError
    from sharegpu.tenant import runtime_dir

    if not 1 <= limit <= 10_000:
        raise typer.BadParameter(f"{limit} is not between 1 and 10000", param_hint="--limit")
    with tenant_service() as service:
        client = agent_client(service)
        if client is None:
            raise AgentError(
                f"no agent answers on {socket_path(runtime_dir())}: events are kept by the agent "
                "(start it with `sharegpu agent`)"
            )
        items, last = client.events(since=since, kind=kind, tenant=tenant, limit=limit)
        if output is Output.json and not follow:
            _emit_json("EventList", [e.model_dump(mode="json") for e in items])
            return
        _print_events(items, output)
        while follow:
            items, last = client.events(since=last, kind=kind, tenant=tenant, limit=1000, wait=25)
            _print_events(items, output)


def _print_events(items: list[Event], output: Output) -> None:
    import time

    for e in items:
        if output is Output.json:
            print(e.model_dump_json(), flush=True)
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
        who = f" [{e.tenant}]" if e.tenant else ""
        level = "" if e.severity == "info" else f" {e.severity.upper()}"
        print(f"{e.id:>6} {when} {e.kind}{level}{who} {e.message}", flush=True)


class Enforce(StrEnum):
    report = "report"
    kill = "kill"


@app.command(
    help="Run the node agent: tenants through an HTTP API on <runtime-dir>/agent.sock, state in "
    "<state-dir>/agent.db, reaping, reconciliation, audit and QoS loops. Stop it with SIGTERM; "
    "tenants keep running and stay enforced while it is down. See docs/agent.md."
)
def agent(  # noqa: PLR0917 (typer maps parameters to options)
    runtime_dir_opt: Annotated[
        Path | None,
        typer.Option("--runtime-dir", help="Default: $SHAREGPU_RUNTIME_DIR, /run/sharegpu as root."),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="Default: /var/lib/sharegpu as root, else ~/.local/state/sharegpu."),
    ] = None,
    enforce: Annotated[
        Enforce | None,
        typer.Option("--enforce", help="On a process bypassing its caps: report it, or kill it too."),
    ] = None,
    allow_overcommit: Annotated[
        bool | None,
        typer.Option("--allow-overcommit/--no-allow-overcommit", help="Admit caps past a card's memory."),
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="debug|info|warning|error.")] = None,
    log_format: Annotated[str | None, typer.Option("--log-format", help="text | json (a line each).")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Prometheus metrics on this TCP port (default 9479); 0: none."),
    ] = None,
    metrics_address: Annotated[
        str | None, typer.Option("--metrics-address", help="Address the metrics endpoint listens on.")
    ] = None,
    cdi_spec: Annotated[
        str | None,
        typer.Option(
            "--cdi-spec",
            help="The CDI spec of the node's vGPUs, kept current "
            "(default /var/run/cdi/sharegpu.json); none: off.",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="Settings file (default /etc/sharegpu/config.yaml, $SHAREGPU_CONFIG)."),
    ] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print every setting with where it came from, and exit.")
    ] = False,
) -> None:
    from sharegpu.agent.config import format_config, load_config
    from sharegpu.agent.daemon import Settings, run_agent
    from sharegpu.agent.logs import setup_logging
    from sharegpu.tenant import RUNTIME_ENV

    flags = {
        "runtime_dir": runtime_dir_opt,
        "state_dir": state_dir,
        "enforce": enforce.value if enforce else None,
        "allow_overcommit": allow_overcommit,
        "log_level": log_level.lower() if log_level else None,
        "log_format": log_format,
        "metrics_port": metrics_port,
        "metrics_address": metrics_address,
        "cdi_spec": cdi_spec,
    }
    loaded = load_config(flags, file=config_file)
    if print_config:
        print(format_config(loaded), end="")
        raise typer.Exit(0)
    cfg = loaded.config
    setup_logging(cfg.log_format, cfg.log_level)
    root = cfg.runtime_dir.absolute()
    os.environ[RUNTIME_ENV] = str(root)  # for anything that asks runtime_dir() in the agent
    settings = Settings(
        runtime_dir=root,
        state_dir=cfg.state_dir.absolute(),
        enforce=cfg.enforce,
        allow_overcommit=cfg.allow_overcommit,
        metrics_port=cfg.metrics_port,
        metrics_address=cfg.metrics_address,
        qos_target_wait_ms=cfg.qos_target_wait_ms,
        arbiter=cfg.arbiter,
        extra_loops=_cdi_loops(root, cfg.cdi_spec),
    )
    raise typer.Exit(run_agent(settings))


def _cdi_loops(root: Path, spec: str) -> tuple[Any, ...]:
    """The agent's CDI spec keeper, unless it is off (`--cdi-spec none`)."""
    if spec.strip().lower() == "none":
        return ()
    from sharegpu.runtime.cdi.generate import spec_target
    from sharegpu.runtime.cdi.keeper import CdiKeeper

    return (CdiKeeper(root, spec_target(Path(spec))),)


@app.command(
    help="Install a new shim (libsharegpu.so) for new tenant processes, without disturbing the running ones."
)
def upgrade(
    shim: Annotated[Path, typer.Option("--shim", help="The new libsharegpu.so.")],
) -> None:
    import importlib

    from sharegpu.errors import AgentError
    from sharegpu.tenant import runtime_dir

    try:
        module: Any = importlib.import_module("sharegpu.agent.upgrade")
    except ImportError as err:
        raise AgentError("this sharegpu cannot upgrade the shim (sharegpu.agent.upgrade is missing)") from err
    result = module.install_shim(shim, runtime_dir())
    if result is not None:
        print(result)


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
        state = simgpu.state_path()
        if state.exists():  # the simulator reads its configuration only when it creates the state
            print(
                f"sharegpu: warning: {state} exists, so --gpus/--memory take effect only after "
                "`sharegpu simgpu reset` (run it when no process uses the simulated GPU)",
                file=sys.stderr,
            )
    for key, value in simgpu.environment(config=config).items():
        print(f"export {key}={value}")


@simgpu_app.command(
    "rootfs",
    help="Build a minimal container root filesystem in DIR from this host's files (static busybox, "
    "the probe and their libraries) to try vGPU containers without an image registry.",
)
def simgpu_rootfs(directory: Annotated[Path, typer.Argument(help="Where to build it.")]) -> None:
    from sharegpu.runtime.rootfs import build_rootfs

    print(
        f"built {build_rootfs(directory)}: try `podman run --rootfs {directory} "
        "--device sharegpu.io/vgpu=<tenant> sgprobe meminfo`"
    )


@simgpu_app.command("reset", help="Clear the simulated GPU's shared state (memory, processes, clocks).")
def simgpu_reset() -> None:
    from sharegpu import simgpu

    removed = simgpu.reset()
    print(f"removed {removed}" if removed else f"nothing to reset ({simgpu.state_path()} does not exist)")


@cdi_app.command(
    "generate",
    help="Write the CDI spec that lists this node's tenants as `sharegpu.io/vgpu=<tenant>` "
    "devices (validated, at the lowest cdiVersion its fields need).",
)
def cdi_generate(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            help="A directory (the spec is its sharegpu.json) or a .json path; "
            "default /var/run/cdi. Use - to print the spec instead.",
        ),
    ] = None,
    tenant: Annotated[
        list[str] | None, typer.Option("--tenant", help="List only this tenant (repeatable).")
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="List this vGPU shape, gpu<index>-<memory>-<compute>[-online|-offline][-cap|-burst] "
            "(repeatable; default: a quarter, a half and all of each GPU). --shape none lists none.",
        ),
    ] = None,
) -> None:
    from sharegpu.runtime.cdi.generate import build_spec, spec_target, write_spec
    from sharegpu.runtime.cdi.owner import claim
    from sharegpu.runtime.cdi.shapes import parse_shape
    from sharegpu.tenant import runtime_dir

    shapes = None if shape is None else [parse_shape(s) for s in shape if s != "none"]
    built = build_spec(runtime_dir(), tenant or None, shapes)
    spec = built.spec
    if output is not None and str(output) == "-":
        sys.stdout.write(spec.to_json())
    else:
        target = spec_target(output)
        claim(target, runtime_dir())  # never another runtime directory's node spec
        write_spec(spec, target)
        names = ", ".join(f"{spec.kind}={d.name}" for d in spec.devices)
        print(f"wrote {target} (cdiVersion {spec.cdi_version}): {names}")
    # One damaged tenant is left out and the others written; the exit status says it.
    for name, why in built.left_out.items():
        print(
            f"sharegpu: tenant {name} left out of the spec: {why} (remove it, or let the agent "
            "restore it; `sharegpu doctor` lists the damaged tenants)",
            file=sys.stderr,
        )
    if built.left_out:
        raise typer.Exit(1)


@hook_app.command(
    "create",
    help="The createRuntime hook of a shape device: make the container's tenant and mount it "
    "(reads the OCI container state on stdin).",
)
def hook_create(
    shape: Annotated[str, typer.Option("--shape", help="The vGPU shape, as its device name.")],
) -> None:
    from sharegpu.runtime.cdi import hook

    raise typer.Exit(hook.main(["create", "--shape", shape]))


@hook_app.command("poststop", help="The poststop hook of a shape device: remove the container's tenant.")
def hook_poststop() -> None:
    from sharegpu.runtime.cdi import hook

    raise typer.Exit(hook.main(["poststop"]))


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
