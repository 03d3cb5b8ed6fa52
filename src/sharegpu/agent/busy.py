"""GPU time per tenant, measured: the agent integrates NVML's per-process utilization.

What the arbiter charges is its own book of the token's holds (since ABI 1.6 the GPU time of the
holds' work; a shim of ABI 1.5 or older charged the wall time held, which for an online service
at 13% of the card was 43%), and it knows nothing of `native` tenants. GPU time here is what
NVML measures per process: every second this loop asks for each process's share of the
card over the past second (``sharegpu.devices.busy_by_pid``, attributed to tenants by
``sharegpu.report.busy_by_tenant``: only the processes NVML names are looked up, by host pid and
start time; the tenants of a card scaled to at most the whole card) and adds share x
elapsed to the tenant's total. The totals are the agent's, kept in memory since it started
(``since``): `sharegpu_tenant_gpu_busy_seconds_total` and the API's ``gpu_time_seconds``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.devices import BUSY_WINDOW_S
from sharegpu.report import busy_by_tenant, measure_busy


class BusyMeter:
    """The loop: every second, each tenant's GPU time on each GPU accumulates."""

    name = "busy"

    def __init__(self, root: Path, *, interval_s: float = BUSY_WINDOW_S) -> None:
        self.root = root
        self.interval_s = interval_s
        self.since = time.time()
        self._seconds: dict[tuple[str, int, str], float] = {}
        self._last: float | None = None
        self._lock = threading.Lock()

    def tick(self) -> list[Event]:
        now = time.monotonic()
        elapsed = self.interval_s if self._last is None else now - self._last
        self._last = now
        # NVML answers for at most its window: a late tick counts the last window's rate for
        # the whole gap rather than nothing.
        busy = measure_busy(min(elapsed, BUSY_WINDOW_S))
        if not busy or not any(busy.values()):
            return []  # nothing ran on any GPU: no tenant to read (most seconds of an idle node)
        shares = busy_by_tenant(self.root, busy)
        with self._lock:
            for key, ratio in shares.items():
                self._seconds[key] = self._seconds.get(key, 0.0) + ratio * elapsed
        return []

    def snapshot(self) -> Mapping[tuple[str, int, str], float]:
        """{(tenant, incarnation, GPU uuid): seconds of GPU time since `since`} (a tenant
        re-created under the same name starts from zero)."""
        with self._lock:
            return dict(self._seconds)
