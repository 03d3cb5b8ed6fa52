"""The QoS loop's decision (sharegpu.agent.qos.next_bound) as a pure function of one tick's
figures: no region, no process, no clock. tests/integration/test_agent_loops.py runs the loop itself."""

from __future__ import annotations

from sharegpu.agent.qos import next_bound

MS = 1_000_000


def step(
    bound: int, *, grants: int = 10, wait_ms_each: float = 1.0, online: bool = True, first: bool = False
):  # type: ignore[no-untyped-def]
    return next_bound(
        bound,
        online=online,
        grants=grants,
        wait_ns=int(grants * wait_ms_each * MS),
        first_sample=first,
        target_wait_ms=2.0,
        bounds=(1, 8),
        raise_below=0.25,
    )


def test_waits_above_the_target_halve_the_bound_down_to_the_minimum() -> None:
    assert (step(8, wait_ms_each=3.0).action, step(8, wait_ms_each=3.0).bound) == ("lower", 4)
    assert step(3, wait_ms_each=3.0).bound == 1
    at_floor = step(1, wait_ms_each=3.0)
    assert (at_floor.action, at_floor.bound, at_floor.reason) == ("hold", 1, "at-minimum")
    assert "already at the minimum 1" in at_floor.why


def test_waits_well_below_the_target_raise_it_by_one_up_to_the_maximum() -> None:
    assert (step(4, wait_ms_each=0.1).action, step(4, wait_ms_each=0.1).bound) == ("raise", 5)
    at_top = step(8, wait_ms_each=0.1)
    assert (at_top.action, at_top.bound, at_top.reason) == ("hold", 8, "at-maximum")


def test_waits_near_the_target_hold_it() -> None:
    near = step(4, wait_ms_each=1.0)  # between a quarter of the target and the target
    assert (near.action, near.bound, near.reason) == ("hold", 4, "near-target")
    assert "1.000 ms per grant" in near.why


def test_without_online_work_or_grants_nothing_moves() -> None:
    assert step(4, online=False).reason == "no-online"
    idle = step(4, grants=0)
    assert (idle.action, idle.bound, idle.reason) == ("hold", 4, "no-grant")
    assert step(4, grants=0, first=True).why == "first sample"
