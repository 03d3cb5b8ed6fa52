"""The real-GPU validation run's analysis (bench/gpucheck), on figures given here. The dry run on
the simulated GPU is tests/integration/test_gpu_check.py.
"""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

from gpucheck.steps.timeslice import analyse


def test_the_time_slice_analysis_reads_runs_and_gaps() -> None:
    # 20 µs kernels: 50 in a 1000 µs slice, then the other's 1000 µs slice and two 50 µs switches.
    intervals = ([20.0] * 49 + [20.0 + 1100]) * 10
    found = analyse(intervals, 20)
    assert found["gaps"] == 10
    assert found["slice_us"] == pytest.approx(1000, abs=1)
    assert found["switch_us"] == pytest.approx(50, abs=1)
    assert analyse([20.0] * 100, 20)["slice_us"] is None
