"""The agent's periodic loops as the agent builds them (no process). Their ticks against real
processes on the simulated GPU are tests/integration/test_agent_loops.py; the sweep that runs
the region-reading loops on one snapshot is tests/unit/test_agent_sweep.py.
"""

from __future__ import annotations

import pytest

from conftest import Sim
from sharegpu.agent.loops import build_loops
from sharegpu.agent.sweep import Sweep


def test_build_loops_gives_the_sweep_of_four_and_the_stall_breaker(sim: Sim) -> None:
    loops = build_loops(sim.runtime, enforce="report")
    assert [(loop.name, loop.interval_s) for loop in loops] == [("sweep", 1.0), ("stalls", 0.5)]
    sweep = loops[0]
    assert isinstance(sweep, Sweep)
    assert [(m.name, m.interval_s) for m in sweep.members] == [
        ("reaper", 1.0),
        ("reconcile", 1.0),
        ("audit", 2.0),
        ("qos", 1.0),
    ]
    kill = build_loops(sim.runtime, enforce="kill")[0]
    assert isinstance(kill, Sweep)
    assert kill.members[2].enforce == "kill"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="enforce"):
        build_loops(sim.runtime, enforce="maybe")
    # No tenant, no GPU region: nothing to say. (The reconciler and the audit ask NVML, of the
    # simulated node, whatever the runtime directory holds.)
    for loop in loops:
        assert loop.tick() == []
    assert sweep.stats["reaper"].ticks == 1
    assert sweep.stats["snapshot"].ticks == 1
