"""`sharegpu run`: run one command as a tenant on this host.

Creates the tenant (limits + usage files), starts the command with the shim preloaded and
`SHAREGPU_TENANT` pointing at the tenant directory, forwards termination signals, removes the
tenant when the command exits and returns the command's exit status (128+N for signal N, as a
shell reports it).

When a node agent answers on the runtime directory, the tenant is created and deleted through
its API (admission, events, the store); otherwise directly on the runtime directory under the
node lock (sharegpu.runtime.tenants, shared with the CDI hooks). This is why `sharegpu.runtime`
sits above `sharegpu.agent` in the import layers: it imports the agent's client.

On a bare host the limits are only as safe as the invoking user's file permissions (the tenant
runs as that user); inside containers the runtime mounts them read-only (see DESIGN.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu import abi
from sharegpu.agent.plan import device_limit
from sharegpu.agent.upgrade import current_shim, stable_path
from sharegpu.errors import CommandNotFound, SpecError, TenantNotFound
from sharegpu.native import shim_path
from sharegpu.runtime import tenants
from sharegpu.spec import ComputeSpec, GpuSelector, validate_tenant_id
from sharegpu.tenant import runtime_dir, supervisor_identity

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
    created = tenants.create(
        name,
        request.memory_bytes,
        request.gpus,
        request.compute,
        api_meta={"supervisor_pid": os.getpid(), "command": list(request.command)},
        direct_meta={"command": list(request.command), "supervisor": supervisor_identity()},
    )
    try:
        env = tenant_environment(created.path, created.uuids, restrict=bool(request.gpus))
        return _supervise(request.command, env)
    finally:
        with contextlib.suppress(TenantNotFound):  # reaped already
            tenants.delete(name, created.path, through_agent=created.through_agent)


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
