"""The agent's periodic loops (reaper, reconciler, audit, QoS), ticked directly against real
processes on the simulated GPU; no daemon involved.

NVML is read through a child process started with the test's simulated-GPU environment (the
simulated NVML maps one state file per process for the life of the process, and each test has
its own), so every loop sees exactly what the agent would on that node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentutil import Agent
from conftest import REPO, Sim, parse_kv
from sharegpu import mps, native
from sharegpu.agent.audit import Auditor
from sharegpu.agent.events import Event
from sharegpu.agent.procs import proc_info
from sharegpu.agent.qos import QosLoop
from sharegpu.agent.reaper import Reaper
from sharegpu.agent.reconcile import Reconciler
from sharegpu.agent.tuning import ArbiterTuner, ArbiterTuning
from sharegpu.arbiter import arbiter_path, ensure_arbiter, read_arbiter, tune_arbiter
from sharegpu.devices import GpuProcess
from sharegpu.regions import abi, agentlib
from sharegpu.spec import MIB
from sharegpu.tenant import (
    DeviceLimit,
    create_tenant,
    iter_tenants,
    read_meta,
    read_usage,
    resize_tenant,
    shrunk_from,
)

NVML_DUMP = (
    "import json; from sharegpu import devices; "
    "print(json.dumps({u: [[p.pid, p.used_bytes] for p in ps] "
    "for u, ps in devices.processes_by_gpu().items()}))"
)


def nvml_of(sim: Sim) -> Callable[[], dict[str, list[GpuProcess]]]:
    """NVML's per-process memory of the test's simulated node, read in a child process."""

    def read() -> dict[str, list[GpuProcess]]:
        out = subprocess.run(
            [sys.executable, "-c", NVML_DUMP],
            env=sim.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return {u: [GpuProcess(pid=p, used_bytes=b) for p, b in ps] for u, ps in json.loads(out).items()}

    return read


def wait_line(proc: subprocess.Popen[str], key: str, timeout: float = 30) -> dict[str, str]:
    """Read the probe's output until a `key=` line; everything read so far as a dict."""
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.update(parse_kv(line)[0])
        if key in seen:
            return seen
    proc.kill()
    raise AssertionError(f"no {key}= from the probe: {seen}\n{proc.stderr.read() if proc.stderr else ''}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _threads_left(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def wait_dead(pid: int, timeout: float = 10) -> None:
    """Until a signalled process is dead (a zombie counts: not waited for, but gone).

    Its main thread reads as a zombie while its other threads may still be exiting and holding
    its files, and so its liveness locks: dead means the zombie is all that is left."""
    deadline = time.monotonic() + timeout
    while ((info := proc_info(pid)) is not None and info.state not in ("Z", "X")) or _threads_left(pid) > 1:
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        time.sleep(0.01)


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def used(tenant: Path, index: int = 0) -> int:
    return int(read_usage(tenant).devices[index].mem_used_bytes)


def compute_tenant(sim: Sim, name: str, priority: int, gpu: int = 0) -> Path:
    uuid = sim.uuids()[gpu]
    limit = DeviceLimit(
        uuid=uuid,
        mem_cap_bytes=256 * MIB,
        policy=abi.POLICY_SHARE,
        priority=priority,
        share_permille=500,
        ceiling_permille=500,
    )
    path = create_tenant(name, [limit], root=sim.runtime)
    ensure_arbiter(sim.runtime, uuid)
    return path


def with_context_overhead(sim: Sim, mib: int) -> Sim:
    sim.config.write_text(
        json.dumps({"gpus": sim.gpus, "memory_mib": sim.memory_mib, "context_overhead_mib": mib})
    )
    return sim


# ---------------------------------------------------------------------------------------------
# reaper


@pytest.mark.timing
def test_reaper_releases_a_killed_process_charge_within_two_seconds(sim: Sim, tmp_path: Path) -> None:
    """Through the running agent, not a hand-called tick: the survivors only sleep, so nothing
    but the agent's reaper can give the charge back."""
    tenant = sim.tenant("a", 512, gpus=[0])
    keeper = sim.spawn_probe("hold", "plain", "50M", "60", env=sim.tenant_env(tenant))
    victim = sim.spawn_probe("hold", "plain", "100M", "60", env=sim.tenant_env(tenant))
    agent = Agent(sim, tmp_path / "state").start()
    try:
        wait_line(keeper, "ready")
        wait_line(victim, "ready")
        assert used(tenant) == 150 * MIB
        time.sleep(1.5)  # a reaper round or more with everyone alive
        assert used(tenant) == 150 * MIB
        assert agent.events(kind="process.reaped") == []
        victim.send_signal(signal.SIGKILL)  # a zombie until waited for: dead all the same
        killed = time.monotonic()
        while used(tenant) != 50 * MIB:
            assert time.monotonic() - killed < 2.0, "the charge outlived its process by 2 s"
            time.sleep(0.02)
        (event,) = agent.events(kind="process.reaped")
        assert event["pid"] == victim.pid
        assert event["tenant"] == "a"
        assert event["data"]["mem_bytes"] == {sim.uuids()[0]: 100 * MIB}
        assert keeper.poll() is None  # the live neighbour keeps its slot and bytes
    finally:
        agent.close()
        stop(victim)
        stop(keeper)


def _lock_free(region: Path, offset: int) -> bool:
    """The futex word of the robust mutex at `offset`: 0 when nobody holds it."""
    with region.open("rb") as f:
        f.seek(offset)
        return int.from_bytes(f.read(4), "little") == 0


def test_reaper_hands_a_dead_holders_token_to_the_waiting_tenant(sim: Sim) -> None:
    a = compute_tenant(sim, "a", abi.PRIORITY_NORMAL)
    b = compute_tenant(sim, "b", abi.PRIORITY_NORMAL)
    path = arbiter_path(sim.runtime, sim.uuids()[0])
    holder = sim.spawn_probe("saturate", "20", "5000", env=sim.tenant_env(a))
    waiter = sim.spawn_probe("saturate", "20", "5000", env=sim.tenant_env(b))
    try:
        wait_line(holder, "started")
        wait_line(waiter, "started")
        # Freeze both while `a` holds the token and `b` waits (and neither holds a lock), so only
        # the reaper can hand the token on: the waiter cannot run its own liveness check.
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "never caught a holding, b waiting"
            holder.send_signal(signal.SIGSTOP)
            waiter.send_signal(signal.SIGSTOP)
            time.sleep(0.01)
            status = read_arbiter(path)
            states = {c.pid: c.state for c in status.clients}
            if (
                status.holder_pid == holder.pid
                and states.get(waiter.pid) == "waiting"
                and _lock_free(path, abi.Arbiter.lock.offset)
                and _lock_free(b / abi.USAGE_FILE, abi.Usage.lock.offset)
            ):
                break
            holder.send_signal(signal.SIGCONT)
            waiter.send_signal(signal.SIGCONT)
            time.sleep(0.03)
        holder.send_signal(signal.SIGKILL)
        wait_dead(holder.pid)
        events = Reaper(sim.runtime).tick()
        status = read_arbiter(path)
        assert status.holder_pid == waiter.pid  # granted while it sleeps
        assert status.reclaims >= 1
        assert all(c.pid != holder.pid for c in status.clients)
        arb = [e for e in events if e.kind == "process.reaped" and e.data.get("region") == "arbiter"]
        assert len(arb) == 1
        assert arb[0].pid == holder.pid
        assert arb[0].tenant == "a"
        assert arb[0].data["held_token"] is True
        assert arb[0].data["token_to_pid"] == waiter.pid
        waiter.send_signal(signal.SIGCONT)
        _, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
    finally:
        for p in (holder, waiter):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
            stop(p)


def _supervisor() -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """A stand-in `sharegpu run` supervisor and its identity for meta.json."""
    proc = subprocess.Popen(["sleep", "60"])
    info = proc_info(proc.pid)
    assert info is not None
    return proc, {"pid": proc.pid, "start_time": info.start_time}


def test_reaper_removes_tenants_whose_supervisor_is_gone(sim: Sim) -> None:
    uuid = sim.uuids()[0]
    limit = [DeviceLimit(uuid=uuid, mem_cap_bytes=256 * MIB)]
    sup1, ident1 = _supervisor()
    sup2, ident2 = _supervisor()
    sup3, ident3 = _supervisor()
    create_tenant("orphan", limit, root=sim.runtime, meta={"supervisor": ident1})
    busy = create_tenant("busy", limit, root=sim.runtime, meta={"supervisor": ident2})
    create_tenant("alive", limit, root=sim.runtime, meta={"supervisor": ident3})
    create_tenant("managed", limit, root=sim.runtime)  # made by the agent's API: no supervisor
    straggler = sim.spawn_probe("hold", "plain", "10M", "60", env=sim.tenant_env(busy))
    try:
        wait_line(straggler, "ready")
        reaper = Reaper(sim.runtime, tenant_interval_s=0)  # look for orphans at every tick
        assert reaper.tick() == []
        for sup in (sup1, sup2):  # killed: a zombie until waited for, dead all the same
            sup.kill()
            wait_dead(sup.pid)
        events = reaper.tick()
        assert [(e.kind, e.tenant) for e in events] == [("tenant.reaped", "orphan")]
        assert f"supervisor {sup1.pid} is gone" in events[0].message
        assert sorted(p.name for p in iter_tenants(sim.runtime)) == ["alive", "busy", "managed"]
        straggler.send_signal(signal.SIGKILL)  # its last process dies: the tenant goes too
        wait_dead(straggler.pid)
        events = reaper.tick()
        assert ("process.reaped", "busy") in [(e.kind, e.tenant) for e in events]
        assert ("tenant.reaped", "busy") in [(e.kind, e.tenant) for e in events]
        assert sorted(p.name for p in iter_tenants(sim.runtime)) == ["alive", "managed"]
        assert reaper.tick() == []
    finally:
        stop(straggler)
        for sup in (sup1, sup2, sup3):
            sup.kill()
            sup.wait()


# ---------------------------------------------------------------------------------------------
# reconciler


def test_reconciled_overhead_is_counted_against_the_cap(sim: Sim) -> None:
    with_context_overhead(sim, 200)  # each context takes 200 MiB (NVML only)
    tenant = sim.tenant("a", 512, gpus=[0])
    uuid = sim.uuids()[0]
    holder = sim.spawn_probe("hold", "plain", "100M", "60", env=sim.tenant_env(tenant))
    try:
        wait_line(holder, "ready")
        # The shim admitted the holder's context at its creation (its measured estimate).
        assert read_usage(tenant).devices[0].overhead_bytes == 200 * MIB
        # NVML's figure is the same quantity: replaced, not added
        assert Reconciler(sim.runtime, nvml=nvml_of(sim)).tick() == []
        assert read_usage(tenant).devices[0].overhead_bytes == 200 * MIB
        agentlib.set_overhead(tenant, 0, 0)  # an estimate lost: the reconciler restores it
        loop = Reconciler(sim.runtime, nvml=nvml_of(sim))
        events = loop.tick()
        assert read_usage(tenant).devices[0].overhead_bytes == 200 * MIB
        (event,) = events
        assert event.kind == "reconcile.overhead"
        assert (event.tenant, event.gpu) == ("a", uuid)
        assert event.data["overhead_bytes"] == 200 * MIB
        assert event.data["per_pid"] == {holder.pid: 200 * MIB}
        assert loop.tick() == []  # unchanged: no new event
        # 100 + 200 + the probe's own context 200 + 300 > 512: refused; + 12 fits.
        values = sim.probe("alloc", "plain", "300M", "12M", env=sim.tenant_env(tenant))
        assert values.all("alloc") == ["CUDA_ERROR_OUT_OF_MEMORY", "OK"]
        # The tenant's own view counts it too (the viewer's own context as well).
        assert int(sim.probe("meminfo", env=sim.tenant_env(tenant))["free"]) == 12 * MIB
        stop(holder)  # SIGKILL: its context's estimate stays until the next pass
        assert read_usage(tenant).devices[0].overhead_bytes == 200 * MIB
        events = loop.tick()  # the process is gone: so is its overhead
        assert read_usage(tenant).devices[0].overhead_bytes == 0
        assert [e.data["overhead_bytes"] for e in events] == [0]
    finally:
        stop(holder)


def test_the_reconciler_never_overwrites_a_context_admitted_while_it_measured(sim: Sim) -> None:
    """A shim that admits (or gives back) a context's memory while NVML is read moves the
    overhead: the figure measured without it is not written, the next pass measures again."""
    with_context_overhead(sim, 200)
    tenant = sim.tenant("a", 512, gpus=[0])
    holder = sim.spawn_probe("hold", "plain", "100M", "60", env=sim.tenant_env(tenant))
    try:
        wait_line(holder, "ready")
        measure = nvml_of(sim)

        def racing() -> dict[str, list[GpuProcess]]:
            seen = measure()
            agentlib.set_overhead(tenant, 0, 456 * MIB)  # as a shim's admission would
            return seen

        agentlib.set_overhead(tenant, 0, 0)
        assert Reconciler(sim.runtime, nvml=racing).tick() == []
        assert read_usage(tenant).devices[0].overhead_bytes == 456 * MIB
        Reconciler(sim.runtime, nvml=measure).tick()
        assert read_usage(tenant).devices[0].overhead_bytes == 200 * MIB
    finally:
        stop(holder)


# ---------------------------------------------------------------------------------------------
# audit


def _bypasser(sim: Sim, size: str) -> subprocess.Popen[str]:
    """A supervisor shell whose child, a probe without the shim (only the simulated GPU's
    environment), holds `size` on GPU 0."""
    return subprocess.Popen(
        ["sh", "-c", f'"$0" hold plain {size} 60; true', str(native.probe_path())],
        env=sim.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def under_mps(sim: Sim) -> Sim:
    """The simulated GPU as clients of an MPS server see it (NVML lists them apart)."""
    sim.config.write_text(json.dumps({"gpus": sim.gpus, "memory_mib": sim.memory_mib, "mps_block_us": 500}))
    return sim


@pytest.mark.parametrize(("enforce", "mps_clients"), [("report", False), ("kill", False), ("kill", True)])
def test_audit_finds_a_process_that_bypasses_the_shim(sim: Sim, enforce: str, mps_clients: bool) -> None:
    """Under MPS too: there the driver lists the bypassing client only among the MPS clients."""
    if mps_clients:
        under_mps(sim)
    uuid = sim.uuids()[0]
    shell = _bypasser(sim, "300M")
    honest: subprocess.Popen[str] | None = None
    try:
        wait_line(shell, "ready")
        (child,) = _children(shell.pid)
        sup = proc_info(shell.pid)
        assert sup is not None
        tenant = create_tenant(
            "rogue",
            [DeviceLimit(uuid=uuid, mem_cap_bytes=128 * MIB)],
            root=sim.runtime,
            meta={"supervisor": {"pid": sup.pid, "start_time": sup.start_time}},
        )
        honest = sim.spawn_probe("hold", "plain", "64M", "60", env=sim.tenant_env(tenant))
        wait_line(honest, "ready")
        audit = Auditor(sim.runtime, enforce, tolerance_bytes=32 * MIB, nvml=nvml_of(sim))
        events = audit.tick()
        bypass = [e for e in events if e.kind == "audit.bypass"]
        assert len(bypass) == 1, events
        assert (bypass[0].tenant, bypass[0].gpu) == ("rogue", uuid)
        assert bypass[0].data["measured_bytes"] == 364 * MIB
        assert bypass[0].data["outside_ledger"] == [child]
        assert "audit.untracked" not in kinds(events)  # both processes are the tenant's
        if enforce == "report":
            assert "audit.killed" not in kinds(events)
            assert audit.tick() == []  # still true: not repeated
            os.kill(child, signal.SIGKILL)
        else:
            killed = [e for e in events if e.kind == "audit.killed"]
            assert [(e.pid, e.tenant) for e in killed] == [(child, "rogue")]
        shell.communicate(timeout=30)  # the shell ends once its probe is dead
        events = audit.tick()
        assert kinds(events) == ["audit.bypass"]
        assert events[0].data["cleared"] is True
        assert honest.poll() is None  # the process inside the ledger was never touched
    finally:
        stop(shell)
        if honest is not None:
            stop(honest)


def test_a_memory_shrink_below_usage_is_not_a_bypass(sim: Sim) -> None:
    tenant = sim.tenant("big", 1024, gpus=[0])
    holder = sim.spawn_probe("hold", "plain", "600M", "60", env=sim.tenant_env(tenant))
    try:
        wait_line(holder, "ready")

        def shrink(devices: list[DeviceLimit]) -> list[DeviceLimit]:
            return [dataclasses.replace(d, mem_cap_bytes=128 * MIB) for d in devices]

        resize_tenant("big", shrink, root=sim.runtime)
        assert shrunk_from(read_meta(tenant)) == {sim.uuids()[0]: 1024 * MIB}
        audit = Auditor(sim.runtime, "kill", tolerance_bytes=32 * MIB, nvml=nvml_of(sim))
        assert [e for e in audit.tick() if e.kind.startswith("audit.")] == []
        assert holder.poll() is None  # a shrink never kills anything, even with --enforce kill
    finally:
        stop(holder)


def test_audit_reports_a_gpu_process_of_no_tenant(sim: Sim) -> None:
    tenant = sim.tenant("a", 256, gpus=[0])
    member = sim.spawn_probe("hold", "plain", "10M", "60", env=sim.tenant_env(tenant))
    stranger = sim.spawn_probe("hold", "plain", "20M", "60")  # no shim, no tenant
    try:
        wait_line(member, "ready")
        wait_line(stranger, "ready")
        audit = Auditor(sim.runtime, "kill", nvml=nvml_of(sim))  # untracked: reported only
        events = audit.tick()
        assert [(e.kind, e.pid, e.gpu) for e in events] == [("audit.untracked", stranger.pid, sim.uuids()[0])]
        assert events[0].data["used_bytes"] == 20 * MIB
        assert audit.tick() == []
        stop(stranger)
        events = audit.tick()
        assert [(e.kind, e.pid, e.data.get("cleared")) for e in events] == [
            ("audit.untracked", stranger.pid, True)
        ]
        assert member.poll() is None
    finally:
        stop(stranger)
        stop(member)


def test_the_nodes_mps_server_is_no_untracked_process_and_is_never_killed(sim: Sim, tmp_path: Path) -> None:
    """Under MPS the driver lists the server (a child of the control daemon) among the compute
    processes: it is no tenant's, and killing it would end every client's work. Its name alone
    proves nothing: a process of that name that the daemon did not start is untracked."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    control, server = bindir / mps.CONTROL, bindir / mps.SERVER  # stand-ins with the daemon's names
    shutil.copy(shutil.which("sh") or "/bin/sh", control)
    shutil.copy(native.probe_path(), server)
    pipe = tmp_path / "mps"
    pipe.mkdir(mode=0o755)
    daemon = subprocess.Popen(
        [str(control), "-c", '"$0" hold plain 24M 60; true', str(server)],
        env=sim.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    impostor = sim.spawn_probe("hold", "plain", "12M", "60")
    named_like_it = subprocess.Popen(
        [str(server), "hold", "plain", "8M", "60"], env=sim.env(), stdout=subprocess.PIPE, text=True
    )
    try:
        wait_line(daemon, "ready")
        wait_line(impostor, "ready")
        wait_line(named_like_it, "ready")
        (server_pid,) = _children(daemon.pid)
        (pipe / mps.PID_FILE).write_text(f"{daemon.pid}\n")
        audit = Auditor(sim.runtime, "kill", nvml=nvml_of(sim), kill_untracked=True, mps_pipe_dir=pipe)
        events = audit.tick()
        untracked = sorted(e.pid or 0 for e in events if e.kind == "audit.untracked")
        assert untracked == sorted([impostor.pid, named_like_it.pid]), events
        assert sorted(e.pid or 0 for e in events if e.kind == "audit.killed") == untracked
        assert proc_info(server_pid) is not None  # the server lives
        assert daemon.poll() is None
        (pipe / mps.PID_FILE).unlink()  # no daemon any more: its child is a process like others
        assert [(e.kind, e.pid) for e in audit.tick() if e.pid == server_pid][:1] == [
            ("audit.untracked", server_pid)
        ]
    finally:
        stop(daemon)
        stop(impostor)
        stop(named_like_it)


# ---------------------------------------------------------------------------------------------
# QoS


@pytest.mark.timing
def test_qos_lowers_the_offline_bound_when_online_waits_too_long(sim: Sim) -> None:
    online = compute_tenant(sim, "web", abi.PRIORITY_ONLINE)
    offline = compute_tenant(sim, "train", abi.PRIORITY_OFFLINE)
    path = arbiter_path(sim.runtime, sim.uuids()[0])
    ensure_arbiter(sim.runtime, sim.uuids()[1])  # a GPU with no tenant: held, said so
    # Drained handovers: each online request waits for the rest of a 2 ms offline kernel. (With
    # early preemption, ABI 1.5's default, it is granted at once and may wait under the target.)
    # Set as an operator does, through the agent's arbiter settings; the bound is the QoS loop's.
    tune_arbiter(path, offline_inflight_max=8)
    drained = ArbiterTuning(online_preempt="drain", preempt_min_kernel_ns=7_000_000)
    tuner = ArbiterTuner(sim.runtime, {"default": drained})
    assert sorted(str(e.gpu) for e in tuner.tick()) == sorted(sim.uuids())
    batch = sim.spawn_probe("saturate", "8", "2000", env=sim.tenant_env(offline))
    web = sim.spawn_probe("bursts", "150", "40", "2", "200", env=sim.tenant_env(online))
    try:
        wait_line(batch, "started")
        wait_line(web, "started")
        qos = QosLoop(sim.runtime, target_wait_ms=0.01)  # any wait behind a 2 ms kernel is over
        first = {e.gpu: e for e in qos.tick()}
        assert all(e.kind == "qos.decision" for e in first.values())
        assert first[sim.uuids()[0]].data["action"] == "hold"  # first sample: nothing to compare
        assert first[sim.uuids()[1]].data["action"] == "hold"
        assert "no online tenant" in first[sim.uuids()[1]].message
        time.sleep(1.0)
        decisions = {e.gpu: e for e in qos.tick()}
        d = decisions[sim.uuids()[0]]
        assert d.data["action"] == "lower", d.message
        assert (d.data["from"], d.data["to"]) == (8, 4)
        assert d.data["online_tenants"] == ["web"]
        assert d.data["grants"] > 0
        assert d.data["wait_ms_per_grant"] > 0.01
        assert read_arbiter(path).offline_inflight_max == 4
        # Each loop writes only its own fields: neither undoes the other.
        assert tuner.tick() == []
        status = read_arbiter(path)
        assert (status.offline_inflight_max, status.online_preempt, status.preempt_min_kernel_ns) == (
            4,
            "drain",
            7_000_000,
        )
        # A generous target gives offline throughput back, one step at a time.
        qos.target_wait_ms = 1e6
        time.sleep(0.5)
        d = {e.gpu: e for e in qos.tick()}[sim.uuids()[0]]
        assert (d.data["action"], d.data["from"], d.data["to"]) == ("raise", 4, 5), d.message
        assert read_arbiter(path).offline_inflight_max == 5
        # Holding for the same reason as at the last tick is not news: no event for it.
        assert sim.uuids()[1] not in {e.gpu for e in qos.tick()}
    finally:
        stop(web)
        stop(batch)


@pytest.mark.timing
def test_qos_raises_the_bound_up_to_its_maximum_when_online_waits_are_short(sim: Sim) -> None:
    tenant = compute_tenant(sim, "web", abi.PRIORITY_ONLINE)  # alone: it never waits long
    path = arbiter_path(sim.runtime, sim.uuids()[0])
    assert read_arbiter(path).offline_inflight_max == abi.ARB_DEFAULT_OFFLINE_INFLIGHT == 1
    web = sim.spawn_probe("bursts", "200", "20", "1", "100", env=sim.tenant_env(tenant))
    try:
        wait_line(web, "started")
        qos = QosLoop(sim.runtime, target_wait_ms=50, max_bound=3)
        seen = []
        for _ in range(12):
            d = {e.gpu: e for e in qos.tick()}[sim.uuids()[0]]
            seen.append((d.data["action"], d.data["to"]))
            assert d.data["to"] == read_arbiter(path).offline_inflight_max <= 3
            if d.data["action"] == "hold" and "maximum" in d.message:
                break
            time.sleep(0.3)
        assert ("raise", 2) in seen
        assert ("raise", 3) in seen
        assert seen[-1] == ("hold", 3), seen
    finally:
        stop(web)


def test_the_simulated_context_overhead_is_configured_strictly(sim: Sim) -> None:
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 512, "context_overhead_mib": 512}))
    bad = sim.probe("info", check=False)
    assert bad.returncode == 1
    assert '"context_overhead_mib" must be less than memory_mib' in bad.stderr
    with_context_overhead(sim, 64)
    assert sim.probe("meminfo")["free"] == str(1024 * MIB - 64 * MIB)  # the probe's own context


FORGER = """
    import ctypes, mmap, os, sys, time
    from cuda.bindings import driver as d
    from sharegpu.regions import abi
    M = 1 << 20
    assert d.cuInit(0)[0] == 0
    d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
    held = [d.cuMemAlloc(100 * M)[1]]
    fd = os.open(os.path.join(os.environ["SHAREGPU_TENANT"], abi.USAGE_FILE), os.O_RDWR)
    usage = abi.Usage.from_buffer(mmap.mmap(fd, ctypes.sizeof(abi.Usage)))
    (slot,) = [s for s in usage.procs if s.pid == os.getpid()]
    for _ in range(5):  # the ledger says nothing is used before each allocation
        slot.dev[0].mem_bytes = slot.dev[0].spare_bytes = 0
        usage.devices[0].mem_used_bytes = usage.devices[0].overhead_bytes = 0
        err, p = d.cuMemAlloc(800 * M)
        assert err == d.CUresult.CUDA_SUCCESS, err
        held.append(p)
    print("over_ns=%d" % time.monotonic_ns(), flush=True)
    time.sleep(60)
"""


@pytest.mark.timing
def test_the_audit_kills_a_tenant_that_forged_its_ledger_within_its_interval(
    sim_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The usage file is the tenant's to write: a process that rewrites its own totals gets past
    its cap (4100 MiB under a 1024 MiB one here). The agent's NVML audit reads what the driver
    gives the tenant's processes, not the ledger: with `--enforce kill` it kills them within its
    interval (2 s). What it cannot tell from driver overhead it lets pass: up to the
    reconciler's 2 GiB per process in the ledger, plus its 256 MiB tolerance."""
    sim = sim_factory(memory_mib=8192)
    tenant = sim.tenant("forger", 1024, gpus=[0])
    agent = Agent(sim, tmp_path / "state", "--enforce", "kill").start()
    env = {**sim.tenant_env(tenant), "PYTHONPATH": str(REPO / "src")}
    forger = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FORGER)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        over_ns = int(wait_line(forger, "over_ns")["over_ns"])
        try:
            forger.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"not killed; events: {agent.events()}") from None
        took = (time.monotonic_ns() - over_ns) / 1e9
        assert forger.returncode == -signal.SIGKILL
        (bypass,) = [e for e in agent.events(kind="audit.bypass") if not e["data"].get("cleared")]
        assert bypass["tenant"] == "forger"
        assert bypass["data"]["measured_bytes"] == 4100 * MIB
        assert "its ledger disagrees with the driver" in bypass["message"]
        (killed,) = agent.events(kind="audit.killed")
        assert killed["pid"] == forger.pid
        print(f"forged ledger, 4100 MiB under a 1024 MiB cap: killed {took:.2f} s after the overuse")
        assert took < 2.0 + 4.0  # one interval, and a tick's lateness on a loaded machine
    finally:
        stop(forger)
        agent.close()
