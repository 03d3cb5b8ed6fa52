"""bench/broker.py: both round trips are measured between two real processes and printed."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def test_the_broker_bench_prints_both_round_trips() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "broker.py"), "--trips", "300", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^(futex wake|Unix socket)[^\d]*([\d.]+)", done.stdout, re.MULTILINE))
    assert set(rows) == {"futex wake", "Unix socket"}
    assert all(float(v) > 0 for v in rows.values())  # a round trip takes time
    assert re.search(r"a broker adds about -?[\d.]+ µs", done.stdout)


def test_the_broker_bench_refuses_a_run_too_short_to_measure() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "broker.py"), "--trips", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--trips must be >= 100" in done.stderr
