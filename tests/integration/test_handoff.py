"""Queued hand-overs (ABI 1.12; docs/design/arbitration.md, "Queued hand-overs"), with real
shims on the simulated GPU: while a holder's sync waits for its work, the token may move to a
waiter of its class, whose work waits on the GPU for a word of the region that the holder's
stream writes after its work."""

from __future__ import annotations

import ctypes

import pytest

from arbiterutil import (
    achieved,
    arbiter_of,
    compute_tenant,
    finish,
    spawn,
    spawn_python,
    spin_script,
    start_at,
)
from conftest import Sim
from sharegpu.agent.cpulatency import CpuLatencyRequest
from sharegpu.arbiter import ArbiterStatus, read_arbiter, tune_arbiter
from sharegpu.regions import abi

RUN_SECONDS = 2.0  # each syncing run's window


def syncing_run(
    sim: Sim,
    shares: dict[str, int],
    handoff: str,
    kernel_us: int,
    *,
    seconds: float = RUN_SECONDS,
    kernels: int = 1,
    policy: str = "share",
) -> tuple[list[float], ArbiterStatus]:
    """Tenants of `policy` (name -> %), each bursts of `kernels` kernels, a sync and 20 µs of
    host time, started together under `handoff`: what each achieved (%) and the region after
    (its counters since it was made)."""
    tenants = [
        sim.runtime / "tenants" / name
        if (sim.runtime / "tenants" / name).exists()
        else compute_tenant(sim, name, policy, pct)
        for name, pct in shares.items()
    ]
    path = arbiter_of(sim)
    tune_arbiter(path, handoff=handoff)
    at = start_at()
    procs = [spawn(sim, t, "syncloop", seconds, kernels, kernel_us, 20, at) for t in tenants]
    return [achieved(finish(p)) for p in procs], read_arbiter(path)


def charged_ns(status: ArbiterStatus, before: ArbiterStatus | None, names: list[str]) -> list[int]:
    """Each tenant's GPU time charged in the run (ns)."""
    times = []
    for name in names:
        now = status.tenant(name)
        assert now is not None
        was = before.tenant(name) if before else None
        times.append(now.gpu_time_ns - (was.gpu_time_ns if was else 0))
    return times


def charged(status: ArbiterStatus, before: ArbiterStatus | None, names: list[str]) -> list[float]:
    """Each tenant's GPU time charged in the run, % of all charged."""
    times = charged_ns(status, before, names)
    return [t / sum(times) * 100 for t in times]


def charged_over_ran(
    status: ArbiterStatus, before: ArbiterStatus, names: list[str], got: list[float]
) -> list[float]:
    """Each tenant's GPU time in the books over what its own count of finished kernel time says
    it ran in the run's window (`got`, % of the card)."""
    window_ns = RUN_SECONDS * 1e9
    return [ns / window_ns * 100 / x for ns, x in zip(charged_ns(status, before, names), got, strict=True)]


@pytest.mark.timing
@pytest.mark.parametrize(
    ("shares", "kernel_us"),
    [
        pytest.param({"a": 30, "b": 70}, 100, id="30-70-100us"),
        pytest.param({"a": 20, "b": 30, "c": 50}, 200, id="20-30-50-200us"),
    ],
)
def test_syncing_tenants_hand_over_queued_and_each_pays_for_its_own_work(
    sim: Sim, shares: dict[str, int], kernel_us: int
) -> None:
    """Bursts of one short kernel and a sync: most hand-overs are queued (the waiter takes the
    token while the holder's sync waits: 9892 of 9903 at 30/70), every queued hold is gated and
    no gate needs its holder to open it, the gates' waits and the switches after them are left
    out of the charges (each tenant charged 1.000-1.001 x what it ran), and the split holds."""
    names = list(shares)
    with CpuLatencyRequest(0):
        drained_got, drained = syncing_run(sim, shares, "drain", kernel_us)
        got, queued = syncing_run(sim, shares, "queued", kernel_us)
    handovers = queued.handovers - drained.handovers
    split = [x / sum(got) * 100 for x in got]
    paid = charged(queued, drained, names)
    books = charged_over_ran(queued, drained, names, got)
    print(
        f"{shares}, 1 x {kernel_us} µs: drain {drained_got} = {sum(drained_got):.1f}%, queued {got} = "
        f"{sum(got):.1f}% (split {[round(x, 1) for x in split]}, charged {[round(x, 1) for x in paid]}); "
        f"{queued.queued_handovers} queued of {handovers} hand-overs, {queued.gated_holds} gated, "
        f"{queued.gates_opened} opened by their holder, {queued.gate_wait_ns / 1e6:.1f} ms waited at gates; "
        f"charged / ran {[round(b, 3) for b in books]}"
    )
    assert (drained.queued_handovers, drained.gated_holds) == (0, 0)  # the region's mode is honoured
    assert queued.queued_handovers >= handovers / 2
    assert queued.gated_holds >= queued.queued_handovers * 0.9
    assert queued.gates_opened == 0
    assert queued.gate_wait_ns > 0
    for name, x, pay in zip(names, split, paid, strict=True):
        assert abs(x - shares[name]) <= 3, name
        assert abs(pay - x) <= 1, name  # each pays what the card ran for it, not its gate's wait
    # Nor the GPU's switch to it after its gate opened (a hold of one 100 µs kernel paid 1.10 x
    # what it ran while the simulated GPU's event after the wait completed before that switch).
    assert all(abs(b - 1) <= 0.04 for b in books), books
    # On the simulated GPU the drain's hand-over already costs what the GPU's switch does, and
    # queued ran 1.2 (two tenants) and 2.6 points (three) below it on the 2-core VM: a guard, not
    # a goal (docs/design/arbitration.md, "Queued hand-overs").
    assert sum(got) >= sum(drained_got) - 5


@pytest.mark.timing
def test_a_holder_that_keeps_the_card_lends_its_gap_one_kernel_at_a_time_queued(sim: Sim) -> None:
    """At 30/70 the 70% tenant follows its own turn four times in ten, and its gap (sync return,
    host code, next launch) idled the card: with bursts of 4 x 100 µs, 95.4% of the card where
    the GPU without sharegpu keeps 97.5% busy.  Under `handoff: queued` it lends the gap: one
    kernel of the 30% tenant queues behind its work and it takes the card back queued behind that
    kernel (96.6%, 2026-12-07).  Bursts of one kernel are not lent (a lent burst is a turn).  The
    split holds and each tenant pays for what it ran."""
    shares = {"a": 30, "b": 70}
    names = list(shares)
    with CpuLatencyRequest(0):
        drained_got, drained = syncing_run(sim, shares, "drain", 100, kernels=4)
        got, lent = syncing_run(sim, shares, "queued", 100, kernels=4)
        _, single = syncing_run(sim, shares, "queued", 100, kernels=1)
    loans = lent.loans - drained.loans
    split = [x / sum(got) * 100 for x in got]
    books = charged_over_ran(lent, drained, names, got)
    print(
        f"4 x 100 µs at 30/70: drain {sum(drained_got):.1f}%, queued {sum(got):.1f}% "
        f"(split {[round(x, 1) for x in split]}); {loans} loans, {single.loans - lent.loans} with bursts "
        f"of one kernel; charged / ran {[round(b, 3) for b in books]}"
    )
    assert loans >= 500  # about 1000 a second measured
    assert single.loans - lent.loans <= loans / 20
    assert lent.gates_opened == 0
    for name, x in zip(names, split, strict=True):
        assert abs(x - shares[name]) <= 1.5, name
    assert all(abs(b - 1) <= 0.04 for b in books), books
    # 1.2 points above the drain on the 2-core VM: a guard against losing the card, not the goal.
    assert sum(got) >= sum(drained_got) - 2


@pytest.mark.timing
def test_tenants_under_a_ceiling_hand_over_and_lend_queued_and_keep_their_caps(sim: Sim) -> None:
    """`cap` 30/70, bursts of 4 x 100 µs and a sync, each tenant wanting more than its cap: a
    holder under a ceiling hands over and lends queued like a share holder (it used to drain
    every time: 95.4% of the card where 96.3% is now measured, the GPU without sharegpu 97.5%),
    its bucket paying for its work in flight when its sync returns (each charged what it ran), so
    neither tenant runs over its cap."""
    caps = {"a": 30, "b": 70}
    names = list(caps)
    with CpuLatencyRequest(0):
        drained_got, drained = syncing_run(sim, caps, "drain", 100, kernels=4, policy="cap")
        got, queued = syncing_run(sim, caps, "queued", 100, kernels=4, policy="cap")
    handovers = queued.handovers - drained.handovers
    queued_handovers = queued.queued_handovers - drained.queued_handovers
    loans = queued.loans - drained.loans
    books = charged_over_ran(queued, drained, names, got)
    print(
        f"cap 30/70, 4 x 100 µs: drain {drained_got} = {sum(drained_got):.1f}%, queued {got} = "
        f"{sum(got):.1f}%; {queued_handovers} queued of {handovers} hand-overs, {loans} loans; "
        f"charged / ran {[round(b, 3) for b in books]}"
    )
    assert all(abs(b - 1) <= 0.04 for b in books), books  # the buckets spent what ran
    assert queued_handovers >= handovers / 2  # none before: holders under a ceiling drained
    assert loans >= 100
    for name, x in zip(names, got, strict=True):
        assert x <= caps[name] + 0.5, name  # the ceiling holds
        # Below its cap by what the card cannot run (the caps add up to all of it).
        assert x >= caps[name] - 3, name
    assert sum(got) >= sum(drained_got) - 2  # a guard against losing the card, not the goal


# A tenant whose work changes shape: short bursts (its offers are taken queued), then one kernel
# of 2.5 s and a sync, which it offers too (its last work at a sync was short).
CHANGES_SHAPE = """
    def burst():
        err, = d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), 0)
        assert err == d.CUresult.CUDA_SUCCESS, err
        assert d.cuCtxSynchronize()[0] == d.CUresult.CUDA_SUCCESS
    while time.monotonic_ns() < START:
        pass
    while time.monotonic_ns() < START + 1_200_000_000:
        burst()
    us.value = 2_500_000
    t = time.monotonic()
    burst()
    print("long_kernel_s=%.3f" % (time.monotonic() - t))
"""


@pytest.mark.timing
def test_a_gate_behind_work_that_runs_past_the_bound_is_opened_by_its_holder(sim: Sim) -> None:
    """A holder offers at the sync of a 2.5 s kernel (its work at syncs had been short): the
    waiter that took the card queued waits on the GPU for it only a quantum and SG_ARB_STALL_NS
    (the gate opened 1.01 s after the long kernel began, read from the region), then its
    watcher raises the holder's word itself and its work runs beside the long kernel (the GPU's
    time-slicing), where waiting would have held it for the whole kernel."""
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    path = arbiter_of(sim)
    tune_arbiter(path, handoff="queued")
    at = start_at(1.0)
    shaper = spawn_python(sim, a, spin_script(200, CHANGES_SHAPE.replace("START", str(at))))
    waiter = spawn(sim, b, "syncloop", 4, 1, 200, 20, at)
    xb = achieved(finish(waiter))
    out, err = shaper.communicate(timeout=60)
    assert shaper.returncode == 0, err
    status = read_arbiter(path)
    print(
        f"beside a 2.5 s kernel: {xb:.1f}% for the waiter; {out.strip()}; {status.gates_opened} gates opened"
    )
    assert status.gates_opened >= 1
    # The waiter's kernels ran inside the long one's span (time-sliced with it: 0.18 s of them
    # on the simulated GPU, the long kernel's full slices between), where a gate left shut would
    # have kept them all behind it (2.50 s).
    assert float(out.split("=")[1]) >= 2.55
    assert xb >= 10


@pytest.mark.timing
def test_a_region_of_abi_1_11_has_no_records_and_its_holders_drain(sim: Sim) -> None:
    """A region an older agent made (ABI 1.11: the arbiter alone, no hand-over records) that
    says `queued`: the shims find no records in its file and hand over at the drain, as 1.11's
    did, and the split holds."""
    a = compute_tenant(sim, "a", "share", 30)
    b = compute_tenant(sim, "b", "share", 70)
    path = arbiter_of(sim)
    tune_arbiter(path, handoff="queued")
    old = bytearray(path.read_bytes()[: ctypes.sizeof(abi.Arbiter)])
    header = abi.RegionHeader.from_buffer(old)
    header.abi_minor, header.total_size = 11, ctypes.sizeof(abi.Arbiter)
    del header
    path.write_bytes(bytes(old))  # before any shim maps it
    at = start_at()
    args = ("syncloop", 2, 1, 200, 20, at)
    pa, pb = spawn(sim, a, *args), spawn(sim, b, *args)
    xa, xb = achieved(finish(pa)), achieved(finish(pb))
    status = read_arbiter(path)
    print(f"ABI 1.11 region: {xa:.1f}% / {xb:.1f}%, {status.handovers} hand-overs")
    assert status.handoff == "queued"
    assert (status.queued_handovers, status.gated_holds) == (0, 0)
    assert status.handovers > 100
    assert abs(xa / (xa + xb) * 100 - 30) <= 3
