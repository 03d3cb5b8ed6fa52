"""What the host did to this machine's CPUs: read by the benches and by the tests judged on
wall time, which print it beside their figures (a VM's hypervisor may take its CPUs for tenths
of a second, and a sharing figure taken then measures the host, not sharegpu)."""

from __future__ import annotations

import os
from pathlib import Path


def host_steal_ms() -> float:
    """CPU time the hypervisor gave other guests while this VM's CPUs wanted to run, all CPUs
    summed (/proc/stat: the `cpu` line's eighth field, in clock ticks; 0 on bare metal).  A
    thread on a stolen CPU is neither running nor runnable to the guest's own scheduler, so the
    probe's CPU wait does not see it: a sleeping sync woken late shows as its return ("r")."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
