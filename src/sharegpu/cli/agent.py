"""The node agent: `agent` runs it, `upgrade` installs a new shim under it."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer()


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
    cpu_wakeup_latency_us: Annotated[
        int | None,
        typer.Option(
            "--cpu-wakeup-latency-us",
            help="Ask every CPU to wake within this many µs while the agent runs (Linux PM QoS; 0: idle "
            "CPUs poll): faster hand-overs of a GPU between tenants, more power. Default: off.",
        ),
    ] = None,
    cpu_wakeup_latency_while: Annotated[
        str | None,
        typer.Option(
            "--cpu-wakeup-latency-while",
            help="agent: hold --cpu-wakeup-latency-us while the agent runs (default); online: only "
            "while a tenant of priority online is on the node.",
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
        "cpu_wakeup_latency_us": cpu_wakeup_latency_us,
        "cpu_wakeup_latency_while": cpu_wakeup_latency_while,
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
        cpu_wakeup_latency_us=cfg.cpu_wakeup_latency_us,
        cpu_wakeup_latency_while=cfg.cpu_wakeup_latency_while,
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
