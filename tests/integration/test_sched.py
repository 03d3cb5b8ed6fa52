"""The arbiter's scheduling decisions (native/shim/arbsched.c) as pure functions of the region and
the time: driven through native/shim/tests/sched_test.c with a fake clock, no processes, no GPU.
The shares here are the decisions' own; tests/integration/test_arbiter.py measures them with processes on the
simulated GPU, where launches, drains and wake-ups cost time too. Times are microseconds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cbuild import SHIM_DIR, gcc

T0 = 1_000_000


@pytest.fixture(scope="module")
def sched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sched")
    sources = [SHIM_DIR / "tests" / "sched_test.c", SHIM_DIR / "arbsched.c", SHIM_DIR / "predict.c"]
    return gcc(tmp, "sched_test", *map(str, sources))


def answers(exe: Path, *commands: str) -> list[dict[str, int]]:
    out = subprocess.run(
        [str(exe)], input="\n".join(commands), capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [{k: int(v) for k, v in (kv.split("=") for kv in line.split())} for line in out.splitlines()]


def shares(exe: Path, tenants: list[tuple[str, int, int]], seconds: int = 3) -> dict[str, int]:
    """Saturating tenants (policy, share, ceiling in permille), one normal client each, for
    `seconds`: each one's share of the time and the idle time, permille."""
    commands = [f"tenant {i} {p} {s} {c} 1 {T0}" for i, (p, s, c) in enumerate(tenants)]
    commands += [f"client {i} {i} normal" for i in range(len(tenants))]
    return answers(exe, *commands, f"run {T0} {seconds * 1000}")[-1]


def near(got: dict[str, int], want: dict[str, int]) -> None:
    """Within 0.2 point of the card each (the first grants' credit, integer time), a fifth of
    the bench's goal: what the decisions give, before launches, drains and wake-ups cost."""
    assert got.keys() == want.keys(), got
    for key, value in want.items():
        assert abs(got[key] - value) <= 2, f"{key}: {got[key]} permille, wanted {value}: {got}"


def test_share_tenants_get_their_shares(sched: Path) -> None:
    near(shares(sched, [("share", 300, 300), ("share", 700, 700)]), {"t0": 300, "t1": 700, "idle": 0})
    near(shares(sched, [("share", 100, 100), ("share", 900, 900)]), {"t0": 100, "t1": 900, "idle": 0})


def test_caps_and_shares_together_get_theirs(sched: Path) -> None:
    mixed = [("cap", 100, 100), ("cap", 200, 200), ("share", 300, 300), ("share", 400, 400)]
    near(shares(sched, mixed), {"t0": 100, "t1": 200, "t2": 300, "t3": 400, "idle": 0})


def test_a_cap_alone_leaves_the_rest_of_the_card_idle(sched: Path) -> None:
    got = shares(sched, [("cap", 300, 300)])
    # The first grant's credit (half a quantum) over 3 s: two tenths of a point.
    assert 300 <= got["t0"] <= 302
    assert got["t0"] + got["idle"] >= 999


def test_a_burst_tenant_gets_its_ceiling_alone_and_its_guarantee_beside_a_busy_share(sched: Path) -> None:
    alone = shares(sched, [("burst", 200, 600)])
    assert 600 <= alone["t0"] <= 602
    near(shares(sched, [("burst", 200, 600), ("share", 500, 500)]), {"t0": 200, "t1": 800, "idle": 0})


def test_the_higher_class_wins_whatever_its_virtual_time(sched: Path) -> None:
    got = answers(
        sched,
        "tenant 0 share 500 500 1 1000",
        "tenant 1 share 500 500 1 1000",
        "client 0 0 normal",
        "client 1 1 online",
        "pay 1 500000 1000",  # the online tenant has used far more of the card
        "wait 0 2000",
        "wait 1 3000",
        "pick 4000",
    )
    assert got[-1]["best"] == 1


def test_within_a_class_the_smaller_virtual_time_then_the_longest_waiting_wins(sched: Path) -> None:
    setup = [
        "tenant 0 share 500 500 1 1000",
        "tenant 1 share 500 500 1 1000",
        "client 0 0 normal",
        "client 1 1 normal",
    ]
    first = answers(sched, *setup, "pay 0 10000 1000", "wait 0 2000", "wait 1 3000", "pick 4000")
    assert first[-1]["best"] == 1  # tenant 1 has used less
    fifo = answers(sched, *setup, "wait 1 3000", "wait 0 2000", "pick 4000")
    assert fifo[-1]["best"] == 0  # equal: the one waiting since 2000


def test_offline_work_is_not_granted_while_held_back(sched: Path) -> None:
    got = answers(
        sched,
        "tenant 0 share 500 500 1 1000",
        "client 0 0 offline",
        "wait 0 1000",
        "holdback 5000",
        "pick 4999",
        "pick 5000",
    )
    assert [got[-2]["best"], got[-1]["best"]] == [-1, 0]


def test_a_ceiling_tenant_is_granted_no_more_than_its_bucket_allows(sched: Path) -> None:
    got = answers(sched, "tenant 0 cap 300 300 1 1000", "client 0 0 normal", "wait 0 1000", "grant 0 1000")
    # Half a quantum of credit, drained at 1 - 0.3 while held: 5000 / 0.7 µs, not the 10 ms quantum.
    assert got[-1]["quantum"] == 5000 * 1000 // 700
    assert got[-1]["holder"] == 0
    assert got[-1]["waiting"] == 0
    spent = answers(
        sched,
        "tenant 0 cap 300 300 1 1000",
        "client 0 0 normal",
        "pay 0 20000 1000",
        "wait 0 1000",
        "pick 1000",
    )
    assert spent[-3]["bucket"] < 0  # overdrawn by the hold it was charged
    assert spent[-1]["best"] == -1  # throttled until the bucket refills


def test_a_ceiling_bucket_runs_dry_once_the_work_in_flight_is_paid(sched: Path) -> None:
    """What a queued hand-over asks of a holder under a ceiling (arbqueue.c): would its bucket,
    earned up to now, fall below the least grant (half of the 10 ms quantum) once its work still
    on the GPU were paid?"""
    got = answers(
        sched,
        "tenant 0 cap 300 300 1 1000",  # starts with one grant's credit: 5000 µs
        "tenant 1 share 700 700 1 1000",
        "dry 0 0 1000",
        "dry 0 1 1000",
        "dry 0 3000 11000",  # 10 ms later it has earned 3000 µs at 30%
        "dry 0 3001 11000",
        "dry 1 1000000 11000",  # no ceiling: never dry
    )
    assert [g["dry"] for g in got if "dry" in g] == [0, 1, 0, 1, 0]


def test_a_client_of_no_tenant_pays_nothing(sched: Path) -> None:
    got = answers(sched, "tenant 0 share 500 500 1 1000", "client 0 70 normal", "pay 0 1000 1000")
    assert got[-1]["paid"] == 0


def test_a_holder_lends_its_gap_to_a_waiter_of_its_class_a_little_ahead_unless_online(
    sched: Path,
) -> None:
    """A holder that keeps the card by virtual time lends it for its host gap (arbiter.c,
    "Loans"), unless it is online (its next burst would wait for the borrower's kernel).  The
    waiter pays for what it runs, so virtual time takes loans back; but a waiter whose kernels
    outlast the holder's bursts would take the card at each of them, so loans stop while it is
    a quarter quantum of its own GPU time ahead in virtual time (10 ms quantum: 2.5 ms)."""
    got = answers(
        sched,
        "tenant 0 share 300 300 1 1000",
        "tenant 1 share 700 700 1 1000",
        "tenant 2 share 500 500 1 1000",
        "tenant 3 share 500 500 1 1000",
        "tenant 4 share 500 500 1 1000",
        "client 0 0 normal",
        "client 1 1 normal",
        "client 2 2 offline",
        "client 3 3 online",
        "client 4 4 online",
        "wait 0 1000",
        "wait 1 1000",
        "wait 2 1000",
        "wait 3 1000",
        "lend 4 3 1000",  # an online holder never lends: its next burst would wait
        "lend 1 0 2000",  # level: the 30% waiter may run in the 70% holder's gap
        "pay 0 2400 3000",  # 2.4 ms ahead
        "lend 1 0 3000",
        "pay 0 200 4000",  # 2.6 ms ahead: no more
        "lend 1 0 4000",
        "pay 1 10000 5000",  # the holder ran 10 ms: the waiter is behind it
        "lend 1 0 5000",  # then it is the better waiter: a hand-over, not a loan
        "lend 1 2 5000",  # never to another class
    )
    assert [g["lend"] for g in got if "lend" in g] == [0, 1, 1, 0, 0, 0]
