"""The reaper: what dead processes and dead supervisors leave behind is released at once.

The shim reclaims a dead process's memory charge and GPU-token entry only lazily, when another
process of the tenant (or of the GPU) next calls in. The reaper does not wait for that: every
half second it frees, in each tenant's usage region, the slots of dead processes (their bytes
leave the per-device totals) and, in each GPU's arbiter region, the entries of dead clients; a
token that a dead client held goes to the best waiter. Both run the shim's own code under the
regions' robust mutexes (libsgagent.so, see ``sharegpu.regions.agentlib``), so the accounting is
exactly the shim's. Then tenants whose owner (``sharegpu run`` supervisor, process group) is
gone and that have no live process left are removed, under the node lock that tenant creation
takes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.procs import ProcessTable, alive_in, live_slots, mib, owner_gone, process_table
from sharegpu.agent.snapshot import NodeSnapshot
from sharegpu.arbiter import rebuild_arbiter
from sharegpu.errors import ConfigError, SharegpuError
from sharegpu.regions import abi, agentlib
from sharegpu.tenant import (
    iter_tenants,
    node_lock,
    read_meta,
    remove_tenant,
    tenant_status,
)

log = logging.getLogger(__name__)


class Reaper:
    """Releases the charges and arbiter entries of dead processes; removes orphaned tenants."""

    name = "reaper"

    def __init__(self, root: Path, *, interval_s: float = 1.0, tenant_interval_s: float = 5.0) -> None:
        self.root = root
        self.interval_s = interval_s
        # Orphaned tenants hold nothing once their processes are reaped: looking for them every
        # few seconds (and at once after a process was reaped) is soon enough, and cheaper.
        self.tenant_interval_s = tenant_interval_s
        self._tenants_at = float("-inf")
        self._broken: set[str] = set()  # regions already reported unreadable

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One pass over `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        events = self._reap_usage(snap)
        events += self._reap_arbiters(snap)
        now = time.monotonic()
        if events or now - self._tenants_at >= self.tenant_interval_s:
            self._tenants_at = now
            events += self._reap_tenants(snap.table)
        return events

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._broken:
            self._broken.add(key)
            log.warning("%s", message)

    def _reap_usage(self, snap: NodeSnapshot) -> list[Event]:
        events = []
        for tenant in snap.tenants:
            path = tenant.path
            try:
                # Reaping takes the tenant's lock: first look (without it) for a dead process.
                usage, lim = tenant.usage, tenant.limits
                if usage is not None and len(live_slots(usage, snap.table)) == len(usage.procs):
                    continue
                if usage is None or lim is None:
                    assert tenant.error is not None
                    raise tenant.error
                uuids = [abi.bytes_to_uuid(bytes(d.uuid)) for d in lim.devices[: lim.device_count]]
                reap = agentlib.reap_usage(path)
            except ConfigError as err:
                if (path / abi.USAGE_FILE).exists():  # else being created or removed
                    self._warn_once(str(path), f"reaper: {err}")
                continue
            self._broken.discard(str(path))
            for slot in reap.slots:
                held = {uuids[i]: b for i, b in enumerate(slot.mem_bytes[: len(uuids)]) if b}
                total = sum(held.values())
                events.append(
                    Event(
                        kind="process.reaped",
                        tenant=path.name,
                        gpu=next(iter(held), None),
                        pid=slot.host_pid or slot.pid,
                        message=f"process {slot.host_pid or slot.pid} of tenant {path.name} is gone: "
                        f"released its {mib(total)} charge",
                        data={
                            "region": "usage",
                            "pid": slot.pid,
                            "host_pid": slot.host_pid,
                            "start_time": slot.start_time,
                            "mem_bytes": held,
                        },
                    )
                )
            if reap.recovered:
                events.append(
                    Event(
                        kind="process.reaped",
                        severity="warning",
                        tenant=path.name,
                        message=f"tenant {path.name}: a process died holding the usage lock; "
                        "the totals were recomputed from the slots",
                        data={"region": "usage", "recovered": True},
                    )
                )
        return events

    def _rebuild(self, path: Path, uuid: str) -> Event | None:
        """A damaged region (the shim refuses it: every launch on the GPU fails) is moved aside
        and made anew; other GPUs' regions are untouched."""
        try:
            rebuilt = rebuild_arbiter(self.root, uuid)
        except (SharegpuError, OSError) as err:
            self._warn_once(str(path), f"reaper: cannot rebuild {path}: {err}")
            return None
        if rebuilt is None:
            return None
        damage, moved = rebuilt
        log.warning("rebuilt the damaged arbiter region of %s: %s (kept at %s)", uuid, damage, moved)
        return Event(
            kind="gpu.arbiter_rebuilt",
            severity="warning",
            gpu=uuid,
            message=f"the GPU's arbiter region was damaged ({damage}); made anew, the damaged one "
            f"kept at {moved}. Processes that gave up on its lock move to the new one at their next "
            "launch; others that had it open keep it until they restart",
            data={"damage": damage, "moved_to": str(moved)},
        )

    def _reap_arbiters(self, snap: NodeSnapshot) -> list[Event]:
        events = []
        for read in snap.arbiters:
            path, uuid, status = read.path, read.uuid, read.status
            try:
                if status is None:
                    assert read.error is not None
                    raise read.error
                if status.broken:  # a lock held past its deadline: the GPU runs unarbitrated
                    if (rebuilt := self._rebuild(path, uuid)) is not None:
                        events.append(rebuilt)
                    continue
                if all(alive_in(snap.table, c.pid, c.start_time) for c in status.clients):
                    continue
                reap = agentlib.reap_arbiter(path)
            except ConfigError as err:
                rebuilt = self._rebuild(path, uuid)
                if rebuilt is None:
                    self._warn_once(str(path), f"reaper: {err}")
                else:
                    events.append(rebuilt)
                continue
            self._broken.discard(str(path))
            for client in reap.clients:
                handed = reap.new_holder_pid if client.held_token else None
                note = ""
                if client.held_token:
                    note = (
                        f"; its GPU token went to process {handed}"
                        if handed
                        else "; its GPU token is free (nobody waits)"
                    )
                events.append(
                    Event(
                        kind="process.reaped",
                        tenant=client.tenant or None,
                        gpu=uuid,
                        pid=client.pid,
                        message=f"process {client.pid} of tenant {client.tenant} is gone: "
                        f"freed its arbiter entry on {uuid}{note}",
                        data={
                            "region": "arbiter",
                            "start_time": client.start_time,
                            "held_token": client.held_token,
                            "token_to_pid": handed,
                        },
                    )
                )
            if reap.recovered:
                events.append(
                    Event(
                        kind="process.reaped",
                        severity="warning",
                        gpu=uuid,
                        message=f"GPU {uuid}: a process died holding the arbiter lock; repaired",
                        data={"region": "arbiter", "recovered": True},
                    )
                )
        return events

    def _reap_tenants(self, table: ProcessTable) -> list[Event]:
        candidates = list(iter_tenants(self.root))
        if not candidates:
            return []
        events = []
        for path in candidates:
            # The owner first (meta.json and the process table): almost always alive, and far
            # cheaper to ask than the tenant's regions.
            if owner_gone(read_meta(path), table) is None:
                continue
            status = tenant_status(path)
            if status.error is not None or live_slots(path):
                continue
            with node_lock(self.root):  # the one create_tenant holds
                # Look again under the lock: tenant creation collects stale tenants too.
                if not path.exists():
                    continue
                status = tenant_status(path)
                reason = owner_gone(status.meta, process_table())
                if status.error is not None or reason is None or live_slots(path):
                    continue
                remove_tenant(path)
            events.append(
                Event(
                    kind="tenant.reaped",
                    tenant=status.id,
                    message=f"tenant {status.id} removed: {reason} and no process of it is left",
                    data={"reason": reason, "meta": status.meta},
                )
            )
        return events
