"""bench/handover.py's turn order and its refusals of bad arguments (pure: no GPU is touched)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
try:
    import handover
    from _turns import owner
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("share", [10, 30, 50, 70])
def test_the_order_gives_the_first_program_its_share_of_every_ten_turns(share: int) -> None:
    for start in range(0, 100, 10):
        firsts = sum(owner(t, share) == 0 for t in range(start, start + 10))
        assert firsts == share // 10


def test_at_30_70_the_larger_program_follows_itself_four_times_in_ten() -> None:
    turns = [owner(t, 30) for t in range(1000)]
    follows = sum(1 for a, b in itertools.pairwise(turns) if a == b == 1)
    hand_overs = sum(1 for a, b in itertools.pairwise(turns) if a != b)
    assert (follows, hand_overs) == (400, 599)  # the turns that leave a program's own gap idle
    assert all(owner(t, 50) != owner(t + 1, 50) for t in range(100))  # 50/50: every turn hands on


@pytest.mark.parametrize(
    "argv",
    [["--share", "0"], ["--share", "100"], ["--cases", "4by500"], ["--cases", "0x500"], ["--cases", "4x"]],
)
def test_bad_arguments_are_refused_before_anything_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        handover.main(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err
