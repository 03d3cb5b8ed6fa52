"""What the periodic repeats of bench/isolation.py --random count per run (bench/_arrivals.py):
pure, on made-up latencies; and the probe's per-request wait for a CPU they read."""

from __future__ import annotations

import sys

from conftest import REPO, Sim, parse_kv

sys.path.insert(0, str(REPO / "bench"))
try:
    import _arrivals
finally:
    sys.path.pop(0)


def test_a_request_late_only_by_its_wait_for_a_cpu_is_told_apart() -> None:
    lat = [1000.0, 1500.0, 3000.0, 1100.0]
    cpu = [0.0, 400.0, 500.0, 0.0]
    late, by_cpu = _arrivals.late_requests(lat, cpu, bound=1200.0)
    assert late == [1, 2]
    assert by_cpu == [1]  # 1500 - 400 is on time; 3000 - 500 is not


def test_the_p99_is_the_probes_rank() -> None:
    values = [float(v) for v in range(200)]
    assert _arrivals.p99(values) == 197.0  # round(0.99 x 199) = 197, as sgprobe ranks it
    assert _arrivals.p99([5.0]) == 5.0


def test_the_probe_reports_each_requests_wait_for_a_cpu(sim: Sim) -> None:
    values, pairs = parse_kv(sim.probe("bursts", "5", "5", "2", "200").stdout)
    lat = [int(v) for k, v in pairs if k == "lat_us"]
    runq = [int(v) for k, v in pairs if k == "runq_us"]
    assert len(lat) == len(runq) == 5
    assert all(0 <= w <= v + 1000 for v, w in zip(lat, runq, strict=True))  # a part of the request
    assert int(values["p99_us"]) >= 400  # two 200 µs kernels
