"""The simulated GPU (`simgpu env`, `rootfs`, `reset`) and the `demo` that runs on it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sharegpu.cli.render import console

app = typer.Typer()
simgpu_app = typer.Typer(
    help="The simulated GPU used by tests, benchmarks and the demo.", no_args_is_help=True
)
app.add_typer(simgpu_app, name="simgpu")


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


@app.command(help="Show two tenants sharing a simulated GPU with their memory caps enforced.")
def demo() -> None:
    from sharegpu.demo import run_demo

    raise typer.Exit(run_demo(console))
