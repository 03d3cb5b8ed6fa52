"""bench/vulkan.py runs end to end (one short round) and measures both configurations."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_the_vulkan_bench_measures_with_and_without_the_layer() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "vulkan.py"),
            "--sections",
            "calls",
            "--rounds",
            "1",
            "--calls",
            "2000",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {row["call"]: row for row in json.loads(proc.stdout)["calls"]}
    assert set(rows) == {"alloc+free 4 KiB", "submit (empty)"}
    # The layer charges every allocation: its pair costs more than the driver's alone.
    assert rows["alloc+free 4 KiB"]["with_ns"] > rows["alloc+free 4 KiB"]["without_ns"] > 0
