"""The per-GPU arbiter region: create it, tune it, read it.

One region per physical GPU, ``<runtime>/gpus/<uuid>/arbiter`` (``struct sg_arbiter`` in
``native/include/sharegpu/abi.h``), shared by every tenant on that GPU: the shims in the tenants'
processes pass the GPU's one token between them through it (docs/design/arbitration.md). Each
tenant directory links ``gpus`` to ``<runtime>/gpus``, so the shim finds it at
``<tenant dir>/gpus/<uuid>/arbiter``.

``ensure_arbiter`` is idempotent and race-free between concurrent callers (``flock`` on
``<runtime>/gpus/.lock``): the first call publishes the region (temporary file, robust
process-shared mutex initialised through libc, rename); later calls validate and return it. An
existing region is never rewritten, since live tenants use it; a corrupt one is reported
(``ConfigError``) and the shims of its GPU fail closed until it is removed.

The region is writable by the tenants on the GPU. Nothing in it is a limit (limits live in
each tenant's read-only ``limits`` file), but a hostile tenant can corrupt it and so disturb the
arbitration of its GPU; the agent's NVML audit is the backstop (threat model).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

from sharegpu import access
from sharegpu.errors import ConfigError, SpecError, TenantError
from sharegpu.regions import abi, agentlib
from sharegpu.regions.files import (
    header_problem,
    init_robust_mutex,
    mapped_region,
    new_header,
    publish_region,
)

LOCK_FILE = ".lock"


def arbiter_path(root: Path, uuid: str) -> Path:
    """``<root>/gpus/<uuid>/arbiter`` (uuid in NVML form, ``GPU-...``)."""
    return root / abi.GPUS_DIR / _canonical_uuid(uuid) / abi.ARBITER_FILE


def _canonical_uuid(uuid: str) -> str:
    try:
        return abi.bytes_to_uuid(abi.uuid_to_bytes(uuid))
    except ValueError as err:
        raise SpecError(f"invalid GPU UUID {uuid!r}: expected GPU-xxxxxxxx-xxxx-...") from err


# ---------------------------------------------------------------------------------------------
# The tunables: the one place their names, ranges, defaults and storage are written.


@dataclass(frozen=True)
class Tunable:
    """One tunable of the region. `name` is its field in ``struct sg_arbiter``, and also its
    keyword in tune_arbiter and check_tunables, its field in ArbiterStatus and the API's view,
    and its key in the agent's settings (sharegpu.agent.tuning)."""

    name: str
    what: str  # the one-line error: "invalid {what} {value}[ ns]: {allowed}"
    allowed: str
    doc: str  # one line, for the metrics' help
    default: int  # as stored in the region; quantum_ns: ensure_arbiter's argument
    low: int = 0
    high: int = 0
    nanoseconds: bool = False
    codes: Mapping[str, int] = field(default_factory=dict, hash=False)  # name -> code (online_preempt)

    def check(self, value: object) -> int | str:
        """`value`, or SpecError (one line) when the tunable cannot take it."""
        if self.codes:
            if not isinstance(value, str) or value not in self.codes:
                raise SpecError(f"invalid {self.what} {value!r}: {self.allowed}")
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"invalid {self.what} {value!r}: {self.allowed}")
        if not self.low <= value <= self.high:
            unit = " ns" if self.nanoseconds else ""
            raise SpecError(f"invalid {self.what} {value}{unit}: {self.allowed}")
        return value

    def stored(self, value: int | str) -> int:
        """`value` as the region holds it (checked first)."""
        return self.codes[str(value)] if self.codes else int(value)


PREEMPT_MODES: tuple[str, ...] = tuple(abi.ARB_PREEMPT_NAMES.values())  # "drain", "early", "by-kernel"

TUNABLES: dict[str, Tunable] = {
    t.name: t
    for t in (
        Tunable(
            "quantum_ns",
            what="quantum",
            allowed=f"must be between {abi.ARB_MIN_QUANTUM_NS} ns and {abi.ARB_MAX_QUANTUM_NS} ns",
            doc="Longest hold of the GPU before it is handed on to a waiter",
            default=abi.ARB_DEFAULT_QUANTUM_NS,
            low=abi.ARB_MIN_QUANTUM_NS,
            high=abi.ARB_MAX_QUANTUM_NS,
            nanoseconds=True,
        ),
        Tunable(
            "offline_inflight_max",
            what="offline in-flight bound",
            allowed=f"must be 1 to {1 << 20}",
            doc="While online tenants are active, an offline holder synchronises after this many launches",
            default=abi.ARB_DEFAULT_OFFLINE_INFLIGHT,
            low=1,
            high=1 << 20,
        ),
        Tunable(
            "online_window_ns",
            what="online window",
            allowed="must be 0 to 60 s",
            doc="An online tenant counts as active this long after its last request",
            default=abi.ARB_DEFAULT_ONLINE_WINDOW_NS,
            high=60 * 10**9,
            nanoseconds=True,
        ),
        Tunable(
            "holdback_max_ns",
            what="hold-back limit",
            allowed="must be 0 (off) to 1 s",
            doc="Longest offline hold-back ahead of a predicted online request; 0: prediction off",
            default=abi.ARB_DEFAULT_HOLDBACK_MAX_NS,
            high=10**9,
            nanoseconds=True,
        ),
        Tunable(
            "online_preempt",
            what="online preemption",
            allowed=f"one of {', '.join(PREEMPT_MODES)}",
            doc="How a higher-class request takes the card from a lower-class holder: "
            + ", ".join(f"{code} {name}" for code, name in abi.ARB_PREEMPT_NAMES.items()),
            default=abi.ARB_DEFAULT_ONLINE_PREEMPT,
            codes={name: code for code, name in abi.ARB_PREEMPT_NAMES.items()},
        ),
        Tunable(
            "preempt_min_kernel_ns",
            what="preemption threshold",
            allowed="must be 0 to 1 s",
            doc="by-kernel: the holder's kernel length from which it is preempted early",
            default=abi.ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS,
            high=10**9,
            nanoseconds=True,
        ),
        Tunable(
            "handoff",
            what="hand-over",
            allowed=f"one of {', '.join(abi.ARB_HANDOFF_NAMES.values())}",
            doc="How the token moves within a class at a sync that covers the holder's work: "
            + ", ".join(f"{code} {name}" for code, name in abi.ARB_HANDOFF_NAMES.items()),
            default=abi.ARB_DEFAULT_HANDOFF,
            codes={name: code for code, name in abi.ARB_HANDOFF_NAMES.items()},
        ),
        Tunable(
            "offline_quiet_ns",
            what="quiet window",
            allowed="must be 0 (off) to 1 s",
            doc="No offline grant for this long after an online request; 0: off",
            default=abi.ARB_DEFAULT_OFFLINE_QUIET_NS,
            high=10**9,
            nanoseconds=True,
        ),
    )
}


class Tunables(TypedDict, total=False):
    """The keywords of tune_arbiter and check_tunables: TUNABLES' names (for the type checker;
    a test holds the two equal). None: not given."""

    quantum_ns: int | None
    offline_inflight_max: int | None
    online_window_ns: int | None
    holdback_max_ns: int | None
    online_preempt: str | None
    preempt_min_kernel_ns: int | None
    handoff: str | None
    offline_quiet_ns: int | None


def _given(caller: str, given: Mapping[str, object]) -> list[tuple[Tunable, int | str]]:
    """The tunables given (not None), in TUNABLES' order, each checked: SpecError for the first
    out of its range; TypeError for a name that is none, as for any unknown keyword."""
    unknown = sorted(given.keys() - TUNABLES.keys())
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    found = []
    for tunable in TUNABLES.values():
        value = given.get(tunable.name)
        if value is not None:
            found.append((tunable, tunable.check(value)))
    return found


@contextlib.contextmanager
def _gpus_lock(gpus: Path) -> Iterator[None]:
    fd = os.open(gpus / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _init_region(view: mmap.mmap, uuid: str, quantum_ns: int) -> None:
    region = abi.Arbiter.from_buffer(view)
    region.hdr = new_header(abi.MAGIC_ARBITER, abi.ARB_FILE_SIZE)
    region.uuid[:] = abi.uuid_to_bytes(uuid)
    region.tenant_slots = abi.ARB_MAX_TENANTS
    region.client_slots = abi.ARB_MAX_CLIENTS
    for tunable in TUNABLES.values():
        setattr(region, tunable.name, tunable.default)
    region.quantum_ns = quantum_ns
    init_robust_mutex(ctypes.addressof(region) + abi.Arbiter.lock.offset, "GPU arbiter")
    del region  # release the buffer export before the mmap closes


def _problem(data: bytes, path: Path, uuid: str) -> tuple[str, bool] | None:
    """What creation checks of an existing region: its header and its GPU. (message, damaged),
    or None; a region of another ABI major is not damage (a newer sharegpu wrote it). The
    shim's full rule is agentlib.arbiter_problem."""
    size = ctypes.sizeof(abi.Arbiter)
    if (problem := header_problem(data, abi.MAGIC_ARBITER, size, path, "arbiter")) is not None:
        return problem
    region = abi.Arbiter.from_buffer_copy(data[:size])
    if bytes(region.uuid) != abi.uuid_to_bytes(uuid):
        return f"{path}: the region belongs to {abi.bytes_to_uuid(bytes(region.uuid))}", True
    return None


def _validate(path: Path, uuid: str) -> None:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    if (problem := _problem(data, path, uuid)) is not None:
        raise ConfigError(problem[0])


def arbiter_damage(path: Path, uuid: str) -> str | None:
    """Why the shim would refuse this region (its own rule, run in libsgagent.so:
    shim/arbregion.c sg_arb_region_problem), or that it is marked broken; None when it is usable
    or missing. A region of another ABI major is not damage (a newer sharegpu wrote it): None."""
    problem = agentlib.arbiter_problem(path, uuid)
    return problem[0] if problem is not None and problem[1] else None


def rebuild_arbiter(root: Path, uuid: str) -> tuple[str, Path] | None:
    """Replace a damaged region by a fresh one: (what was wrong, where the damaged file was
    moved), or None when it was not damaged.  Processes that mapped the old file keep it until
    they restart; every process from now on arbitrates on the new one."""
    uuid = _canonical_uuid(uuid)
    gpus = root / abi.GPUS_DIR
    path = gpus / uuid / abi.ARBITER_FILE
    with _gpus_lock(gpus):
        damage = arbiter_damage(path, uuid)
        if damage is None:
            return None
        moved = path.with_name(f"{abi.ARBITER_FILE}.damaged-{time.time_ns()}")
        # Kept under a second name first, then replaced in one rename: a process that opens the
        # path meanwhile finds the old region or the new one, never none (which fails it closed).
        try:
            os.link(path, moved)
        except OSError as err:
            raise TenantError(f"cannot keep the damaged {path} aside: {err.strerror}") from err
        # The defaults, not the old file's tunables: a tenant may have written those. The agent's
        # tuner brings the new region to the configured settings at its next pass.
        _create(path, uuid, abi.ARB_DEFAULT_QUANTUM_NS)
        _keep_grants(moved, path)
        _prune_damaged(path.parent)
    return damage, moved


KEEP_DAMAGED = 5  # damaged regions kept per GPU for a post-mortem


def _prune_damaged(directory: Path) -> None:
    """Only the newest KEEP_DAMAGED damaged files stay: a tenant that breaks its GPU's region
    again and again must not fill the runtime directory."""
    kept = sorted(
        directory.glob(f"{abi.ARBITER_FILE}.damaged-*"), key=lambda p: p.name.rsplit("-", 1)[-1].zfill(24)
    )
    for old in kept[:-KEEP_DAMAGED]:
        with contextlib.suppress(OSError):
            old.unlink()


def _keep_grants(old: Path, new: Path) -> None:
    """The tenant owners the old region let in (ACL entries, or world-writable) keep their way in."""
    try:
        if access.world_writable(old):
            new.chmod(0o666)
        for uid in access.acl_users(old):
            access.grant(new, uid)
    except OSError as err:
        raise TenantError(f"cannot give {new} the grants of {old}: {err.strerror}") from err


def grant_arbiter(root: Path, uuid: str, uid: int) -> bool:
    """Let the processes of user `uid` (a tenant's owner) use the GPU's arbiter region: a POSIX
    ACL entry (sharegpu.access).  False when the filesystem has no ACLs (the region is then made
    world-writable, which doctor reports)."""
    path = arbiter_path(root, uuid)
    try:
        return access.grant(path, uid)
    except OSError as err:
        raise TenantError(f"cannot let uid {uid} use {path}: {err.strerror}") from err


def ensure_arbiter(root: Path, uuid: str, quantum_ns: int | None = None) -> Path:
    """Create ``<root>/gpus/<uuid>/arbiter`` if it does not exist; return its path.

    ``quantum_ns`` applies only when this call creates the region (default: the measured
    ``abi.ARB_DEFAULT_QUANTUM_NS``); use ``tune_arbiter`` to change a live one.
    """
    uuid = _canonical_uuid(uuid)
    quantum = quantum_ns if quantum_ns is not None else TUNABLES["quantum_ns"].default
    TUNABLES["quantum_ns"].check(quantum)
    gpus = root / abi.GPUS_DIR
    directory = gpus / uuid
    path = directory / abi.ARBITER_FILE
    try:
        gpus.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as err:
        raise TenantError(f"cannot create {gpus}: {err.strerror}") from err
    with _gpus_lock(gpus):
        if path.exists():
            _validate(path, uuid)
            return path
        try:
            directory.mkdir(exist_ok=True, mode=0o755)
        except OSError as err:
            raise TenantError(f"cannot create {directory}: {err.strerror}") from err
        _create(path, uuid, quantum)
    return path


def _create(path: Path, uuid: str, quantum_ns: int) -> None:
    """Write a fresh region at `path` atomically, mode 0600 (its creator; each tenant owner is
    granted by ACL, grant_arbiter).  Caller holds the gpus lock."""
    size = abi.ARB_FILE_SIZE
    publish_region(
        path.parent, path.name, None, size, 0o600, fill=lambda view: _init_region(view, uuid, quantum_ns)
    )


def check_tunables(**given: Unpack[Tunables]) -> None:
    """Raise SpecError (one line) for the first tunable out of its range, in TUNABLES' order;
    None means not given. tune_arbiter and the agent's settings check through TUNABLES too."""
    _given("check_tunables", given)


def tune_arbiter(path: Path, **given: Unpack[Tunables]) -> None:
    """Change the tunables of a live region (single aligned stores; shims read them at grants).
    Only the fields given are written; every one is checked first, so a bad value changes
    nothing. `online_preempt` is "drain", "early" or "by-kernel" (docs/design/arbitration.md)."""
    _validate_header_only(path)
    changes = _given("tune_arbiter", given)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Arbiter)) as view:
            region = abi.Arbiter.from_buffer(view)
            for tunable, value in changes:
                setattr(region, tunable.name, tunable.stored(value))
            del region
    finally:
        os.close(fd)


def _validate_header_only(path: Path) -> None:
    try:
        with path.open("rb") as f:
            raw = f.read(ctypes.sizeof(abi.RegionHeader))
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    header = ctypes.sizeof(abi.RegionHeader)
    if (problem := header_problem(raw, abi.MAGIC_ARBITER, header, path, "arbiter")) is not None:
        raise ConfigError(problem[0])


# ---------------------------------------------------------------------------------------------
# Reading.


@dataclass
class ArbiterTenant:
    """One tenant's entry: its configuration as the shims copied it and its totals on the GPU."""

    id: str
    incarnation: int  # the tenant's (limits); an entry of another is a deleted namesake's
    policy: str
    priority: str
    share_permille: int
    ceiling_permille: int
    weight: int
    clients: int
    gpu_time_ns: int
    wait_ns: int
    throttled_ns: int
    preemptions: int
    grants: int
    vtime: int
    bucket_ns: int


@dataclass
class ArbiterClient:
    pid: int
    start_time: int  # with pid, tells a live client from a dead one whose pid was reused
    tenant: str
    state: str
    holding: bool
    grant_ns: int  # CLOCK_MONOTONIC of its last charge (of its grant, if charged since)
    gpu_time_ns: int
    wait_ns: int
    throttled_ns: int
    preemptions: int


@dataclass
class ArbiterStatus:
    """A snapshot of one GPU's arbiter (copied without the lock: counters may be a few ns apart)."""

    path: Path
    uuid: str
    quantum_ns: int
    offline_inflight_max: int
    online_window_ns: int
    holdback_max_ns: int
    online_period_ns: int  # learned period of online requests; 0: none
    online_jitter_ns: int
    online_samples: int
    holdbacks: int  # offline launches held back ahead of a predicted online request
    holdback_ns: int
    holdback_misses: int  # hold-backs whose predicted request never came
    holder_pid: int | None
    waiting: int
    grants: int
    handovers: int
    handover_idle_ns: int
    reclaims: int  # tokens taken back from dead holders
    recoveries: int
    stall_reclaims: int = 0  # tokens taken back from holders stopped past their quantum (1.3)
    entry_waits: int = 0  # processes that waited for a client entry instead of failing (1.3)
    online_preempt: str = "drain"  # how a higher class takes the card (1.5)
    preempt_min_kernel_ns: int = 0
    offline_quiet_ns: int = 0  # quiet window after each online request (1.5)
    early_preemptions: int = 0  # grants to a higher class before the holder's drain (1.5)
    quiet_windows: int = 0
    lock_timeouts: int = 0  # lock attempts that gave up at the deadline (1.7)
    broken_since_ns: int = 0  # CLOCK_MONOTONIC of the first; 0: healthy
    online_stalls: int = 0  # runs of off-beat online requests that ended on the beat (1.8)
    online_relearns: int = 0  # changed request patterns learned from off-beat requests (1.8)
    loans: int = 0  # grants lent for a holder's host gap (1.10)
    online_gap_ns: int = 0  # learned host time of a closed-loop service after a request (1.11)
    online_gap_samples: int = 0  # consistent such gaps in a row
    handoff: str = "drain"  # how the token moves within a class at a covering sync (1.12)
    queued_handovers: int = 0  # hand-overs made before the holder's work ended (1.12)
    gated_holds: int = 0  # holds whose first work waited on the GPU for the last holder's
    gates_opened: int = 0  # of those, gates a holder opened itself (bound passed, holder dead)
    gate_wait_ns: int = 0  # time first work waited at those gates (not charged)
    tenants: list[ArbiterTenant] = field(default_factory=list)
    clients: list[ArbiterClient] = field(default_factory=list)

    def tenant(self, tenant_id: str, incarnation: int | None = None) -> ArbiterTenant | None:
        """The entry of `tenant_id` (of that incarnation when given: an entry of the same name and
        another incarnation is a deleted tenant's, none of whose figures are the new one's)."""
        return next(
            (
                t
                for t in self.tenants
                if t.id == tenant_id and (incarnation is None or t.incarnation == incarnation)
            ),
            None,
        )

    @property
    def broken(self) -> bool:
        """A lock timed out: the GPU runs unarbitrated until the agent replaces the region."""
        return self.broken_since_ns != 0

    @property
    def mean_handover_idle_ns(self) -> float:
        return self.handover_idle_ns / self.handovers if self.handovers else 0.0


_TENANT_ID_AT = abi.Arbiter.tenants.offset + abi.ArbTenant.tenant_id.offset
_CLIENTS_AT = abi.Arbiter.clients.offset + abi.ArbClient.pid.offset


def _handoff_totals(data: bytes | mmap.mmap, region: abi.Arbiter) -> tuple[int, int, int, int]:
    """The hand-over records' counters summed over the client entries (1.12): queued
    hand-overs, gated holds, gates opened by their holder, gate wait; zeros for a region
    without the records."""
    base = abi.ARB_HANDOFFS_OFFSET
    if region.hdr.total_size < abi.ARB_FILE_SIZE or len(data) < abi.ARB_FILE_SIZE:
        return 0, 0, 0, 0
    records = abi.ArbHandoffs.from_buffer_copy(data[base : abi.ARB_FILE_SIZE]).h
    return (
        sum(r.queued for r in records),
        sum(r.gated for r in records),
        sum(r.gates_opened for r in records),
        sum(r.gate_wait_ns for r in records),
    )


def read_arbiter(path: Path) -> ArbiterStatus:
    """Read an arbiter region (validated: magic, ABI major, size)."""
    size = ctypes.sizeof(abi.Arbiter)
    data = mapped_region(path, abi.MAGIC_ARBITER, size, "arbiter")
    region = abi.Arbiter.from_buffer_copy(data)
    queued, gated, opened, gate_wait = _handoff_totals(data, region)
    # Walk only the occupied entries (most of the 64 + 256 are empty): found with numpy.
    import numpy as np  # here, not at the top: the CDI hooks import this module and never call this

    raw = np.frombuffer(data, dtype=np.uint8, count=size)
    used_tenants = np.flatnonzero(raw[_TENANT_ID_AT :: ctypes.sizeof(abi.ArbTenant)][: abi.ARB_MAX_TENANTS])
    stride = ctypes.sizeof(abi.ArbClient)
    client_pids = np.ndarray(
        (abi.ARB_MAX_CLIENTS,), dtype=np.int32, buffer=raw, offset=_CLIENTS_AT, strides=(stride,)
    )
    used_clients = np.flatnonzero(client_pids)
    del raw, client_pids
    tenants_by_index: dict[int, str] = {}
    tenants = []
    for i in map(int, used_tenants):
        t = region.tenants[i]
        if not t.tenant_id:
            continue
        tid = t.tenant_id.decode(errors="replace")
        tenants_by_index[i] = tid
        tenants.append(
            ArbiterTenant(
                id=tid,
                incarnation=int(t.incarnation),
                policy=abi.POLICY_NAMES.get(t.policy, str(t.policy)),
                priority=abi.PRIORITY_NAMES.get(t.priority, str(t.priority)),
                share_permille=t.share_permille,
                ceiling_permille=t.ceiling_permille,
                weight=t.weight,
                clients=t.clients,
                gpu_time_ns=t.gpu_time_ns,
                wait_ns=t.wait_ns,
                throttled_ns=t.throttled_ns,
                preemptions=t.preemptions,
                grants=t.grants,
                vtime=t.vtime,
                bucket_ns=t.bucket_ns,
            )
        )
    holder = abi.token_holder(region.token)
    clients = []
    holder_pid = None
    for i in map(int, used_clients):
        c = region.clients[i]
        if c.pid == 0:
            continue
        if i == holder:
            holder_pid = c.pid
        clients.append(
            ArbiterClient(
                pid=c.pid,
                start_time=c.start_time,
                tenant=tenants_by_index.get(c.tenant, "?"),
                state=abi.ARB_STATE_NAMES.get(c.state, str(c.state)),
                holding=i == holder,
                grant_ns=c.grant_ns,
                gpu_time_ns=c.gpu_time_ns,
                wait_ns=c.wait_ns,
                throttled_ns=c.throttled_ns,
                preemptions=c.preemptions,
            )
        )
    return ArbiterStatus(
        path=path,
        uuid=abi.bytes_to_uuid(bytes(region.uuid)),
        quantum_ns=region.quantum_ns,
        offline_inflight_max=region.offline_inflight_max,
        online_window_ns=region.online_window_ns,
        holdback_max_ns=region.holdback_max_ns,
        online_period_ns=region.online_period_ns,
        online_jitter_ns=region.online_jitter_ns,
        online_samples=region.online_samples,
        holdbacks=region.holdbacks,
        holdback_ns=region.holdback_ns,
        holdback_misses=region.holdback_misses,
        holder_pid=holder_pid,
        waiting=region.waiting,
        grants=region.grants,
        handovers=region.handovers,
        handover_idle_ns=region.handover_idle_ns,
        reclaims=region.reclaims,
        recoveries=region.recoveries,
        stall_reclaims=region.stall_reclaims,
        lock_timeouts=region.lock_timeouts,
        broken_since_ns=region.broken_since_ns,
        entry_waits=region.entry_waits,
        online_preempt=abi.ARB_PREEMPT_NAMES.get(region.online_preempt, str(region.online_preempt)),
        preempt_min_kernel_ns=region.preempt_min_kernel_ns,
        offline_quiet_ns=region.offline_quiet_ns,
        early_preemptions=region.early_preemptions,
        quiet_windows=region.quiet_windows,
        online_stalls=region.online_stalls,
        online_relearns=region.online_relearns,
        loans=region.loans,
        online_gap_ns=region.online_gap_ns,
        online_gap_samples=region.online_gap_samples,
        handoff=abi.ARB_HANDOFF_NAMES.get(region.handoff, str(region.handoff)),
        queued_handovers=queued,
        gated_holds=gated,
        gates_opened=opened,
        gate_wait_ns=gate_wait,
        tenants=tenants,
        clients=clients,
    )


def iter_arbiters(root: Path) -> Iterator[Path]:
    """Every arbiter region under ``<root>/gpus``."""
    gpus = root / abi.GPUS_DIR
    if not gpus.is_dir():
        return
    for entry in sorted(gpus.iterdir()):
        path = entry / abi.ARBITER_FILE
        if entry.is_dir() and path.is_file():
            yield path


__all__ = [
    "PREEMPT_MODES",
    "TUNABLES",
    "ArbiterClient",
    "ArbiterStatus",
    "ArbiterTenant",
    "Tunable",
    "Tunables",
    "arbiter_path",
    "check_tunables",
    "ensure_arbiter",
    "iter_arbiters",
    "read_arbiter",
    "tune_arbiter",
]
