"""The agent's periodic loops as the agent builds them (no tick, no process). Their ticks against
real processes on the simulated GPU are tests/integration/test_agent_loops.py.
"""

from __future__ import annotations

import pytest

from conftest import Sim
from sharegpu.agent.loops import build_loops


def test_build_loops_gives_the_five_loops(sim: Sim) -> None:
    loops = build_loops(sim.runtime, enforce="report")
    assert [(loop.name, loop.interval_s) for loop in loops] == [
        ("reaper", 1.0),
        ("stalls", 0.5),
        ("reconcile", 1.0),
        ("audit", 2.0),
        ("qos", 1.0),
    ]
    assert build_loops(sim.runtime, enforce="kill")[3].enforce == "kill"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="enforce"):
        build_loops(sim.runtime, enforce="maybe")
    for loop in loops[:2] + loops[4:]:  # no tenant, no GPU region: nothing to say
        assert loop.tick() == []
