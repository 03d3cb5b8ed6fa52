"""`sharegpu run`: run one command as a tenant on this host.

Creates the tenant (limits + usage files), starts the command with the shim preloaded and
`SHAREGPU_TENANT` pointing at the tenant directory, forwards termination signals, removes the
tenant when the command exits and returns the command's exit status (128+N for signal N, as a
shell reports it).

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
from sharegpu.arbiter import ensure_arbiter
from sharegpu.devices import Gpu, list_gpus, select_gpus
from sharegpu.errors import CommandNotFound, SpecError
from sharegpu.native import shim_path
from sharegpu.spec import ComputeSpec, GpuSelector, format_size, validate_tenant_id
from sharegpu.tenant import DeviceLimit, create_tenant, remove_tenant, runtime_dir, supervisor_identity

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class RunRequest:
    command: Sequence[str]
    memory_bytes: int
    gpus: Sequence[GpuSelector] = ()
    name: str | None = None
    compute: ComputeSpec = field(default_factory=ComputeSpec)


_POLICY_CODES = {
    "share": abi.POLICY_SHARE,
    "cap": abi.POLICY_CAP,
    "burst": abi.POLICY_BURST,
    "native": abi.POLICY_NATIVE,
}
_PRIORITY_CODES = {
    "online": abi.PRIORITY_ONLINE,
    "normal": abi.PRIORITY_NORMAL,
    "offline": abi.PRIORITY_OFFLINE,
}


def device_limit(uuid: str, memory_bytes: int, compute: ComputeSpec) -> DeviceLimit:
    return DeviceLimit(
        uuid=uuid,
        mem_cap_bytes=memory_bytes,
        policy=_POLICY_CODES[compute.policy],
        priority=_PRIORITY_CODES[compute.priority],
        share_permille=compute.share_permille,
        ceiling_permille=compute.ceiling_permille,
        weight=compute.weight,
    )


def plan_devices(request: RunRequest, gpus: list[Gpu]) -> list[DeviceLimit]:
    """The vGPUs of the tenant: one per selected GPU, each with the memory cap, checked."""
    chosen = select_gpus(list(request.gpus), gpus)
    for gpu in chosen:
        if request.memory_bytes > gpu.memory_total:
            raise SpecError(
                f"memory cap {format_size(request.memory_bytes)} is larger than GPU {gpu.index} "
                f"({gpu.name}, {format_size(gpu.memory_total)})"
            )
    return [device_limit(g.uuid, request.memory_bytes, request.compute) for g in chosen]


def tenant_environment(tenant_dir: Path, limits: list[DeviceLimit], restrict: bool) -> dict[str, str]:
    env = dict(os.environ)
    env[abi.TENANT_ENV] = str(tenant_dir)
    preload = [str(shim_path())] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env["LD_PRELOAD"] = ":".join(dict.fromkeys(preload))
    if restrict:
        # Only the granted GPUs are visible to CUDA, as a container would mount only those.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in limits)
    return env


def run(request: RunRequest) -> int:
    if not request.command:
        raise SpecError("no command given: use `sharegpu run [OPTIONS] -- COMMAND [ARGS]`")
    name = validate_tenant_id(request.name) if request.name else f"run-{os.getpid()}"
    limits = plan_devices(request, list_gpus())
    if request.compute.policy != "native":
        for dev in limits:
            ensure_arbiter(runtime_dir(), dev.uuid)
    tenant_dir = create_tenant(
        name, limits, meta={"command": list(request.command), "supervisor": supervisor_identity()}
    )
    try:
        env = tenant_environment(tenant_dir, limits, restrict=bool(request.gpus))
        return _supervise(request.command, env)
    finally:
        remove_tenant(tenant_dir)


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
