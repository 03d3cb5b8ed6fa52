"""The tests judged on wall time (marked `timing`) and the host under them: how much CPU the
hypervisor took during a test or a measurement (bench/_host.py), and a measurement repeated
while the host took enough to decide it.

A VM's hypervisor may run other guests on its CPUs for tenths of a second (steal).  A futex
wake to a vCPU it holds waits for it, so an online request, a hand-over or an offline job's next
launch comes late, and a figure taken then measures the host.  On CI's machine four tests of the
online and offline classes failed twice in a row in one run (2026-12-06); here the same tests
failed when the host stole 1.9 s of CPU in 31 s and passed at 0.06 s in 25 s."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
try:
    from _host import host_steal_ms
finally:
    sys.path.pop(0)

T = TypeVar("T")

# A measurement during which the host stole more than this much CPU per second of wall time
# (ms/s, both CPUs together: 1% of a 2-core machine) is taken again. Quiet runs here steal
# 0-5 ms/s; the runs that failed, 40-60.
STOLEN_MS_PER_S = 20.0


def least_stolen(measure: Callable[[], T], *, attempts: int = 3) -> T:
    """measure(), taken again while the host stole more than STOLEN_MS_PER_S during it, at most
    `attempts` times: the result of the attempt it stole least from.  Each attempt prints what
    was stolen, so a failure shows whether the host was quiet when it was measured.  A
    regression fails the quiet attempts as well: this never loosens a bound."""
    taken: list[tuple[float, T]] = []
    for attempt in range(1, attempts + 1):
        began, stolen = time.monotonic(), host_steal_ms()
        result = measure()
        rate = (host_steal_ms() - stolen) / max(time.monotonic() - began, 1e-3)
        print(f"  (attempt {attempt}: the host stole {rate:.0f} ms of CPU a second)")
        taken.append((rate, result))
        if rate <= STOLEN_MS_PER_S:
            break
    return min(taken, key=lambda pair: pair[0])[1]
