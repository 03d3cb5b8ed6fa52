"""Stalls: a process stopped inside a region's critical section. In a tenant's own usage region
the agent's stall breaker kills it so that the tenant's other processes run again; a GPU's
arbiter lock is shared by tenants, so nobody waits for it past its deadline (the GPU then runs
unarbitrated) and the agent replaces the region. A stopped process that holds no lock is left
alone.

The stopped holder is a real process that takes the region's robust mutex the way the shim
does (pthread_mutex_lock on the shared mapping) and stops itself while holding it, as a
process frozen at the wrong instant by SIGSTOP, a debugger or `docker pause` would be.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentutil import Agent
from arbiterutil import arbiter_of, compute_tenant, stop_a_token_holder
from conftest import Sim, parse_kv
from sharegpu.arbiter import arbiter_path, ensure_arbiter, read_arbiter
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant, read_usage

HOLDER = textwrap.dedent(
    """
    import ctypes, mmap, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(sys.argv[1], os.O_RDWR)
    region = mmap.mmap(fd, os.fstat(fd).st_size)
    mutex = (ctypes.c_char * 64).from_buffer(region, int(sys.argv[2]))
    print("locked=%d" % libc.pthread_mutex_lock(ctypes.byref(mutex)), flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the critical section
    libc.pthread_mutex_unlock(ctypes.byref(mutex))
    """
)


def stopped_holder(region: Path, offset: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(region), str(offset)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked=0"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the holder never stopped"
        time.sleep(0.01)
    return proc


def wait_killed(proc: subprocess.Popen[str], timeout: float) -> float:
    start = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the stopped holder was not killed within {timeout} s") from None
    assert proc.returncode == -signal.SIGKILL
    return time.monotonic() - start


def finish(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=30)


@pytest.mark.timing
def test_a_holder_stopped_in_the_usage_lock_is_killed_and_allocations_resume(
    sim: Sim, tmp_path: Path
) -> None:
    tenant = sim.tenant("t", 64, gpus=[0])
    agent = Agent(sim, tmp_path / "state").start()
    holder = stopped_holder(tenant / abi.USAGE_FILE, abi.Usage.lock.offset)
    try:
        recoveries = read_usage(tenant).recoveries
        took = wait_killed(holder, timeout=15)
        assert took < 10
        res = sim.probe("alloc", "plain", "32M", env=sim.tenant_env(tenant))
        assert res.all("alloc") == ["OK"]  # the lock is free again: the region was repaired
        assert read_usage(tenant).recoveries == recoveries + 1  # EOWNERDEAD: totals recomputed
        (event,) = agent.events(kind="process.lock_holder_killed")
        assert event["pid"] == holder.pid
        assert event["tenant"] == "t"
        assert event["data"]["region"] == "usage"
        assert event["data"]["stopped_s"] >= 2.0
    finally:
        finish(holder)
        agent.close()


def share_tenant(sim: Sim, name: str, uuid: str) -> Path:
    limit = DeviceLimit(
        uuid=uuid, mem_cap_bytes=256 * MIB, policy=abi.POLICY_SHARE, share_permille=500, ceiling_permille=500
    )
    tenant = create_tenant(name, [limit], root=sim.runtime)
    ensure_arbiter(sim.runtime, uuid)
    return tenant


@pytest.mark.timing
def test_a_tenant_holding_the_arbiter_lock_holds_up_another_for_at_most_the_deadline(sim: Sim) -> None:
    """Issue 34, hole 8: tenant a takes its GPU's arbiter lock through its own tenant directory
    and stops (as a hostile program, a debugger or `docker pause` at the wrong instant would);
    tenant b's 100 launches of 1 ms waited for it without bound (6.1 s for as long as it held
    it). Now b waits once, the lock's deadline, and runs unarbitrated; the region says why."""
    uuid = sim.uuids()[0]
    a, b = share_tenant(sim, "a", uuid), share_tenant(sim, "b", uuid)
    region = a / abi.GPUS_DIR / uuid / abi.ARBITER_FILE  # the way a's own processes reach it
    holder = stopped_holder(region, abi.Arbiter.lock.offset)
    try:
        start = time.monotonic()
        res = sim.probe("launch", "100", "1000", env=sim.tenant_env(b))
        took = time.monotonic() - start
        assert res["kernels"] == "100"
        wall_s = int(res["wall_us"]) / 1e6
        # 0.1 s of kernels + one deadline (0.2 s); generous for a loaded 2-core machine, and far
        # below the unbounded wait it was (the holder stays stopped for the whole test).
        assert wall_s < 0.1 + abi.ARB_LOCK_DEADLINE_NS / 1e9 + 1.0, wall_s
        assert took < 10
        state = read_arbiter(arbiter_path(sim.runtime, uuid))
        assert state.broken
        assert state.lock_timeouts >= 1
        assert "held the GPU arbiter's lock past 200 ms" in res.stderr
    finally:
        finish(holder)


def test_the_agent_replaces_a_broken_arbiter_and_its_clients_move_to_the_new_one(
    sim: Sim, tmp_path: Path
) -> None:
    """After a lock timed out, the agent moves the region aside and makes a new one (event,
    metric); a running client maps it at its next launch and is arbitrated again there. The
    stopped holder is left alone: it holds a lock nobody uses any more."""
    uuid = sim.uuids()[0]
    a, b = share_tenant(sim, "a", uuid), share_tenant(sim, "b", uuid)
    path = arbiter_path(sim.runtime, uuid)
    holder = stopped_holder(a / abi.GPUS_DIR / uuid / abi.ARBITER_FILE, abi.Arbiter.lock.offset)
    old_inode = path.stat().st_ino
    launcher = sim.spawn_probe("launch", "4000", "1000", env=sim.tenant_env(b))
    agent = Agent(sim, tmp_path / "state").start()
    try:
        event = agent.wait_event("gpu.arbiter_rebuilt", timeout=30)
        assert event["gpu"] == uuid
        assert "held its lock past 200 ms" in event["data"]["damage"]
        assert path.stat().st_ino != old_inode
        deadline = time.monotonic() + 20
        while not [c for c in read_arbiter(path).clients if c.pid == launcher.pid]:
            assert launcher.poll() is None, "the launcher ended before it moved to the new region"
            assert time.monotonic() < deadline, "the launcher never joined the new region"
            time.sleep(0.05)
        assert read_arbiter(path).grants >= 1  # arbitrated again
        assert not read_arbiter(path).broken
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert parse_kv(out)[0]["kernels"] == "4000"
        assert holder.poll() is None  # not killed: harmless now
        assert agent.events(kind="process.lock_holder_killed") == []
    finally:
        finish(holder, launcher)
        agent.close()


def test_a_tenant_sees_only_the_arbiters_of_its_own_gpus(sim: Sim) -> None:
    """Under `--gpu 0` the tenant's directory leads to GPU 0's arbiter and to no other GPU's."""
    uuid0, uuid1 = sim.uuids()[:2]
    share_tenant(sim, "other", uuid1)  # GPU 1's arbiter exists
    tenant = share_tenant(sim, "t", uuid0)
    assert sorted(p.name for p in (tenant / abi.GPUS_DIR).iterdir()) == [uuid0]
    assert (tenant / abi.GPUS_DIR / uuid0 / abi.ARBITER_FILE).exists()
    assert not (tenant / abi.GPUS_DIR / uuid1).exists()
    res = sim.probe("launch", "3", "100", env=sim.tenant_env(tenant))
    assert res["kernels"] == "3"  # its own arbiter is where the shim looks for it


def test_a_stopped_process_outside_the_locks_is_left_alone(sim: Sim, tmp_path: Path) -> None:
    """The usual `docker pause`: frozen between calls, holding memory but no lock."""
    tenant = sim.tenant("t", 64, gpus=[0])
    paused = sim.spawn_probe("hold", "plain", "16M", "60", env=sim.tenant_env(tenant))
    agent = Agent(sim, tmp_path / "state").start()
    try:
        assert paused.stdout is not None
        assert paused.stdout.readline().strip() == "ready=1"
        paused.send_signal(signal.SIGSTOP)
        time.sleep(4)  # two stall windows of the breaker
        assert paused.poll() is None
        assert agent.events(kind="process.lock_holder_killed") == []
        res = sim.probe("alloc", "plain", "32M", env=sim.tenant_env(tenant))
        assert res.all("alloc") == ["OK"]  # nobody waits on a paused process
    finally:
        finish(paused)
        agent.close()


def test_a_region_broken_again_and_again_costs_its_clients_and_the_node_a_bounded_amount(
    sim: Sim, tmp_path: Path
) -> None:
    """Any tenant of the GPU can mark its region broken (one store, no lock needed), and the agent
    then replaces it; done again and again, each client moves to each new region. A client keeps
    the regions it left mapped (a thread may still read one without a lock), one per move and at
    most 64 (then it stops following); the node keeps the last five damaged files."""
    uuid = sim.uuids()[0]
    a, b = share_tenant(sim, "a", uuid), share_tenant(sim, "b", uuid)
    path = arbiter_path(sim.runtime, uuid)
    launcher = sim.spawn_probe("launch", "200000", "100", env=sim.tenant_env(b))
    agent = Agent(sim, tmp_path / "state").start()
    try:
        for _ in range(8):
            deadline = time.monotonic() + 20
            while not [c for c in read_arbiter(path).clients if c.pid == launcher.pid]:
                assert launcher.poll() is None, "the launcher ended early"
                assert time.monotonic() < deadline, "the launcher never joined the new region"
                time.sleep(0.02)
            inode = path.stat().st_ino
            with (a / abi.GPUS_DIR / uuid / abi.ARBITER_FILE).open("r+b") as region:
                region.seek(abi.Arbiter.broken_since_ns.offset)
                region.write((1).to_bytes(8, "little"))  # what a hostile tenant can write
            while path.stat().st_ino == inode:
                assert time.monotonic() < deadline, "the agent never replaced the broken region"
                time.sleep(0.02)
        maps = Path(f"/proc/{launcher.pid}/maps").read_text().splitlines()
        mapped = {line.split()[4] for line in maps if abi.ARBITER_FILE in line}  # by inode
        assert len(mapped) <= 8 + 1, mapped  # one per move: none mapped twice
        assert len(list(path.parent.glob(f"{abi.ARBITER_FILE}.damaged-*"))) == 5
        assert len(agent.events(kind="gpu.arbiter_rebuilt")) == 8
    finally:
        finish(launcher)
        agent.close()


def test_a_stopped_token_holder_is_an_event_not_only_a_counter(sim: Sim, tmp_path: Path) -> None:
    """Issue 36: a token holder stopped past its quantum (docker pause) stalled the card for a
    second, and only the region's counter said so.  The agent names the GPU in an event."""
    a = compute_tenant(sim, "a", "share", 50)
    b = compute_tenant(sim, "b", "share", 50)
    agent = Agent(sim, tmp_path / "state").start()
    try:
        stop_a_token_holder(sim, a, b, runs_s=5, stopped_s=2.0)
        reclaims = read_arbiter(arbiter_of(sim)).stall_reclaims
        assert reclaims >= 1
        event = agent.wait_event("gpu.token_stall_reclaimed")
    finally:
        agent.close()
    assert event["severity"] == "warning"
    assert event["gpu"] == sim.uuids()[0]
    assert 1 <= event["data"]["new"] <= reclaims
    assert "stopped past its quantum" in event["message"]
