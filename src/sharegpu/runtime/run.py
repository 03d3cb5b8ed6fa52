"""`sharegpu run`: run one command as a tenant on this host.

Creates the tenant (limits + usage files), starts the command with the shim preloaded and
`SHAREGPU_TENANT` pointing at the tenant directory, forwards termination signals, removes the
tenant when the command exits and returns the command's exit status (128+N for signal N, as a
shell reports it).

The tenant is created and deleted through the tenant service that sharegpu.doors picks: the
node agent's when one answers on the runtime directory (admission, events, the store), else the
local one on the runtime directory, with the same steps and errors.

On a bare host the limits are only as safe as the invoking user's file permissions (the tenant
runs as that user); inside containers the runtime mounts them read-only (docs/architecture.md,
the threat model).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.agent.upgrade import current_shim, stable_path
from sharegpu.doors import tenant_service
from sharegpu.errors import CommandNotFound, SpecError, TenantNotFound
from sharegpu.native import shim_path, vulkan_layer_share
from sharegpu.regions import abi
from sharegpu.service import TenantRequest
from sharegpu.service.plan import device_limit
from sharegpu.spec import ComputeSpec, GpuSelector, validate_tenant_id
from sharegpu.tenant import runtime_dir

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
    share = vulkan_layer_share()
    if share is not None:
        # The Vulkan layer: its manifest is found on XDG_DATA_DIRS (the loader's implicit-layer
        # search path; default /usr/local/share:/usr/share) and enabled by SHAREGPU_VULKAN.
        dirs = env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share"
        env["XDG_DATA_DIRS"] = ":".join(dict.fromkeys([str(share), *dirs.split(":")]))
        env["SHAREGPU_VULKAN"] = "1"
    return env


def run(request: RunRequest) -> int:
    """The command as a tenant, created and removed through the tenant service (sharegpu.doors)."""
    if not request.command:
        raise SpecError("no command given: use `sharegpu run [OPTIONS] -- COMMAND [ARGS]`")
    name = validate_tenant_id(request.name) if request.name else f"run-{os.getpid()}"
    with tenant_service() as service:
        tenant = service.create(
            TenantRequest(
                name,
                request.memory_bytes,
                request.gpus,
                request.compute,
                supervisor_pid=os.getpid(),
                command=list(request.command),
            )
        )
    try:
        env = tenant_environment(tenant.path, tenant.uuids, restrict=bool(request.gpus))
        return _supervise(request.command, env)
    finally:
        # Asked anew: the agent may have come or gone meanwhile. Forced: the command is gone,
        # and what it left running keeps its limits until it exits.
        with contextlib.suppress(TenantNotFound), tenant_service() as service:  # reaped already
            service.delete(name, incarnation=tenant.incarnation, force=True)


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
