"""The sweep: the loops that read the node's regions, one after another on one snapshot.

The reaper, the reconciler, the audit, the QoS loop, the GPU-time loop and the online-wait
sampler all judge the same things: each tenant's usage region and limits, each GPU's arbiter
region, /proc, NVML's process list. Each used to read them itself, in a worker thread of its own,
every second. The sweep reads them once (``sharegpu.agent.snapshot``) and runs each loop that is
due on that snapshot, in one worker thread: one read and one thread hand-off a second instead of
six (docs/agent.md, Costs).

Each loop keeps its own interval (the audit runs every other sweep), its own figures in the
agent's health (ticks, errors, CPU of its own ticks) and its own failures: a loop that raises is
logged and counted, and the loops after it still run. The CPU of reading the snapshot is counted
apart, as the loop "snapshot".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from sharegpu.agent.events import Event
from sharegpu.agent.service import LoopStats
from sharegpu.agent.snapshot import NodeSnapshot

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot"  # the name the snapshot's reading is counted under


class SnapshotLoop(Protocol):
    """A periodic loop that judges from a snapshot of the node (the sweep's)."""

    name: str
    interval_s: float

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]: ...


def due(last_run: float | None, now: float, interval_s: float, period_s: float) -> bool:
    """Whether a loop of `interval_s`, last run at `last_run` (None: never), runs at a sweep at
    `now`, sweeps coming every `period_s`. A quarter period early is on time: a sweep a few ms
    early must not push a 2 s loop to every third 1 s sweep. Pure."""
    return last_run is None or now - last_run >= interval_s - period_s / 4


class Sweep:
    """Reads a snapshot of the node and runs each member loop that is due on it."""

    name = "sweep"

    def __init__(
        self,
        root: Path,
        members: Sequence[SnapshotLoop] = (),
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        take: Callable[[Path], NodeSnapshot] = NodeSnapshot.take,
    ) -> None:
        self.root = root
        self.interval_s = interval_s
        self.members: list[SnapshotLoop] = []
        # Each member's figures and the snapshot's, as the agent's health shows them.
        self.stats: dict[str, LoopStats] = {SNAPSHOT: LoopStats(interval_s=interval_s, cpu_seconds=0.0)}
        self._last_run: dict[str, float] = {}
        self._clock = clock
        self._cpu = cpu_clock
        self._take = take
        for member in members:
            self.add(member)

    def add(self, member: SnapshotLoop) -> None:
        """Run `member` in this sweep from its next tick (a loop more frequent than the sweep
        runs at the sweep's pace)."""
        if member.name in self.stats:
            raise ValueError(f"a loop named {member.name!r} is already in the sweep")
        self.members.append(member)
        self.stats[member.name] = LoopStats(
            interval_s=max(member.interval_s, self.interval_s), cpu_seconds=0.0
        )

    def tick(self) -> list[Event]:
        now = self._clock()
        began = self._cpu()
        snapshot = self._take(self.root)
        self._count(SNAPSHOT, began, None)
        events: list[Event] = []
        for member in self.members:
            if not due(self._last_run.get(member.name), now, member.interval_s, self.interval_s):
                continue
            # Let the event loop's thread have the GIL between two loops: an API request that
            # comes during the sweep waits for one loop, not for the interpreter's 5 ms turns.
            time.sleep(0)
            self._last_run[member.name] = now
            began = self._cpu()
            try:
                events += member.tick(snapshot)
            except Exception as err:
                self._count(member.name, began, err)
                log.warning("loop %s failed (retried in %.1f s): %s", member.name, member.interval_s, err)
            else:
                self._count(member.name, began, None)
        return events

    def _count(self, name: str, began: float, error: Exception | None) -> None:
        stats = self.stats[name]
        stats.cpu_seconds = (stats.cpu_seconds or 0.0) + self._cpu() - began
        if error is None:
            stats.ticks += 1
            stats.last_tick = time.time()
        else:
            stats.errors += 1
            stats.last_error = f"{type(error).__name__}: {error}"
