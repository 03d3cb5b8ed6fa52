"""The sweep (sharegpu.agent.sweep): one snapshot a tick, each loop when due, a failing loop
alone. Fake loops, a fake clock and a fake snapshot: no process, no region."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.agent.events import Event
from sharegpu.agent.procs import process_table
from sharegpu.agent.snapshot import NodeSnapshot
from sharegpu.agent.sweep import Sweep, due


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A loop that remembers the snapshots it was given (and may fail)."""

    def __init__(self, name: str, interval_s: float = 1.0, *, fails: bool = False) -> None:
        self.name = name
        self.interval_s = interval_s
        self.fails = fails
        self.seen: list[NodeSnapshot | None] = []

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        self.seen.append(snapshot)
        if self.fails:
            raise RuntimeError(f"{self.name} broke")
        return [Event(kind="qos.decision", message=f"{self.name} ran")]


def _sweep(members: list[Recorder], clock: Clock) -> tuple[Sweep, list[NodeSnapshot]]:
    taken: list[NodeSnapshot] = []

    def take(root: Path) -> NodeSnapshot:
        taken.append(NodeSnapshot(root, 0, [], [], process_table()))
        return taken[-1]

    return Sweep(Path("/nowhere"), members, clock=clock, cpu_clock=clock, take=take), taken


def test_due_runs_a_loop_at_its_interval_within_a_quarter_period() -> None:
    assert due(None, 5.0, 2.0, 1.0)  # never run: now
    assert not due(10.0, 11.0, 2.0, 1.0)
    assert due(10.0, 11.8, 2.0, 1.0)  # a sweep 0.2 s early is on time
    assert not due(10.0, 11.7, 2.0, 1.0)
    assert due(10.0, 11.0, 1.0, 1.0)
    assert due(10.0, 10.75, 1.0, 1.0)


def test_every_loop_is_given_the_same_snapshot_read_once_a_tick() -> None:
    clock = Clock()
    a, b = Recorder("a"), Recorder("b")
    sweep, taken = _sweep([a, b], clock)
    events = sweep.tick()
    assert [e.message for e in events] == ["a ran", "b ran"]
    assert len(taken) == 1
    assert a.seen == [taken[0]]
    assert b.seen == [taken[0]]
    clock.now += 1.0
    sweep.tick()
    assert len(taken) == 2
    assert a.seen[1] is taken[1]
    assert b.seen[1] is taken[1]


def test_a_slower_loop_runs_every_other_sweep_even_when_sweeps_come_early() -> None:
    clock = Clock()
    fast, slow = Recorder("fast"), Recorder("slow", interval_s=2.0)
    sweep, _ = _sweep([fast, slow], clock)
    for step in (0.0, 0.98, 1.0, 0.97, 1.02, 1.0):  # a loaded machine's jitter
        clock.now += step
        sweep.tick()
    assert len(fast.seen) == 6
    assert len(slow.seen) == 3
    assert sweep.stats["slow"].ticks == 3
    assert sweep.stats["snapshot"].ticks == 6


def test_a_failing_loop_is_counted_and_the_others_still_run() -> None:
    clock = Clock()
    broken, after = Recorder("broken", fails=True), Recorder("after")
    sweep, _ = _sweep([broken, after], clock)
    assert [e.message for e in sweep.tick()] == ["after ran"]
    assert sweep.stats["broken"].errors == 1
    assert sweep.stats["broken"].last_error == "RuntimeError: broken broke"
    assert sweep.stats["broken"].ticks == 0
    assert sweep.stats["after"].ticks == 1


def test_each_loop_is_charged_its_own_cpu_and_the_snapshot_apart() -> None:
    clock = Clock()  # as the CPU clock too: each call of a fake loop costs what it advances

    class Costly(Recorder):
        def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
            clock.now += 0.25
            return super().tick(snapshot)

    sweep, _ = _sweep([Costly("costly"), Recorder("free")], clock)
    sweep.tick()
    assert sweep.stats["costly"].cpu_seconds == pytest.approx(0.25)
    assert sweep.stats["free"].cpu_seconds == 0.0
    assert sweep.stats["snapshot"].cpu_seconds == 0.0


def test_two_loops_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="already in the sweep"):
        Sweep(Path("/nowhere"), [Recorder("a"), Recorder("a")])
    with pytest.raises(ValueError, match="already in the sweep"):
        Sweep(Path("/nowhere"), [Recorder("snapshot")])
