"""The simulated GPU (native/simgpu) driven through real processes: sgprobe, cuda-python, pynvml."""

from __future__ import annotations

import ctypes
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simgpuutil import (
    GIB,
    KINDS,
    LIB,
    MIB,
    NATIVE,
    PROBES,
    SIMLIB,
    needs,
    parse,
    probe,
    run_py,
    small,
    start_hold,
    stop,
)

# ---- exports ---------------------------------------------------------------------------------


def _exports(lib: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if " T " in line}


def test_libnvml_exports_exactly_its_entry_points(built: Path) -> None:
    src = (NATIVE / "simgpu" / "nvml" / "nvml.c").read_text()
    names = set(re.findall(r"NVML_EXPORT [\w *]+?\b(nvml\w+)\(", src))
    assert _exports(SIMLIB / "libnvidia-ml.so.1") == names


def test_a_thread_with_a_small_stack_starts_beside_both_libraries(sim_env: dict[str, str]) -> None:
    # glibc carves the TLS of libraries loaded at start out of every thread's stack: per-thread
    # tables in the simulated libraries once left the shim's 64 KiB watcher thread no room to
    # start, so every tenant kept an idle token. Both libraries preloaded, as a linked program
    # loads them; Python threads, since pthread_create's failure surfaces as a RuntimeError.
    env = {**sim_env, "LD_PRELOAD": f"{SIMLIB / 'libcuda.so.1'}:{SIMLIB / 'libnvidia-ml.so.1'}"}
    code = (
        "import threading\n"
        "threading.stack_size(64 * 1024)\n"
        "t = threading.Thread(target=lambda: None)\n"
        "t.start(); t.join(); print('started')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "started"


# ---- devices -----------------------------------------------------------------------------------


@pytest.mark.parametrize("exe", PROBES)
def test_probe_info_and_meminfo(sim_env: dict[str, str], exe: str) -> None:
    kv = probe(sim_env, "info", exe=exe)
    assert kv["count"] == "2"
    assert kv["driver_version"] == "13000"
    assert kv["dev0.name"] == "sharegpu simulated H100"
    assert int(kv["dev0.total"]) == 80 * GIB
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", kv["dev0.uuid"])
    assert kv["dev0.uuid"] != kv["dev1.uuid"]
    assert probe(sim_env, "info", exe=exe)["dev1.uuid"] == kv["dev1.uuid"]  # stable
    mem = probe(sim_env, "-d", "1", "meminfo", exe=exe)
    assert int(mem["free"]) == int(mem["total"]) == int(mem["devtotal"]) == 80 * GIB


def test_copy_round_trip(sim_env: dict[str, str]) -> None:
    kv = probe(sim_env, "copy", "3M")
    assert kv["copy"] == "OK"
    assert kv["memset"] == "OK"


def test_cuda_visible_devices(sim_env: dict[str, str]) -> None:
    full = probe(sim_env, "info")
    kv = probe({**sim_env, "CUDA_VISIBLE_DEVICES": "1"}, "info")
    assert kv["count"] == "1"
    assert kv["dev0.uuid"] == full["dev1.uuid"]
    kv = probe({**sim_env, "CUDA_VISIBLE_DEVICES": full["dev1.uuid"][:12] + ",0"}, "info")
    assert kv["count"] == "2"
    assert kv["dev0.uuid"] == full["dev1.uuid"]
    assert probe({**sim_env, "CUDA_VISIBLE_DEVICES": "0,7,1"}, "info")["count"] == "1"
    kv = probe({**sim_env, "CUDA_VISIBLE_DEVICES": ""}, "info", rc=1)
    assert kv["error"] == "CUDA_ERROR_NO_DEVICE"


def test_bad_config_is_a_clear_error(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = small(sim_env, tmp_path, memroy_mib=5)
    kv = probe(env, "info", rc=1)
    assert kv["fail"] == "api.cuInit(0)"
    assert re.search(r'^simgpu: .*unknown key "memroy_mib"', kv["_stderr"], re.M)
    env = small(sim_env, tmp_path, gpus="two")
    assert '"gpus" must be an integer' in probe(env, "info", rc=1)["_stderr"]
    (tmp_path / "simgpu.json").write_text('{"gpus": 2,}')
    assert "simgpu:" in probe(env, "info", rc=1)["_stderr"]
    assert not Path(sim_env["SIMGPU_STATE"]).exists()  # nothing created from a bad config
    code = """
        import ctypes, json
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        print(json.dumps({"rc": lib.nvmlInit_v2()}))
    """
    assert run_py(env, code)["rc"] != 0


def test_corrupt_state_is_refused(sim_env: dict[str, str]) -> None:
    Path(sim_env["SIMGPU_STATE"]).write_bytes(b"\0" * 4096)
    kv = probe(sim_env, "info", rc=1)
    assert re.search(r"^simgpu: .*(not a simgpu state|corrupt)", kv["_stderr"], re.M)
    Path(sim_env["SIMGPU_STATE"]).write_bytes(b"")
    assert "simgpu:" in probe(sim_env, "info", rc=1)["_stderr"]


# ---- memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_allocates_to_capacity(sim_env: dict[str, str], tmp_path: Path, kind: str) -> None:
    env = small(sim_env, tmp_path)
    kv = probe(env, "fill", kind, "16M")
    assert kv["count"] == "16"
    assert kv["bytes"] == str(256 * MIB)
    assert kv["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert kv["refill"] == "OK"
    mem = probe(env, "meminfo")
    assert mem["free"] == mem["total"] == str(256 * MIB)  # all returned at the end


@pytest.mark.parametrize("exe", PROBES)
def test_capacity_is_shared_across_processes(sim_env: dict[str, str], tmp_path: Path, exe: str) -> None:
    env = small(sim_env, tmp_path)
    holder = start_hold(env, "plain", "200M")
    try:
        kv = probe(env, "alloc", "plain", "100M", exe=exe)
        assert kv["alloc"] == "CUDA_ERROR_OUT_OF_MEMORY"
        kv = probe(env, "alloc", "plain", "50M", exe=exe)
        assert kv["alloc"] == "OK"
        assert int(kv["free"]) == 6 * MIB
        # GPU 1 is another card.
        assert probe(env, "-d", "1", "alloc", "plain", "250M", exe=exe)["alloc"] == "OK"
    finally:
        stop(holder)


def test_threads_share_capacity(sim_env: dict[str, str], tmp_path: Path) -> None:
    kv = probe(small(sim_env, tmp_path), "threads", "4", "plain", "1M")
    assert kv["count"] == "256"
    assert kv["error"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_sigkilled_process_memory_is_freed(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = small(sim_env, tmp_path)
    holder = start_hold(env, "plain", "200M")
    assert int(probe(env, "meminfo")["free"]) == 56 * MIB
    stop(holder)
    assert probe(env, "alloc", "plain", "250M")["alloc"] == "OK"
    kv = probe(env, "forkfree", "vmm", "100M")  # killed child, no waiting by the reaper
    assert kv["child"] == f"signal:{signal.SIGKILL}"
    assert kv["freed"] == "1"


def test_exit_frees_memory_and_cycle_is_cheap(sim_env: dict[str, str]) -> None:
    probe(sim_env, "alloc", "plain", "1G")
    assert int(probe(sim_env, "meminfo")["free"]) == 80 * GIB
    assert int(probe(sim_env, "cycle", "plain", "1M", "20000")["ns_per_pair"]) < 200_000


# ---- execution ---------------------------------------------------------------------------------


@pytest.mark.timing
def test_spin_kernel_takes_its_time(sim_env: dict[str, str]) -> None:
    kv = probe(sim_env, "launch", "1", "20000")
    assert 18_000 <= int(kv["wall_us"]) <= 60_000
    assert_gpu_time(kv, 20_000)
    assert probe(sim_env, "launch", "0", "20000")["launch_gap_us"] == "0"  # nothing launched


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["kernel", "ex", "coop", "graph", "capture"])
def test_launch_apis_take_the_expected_time(sim_env: dict[str, str], mode: str) -> None:
    kv = probe(sim_env, "launch", "5", "10000", mode)
    assert 49_000 <= int(kv["wall_us"]) <= 150_000
    assert abs(int(kv["gpu_us"]) - 50_000) <= 1_000


@pytest.mark.timing
def test_non_spin_kernel_uses_simgpu_kernel_us(sim_env: dict[str, str]) -> None:
    code = """
        import ctypes, json, time
        cu = ctypes.CDLL("libcuda.so.1")
        ctx, mod, f, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
        assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cu.cuCtxSetCurrent(ctx) == 0
        ptx = b".version 8.0\\n.target sm_90\\n.visible .entry work()\\n{\\nret;\\n}\\n"
        assert cu.cuModuleLoadData(ctypes.byref(mod), ptx) == 0
        missing = cu.cuModuleGetFunction(ctypes.byref(f), mod, b"spin")
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, b"work") == 0
        t = time.monotonic()
        for _ in range(3):
            assert cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, None, None, None) == 0
        assert cu.cuCtxSynchronize() == 0
        print(json.dumps({"missing": missing, "ms": (time.monotonic() - t) * 1000}))
    """
    res = run_py({**sim_env, "SIMGPU_KERNEL_US": "15000"}, code)
    assert res["missing"] == 500  # CUDA_ERROR_NOT_FOUND: not an .entry of that PTX
    assert 45 <= float(res["ms"]) <= 150


def start_at(delay_s: float = 0.5) -> int:
    """A CLOCK_MONOTONIC instant (ns) a little ahead: the common start of several probes."""
    return time.monotonic_ns() + int(delay_s * 1e9)


def spawn_launch(
    env: dict[str, str], n: int, us: int, mode: str = "kernel", at: int = 0
) -> subprocess.Popen[str]:
    args = ["launch", str(n), str(us), mode] + ([str(at)] if at else [])
    return subprocess.Popen(
        [str(LIB / "sgprobe"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_line(p: subprocess.Popen[str], line: str) -> None:
    assert p.stdout is not None
    for got in p.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"{line!r} never came: rc={p.wait()} stderr={p.stderr.read() if p.stderr else ''}")


def finish(p: subprocess.Popen[str]) -> dict[str, str]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (p.returncode, out, err)
    return parse(out)


ENGINE_SLACK_US = 200
"""Rounding of event times to the engine's commits, and of gpu_us to whole microseconds."""


def assert_gpu_time(result: dict[str, str], low_us: int, high_us: int | None = None) -> None:
    """A probe's gpu_us (start event to end event) against the engine's work, [low, high]. On an
    idle engine the start event completes when recorded, so the host's gap before the first
    launch counts too (a probe descheduled on a loaded 2-core machine: up to 4 ms seen); the
    probe reports how long that gap was at most (launch_gap_us), and it may only add."""
    got = int(result["gpu_us"])
    high = (low_us if high_us is None else high_us) + int(result["launch_gap_us"])
    assert low_us - ENGINE_SLACK_US <= got <= high + ENGINE_SLACK_US, (low_us, high_us, result)


def run_together(
    env: dict[str, str],
    jobs: list[tuple[int, int, str, float]],
    max_lag_ms: float = 15,
    job_envs: list[dict[str, str]] | None = None,
) -> tuple[int, list[dict[str, str]]]:
    """Runs `sgprobe launch N US MODE` per job (N, US, MODE, start offset in ms) from a common
    start, job i with job_envs[i] over env; each result gets done_ms (end of its sync, from the
    common start).  Retried when a probe started more than max_lag_ms late (a loaded machine),
    which would change the contest."""
    extra = job_envs or [{} for _ in jobs]
    for _attempt in range(3):
        t = start_at()
        procs = [
            spawn_launch(env | more, n, us, mode, t + int(off * 1e6))
            for (n, us, mode, off), more in zip(jobs, extra, strict=True)
        ]
        results = [finish(p) for p in procs]
        lags = [(int(r["start_ns"]) - t) / 1e6 - job[3] for r, job in zip(results, jobs, strict=True)]
        if max(lags) <= max_lag_ms:
            for r in results:
                r["done_ms"] = str((int(r["end_ns"]) - t) / 1e6)
            return t, results
    pytest.fail(f"probes kept starting late (lags {lags} ms): machine too loaded")


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["kernel", "graph", "capture"])
def test_two_processes_time_slice_one_engine(sim_env: dict[str, str], mode: str) -> None:
    # Each launches a 100 ms kernel at the same moment: the engine alternates 2 ms slices, so
    # both complete after about 205 ms (a FIFO would finish one at ~100 ms): 200 ms of work
    # and ~100 preemptions of 50 µs.
    _, res = run_together(sim_env, [(1, 100_000, mode, 0)] * 2)
    for r in res:
        assert 180 <= float(r["done_ms"]) <= 300, res
        assert 170_000 <= int(r["gpu_us"]) <= 212_000, res


@pytest.mark.timing
def test_three_processes_share_equally(sim_env: dict[str, str]) -> None:
    _, res = run_together(sim_env, [(1, 100_000, "kernel", 0)] * 3)
    for r in res:
        assert 270 <= float(r["done_ms"]) <= 400, res
        assert 255_000 <= int(r["gpu_us"]) <= 315_000, res  # 300 ms and ~150 preemptions


@pytest.mark.timing
def test_short_kernel_waits_slices_not_a_backlog(sim_env: dict[str, str]) -> None:
    # 200 ms of queued work (20 x 10 ms) in one process; a 10 ms kernel from another, 30 ms later,
    # shares the engine at once: its own 10 ms + the other's slices in between, not ~170 ms.
    _, (backlog, short) = run_together(sim_env, [(20, 10_000, "kernel", 0), (1, 10_000, "kernel", 30)])
    assert 10_000 <= int(short["gpu_us"]) <= 30_000, short
    assert int(short["wall_us"]) <= 80_000, short
    assert float(backlog["done_ms"]) >= 205, backlog  # it gave up the time the short kernel took


@pytest.mark.timing
def test_lone_kernel_longer_than_a_slice_is_not_slowed(sim_env: dict[str, str]) -> None:
    env = {**sim_env, "SIMGPU_TIMESLICE_US": "100"}  # this test's fresh state: a 100 µs slice
    kv = probe(env, "launch", "1", "50000")
    assert_gpu_time(kv, 50_000)
    assert 49_000 <= int(kv["wall_us"]) <= 120_000
    kv = probe(env, "launch", "5", "10000", "graph")
    assert_gpu_time(kv, 50_000)


@pytest.mark.timing
def test_timeslice_setting_applies(sim_env: dict[str, str]) -> None:
    # A slice as long as the kernels: two processes launching at once run one after the other.
    env = {**sim_env, "SIMGPU_TIMESLICE_US": "100000"}
    _, res = run_together(env, [(1, 100_000, "kernel", 0)] * 2)
    first, second = sorted(float(r["done_ms"]) for r in res)
    assert 95 <= first <= 150, res
    assert 180 <= second <= 300, res


def test_a_running_kernel_is_preempted_at_the_slice_end_and_the_switches_cost(
    sim_env: dict[str, str],
) -> None:
    # A 50 ms kernel runs alone; a 1 ms kernel of another process arrives 10 ms in.  It waits
    # for the rest of the running slice (<= 2 ms), the preemption (5 ms here, large so that host
    # noise cannot hide it), and runs; switching back costs ctxsw (3 ms).  Event times are the
    # engine's, so the switch costs show exactly in the long kernel's GPU time.
    env = {**sim_env, "SIMGPU_PREEMPT_US": "5000", "SIMGPU_CTXSW_US": "3000"}
    _, (long, short) = run_together(env, [(1, 50_000, "kernel", 0), (1, 1_000, "kernel", 10)])
    assert_gpu_time(short, 6_000, 8_100)  # preempted, not waited for
    assert_gpu_time(long, 50_000 + 1_000 + 5_000 + 3_000)


def test_switches_are_free_when_configured_so(sim_env: dict[str, str]) -> None:
    env = {**sim_env, "SIMGPU_PREEMPT_US": "0", "SIMGPU_CTXSW_US": "0"}
    _, (long, short) = run_together(env, [(1, 50_000, "kernel", 0), (1, 1_000, "kernel", 10)])
    assert_gpu_time(short, 1_000, 3_100)
    assert_gpu_time(long, 51_000)


def test_a_lone_context_is_never_preempted(sim_env: dict[str, str]) -> None:
    # Slices of 100 µs, a 5 ms preemption cost: a lone 50 ms kernel still takes 50 ms.
    env = {**sim_env, "SIMGPU_TIMESLICE_US": "100", "SIMGPU_PREEMPT_US": "5000", "SIMGPU_CTXSW_US": "5000"}
    kv = probe(env, "launch", "1", "50000")
    assert_gpu_time(kv, 50_000)


@pytest.mark.timing
def test_default_switch_costs_are_charged(sim_env: dict[str, str]) -> None:
    # Two 100 ms kernels at once: the engine is busy from the first start to the last end with
    # the 200 ms of work plus a 50 µs preemption (the default) at each 2 ms slice while both have
    # work: 100 of them, or (100 - L) when the second starts L ms late (run_together keeps L
    # under 15 ms), so at least 4.25 ms. The span, not the last kernel's own time: that one
    # started L ms late and would not show the first L ms.
    _, res = run_together(sim_env, [(1, 100_000, "kernel", 0)] * 2)
    span_us = (max(int(r["end_ns"]) for r in res) - min(int(r["start_ns"]) for r in res)) / 1000
    assert 203_000 <= span_us <= 212_000, res


BELOW_NORMAL = {"CUDA_MPS_CLIENT_PRIORITY": "1"}


@pytest.mark.timing
def test_under_mps_a_normal_client_waits_one_block_of_a_below_normal_kernel(sim_env: dict[str, str]) -> None:
    # An MPS server with 500 µs blocks: a 50 ms kernel of a below-normal client runs; a 1 ms
    # kernel of a normal client arriving 10 ms in waits for the running block (<= 0.5 ms), not
    # for a time slice and a preemption (5 ms here), and passing between them costs nothing.
    env = {**sim_env, "SIMGPU_MPS_BLOCK_US": "500", "SIMGPU_PREEMPT_US": "5000", "SIMGPU_CTXSW_US": "3000"}
    jobs = [(1, 50_000, "kernel", 0), (1, 1_000, "kernel", 10)]
    _, (long, short) = run_together(env, jobs, job_envs=[BELOW_NORMAL, {}])
    assert_gpu_time(short, 1_000, 1_600)
    assert_gpu_time(long, 51_000)  # its own 50 ms and the short one's 1 ms
    # Without MPS the same pair pays the slice and both switches (the model's default).
    env.pop("SIMGPU_MPS_BLOCK_US")
    _, (long, short) = run_together(env | {"SIMGPU_STATE": env["SIMGPU_STATE"] + ".2"}, jobs)
    assert int(short["gpu_us"]) >= 6_000, short


@pytest.mark.timing
def test_under_mps_a_below_normal_client_waits_for_the_normal_ones_work(sim_env: dict[str, str]) -> None:
    # The other way round: the below-normal kernel arriving 10 ms into a normal 50 ms kernel
    # runs only when that one is done (no slices against a lower priority).
    env = {**sim_env, "SIMGPU_MPS_BLOCK_US": "500"}
    jobs = [(1, 50_000, "kernel", 0), (1, 1_000, "kernel", 10)]
    _, (long, short) = run_together(env, jobs, job_envs=[{}, BELOW_NORMAL])
    assert_gpu_time(long, 50_000)
    # It waits for the rest of the normal kernel, counted from the two probes' own starts (the
    # host may start either late), then runs its own 1 ms; sliced in, it would take 1-3 ms.
    started_after_us = (int(short["start_ns"]) - int(long["start_ns"])) // 1000
    waited = 50_000 - started_after_us + 1_000
    gaps = int(long["launch_gap_us"]) + int(short["launch_gap_us"])  # late launches shift it
    assert waited - gaps - ENGINE_SLACK_US <= int(short["gpu_us"]) <= waited + gaps + ENGINE_SLACK_US, short


def test_under_mps_clients_of_one_priority_take_turns_without_switch_costs(sim_env: dict[str, str]) -> None:
    env = {**sim_env, "SIMGPU_MPS_BLOCK_US": "500", "SIMGPU_PREEMPT_US": "5000", "SIMGPU_CTXSW_US": "3000"}
    _, (long, short) = run_together(env, [(1, 50_000, "kernel", 0), (1, 1_000, "kernel", 10)])
    assert_gpu_time(short, 1_000, 3_100)  # the rest of a 2 ms slice, then its own
    assert_gpu_time(long, 51_000)


@pytest.mark.parametrize("value", ["abc", "100001", "-5"])
def test_a_bad_mps_block_is_refused(sim_env: dict[str, str], value: str) -> None:
    kv = probe({**sim_env, "SIMGPU_MPS_BLOCK_US": value}, "info", rc=1)
    assert re.search(
        rf"^simgpu: .*SIMGPU_MPS_BLOCK_US={re.escape(value)}: expected microseconds \(0\.\.100000\)$",
        kv["_stderr"],
        re.M,
    )


@pytest.mark.parametrize("var", ["SIMGPU_CTXSW_US", "SIMGPU_PREEMPT_US"])
@pytest.mark.parametrize("value", ["abc", "10001", "-5"])
def test_bad_switch_cost_is_refused(sim_env: dict[str, str], var: str, value: str) -> None:
    kv = probe({**sim_env, var: value}, "info", rc=1)
    assert re.search(
        rf"^simgpu: .*{var}={re.escape(value)}: expected microseconds \(0\.\.10000\)$", kv["_stderr"], re.M
    )


def test_bad_switch_cost_in_the_config_is_refused(sim_env: dict[str, str], tmp_path: Path) -> None:
    kv = probe(small(sim_env, tmp_path, preempt_us=20000), "info", rc=1)
    assert '"preempt_us" must be between 0 and 10000, got 20000' in kv["_stderr"]
    assert probe(small(sim_env, tmp_path, ctxsw_us=0, preempt_us=100), "info")["count"] == "2"


@pytest.mark.parametrize("value", ["abc", "99", "100001", "-5", "2000us", " 2000"])
def test_bad_timeslice_is_refused(sim_env: dict[str, str], value: str) -> None:
    env = {**sim_env, "SIMGPU_TIMESLICE_US": value}
    kv = probe(env, "info", rc=1)
    assert kv["fail"] == "api.cuInit(0)"
    line = rf"^simgpu: .*SIMGPU_TIMESLICE_US={re.escape(value)}: expected microseconds \(100\.\.100000\)$"
    assert re.search(line, kv["_stderr"], re.M), kv["_stderr"]
    code = """
        import ctypes, json
        print(json.dumps({"rc": ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()}))
    """
    assert run_py(env, code)["rc"] != 0
    assert not Path(sim_env["SIMGPU_STATE"]).exists()


def test_bad_timeslice_in_the_config_is_refused(sim_env: dict[str, str], tmp_path: Path) -> None:
    kv = probe(small(sim_env, tmp_path, timeslice_us=50), "info", rc=1)
    assert '"timeslice_us" must be between 100 and 100000, got 50' in kv["_stderr"]
    assert probe(small(sim_env, tmp_path, timeslice_us=500), "info")["count"] == "2"


def test_events_keep_their_time_thousands_of_launches_later(sim_env: dict[str, str]) -> None:
    # e0 waits for a 100 ms kernel, then 5000 kernels of 50 µs follow (more than a stream's 1024
    # pending kernels, so launches block; more than a channel's 4096 history entries, so e0's
    # entry is overwritten): e0..e1 must still be exactly the 250 ms of kernels in between.  The
    # queue stays ~50 ms ahead of the launching thread, so the stream never runs dry.
    code = """
        import ctypes, json
        cu = ctypes.CDLL("libcuda.so.1")
        ctx, mod, f, dev, s = (ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(),
                               ctypes.c_int(), ctypes.c_void_p())
        assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cu.cuCtxSetCurrent(ctx) == 0
        ptx = b".version 8.0\\n.target sm_90\\n.visible .entry spin(.param .u64 us)\\n{\\nret;\\n}\\n"
        assert cu.cuModuleLoadData(ctypes.byref(mod), ptx) == 0
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, b"spin") == 0
        assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0
        ev = [ctypes.c_void_p() for _ in range(4)]
        for e in ev:
            assert cu.cuEventCreate(ctypes.byref(e), 0) == 0
        us = ctypes.c_uint64()
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(us), ctypes.c_void_p))
        def launch(n):
            us.value = n
            assert cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, None) == 0
        assert cu.cuEventRecord(ev[3], s) == 0            # idle stream: done at once
        idle = cu.cuEventQuery(ev[3])
        launch(100000)
        assert cu.cuEventRecord(ev[0], s) == 0
        pending = cu.cuEventQuery(ev[0])
        for _ in range(5000):
            launch(50)
        assert cu.cuEventRecord(ev[1], s) == 0
        launch(5000)
        assert cu.cuEventRecord(ev[2], s) == 0
        assert cu.cuEventSynchronize(ev[2]) == 0
        ms = [ctypes.c_float() for _ in range(3)]
        assert cu.cuEventElapsedTime(ctypes.byref(ms[0]), ev[0], ev[1]) == 0
        assert cu.cuEventElapsedTime(ctypes.byref(ms[1]), ev[1], ev[2]) == 0
        assert cu.cuEventElapsedTime(ctypes.byref(ms[2]), ev[3], ev[2]) == 0
        print(json.dumps({"idle": idle, "pending": pending, "ms": [m.value for m in ms],
                          "query": cu.cuStreamQuery(s)}))
    """
    res = run_py(sim_env, code)
    assert res["idle"] == 0  # CUDA_SUCCESS
    assert res["pending"] == 600  # CUDA_ERROR_NOT_READY while its kernel runs
    assert res["query"] == 0
    first, second, total = res["ms"]
    assert abs(first - 250.0) <= 0.01
    assert abs(second - 5.0) <= 0.01
    assert 355.0 <= total <= 420.0  # 100 + 250 + 5 ms of kernels, plus the first launch


@pytest.mark.timing
def test_sigkill_of_a_backlogged_process_frees_the_engine(sim_env: dict[str, str]) -> None:
    hog = spawn_launch(sim_env, 100, 100_000)  # 10 s of queued kernels
    try:
        wait_line(hog, "launched=1")
        victim = spawn_launch(sim_env, 1, 200_000)
        wait_line(victim, "launched=1")
        hog.kill()  # left unwaited: a zombie, which the reaper treats as dead
        kv = finish(victim)
        # Shared with the hog until the next reaping sweep (<= 100 ms), then alone: well under
        # the 400 ms that sharing with a dead process to the end would take.
        assert 200_000 <= int(kv["gpu_us"]) <= 330_000, kv
        kv = probe(sim_env, "launch", "1", "50000")
        assert abs(int(kv["gpu_us"]) - 50_000) <= 1_000
    finally:
        hog.kill()
        hog.communicate()


def test_launch_path_is_cheap(sim_env: dict[str, str]) -> None:
    assert int(probe(sim_env, "launchbench", "20000")["ns_per_launch"]) < 50_000


# ---- cuGetProcAddress ----------------------------------------------------------------------------

PROC_CASES = [
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 13000, 0, "cuMemAlloc_v2"),
    ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
    ("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"),
    ("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"),
    ("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"),
    ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"),
    ("cuDeviceGetUuid", 11030, 0, "cuDeviceGetUuid"),
    ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
    ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
    ("cuGraphInstantiate", 12000, 0, "cuGraphInstantiate_v2"),
    ("cuGraphAddKernelNode", 11000, 0, "cuGraphAddKernelNode"),
    ("cuGraphAddKernelNode", 12000, 0, "cuGraphAddKernelNode_v2"),
    ("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"),
    ("cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"),
    ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
    ("cuLaunchKernel", 12000, 1, "cuLaunchKernel"),
    ("cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoD", 6050, 2, "cuMemcpyHtoD_v2"),  # per-thread variants start at 7000
    ("cuMemcpyDtoHAsync", 7000, 2, "cuMemcpyDtoHAsync_v2_ptsz"),
    ("cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz"),
    ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
    ("cuMemAlloc", 12000, 2, "cuMemAlloc_v2"),  # no per-thread variant: the base one
]


def _cuda() -> ctypes.CDLL:
    return ctypes.CDLL(str(SIMLIB / "libcuda.so.1"))


@pytest.mark.parametrize(("name", "version", "flags", "expected"), PROC_CASES)
def test_get_proc_address_v2(built: Path, name: str, version: int, flags: int, expected: str) -> None:
    cu = _cuda()
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = cu.cuGetProcAddress_v2(
        name.encode(), ctypes.byref(fn), version, ctypes.c_ulonglong(flags), ctypes.byref(status)
    )
    assert (rc, status.value) == (0, 0)
    assert fn.value == ctypes.cast(getattr(cu, expected), ctypes.c_void_p).value


def test_get_proc_address_failures(built: Path) -> None:
    cu = _cuda()
    fn, status = ctypes.c_void_p(1), ctypes.c_int(-1)
    rc = cu.cuGetProcAddress_v2(
        b"cuNoSuchThing", ctypes.byref(fn), 13000, ctypes.c_ulonglong(0), ctypes.byref(status)
    )
    assert (rc, status.value, fn.value) == (500, 1, None)
    rc = cu.cuGetProcAddress_v2(
        b"cuMemAlloc", ctypes.byref(fn), 1000, ctypes.c_ulonglong(0), ctypes.byref(status)
    )
    assert (rc, status.value, fn.value) == (500, 2, None)
    rc = cu.cuGetProcAddress(b"cuMemAlloc", ctypes.byref(fn), 3000, ctypes.c_ulonglong(0))
    assert rc == 0
    assert fn.value == ctypes.cast(cu.cuMemAlloc, ctypes.c_void_p).value  # the 32-bit ABI of CUDA 2.0
    rc = cu.cuGetProcAddress(b"cuMemAlloc", ctypes.byref(fn), 3020, ctypes.c_ulonglong(0))
    assert rc == 0
    assert fn.value == ctypes.cast(cu.cuMemAlloc_v2, ctypes.c_void_p).value


def test_error_names_cover_the_header(built: Path) -> None:
    header = (NATIVE / "include" / "sharegpu" / "cuda_api.h").read_text()
    cu = _cuda()
    for name, value in re.findall(r"(CUDA_(?:SUCCESS|ERROR_\w+)) = (\d+)", header):
        s = ctypes.c_char_p()
        assert cu.cuGetErrorName(int(value), ctypes.byref(s)) == 0
        assert s.value == name.encode()
        assert cu.cuGetErrorString(int(value), ctypes.byref(s)) == 0
        assert s.value
    assert cu.cuGetErrorName(12345, ctypes.byref(ctypes.c_char_p())) == 1


# ---- unmodified third-party clients ----------------------------------------------------------------


@pytest.mark.timing
def test_cuda_python_end_to_end(sim_env: dict[str, str]) -> None:
    needs("cuda.bindings")
    code = r"""
        import ctypes, json, time
        from cuda.bindings import driver as d

        def ck(res):
            err, *rest = res if isinstance(res, tuple) else (res,)
            assert err == d.CUresult.CUDA_SUCCESS, err
            return rest[0] if len(rest) == 1 else rest

        ck(d.cuInit(0))
        dev = ck(d.cuDeviceGet(0))
        out = {"count": ck(d.cuDeviceGetCount()),
               "name": ck(d.cuDeviceGetName(64, dev)).split(b"\0")[0].decode(),
               "total": ck(d.cuDeviceTotalMem(dev)),
               "uuid": bytes(ck(d.cuDeviceGetUuid(dev)).bytes).hex()}
        ctx = ck(d.cuDevicePrimaryCtxRetain(dev))
        ck(d.cuCtxSetCurrent(ctx))
        n = 1 << 20
        ptr = ck(d.cuMemAlloc(n))
        src = bytes(range(256)) * (n // 256)
        ck(d.cuMemcpyHtoD(ptr, src, n))
        dst = bytearray(n)
        ck(d.cuMemcpyDtoH(dst, ptr, n))
        out["copy"] = bytes(dst) == src
        free, total = ck(d.cuMemGetInfo())
        out["used"] = total - free
        ptx = b".version 8.0\n.target sm_90\n.address_size 64\n" \
              b".visible .entry spin(.param .u64 us)\n{\nret;\n}\n\0"
        mod = ck(d.cuModuleLoadData(ptx))
        f = ck(d.cuModuleGetFunction(mod, b"spin"))
        stream = ck(d.cuStreamCreate(0))
        e0, e1 = ck(d.cuEventCreate(0)), ck(d.cuEventCreate(0))
        t = time.monotonic()
        ck(d.cuEventRecord(e0, stream))
        ck(d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, ((20000,), (ctypes.c_uint64,)), 0))
        out["launch_gap_us"] = int((time.monotonic() - t) * 1e6)
        ck(d.cuEventRecord(e1, stream))
        ck(d.cuStreamSynchronize(stream))
        out["wall_ms"] = (time.monotonic() - t) * 1000
        out["event_ms"] = ck(d.cuEventElapsedTime(e0, e1))
        ck(d.cuMemFree(ptr))
        print(json.dumps(out))
    """
    res = run_py(sim_env, code)
    info = probe(sim_env, "info")
    assert res["count"] == 2
    assert res["name"] == "sharegpu simulated H100"
    assert res["total"] == 80 * GIB
    assert res["copy"] is True
    assert res["used"] == MIB
    assert "GPU-" + str(res["uuid"]) == info["dev0.uuid"].replace("-", "").replace("GPU", "GPU-")
    assert 18 <= float(res["wall_ms"]) <= 60
    assert_gpu_time({"gpu_us": str(round(float(res["event_ms"]) * 1000)), **res}, 20_000)


def test_pynvml_sees_devices_and_process_usage(sim_env: dict[str, str]) -> None:
    needs("pynvml")
    info = probe(sim_env, "info")
    holder = start_hold(sim_env, "plain", "300M")
    launcher = subprocess.Popen(
        [str(LIB / "sgprobe"), "-d", "1", "launch", "1", "400000"], env=sim_env, stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.2)
        code = """
            import json, pynvml as n
            n.nvmlInit()
            h = n.nvmlDeviceGetHandleByIndex(0)
            h1 = n.nvmlDeviceGetHandleByIndex(1)
            m = n.nvmlDeviceGetMemoryInfo(h)
            m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            out = {
                "count": n.nvmlDeviceGetCount(), "driver": n.nvmlSystemGetDriverVersion(),
                "cuda": n.nvmlSystemGetCudaDriverVersion(), "name": n.nvmlDeviceGetName(h),
                "uuid": [n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetUUID(h1)],
                "total": m.total, "used": m.used, "free": m.free, "v2": [m2.used, m2.reserved],
                "procs": [[p.pid, p.usedGpuMemory, p.gpuInstanceId]
                          for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
                "procs_v2": [[p.pid, p.usedGpuMemory]
                             for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)],
                "util1": n.nvmlDeviceGetUtilizationRates(h1).gpu,
                "samples1": [s.smUtil for s in n.nvmlDeviceGetProcessUtilization(h1, 0)],
                "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h1))),
            }
            n.nvmlShutdown()
            print(json.dumps(out))
        """
        res = run_py(sim_env, code)
    finally:
        stop(holder)
        launcher.wait()
    assert res["count"] == 2
    assert res["driver"] == "580.65.06"
    assert res["cuda"] == 13000
    assert res["name"] == "sharegpu simulated H100"
    assert res["uuid"] == [info["dev0.uuid"], info["dev1.uuid"]]
    assert res["total"] == 80 * GIB
    assert res["used"] == 300 * MIB
    assert res["free"] == 80 * GIB - 300 * MIB
    assert res["v2"] == [300 * MIB, 0]
    assert [holder.pid, 300 * MIB, 0xFFFFFFFF] in res["procs"]
    assert [holder.pid, 300 * MIB] in res["procs_v2"]
    assert int(res["util1"]) > 0
    assert res["samples1"]
    assert max(res["samples1"]) > 0
    assert res["by_uuid"] == 1


def test_nvml_drops_a_killed_process(sim_env: dict[str, str]) -> None:
    needs("pynvml")
    holder = start_hold(sim_env, "managed", "64M")
    code = """
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps({"used": n.nvmlDeviceGetMemoryInfo(h).used,
                          "pids": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]}))
    """
    before = run_py(sim_env, code)
    stop(holder)
    after = run_py(sim_env, code)
    assert before == {"used": 64 * MIB, "pids": [holder.pid]}
    assert after == {"used": 0, "pids": []}


@pytest.mark.parametrize("mps", [False, True])
def test_nvml_lists_mps_clients_apart_from_compute_processes(sim_env: dict[str, str], mps: bool) -> None:
    """Under an MPS server the driver lists its clients through the MPS query, not the compute
    one (which holds the server, absent here); without one the MPS list is empty."""
    needs("pynvml")
    env = {**sim_env, "SIMGPU_MPS_BLOCK_US": "500"} if mps else sim_env
    holder = start_hold(env, "plain", "32M")
    code = """
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps({
            "compute": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
            "mps": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetMPSComputeRunningProcesses(h)],
            "mps_v2": [p.pid for p in n.nvmlDeviceGetMPSComputeRunningProcesses_v2(h)],
        }))
    """
    try:
        res = run_py(env, code)
    finally:
        stop(holder)
    if mps:
        assert res == {"compute": [], "mps": [[holder.pid, 32 * MIB]], "mps_v2": [holder.pid]}
    else:
        assert res == {"compute": [holder.pid], "mps": [], "mps_v2": []}


@pytest.mark.timing
def test_nvml_utilization_while_two_processes_compete(sim_env: dict[str, str]) -> None:
    needs("pynvml")
    t = start_at()
    procs = [spawn_launch(sim_env, 1, 1_500_000, "kernel", t) for _ in range(2)]
    try:
        for p in procs:
            wait_line(p, "launched=1")
        code = f"""
            import json, time, pynvml as n
            n.nvmlInit()
            h = n.nvmlDeviceGetHandleByIndex(0)
            time.sleep(max(0.0, ({t} + 1_100_000_000 - time.monotonic_ns()) / 1e9))
            since = time.time() - (time.monotonic_ns() - {t} - 100_000_000) / 1e9
            out = {{"util": n.nvmlDeviceGetUtilizationRates(h).gpu,
                   "samples": {{str(s.pid): s.smUtil
                               for s in n.nvmlDeviceGetProcessUtilization(h, int(since * 1e6))}}}}
            print(json.dumps(out))
        """
        res = run_py(sim_env, code)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert res["util"] >= 95, res
    assert sorted(res["samples"]) == sorted(str(p.pid) for p in procs), res
    for pct in res["samples"].values():
        assert 40 <= pct <= 60, res


# ---- sanitizers --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sanitized(built: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(NATIVE), "sanitize"], check=True, capture_output=True)
    return LIB


@pytest.mark.parametrize("flavour", ["asan", "tsan"])
def test_probe_is_clean_under_sanitizers(
    sim_env: dict[str, str], tmp_path: Path, sanitized: Path, flavour: str
) -> None:
    env = {
        **small(sim_env, tmp_path),
        "LD_LIBRARY_PATH": str(LIB / flavour / "simgpu"),
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "TSAN_OPTIONS": "halt_on_error=1",
    }
    commands = [
        ["alloc", "plain", "1M", "300M"],
        ["copy", "1M"],
        ["memops"],
        ["fill", "vmm", "32M"],
        ["fill", "pool", "64M"],
        ["launch", "3", "1000", "capture"],
        ["launch", "3", "1000", "graph"],
        ["launch", "1100", "10"],  # more than a stream's pending limit: launches block
        ["launchbench", "2000"],
        ["threads", "3", "plain", "8M"],
        ["forkfree", "plain", "64M"],
    ]
    for args in commands:
        p = subprocess.run(
            [str(LIB / flavour / "sgprobe"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert p.returncode == 0, (args, p.stdout, p.stderr)
        assert "MISMATCH" not in p.stdout, (args, p.stdout)  # a probe's own check of what it read
        assert "Sanitizer" not in p.stderr, (args, p.stderr)
        assert "runtime error" not in p.stderr, (args, p.stderr)


# ---- robustness ---------------------------------------------------------------------------------------

LOCK_AND_DIE = r"""
#include "common/sim.h"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    struct sim_state *st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd < 0 || st == MAP_FAILED || pthread_mutex_lock(&st->lock) != 0) return 1;
    st->gpu[0].used += 12345; /* a half-done update the next locker must repair */
    st->gpu[0].nactive = 3;   /* and an engine whose active list is garbage */
    st->gpu[0].cur = 77;
    st->gpu[0].chan[5].n += 9;
    puts("locked");
    fflush(stdout);
    raise(SIGKILL);
    return 1;
}
"""


def test_state_lock_survives_a_holder_killed_inside(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = small(sim_env, tmp_path)
    holder = start_hold(env, "plain", "100M")  # a live slot whose bytes the repair must keep
    try:
        src, exe = tmp_path / "lockdie.c", tmp_path / "lockdie"
        src.write_text(LOCK_AND_DIE)
        subprocess.run(
            [
                "gcc",
                "-std=c11",
                "-D_GNU_SOURCE",
                f"-I{NATIVE / 'simgpu'}",
                "-o",
                str(exe),
                str(src),
                "-lpthread",
            ],
            check=True,
        )
        p = subprocess.run(
            [str(exe), env["SIMGPU_STATE"]], capture_output=True, text=True, timeout=30, check=False
        )
        assert p.returncode == -signal.SIGKILL
        assert p.stdout == "locked\n"
        kv = probe(env, "alloc", "plain", "156M", timeout=30)  # would hang on a non-robust lock
        assert kv["alloc"] == "OK"
        assert kv["free"] == "0"
        kv = probe(env, "launch", "2", "10000", timeout=30)  # the engine was rebuilt
        assert_gpu_time(kv, 20_000)
    finally:
        stop(holder)
