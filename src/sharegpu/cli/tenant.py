"""One tenant at a time: `run` a command as one, `create` one for containers (a tenant device,
docs/containers.md), `get`, `resize` and `delete` it, all through the one tenant service (the
agent when it answers, else directly on the runtime directory)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from sharegpu.cli.render import Format, OutputOpt, emit

if TYPE_CHECKING:
    from sharegpu.agent.models import TenantView

app = typer.Typer()

# A tenant's options, shared by `sharegpu create` and `sharegpu run`.
MemoryOpt = Annotated[
    str, typer.Option("--memory", "-m", help="Memory cap per GPU, e.g. 512MiB, 4GiB, 1.5GiB.")
]
GpuOpt = Annotated[
    list[str] | None, typer.Option("--gpu", "-g", help="GPU index or UUID; repeat for several. Default: all.")
]
ComputeOpt = Annotated[
    str | None,
    typer.Option("--compute", "-c", help="Share of GPU time, 1%-100%: the share, the cap or the guarantee."),
]
PolicyOpt = Annotated[
    str | None, typer.Option("--policy", help="share (default) | cap | burst | native (memory only).")
]
CeilingOpt = Annotated[str | None, typer.Option("--ceiling", help="burst only: most GPU time when idle.")]
PriorityOpt = Annotated[str | None, typer.Option("--priority", help="online | normal (default) | offline.")]
WeightOpt = Annotated[int | None, typer.Option("--weight", help="Tie-break weight within a class (1-1000).")]


def _items(views: list[TenantView]) -> list[dict[str, object]]:
    return [v.model_dump(mode="json") for v in views]


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run COMMAND as a tenant with a memory cap and a compute share on each GPU it uses.\n\n"
    "Example: sharegpu run --memory 4GiB --compute 30% -- python train.py",
)
def run(  # noqa: PLR0917 (typer maps parameters to options)
    memory: MemoryOpt,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command and its arguments, after --.")
    ] = None,
    gpu: GpuOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="Tenant name (default run-<pid>).")] = None,
    compute: ComputeOpt = None,
    policy: PolicyOpt = None,
    ceiling: CeilingOpt = None,
    priority: PriorityOpt = None,
    weight: WeightOpt = None,
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


@app.command(
    help="Create a tenant for containers to use (the CDI device sharegpu.io/vgpu=NAME): a memory cap "
    "and a compute share on each GPU.\n\n"
    "Example: sharegpu create web --memory 4GiB --compute 30% --owner 1000",
)
def create(  # noqa: PLR0917 (typer maps parameters to options)
    name: Annotated[str, typer.Argument(help="The tenant's name: the CDI device sharegpu.io/vgpu=NAME.")],
    memory: MemoryOpt,
    gpu: GpuOpt = None,
    compute: ComputeOpt = None,
    policy: PolicyOpt = None,
    ceiling: CeilingOpt = None,
    priority: PriorityOpt = None,
    weight: WeightOpt = None,
    owner: Annotated[
        int | None,
        typer.Option(
            "--owner",
            min=0,
            help="The uid its processes run as (a container's --user): its files are made writable "
            "by it. Default: yours.",
        ),
    ] = None,
    output: OutputOpt = Format.table,
) -> None:
    from sharegpu.doors import tenant_service, tenant_views
    from sharegpu.service import TenantRequest
    from sharegpu.spec import ComputeSpec, GpuSelector, parse_memory_cap, validate_tenant_id

    request = TenantRequest(
        name=validate_tenant_id(name),
        memory_bytes=parse_memory_cap(memory),
        gpus=[GpuSelector.parse(g) for g in gpu or []],
        compute=ComputeSpec.parse(compute, policy, ceiling, priority, weight),
        owner=owner,
        command=["sharegpu", "create"],
    )
    with tenant_service() as service:
        tenant = service.create(request)
        views = tenant_views(service, only=tenant.name)
    emit(
        output,
        "TenantList",
        _items(views),
        lambda wide: (
            f"created {tenant.name} (incarnation {tenant.incarnation}) on {', '.join(tenant.uuids)}: "
            f"use it as the CDI device sharegpu.io/vgpu={tenant.name}"
        ),
    )


@app.command(help="Show one tenant: its state, incarnation and limits.\n\nExample: sharegpu get web")
def get(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    output: OutputOpt = Format.table,
) -> None:
    from sharegpu.doors import tenant_service, tenant_views
    from sharegpu.errors import TenantNotFound
    from sharegpu.spec import validate_tenant_id

    validate_tenant_id(name)
    with tenant_service() as service:
        views = tenant_views(service, only=name)
    if not views:
        raise TenantNotFound(f"no tenant {name!r} on this node")
    emit(output, "TenantList", _items(views[:1]), lambda wide: _describe(views[0]))


def _describe(view: TenantView) -> str:
    from sharegpu.spec import format_size

    lines = [f"{view.id}: {view.state}, incarnation {view.incarnation}, {view.path}"]
    if view.error:
        lines.append(f"  error: {view.error}")
    for d in view.devices:
        used = format_size(d.memory_used_bytes) if d.memory_used_bytes else "0"
        lines.append(
            f"  {d.uuid}: {used} of {format_size(d.memory_cap_bytes)}, {d.policy} "
            f"{d.compute_share_ratio:.0%}, {d.priority}"
        )
    return "\n".join(lines)


@app.command(
    help="Delete a tenant: refused while processes use it unless --force (a damaged one too).\n\n"
    "Example: sharegpu delete web --force",
)
def delete(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    force: Annotated[
        bool, typer.Option("--force", help="Remove it even while processes use it (they keep their limits).")
    ] = False,
    incarnation: Annotated[
        int | None,
        typer.Option(
            "--incarnation", help="Only if it is this incarnation (a re-created tenant is another)."
        ),
    ] = None,
) -> None:
    from sharegpu.doors import tenant_service
    from sharegpu.spec import validate_tenant_id

    validate_tenant_id(name)
    with tenant_service() as service:
        service.delete(name, incarnation=incarnation, force=force)
    print(f"deleted {name}")


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
    output: OutputOpt = Format.table,
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
    emit(output, "TenantList", _items(found[:1]), lambda wide: _resized(found[0]))


def _resized(view: TenantView) -> str:
    from sharegpu.ops.output import configured, size

    parts = [f"{size(d.memory_cap_bytes)} {configured(d)} {d.priority}" for d in view.devices[:1]]
    line = f"resized {view.id}: {', '.join(parts)} (limits generation {view.limits_generation})"
    return f"{line}\nnote: {view.note}" if view.note else line
