"""The stall breaker's decision (sharegpu.agent.stalls.judge) as a pure function of what one look
at a region lock shows: a fake clock, fake owners, no process stopped. tests/integration/test_stalls.py stops
real processes inside the locks."""

from __future__ import annotations

from sharegpu.agent.stalls import Holder, Suspect, judge

OWNER = Holder(pid=4242, tid=4243)


def look(suspect: Suspect | None, tid: int, now: float, *, stalled: bool = True, found: bool = True):  # type: ignore[no-untyped-def]
    return judge(
        suspect,
        tid,
        now,
        stall_s=2.0,
        find=lambda t: OWNER if found and t == OWNER.tid else None,
        is_stalled=lambda h: stalled,
    )


def test_a_stopped_owner_is_killed_once_it_held_the_lock_for_the_stall_time() -> None:
    s, kill = look(None, OWNER.tid, 0.0)
    assert (s, kill) == (Suspect(OWNER.tid), None)  # first look: usually just busy
    s, kill = look(s, OWNER.tid, 0.5)
    assert s == Suspect(OWNER.tid, OWNER, 0.5)  # second look: found, stalled since now
    assert kill is None
    s, kill = look(s, OWNER.tid, 2.4)
    assert (s, kill) == (Suspect(OWNER.tid, OWNER, 0.5), None)  # 1.9 s: not yet
    s, kill = look(s, OWNER.tid, 2.5)
    assert (s, kill) == (None, OWNER)


def test_an_owner_that_runs_or_lets_go_is_forgotten() -> None:
    watched = Suspect(OWNER.tid, OWNER, 0.0)
    assert look(watched, OWNER.tid, 5.0, stalled=False) == (None, None)  # it runs again
    assert look(watched, 0, 5.0) == (None, None)  # the lock is free
    assert look(watched, 999, 5.0) == (Suspect(999), None)  # another owner: watched anew
    assert look(Suspect(OWNER.tid), OWNER.tid, 1.0, found=False) == (None, None)  # not found (ours)
    assert look(Suspect(OWNER.tid), OWNER.tid, 1.0, stalled=False) == (None, None)  # busy, running
