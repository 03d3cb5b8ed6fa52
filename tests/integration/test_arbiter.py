"""Compute isolation: the per-GPU arbiter, through real processes on the simulated GPU.

Tenants are made with compute limits (policy, priority, share, ceiling) and the GPU's arbiter
region is created with ``sharegpu.arbiter.ensure_arbiter``, as ``sharegpu run`` does; the
workloads are ``sgprobe saturate`` (back-to-back spin kernels, achieved fraction of the GPU) and
``sgprobe bursts`` (latency of periodic kernel bursts). Tolerances are meant to hold on a loaded
2-core machine; the precise accuracy goals live in bench/.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from arbiterutil import (
    achieved,
    arbiter_of,
    compute_tenant,
    finish,
    kill_while_holding,
    patch_file,
    spawn,
    spawn_in_pid_namespace,
    spawn_python,
    spin_script,
    start_at,
    stop_a_token_holder,
)
from conftest import Sim, parse_kv, python
from sharegpu.agent.cpulatency import CpuLatencyRequest
from sharegpu.arbiter import (
    ensure_arbiter,
    read_arbiter,
    tune_arbiter,
)
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant, read_limits
from timingutil import least_stolen

# ---------------------------------------------------------------------------------------------
# helpers


def usage_totals(tenant: Path) -> dict[str, int]:
    """Compute counters of every process slot of the tenant on its device 0 (slots keep their
    counters after the process exits, until the slot is claimed again)."""
    usage = abi.Usage.from_buffer_copy((tenant / abi.USAGE_FILE).read_bytes())
    keys = ("gpu_time_ns", "wait_ns", "throttled_ns", "preemptions")
    return {k: sum(getattr(p.dev[0], k) for p in usage.procs) for k in keys}


def achieved_by_script(sim: Sim, tenant: Path, script: str, *args: str) -> float:
    """Run a cuda-python `script` as a process of `tenant`; the achieved share it prints, in %."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=sim.tenant_env(tenant),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return float(parse_kv(proc.stdout)[0]["achieved"]) * 100


# ---------------------------------------------------------------------------------------------
# policies


@pytest.mark.timing
def test_two_saturating_share_tenants_split_30_70(sim: Sim) -> None:
    a = compute_tenant(sim, "a", "share", 30)
    b = compute_tenant(sim, "b", "share", 70)
    at = start_at()
    pa, pb = spawn(sim, a, "saturate", 2, 500, "kernel", at), spawn(sim, b, "saturate", 2, 500, "kernel", at)
    va, vb = finish(pa), finish(pb)
    xa, xb = achieved(va), achieved(vb)
    print(f"share 30/70: achieved {xa:.1f}% / {xb:.1f}%")
    assert abs(xa - 30) <= 5
    assert abs(xb - 70) <= 5
    status = read_arbiter(arbiter_of(sim))
    ta, tb = status.tenant("a"), status.tenant("b")
    assert ta is not None
    assert tb is not None
    assert (ta.policy, ta.share_permille, tb.share_permille) == ("share", 300, 700)
    held = ta.gpu_time_ns / (ta.gpu_time_ns + tb.gpu_time_ns) * 100
    assert abs(held - 30) <= 5  # the arbiter's own accounting agrees
    assert status.handovers > 10
    assert status.holder_pid is None
    for tenant in (a, b):
        counters = usage_totals(tenant)
        assert counters["gpu_time_ns"] > 200_000_000
        assert counters["wait_ns"] > 100_000_000  # each waited while the other held the card
        assert counters["throttled_ns"] == 0
        assert counters["preemptions"] == 0


@pytest.mark.timing
@pytest.mark.parametrize(
    ("kernels", "us", "seconds"),
    [
        pytest.param(4, 100, 2.0, id="short-kernels"),
        pytest.param(4, 1000, 2.0, id="bursts-of-4-ms"),
        pytest.param(16, 5000, 4.0, id="bursts-longer-than-a-quantum"),
    ],
)
def test_tenants_that_synchronise_split_30_70(sim: Sim, kernels: int, us: int, seconds: float) -> None:
    """Programs that launch a burst and wait for it (cuCtxSynchronize) get their shares of what
    the card ran for them, at both ends of the kernel length. With the token handed on before the
    drain, the GPU time-sliced the two contexts during it and whoever took over mid-burst got
    those slices free: 4 x 1 ms bursts split 36/64, and bursts longer than a quantum 50/50."""
    a = compute_tenant(sim, "a", "share", 30)
    b = compute_tenant(sim, "b", "share", 70)
    at = start_at()
    args = ("syncloop", seconds, kernels, us, 20, at)
    pa, pb = spawn(sim, a, *args), spawn(sim, b, *args)
    xa, xb = achieved(finish(pa)), achieved(finish(pb))
    split = xa / (xa + xb) * 100
    print(
        f"{kernels} x {us} µs then a sync, share 30/70: {xa:.1f}% / {xb:.1f}% "
        f"(split {split:.1f}/{100 - split:.1f})"
    )
    assert abs(split - 30) <= 3
    assert xa + xb >= 75  # each keeps the card busy through its own short waits
    status = read_arbiter(arbiter_of(sim))
    ta, tb = status.tenant("a"), status.tenant("b")
    assert ta is not None
    assert tb is not None
    charged = ta.gpu_time_ns / (ta.gpu_time_ns + tb.gpu_time_ns) * 100
    assert abs(charged - split) <= 3  # the arbiter charged what the card ran for each


@pytest.mark.timing
def test_short_bursts_at_an_uneven_split_keep_the_card_busy(sim: Sim) -> None:
    """Bursts of one 100 µs kernel and 20 µs of host time at 30/70: the 70% tenant must follow its
    own turn four times in ten and keeps the card at each of those syncs.  Its watcher is not
    woken at each of them (a futex wake that a VM pays for inside the tenant's own gap): 81% of
    the card against 91% without sharegpu when it was, 85-87% since, the most turns reach at
    these costs (docs/design/arbitration.md, "Turns").  Both runs hold the CPUs out of deep idle
    (a PM QoS request, as `sharegpu agent --cpu-wakeup-latency-us 0` does): what this measures
    is the arbiter's turns, and a VM whose halted vCPUs wake slowly took 10 points from them
    (80-81% on 2026-12-06, the run without sharegpu unchanged; 83.5-84.3% against 90.6-90.8%
    with the request, the same hour, and 82.1% against 90.8% inside the whole suite on CI's
    machine).  The build that woke the watcher at each burst lost about 4 points more."""
    with CpuLatencyRequest(0):
        args = ("syncloop", 3, 1, 100, 20)
        at = start_at()
        bare = [achieved(finish(p)) for p in [spawn(sim, None, *args, at) for _ in range(2)]]
        a = compute_tenant(sim, "a", "share", 30)
        b = compute_tenant(sim, "b", "share", 70)
        runs = []
        for _ in range(2):  # the better of two: a VM's noisy second takes a few points from one run
            at = start_at()
            pa, pb = spawn(sim, a, *args, at), spawn(sim, b, *args, at)
            xa, xb = achieved(finish(pa)), achieved(finish(pb))
            print(f"1 x 100 µs bursts, 30/70: {xa:.1f}% + {xb:.1f}% = {xa + xb:.1f}%; bare {sum(bare):.1f}%")
            assert abs(xa / (xa + xb) * 100 - 30) <= 3
            runs.append(xa + xb)
        assert max(runs) >= sum(bare) - 10


def loaned_run(sim: Sim, a_args: tuple[object, ...], b_args: tuple[object, ...]) -> tuple[float, float, int]:
    """Share tenants a (30%) and b (70%) running `sgprobe syncloop` with their arguments, started
    together: what each achieved, in %, and the loans the arbiter made meanwhile.  Checks that
    what the arbiter charged each is what the card ran for it."""
    a = compute_tenant(sim, "a", "share", 30)
    b = compute_tenant(sim, "b", "share", 70)
    path = arbiter_of(sim)
    before = read_arbiter(path).loans
    at = start_at()
    pa, pb = spawn(sim, a, "syncloop", *a_args, at), spawn(sim, b, "syncloop", *b_args, at)
    xa, xb = achieved(finish(pa)), achieved(finish(pb))
    status = read_arbiter(path)
    ta, tb = status.tenant("a"), status.tenant("b")
    assert ta is not None
    assert tb is not None
    charged = ta.gpu_time_ns / (ta.gpu_time_ns + tb.gpu_time_ns) * 100
    assert abs(charged - xa / (xa + xb) * 100) <= 3  # each paid for what the card ran for it
    return xa, xb, status.loans - before


@pytest.mark.timing
def test_a_holder_lends_its_host_gap_to_a_waiter_of_its_class(sim: Sim) -> None:
    """Bursts of 4 x 500 µs with 200 µs of host time between them at 30/70: the 70% tenant
    follows its own turn and keeps the card by virtual time, where it used to leave it idle
    through its 200 µs (95% of the card against 99.5% without sharegpu, all an arbiter of whole
    turns can reach).  It lends the card to the 30% tenant for the gap, one kernel at a time, and
    takes it back when it launches again: 97-98% on this VM with the CPUs polling (measured on
    2026-12-06; docs/design/arbitration.md, "Loans").  The loans are counted, the split holds and
    each tenant paid for what it ran.  The CPUs are held out of deep idle, as in the uneven-split
    test above: a loan is two hand-overs, and the card is judged on the arbiter, not the host."""
    with CpuLatencyRequest(0):
        xa, xb, loans = loaned_run(sim, (3, 4, 500, 200), (3, 4, 500, 200))
    print(f"4 x 500 µs + 200 µs, 30/70: {xa:.1f}% + {xb:.1f}% = {xa + xb:.1f}%; {loans} loans")
    assert loans >= 100  # ~200 a second measured
    assert abs(xa / (xa + xb) * 100 - 30) <= 3
    assert xa + xb >= 85


@pytest.mark.timing
def test_loans_do_not_give_a_waiter_of_long_kernels_more_than_its_share(sim: Sim) -> None:
    """The 30% tenant's kernels (5 ms) outlast the 70% tenant's bursts (4 x 500 µs, 200 µs of
    host time): lent the card at each of the 70% tenant's gaps, it would run 5 ms for every 2 ms
    of the other's.  Loans stop while it is a quarter quantum of its GPU time ahead in virtual
    time (sg_arb_may_lend_locked), so the split stays 30/70."""
    xa, xb, loans = loaned_run(sim, (3, 1, 5000, 20), (3, 4, 500, 200))
    split = xa / (xa + xb) * 100
    print(
        f"1 x 5 ms beside 4 x 500 µs + 200 µs, 30/70: {xa:.1f}% / {xb:.1f}% "
        f"(split {split:.1f}); {loans} loans"
    )
    assert abs(split - 30) <= 3


@pytest.mark.timing
def test_a_loop_that_pauses_hands_the_card_to_its_own_class_within_a_poll(sim: Sim) -> None:
    """A loop of short bursts keeps the card at its syncs without waking its watcher each time
    (the watcher polls every quantum/10 while one of its class waits): when the loop pauses
    holding the card, the waiter still gets it within the loop's grace and one poll (about
    1 ms), not after half a quantum of idleness (5 ms) or at the quantum's end."""
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    code = spin_script(
        200,
        """
        for cycle in range(12):
            for burst in range(60):
                err, = d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), 0)
                assert err == d.CUresult.CUDA_SUCCESS, err
                d.cuCtxSynchronize()
                until = time.monotonic_ns() + 20_000
                while time.monotonic_ns() < until:
                    pass
            print("paused=%d" % time.monotonic_ns(), flush=True)
            time.sleep(0.03)
        """,
    )
    waiter = spawn(sim, a, "saturate", 20, 500, "kernel")
    loop = spawn_python(sim, b, code)
    region = arbiter_of(sim)
    delays_ms = []
    assert loop.stdout is not None
    for line in loop.stdout:
        paused = int(line.split("=", 1)[1])
        if read_arbiter(region).holder_pid != loop.pid:
            continue  # it paused after handing the card on at its sync
        while read_arbiter(region).holder_pid == loop.pid and time.monotonic_ns() - paused < 25_000_000:
            time.sleep(0.0001)
        delays_ms.append((time.monotonic_ns() - paused) / 1e6)
    _, err = loop.communicate(timeout=60)
    assert loop.returncode == 0, err
    waiter.kill()
    waiter.communicate(timeout=30)
    print("pauses holding the card, ms until the waiter got it: " + " ".join(f"{d:.2f}" for d in delays_ms))
    assert len(delays_ms) >= 2  # the loop held the card at some of its 12 pauses
    assert sorted(delays_ms)[len(delays_ms) // 2] < 3  # grace + one poll, not 5-10 ms


@pytest.mark.timing
@pytest.mark.parametrize(
    ("kernels", "us", "gap_us"),
    [
        pytest.param(1, 100, 20, id="100us-bursts"),
        pytest.param(4, 1000, 1000, id="4ms-bursts-1ms-host-time"),
    ],
)
def test_a_cap_is_gpu_time_not_time_held(sim: Sim, kernels: int, us: int, gap_us: int) -> None:
    """A capped tenant is charged the GPU time its work used: neither the idle time between a
    sync that drained its work and its next launch, nor the lateness of the sync's return (the
    burst clock reads the end from the GPU). Charged the time held, a 50% cap of 100 µs bursts
    got 43% of the card."""
    c = compute_tenant(sim, "c", "cap", 50)
    x = achieved(finish(spawn(sim, c, "syncloop", 2, kernels, us, gap_us)))
    print(f"cap 50% alone, {kernels} x {us} µs then a sync and {gap_us} µs of host time: {x:.1f}%")
    assert 46 <= x <= 54


@pytest.mark.timing
def test_a_service_that_idles_between_requests_leaves_the_card_to_its_own_class(sim: Sim) -> None:
    """A service of short bursts and 5 ms of idle time between them, beside a job of its own
    class that never waits: after a sync that drained its work the service hands the card on
    once it stays idle a short grace (at once once it is known to idle that long), rather than
    at the end of its quantum once idle for half of one."""
    service = compute_tenant(sim, "svc", "share", 50)
    job = compute_tenant(sim, "job", "share", 50)
    at = start_at()
    ps = spawn(sim, service, "syncloop", 2, 4, 200, 5000, at)
    pj = spawn(sim, job, "saturate", 2, 500, "kernel", at)
    xs, xj = achieved(finish(ps)), achieved(finish(pj))
    print(f"service {xs:.1f}%, job {xj:.1f}% of the card")
    assert xs >= 5  # about 9% (11.7% without sharegpu: the job's queue drains before each request)
    assert xs + xj >= 85  # the job fills the service's idle time


@pytest.mark.timing
def test_an_online_service_of_one_burst_requests_hands_the_card_to_offline_at_once(sim: Sim) -> None:
    """An online service whose every request is one burst and whose next request is predicted
    hands the card to the offline job when its request drains, not after the idle grace
    (quantum/20; docs/design/arbitration.md "Turns"). So a longer grace costs the offline job
    nothing: with a 40 ms quantum the grace is 2 ms, which after each of the service's ~170
    requests a second would leave the card idle a third of the time."""
    service = compute_tenant(sim, "svc", "share", 50, priority="online")
    job = compute_tenant(sim, "job", "share", 50, priority="offline")
    path = arbiter_of(sim)

    def run() -> tuple[float, float]:
        at = start_at()
        ps = spawn(sim, service, "syncloop", 2.5, 4, 200, 5000, at)
        pj = spawn(sim, job, "saturate", 2.5, 500, "kernel", at)
        return achieved(finish(ps)), achieved(finish(pj))

    short = least_stolen(run)
    tune_arbiter(path, quantum_ns=40_000_000)
    long = least_stolen(run)
    print(
        f"service/job % of the card: grace 0.5 ms {short[0]:.1f}/{short[1]:.1f}, "
        f"grace 2 ms {long[0]:.1f}/{long[1]:.1f}"
    )
    assert short[0] >= 10  # the service gets all it asks (~13.5%)
    assert long[0] >= 10
    assert long[1] >= short[1] - 4  # handed on at once: the grace's length is not paid


@pytest.mark.timing
def test_cap_alone_on_an_idle_card_stays_under_its_ceiling(sim: Sim) -> None:
    c = compute_tenant(sim, "c", "cap", 20)
    x = achieved(finish(spawn(sim, c, "saturate", 1.5, 500)))
    print(f"cap 20% alone: {x:.1f}%")
    assert 15 <= x <= 25
    counters = usage_totals(c)
    assert counters["throttled_ns"] > 800_000_000  # held back by the ceiling most of the time
    t = read_arbiter(arbiter_of(sim)).tenant("c")
    assert t is not None
    assert t.throttled_ns == counters["throttled_ns"]


MANY_CONTEXTS = """
    import ctypes, time
    from cuda.bindings import driver as cu
    PTX = b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
    PTX += b".visible .entry spin(.param .u64 us)\\n{\\n ret;\\n}\\n"
    assert cu.cuInit(0)[0] == 0
    arg = ctypes.c_uint64(1000)  # 1 ms kernels
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    places = []
    for _ in range(12):
        ctx = cu.cuCtxCreate(None, 0, 0)[1]
        fn = cu.cuModuleGetFunction(cu.cuModuleLoadData(PTX)[1], b"spin")[1]
        places.append((ctx, fn, cu.cuStreamCreate(0)[1]))
    t0 = time.monotonic()
    kernels = 0
    while time.monotonic() < t0 + 2:
        for ctx, fn, stream in places:  # one kernel in each context, then wait for them all
            cu.cuCtxSetCurrent(ctx)
            assert cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, ctypes.addressof(params), 0)[0] == 0
            kernels += 1
        for ctx, _, stream in places:
            cu.cuCtxSetCurrent(ctx)
            cu.cuStreamSynchronize(stream)
    print("achieved=%.4f" % (kernels * 1e-3 / (time.monotonic() - t0)))
"""


@pytest.mark.timing
def test_a_cap_holds_for_work_on_many_contexts(sim: Sim) -> None:
    """Issue 34: a release drained the first 8 contexts a hold launched to; the work of a ninth
    kept running after the token moved on, uncharged, so a 20% cap launching on 12 contexts got
    more. Every context of the hold is drained now."""
    c = compute_tenant(sim, "c", "cap", 20)
    values, proc = python(sim.tenant_env(c), MANY_CONTEXTS)
    assert proc.returncode == 0, proc.stderr
    x = float(values["achieved"]) * 100
    print(f"cap 20%, 1 ms kernels on 12 contexts: {x:.1f}%")
    assert x <= 25


@pytest.mark.timing
def test_a_high_cap_alone_reaches_its_ceiling(sim: Sim) -> None:
    # Credit earned while holding the card used to be capped before the hold was charged, so a
    # 90% cap alone got about 67%.
    c = compute_tenant(sim, "c", "cap", 90)
    x = achieved(finish(spawn(sim, c, "saturate", 1.5, 500)))
    print(f"cap 90% alone: {x:.1f}%")
    assert 84 <= x <= 92


@pytest.mark.timing
def test_burst_alone_reaches_its_ceiling(sim: Sim) -> None:
    b = compute_tenant(sim, "b", "burst", 20, ceiling=60)
    x = achieved(finish(spawn(sim, b, "saturate", 1.5, 500)))
    print(f"burst 20% ceiling 60% alone: {x:.1f}%")
    assert abs(x - 60) <= 8


@pytest.mark.timing
def test_share_alone_gets_nearly_the_whole_card(sim: Sim) -> None:
    s = compute_tenant(sim, "s", "share", 10)
    x = achieved(finish(spawn(sim, s, "saturate", 1, 500)))
    print(f"share 10% alone: {x:.1f}%")
    assert x >= 85


@pytest.mark.timing
def test_the_watcher_starts_beside_libraries_with_large_thread_local_storage(
    sim: Sim, tmp_path: Path
) -> None:
    # glibc takes the static TLS of the libraries loaded at start from every thread's stack: with
    # more than the watcher's 64 KiB the shim must still start it (at the default size), or an
    # idle holder keeps the token. The probe's stderr stays empty only if the watcher started.
    source = tmp_path / "bigtls.c"
    source.write_text("__thread char big_tls[256 * 1024];\nchar *big_tls_at(void) { return big_tls; }\n")
    lib = tmp_path / "libbigtls.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    s = compute_tenant(sim, "s", "share", 50)
    env = sim.tenant_env(s)
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}"
    x = achieved(finish(sim.spawn_probe("saturate", "0.5", "500", env=env)))
    assert x >= 85


@pytest.mark.timing
@pytest.mark.parametrize("mode", [pytest.param("graph", id="graph"), pytest.param("capture", id="capture")])
def test_graphs_and_stream_capture_are_held_to_the_cap(sim: Sim, mode: str) -> None:
    c = compute_tenant(sim, "c", "cap", 20)
    values = finish(spawn(sim, c, "saturate", 1.5, 500, mode))
    assert values["mode"] == mode
    x = achieved(values)
    print(f"cap 20% through {mode}: {x:.1f}%")
    assert 15 <= x <= 25
    # Without the shim the same graphs take the whole card: the cap is the arbiter's doing.
    assert achieved(finish(spawn(sim, None, "saturate", 0.5, 500, mode))) >= 85


@pytest.mark.timing
def test_cap_share_and_offline_together(sim: Sim) -> None:
    cap = compute_tenant(sim, "cap", "cap", 20)
    share = compute_tenant(sim, "share", "share", 50)
    off = compute_tenant(sim, "off", "share", 100, priority="offline")
    at = start_at()
    procs = [spawn(sim, t, "saturate", 2, 500, "kernel", at) for t in (cap, share, off)]
    xc, xs, xo = (achieved(finish(p)) for p in procs)
    print(f"cap 20% + share + offline: {xc:.1f}% / {xs:.1f}% / {xo:.1f}%")
    assert xc <= 25  # the ceiling holds under contention
    assert xs >= 65  # share takes what the cap leaves (work-conserving)
    assert xo <= 5  # offline gets only what the others leave: nearly nothing here
    # Without the share tenant, offline soaks up what the capped tenant leaves.
    at = start_at()
    procs = [spawn(sim, t, "saturate", 1.5, 500, "kernel", at) for t in (cap, off)]
    xc, xo = (achieved(finish(p)) for p in procs)
    print(f"cap 20% + offline: {xc:.1f}% / {xo:.1f}%")
    assert xc <= 25
    assert xo >= 60


def resize_compute(tenant: Path, **fields: int) -> None:
    """Change device 0's compute limits in place, as the agent resizes (the limits seqlock)."""
    path = tenant / abi.LIMITS_FILE
    path.chmod(0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Limits)) as view:
            lim = abi.Limits.from_buffer(view)
            gen = lim.generation
            lim.generation = gen + 1
            for name, value in fields.items():
                setattr(lim.devices[0], name, value)
            lim.generation = gen + 2
            del lim
    finally:
        os.close(fd)


@pytest.mark.timing
def test_a_live_resize_of_the_compute_limits_is_followed(sim: Sim) -> None:
    t = compute_tenant(sim, "t", "share", 100)
    proc = spawn(sim, t, "saturate", 3, 500)
    time.sleep(1.0)
    resize_compute(t, policy=abi.POLICY_CAP, share_permille=200, ceiling_permille=200)
    x = achieved(finish(proc))
    print(f"share 100% for ~1 s, then cap 20% for ~2 s: {x:.1f}% (about 47% expected)")
    assert 30 <= x <= 65
    entry = read_arbiter(arbiter_of(sim)).tenant("t")
    assert entry is not None
    assert (entry.policy, entry.ceiling_permille) == ("cap", 200)
    assert entry.throttled_ns > 500_000_000


# ---------------------------------------------------------------------------------------------
# online / offline


def _online_p90(
    sim: Sim, online: Path | None, offline: Path | None, n_offline: int
) -> tuple[int, list[float]]:
    """The 90th percentile of 80 bursts: the p99 of 80 is their second-worst, which two host
    stalls on a loaded 2-core machine decide (bench/isolation.py measures p99 with more)."""
    at = start_at(0.5)
    offs = [spawn(sim, offline, "saturate", 3.5, 200, "kernel", at - 300_000_000) for _ in range(n_offline)]
    lat = sorted(_latencies(spawn(sim, online, "bursts", 80, 30, 4, 1000, at)))
    off = [achieved(finish(p)) for p in offs]
    return lat[int(0.9 * (len(lat) - 1))], off


def _latencies(probe: subprocess.Popen[str]) -> list[int]:
    """The `lat_us=` lines of a bursts probe, in order."""
    out, err = probe.communicate(timeout=60)
    assert probe.returncode == 0, err
    return [int(value) for key, value in parse_kv(out)[1] if key == "lat_us"]


@pytest.mark.timing
def test_online_preempts_offline(sim: Sim) -> None:
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    # The yield path itself: with prediction on, offline clients mostly step aside before a
    # request comes (test_offline_holds_back_before_predicted_online_requests).
    path = arbiter_of(sim)
    tune_arbiter(path, holdback_max_ns=0)

    def preemptions() -> int:
        t = read_arbiter(path).tenant("train")
        return t.preemptions if t is not None else 0

    def shared_run() -> tuple[int, list[float], int, int]:
        """p90, offline shares, the preemptions the arbiter counted and those the offline
        processes' usage slots did (each run's three processes take the same three slots)."""
        before = preemptions()
        p90, off = _online_p90(sim, online, offline, 3)
        return p90, off, preemptions() - before, usage_totals(offline)["preemptions"]

    alone, _ = least_stolen(lambda: _online_p90(sim, online, None, 0))
    shared, off, counted, in_slots = least_stolen(shared_run)
    bare, _ = least_stolen(lambda: _online_p90(sim, None, None, 3))
    print(f"online burst p90: alone {alone} us, with offline under sharegpu {shared} us, without {bare} us")
    print(f"offline throughput under sharegpu: {sum(off):.1f}% of the card")
    assert shared <= 1.5 * alone
    assert bare > 1.5 * shared  # what the arbiter buys: the simulated GPU time-slices contexts
    assert sum(off) >= 40  # offline still uses the time online leaves
    assert counted >= 20
    assert in_slots == counted


def _late_bursts(
    sim: Sim,
    online: Path,
    offline_env: dict[str, str],
    arrivals: str,
    kernel_us: int = 1000,
    *,
    host_us: int | None = None,
    requests: int = 60,
) -> float:
    """Online requests (`requests` of 2 x 1 ms kernels, every 25 ms or at random around it) next to a process
    of `offline_env` saturating with kernels of `kernel_us` (or, with `host_us`, launching one,
    syncing and spending that long on the host, over and over): the fraction of requests delayed
    by more than 0.4 ms over the quickest."""
    at = start_at(0.5)
    begin = str(at - 300_000_000)
    seconds = f"{requests * 0.025 + 1.1:.1f}"  # the requests' window, and a margin around it
    if host_us is None:
        off = sim.spawn_probe("saturate", seconds, str(kernel_us), "kernel", begin, env=offline_env)
    else:
        off = sim.spawn_probe("syncloop", seconds, "1", str(kernel_us), str(host_us), begin, env=offline_env)
    lat = _latencies(spawn(sim, online, arrivals, requests, 25, 2, 1000, at))
    finish(off)
    quickest = min(lat)
    return sum(1 for x in lat if x > quickest + 400) / len(lat)


@pytest.mark.timing
def test_offline_holds_back_before_predicted_online_requests(sim: Sim) -> None:
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    path = arbiter_of(sim)
    late = _late_bursts(sim, online, sim.tenant_env(offline), "bursts")
    status = read_arbiter(path)
    print(f"periodic: {late:.0%} late, period {status.online_period_ns} ns, holdbacks {status.holdbacks}")
    assert abs(status.online_period_ns - 25_000_000) < 2_500_000  # the period was learned
    assert status.holdbacks >= 30  # about one per request once learned
    tune_arbiter(path, holdback_max_ns=0)  # prediction off: the in-flight bound alone
    late_off = _late_bursts(sim, online, sim.tenant_env(offline), "bursts")
    print(f"periodic without prediction: {late_off:.0%} late")
    assert read_arbiter(path).holdbacks == status.holdbacks
    assert late < late_off / 2
    tune_arbiter(path, holdback_max_ns=abi.ARB_DEFAULT_HOLDBACK_MAX_NS)
    # Nothing regular to predict: few (wrong) hold-backs.  Each run draws its own random pattern
    # (12-20 per 60 requests is usual, 29 was seen once), so the count is taken over 120
    # requests and judged against the periodic rate: under half of it, per request.
    _late_bursts(sim, online, sim.tenant_env(offline), "poisson", requests=120)
    random_holds = read_arbiter(path).holdbacks - status.holdbacks
    print(f"random arrivals: {random_holds} holdbacks for 120 requests")
    assert random_holds / 120 < status.holdbacks / 60 / 2


@pytest.mark.timing
def test_an_offline_launch_after_host_time_is_held_back_at_the_launch(sim: Sim) -> None:
    """An offline step of one 2 ms kernel, a sync and 3 ms of host code: at its sync the next
    request can be 5 ms away, far enough for a kernel started then, but the kernel starts 3 ms
    later, into the request.  The launch itself is checked against the prediction (launch_by)."""
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    path = arbiter_of(sim)

    def run() -> tuple[float, int, int]:
        before = read_arbiter(path)
        late = _late_bursts(sim, online, sim.tenant_env(offline), "bursts", kernel_us=2000, host_us=3000)
        after = read_arbiter(path)
        return late, after.early_preemptions - before.early_preemptions, after.holdbacks - before.holdbacks

    late, early, holdbacks = least_stolen(run)
    print(
        f"2 ms offline steps with 3 ms of host time: {late:.0%} late, {early} early preemptions, "
        f"{holdbacks} hold-backs"
    )
    assert holdbacks >= 30
    assert early <= 10  # the first requests, before the beat is learned
    assert late <= 0.2


@pytest.mark.timing
def test_hold_back_covers_offline_kernels_up_to_half_the_period(sim: Sim) -> None:
    # 8 ms offline kernels against a 25 ms beat: more than a quarter of the period, which got no
    # hold-back before (every request then waited for the GPU's time slice).
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    path = arbiter_of(sim)
    late = _late_bursts(sim, online, sim.tenant_env(offline), "bursts", kernel_us=8000)
    holds = read_arbiter(path).holdbacks
    tune_arbiter(path, holdback_max_ns=0)
    late_off = _late_bursts(sim, online, sim.tenant_env(offline), "bursts", kernel_us=8000)
    print(f"8 ms offline kernels: {late:.0%} late with {holds} holdbacks, {late_off:.0%} without prediction")
    assert holds >= 30
    assert late < late_off / 2


# ---------------------------------------------------------------------------------------------
# robustness


@pytest.mark.timing
def test_under_mps_an_offline_tenant_is_a_below_normal_client_whatever_it_sets(sim_factory) -> None:  # type: ignore[no-untyped-def]
    """With an MPS server (the simulated GPU's, 200 µs blocks) the shim makes an offline tenant's
    processes BELOW_NORMAL clients, even one that asks for NORMAL: an online request arriving at
    random next to its 8 ms kernels waits for one block, not for their end or a time slice. A
    process without the shim, of normal priority, takes slices from the same requests."""
    sim = sim_factory(extra_env={"SIMGPU_MPS_BLOCK_US": "200"})
    online = compute_tenant(sim, "web", "share", 50, priority="online")
    offline = compute_tenant(sim, "train", "share", 50, priority="offline")
    tune_arbiter(arbiter_of(sim), holdback_max_ns=0)  # no prediction: these come at random
    late = least_stolen(
        lambda: _late_bursts(
            sim, online, sim.tenant_env(offline, CUDA_MPS_CLIENT_PRIORITY="0"), "poisson", 8000
        )
    )
    plain = least_stolen(
        lambda: _late_bursts(sim, online, sim.env(CUDA_MPS_CLIENT_PRIORITY="0"), "poisson", 8000)
    )
    print(f"under MPS, next to 8 ms kernels: {late:.0%} late with the shim's priority, {plain:.0%} without")
    assert late <= 0.2
    assert plain >= 0.5


@pytest.mark.timing
def test_sigkill_of_the_token_holder(sim: Sim) -> None:
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    at = start_at()
    victim = spawn(sim, a, "saturate", 10, 500, "kernel", at)
    survivor = spawn(sim, b, "saturate", 2.5, 500, "kernel", at)
    path = arbiter_of(sim)
    time.sleep(1.0)
    kill_while_holding(path, victim.pid, victim.pid, "the victim")
    victim.communicate(timeout=10)
    values = finish(survivor)
    gap = int(values["max_gap_us"])
    print(f"longest stall of the survivor: {gap} us")
    assert gap < 1_000_000
    status = read_arbiter(path)
    assert status.reclaims >= 1
    assert all(c.pid != victim.pid for c in status.clients)


KILL_IN_LOCK = """
import ctypes, mmap, os, signal, sys
from sharegpu.regions import abi
fd = os.open(sys.argv[1], os.O_RDWR)
view = mmap.mmap(fd, ctypes.sizeof(abi.Arbiter))
region = abi.Arbiter.from_buffer(view)
libc = ctypes.CDLL("libc.so.6")
assert libc.pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(region) + abi.Arbiter.lock.offset)) == 0
region.waiting = 77  # half-way through an update: an invariant broken
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timing
def test_death_inside_the_critical_section_is_repaired(sim: Sim) -> None:
    a = compute_tenant(sim, "a", "share", 50)
    path = arbiter_of(sim)
    proc = spawn(sim, a, "saturate", 1.5, 500)
    time.sleep(0.4)
    killer = subprocess.run([sys.executable, "-c", KILL_IN_LOCK, str(path)], check=False, timeout=30)
    assert killer.returncode == -signal.SIGKILL
    values = finish(proc)
    assert int(values["max_gap_us"]) < 1_000_000
    assert achieved(values) >= 60
    status = read_arbiter(path)
    assert status.recoveries >= 1
    assert status.waiting == 0  # recomputed from the client entries


@pytest.mark.timing
def test_regions_of_other_minor_versions_are_used(sim: Sim) -> None:
    """Within one major version, fields are only appended: a shim and an agent of 1.2 work with
    an arbiter written by 1.1 (prediction fields zero: prediction off) and with limits and
    usage regions from a newer 1.x."""
    a = compute_tenant(sim, "a", "cap", 50)
    path = arbiter_of(sim)
    minor_at = abi.RegionHeader.abi_minor.offset
    patch_file(path, minor_at, (1).to_bytes(2, "little"))
    patch_file(path, abi.Arbiter.holdback_max_ns.offset, bytes(8))
    for name in (abi.LIMITS_FILE, abi.USAGE_FILE):
        region = a / name
        region.chmod(0o644)
        patch_file(region, minor_at, (9).to_bytes(2, "little"))
    x = achieved(finish(spawn(sim, a, "saturate", 1.0, 500)))
    assert 40 <= x <= 55  # still held to its cap
    status = read_arbiter(path)
    assert (status.holdback_max_ns, status.holdbacks) == (0, 0)
    assert status.tenant("a") is not None
    assert read_limits(a).hdr.abi_minor == 9


def test_a_forked_child_asks_for_its_own_token(sim: Sim) -> None:
    a = compute_tenant(sim, "a", "share", 50)
    proc = spawn(sim, a, "forklaunch", 100, 0.5)
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    while "child_launch" not in seen:
        line = proc.stdout.readline()
        assert line, "the probe ended early"
        if "=" in line:
            k, v = line.strip().split("=", 1)
            seen[k] = v
    assert seen["child_launch"] == "OK"
    status = read_arbiter(arbiter_of(sim))
    pids = {c.pid for c in status.clients}
    assert {int(seen["parent_pid"]), int(seen["child_pid"])} <= pids  # two clients, not one
    values = finish(proc)
    assert values["child_status"] == "0"
    assert values["parent_launch"] == "OK"


BROKEN_REGIONS = [
    pytest.param(lambda p: p.unlink(), "cannot open the GPU arbiter", id="missing"),
    pytest.param(lambda p: patch_file(p, 0, b"XXXX"), "bad magic", id="magic"),
    pytest.param(lambda p: patch_file(p, 4, (2).to_bytes(2, "little") + bytes(2)), "ABI 2.0", id="abi-major"),
    pytest.param(lambda p: os.truncate(p, 4096), "not a GPU arbiter region", id="short"),
    pytest.param(
        lambda p: patch_file(p, abi.Arbiter.quantum_ns.offset, (1).to_bytes(8, "little")),
        "quantum",
        id="quantum",
    ),
    pytest.param(lambda p: patch_file(p, abi.Arbiter.lock.offset, bytes(64)), "robust", id="mutex"),
]


@pytest.mark.parametrize(("breakage", "message"), BROKEN_REGIONS)
def test_a_broken_arbiter_fails_closed_with_one_line(sim: Sim, breakage, message) -> None:  # type: ignore[no-untyped-def]
    a = compute_tenant(sim, "a", "share", 50)
    breakage(arbiter_of(sim))
    res = sim.probe("launch", "1", "10", env=sim.tenant_env(a), check=False)
    assert res.returncode == 1
    assert res["error"] == "CUDA_ERROR_NOT_PERMITTED"
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sharegpu: ")
    assert message in lines[0], lines[0]
    assert "fail closed" in lines[0]


def test_native_tenants_never_touch_the_arbiter(sim: Sim) -> None:
    n = compute_tenant(sim, "n", "native", arbiter=False)  # no region at all: not needed
    values = sim.probe("launch", "20", "100", env=sim.tenant_env(n))
    assert values.int("kernels") == 20
    assert not (sim.runtime / "gpus").exists() or not any((sim.runtime / "gpus").iterdir())


@pytest.mark.timing
def test_launch_fast_path_cost(sim: Sim) -> None:
    """Sanity bound only; the goal (< 100 ns added) is measured by bench/."""
    s = compute_tenant(sim, "s", "share", 50)

    def best(tenant: Path | None) -> int:
        env = sim.tenant_env(tenant) if tenant else sim.env()
        return min(sim.probe("launchbench", "100000", env=env).int("ns_per_launch") for _ in range(3))

    bare, shim = best(None), best(s)
    print(f"launch with the token held: {bare} ns bare, {shim} ns with the arbiter (+{shim - bare} ns)")
    assert shim - bare < 2000


@pytest.mark.timing
def test_launch_hooks_reach_cuda_python(sim: Sim) -> None:
    """cuda-python resolves cuLaunchKernel through cuGetProcAddress: it must get the gate."""
    c = compute_tenant(sim, "c", "cap", 20)
    code = spin_script(
        1000,
        """
        t0 = time.monotonic(); n = 0
        while time.monotonic() - t0 < 1.0:
            err, = d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), 0)
            assert err == d.CUresult.CUDA_SUCCESS, err
            d.cuCtxSynchronize(); n += 1
        print("achieved=%.4f" % (n * 1e-3 / (time.monotonic() - t0)))
        """,
    )
    x = achieved_by_script(sim, c, code)
    print(f"cap 20% through cuda-python: {x:.1f}%")
    assert x <= 25


def test_probe_help_lists_the_compute_commands(sim: Sim) -> None:
    out = sim.probe("help").stdout
    for name in ("saturate", "bursts", "forklaunch"):
        assert f"  {name}" in out


@pytest.mark.timing
def test_a_tenant_recreated_under_the_same_name_inherits_nothing(sim: Sim) -> None:
    """The arbiter keys tenants by name and incarnation: a new tenant of an old name gets its own
    limits, and none of the old one's GPU time, virtual time or ceiling debt, so next to a
    newcomer it gets its fair half (the review saw 13.9% / 87.8% when the entry was inherited)."""
    from sharegpu.tenant import remove_tenant

    old = compute_tenant(sim, "reused", "share", 50)
    assert achieved(finish(spawn(sim, old, "saturate", 1.5, 500))) > 80  # alone: virtual time grows
    old_incarnation = read_limits(old).incarnation
    remove_tenant(old)
    new = compute_tenant(sim, "reused", "share", 50)
    other = compute_tenant(sim, "other", "share", 50)
    # The newcomer runs first: a re-created tenant that kept the old virtual time would wait
    # until the newcomer caught up with it (about 1.4 s of the card).
    po = spawn(sim, other, "saturate", 2.5, 500)
    time.sleep(0.5)
    xn, xo = achieved(finish(spawn(sim, new, "saturate", 1.2, 500))), achieved(finish(po))
    print(f"re-created tenant next to a newcomer: {xn:.1f}% (and the newcomer {xo:.1f}% of 2.5 s)")
    assert 35 <= xn <= 65
    (entry,) = [t for t in read_arbiter(arbiter_of(sim)).tenants if t.id == "reused"]
    assert (entry.policy, entry.share_permille) == ("share", 500)
    assert read_limits(new).incarnation not in (0, old_incarnation)


def two_gpu_tenant(sim: Sim, name: str, gpu1_cap_pct: int) -> Path:
    """GPU 0 with the whole card (share 100%), GPU 1 capped at gpu1_cap_pct."""
    u0, u1 = sim.uuids()[:2]
    limits = [
        DeviceLimit(
            uuid=u0,
            mem_cap_bytes=256 * MIB,
            policy=abi.POLICY_SHARE,
            priority=abi.PRIORITY_NORMAL,
            share_permille=1000,
            ceiling_permille=1000,
        ),
        DeviceLimit(
            uuid=u1,
            mem_cap_bytes=256 * MIB,
            policy=abi.POLICY_CAP,
            priority=abi.PRIORITY_NORMAL,
            share_permille=gpu1_cap_pct * 10,
            ceiling_permille=gpu1_cap_pct * 10,
        ),
    ]
    tenant = create_tenant(name, limits, root=sim.runtime)
    ensure_arbiter(sim.runtime, u0)
    ensure_arbiter(sim.runtime, u1)
    return tenant


STREAM_DEVICE_SCRIPT = """
    import ctypes, sys, time
    from cuda.bindings import driver as d
    OK = d.CUresult.CUDA_SUCCESS
    PTX = (b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
           b".visible .entry spin(.param .u64 us)\\n{\\n ret;\\n}\\n")
    how = sys.argv[1]
    d.cuInit(0)
    c0 = d.cuDevicePrimaryCtxRetain(0)[1]
    c1 = d.cuDevicePrimaryCtxRetain(1)[1]
    d.cuCtxSetCurrent(c1)
    s1 = d.cuStreamCreate(0)[1]
    if how == "kernel":  # a CUkernel takes its context from the stream
        lib = d.cuLibraryLoadData(PTX, None, None, 0, None, None, 0)[1]
        f = d.CUfunction(int(d.cuLibraryGetKernel(lib, b"spin")[1]))
        d.cuCtxSetCurrent(None)
    else:  # a function of GPU 1's context, launched while GPU 0's is current
        f = d.cuModuleGetFunction(d.cuModuleLoadData(PTX)[1], b"spin")[1]
        d.cuCtxSetCurrent(c0)
    us = ctypes.c_uint64(1000)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(us))
    t0 = time.monotonic(); n = 0
    while time.monotonic() - t0 < 1.5:
        for _ in range(4):
            err, = d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s1, ctypes.addressof(params), 0)
            assert err == OK, err
        assert d.cuStreamSynchronize(s1)[0] == OK
        n += 4
    print("achieved=%.4f" % (n * 1e-3 / (time.monotonic() - t0)))
"""


@pytest.mark.timing
@pytest.mark.parametrize("how", ["other-current", "kernel"])
def test_launches_are_gated_by_the_stream_device(sim: Sim, how: str) -> None:
    """The work goes to the stream's GPU: that GPU's share holds, whatever context is current
    (GPU 0's, or none for a CUkernel, which takes its context from the stream)."""
    tenant = two_gpu_tenant(sim, "t", 20)
    x = achieved_by_script(sim, tenant, STREAM_DEVICE_SCRIPT, how)
    print(f"cap 20% on the stream's GPU, {how}: {x:.1f}%")
    assert x <= 27
    t = read_arbiter(arbiter_of(sim, 1)).tenant("t")
    assert t is not None
    assert t.gpu_time_ns > 0


MULTI_DEVICE_SCRIPT = """
    import ctypes, time
    from cuda.bindings import driver as d
    PTX = (b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
           b".visible .entry spin(.param .u64 us)\\n{\\n ret;\\n}\\n")

    class Params(ctypes.Structure):  # CUDA_LAUNCH_PARAMS
        _fields_ = [("function", ctypes.c_void_p)] + [
            (n, ctypes.c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")
        ] + [("stream", ctypes.c_void_p), ("params", ctypes.c_void_p)]

    cuda = ctypes.CDLL("libcuda.so.1")
    d.cuInit(0)
    us = ctypes.c_uint64(1000)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(us))
    launch, streams = (Params * 2)(), []
    for i in range(2):
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(i)[1])
        f = d.cuModuleGetFunction(d.cuModuleLoadData(PTX)[1], b"spin")[1]
        s = d.cuStreamCreate(0)[1]
        streams.append(s)
        launch[i] = Params(int(f), 1, 1, 1, 1, 1, 1, 0, int(s), ctypes.addressof(args))
    t0 = time.monotonic(); n = 0
    while time.monotonic() - t0 < 1.5:
        assert cuda.cuLaunchCooperativeKernelMultiDevice(launch, 2, 0) == 0
        for s in streams:
            d.cuStreamSynchronize(s)
        n += 1
    print("achieved=%.4f" % (n * 1e-3 / (time.monotonic() - t0)))
"""


@pytest.mark.timing
def test_multi_device_cooperative_launches_are_gated_on_every_gpu(sim: Sim) -> None:
    u0, u1 = sim.uuids()[:2]
    limits = [
        DeviceLimit(
            uuid=u,
            mem_cap_bytes=256 * MIB,
            policy=abi.POLICY_CAP,
            priority=abi.PRIORITY_NORMAL,
            share_permille=200,
            ceiling_permille=200,
        )
        for u in (u0, u1)
    ]
    tenant = create_tenant("t", limits, root=sim.runtime)
    for u in (u0, u1):
        ensure_arbiter(sim.runtime, u)
    x = achieved_by_script(sim, tenant, MULTI_DEVICE_SCRIPT)
    print(f"cap 20% on both GPUs through cuLaunchCooperativeKernelMultiDevice: {x:.1f}%")
    assert x <= 27
    for gpu in (0, 1):
        t = read_arbiter(arbiter_of(sim, gpu)).tenant("t")
        assert t is not None
        assert t.gpu_time_ns > 0


@pytest.mark.timing
@pytest.mark.parametrize("mount_proc", [False, True], ids=["host-proc", "own-proc"])
def test_tenants_in_two_pid_namespaces_split_30_70_without_reclaims(sim: Sim, mount_proc: bool) -> None:
    """Containers share a GPU from different pid namespaces: no holder may be judged dead by a
    pid of another namespace (the review saw 21 reclaims from live holders)."""
    from sharegpu.regions.agentlib import reap_arbiter

    a = compute_tenant(sim, "a", "share", 30)
    b = compute_tenant(sim, "b", "share", 70)
    at = start_at(0.8)
    pa = spawn_in_pid_namespace(sim, a, "saturate", 2, 500, "kernel", at, mount_proc=mount_proc)
    pb = spawn(sim, b, "saturate", 2, 500, "kernel", at)
    # The agent's reaper (host namespace) runs all the while, as on a node.
    done, reaped = threading.Event(), []

    def reap() -> None:
        while not done.wait(0.02):
            reaped.extend(reap_arbiter(arbiter_of(sim)).clients)

    reaper = threading.Thread(target=reap)
    reaper.start()
    try:
        xa, xb = achieved(finish(pa)), achieved(finish(pb))
    finally:
        done.set()
        reaper.join()
    assert reaped == []
    status = read_arbiter(arbiter_of(sim))
    print(f"share 30/70 across pid namespaces: {xa:.1f}% / {xb:.1f}%, {status.reclaims} reclaims")
    assert status.reclaims == 0
    assert abs(xa - 30) <= 5
    assert abs(xb - 70) <= 5


@pytest.mark.timing
def test_a_killed_holder_of_another_pid_namespace_is_reclaimed(sim: Sim) -> None:
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    at = start_at(0.8)
    victim = spawn_in_pid_namespace(sim, a, "saturate", 10, 500, "kernel", at, mount_proc=False)
    survivor = spawn(sim, b, "saturate", 3, 500, "kernel", at)
    path = arbiter_of(sim)
    time.sleep(1.3)
    probe = int(Path(f"/proc/{victim.pid}/task/{victim.pid}/children").read_text().split()[0])
    kill_while_holding(path, 1, probe, "the victim")  # pid 1 of its namespace
    victim.communicate(timeout=10)  # unshare --kill-child follows its child
    values = finish(survivor)
    assert int(values["max_gap_us"]) < 1_000_000
    status = read_arbiter(path)
    assert status.reclaims >= 1
    assert all(c.pid != 1 for c in status.clients)


@pytest.mark.timing
def test_a_stopped_token_holder_loses_the_token(sim: Sim) -> None:
    """SIGSTOP (docker pause, a debugger) of the holder must not stall the GPU: after its quantum
    and SG_ARB_STALL_NS the others take the token back."""
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    gap = int(stop_a_token_holder(sim, a, b, runs_s=6, stopped_s=2.5)["max_gap_us"])
    status = read_arbiter(arbiter_of(sim))
    print(f"longest stall next to a stopped holder: {gap} us, {status.stall_reclaims} stall reclaims")
    assert gap < 1_700_000  # the stall bound (1 s) plus a quantum and a poll, not the 2.5 s stop
    assert status.stall_reclaims >= 1
    assert status.reclaims == 0  # it was alive all along


@pytest.mark.timing
def test_one_tenant_with_many_processes_leaves_entries_to_the_others(sim: Sim) -> None:
    """A tenant of 260 launching processes holds at most ARB_TENANT_MAX_CLIENTS entries; its
    other processes wait for one, and another tenant's first launch is served at once (it failed
    with CUDA_ERROR_NOT_PERMITTED when one tenant could take all 256)."""
    crowd_tenant = compute_tenant(sim, "crowd", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    path = arbiter_of(sim)
    # A parent and a child each, in a process group of their own: a killed parent's child (asleep
    # for 30 s, holding the parent's stdout) goes with it.
    crowd = [
        sim.spawn_probe("forklaunch", "100", "30", env=sim.tenant_env(crowd_tenant), new_session=True)
        for _ in range(130)
    ]
    try:
        deadline = time.monotonic() + 60
        while (t := read_arbiter(path).tenant("crowd")) is None or t.clients < abi.ARB_TENANT_MAX_CLIENTS:
            assert time.monotonic() < deadline, "the crowd never reached its entry limit"
            time.sleep(0.05)
        time.sleep(1.0)
        status = read_arbiter(path)
        crowd_entry = status.tenant("crowd")
        assert crowd_entry is not None
        assert crowd_entry.clients == abi.ARB_TENANT_MAX_CLIENTS
        assert status.entry_waits >= 1
        started = time.monotonic()
        res = sim.probe("launch", "4", "100", env=sim.tenant_env(b), timeout=30)
        assert res["launched"] == "1"
        assert time.monotonic() - started < 10
    finally:
        for proc in crowd:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in crowd:
            proc.communicate(timeout=30)
