"""The agent's service: the local tenant service (sharegpu.service.local: create, resize,
delete) plus the store and the events; recovery and adoption; the views the API serves.

Every change runs under an asyncio lock (one change at a time inside the agent) and, in a worker
thread, the local service's steps under the node lock of sharegpu.tenant (flock), which every
door takes too when no agent answers: so two API calls racing for the last MiB of a card, or an
API call and a CLI user, see each other, and exactly one wins.

The tenant directories are the truth for limits and usage; the store (SQLite) adds what they do
not say and the event history. `sync` reconciles the two: a directory the store does not know is
adopted (made by `sharegpu run` without the agent, or while it was down), a row whose directory
vanished is dropped with an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from sharegpu.agent.busy import BusyMeter
from sharegpu.agent.events import Event
from sharegpu.agent.models import (
    GpuView,
    TenantCreate,
    TenantResize,
    TenantView,
    gpu_views,
    tenant_view,
)
from sharegpu.agent.store import Store, TenantRow
from sharegpu.agent.tuning import ArbiterTuner, tuned_event
from sharegpu.devices import Gpu, GpuFault, gpu_faults, list_gpus
from sharegpu.errors import ConfigError, DeviceError, SpecError, TenantNotFound
from sharegpu.regions import abi
from sharegpu.report import ChargeKey, GpuTime, node_report, read_arbiters
from sharegpu.service import LocalTenantService, ResizeRequest, TenantRequest
from sharegpu.service.plan import compute_of
from sharegpu.service.settings import Changes
from sharegpu.spec import format_size
from sharegpu.tenant import (
    DeviceLimit,
    device_limit_of,
    iter_tenants,
    node_lock,
    read_device_limits,
    read_limits,
    read_meta,
    tenants_dir,
    write_limits_in_place,
)

log = logging.getLogger("sharegpu.agent")

ADOPT_AFTER_S = 10.0  # a directory without meta.json this old is adopted anyway


@dataclasses.dataclass
class LoopStats:
    interval_s: float
    ticks: int = 0
    errors: int = 0
    last_tick: float | None = None
    last_error: str | None = None
    cpu_seconds: float | None = None  # CPU its ticks took (thread time); None: not measured


def describe(devices: list[DeviceLimit]) -> str:
    """'512MiB on GPU-1234abcd, cap 30% normal' (and 'weight N' unless 1) for messages."""
    if not devices:
        return "no GPU"
    caps = {d.mem_cap_bytes for d in devices}
    mem = "/".join(format_size(c) for c in sorted(caps))
    where = ", ".join(d.uuid[:12] for d in devices)
    spec = compute_of(devices[0])
    if spec.policy == "native":
        compute = "native (memory only)"
    elif spec.policy == "burst":
        compute = f"burst {spec.share_permille / 10:g}%-{spec.ceiling_permille / 10:g}%"
    else:
        compute = f"{spec.policy} {spec.share_permille / 10:g}%"
    weight = f" weight {spec.weight}" if spec.weight != 1 else ""
    return f"{mem} on {where}, {compute} {spec.priority}{weight}"


def views(
    root: Path,
    rows: Mapping[str, TenantRow] | None = None,
    only: str | None = None,
    gpu_time: Mapping[ChargeKey, GpuTime] | None = None,
) -> list[TenantView]:
    """Every tenant (or `only` that one) as the API shows it (`gpu_time`: what the agent's meter
    measured per (tenant, incarnation, GPU uuid), see sharegpu.agent.busy: the arbitrated
    tenants' GPU time is the rate of their charges it measured)."""
    if only is not None and ("/" in only or only in (".", "..")):
        return []  # never a path: a tenant id names one directory under tenants/
    charges = None
    if gpu_time is not None:
        charges = {k: t.ratio for k, t in gpu_time.items() if t.source == "arbiter" and t.ratio is not None}
    reports = node_report(root, only, charges=charges)
    found = []
    for report in reports:
        name = report.path.name
        if only is not None and name != only:
            continue
        generation = None
        if report.error is None:
            with contextlib.suppress(ConfigError):
                generation = int(read_limits(report.path).generation)
        row = (rows or {}).get(name)
        meta = read_meta(report.path) or (row.spec.get("meta", {}) if row else {})
        measured = None
        if gpu_time is not None:
            measured = {
                uuid: measure
                for (tenant, incarnation, uuid), measure in gpu_time.items()
                if tenant == report.id and incarnation == report.incarnation
            }
        found.append(
            tenant_view(report, meta, generation=generation, managed=row is not None, gpu_time=measured)
        )
    return found


def resize_request(req: TenantResize) -> ResizeRequest:
    """The API's resize body (validated strings) as the service's request."""
    return ResizeRequest(
        memory_bytes=req.memory_bytes,
        compute=req.compute,
        ceiling=req.ceiling,
        policy=req.policy,
        priority=req.priority,
        weight=req.weight,
    )


class AgentService:
    """The agent's operations: the local tenant service (sharegpu.service.local) plus the store
    and the events; the API calls these, the daemon's loops call sync and record."""

    def __init__(
        self,
        root: Path,
        store: Store,
        *,
        allow_overcommit: bool = False,
        enforce: str = "report",
        gpu_source: Callable[[], list[Gpu]] = list_gpus,
        fault_source: Callable[[], list[GpuFault]] = gpu_faults,
    ) -> None:
        self.root = root
        self.store = store
        self.allow_overcommit = allow_overcommit
        self.enforce = enforce
        self.gpu_source = gpu_source
        self.fault_source = fault_source  # asked only when a GPU went away: why
        self.started = time.time()
        self.loops: dict[str, LoopStats] = {}
        self.known_gpus: list[Gpu] | None = None  # as of the last scan (scan_gpus)
        self.meter: BusyMeter | None = None  # the daemon's GPU-time loop, when it runs
        self.tuner: ArbiterTuner | None = None  # the daemon's arbiter settings, when it runs
        self.tenants = LocalTenantService(
            root,
            allow_overcommit=allow_overcommit,
            gpu_source=gpu_source,
            created_by="agent",
            tuner=self._tune,
        )
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._closing = False

    # -- reading -------------------------------------------------------------------------------

    def _views(self, only: str | None = None) -> list[TenantView]:
        gpu_time = self.meter.snapshot() if self.meter else None
        if only is None:
            rows = self.store.tenants()
        else:  # one row, not every tenant's parsed for one (each create and resize answers with one)
            row = self.store.tenant(only)
            rows = {only: row} if row is not None else {}
        return views(self.root, rows, only, gpu_time)

    def _view(self, tenant_id: str) -> TenantView:
        found = self._views(tenant_id)
        if not found:  # removed meanwhile (the reaper, or a user with the runtime directory)
            raise TenantNotFound(f"no tenant {tenant_id!r} on this node ({tenants_dir(self.root)})")
        return found[0]

    async def list_tenants(self) -> list[TenantView]:
        return await asyncio.to_thread(self._views)

    async def get_tenant(self, tenant_id: str) -> TenantView:
        return await asyncio.to_thread(self._view, tenant_id)

    def _gpu_views(self) -> list[GpuView]:
        gpus = self.gpu_source()
        return gpu_views(gpus, self._views(), read_arbiters(self.root, [g.uuid for g in gpus]))

    async def list_gpus(self) -> list[GpuView]:
        return await asyncio.to_thread(self._gpu_views)

    def tenant_count(self) -> int:
        return sum(1 for _ in iter_tenants(self.root))

    # -- changing --------------------------------------------------------------------------------

    async def create(self, req: TenantCreate) -> TenantView:
        async with self._lock:
            view, events = await asyncio.to_thread(self._create, req)
        await self.record(events)
        return view

    def _tune(self, region: Path) -> tuple[str, Changes]:
        """The configured arbiter settings on a region a creation may just have made, before the
        tenant's first launch (its processes start after the create answers; the tuner's loop
        would get there within a second): through the loop's tuner, one writer at a time."""
        if self.tuner is None:
            return self.tenants.tune_to_node_settings(region)
        return self.tuner.tune(region)

    def _create(self, req: TenantCreate) -> tuple[TenantView, list[Event]]:
        request = TenantRequest(
            name=req.name,
            memory_bytes=req.memory_bytes,
            gpus=req.selectors,
            compute=req.compute_spec(),
            supervisor_pid=req.supervisor_pid,
            owner=req.owner,
            pgid=req.pgid,
            command=req.command,
            labels=req.labels,
        )
        tenant, limits, tuned = self.tenants.create_reporting(request)
        meta = read_meta(tenant.path)
        spec = {"request": req.model_dump(), "devices": [dataclasses.asdict(d) for d in limits], "meta": meta}
        self.store.put_tenant(req.name, spec, created=time.time(), state="created")
        event = Event(
            kind="tenant.created",
            tenant=req.name,
            message=f"tenant {req.name} created: {describe(limits)}",
            data={"devices": spec["devices"], "labels": req.labels, "supervisor": meta.get("supervisor")},
        )
        return self._view(req.name), [*(tuned_event(u, c) for u, c in tuned.items()), event]

    async def resize(self, tenant_id: str, req: TenantResize) -> TenantView:
        async with self._lock:
            view, event = await asyncio.to_thread(self._resize, tenant_id, req)
        await self.record([event])
        return view

    def _resize(self, tenant_id: str, req: TenantResize) -> tuple[TenantView, Event]:
        _, before, after, generation = self.tenants.resize_reporting(tenant_id, resize_request(req))
        row = self.store.tenant(tenant_id)
        if row is not None:
            spec = dict(row.spec, devices=[dataclasses.asdict(d) for d in after])
            self.store.put_tenant(tenant_id, spec, created=row.created, state=row.state)
        view = self._view(tenant_id)
        message = (
            f"tenant {tenant_id} resized: {describe(before)} -> {describe(after)} (generation {generation})"
        )
        if view.note:
            message += f"; {view.note}"
        event = Event(
            kind="tenant.resized",
            severity="warning" if view.over_cap else "info",
            tenant=tenant_id,
            message=message,
            data={
                "before": [dataclasses.asdict(d) for d in before],
                "after": [dataclasses.asdict(d) for d in after],
                "generation": generation,
                "over_cap": view.over_cap,
            },
        )
        return view, event

    async def delete(self, tenant_id: str, *, incarnation: int | None = None, force: bool = False) -> None:
        async with self._lock:
            event = await asyncio.to_thread(self._delete, tenant_id, incarnation, force)
        await self.record([event])

    def _delete(self, tenant_id: str, incarnation: int | None, force: bool) -> Event:
        live = self.tenants.delete_reporting(tenant_id, incarnation=incarnation, force=force)
        self.store.delete_tenant(tenant_id)
        note = f" ({len(live)} live process(es) keep their limits until they exit)" if live else ""
        return Event(
            kind="tenant.deleted",
            tenant=tenant_id,
            message=f"tenant {tenant_id} deleted{note}",
            data={"forced": force, "live_pids": live},
        )

    # -- recovery and adoption -------------------------------------------------------------------

    async def sync(self, *, initial: bool = False) -> list[Event]:
        """Reconcile the store with the tenant directories (see the module docstring)."""
        async with self._lock:
            events = await asyncio.to_thread(self._sync, initial)
        return await self.record(events)

    def _sync(self, initial: bool) -> list[Event]:
        events = []
        lost = self.store.restore_if_lost()
        if lost is not None:
            message = (
                f"the agent's database {self.store.path} was {lost} while it ran: written again "
                "from its open copy"
            )
            log.error("%s", message)
            events.append(Event(kind="agent.store_restored", severity="error", message=message))
        rows = self.store.tenants()
        dirs = {p.name: p for p in iter_tenants(self.root)}
        now = time.time()
        for name, path in dirs.items():
            row = rows.get(name)
            if row is not None:
                if initial:
                    repaired = self._repair(path, row)
                    events.append(
                        Event(
                            kind="tenant.recovered",
                            tenant=name,
                            message=f"tenant {name} recovered{repaired}",
                            data={"adopted": False, "path": str(path)},
                        )
                    )
                continue
            meta = read_meta(path)
            if not meta:
                # `sharegpu run` writes meta.json last: wait for it, unless the tenant is old.
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime < ADOPT_AFTER_S:
                        continue
            try:
                devices = [dataclasses.asdict(d) for d in read_device_limits(path)]
            except ConfigError:
                devices = []
            created = meta.get("created")
            self.store.put_tenant(
                name,
                {"devices": devices, "meta": meta},
                created=float(created) if isinstance(created, int | float) else now,
                state="adopted",
            )
            events.append(
                Event(
                    kind="tenant.recovered",
                    tenant=name,
                    message=f"tenant {name} adopted: found in {path}, made without the agent",
                    data={"adopted": True, "path": str(path), "devices": devices},
                )
            )
        for name, row in rows.items():
            if name not in dirs and self.store.delete_tenant(name):
                events.append(
                    Event(
                        kind="tenant.deleted",
                        tenant=name,
                        message=f"tenant {name} forgotten: its directory vanished",
                        data={"reason": "directory vanished", "devices": row.spec.get("devices", [])},
                    )
                )
        return events

    def _repair(self, path: Path, row: TenantRow) -> str:
        """Finish a limits write that a writer (an agent killed mid-resize) left odd."""
        try:
            raw = (path / abi.LIMITS_FILE).read_bytes()
            region = abi.Limits.from_buffer_copy(raw[: len(bytes(abi.Limits()))])
        except (OSError, ValueError):
            return ""
        if region.generation % 2 == 0:
            return ""
        devices = [DeviceLimit(**d) for d in row.spec.get("devices", [])]
        if not devices:
            devices = [
                device_limit_of(d) for d in region.devices[: min(int(region.device_count), abi.MAX_DEVICES)]
            ]
        with node_lock(self.root):
            generation = write_limits_in_place(path, devices)
        return f" (its limits were left half-written; rewritten, generation {generation})"

    # -- GPUs ------------------------------------------------------------------------------------

    async def scan_gpus(self) -> list[Event]:
        """Look for GPUs that appeared or went away since the last scan."""
        try:
            gpus = await asyncio.to_thread(self.gpu_source)
        except DeviceError as err:
            if self.known_gpus is None:
                log.warning("GPU discovery failed: %s", err)
                self.known_gpus = []
            return []
        previous = self.known_gpus
        self.known_gpus = gpus
        if previous is None:
            return []
        old = {g.uuid: g for g in previous}
        new = {g.uuid: g for g in gpus}
        events = [
            Event(
                kind="gpu.added",
                gpu=g.uuid,
                message=f"GPU {g.index} {g.uuid} ({g.name}, {format_size(g.memory_total)}) appeared",
                data={"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total},
            )
            for uuid, g in new.items()
            if uuid not in old
        ]
        gone = [g for uuid, g in old.items() if uuid not in new]
        why = await self._why_gone(gone)
        events += [
            Event(
                kind="gpu.removed",
                severity="warning",
                gpu=g.uuid,
                message=f"GPU {g.index} {g.uuid} ({g.name}) is gone"
                + (f": {why[g.index].reason}" if g.index in why else ""),
                data={"index": g.index, "name": g.name}
                | ({"nvml_error": why[g.index].error} if g.index in why else {}),
            )
            for g in gone
        ]
        return await self.record(events)

    async def _why_gone(self, gone: list[Gpu]) -> dict[int, GpuFault]:
        """NVML's error for each GPU of `gone` it still counts (fallen off the bus); a GPU NVML
        no longer counts at all has none."""
        if not gone:
            return {}
        try:
            faults = await asyncio.to_thread(self.fault_source)
        except DeviceError:
            return {}
        return {f.index: f for f in faults}

    # -- events ----------------------------------------------------------------------------------

    async def record(self, events: list[Event]) -> list[Event]:
        """Store events (ids assigned), log them, and wake the API's waiting event readers."""
        if not events:
            return []
        stored = await asyncio.to_thread(self.store.add_events, events)
        for event in stored:
            if event.kind == "tenant.reaped" and event.tenant:
                # A loop removed the directory: forget the row now, not as "vanished" later.
                await asyncio.to_thread(self.store.delete_tenant, event.tenant)
            level = {"info": logging.INFO, "warning": logging.WARNING}.get(event.severity, logging.ERROR)
            if event.kind == "qos.decision" and level == logging.INFO:
                level = logging.DEBUG  # one or more a second: the API has them all
            log.log(level, "%s: %s", event.kind, event.message)
        self._wakeup.set()
        self._wakeup = asyncio.Event()
        return stored

    def release_waiters(self) -> None:
        """The agent is stopping: answer the requests waiting for events now."""
        self._closing = True
        self._wakeup.set()

    async def events(
        self,
        *,
        since: int | None = None,
        kind: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        wait: float = 0.0,
    ) -> list[Event]:
        """Events after `since`; with `wait`, hold the request up to that long for new ones."""
        deadline = time.monotonic() + wait
        while True:
            waiter = self._wakeup
            items = await asyncio.to_thread(
                self.store.events, since=since, kind=kind, tenant=tenant, limit=limit
            )
            remaining = deadline - time.monotonic()
            if items or since is None or remaining <= 0 or self._closing:
                return items
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), remaining)


def validation_message(err: ValidationError | list[dict[str, Any]]) -> str:
    """One line for the first problem of a pydantic validation error: 'memory: invalid size ...'."""
    errors = list(err.errors() if isinstance(err, ValidationError) else err)
    if not errors:
        return "invalid request"
    # A misspelt field explains the "required" error that comes with it: name it first.
    errors.sort(key=lambda e: e.get("type") != "extra_forbidden")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    msg = str(first.get("msg", "invalid"))
    ctx = first.get("ctx") or {}
    if first.get("type") == "value_error" and "error" in ctx:
        msg = str(ctx["error"])
    elif first.get("type") == "missing":
        msg = "required"
    elif first.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {ctx.get('error', msg)}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{'.'.join(loc)}: {msg}{more}" if loc else f"{msg}{more}"


_M = TypeVar("_M", TenantCreate, TenantResize)


def parse_model(model: type[_M], data: dict[str, Any]) -> _M:
    """Validate `data` as `model`, with the API's one-line message as a SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(validation_message(err)) from err
