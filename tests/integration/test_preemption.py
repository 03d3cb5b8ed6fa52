"""How an online request takes the card from an offline holder (ABI 1.5, docs/design/arbitration.md
"Random requests"): drained first, or granted at once with the offline kernel in flight left to
the simulated GPU's time-slicing (early), and the quiet window after online requests.  Timing
goals live in bench/isolation.py --random; these check the behaviour with wide margins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from arbiterutil import arbiter_of, compute_tenant, finish, start_at
from conftest import Sim, parse_kv
from sharegpu.arbiter import read_arbiter, tune_arbiter
from sharegpu.errors import SpecError


def spawn(sim: Sim, tenant: Path, *args: object) -> subprocess.Popen[str]:
    return sim.spawn_probe(*(str(a) for a in args), env=sim.tenant_env(tenant))


def finish_lines(proc: subprocess.Popen[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"probe exited {proc.returncode}\n{out}\n{err}"
    return parse_kv(out)


def _requests_next_to_long_kernels(sim: Sim, online: Path, offline: Path) -> tuple[list[int], int, int]:
    """25 requests of one 1 ms kernel every 70 ms next to an offline job of 40 ms kernels: the
    latencies (µs), and the wall time from the first start to the last end and the GPU time the
    arbiter charged the two tenants over the run (ns)."""
    path = arbiter_of(sim)
    before = read_arbiter(path)
    at = start_at(0.5)
    off = spawn(sim, offline, "saturate", 1.9, 40_000, "kernel", at - 200_000_000)
    on = spawn(sim, online, "bursts", 25, 70, 1, 1000, at)
    (res_on, lines), res_off = finish_lines(on), finish(off)
    after = read_arbiter(path)
    charged = 0
    for name in ("web", "train"):
        t0, t1 = before.tenant(name), after.tenant(name)
        assert t1 is not None
        charged += t1.gpu_time_ns - (t0.gpu_time_ns if t0 else 0)

    lat = [int(v) for k, v in lines if k == "lat_us"]
    wall = max(int(res_off["end_ns"]), at + int(res_on["wall_ns"])) - int(res_off["start_ns"])
    return lat, wall, charged


@pytest.fixture
def pair(sim: Sim) -> tuple[Path, Path]:
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    tune_arbiter(arbiter_of(sim), holdback_max_ns=0)  # no prediction: every request is a surprise
    return online, offline


@pytest.mark.timing
def test_early_preemption_does_not_wait_for_the_offline_kernel(sim: Sim, pair: tuple[Path, Path]) -> None:
    online, offline = pair
    path = arbiter_of(sim)
    tune_arbiter(path, online_preempt="drain")
    drained, wall, charged = _requests_next_to_long_kernels(sim, online, offline)
    assert read_arbiter(path).early_preemptions == 0
    assert charged <= wall + 2_000_000  # every nanosecond charged once
    tune_arbiter(path, online_preempt="early")
    early, wall, charged = _requests_next_to_long_kernels(sim, online, offline)
    status = read_arbiter(path)
    print(
        f"latency (ms): drain {sorted(x // 1000 for x in drained)}, early {sorted(x // 1000 for x in early)}"
    )
    print(
        f"early preemptions {status.early_preemptions}; charged {charged / 1e6:.1f} ms of {wall / 1e6:.1f} ms"
    )
    # A request that finds the offline client holding the token: drained, it waits for the rest
    # of a 40 ms kernel; early, for the rest of the GPU's 2 ms slice, one preemption and its own
    # 1 ms kernel.  (The others find the token free: the offline client's watcher hands it back
    # while the client waits in its in-flight bound, and the GPU preempts the kernel as above.)
    assert max(drained) >= 20_000
    assert sorted(early)[-3] <= 8_000
    # How many of the 25 find the token held (rather than handed back by the watcher) depends
    # on the machine's timing: 4 to 12 seen. At least one shows the early path is taken.
    assert status.early_preemptions >= 1
    # Every nanosecond is charged once: the holders' charges never add up to more than the run.
    assert charged <= wall + 2_000_000


@pytest.mark.timing
def test_by_kernel_length_preempts_early_only_for_long_kernels(sim: Sim, pair: tuple[Path, Path]) -> None:
    online, offline = pair
    path = arbiter_of(sim)
    tune_arbiter(path, online_preempt="by-kernel", preempt_min_kernel_ns=100_000_000)  # 40 ms < 100 ms
    _requests_next_to_long_kernels(sim, online, offline)
    assert read_arbiter(path).early_preemptions == 0
    tune_arbiter(path, preempt_min_kernel_ns=20_000_000)
    lat, _, _ = _requests_next_to_long_kernels(sim, online, offline)
    assert read_arbiter(path).early_preemptions >= 1  # how many: the machine's timing (see above)
    assert sorted(lat)[-3] <= 8_000


@pytest.mark.timing
def test_quiet_window_keeps_offline_off_after_online_requests(sim: Sim, pair: tuple[Path, Path]) -> None:
    online, offline = pair
    path = arbiter_of(sim)

    def run() -> dict[str, str]:
        at = start_at(0.5)
        off = spawn(sim, offline, "saturate", 1.6, 1000, "kernel", at - 200_000_000)
        finish(spawn(sim, online, "bursts", 20, 70, 1, 1000, at))
        return finish(off)

    free = run()
    tune_arbiter(path, offline_quiet_ns=30_000_000)
    quiet = run()
    status = read_arbiter(path)
    print(
        f"offline max gap: {free['max_gap_us']} us free, {quiet['max_gap_us']} us with a 30 ms quiet window"
    )
    print(f"achieved {free['achieved']} / {quiet['achieved']}, quiet windows {status.quiet_windows}")
    assert int(free["max_gap_us"]) < 20_000
    assert int(quiet["max_gap_us"]) >= 25_000
    assert status.quiet_windows >= 15
    assert float(quiet["achieved"]) < float(free["achieved"]) - 0.15  # ~30 of every 70 ms lost


def test_tune_rejects_bad_preemption_settings(sim: Sim, pair: tuple[Path, Path]) -> None:
    path = arbiter_of(sim)
    with pytest.raises(SpecError, match="online preemption"):
        tune_arbiter(path, online_preempt="sometimes")
    with pytest.raises(SpecError, match="quiet window"):
        tune_arbiter(path, offline_quiet_ns=-1)
    with pytest.raises(SpecError, match="preemption threshold"):
        tune_arbiter(path, preempt_min_kernel_ns=2 * 10**9)
    status = read_arbiter(path)
    assert (status.online_preempt, status.offline_quiet_ns) == ("early", 0)  # the defaults


@pytest.mark.timing
def test_an_online_request_returns_without_giving_its_cpu_away(sim: Sim) -> None:
    """At a request's end, in its sync, the service hands the card to the offline job waiting for
    it.  A hand-over within a class then yields the CPU, so that a next holder woken onto it
    launches before the releaser's host code; a service did so too, and its request returned only
    when whatever else was runnable on its CPU let it (beside 2 ms offline kernels on the 2-core
    VM the shim's part of the service's sync return went from 2 µs alone to 28-47 µs on average,
    up to 4.9 ms, 2026-12-07).  With a busy program on the service's CPU, each request's return
    after its kernels ended (its latency less its launches and its kernels' span on the GPU's
    clock) stays far below a scheduler's time slice."""
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")  # requests predicted
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpu})
        at = start_at(0.5)
        off = spawn(sim, offline, "saturate", 1.7, 500, "kernel", at - 200_000_000)
        on = spawn(sim, online, "bursts", 100, 10, 3, 300, at)
        os.sched_setaffinity(on.pid, {cpu})  # before its first launch starts its watcher
        (_, lines), _ = finish_lines(on), finish(off)
    finally:
        busy.kill()
        busy.wait()
    parts = {k: [int(v) for key, v in lines if key == k] for k in ("lat_us", "launch_us", "span_us")}
    returns = sorted(
        lat - launch - span
        for lat, launch, span in zip(parts["lat_us"], parts["launch_us"], parts["span_us"], strict=True)
    )
    median = returns[len(returns) // 2]
    print(f"return after the kernels ended: median {median} µs, p90 {returns[len(returns) * 9 // 10]} µs")
    assert median <= 700, returns  # 1.4-3.3 ms when it yielded
