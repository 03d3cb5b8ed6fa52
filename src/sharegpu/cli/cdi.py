"""Containers: `cdi generate` writes the node's CDI spec; `hook create` and `hook poststop` are
the OCI hooks that spec names for shape devices."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer()
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
