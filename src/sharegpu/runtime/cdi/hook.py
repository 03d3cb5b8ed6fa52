"""The OCI hooks of a shape device: a tenant per container, made at creation, gone at stop.

`sharegpu hook create --shape gpu0-4GiB-30` runs as the container's `createRuntime` hook, and
`sharegpu hook poststop` as its `poststop` hook; each reads the container's state (OCI runtime
spec, "State": `id`, `pid`, `bundle`) on stdin.

create: the tenant `ctr-<first 12 of the container id>` is made with the shape's limits through
the tenant service (sharegpu.doors: the agent when it answers), its supervisor being
the container's process (so the reaper removes it if the container dies before its poststop).
Then its files are bind-mounted into the container's root filesystem from inside the
container's mount namespace (createRuntime runs after the runtime's own mounts, before
pivot_root, so the host's paths are still visible there): limits read-only, usage and the
arbiter directories read-write, at the paths of a tenant device (generate.py). A mount point
that the image makes a symbolic link is refused, so an image cannot make the hook write
through its links. Any failure removes the tenant again and fails the container's creation
with one line.

poststop: the container's tenant is removed; a second poststop (or one without a create) says
so and succeeds.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharegpu.doors import tenant_service
from sharegpu.errors import ConfigError, TenantNotFound
from sharegpu.runtime.cdi.binds import tenant_binds
from sharegpu.runtime.cdi.shapes import parse_shape
from sharegpu.service import TenantRequest
from sharegpu.spec import GpuSelector, tenant_id_from
from sharegpu.tenant import runtime_dir

TENANT_PREFIX = "ctr-"
# Inside the container's mount namespace, before pivot_root: bind each (source, target), then
# make the read-only ones so.  Paths come as arguments, never in the script's text.
_MOUNT_SCRIPT = """
set -e
while [ "$#" -gt 0 ]; do
    mount --bind "$1" "$2"
    if [ "$3" = ro ]; then mount -o remount,bind,ro,nosuid,nodev "$2"; fi
    shift 3
done
"""


@dataclass(frozen=True)
class ContainerState:
    id: str
    pid: int
    bundle: Path


def read_state(text: str) -> ContainerState:
    """The OCI state a runtime passes a hook on stdin."""
    try:
        doc = json.loads(text)
        state = ContainerState(id=str(doc["id"]), pid=int(doc.get("pid") or 0), bundle=Path(doc["bundle"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"the hook's stdin is not an OCI container state ({err}): run it as a CDI hook"
        ) from err
    if not state.id:
        raise ConfigError("the OCI container state on stdin has no container id")
    return state


def tenant_name(container_id: str) -> str:
    """`ctr-` and the id's first 12 characters, in the characters a tenant name allows (runtimes
    other than Podman and Docker let users pick ids)."""
    return tenant_id_from(TENANT_PREFIX + container_id[:12])


def _config(state: ContainerState) -> dict[str, Any]:
    """The container's OCI config (config.json of its bundle)."""
    try:
        config = json.loads((state.bundle / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the OCI config of container {state.id}: {err}") from err
    if not isinstance(config, dict):
        raise ConfigError(f"the OCI config of container {state.id} is not an object")
    return config


def rootfs_of(state: ContainerState) -> Path:
    try:
        root = _config(state)["root"]["path"]
    except (KeyError, TypeError) as err:
        raise ConfigError(f"cannot read the root filesystem of container {state.id}: {err}") from err
    path = Path(root)
    return path if path.is_absolute() else state.bundle / path


def user_of(state: ContainerState) -> int:
    """The uid the container's process runs as (`process.user.uid`; 0 when not set).  At
    createRuntime its first process is still the runtime's, as root: the config says who it
    will be."""
    try:
        uid = _config(state).get("process", {}).get("user", {}).get("uid", 0)
    except AttributeError as err:
        raise ConfigError(f"the OCI config of container {state.id} has no readable process.user") from err
    if not isinstance(uid, int) or uid < 0:
        raise ConfigError(f"the OCI config of container {state.id} has a bad process.user.uid: {uid!r}")
    return uid


def mount_point(rootfs: Path, inside: str, *, directory: bool) -> Path:
    """`inside` under rootfs, created as needed, never through a symbolic link."""
    parts = Path(inside).relative_to("/").parts
    here = rootfs
    for i, part in enumerate(parts):
        here = here / part
        last = i == len(parts) - 1
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            if last and not directory:
                os.close(os.open(here, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY, 0o644))
            else:
                os.mkdir(here, 0o755)
            continue
        if stat.S_ISLNK(mode):
            raise ConfigError(
                f"the container's /{'/'.join(parts[: i + 1])} is a symbolic link: refusing to mount "
                "the vGPU through it"
            )
    return here


def _mount_tenant(state: ContainerState, path: Path, uuids: list[str]) -> None:
    rootfs = rootfs_of(state)
    args: list[str] = []
    for source, inside, writable in tenant_binds(runtime_dir(), path, uuids):
        target = mount_point(rootfs, inside, directory=source.is_dir())
        args += [str(source), str(target), "rw" if writable else "ro"]
    cmd = ["nsenter", f"--target={state.pid}", "--mount", "--", "/bin/sh", "-c", _MOUNT_SCRIPT, "sh", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"cannot enter container {state.id}'s mount namespace: {err}") from err
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise ConfigError(f"cannot mount the vGPU into container {state.id}: {why}")


def create(shape_name: str, state_text: str) -> str:
    """The createRuntime hook; returns the tenant's name."""
    shape = parse_shape(shape_name)
    state = read_state(state_text)
    if state.pid <= 0:
        raise ConfigError(f"the OCI state of container {state.id} has no pid: is this a createRuntime hook?")
    name = tenant_name(state.id)
    request = TenantRequest(
        name,
        shape.memory_bytes,
        [GpuSelector(index=shape.gpu)],
        shape.compute,
        supervisor_pid=state.pid,
        owner=user_of(state),
        labels={"container": state.id[:253], "shape": shape.name},
    )
    with tenant_service() as service:
        tenant = service.create(request)
        try:
            _mount_tenant(state, tenant.path, list(tenant.uuids))
        except BaseException:
            service.delete(name, incarnation=tenant.incarnation, force=True)
            raise
    return name


def poststop(state_text: str) -> str:
    """The poststop hook: the container's tenant goes; a message saying what happened."""
    state = read_state(state_text)
    name = tenant_name(state.id)
    try:
        # Forced: the container has stopped; a process that outlives it keeps its limits.
        with tenant_service() as service:
            service.delete(name, force=True)
    except TenantNotFound:
        return f"no tenant {name} for container {state.id} (removed already)"
    return f"removed tenant {name} of container {state.id}"


def main(argv: list[str] | None = None) -> int:
    """`python -m sharegpu.runtime.cdi.hook create --shape NAME | poststop`: what the spec runs.

    The same as `sharegpu hook ...` without the CLI's imports (typer, rich): a container start
    pays for two hooks.  Errors are one `sharegpu: error:` line with the CLI's exit statuses."""
    import argparse
    import sys

    from sharegpu.errors import SharegpuError

    parser = argparse.ArgumentParser(prog="sharegpu-hook")
    sub = parser.add_subparsers(dest="hook", required=True)
    sub.add_parser("create").add_argument("--shape", required=True)
    sub.add_parser("poststop")
    args = parser.parse_args(argv)
    try:
        if args.hook == "create":
            print(
                f"sharegpu: container tenant {create(args.shape, sys.stdin.read())} ({args.shape})",
                file=sys.stderr,
            )
        else:
            print(f"sharegpu: {poststop(sys.stdin.read())}", file=sys.stderr)
    except SharegpuError as err:
        print(f"sharegpu: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
