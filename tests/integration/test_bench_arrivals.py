"""What the periodic repeats of bench/isolation.py --random count per run (bench/_arrivals.py):
pure, on made-up latencies; and the probe's per-request figures they read."""

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


def request(latency: float, cpu: float = 5, launched: float = 15, span: float = 905, woke: float = 100):
    return _arrivals.Request(latency, cpu, launched, span, woke)


def test_a_late_request_is_told_by_the_part_furthest_above_the_usual() -> None:
    usual = [request(920) for _ in range(20)]
    late = [
        request(2900, span=2885),  # queued behind a 2 ms offline kernel
        request(2100, launched=1200),  # waited for the token
        request(2000, cpu=1070),  # waited for a CPU
        request(1900),  # the sync returned late after the kernels
        request(2300, cpu=400, span=1905),  # both, the GPU's part the larger
    ]
    served = usual + late
    at = list(range(20, 25))
    assert _arrivals.late_causes(served, at) == ["gpu", "token", "cpu", "return", "gpu"]
    assert _arrivals.late_causes([], []) == []


def test_the_probes_per_request_lines_become_requests() -> None:
    probe = {
        "lat_us_all": "920,3000",
        "runq_us_all": "3,10",
        "launch_us_all": "12,20",
        "span_us_all": "905,2950",
        "woke_us_all": "80,1500",
    }
    got = _arrivals.requests_of(probe)
    assert got == [request(920, 3, 12, 905, 80), request(3000, 10, 20, 2950, 1500)]
    assert _arrivals.requests_of({}) == []


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
    column = {k: [int(v) for key, v in pairs if key == k] for k in ("launch_us", "span_us", "woke_us")}
    assert all(len(v) == 5 for v in column.values())
    assert all(400 <= span <= v for span, v in zip(column["span_us"], lat, strict=True))  # the kernels
    assert all(launch < v for launch, v in zip(column["launch_us"], lat, strict=True))
    assert all(0 <= w < 5_000 for w in column["woke_us"])  # each began about on its instant
