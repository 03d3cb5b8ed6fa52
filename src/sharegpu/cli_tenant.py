"""`sharegpu create`, `get` and `delete`: one tenant at a time, through the one tenant service
(the agent when it answers, else directly on the runtime directory), for containers whose
tenant is made in advance (a tenant device, docs/containers.md) and for removing a damaged one.
Registered on the CLI's app by sharegpu.cli; the options mirror `sharegpu run`'s."""

from __future__ import annotations

import json
from typing import Annotated

import typer

JSON_VERSION = 1


def _emit(items: list[dict[str, object]]) -> None:
    print(json.dumps({"version": JSON_VERSION, "kind": "TenantList", "items": items}, indent=2))


# A tenant's options, shared by `sharegpu create` and `sharegpu run` (cli.py).
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
    as_json: Annotated[bool, typer.Option("--json", help="Print the tenant as JSON.")] = False,
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
    if as_json:
        _emit([v.model_dump(mode="json") for v in views])
        return
    print(
        f"created {tenant.name} (incarnation {tenant.incarnation}) on {', '.join(tenant.uuids)}: "
        f"use it as the CDI device sharegpu.io/vgpu={tenant.name}"
    )


def get(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the tenant as JSON.")] = False,
) -> None:
    from sharegpu.doors import tenant_service, tenant_views
    from sharegpu.errors import TenantNotFound
    from sharegpu.spec import format_size, validate_tenant_id

    validate_tenant_id(name)
    with tenant_service() as service:
        views = tenant_views(service, only=name)
    if not views:
        raise TenantNotFound(f"no tenant {name!r} on this node")
    view = views[0]
    if as_json:
        _emit([view.model_dump(mode="json")])
        return
    print(f"{view.id}: {view.state}, incarnation {view.incarnation}, {view.path}")
    if view.error:
        print(f"  error: {view.error}")
    for d in view.devices:
        used = format_size(d.memory_used_bytes) if d.memory_used_bytes else "0"
        print(
            f"  {d.uuid}: {used} of {format_size(d.memory_cap_bytes)}, {d.policy} "
            f"{d.compute_share_ratio:.0%}, {d.priority}"
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
