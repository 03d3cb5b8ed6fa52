"""The reconciler: what NVML sees a tenant use beyond its ledger becomes its overhead.

The shim's ledger counts the bytes the tenant's processes allocate through CUDA. The driver
also charges each process for its contexts, kernels, local memory and library workspaces, which
no allocation call shows. Every second the reconciler compares, per tenant and GPU, NVML's
per-process memory with the ledger and writes the difference into the tenant's usage region as
``overhead_bytes``; the shim counts it against the cap at every admission (ledger.c
``fits_locked``: used + overhead + size <= cap) and in the memory the tenant sees. So the cap
covers what the tenant really uses on the card.

Per process of the tenant's ledger (a live usage slot) seen by NVML on the GPU:
``max(0, min(nvml - ledger, max_process_overhead))``, summed over the tenant. The ledger is read
before and after NVML and the larger figure used, so a free or an allocation racing the
measurement never inflates the overhead. Processes outside the ledger (no slot: a process that
unloaded the shim, or one with a context that never allocated) add nothing here: their whole
use is what the audit weighs against the cap. The per-process ceiling keeps a process that
allocates around the shim while loaded from hiding it all as overhead.

The shim itself adds a new context's memory to ``overhead_bytes`` the moment the context is
created (its measured estimate, the same quantity: NVML's bytes of the process beyond its
ledger), and takes it out when the context ends (native/shim/hooks_ctx.c), so admission counts
it before this loop has seen it. This pass then replaces those estimates by its measurement
(which also drops the estimates of a process killed with its contexts). It writes with a
compare-and-swap against the value read *before* NVML was asked: when a shim moved it meanwhile
(a context created or destroyed while NVML was read, so the measurement may not include it), the
figure is not written and the next pass measures again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.procs import SlotProc, live_slots, mib
from sharegpu.agent.snapshot import NodeSnapshot, NvmlSource
from sharegpu.devices import GpuProcess, processes_by_gpu
from sharegpu.errors import ConfigError, DeviceError
from sharegpu.regions import abi, agentlib
from sharegpu.spec import MIB
from sharegpu.tenant import UsageSnapshot, read_usage

log = logging.getLogger(__name__)

DEFAULT_EVENT_THRESHOLD = 32 * MIB
DEFAULT_MAX_PROCESS_OVERHEAD = 2048 * MIB


class Reconciler:
    """Writes each tenant's overhead (NVML minus ledger) per GPU into its usage region."""

    name = "reconcile"

    def __init__(
        self,
        root: Path,
        *,
        interval_s: float = 1.0,
        nvml: NvmlSource | None = None,
        event_threshold_bytes: int = DEFAULT_EVENT_THRESHOLD,
        max_process_overhead_bytes: int = DEFAULT_MAX_PROCESS_OVERHEAD,
    ) -> None:
        self.root = root
        self.interval_s = interval_s
        self.nvml = nvml or processes_by_gpu
        self.event_threshold_bytes = event_threshold_bytes
        self.max_process_overhead_bytes = max_process_overhead_bytes
        self._reported: dict[tuple[str, str], int] = {}  # (tenant, uuid) -> last reported
        self._nvml_failed = False

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One pass over `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        if not snap.tenants:
            return []
        # The snapshot was read before NVML: the ledger (a racing free never inflates the
        # overhead) and the overhead, which is written only if no shim moved it meanwhile
        # (swap_overhead).
        before = {t.path: live_slots(t.usage, snap.table) if t.usage else [] for t in snap.tenants}
        try:
            gpus = snap.nvml(self.nvml)
        except DeviceError as err:
            if not self._nvml_failed:
                log.warning("reconcile: %s", err)
            self._nvml_failed = True
            return []
        self._nvml_failed = False
        events = []
        for tenant in snap.tenants:
            if tenant.limits is None:
                continue  # being created or removed, or broken (the shim reports that)
            try:
                usage = read_usage(tenant.path)
            except ConfigError:
                continue
            slots: dict[int, list[SlotProc]] = {}  # each live process's views, before and after
            for slot in (*before[tenant.path], *live_slots(usage, snap.table)):
                slots.setdefault(slot.pid, []).append(slot)
            events += self._tenant(tenant.path, tenant.limits, slots, usage, gpus, pre=tenant.usage or usage)
        names = {t.id for t in snap.tenants}
        self._reported = {k: v for k, v in self._reported.items() if k[0] in names}
        return events

    def _tenant(
        self,
        path: Path,
        limits: abi.Limits,
        slots: dict[int, list[SlotProc]],
        usage: UsageSnapshot,
        gpus: dict[str, list[GpuProcess]],
        *,
        pre: UsageSnapshot,
    ) -> list[Event]:
        events = []
        for i, dev in enumerate(limits.devices[: limits.device_count]):
            uuid = abi.bytes_to_uuid(bytes(dev.uuid))
            if uuid not in gpus:
                continue  # NVML does not show the GPU: leave the last figure
            seen = {p.pid: p.used_bytes for p in gpus[uuid]}
            overhead = 0
            per_pid = {}
            for pid, views in slots.items():
                if pid not in seen:
                    continue
                # What the ledger charges the process, spare included (ledger.c): the spare is in
                # the totals the cap is checked against, so the overhead is NVML's figure above it
                # (admission then counts exactly what NVML sees).
                ledger = max(v.mem_bytes[i] for v in views)
                extra = min(max(seen[pid] - ledger, 0), self.max_process_overhead_bytes)
                if extra:
                    per_pid[pid] = extra
                overhead += extra
            current = int(usage.devices[i].overhead_bytes)
            if overhead != current:
                try:
                    stored = agentlib.swap_overhead(path, i, int(pre.devices[i].overhead_bytes), overhead)
                except ConfigError as err:
                    log.warning("reconcile: %s", err)
                    continue
                if not stored:
                    continue  # a shim admitted or gave back a context meanwhile: measure again
            key = (path.name, uuid)
            last = self._reported.get(key, current)
            if abs(overhead - last) > self.event_threshold_bytes:
                self._reported[key] = overhead
                events.append(
                    Event(
                        kind="reconcile.overhead",
                        tenant=path.name,
                        gpu=uuid,
                        message=f"tenant {path.name} on {uuid}: overhead {mib(last)} -> {mib(overhead)} "
                        f"(NVML beyond the ledger; counted against its {mib(int(dev.mem_cap_bytes))} cap)",
                        data={
                            "overhead_bytes": overhead,
                            "previous_bytes": last,
                            "cap_bytes": int(dev.mem_cap_bytes),
                            "ledger_bytes": int(usage.devices[i].mem_used_bytes),
                            "per_pid": per_pid,
                        },
                    )
                )
            else:
                self._reported.setdefault(key, current)
        return events
