"""Tenant directories: the files the shim reads its limits from and writes its usage to.

Layout under the runtime directory (see DESIGN.md)::

    <runtime>/tenants/<id>/limits     struct sg_limits, mode 0444, never written by the tenant
    <runtime>/tenants/<id>/usage      struct sg_usage, written by every shim of the tenant
    <runtime>/tenants/<id>/meta.json  who made the tenant and for what command (for humans)
    <runtime>/tenants/<id>/gpus       symlink to <runtime>/gpus: the per-GPU arbiter regions
                                      (a container runtime mounts <runtime>/gpus/<uuid> there)

Each file is published by writing a temporary file in the same directory and renaming it, so a
reader never sees half a file. The usage region's robust, process-shared mutex is initialised
here through libc (``pthread_mutex_init``) before the rename.

A resize rewrites the limits file *in place* under its seqlock (generation odd while writing,
+2 when done), never by rename: a container's read-only bind mount pins the inode, and the shim
keeps the file mapped, so only an in-place write reaches them (``resize_tenant``).

Admission (under the node lock, so concurrent creators and resizers see each other): compute
guarantees (cap and burst) on a GPU sum to at most 100%; and, when the caller passes the cards'
memory (``memory_totals``), memory caps on a GPU sum to at most the card's memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import mmap
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharegpu import abi, access, liveness, regionmap
from sharegpu.cgroup import Container, container_of_process
from sharegpu.errors import AdmissionError, ConfigError, SpecError, TenantError, TenantExists, TenantNotFound
from sharegpu.spec import format_size, validate_tenant_id

RUNTIME_ENV = "SHAREGPU_RUNTIME_DIR"
GPUS_DIR = "gpus"
# Hidden names (iter_tenants skips dot-names) of a tenant being built or being deleted.
_STAGING = ".new."
_DOOMED = ".gone."


def runtime_dir() -> Path:
    """`SHAREGPU_RUNTIME_DIR`, else /run/sharegpu as root, else $XDG_RUNTIME_DIR/sharegpu."""
    if env := os.environ.get(RUNTIME_ENV):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/sharegpu")
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "sharegpu"
    return Path(tempfile.gettempdir()) / f"sharegpu-{os.getuid()}"


def tenants_dir(root: Path | None = None) -> Path:
    return (root or runtime_dir()) / "tenants"


def gpus_dir(root: Path | None = None) -> Path:
    """Where the per-GPU arbiter regions live: <runtime>/gpus/<uuid>/arbiter."""
    return (root or runtime_dir()) / GPUS_DIR


@dataclass(frozen=True)
class DeviceLimit:
    """One vGPU of a tenant: the physical GPU and the limits on it."""

    uuid: str
    mem_cap_bytes: int
    policy: int = abi.POLICY_NATIVE
    priority: int = abi.PRIORITY_NORMAL
    share_permille: int = 1000
    ceiling_permille: int = 1000
    weight: int = 1


@dataclass
class ProcessUsage:
    pid: int  # as the process's own namespace knows it (a container's, inside one)
    host_pid: int  # in this process's namespace (liveness.host_pids); 0 when out of sight
    alive: bool
    mem_bytes: dict[str, int]
    oom_events: int
    container: Container | None = None  # the container it runs in (its cgroup), if any


@dataclass
class DeviceUsage:
    uuid: str
    mem_cap_bytes: int
    mem_used_bytes: int
    overhead_bytes: int
    mem_peak_bytes: int
    oom_events: int


@dataclass
class TenantStatus:
    id: str
    path: Path
    devices: list[DeviceUsage]
    processes: list[ProcessUsage]
    meta: dict[str, object] = field(default_factory=dict)
    error: str | None = None


# ---------------------------------------------------------------------------------------------
# libc: robust process-shared mutex initialisation.

_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def init_robust_mutex(address: int, what: str = "usage") -> None:
    """Initialise the pthread mutex at `address` as robust and process-shared (through libc).

    Shared by every region that holds one (the usage region here, the GPU arbiter in
    ``sharegpu.arbiter``); the shim refuses a region whose mutex lacks either attribute.
    """
    libc = _libc()
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes on glibc; be generous
    for call, args in (
        (libc.pthread_mutexattr_init, (attr,)),
        (libc.pthread_mutexattr_setpshared, (attr, _PTHREAD_PROCESS_SHARED)),
        (libc.pthread_mutexattr_setrobust, (attr, _PTHREAD_MUTEX_ROBUST)),
        (libc.pthread_mutex_init, (ctypes.c_void_p(address), attr)),
    ):
        if rc := call(*args):
            raise TenantError(f"cannot initialise the {what} mutex: {os.strerror(rc)}")
    libc.pthread_mutexattr_destroy(attr)


# ---------------------------------------------------------------------------------------------
# Writing regions.


def _header(magic: int, size: int) -> abi.RegionHeader:
    return abi.RegionHeader(
        magic=magic,
        abi_major=abi.ABI_MAJOR,
        abi_minor=abi.ABI_MINOR,
        header_size=ctypes.sizeof(abi.RegionHeader),
        total_size=size,
        created_ns=time.time_ns(),
    )


def publish_region(
    directory: Path, name: str, data: bytes | None, size: int, mode: int, *, fill: object = None
) -> None:
    """Write `name` in `directory` atomically: temp file, optional in-place init, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as view:
            if data is not None:
                view[: len(data)] = data
            if callable(fill):
                fill(view)
            view.flush()
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, directory / name)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def limits_bytes(tenant_id: str, devices: Sequence[DeviceLimit], generation: int = 0) -> bytes:
    if not devices:
        raise TenantError("a tenant needs at least one GPU")
    if len(devices) > abi.MAX_DEVICES:
        raise TenantError(f"a tenant can use at most {abi.MAX_DEVICES} GPUs, not {len(devices)}")
    region = abi.Limits()
    region.hdr = _header(abi.MAGIC_LIMITS, ctypes.sizeof(abi.Limits))
    region.generation = generation
    region.tenant_id = tenant_id.encode()
    region.device_count = len(devices)
    region.incarnation = secrets.randbits(64) | 1  # nonzero: a re-created tenant is another
    for slot, dev in zip(region.devices, devices, strict=False):
        slot.uuid[:] = abi.uuid_to_bytes(dev.uuid)
        slot.mem_cap_bytes = dev.mem_cap_bytes
        slot.policy = dev.policy
        slot.priority = dev.priority
        slot.share_permille = dev.share_permille
        slot.ceiling_permille = dev.ceiling_permille
        slot.weight = dev.weight
    return bytes(region)


def _usage_init(view: mmap.mmap) -> None:
    region = abi.Usage.from_buffer(view)
    region.hdr = _header(abi.MAGIC_USAGE, ctypes.sizeof(abi.Usage))
    region.slot_count = abi.MAX_PROCS
    region.device_count = abi.MAX_DEVICES
    init_robust_mutex(ctypes.addressof(region) + abi.Usage.lock.offset)
    del region  # release the buffer export before the mmap closes


@contextlib.contextmanager
def _node_lock(base: Path) -> Iterator[None]:
    """Serialises tenant creation on a node, so admission checks see every tenant."""
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
    with _node_lock(base):
        yield


def supervisor_identity(pid: int | None = None) -> dict[str, int]:
    """This process (or `pid`) as a tenant's supervisor: pid plus start time, so a reused pid
    is not it."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start_time": process_start_time(pid) or 0}


def supervisor_gone(meta: Mapping[str, Any]) -> bool:
    """The tenant names a supervisor (`sharegpu run`) and that process is gone."""
    sup = meta.get("supervisor")
    if not isinstance(sup, dict):
        return False
    return process_start_time(int(sup.get("pid", 0))) != int(sup.get("start_time", -1))


def is_stale(status: TenantStatus) -> bool:
    """A tenant whose supervisor died and that has no live process left (nobody will remove it)."""
    if status.error is not None or not supervisor_gone(status.meta):
        return False
    return not any(p.alive for p in status.processes)


def _guarantee(dev: DeviceLimit) -> int:
    return dev.share_permille if dev.policy in (abi.POLICY_CAP, abi.POLICY_BURST) else 0


def _allocated_on(base: Path, uuid: str, exclude: str | None) -> tuple[int, int]:
    """(permille promised to cap/burst tenants, bytes of memory caps) on `uuid`, all tenants
    but `exclude`."""
    guaranteed = memory = 0
    for path in iter_tenants(base.parent):
        if path.name == exclude:
            continue
        with contextlib.suppress(ConfigError):
            for dev in read_device_limits(path):
                if dev.uuid == uuid:
                    guaranteed += _guarantee(dev)
                    memory += dev.mem_cap_bytes
    return guaranteed, memory


def _admit(
    base: Path,
    devices: Sequence[DeviceLimit],
    *,
    exclude: str | None = None,
    before: Sequence[DeviceLimit] = (),
    memory_totals: Mapping[str, int] | None = None,
) -> None:
    """Refuse what could not be honoured next to the other tenants. On a resize (`before` given)
    only what grows is checked: shrinking is always allowed, even on an overcommitted card."""
    old = {d.uuid: d for d in before}
    for dev in devices:
        prev = old.get(dev.uuid)
        grows_compute = _guarantee(dev) > (_guarantee(prev) if prev else 0)
        grows_memory = memory_totals is not None and dev.mem_cap_bytes > (prev.mem_cap_bytes if prev else 0)
        if not (grows_compute or grows_memory):
            continue
        taken, memory = _allocated_on(base, dev.uuid, exclude)
        if grows_compute and taken + _guarantee(dev) > 1000:
            raise AdmissionError(
                f"compute guarantees on {dev.uuid} would total {(taken + _guarantee(dev)) / 10:g}% "
                f"({taken / 10:g}% already promised to cap/burst tenants): they could not all be honoured"
            )
        total = (memory_totals or {}).get(dev.uuid)
        if grows_memory and total is not None and memory + dev.mem_cap_bytes > total:
            raise AdmissionError(
                f"memory caps on {dev.uuid} would total {format_size(memory + dev.mem_cap_bytes)} of "
                f"the card's {format_size(total)} ({format_size(memory)} already given to other tenants, "
                f"{format_size(max(total - memory, 0))} left): they could not all be honoured "
                "(an agent started with --allow-overcommit allows it)"
            )


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
    with _node_lock(base):
        collect_stale(base.parent)
        if (base / tenant_id).exists():
            raise TenantExists(f"tenant {tenant_id!r} already exists ({base / tenant_id})")
        _admit(base, devices, memory_totals=memory_totals)
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
        publish_region(staging, abi.USAGE_FILE, None, ctypes.sizeof(abi.Usage), 0o600, fill=_usage_init)
        (staging / GPUS_DIR).symlink_to(base.parent / GPUS_DIR)
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


# ---------------------------------------------------------------------------------------------
# Resizing a live tenant.


def tenant_path(tenant_id: str, root: Path | None = None) -> Path:
    """The directory of an existing tenant; TenantNotFound when there is none."""
    base = tenants_dir(root)
    try:
        validate_tenant_id(tenant_id)
    except SpecError as err:
        raise TenantNotFound(f"no tenant {tenant_id!r} on this node: {err}") from err
    path = base / tenant_id
    if not path.is_dir():
        raise TenantNotFound(f"no tenant {tenant_id!r} on this node ({base})")
    return path


def write_limits_in_place(path: Path, devices: Sequence[DeviceLimit]) -> int:
    """Rewrite the device entries of `path`/limits under the seqlock; returns the new generation.

    Writer protocol of abi.h: store generation+1 (odd), write the fields, store generation+2.
    Each store is one aligned 8-byte write and x86 keeps stores in program order, which is what
    the shim's acquire loads pair with. A generation left odd by a writer that died is first
    rounded up, so this write repairs it. Caller holds the node lock (the single writer)."""
    if not devices or len(devices) > abi.MAX_DEVICES:
        raise TenantError(f"a tenant needs 1 to {abi.MAX_DEVICES} GPUs, not {len(devices)}")
    file = path / abi.LIMITS_FILE
    _read_region(file, abi.Limits, abi.MAGIC_LIMITS)  # magic, ABI and size, before writing a byte
    try:
        mode = file.stat().st_mode & 0o777
        # The file is 0444 (the tenant must not write it): lend its owner write permission just
        # long enough to open it; an open descriptor keeps working after the mode is restored.
        os.chmod(file, mode | 0o200)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
        finally:
            os.chmod(file, mode)
    except OSError as err:
        raise TenantError(f"cannot open {file} for a resize: {err.strerror}") from err
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Limits)) as view:
            region = abi.Limits.from_buffer(view)
            gen = int(region.generation)
            gen += gen % 2
            region.generation = gen + 1
            region.device_count = len(devices)
            for i in range(abi.MAX_DEVICES):
                slot = abi.LimitsDevice()
                if i < len(devices):
                    dev = devices[i]
                    slot.uuid[:] = abi.uuid_to_bytes(dev.uuid)
                    slot.mem_cap_bytes = dev.mem_cap_bytes
                    slot.policy = dev.policy
                    slot.priority = dev.priority
                    slot.share_permille = dev.share_permille
                    slot.ceiling_permille = dev.ceiling_permille
                    slot.weight = dev.weight
                region.devices[i] = slot
            region.generation = gen + 2
            del region  # release the buffer export before the mmap closes
    finally:
        os.close(fd)
    return gen + 2


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
    with _node_lock(base):
        if not path.is_dir():
            raise TenantNotFound(f"no tenant {tenant_id!r} on this node ({base})")
        before = read_device_limits(path)
        after = update(list(before))
        if [d.uuid for d in after] != [d.uuid for d in before]:
            raise SpecError("a resize cannot change the GPUs of a tenant: create a new tenant instead")
        _admit(base, after, exclude=path.name, before=before, memory_totals=memory_totals)
        generation = write_limits_in_place(path, after)
        _note_shrinks(path, before, after)
    return before, after, generation


SHRUNK_KEY = "shrunk_from_bytes"


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


def shrunk_from(meta: Mapping[str, Any]) -> dict[str, int]:
    """GPU UUID -> the cap a tenant had before its memory was shrunk (see _note_shrinks)."""
    value = meta.get(SHRUNK_KEY)
    if not isinstance(value, dict):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int)}


# ---------------------------------------------------------------------------------------------
# The node's admission policy, written by the agent so that `sharegpu run` without it applies
# the same rule.

ADMISSION_FILE = "admission.json"


def write_admission_policy(root: Path, *, allow_overcommit: bool) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{ADMISSION_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"allow_overcommit": allow_overcommit}) + "\n")
    os.replace(tmp, root / ADMISSION_FILE)


def overcommit_allowed(root: Path | None = None) -> bool:
    """Whether memory caps may sum past a card: the agent's --allow-overcommit, last set."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        policy = json.loads(((root or runtime_dir()) / ADMISSION_FILE).read_text())
        return bool(policy.get("allow_overcommit", False))
    return False


# ---------------------------------------------------------------------------------------------
# Reading regions.


def _check_header(hdr: abi.RegionHeader, magic: int, need: int, what: Path) -> None:
    if hdr.magic != magic:
        raise ConfigError(f"{what}: not a sharegpu region (bad magic {hdr.magic:#x})")
    if hdr.abi_major != abi.ABI_MAJOR:
        raise ConfigError(f"{what}: ABI {hdr.abi_major}.{hdr.abi_minor}, this is {abi.ABI_MAJOR}.x")
    if hdr.total_size < need:
        raise ConfigError(f"{what}: region is {hdr.total_size} bytes, need {need}")


def _mapped_region(path: Path, size: int, magic: int) -> mmap.mmap:
    """The region at `path`, mapped read-only, with its header checked."""
    view = regionmap.mapped(path)
    if len(view) < ctypes.sizeof(abi.RegionHeader):
        raise ConfigError(f"{path}: truncated ({len(view)} bytes)")
    _check_header(abi.RegionHeader.from_buffer_copy(view), magic, size, path)
    if len(view) < size:
        raise ConfigError(f"{path}: truncated ({len(view)} of {size} bytes)")
    return view


def _read_region(path: Path, struct: type[ctypes.Structure], magic: int) -> ctypes.Structure:
    return struct.from_buffer_copy(_mapped_region(path, ctypes.sizeof(struct), magic))


def read_limits(path: Path) -> abi.Limits:
    """Read a limits file with the seqlock protocol (retry while a writer is active)."""
    for _ in range(100):
        region = _read_region(path / abi.LIMITS_FILE, abi.Limits, abi.MAGIC_LIMITS)
        assert isinstance(region, abi.Limits)
        if region.generation % 2 == 0:
            if region.device_count > abi.MAX_DEVICES:
                raise ConfigError(f"{path / abi.LIMITS_FILE}: device_count {region.device_count} too large")
            return region
        time.sleep(0.001)
    raise ConfigError(f"{path / abi.LIMITS_FILE}: a writer never finished (generation stays odd)")


def read_device_limits(path: Path) -> list[DeviceLimit]:
    """The vGPUs in `path`/limits as DeviceLimit (read under the seqlock)."""
    limits = read_limits(path)
    return [
        DeviceLimit(
            uuid=abi.bytes_to_uuid(bytes(d.uuid)),
            mem_cap_bytes=int(d.mem_cap_bytes),
            policy=int(d.policy),
            priority=int(d.priority),
            share_permille=int(d.share_permille),
            ceiling_permille=int(d.ceiling_permille),
            weight=int(d.weight),
        )
        for d in limits.devices[: limits.device_count]
    ]


@dataclass
class UsageSnapshot:
    """A copy of a usage region: its per-device totals and its occupied process slots only (a
    region has 256 slots, nearly all empty; copying and walking them all was the agent's main
    cost)."""

    hdr: abi.RegionHeader
    slot_count: int
    device_count: int
    recoveries: int
    devices: ctypes.Array[abi.UsageDevice]
    procs: list[abi.UsageProc]  # occupied slots (pid != 0), in slot order
    slots: list[int]  # their indexes
    path: Path | None = None  # the tenant directory it was read from


_PROCS_AT = abi.Usage.procs.offset
_SLOT_SIZE = ctypes.sizeof(abi.UsageProc)
_PID_AT = abi.UsageProc.pid.offset


def _u32(view: mmap.mmap, at: int) -> int:
    return int.from_bytes(view[at : at + 4], "little")


def read_usage(path: Path) -> UsageSnapshot:
    view = _mapped_region(path / abi.USAGE_FILE, ctypes.sizeof(abi.Usage), abi.MAGIC_USAGE)
    import numpy as np  # here, not at the top: the CDI hooks import this module and never call this

    pids = np.ndarray(
        (abi.MAX_PROCS,), dtype=np.int32, buffer=view, offset=_PROCS_AT + _PID_AT, strides=(_SLOT_SIZE,)
    )
    slots = [int(i) for i in np.flatnonzero(pids)]
    procs = [abi.UsageProc.from_buffer_copy(view, _PROCS_AT + i * _SLOT_SIZE) for i in slots]
    del pids  # the array holds an export of the mapping
    return UsageSnapshot(
        hdr=abi.RegionHeader.from_buffer_copy(view),
        slot_count=_u32(view, abi.Usage.slot_count.offset),
        device_count=_u32(view, abi.Usage.device_count.offset),
        recoveries=int.from_bytes(
            view[abi.Usage.recoveries.offset : abi.Usage.recoveries.offset + 8], "little"
        ),
        devices=(abi.UsageDevice * abi.MAX_DEVICES).from_buffer_copy(view, abi.Usage.devices.offset),
        procs=[p for p in procs if p.pid != 0],  # a slot freed between the two reads
        slots=[i for i, p in zip(slots, procs, strict=True) if p.pid != 0],
        path=path,
    )


def process_uid(pid: int) -> int | None:
    """The real uid of process `pid` (/proc/<pid>/status), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if the pid is gone."""
    return liveness.start_time(pid)


def slot_host_pid(proc: abi.UsageProc) -> int | None:
    """The pid in this namespace of a slot's process (a container's process has another one in
    its own namespace), None when it cannot be seen from here."""
    if proc.host_pid:
        return int(proc.host_pid)
    return liveness.host_pids.resolve(int(proc.pidns), int(proc.pid), int(proc.start_time))


def slot_alive(tenant: Path, index: int, proc: abi.UsageProc) -> bool:
    """The shim's rule (liveness.py): the slot's liveness lock, else pid plus start time (never
    pid alone: pids are reused), judged only from the writer's pid namespace."""
    if proc.host_pid:  # learned by the agent: a pid of the host's namespace
        return process_start_time(int(proc.host_pid)) == int(proc.start_time)
    return liveness.entry_alive(
        tenant / abi.USAGE_FILE,
        index,
        flags=int(proc.flags),
        pidns=int(proc.pidns),
        pid=int(proc.pid),
        start=int(proc.start_time),
    )


_meta_cache: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def read_meta(path: Path) -> dict[str, Any]:
    """The tenant's meta.json ({} when missing or unreadable: it is for humans and reapers).

    The agent asks for every tenant's several times a second; a parsed copy is kept while the
    file keeps its inode, size and mtime (it is only ever replaced by rename).  Callers get their
    own top-level copy: they may set keys, not change nested values in place."""
    name = str(path / "meta.json")
    try:
        st = os.stat(name)
    except OSError:
        _meta_cache.pop(name, None)
        return {}
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _meta_cache.get(name)
    if hit is not None and hit[0] == ident:
        return dict(hit[1])
    with contextlib.suppress(OSError, ValueError):
        with open(name, encoding="utf-8") as f:
            meta = json.load(f)
        if isinstance(meta, dict):
            if len(_meta_cache) > 4096:
                _meta_cache.clear()
            _meta_cache[name] = (ident, meta)
            return dict(meta)
    return {}


def tenant_status(path: Path) -> TenantStatus:
    meta = read_meta(path)
    try:
        limits = read_limits(path)
        usage = read_usage(path)
    except ConfigError as err:
        return TenantStatus(id=path.name, path=path, devices=[], processes=[], meta=meta, error=str(err))
    uuids = [abi.bytes_to_uuid(bytes(d.uuid)) for d in limits.devices[: limits.device_count]]
    processes = []
    live_bytes = [0] * limits.device_count
    # The slot's own index, not its place among the occupied ones: its liveness lock is there.
    for index, proc in zip(usage.slots, usage.procs, strict=True):
        alive = slot_alive(path, index, proc)
        # A process's spare (charged, not allocated: ledger.c) is free memory, not its use.
        allocated = [
            max(0, proc.dev[i].mem_bytes - proc.dev[i].spare_bytes) for i in range(limits.device_count)
        ]
        per_dev = {uuids[i]: allocated[i] for i in range(limits.device_count) if allocated[i]}
        if alive:
            for i in range(limits.device_count):
                live_bytes[i] += allocated[i]
        here = slot_host_pid(proc) if alive else None
        processes.append(
            ProcessUsage(
                pid=proc.pid,
                host_pid=here or 0,
                alive=alive,
                container=container_of_process(here, int(proc.start_time)) if here else None,
                mem_bytes=per_dev,
                oom_events=sum(proc.dev[i].oom_events for i in range(limits.device_count)),
            )
        )
    devices = [
        DeviceUsage(
            uuid=uuids[i],
            mem_cap_bytes=limits.devices[i].mem_cap_bytes,
            # Dead processes still in the ledger are not using memory: show live usage only.
            mem_used_bytes=live_bytes[i],
            overhead_bytes=usage.devices[i].overhead_bytes,
            mem_peak_bytes=usage.devices[i].mem_peak_bytes,
            oom_events=usage.devices[i].oom_events,
        )
        for i in range(limits.device_count)
    ]
    return TenantStatus(
        id=limits.tenant_id.decode(), path=path, devices=devices, processes=processes, meta=meta
    )


def iter_tenants(root: Path | None = None) -> Iterator[Path]:
    base = tenants_dir(root)
    try:
        with os.scandir(base) as entries:  # d_type: no stat() per entry
            names = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return
    for name in names:
        yield base / name
