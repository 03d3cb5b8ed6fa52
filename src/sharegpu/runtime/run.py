"""`sharegpu run`: run one command as a tenant on this host.

Creates the tenant (limits + usage files), starts the command with the shim preloaded and
`SHAREGPU_TENANT` pointing at the tenant directory, forwards termination signals, removes the
tenant when the command exits and returns the command's exit status (128+N for signal N, as a
shell reports it).

When a node agent answers on the runtime directory, the tenant is created and deleted through
its API (admission, events, the store); otherwise directly on the runtime directory under the
node lock, as before the agent existed. This module is why `sharegpu.runtime` sits above
`sharegpu.agent` in the import layers: it imports the agent's client.

On a bare host the limits are only as safe as the invoking user's file permissions (the tenant
runs as that user); inside containers the runtime mounts them read-only (see DESIGN.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu import abi
from sharegpu.agent.client import AgentClient
from sharegpu.agent.plan import device_limit, memory_totals, plan_devices
from sharegpu.agent.upgrade import current_shim, stable_path
from sharegpu.arbiter import ensure_arbiter, grant_arbiter
from sharegpu.devices import list_gpus
from sharegpu.errors import AgentError, CommandNotFound, SpecError, TenantNotFound
from sharegpu.native import shim_path
from sharegpu.spec import MIB, ComputeSpec, GpuSelector, validate_tenant_id
from sharegpu.tenant import (
    create_tenant,
    overcommit_allowed,
    remove_tenant,
    runtime_dir,
    supervisor_identity,
)

__all__ = ["RunRequest", "device_limit", "run", "tenant_environment"]

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class RunRequest:
    command: Sequence[str]
    memory_bytes: int
    gpus: Sequence[GpuSelector] = ()
    name: str | None = None
    compute: ComputeSpec = field(default_factory=ComputeSpec)


def preload_shim() -> Path:
    """The shim a new tenant process loads: the node's installed build (the stable link that
    `sharegpu upgrade` swaps) when there is one, else the package's own."""
    root = runtime_dir()
    return stable_path(root) if current_shim(root) is not None else shim_path()


def tenant_environment(tenant_dir: Path, uuids: Sequence[str], restrict: bool) -> dict[str, str]:
    env = dict(os.environ)
    env[abi.TENANT_ENV] = str(tenant_dir)
    preload = [str(preload_shim())] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env["LD_PRELOAD"] = ":".join(dict.fromkeys(preload))
    if restrict:
        # Only the granted GPUs are visible to CUDA, as a container would mount only those.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    return env


def run(request: RunRequest) -> int:
    """Through the agent when one answers on the runtime directory (it admits, records and
    reports the tenant); else directly on the runtime directory, under the node lock."""
    if not request.command:
        raise SpecError("no command given: use `sharegpu run [OPTIONS] -- COMMAND [ARGS]`")
    name = validate_tenant_id(request.name) if request.name else f"run-{os.getpid()}"
    client = AgentClient.connect(runtime_dir())
    if client is not None:
        with client:
            return _run_with_agent(client, request, name)
    return _run_direct(request, name)


def _run_direct(request: RunRequest, name: str) -> int:
    gpus = list_gpus()
    limits = plan_devices(request.memory_bytes, request.gpus, request.compute, gpus)
    if request.compute.policy != "native":
        for dev in limits:
            ensure_arbiter(runtime_dir(), dev.uuid)
            grant_arbiter(runtime_dir(), dev.uuid, os.geteuid())
    tenant_dir = create_tenant(
        name,
        limits,
        meta={"command": list(request.command), "supervisor": supervisor_identity()},
        memory_totals=memory_totals(gpus, overcommit_allowed()),
    )
    try:
        env = tenant_environment(tenant_dir, [d.uuid for d in limits], restrict=bool(request.gpus))
        return _supervise(request.command, env)
    finally:
        remove_tenant(tenant_dir)


def _create_body(request: RunRequest, name: str) -> dict[str, object]:
    """The request as the agent's API takes it (the strings the CLI took)."""
    compute = request.compute
    body: dict[str, object] = {
        "name": name,
        "memory": f"{request.memory_bytes // MIB}MiB",
        "gpus": [str(s) for s in request.gpus],
        "policy": compute.policy,
        "priority": compute.priority,
        "weight": compute.weight,
        "supervisor_pid": os.getpid(),
        "command": list(request.command),
    }
    if compute.policy != "native":
        body["compute"] = f"{compute.share_permille // 10}%"
    if compute.policy == "burst":
        body["ceiling"] = f"{compute.ceiling_permille // 10}%"
    return body


def _run_with_agent(client: AgentClient, request: RunRequest, name: str) -> int:
    view = client.create_tenant(_create_body(request, name))
    tenant_dir = Path(view.path)
    try:
        env = tenant_environment(tenant_dir, [d.uuid for d in view.devices], restrict=bool(request.gpus))
        return _supervise(request.command, env)
    finally:
        try:
            client.delete_tenant(name, force=True)
        except TenantNotFound:
            pass  # reaped already
        except AgentError:
            remove_tenant(tenant_dir)  # the agent went away meanwhile: clean up as without it


def _supervise(command: Sequence[str], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(list(command), env=env)
    except FileNotFoundError as err:
        raise CommandNotFound(f"command not found: {command[0]}") from err
    except PermissionError as err:
        raise CommandNotFound(f"cannot execute {command[0]}: permission denied") from err

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    # Ctrl-C reaches the child through the terminal's process group; the supervisor waits.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code
