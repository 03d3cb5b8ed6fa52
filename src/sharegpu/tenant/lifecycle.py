"""Creating, resizing and removing tenants under the node lock, and collecting the ones a killed
supervisor left."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from sharegpu import access
from sharegpu.errors import SpecError, TenantError, TenantExists, TenantNotFound
from sharegpu.regions import abi
from sharegpu.regions.files import publish_region
from sharegpu.spec import validate_tenant_id
from sharegpu.tenant.admission import admit
from sharegpu.tenant.paths import GPUS_DIR, iter_tenants, tenant_path, tenants_dir
from sharegpu.tenant.processes import supervisor_gone
from sharegpu.tenant.records import DeviceLimit
from sharegpu.tenant.regions import (
    init_usage_region,
    limits_bytes,
    read_device_limits,
    write_limits_in_place,
)
from sharegpu.tenant.status import SHRUNK_KEY, is_stale, read_meta, shrunk_from, tenant_status

# Hidden names (iter_tenants skips dot-names) of a tenant being built or being deleted.
_STAGING = ".new."
_DOOMED = ".gone."


@contextlib.contextmanager
def directory_lock(base: Path) -> Iterator[None]:
    """flock on ``base``/.lock: the node lock over tenants (creation, resize, removal see each
    other's admission), and the shim upgrade's over its install directory."""
    fd = os.open(base / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def node_lock(root: Path | None = None) -> Iterator[None]:
    """The node lock (flock on <runtime>/tenants/.lock) that creation, resize and removal take."""
    base = tenants_dir(root)
    base.mkdir(parents=True, exist_ok=True, mode=0o755)
    with directory_lock(base):
        yield


def collect_stale(root: Path | None = None) -> list[str]:
    """Remove tenants left behind by a supervisor that was killed; returns their ids."""
    removed = []
    _sweep_leftovers(tenants_dir(root))
    for path in iter_tenants(root):
        if not supervisor_gone(read_meta(path)):
            continue  # the usual case, answered without reading the tenant's regions
        status = tenant_status(path)
        if is_stale(status):
            remove_tenant(path)
            removed.append(path.name)
    return removed


def create_tenant(
    tenant_id: str,
    devices: Sequence[DeviceLimit],
    *,
    root: Path | None = None,
    meta: dict[str, object] | None = None,
    memory_totals: Mapping[str, int] | None = None,
    owner: int | None = None,
) -> Path:
    """Create a tenant directory with its limits, usage and meta files; returns the directory.

    `owner` is the user whose processes run the tenant (default: the caller): its usage region
    is mode 0600 and theirs (only root creates a tenant for another user).

    Under the node lock: tenants left behind by dead supervisors are collected first, then the
    compute guarantees (cap and burst) on each GPU must still sum to at most 100%, and, with
    `memory_totals` (GPU UUID -> card memory), the memory caps to at most the card."""
    validate_tenant_id(tenant_id)
    base = tenants_dir(root)
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as err:
        raise TenantError(f"cannot create the runtime directory {base}: {err.strerror}") from err
    with directory_lock(base):
        collect_stale(base.parent)
        if (base / tenant_id).exists():
            raise TenantExists(f"tenant {tenant_id!r} already exists ({base / tenant_id})")
        admit(base, devices, memory_totals=memory_totals)
        return _create_locked(base, tenant_id, devices, meta, owner)


def _create_locked(
    base: Path,
    tenant_id: str,
    devices: Sequence[DeviceLimit],
    meta: dict[str, object] | None,
    owner: int | None,
) -> Path:
    """Build the tenant under a hidden name and rename it into place, so that every reader (the
    agent's reconciler and reaper, `sharegpu tenants`, a test) sees a whole tenant or none."""
    path = base / tenant_id
    staging = base / f".{tenant_id}{_STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # a pid reused after a creator died mid-way
    try:
        staging.mkdir(mode=0o755)
    except OSError as err:
        raise TenantError(f"cannot create {staging}: {err.strerror}") from err
    try:
        publish_region(
            staging,
            abi.LIMITS_FILE,
            limits_bytes(tenant_id, devices),
            ctypes.sizeof(abi.Limits),
            0o444,
        )
        # The tenant's processes keep their ledger here: their owner's alone (and root's).
        publish_region(staging, abi.USAGE_FILE, None, ctypes.sizeof(abi.Usage), 0o600, fill=init_usage_region)
        _link_gpus(staging, base.parent / GPUS_DIR, devices)
        info = {"id": tenant_id, "created": time.time(), **(meta or {})}
        (staging / "meta.json").write_text(json.dumps(info, indent=2) + "\n")
        if owner is not None and owner != os.geteuid():
            _give_usage(staging, tenant_id, owner)
        if path.exists():  # rename(2) would replace an empty directory
            raise TenantExists(f"tenant {tenant_id!r} already exists ({path})")
        os.rename(staging, path)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise TenantError(f"cannot create {path}: {err.strerror}") from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _link_gpus(directory: Path, gpus: Path, devices: Sequence[DeviceLimit]) -> None:
    """The tenant's way to the arbiters of its own GPUs, and of no other: `gpus/<uuid>` links to
    the node's `gpus/<uuid>` for each of its GPUs (as a container mounts exactly those)."""
    (directory / GPUS_DIR).mkdir(mode=0o755)
    for dev in devices:
        uuid = abi.bytes_to_uuid(abi.uuid_to_bytes(dev.uuid))
        (directory / GPUS_DIR / uuid).symlink_to(gpus / uuid)


def _give_usage(directory: Path, tenant_id: str, owner: int) -> None:
    try:
        access.give_to(directory / abi.USAGE_FILE, owner)
    except OSError as err:
        raise TenantError(f"cannot give tenant {tenant_id!r} to uid {owner}: {err.strerror}") from err


def remove_tenant(path: Path) -> None:
    """Take the tenant out of sight in one rename, then delete it: no reader ever finds a tenant
    whose limits are already gone. Two removers race harmlessly (one rename wins)."""
    doomed = path.with_name(f".{path.name}{_DOOMED}{os.getpid()}.{time.monotonic_ns()}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    except OSError:
        doomed = path  # e.g. a read-only parent: delete in place, as before
    shutil.rmtree(doomed, ignore_errors=True)


def _sweep_leftovers(base: Path) -> None:
    """Delete what a creator or remover killed mid-way left under a hidden name. Under the node
    lock: no creator is at work, and a remover's leftover is garbage whoever finishes it."""
    try:
        with os.scandir(base) as entries:
            names = [e.name for e in entries if e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        if _DOOMED in name or _STAGING in name:
            shutil.rmtree(base / name, ignore_errors=True)


def resize_tenant(
    tenant_id: str,
    update: Callable[[list[DeviceLimit]], list[DeviceLimit]],
    *,
    root: Path | None = None,
    memory_totals: Mapping[str, int] | None = None,
) -> tuple[list[DeviceLimit], list[DeviceLimit], int]:
    """Resize a tenant, running or not: under the node lock, `update` maps the current limits to
    the new ones, admission re-runs for what grows, and the limits are rewritten in place.

    Returns (before, after, generation). The shim follows at its next allocation or launch.
    Shrinking memory below what the tenant holds kills nothing: its allocations are refused
    until its usage falls under the new cap."""
    path = tenant_path(tenant_id, root)
    base = path.parent
    with directory_lock(base):
        if not path.is_dir():
            raise TenantNotFound(f"no tenant {tenant_id!r} on this node ({base})")
        before = read_device_limits(path)
        after = update(list(before))
        if [d.uuid for d in after] != [d.uuid for d in before]:
            raise SpecError("a resize cannot change the GPUs of a tenant: create a new tenant instead")
        admit(base, after, exclude=path.name, before=before, memory_totals=memory_totals)
        generation = write_limits_in_place(path, after)
        _note_shrinks(path, before, after)
    return before, after, generation


def _note_shrinks(path: Path, before: Sequence[DeviceLimit], after: Sequence[DeviceLimit]) -> None:
    """Remember in meta.json the largest memory cap granted before a shrink, per GPU: until the
    tenant frees down to its new cap, holding more is legitimate, not a bypass (the audit)."""
    meta = read_meta(path)
    shrunk = dict(shrunk_from(meta))
    for old, new in zip(before, after, strict=True):
        if new.mem_cap_bytes < old.mem_cap_bytes:
            shrunk[new.uuid] = max(old.mem_cap_bytes, shrunk.get(new.uuid, 0))
        elif new.mem_cap_bytes >= shrunk.get(new.uuid, 0):
            shrunk.pop(new.uuid, None)
    if shrunk != shrunk_from(meta):
        meta[SHRUNK_KEY] = shrunk
        tmp = path / f".meta.json.{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, path / "meta.json")
