"""The QoS loop: how much work offline tenants may keep in flight, from what online tenants wait.

While online tenants are active on a GPU, an offline holder synchronises after every
``offline_inflight_max`` launches, so that an online request waits about that many offline
kernels before it gets the card (docs/design/arbitration.md). A small bound protects
online latency; a large one lets offline work run in longer batches (fewer syncs, better
throughput). The shim takes the bound as configured; this loop sets it from measurement.

Every second, per GPU: the online tenants' mean wait per grant over the last second, from the
arbiter region's counters (delta ``wait_ns`` / delta ``grants`` summed over the online
tenants), against ``target_wait_ms``:

* above the target: halve the bound (at least 1): protect latency at once;
* below a quarter of the target (``raise_below``): raise it by one (at most ``max_bound``): give
  offline throughput back slowly;
* otherwise, or with no online tenant on the GPU, or no online grant in the interval: hold.

Multiplicative decrease and additive increase, so latency recovers in a tick or two and the
bound settles where online waits sit just under the target. Every change is an event
``qos.decision`` with the figures it was made from; a hold is one too, but only when the reason
for holding differs from the previous tick's on that GPU (a GPU with no online tenant would
otherwise write an event every second for ever).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.snapshot import NodeSnapshot
from sharegpu.arbiter import ArbiterStatus, tune_arbiter
from sharegpu.errors import ConfigError, SpecError

log = logging.getLogger(__name__)


@dataclass
class _Sample:
    wait_ns: int
    grants: int


class QosLoop:
    """Tunes each GPU's offline in-flight bound from the online tenants' measured waits."""

    name = "qos"

    def __init__(
        self,
        root: Path,
        target_wait_ms: float = 2.0,
        *,
        interval_s: float = 1.0,
        min_bound: int = 1,
        max_bound: int = 8,
        raise_below: float = 0.25,
    ) -> None:
        if target_wait_ms <= 0 or not 1 <= min_bound <= max_bound:
            raise ValueError("target_wait_ms must be > 0 and 1 <= min_bound <= max_bound")
        self.root = root
        self.target_wait_ms = target_wait_ms
        self.interval_s = interval_s
        self.min_bound = min_bound
        self.max_bound = max_bound
        self.raise_below = raise_below
        self._last: dict[tuple[str, str], _Sample] = {}  # (gpu, tenant) -> counters last tick
        self._said: dict[str, str] = {}  # gpu -> why it held at the last tick ("" after a change)

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """One decision per GPU from `snapshot` (the sweep's; read now when not given)."""
        snap = snapshot or NodeSnapshot.take(self.root)
        events = []
        for read in snap.arbiters:
            try:
                if read.status is None:
                    assert read.error is not None
                    raise read.error
                event = self._gpu(read.path, read.status)
            except (ConfigError, SpecError) as err:
                log.warning("qos: %s", err)
                continue
            held = event.data["action"] == "hold"
            why = str(event.data["reason"]) if held else ""
            if not held or self._said.get(str(event.gpu)) != why:
                events.append(event)
            self._said[str(event.gpu)] = why
        return events

    def _gpu(self, path: Path, status: ArbiterStatus) -> Event:
        uuid = status.uuid
        online = [t for t in status.tenants if t.priority == "online" and t.clients > 0]
        wait = grants = 0
        fresh = []
        for t in online:
            prev = self._last.get((uuid, t.id))
            if prev is not None and t.grants >= prev.grants and t.wait_ns >= prev.wait_ns:
                wait += t.wait_ns - prev.wait_ns
                grants += t.grants - prev.grants
                fresh.append(t.id)
        for t in status.tenants:
            self._last[(uuid, t.id)] = _Sample(wait_ns=t.wait_ns, grants=t.grants)
        known = {t.id for t in status.tenants}
        self._last = {k: v for k, v in self._last.items() if k[0] != uuid or k[1] in known}

        bound = int(status.offline_inflight_max)
        figures: dict[str, object] = {
            "online_tenants": [t.id for t in online],
            "target_wait_ms": self.target_wait_ms,
            "grants": grants,
            "wait_ms_total": wait / 1e6,
            "offline_inflight_max": bound,
        }
        if grants:
            figures["wait_ms_per_grant"] = round(wait / grants / 1e6, 4)
        step = next_bound(
            bound,
            online=bool(online),
            grants=grants,
            wait_ns=wait,
            first_sample=not fresh,
            target_wait_ms=self.target_wait_ms,
            bounds=(self.min_bound, self.max_bound),
            raise_below=self.raise_below,
        )
        if step.bound != bound:
            tune_arbiter(path, offline_inflight_max=step.bound)
        return _decision(uuid, step.action, (bound, step.bound), step.why, figures, reason=step.reason)


@dataclass(frozen=True)
class Step:
    """One tick's decision for one GPU."""

    action: str  # "lower", "raise" or "hold"
    bound: int  # the new offline in-flight bound
    reason: str  # a hold's (or a change's) kind, for the events
    why: str  # in words, with the figures


def next_bound(
    bound: int,
    *,
    online: bool,
    grants: int,
    wait_ns: int,
    first_sample: bool,
    target_wait_ms: float,
    bounds: tuple[int, int],
    raise_below: float,
) -> Step:
    """The bound from the online tenants' waits over the last tick: halved above the target,
    one more well below it, held otherwise (or with no online tenant, or no online grant)."""
    low, high = bounds
    if not online:
        return Step("hold", bound, "no-online", "no online tenant on the GPU")
    if grants == 0:
        why = "first sample" if first_sample else "no online grant since the last tick"
        return Step("hold", bound, "no-grant", why)
    mean_ms = wait_ns / grants / 1e6
    target = f"{target_wait_ms:g} ms target"
    if mean_ms > target_wait_ms:
        new = max(low, bound // 2)
        why = f"online wait {mean_ms:.3f} ms per grant is above the {target}"
        if new >= bound:
            return Step("hold", bound, "at-minimum", why + f" (already at the minimum {low})")
        return Step("lower", new, "at-minimum", why)
    if mean_ms < raise_below * target_wait_ms:
        new = min(high, bound + 1)
        why = f"online wait {mean_ms:.3f} ms per grant is well below the {target}"
        if new <= bound:
            return Step("hold", bound, "at-maximum", why + f" (already at the maximum {high})")
        return Step("raise", new, "at-maximum", why)
    return Step("hold", bound, "near-target", f"online wait {mean_ms:.3f} ms per grant is near the {target}")


def _decision(
    uuid: str, action: str, change: tuple[int, int], why: str, figures: dict[str, object], *, reason: str
) -> Event:
    old, new = change
    verb = f"bound {old} -> {new}" if new != old else f"bound stays {old}"
    return Event(
        kind="qos.decision",
        gpu=uuid,
        message=f"{uuid}: offline in-flight {verb}: {why}",
        data={
            **figures,
            "action": action,
            "reason": reason,
            "knob": "offline_inflight_max",
            "from": old,
            "to": new,
        },
    )
