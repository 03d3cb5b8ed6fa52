"""GPU time per tenant, measured every second: the arbiter's charges, with NVML as the cross-check.

Every second this loop reads what each GPU's arbiter has charged each tenant it schedules (one
read of each arbiter region; ``sharegpu.report.read_charges``) and NVML's per-process
utilization over the past second (``sharegpu.devices.busy_by_pid``, attributed to tenants by
``sharegpu.report.busy_by_tenant``: only the processes NVML names are looked up, by host pid and
start time). From the two it keeps, per (tenant, incarnation, GPU):

- the GPU time over the last second: the charges' rate for an arbitrated tenant (exact, and blind
  to pid namespaces), NVML's share for a ``native`` one, which the arbiter does not see;
- the GPU time since the agent started (``sharegpu_tenant_gpu_busy_seconds_total``, the API's
  ``gpu_time_seconds``) and NVML's own total beside it (``..._gpu_nvml_seconds_total``).

The cross-check: a tenant that launches around the arbiter (a driver reached past the shim) or
rewrites its charges in the region it can write leaves GPU time that no charge accounts for. NVML's
per-process figures cannot show that tenant by themselves: on a real GPU they overlap (an H200
showed 49% and 60% for two tenants charged 29% and 69%, which is what their work got). The card's
own figure does not overlap, so the check is per GPU: when the card ran, second after second, well
past what its tenants account for (their charges; NVML's figure for a ``native`` tenant), the
arbitrated tenant furthest past its charges is the one reported. ``uncharged_suspect`` and
``crosscheck`` decide; the loop reports ``audit.compute_uncharged`` once when it starts and once,
``cleared``, when it ends (the threat model: docs/architecture.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.snapshot import NodeSnapshot
from sharegpu.devices import BUSY_WINDOW_S
from sharegpu.report import ChargeKey, GpuTime, busy_by_tenant, charge_rates, measure_busy, read_charges

# A card busy past what its tenants account for by this much of it, with a tenant as far past its
# charges, for this many consecutive seconds: reported. NVML's one-second figures and the charges'
# quantum boundaries differ by a few points from one second to the next (a 10 ms quantum is one
# point); work run around the arbiter is far past it, every second.
UNCHARGED_RATIO = 0.10
UNCHARGED_SECONDS = 3


@dataclass(frozen=True)
class Crosscheck:
    """A tenant's run of seconds as the GPU's suspect."""

    seconds: int = 0  # consecutive seconds as the suspect
    reported: bool = False


def uncharged_suspect(
    card: float | None, tenants: Mapping[ChargeKey, tuple[float, float | None]]
) -> ChargeKey | None:
    """The tenant of one GPU that this second points at, or None. `tenants`: each tenant's
    (NVML's share, the charges' rate; None for a native tenant, which the arbiter does not
    charge); `card`: NVML's busy share of the card (None: unknown, then only the tenants'
    figures are weighed). Pure."""
    excess = {key: nvml - charged for key, (nvml, charged) in tenants.items() if charged is not None}
    if not excess:
        return None
    worst = max(excess, key=lambda key: excess[key])
    if excess[worst] <= UNCHARGED_RATIO:
        return None
    if card is not None:
        accounted = sum(charged if charged is not None else nvml for nvml, charged in tenants.values())
        if card - accounted <= UNCHARGED_RATIO:
            return None  # the card's time is accounted for: NVML's per-process figures overlapped
    return worst


def crosscheck(state: Crosscheck, suspected: bool) -> tuple[Crosscheck, str | None]:
    """One second's verdict for a tenant: the new state and "started", "cleared" or None
    (nothing to report). Pure."""
    if suspected:
        seconds = state.seconds + 1
        if not state.reported and seconds >= UNCHARGED_SECONDS:
            return Crosscheck(seconds, True), "started"
        return Crosscheck(seconds, state.reported), None
    if state.reported:
        return Crosscheck(), "cleared"
    return Crosscheck(), None


def charges_at(
    readings: Sequence[tuple[float, Mapping[ChargeKey, int]]], at: float
) -> tuple[float, dict[ChargeKey, float]]:
    """The charges at instant `at` and that instant, from readings in time order: between two
    readings, interpolated (a charge grows by a quantum at a time, about evenly over a second; a
    tenant new in the later reading from zero); before the first or after the last, that
    reading and its own instant."""
    earlier = [r for r in readings if r[0] <= at]
    later = [r for r in readings if r[0] > at]
    if not earlier:
        first_at, first = readings[0]
        return first_at, dict(first)
    t0, c0 = earlier[-1]
    if not later:
        return t0, dict(c0)
    t1, c1 = later[0]
    f = (at - t0) / (t1 - t0)
    found: dict[ChargeKey, float] = {}
    for key in c0.keys() | c1.keys():
        a, b = c0.get(key, 0), c1.get(key, 0)
        found[key] = a + (b - a) * f if b >= a else a  # went back (a rebuilt region): as it was
    return at, found


class BusyMeter:
    """The loop: every second, each tenant's GPU time on each GPU."""

    name = "busy"

    def __init__(self, root: Path, *, interval_s: float = BUSY_WINDOW_S) -> None:
        self.root = root
        self.interval_s = interval_s
        self.since = time.time()
        # (monotonic, charges) of the last ticks, oldest first: the last one is the previous
        # tick's, and a view's second a moment ago lies between two of them.
        self._readings: deque[tuple[float, dict[ChargeKey, int]]] = deque(maxlen=3)
        self._times: dict[ChargeKey, GpuTime] = {}
        self._checks: dict[ChargeKey, Crosscheck] = {}
        self._lock = threading.Lock()

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One second's figures from `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        now = snap.taken_ns / 1e9  # time.monotonic(), when the charges were read
        charged = snap.charges()
        with self._lock:
            previous = self._readings[-1] if self._readings else None
            self._readings.append((now, charged))
        elapsed = self.interval_s if previous is None else now - previous[0]
        rates = charge_rates(previous[1], charged, elapsed) if previous is not None else {}
        # NVML answers for at most its window: a late tick counts the last window's rate for
        # the whole gap rather than nothing.
        busy = measure_busy(min(elapsed, BUSY_WINDOW_S)) or {}
        by_pid = {uuid: gpu.by_pid for uuid, gpu in busy.items()}
        nvml = busy_by_tenant(self.root, by_pid) if any(by_pid.values()) else {}
        figures: dict[str, dict[ChargeKey, tuple[float, float | None]]] = {}  # per GPU
        with self._lock:
            for key in set(rates) | set(nvml) | set(self._times):
                old = self._times.get(key)
                seen = nvml.get(key, 0.0)
                rate = rates.get(key)
                if rate is None and old is not None and old.source == "arbiter" and key not in charged:
                    rate = 0.0  # its entry is gone (deleted, or its region rebuilt): nothing more
                source = "arbiter" if rate is not None else "nvml"
                ratio = rate if rate is not None else seen
                self._times[key] = GpuTime(
                    ratio=ratio,
                    source=source,
                    nvml_ratio=seen,
                    seconds=(old.seconds if old else 0.0) + ratio * elapsed,
                    nvml_seconds=(old.nvml_seconds if old else 0.0) + seen * elapsed,
                )
                figures.setdefault(key[2], {})[key] = (seen, rate)
        events = []
        for uuid, tenants in figures.items():
            card = busy[uuid].card if uuid in busy else None
            suspect = uncharged_suspect(card, tenants)
            for key, (seen, rate) in tenants.items():
                if rate is not None:
                    events += self._check(key, seen, rate, card, suspected=key == suspect)
        return events

    def _check(
        self, key: ChargeKey, nvml: float, charged: float, card: float | None, *, suspected: bool
    ) -> list[Event]:
        state, verdict = crosscheck(self._checks.get(key, Crosscheck()), suspected)
        if state == Crosscheck():
            self._checks.pop(key, None)
        else:
            self._checks[key] = state
        if verdict is None:
            return []
        tenant, incarnation, uuid = key
        cleared = verdict == "cleared"
        message = (
            f"NVML no longer sees {tenant} run past its charges on {uuid}"
            if cleared
            else f"NVML sees {tenant} run {nvml:.0%} of {uuid} for {state.seconds} s, and the arbiter "
            f"charged it {charged:.0%}: it launches around the arbiter or rewrites its charges"
        )
        return [
            Event(
                kind="audit.compute_uncharged",
                severity="info" if cleared else "warning",
                message=message,
                tenant=tenant,
                gpu=uuid,
                data={
                    "incarnation": incarnation,
                    "nvml_ratio": round(nvml, 4),
                    "charged_ratio": round(charged, 4),
                    "card_ratio": None if card is None else round(card, 4),
                    "cleared": cleared,
                },
            )
        ]

    def snapshot(self) -> Mapping[ChargeKey, GpuTime]:
        """{(tenant, incarnation, GPU uuid): its GPU time}, for every tenant measured since the
        agent started (a tenant re-created under the same name is another incarnation, from zero).
        An arbitrated tenant's ratio is measured again at the call, over the last second: from
        its charge a second ago (charges_at, between the two ticks around it) to now, so that a
        view's GPU time is the second before it was asked for, as NVML's is, not the last
        tick's."""
        now = time.monotonic()
        with self._lock:
            times = dict(self._times)
            readings = list(self._readings)
        if not readings:
            return times
        then, before = charges_at(readings, now - BUSY_WINDOW_S)
        if now - then < BUSY_WINDOW_S / 4:
            return times  # only a reading of this instant: the last tick's rates stand
        for key, rate in charge_rates(before, read_charges(self.root), now - then).items():
            old = times.get(key)
            if old is None:
                times[key] = GpuTime(rate, "arbiter", None, 0.0, 0.0)
            elif old.source == "arbiter":
                times[key] = replace(old, ratio=rate)
        return times
